// Validation scoring of the fine-tuning loop (trainer.h): the token-mean cross-entropy of an SFT
// set and the mean preference loss of a DPO/ORPO set, each over whole batches in file order, and
// the DPO reference log-probs that the training step shares. Not the training step itself.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "models/model.h"
#include "train/dataset.h"
#include "train/distributed.h"
#include "train/preference.h"
#include "train/preference_data.h"

namespace hearth::train {

/// Token-mean next-token cross-entropy (nats) of `data` over up to `max_batches` batches of
/// `batch_size` rows (-1: all), in file order, no graph; every row is scored (a short last batch),
/// so the loss depends on neither the batch size nor the process count. Data-parallel (`dp`): each
/// rank scores its share of every whole batch, rank 0 the short tail, the sums are reduced (a
/// collective: every rank calls it with the same arguments). `chunk`: positions per loss-head chunk
/// (chunked_cross_entropy). `stop(i)` is asked before batch i (all ranks alike: it may be a
/// collective); true → std::nullopt (the caller stops). 0 when no token is scored.
std::optional<double> evaluate(models::Model& model, const Dataset& data, int64_t batch_size, int64_t max_batches,
                               int64_t chunk, DataParallel* dp, const std::function<bool(int64_t)>& stop = {});

/// Mean preference loss (PreferenceOptions' method) over up to `max_batches` batches of pairs of
/// `data` (-1: all), in file order: each batch's pair mean weighed by its pairs. `ref_table`: the
/// reference log-probs of every pair (reference_table; empty → computed per batch with the adapter
/// off). Data-parallel and `stop` as evaluate().
std::optional<double> evaluate_preference(models::Model& model, const PreferenceDataset& data, int64_t batch_size,
                                          int64_t max_batches, const PreferenceOptions& popt,
                                          const std::vector<double>& ref_table, DataParallel* dp,
                                          const std::function<bool(int64_t)>& stop = {});

/// Reference log-probs [2B] (fp64; chosen rows then rejected rows) of the B pairs `idx` of batch
/// `b`: read from `table` (2 per pair: chosen, rejected) when it is filled (a full fine-tune, whose
/// base weights change), else a forward with the adapter off (reference_logps).
at::Tensor batch_reference(models::Model& model, const PreferenceBatch& b, const std::vector<int64_t>& idx,
                           const std::vector<double>& table, int64_t chunk);

/// The base model's reference log-probs of every pair of `data` (2 per pair: chosen, rejected), in
/// batches of `batch_size` pairs; `chunk` as reference_logps.
std::vector<double> reference_table(models::Model& model, const PreferenceDataset& data, int64_t batch_size,
                                    int64_t chunk);

/// `popt` for one rank's share `pb` of a batch: under data parallelism ORPO's NLL term divides by
/// the whole batch's token count over the ranks (a collective: every rank calls it), so that the
/// shares' equal-weighted losses add up to the batch's token mean. Otherwise `popt` itself.
PreferenceOptions share_options(const PreferenceOptions& popt, const PreferenceBatch& pb, DataParallel* dp);

}  // namespace hearth::train
