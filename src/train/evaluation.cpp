// Validation scoring of the fine-tuning loop (evaluation.h) and the DPO reference log-probs it shares
// with the training step.
#include "train/evaluation.h"

#include <c10/core/GradMode.h>

#include <algorithm>

#include "train/loss.h"

namespace hearth::train {

namespace {

// The rows of batch `idx` this process scores in an evaluation: all of them in one process; a
// data-parallel rank's share of a whole batch, and the short last batch on rank 0 only.
std::vector<int64_t> scored_rows(const std::vector<int64_t>& idx, int64_t batch_size, const DataParallel* dp) {
  if (!dp) return idx;
  if (static_cast<int64_t>(idx.size()) < batch_size) return dp->rank() == 0 ? idx : std::vector<int64_t>{};
  return dp->share(idx);
}

}  // namespace

std::optional<double> evaluate(models::Model& model, const Dataset& data, int64_t batch_size, int64_t max_batches,
                               int64_t chunk, DataParallel* dp, const std::function<bool(int64_t)>& stop) {
  c10::NoGradGuard no_grad;
  // Every row is scored (a short last batch), so the loss depends on neither --batch-size nor the
  // number of processes: data-parallel ranks score their shares of whole batches, rank 0 the tail.
  Batcher b(data, batch_size, 0, /*shuffle=*/false, /*keep_tail=*/true);
  const int64_t n = max_batches < 0 ? b.num_batches() : std::min(max_batches, b.num_batches());
  double sum = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (stop && stop(i)) return std::nullopt;
    const std::vector<int64_t> idx = scored_rows(b.next_indices(), batch_size, dp);
    if (idx.empty()) continue;
    std::vector<const Example*> rows;
    for (int64_t k : idx) rows.push_back(&data.examples[k]);
    Batch batch = make_batch(rows);
    const models::Positions start = models::Positions::uniform(0, batch.input_ids.size(0));
    at::Tensor h = model.forward_layers(model.embed(batch.input_ids), 0, model.num_layers(), start, nullptr).hidden;
    HeadVjp r = chunked_cross_entropy(h, shift_labels(batch.labels), [&](const at::Tensor& x) { return model.head(x); },
                                      chunk);
    sum += r.loss_sum;
    count += r.n_tokens;
  }
  if (dp) sum = dp->sum(sum), count = dp->sum(count);
  return count > 0 ? sum / static_cast<double>(count) : 0.0;
}

at::Tensor batch_reference(models::Model& model, const PreferenceBatch& b, const std::vector<int64_t>& idx,
                           const std::vector<double>& table, int64_t chunk) {
  if (table.empty()) return reference_logps(model, b, chunk);
  const int64_t B = static_cast<int64_t>(idx.size());
  at::Tensor r = at::empty({2 * B}, at::kDouble);
  for (int64_t i = 0; i < B; ++i) {
    r[i] = table[2 * idx[i]];
    r[B + i] = table[2 * idx[i] + 1];
  }
  return r;
}

std::vector<double> reference_table(models::Model& model, const PreferenceDataset& data, int64_t batch_size,
                                    int64_t chunk) {
  std::vector<double> t(2 * data.pairs.size());
  const int64_t n = static_cast<int64_t>(data.pairs.size());
  for (int64_t s = 0; s < n; s += batch_size) {
    std::vector<int64_t> idx;
    for (int64_t i = s; i < std::min(n, s + batch_size); ++i) idx.push_back(i);
    at::Tensor r = reference_logps(model, make_preference_batch(data, idx), chunk).cpu();
    const int64_t B = static_cast<int64_t>(idx.size());
    for (int64_t i = 0; i < B; ++i) {
      t[2 * idx[i]] = r[i].item<double>();
      t[2 * idx[i] + 1] = r[B + i].item<double>();
    }
  }
  return t;
}

PreferenceOptions share_options(const PreferenceOptions& popt, const PreferenceBatch& pb, DataParallel* dp) {
  if (!dp || popt.method != Method::kOrpo) return popt;
  PreferenceOptions o = popt;
  o.nll_count = dp->sum(orpo_nll_tokens(pb, popt)) / static_cast<double>(dp->world_size());
  return o;
}

std::optional<double> evaluate_preference(models::Model& model, const PreferenceDataset& data, int64_t batch_size,
                                          int64_t max_batches, const PreferenceOptions& popt,
                                          const std::vector<double>& ref_table, DataParallel* dp,
                                          const std::function<bool(int64_t)>& stop) {
  Batcher b(data.lengths(), batch_size, 0, /*shuffle=*/false, /*keep_tail=*/true);
  const int64_t n = max_batches < 0 ? b.num_batches() : std::min(max_batches, b.num_batches());
  double sum = 0, pairs = 0;  // each batch's pair mean weighed by its pairs (the short tail's fewer)
  for (int64_t i = 0; i < n; ++i) {
    if (stop && stop(i)) return std::nullopt;
    const std::vector<int64_t> all = b.next_indices();
    const bool tail = static_cast<int64_t>(all.size()) < batch_size;
    const auto idx = scored_rows(all, batch_size, dp);
    if (idx.empty()) continue;
    PreferenceBatch pb = make_preference_batch(data, idx);
    at::Tensor ref = popt.method == Method::kDpo ? batch_reference(model, pb, idx, ref_table, popt.loss_chunk) : at::Tensor();
    const double weight = static_cast<double>(idx.size());
    // The tail is rank 0's alone: its options need no collective (the other ranks make none).
    sum += preference_eval(model, pb, ref, share_options(popt, pb, tail ? nullptr : dp)).loss * weight;
    pairs += weight;
  }
  if (dp) sum = dp->sum(sum), pairs = dp->sum(pairs);
  return pairs > 0 ? sum / pairs : 0.0;
}

}  // namespace hearth::train
