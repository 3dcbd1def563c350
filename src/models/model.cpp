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

std::vector<RowGroup> row_groups(const Positions& pos, const cache::Caches* caches, const char* who, bool merge) {
  if (!is_ragged_view(caches)) return {RowGroup{0, pos.batch(), pos.common(who)}};
  for (const auto& c : *caches) {
    if (!c) continue;
    const auto* rows = dynamic_cast<const cache::RowsCache*>(c.get());
    HEARTH_CHECK(rows, who, ": a ragged batch mixes row views with a shared cache");
    HEARTH_CHECK(rows->batch() == pos.batch(), who, ": a ragged view of ", rows->batch(), " rows for a batch of ",
                 pos.batch());
  }
  // Rows b and b + 1 share a group when merging and both sit at one position with growing KV
  // caches in every layer (a null entry, a layer without state, is no obstacle).
  auto joins = [&](const RowGroup& g, int64_t b) {
    if (!merge || pos.offsets[b] != g.offset) return false;
    for (const auto& c : *caches)
      if (c && !static_cast<const cache::RowsCache&>(*c).groupable(b - 1, 2)) return false;  // b - 1 is in g
    return true;
  };
  std::vector<RowGroup> groups;
  for (int64_t b = 0; b < pos.batch(); ++b) {
    if (!groups.empty() && joins(groups.back(), b)) ++groups.back().count;
    else groups.push_back(RowGroup{b, 1, pos.offsets[b]});
  }
  return groups;
}

cache::LayerCache* group_cache(cache::LayerCache* c, const RowGroup& g) {
  if (auto* rows = dynamic_cast<cache::RowsCache*>(c))
    return g.count == 1 ? rows->row(g.begin) : rows->group(g.begin, g.count);
  return c;
}

}  // namespace hearth::models
