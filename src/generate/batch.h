// Continuous batching at the level of tokens: a Sequence is one generation in progress (its caches,
// sampler, adapters and progress), and step() advances a set of them by one scheduler iteration —
// prompt chunks for the ones still prefilling (several sequences' chunks in one padded forward),
// then one token for every decoding one in a single batched forward (rows at their own positions,
// each with its own caches and adapters). The single-sequence loop of generate.h is this with one
// sequence. Not the server's queue or admission (src/server/engine_loop.h) and not detokenization.
#pragma once
#include <ATen/ATen.h>

#include <chrono>
#include <functional>
#include <cstdint>
#include <string>
#include <vector>

#include "cache/kv_cache.h"
#include "generate/generate.h"

namespace hearth::generate {

class DecodeSlots;

/// One generation in progress. Created with its prompt and options; advanced only by step().
/// Follows generate()'s semantics exactly: prefill in chunks of opts.prefill_step_size, sample, call
/// on_step per token (not for an EOS), stop at an EOS id, after opts.max_tokens tokens, when
/// on_step returns false, or when opts.cancelled returns true (polled at each step() and before each
/// prompt chunk: see step()).
class Sequence {
 public:
  /// `caches`: empty → fresh from the model at the first step; else caches holding a prefix of
  /// `prompt` (a prompt-cache hit, fewer tokens than the prompt). `adapters`: the LoRA selection
  /// active for this sequence's rows (nn::ActiveAdapters / nn::RowAdapters). Throws hearth::Error on
  /// an empty prompt or a non-positive prefill_step_size.
  Sequence(std::vector<int64_t> prompt, GenerateOptions opts, cache::Caches caches,
           std::vector<std::string> adapters, StepCallback on_step);
  /// A sequence still waiting for a prefill it shares (share_prefill) ends with error(); one whose
  /// prefill others share releases them; one in a decode slot frees it.
  ~Sequence();
  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;

  /// Makes `child` share this sequence's prefill (OpenAI n > 1: one prompt, several choices). The
  /// child — same prompt and adapters, its own options (sampler seed, limits) and callback, not yet
  /// stepped, no caches of its own — computes nothing until this sequence's prompt is prefilled;
  /// then it gets a deep copy of the caches (cache::clone) and samples its first token with its own
  /// sampler from the same last-position logits, and decodes on its own from there. Pass both to
  /// the same step() calls. Throws hearth::Error when the prompts or adapters differ, the child
  /// holds caches, or either has started.
  void share_prefill(Sequence& child);

  /// True once the sequence has ended (EOS, limit, the callback said stop, or its own sampling
  /// failed: see error()).
  bool done() const { return done_; }
  /// Why this sequence alone failed ("" when it did not): its sampling (a logits processor or a
  /// TokenConstraint, e.g. a grammar that outgrew its limits) threw. Other sequences of the same
  /// step are unaffected.
  const std::string& error() const { return error_; }
  /// True while prompt tokens remain to be prefilled.
  /// False while it waits for a prefill it shares (share_prefill).
  bool prefilling() const { return !done_ && !parent_ && offset_ < static_cast<int64_t>(prompt_.size()); }
  /// Tokens generated so far and the stats (complete once done()).
  const GenerationResult& result() const { return result_; }
  /// The caches: every token whose keys/values were computed (see generate()). A sequence that
  /// decodes in a decode slot (decode_slots.h) has its caches read back from the slot first (the
  /// slot is freed and it decodes on through the ragged path).
  cache::Caches& caches();
  /// Bytes its own caches hold now (cache::total_bytes; while it decodes in a decode slot, the
  /// slot's rows are the pool's and not counted). Changes nothing.
  int64_t cache_bytes() const { return cache::total_bytes(caches_); }
  /// True while it decodes in a slot of a DecodeSlots pool.
  bool in_slot() const { return slots_ != nullptr; }
  const std::vector<int64_t>& prompt() const { return prompt_; }
  const std::vector<std::string>& adapters() const { return adapters_; }

  /// Runs the rest of this sequence (it must have its first token: !prefilling()) on the static
  /// fast path of graph_decode.cpp when it applies — greedy without logits processors, every layer
  /// a growing or sliding-window KV cache, a recurrent state or none, a family with a static step, the model on CUDA (or HEARTH_STATIC_DECODE=1)
  /// and HEARTH_CUDA_GRAPHS not "0" — with a CUDA graph replayed per token on CUDA. Returns false,
  /// changing nothing, when it does not apply. Same tokens as the eager loop (up to the rounding
  /// of attention over the padded static length).
  bool run_static(models::Model& model);

  /// Receives a snapshot of the caches (LayerCache::clone of every layer) holding `tokens` prompt
  /// tokens, taken during prefill.
  using SnapshotFn = std::function<void(int64_t tokens, cache::Caches snapshot)>;
  /// Asks for snapshots during prefill: each time the caches hold a multiple of `every` prompt
  /// tokens (every <= 0: never) and once when the whole prompt is in, before the first token is
  /// sampled. Prefill chunks are cut at those multiples. For hybrid models, whose recurrent states
  /// cannot be trimmed back to a shared prefix, the server's prompt cache keeps these (issue 9:
  /// "snapshots at the end of each cached prompt, plus every N tokens of long prompts").
  void on_snapshot(int64_t every, SnapshotFn fn);

 private:
  friend class DecodeSlots;
  friend void step(models::Model& model, const std::vector<Sequence*>& seqs, int64_t prefill_budget,
                   DecodeSlots* slots);
  void check_prompt(const models::Model& model);
  // True when it is done, or opts_.cancelled says so now: it then ends where it is (a share_prefill
  // child leaves its parent; a parent hands its caches and its other children to its first child).
  bool end_if_cancelled(const models::Model& model);
  // Tokens of the prompt chunk that starts at prompt position `at` (prefill_step_size, cut at the
  // prompt's end and at the next snapshot multiple).
  int64_t chunk_at(int64_t at) const;
  // One forward of this sequence alone for its next `len` prompt tokens, then end_chunk.
  void prefill_alone(models::Model& model, int64_t len);
  // After `len` prompt tokens went into the caches: snapshots, and when the prompt is complete the
  // forks and the first token from last_logits [V] (undefined while the prompt is incomplete) —
  // `greedy` when >= 0: the caller's argmax of them for a plain-greedy sequence without forks.
  // `finite` false (the caller's check of last_logits found NaN or Inf): the sequence and its forks
  // end with an error instead of a token drawn from them (an argmax over NaN is token 0).
  void end_chunk(models::Model& model, int64_t len, const at::Tensor& last_logits, int64_t greedy = -1,
                 bool finite = true);
  // One padded forward for the next lens[b] prompt tokens of rows[b] (batch.cpp explains); with
  // `slots`, rows that are in those decode slots, written straight into them.
  static void prefill_together(models::Model& model, const std::vector<Sequence*>& rows,
                               const std::vector<int64_t>& lens, DecodeSlots* slots = nullptr);
  // The next token from last_logits [V] into *next and, with opts_.logprobs, its log-probabilities
  // [V] float32 (same device) into *logprobs. False when this sequence's sampling threw: it has
  // then ended (error_), and nothing is to be emitted.
  bool sample(const at::Tensor& last_logits, int64_t* next, at::Tensor* logprobs);
  void sample_and_emit(const at::Tensor& last_logits);  // sample, then emit_together alone
  void emit(int64_t next, const StepLogprobs* logprobs);  // a sampled token: EOS, callback, limit
  // A token drawn for a sequence in a step, with its log-probabilities [V] when it asks for them
  // (undefined otherwise).
  struct Drawn {
    Sequence* seq;
    int64_t token;
    at::Tensor logprobs;
  };
  // Emits every drawn token in order, the logprobs of the rows that ask for them read to the host
  // together: one read_logprobs (one copy) for the whole list. `stacked`, when defined, is those
  // rows' logprobs already in one [L, V] tensor (row j = the j-th drawn entry with logprobs), used
  // instead of stacking them.
  static void emit_together(const std::vector<Drawn>& drawn, const at::Tensor& stacked = at::Tensor());
  void finish_stats(const models::Model& model);
  void release_forks(models::Model& model, const at::Tensor& last_logits);  // share_prefill's children start

  Sequence* parent_ = nullptr;     // the sequence whose prefill this one waits for
  std::vector<Sequence*> forks_;   // sequences waiting for this one's prefill

  std::vector<int64_t> prompt_;
  GenerateOptions opts_;
  cache::Caches caches_;
  std::vector<std::string> adapters_;
  StepCallback on_step_;
  Sampler sampler_;
  std::vector<int64_t> tokens_;  // prompt + generated: the penalties' context
  GenerationResult result_;
  int64_t offset_ = 0;   // tokens in the caches
  int64_t pending_ = -1; // sampled and emitted, not yet fed back
  bool started_ = false, done_ = false;
  std::string error_;
  int64_t snapshot_every_ = 0;
  SnapshotFn on_snapshot_;
  std::chrono::steady_clock::time_point t0_, t1_, t_last_;
  DecodeSlots* slots_ = nullptr;  // the pool whose slot slot_ holds this sequence's caches
  int64_t slot_ = -1;
};

/// One scheduler iteration over `seqs` (sequences already done are skipped).
///
/// Cancellation: every sequence's GenerateOptions::cancelled is polled first, and a prefilling
/// one's again before each of its chunks; a cancelled sequence ends there (done(),
/// result().stats.cancelled, its caches holding the chunks already run), so a long prompt stops at
/// the next chunk boundary. A cancelled share_prefill parent hands the prefill it started (its
/// caches, its other children) to its first child, which prefills on from there at the next step
/// (keep every child in `seqs`).
///
/// Prefill: prompt chunks (Sequence's prefill_step_size, cut at snapshot multiples) are planned
/// sequence by sequence, in order, while the chunks' total stays within `prefill_budget` tokens (at
/// least one chunk when any sequence prefills; a chunk that does not fit ends that sequence's share
/// and the next may still fit). The plan runs in chunk-rounds: round k holds the k-th planned chunk
/// of each sequence. When the model takes ragged batches (Model::ragged_batches) and
/// it runs on a GPU (HEARTH_BATCH_PREFILL=1 / =0 forces it on / off), the chunks of one round go through ONE
/// forward (rows at their own positions via cache::rows_view, each with its own adapters via
/// nn::RowAdapters), right-padded to the longest chunk; each row's padding is trimmed from its
/// caches right after, so a cache only ever holds its own prompt's tokens, and the logits are
/// computed only at the last real token of rows whose prompt completes. Padding is only possible
/// for rows whose every layer cache is a plain cache::KVCache (exact trim); rows with sliding-window
/// or recurrent caches share a forward only with rows of the same chunk length. Nor is a row padded
/// past what its KVCache buffers would reach alone (its prompt + max_tokens rounded up to the
/// caches' growth step, the server's memory charge Engine::state_bytes, or their present capacity
/// when larger: a trim gives no buffer back); such a row joins a forward of shorter chunks, or its
/// own. One padded forward
/// holds at most max(prefill_budget, its longest chunk) token positions (rows longest first; more
/// forwards when they do not fit). Otherwise each chunk is a forward of its own (the CPU's default:
/// compute-bound, that streams each first token as soon as its own forward ends:
/// docs/benchmarks.md). A sequence whose prefill completes samples its first token (and releases
/// its share_prefill forks) right after its round's forward.
///
/// Decode: feeds every decoding sequence's last token in ONE forward when the model takes ragged
/// batches, else one forward per sequence, and samples each row's next token with its own sampler.
/// The rows that ask for logprobs get them from one read_logprobs for the forward (one
/// device-to-host copy, however many rows), then each row's callback runs, in row order. (A prompt
/// that completes samples its first token right after its prefill, with a read of its own.)
/// The results equal running each sequence alone up to floating-point summation order of the
/// batched matmuls. A sequence whose own sampling throws ends with Sequence::error() set; the others
/// go on. Throws hearth::Error on a prompt token outside the vocabulary, and hearth::Error /
/// c10::Error from the model's forward (the sequences are then in an undefined state and must be
/// dropped).
///
/// With `slots` (a DecodeSlots pool built for `model`): a decoding sequence that fits a free slot
/// (prompt + max_tokens within its capacity, caches as make_cache() gives them) moves into it and decodes
/// there, all slotted rows in one static step (a replayed CUDA graph on the GPU), with no per-step
/// copies of its caches; a slotted sequence that ends is read back into growing caches and its
/// slot freed. Sequences that do not fit decode through the ragged path above in the same step.
/// Same tokens as without slots (greedy: identical on CPU in tests; the logits differ by the
/// summation order of the padded attention).
void step(models::Model& model, const std::vector<Sequence*>& seqs, int64_t prefill_budget,
          DecodeSlots* slots = nullptr);

/// The host half of R rows' StepLogprobs, read in ONE device-to-host copy (one sync): `logprobs`
/// [R, V] (any float dtype, any device; read as float32), `tokens` the R chosen ids (each in [0,
/// V)), `top` how many most likely tokens each row lists (clamped to [0, V]). Row r gets
/// logprobs[r][tokens[r]] and its top[r] best (values descending, ties in increasing id order: one
/// int64 key per entry, so a row's list does not depend on the other rows' top[]); `all` is left
/// undefined for the caller. Counts one StepTrace::logprob_reads. Throws hearth::Error when the
/// sizes disagree (c10::Error for an id outside [0, V)).
std::vector<StepLogprobs> read_logprobs(const at::Tensor& logprobs, const std::vector<int64_t>& tokens,
                                        const std::vector<int64_t>& top);

}  // namespace hearth::generate
