// The row grouping of a forward (one group, or one per row of a ragged batch) shared by the families.
// Not a family's layers (models/<family>/) and not the caches (cache/).
#include "models/model.h"

namespace hearth::models {

namespace {
bool is_ragged_view(const cache::Caches* caches) {
  if (!caches) return false;
  for (const auto& c : *caches)
    if (c) return dynamic_cast<const cache::RowsCache*>(c.get()) != nullptr;
  return false;
}
}  // namespace

std::vector<RowGroup> row_groups(const Positions& pos, const cache::Caches* caches, const char* who) {
  if (!is_ragged_view(caches)) return {RowGroup{0, pos.batch(), pos.common(who)}};
  for (const auto& c : *caches) {
    if (!c) continue;
    const auto* rows = dynamic_cast<const cache::RowsCache*>(c.get());
    HEARTH_CHECK(rows, who, ": a ragged batch mixes row views with a shared cache");
    HEARTH_CHECK(static_cast<int64_t>(rows->rows().size()) == pos.batch(), who, ": a ragged view of ",
                 rows->rows().size(), " rows for a batch of ", pos.batch());
  }
  std::vector<RowGroup> groups;
  for (int64_t b = 0; b < pos.batch(); ++b) groups.push_back(RowGroup{b, 1, pos.offsets[b]});
  return groups;
}

cache::LayerCache* group_cache(cache::LayerCache* c, const RowGroup& g) {
  if (auto* rows = dynamic_cast<cache::RowsCache*>(c)) return rows->rows().at(static_cast<size_t>(g.begin));
  return c;
}

}  // namespace hearth::models
