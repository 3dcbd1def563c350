// The generation loop: prefill the prompt in chunks through the KV cache, then decode one token
// at a time with a Sampler until an EOS id or max_tokens; a callback per token for streaming,
// and timing/memory stats like mlx_lm.generate prints. Not detokenization (the caller's
// StreamDecoder) and not batching (batch.h, which this loop runs with one sequence).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "generate/sampler.h"
#include "models/model.h"

namespace hearth::generate {

struct GenerateOptions {
  int64_t max_tokens = 256;
  int64_t prefill_step_size = 2048;  // prompt tokens per forward during prefill
  SamplingParams sampling;
  std::vector<int64_t> eos_ids;      // stop (EOS not emitted to the callback, not counted)
  bool logprobs = false;             // hand StepCallback the token's log-probabilities (StepLogprobs)
  /// With logprobs: how many of the most likely tokens StepLogprobs lists per token (<= 0: none; at
  /// most the vocabulary). Read to the host with the chosen token's logprob, in the same copy.
  int64_t top_logprobs = 0;
  /// Whether anyone reads the caches once the sequence has ended (Sequence::caches(), the prompt
  /// cache, generate()'s caller). false lets a decode slot (decode_slots.h) free the ended
  /// sequence's rows without reading them back; Sequence::caches() is then empty.
  bool keep_caches = true;
  /// Polled at the start of every step() (batch.h) and before each prompt chunk: once it returns
  /// true the sequence ends where it is (done, stats.cancelled; the caches hold what was computed),
  /// so a request whose client left stops at the next chunk boundary instead of after its whole
  /// prefill. Empty = never. Called on the generating thread; must be cheap (an atomic load).
  std::function<bool()> cancelled;
};

struct GenerationStats {
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;         // prompt tokens already in the caches passed in (not prefilled)
  double prompt_tps = 0;             // prefilled prompt tokens / prefill seconds (to first token)
  int64_t generation_tokens = 0;
  double generation_tps = 0;         // generated tokens after the first / their seconds
  double ttft_s = 0;                 // time to first token (prefill + first sample)
  int64_t peak_memory_bytes = 0;     // compat::peak_memory_bytes(device)
  bool stopped_by_eos = false;
  bool cancelled = false;            // GenerateOptions::cancelled ended it
  int64_t prefill_chunks = 0;        // prompt chunks that went through the model (forwards' worth)
  /// The decode after the first token ran on the static path (batch.h Sequence::run_static): a CUDA
  /// graph per token on CUDA.
  bool static_decode = false;
  bool cuda_graph = false;  ///< ... and that step was a captured CUDA graph
  /// Seconds of the decode spent making the static caches and recording the step (the eager first
  /// step, the graph's warm-up and capture), included in generation_tps's time; 0 off that path.
  double static_setup_s = 0;
};

struct GenerationResult {
  std::vector<int64_t> tokens;  // generated ids (without the EOS that stopped it)
  GenerationStats stats;
};

/// Called per generated token; return false to stop.
using TokenCallback = std::function<bool(int64_t token)>;
/// One generated token's log-probabilities, as StepCallback gets them (GenerateOptions::logprobs):
/// the log-softmax of the processed logits (after the penalties, before top-p/min-p/top-k and
/// temperature, as mlx-lm reports them). `logprob` and the top entries are already on the host: a
/// batched step reads them for all its rows in one device-to-host copy (read_logprobs, batch.h), so
/// a callback that uses only these costs no device sync of its own.
struct StepLogprobs {
  float logprob = 0;  ///< the chosen token's log-probability
  /// The GenerateOptions::top_logprobs most likely tokens (fewer when the vocabulary is smaller),
  /// most likely first, equal log-probabilities in increasing id order; top_values[i] is
  /// top_ids[i]'s log-probability.
  std::vector<int64_t> top_ids;
  std::vector<float> top_values;
  /// The whole distribution: [V] float32 on the model's device (it may be a view of the step's
  /// [rows, V] tensor: clone it to keep it alone). Reading it on the host syncs with the device.
  at::Tensor all;
};

/// Called per generated token with its log-probabilities when GenerateOptions::logprobs, else
/// nullptr (the pointer is valid only during the call). Return false to stop.
using StepCallback = std::function<bool(int64_t token, const StepLogprobs* logprobs)>;

/// Generates a continuation of `prompt` (non-empty ids) with `model` (batch 1). Throws
/// hearth::Error on an empty prompt or an id outside the vocabulary.
GenerationResult generate(models::Model& model, const std::vector<int64_t>& prompt, const GenerateOptions& opts,
                          const TokenCallback& on_token = {});
/// The same loop with a per-step callback that can also see the step's log-probabilities.
GenerationResult generate(models::Model& model, const std::vector<int64_t>& prompt, const GenerateOptions& opts,
                          const StepCallback& on_step);
/// The same loop over caller-owned `caches`: empty → filled from model.make_cache(); else the
/// caches of every layer holding the first c = caches[0]->offset() tokens of `prompt` (a prompt
/// cache hit, 0 < c < prompt.size(), all layers alike), and only prompt[c..] is prefilled. On
/// return `caches` hold every token whose keys/values were computed (the prompt and each generated
/// token that was fed back: all but the last one, unless it was an EOS). stats.cached_tokens = c.
/// Throws hearth::Error as above, or when the layers' offsets differ or c >= prompt.size().
GenerationResult generate(models::Model& model, const std::vector<int64_t>& prompt, const GenerateOptions& opts,
                          cache::Caches& caches, const StepCallback& on_step);

}  // namespace hearth::generate
