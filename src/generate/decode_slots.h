// Decode slots (vLLM style): a pool of S rows × C tokens of static caches for every layer, in which
// decoding sequences live once their prefill is done, so that the batched decode step of
// generate::step runs the family's static path over slots [0, bucket) with no per-step KV copies,
// replayed as one CUDA graph per (batch bucket, length bucket) on the GPU. Not the scheduler
// (batch.h step() decides who decodes) and not prefill (growing caches, as before).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cache/static_kv_cache.h"
#include "cache/static_recurrent_cache.h"
#include "core/cuda_graph.h"
#include "models/model.h"

namespace hearth::generate {

class Sequence;

/// The pool. Each layer holds one static buffer set: KV layers [S, Hkv, C, D] (the model's dtype),
/// sliding-window layers too (by absolute position, as the single-sequence static path holds them:
/// the family's window mask, from each row's own position, hides what the window excludes),
/// recurrent-state layers conv [S, convDim, W] and float32 state [S, Hv, Dk, Dv], layers without
/// state of their own (Gemma 4's KV sharers: null cache entries) nothing — they read their donor
/// layer's buffers. One positions tensor [S] (int64, device) and one token-id tensor [S, 1] are the
/// step's only inputs; logits [S, V] float32 and their argmax [S] its outputs.
///
/// A decoding sequence (prefill done) whose layer caches are of the kinds make_cache() gives
/// (KVCache, RotatingKVCache, RecurrentCache or null) and whose prompt + remaining tokens fit C
/// takes the lowest free slot (admit): its caches are copied into the slot's rows once and dropped,
/// except its sliding-window caches (small: about the window), which the pool keeps unchanged while
/// it is slotted. It then decodes in place. When it ends (or someone asks for its caches:
/// Sequence::caches()) its rows are read back — growing caches of exactly its tokens, recurrent
/// states, and the kept sliding-window caches appended the positions decoded in the slot (as the
/// eager loop would have left them) — and the slot is freed; a Sequence destroyed in a slot frees it.
///
/// A step (decode) runs over rows [0, b), b = the smallest of {1, 2, 4, …, S} above the highest
/// occupied slot, and tokens [0, L), L = the smallest of {128, 256, …, C} above the highest
/// position among them (attention reads L, not C). Free rows in [0, b) compute harmless garbage at
/// position 0 (their outputs are ignored; a slot's rows are overwritten when it is taken). On CUDA
/// each (b, L) step is captured once as a CUDA graph (compat::RecordedStep) and replayed; on CPU,
/// or with HEARTH_CUDA_GRAPHS=0 / nocapture, the same step runs eagerly. A step in which a row has
/// LoRA adapters runs eagerly through the same buffers inside nn::RowAdapters (a graph would bake
/// in one row-to-adapter assignment).
class DecodeSlots {
 public:
  /// Builds a pool of `slots` rows × `capacity` tokens for `model` and proves the family's static
  /// path with one eager step. Returns nullptr (with the reason in *why when given) when the model
  /// cannot use slots: a layer cache of another kind than KVCache, RotatingKVCache, RecurrentCache
  /// or none, or a family without a static step. Throws hearth::Error when slots < 1 or
  /// capacity < 2, and c10::Error when the buffers cannot be allocated.
  static std::unique_ptr<DecodeSlots> create(models::Model& model, int64_t slots, int64_t capacity,
                                             std::string* why = nullptr);
  /// What one slot of C tokens holds for a model: per_token × C + fixed bytes (per_token: the K and
  /// V of one token over every layer with its own KV, sliding-window layers included, since a slot
  /// holds them by absolute position; fixed: the recurrent states). The pool is slots × that.
  struct SlotBytes {
    int64_t per_token = 0, fixed = 0;
  };
  /// Measures SlotBytes with a one-token probe (as create() does). {0, 0} when the model cannot use
  /// slots (create() says why). Throws c10::Error from the probe's forward.
  static SlotBytes slot_bytes(models::Model& model);
  /// Reads every occupied slot back into its sequence's growing caches (they go on eagerly).
  ~DecodeSlots();
  DecodeSlots(const DecodeSlots&) = delete;
  DecodeSlots& operator=(const DecodeSlots&) = delete;

  int64_t slots() const { return slots_; }
  int64_t capacity() const { return capacity_; }
  /// Bytes of the pool's cache buffers (KV and states; not the step's activations or graphs).
  int64_t nbytes() const { return nbytes_; }
  /// Occupied slots.
  int64_t occupied() const;
  /// Steps replayed from a captured CUDA graph / run eagerly (on CPU every step is eager).
  int64_t graph_steps() const { return graph_steps_; }
  int64_t eager_steps() const { return eager_steps_; }
  /// Sequences that took a slot before their prefill and wrote their prompt straight into it
  /// (fits_prefill); the others were admitted after a prefill into growing caches.
  int64_t prefilled_in_slots() const { return prefilled_in_slots_; }
  /// Batch buckets for S slots: 1, 2, 4, … below S, then S. Length buckets for C: 128, 256, …
  /// below C, then C.
  static std::vector<int64_t> batch_buckets(int64_t slots);
  static std::vector<int64_t> length_buckets(int64_t capacity);
  /// The (b, L) bucket a decode step takes when the highest occupied slot is `top_slot` (0-based)
  /// and the longest row is at position `longest` (its next token is written there): b the
  /// smallest batch bucket above top_slot, L the smallest length bucket above longest.
  static std::pair<int64_t, int64_t> bucket_for(int64_t slots, int64_t capacity, int64_t top_slot, int64_t longest);
  /// Every (b, L) a pool of `slots` × `capacity` can ask for: batch_buckets × length_buckets, b
  /// major (any top slot can meet any length, so each is reachable through bucket_for).
  static std::vector<std::pair<int64_t, int64_t>> all_buckets(int64_t slots, int64_t capacity);

  /// What warm_up() did.
  struct Warmup {
    int64_t buckets = 0;   ///< buckets whose step was recorded now
    int64_t captured = 0;  ///< of them, captured as CUDA graphs
    double seconds = 0;    ///< wall time of the whole warm-up
  };
  /// Records every bucket's step (all_buckets) before any request needs it, so that no request
  /// pays for a capture inside its latency (as vLLM captures its batch sizes at start-up): on
  /// CUDA with graphs on (HEARTH_CUDA_GRAPHS not 0 / nocapture), each (b, L) is captured as its
  /// first use would (warm-up run, capture, recurrent states rewound) and replayed once; the
  /// whole pool's KV buffers are zero-filled first. Elsewhere (CPU, graphs off) it does nothing
  /// unless `run_eager`, which records and runs each bucket's step once eagerly (how CPU tests
  /// exercise this path). The rows are free, so the steps write only garbage nobody reads;
  /// warm-up steps count in neither graph_steps() nor eager_steps(). Requires an empty pool
  /// (hearth::Error otherwise); c10::Error when a capture runs out of memory.
  Warmup warm_up(bool run_eager = false);
  /// Buckets whose step is recorded now (captured or eager).
  int64_t recorded_buckets() const;

 private:
  friend class Sequence;
  friend void step(models::Model& model, const std::vector<Sequence*>& seqs, int64_t prefill_budget,
                   DecodeSlots* slots);
  struct Bucket {
    std::shared_ptr<cache::StaticState> state;
    cache::Caches caches;  // windows of the pool: rows [0, b), tokens [0, L)
    std::unique_ptr<compat::RecordedStep> recorded;
    int64_t b = 0;
  };
  DecodeSlots(models::Model& model, int64_t slots, int64_t capacity);
  /// One layer as a one-token probe of the model finds it (defined in decode_slots.cpp).
  struct LayerProto;
  /// The probe: every layer's kind and one row's buffers. Empty, with the reason in *why, when the
  /// model cannot use slots; *logits gets the probe's logits [1, 1, V].
  static std::vector<LayerProto> probe(models::Model& model, at::Tensor* logits, std::string* why);

  /// Whether `s` (decoding, not in a slot) can take a slot now.
  bool fits(const Sequence& s) const;
  /// Whether `s`, still prefilling, can take a slot now and prefill straight into it (step() asks
  /// only for a sequence whose whole remaining prompt runs in this step, so it decodes in the same
  /// step and no decode step sees a slot half filled): every layer of the pool a plain KV layer
  /// (prefill_view), HEARTH_SLOT_PREFILL not "0", no snapshots or shared prefill, its caches one
  /// row of growing KV caches (a prompt-cache prefix, copied in by admit), prompt + tokens to
  /// generate within the capacity.
  bool fits_prefill(const Sequence& s) const;
  /// Moves `s` into the lowest free slot (fits(s) or fits_prefill(s) must hold).
  void admit(Sequence& s);
  /// The caches of a prefill forward over slotted `rows` (each at its own offset_): one
  /// SlotRowsCache per layer over the pool's buffers (slot_rows_cache.h). Throws hearth::Error when
  /// a row is not in this pool.
  cache::Caches prefill_view(const std::vector<Sequence*>& rows);
  /// Frees `s`'s slot; with `read_back`, its caches are first read back into s.caches_.
  void release(Sequence& s, bool read_back);
  /// One decode step over the slotted sequences `rows`: feeds each one's pending token, samples
  /// its next one with its own sampler (greedy rows: the step's argmax), reads the logprobs of
  /// every row that asks for them to the host at once (Sequence::emit_together) and emits the
  /// tokens in row order; rows that ended leave their slots.
  void decode(const std::vector<Sequence*>& rows);
  Bucket& bucket(int64_t b, int64_t len);
  void forward(Bucket& bk);  // the step itself: ids_/positions_ → logits_/next_ rows [0, b)
  void run_step(Bucket& bk, const std::vector<Sequence*>& rows);
  /// Records bk's step when it has none: a CUDA graph on CUDA with capture_ (the recurrent
  /// states of rows [0, b) rewound after the capture's warm-up), else the eager function.
  void record(Bucket& bk);
  /// Zero-fills tokens [zeroed_, tokens) of every row of the KV buffers (allocated uninitialised, so
  /// a CPU pool costs memory only as far as sequences reach; a masked key must still be finite).
  void ensure_zeroed(int64_t tokens);

  models::Model& model_;
  int64_t slots_ = 0, capacity_ = 0, nbytes_ = 0;
  at::Device device_;
  std::shared_ptr<cache::StaticState> full_state_;  // all rows, all tokens: write_row/read_row
  cache::Caches full_;                              // per layer, over the whole pool
  /// A layer's kind of slot storage: none (a KV sharer), KV, sliding-window KV (by absolute
  /// position; the sequence's RotatingKVCache is kept aside), recurrent state.
  enum class Kind { kShared, kKV, kWindow, kRecurrent };
  std::vector<std::pair<at::Tensor, at::Tensor>> buffers_;  // per layer: (keys, values), (conv, recurrent) or none
  std::vector<Kind> kinds_;                         // per layer
  std::vector<int64_t> windows_;                    // per layer: the RotatingKVCache's window (kWindow)
  std::vector<cache::Caches> kept_;                 // per slot: its sequence's sliding-window caches (else null)
  at::Tensor positions_, ids_, logits_, next_;      // [S], [S, 1], [S, V] float32, [S]
  std::vector<Sequence*> occupant_;                 // per slot (nullptr = free)
  compat::GraphPool graph_pool_;  // shared by every bucket's graph (declared first: outlives them)
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Bucket>> buckets_;
  bool capture_ = true;
  bool prefill_in_slots_ = false;  // every layer kKV and HEARTH_SLOT_PREFILL not "0" (fits_prefill)
  int64_t zeroed_ = 0;  // tokens [0, zeroed_) of every KV row hold finite values
  int64_t graph_steps_ = 0, eager_steps_ = 0, prefilled_in_slots_ = 0;
};

}  // namespace hearth::generate
