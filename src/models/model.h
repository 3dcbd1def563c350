// The interface every model family implements: token ids in, logits out, with per-layer typed
// caches, a position per sequence, and layer-range entry points that pass a Boundary (the hidden
// stream plus the streams a family carries across layers) for segmented training. Not a loader
// (registry.h) or a generation loop (generate/generate.h). docs/architecture.md explains the seam.
#pragma once
#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

#include "cache/kv_cache.h"
#include "models/boundary.h"
#include "core/error.h"
#include "nn/linear.h"
#include "nn/param_source.h"

namespace hearth::models {

/// Where each sequence of a step starts: offsets[b] is the absolute position of the first token of
/// row b of input_ids [B, T] (= the tokens row b's caches already hold).
struct Positions {
  std::vector<int64_t> offsets;

  /// B rows all starting at `offset`.
  static Positions uniform(int64_t offset, int64_t batch = 1) { return {std::vector<int64_t>(batch, offset)}; }
  int64_t batch() const { return static_cast<int64_t>(offsets.size()); }
  /// The offset shared by every row. Throws hearth::Error naming `who` when the rows differ (a path
  /// that does not take ragged batches) or when there are no rows.
  int64_t common(const char* who) const {
    HEARTH_CHECK(!offsets.empty(), who, ": no positions given");
    for (int64_t o : offsets)
      HEARTH_CHECK(o == offsets.front(), who, ": rows at different positions (", offsets.front(), " and ", o,
                   ") are not supported on this path");
    return offsets.front();
  }
};

/// Rows [begin, begin + count) of a batch that share a position (`offset`) and a cache: how a family
/// that takes ragged batches walks one (see row_groups).
struct RowGroup {
  int64_t begin = 0, count = 0, offset = 0;
};

/// The row groups of a forward: one group of all rows at pos.common() unless `caches` is a ragged view
/// (cache::rows_view: entries are cache::RowsCache), then one group per row at its own position —
/// or, with `merge`, one group per run of consecutive rows at the same position whose caches are
/// growing KV caches in every layer (cache::grouped_kv), so a padded batch of prompt chunks (the
/// scheduler's batched prefill) attends in one call per run instead of one per row. Throws
/// hearth::Error when rows differ in position without a ragged view, or the view's row count is not
/// the batch.
std::vector<RowGroup> row_groups(const Positions& pos, const cache::Caches* caches, const char* who,
                                 bool merge = false);

/// The cache a row group reads and appends to in layer entry `c`: when `c` is a cache::RowsCache,
/// its row's cache (a one-row group) or the rows' RowsCache::group view; else `c` itself (may be
/// null).
cache::LayerCache* group_cache(cache::LayerCache* c, const RowGroup& g);

class Model {
 public:
  virtual ~Model() = default;

  /// logits [B, T', V] for input_ids [B, T] (int64), row b at absolute positions
  /// pos.offsets[b].., T' = T, or the last `logits_to_keep` positions when > 0. With `caches`
  /// (from make_cache(), holding pos.offsets[b] tokens), past state is read and the new tokens
  /// appended; without, the T tokens attend only to each other. Throws hearth::Error on bad shapes
  /// or positions a family's path does not take.
  at::Tensor forward(const at::Tensor& input_ids, const Positions& pos, cache::Caches* caches,
                     int64_t logits_to_keep = 0) {
    at::Tensor h = forward_layers(embed(input_ids), 0, num_layers(), pos, caches).hidden;
    if (logits_to_keep > 0 && logits_to_keep < h.size(1)) h = h.narrow(1, h.size(1) - logits_to_keep, logits_to_keep);
    return head(h);
  }
  /// The same with every row at `offset`.
  at::Tensor forward(const at::Tensor& input_ids, int64_t offset, cache::Caches* caches, int64_t logits_to_keep = 0) {
    return forward(input_ids, Positions::uniform(offset, input_ids.dim() > 0 ? input_ids.size(0) : 1), caches,
                   logits_to_keep);
  }

  /// Token embeddings and the streams computed from the ids: input_ids [B, T] → Boundary with
  /// hidden [B, T, C] (family scaling applied) and any family streams (Gemma 4's per-layer inputs).
  virtual Boundary embed(const at::Tensor& input_ids) = 0;
  /// Runs decoder layers [begin, end) on `in` at positions `pos` → the boundary after layer end-1.
  /// `caches` (if any) holds all layers; only [begin, end) are touched.
  virtual Boundary forward_layers(const Boundary& in, int64_t begin, int64_t end, const Positions& pos,
                                  cache::Caches* caches) = 0;
  /// Final norm + lm_head (+ any logit softcap): hidden [B, T, C] → logits [B, T, V].
  virtual at::Tensor head(const at::Tensor& hidden) = 0;

  /// Fresh per-layer caches, one entry per layer typed by the layer's kind (KV, rotating KV,
  /// recurrent state; null for a layer without state of its own).
  virtual cache::Caches make_cache() const = 0;

  /// Whether forward_layers takes ragged batches: rows at different positions, each with its own
  /// caches (a cache::rows_view), as continuous batching decodes them together. Default: no (the
  /// caller then runs such rows one forward each).
  virtual bool ragged_batches() const { return false; }

  /// Layers a segmented backward should give a segment of their own (e.g. a hybrid's full-attention
  /// layers, whose activations dominate). Default: none.
  virtual std::vector<int64_t> isolated_layers() const { return {}; }

  virtual const std::string& model_type() const = 0;
  virtual int64_t num_layers() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t hidden_size() const = 0;
  /// Device and floating dtype the weights were loaded to.
  virtual const nn::LoadOptions& placement() const = 0;
  /// Bytes held by weights.
  virtual int64_t weight_bytes() const = 0;

  /// Every nn::Linear of the model with its Hugging Face module path, in model order
  /// ("model.layers.3.self_attn.q_proj", "model.layers.3.mlp.down_proj", "lm_head"). The pointers
  /// stay valid for the model's lifetime; adapters/ attaches LoRA through them. A tied lm_head is
  /// listed (it is its own Linear sharing the embedding's weight).
  virtual std::vector<std::pair<std::string, nn::Linear*>> linear_modules() = 0;

  /// Every dense floating weight by Hugging Face name ("model.layers.0.self_attn.q_proj.weight"),
  /// each the model's own tensor (requires_grad_ or an in-place update changes the model): the
  /// parameters of a full fine-tune. A tied lm_head appears once, as model.embed_tokens.weight.
  /// Throws hearth::Error when a weight is quantized or the family does not expose them.
  virtual std::vector<std::pair<std::string, at::Tensor>> named_parameters() {
    throw Error(cat(model_type(), ": this model family does not expose its parameters for full fine-tuning"));
  }
};

}  // namespace hearth::models
