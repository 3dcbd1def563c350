// The interface every model family implements: token ids in, logits out, with per-layer caches
// and layer-range entry points for segmented training. Not a loader (registry.h) or a
// generation loop (generate/generate.h).
#pragma once
#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

#include "cache/kv_cache.h"
#include "core/error.h"
#include "nn/linear.h"
#include "nn/param_source.h"

namespace hearth::models {

class Model {
 public:
  virtual ~Model() = default;

  /// logits [B, T', V] for input_ids [B, T] (int64) at absolute positions offset..offset+T-1,
  /// T' = T, or the last `logits_to_keep` positions when > 0. With `caches` (from make_cache(),
  /// whose offset() must equal `offset`), past keys/values are read and the new ones appended;
  /// without, the T tokens attend only to each other. Throws hearth::Error on bad shapes.
  at::Tensor forward(const at::Tensor& input_ids, int64_t offset, cache::Caches* caches, int64_t logits_to_keep = 0) {
    at::Tensor h = forward_layers(embed(input_ids), 0, num_layers(), offset, caches);
    if (logits_to_keep > 0 && logits_to_keep < h.size(1)) h = h.narrow(1, h.size(1) - logits_to_keep, logits_to_keep);
    return head(h);
  }

  /// Token embeddings: input_ids [B, T] → hidden [B, T, C] (with any family-specific scaling).
  virtual at::Tensor embed(const at::Tensor& input_ids) = 0;
  /// Runs decoder layers [begin, end) on hidden [B, T, C] at positions offset.. → [B, T, C].
  /// `caches` (if any) holds all layers; only [begin, end) are touched.
  virtual at::Tensor forward_layers(const at::Tensor& hidden, int64_t begin, int64_t end, int64_t offset,
                                    cache::Caches* caches) = 0;
  /// Final norm + lm_head: hidden [B, T, C] → logits [B, T, V].
  virtual at::Tensor head(const at::Tensor& hidden) = 0;

  /// Fresh per-layer caches (one per layer, typed by the layer's attention: full or windowed).
  virtual cache::Caches make_cache() const = 0;

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
