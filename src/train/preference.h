// Preference losses: DPO (Rafailov et al. 2023; TRL DPOTrainer, loss_type "sigmoid") and ORPO (Hong
// et al. 2024; TRL ORPOTrainer) as loss heads over the final hidden stream, so the full and the
// segmented backward (segmented.h) both apply; the DPO reference pass. Not the data (preference_data.h)
// or the training loop (trainer.h).
#pragma once
#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "models/model.h"
#include "train/preference_data.h"
#include "train/segmented.h"

namespace hearth::train {

enum class Method { kSft, kDpo, kOrpo };

/// "sft" | "dpo" | "orpo" → Method; throws hearth::Error naming --method otherwise.
Method parse_method(const std::string& s);

/// The knobs of a preference loss.
struct PreferenceOptions {
  Method method = Method::kDpo;
  double beta = 0.1;         // DPO β
  double orpo_lambda = 0.1;  // ORPO λ (weights the odds-ratio term only)
  bool sft_full = false;     // ORPO: the NLL term also covers the chosen prompt's tokens
  int64_t loss_chunk = 1024; // positions per loss-head chunk
  /// ORPO: the token count the NLL term's mean divides by; 0 = this batch's own Σ nll. Data-parallel
  /// training sets it to (the global batch's count) / (ranks), so that the ranks' equal-weighted
  /// losses and gradients add up to those of the whole batch.
  double nll_count = 0;
};

/// Per-batch metrics (means over the B pairs).
struct PreferenceStats {
  double loss = 0;
  double accuracy = 0;  // share of pairs with chosen reward > rejected reward (ORPO: ℓc > ℓr)
  double margin = 0;    // DPO: mean(r_c − r_r), r = β(π − ref); ORPO: mean log-odds (as mlx-bun)
  double nll = 0;       // ORPO: the NLL term
  double odds_ratio = 0;  // ORPO: mean −logsigmoid(log_odds), the term λ multiplies
  /// (name, value) for reports: loss, accuracy, margin (+ nll, or for ORPO).
  std::vector<std::pair<std::string, double>> named(Method m) const;
};

/// log p(targets[n, t] | hidden[n, t]) for each position, computed by `head` (hidden [N, t, C] →
/// logits [N, t, V], upcast to fp32) in chunks of `chunk` positions without a graph.
/// hidden [N, T, C], targets [N, T] int64 (already shifted; kIgnoreIndex positions give 0) →
/// [N, T] fp32 on hidden's device.
at::Tensor token_logps(const at::Tensor& hidden, const at::Tensor& targets,
                       const std::function<at::Tensor(const at::Tensor&)>& head, int64_t chunk);

/// The loss of a preference batch from its token log-probs, differentiable in `logp`.
/// logp [2B, T] (rows [0, B) chosen, [B, 2B) rejected, any float dtype; computed in fp64),
/// resp [2B, T] 1 on response targets (shifted), nll [B, T] 1 on the chosen positions the ORPO NLL
/// covers (unused for DPO), ref [2B] the reference's summed response log-probs (DPO; undefined for
/// ORPO). DPO: −logsigmoid(β((πc − πr) − (refc − refr))) with π = Σ response log-probs, mean over
/// pairs. ORPO: NLL + λ·mean(−logsigmoid(log_odds)), log_odds = (ℓc − ℓr) − (log1p(−e^ℓc) −
/// log1p(−e^ℓr)), ℓ = mean response log-prob per row, NLL = −Σ logp·nll / Σ nll (token mean over
/// the batch's chosen rows, as transformers' CE; opts.nll_count replaces Σ nll when > 0). Fills
/// `stats` when not null. → scalar fp64.
at::Tensor preference_loss(const at::Tensor& logp, const at::Tensor& resp, const at::Tensor& nll,
                           const at::Tensor& ref, const PreferenceOptions& opts, PreferenceStats* stats);

/// ORPO: the number of chosen-row positions the NLL term covers in `batch` (Σ nll above), counted on
/// the CPU.
double orpo_nll_tokens(const PreferenceBatch& batch, const PreferenceOptions& opts);

/// The shifted targets a batch is scored on: [2B, T] int64, the response tokens, except the chosen
/// rows of ORPO with sft_full, which score every real token (for the NLL term).
at::Tensor preference_targets(const PreferenceBatch& batch, const PreferenceOptions& opts);

/// Summed response log-probs [2B] (fp64) of `batch` under `model` with no adapter active (the base
/// weights: DPO's reference, no second copy of the weights), without a graph.
at::Tensor reference_logps(models::Model& model, const PreferenceBatch& batch, int64_t chunk);

/// The loss head for backward_with_head: from the final hidden stream of `batch`'s input_ids,
/// token log-probs (a chunked pass without a graph), the loss and W = d(scale·loss)/d logp (small
/// autograd over [2B, T]), then a second chunked pass taking the VJP of Σ W·logp through the head
/// (its logits freed chunk by chunk), adding head parameter gradients. HeadVjp::loss_sum = the
/// loss (unscaled), n_tokens = response tokens. `ref` as for preference_loss. Writes `stats`.
LossHead preference_head(const PreferenceBatch& batch, const at::Tensor& ref, const PreferenceOptions& opts,
                         const std::function<at::Tensor(const at::Tensor&)>& head,
                         const std::vector<at::Tensor>& head_params, double scale, PreferenceStats* stats);

/// Forward only (evaluation): the loss and metrics of `batch` under the model as it is (adapters
/// as currently active). `ref` as for preference_loss.
PreferenceStats preference_eval(models::Model& model, const PreferenceBatch& batch, const at::Tensor& ref,
                                const PreferenceOptions& opts);

}  // namespace hearth::train
