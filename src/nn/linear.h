// nn::Linear, THE seam for weight matmuls: y = x Wᵀ (+ b) with W dense [out, in] or MLX-affine
// quantized, plus named LoRA adapters applied only when active on the calling thread
// (ActiveAdapters), trainable when their A/B tensors require grad. Model files call forward() and
// never learn which. Not an adapter file format or registry (src/adapters/).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "nn/param_source.h"
#include "nn/quant.h"
#include "nn/rms_norm.h"

namespace hearth::nn {

/// One LoRA adapter on a Linear: y += scale · (dropout(x) Aᵀ) Bᵀ with A [r, in], B [out, r]
/// (PEFT's LoraLayer and mlx-lm's LoRALinear). mlx-lm stores lora_a [in, r] / lora_b [r, out];
/// PEFT stores A [r, in] / B [out, r]: the adapters/ loader converts to this PEFT orientation.
/// For training, A and B are requires_grad leaves (in the model's compute dtype); the optimizer
/// must update them in place so the Linear sees the new values.
struct LoraAdapter {
  at::Tensor a;          // [r, in]
  at::Tensor b;          // [out, r]
  double scale = 1.0;    // effective multiplier (PEFT lora_alpha / r, or alpha / sqrt(r) with rsLoRA)
  double dropout = 0.0;  // probability of zeroing an input element of the LoRA branch; applied only
                         // inside a LoraDropoutScope (training), as PEFT / torch.nn.Dropout does
};

/// RAII: the adapter ids active on this thread while the scope lives (restores the previous list
/// on exit; scopes nest). Linear::forward applies, in this order and summed, the active adapters it
/// holds; ids it does not hold are skipped (an adapter may target only some modules). With no
/// scope no adapter applies. Whoever runs the model sets it: the server's engine thread per
/// request, the trainer, the generate CLI. Thread-local: a scope on one thread never affects
/// another.
class ActiveAdapters {
 public:
  explicit ActiveAdapters(std::vector<std::string> ids);
  ~ActiveAdapters();
  ActiveAdapters(const ActiveAdapters&) = delete;
  ActiveAdapters& operator=(const ActiveAdapters&) = delete;
  /// The ids active on the calling thread (empty when none).
  static const std::vector<std::string>& current();

 private:
  std::vector<std::string> saved_;
};

/// RAII: a different adapter selection per batch row (continuous batching of requests that use
/// different adapters, as S-LoRA / punica): while the scope lives, Linear::forward on x [B, ..., in]
/// computes the base product for all B rows at once and adds each adapter's delta only to the rows
/// whose selection lists it (rows[b], in that order), ignoring ActiveAdapters. rows.size() must equal
/// the batch of every forward inside the scope (Linear::forward throws hearth::Error otherwise).
/// Thread-local; scopes nest (the previous one is restored on exit).
class RowAdapters {
 public:
  explicit RowAdapters(std::vector<std::vector<std::string>> rows);
  ~RowAdapters();
  RowAdapters(const RowAdapters&) = delete;
  RowAdapters& operator=(const RowAdapters&) = delete;

 private:
  std::vector<std::vector<std::string>> saved_;
  bool saved_on_ = false;
};

/// Parses an adapter selection: "a+b" or "a,b" → {"a", "b"} (stacked, applied in order), "" or
/// "none" → {} (base model). Throws hearth::InvalidArgument on an empty id ("a++b").
std::vector<std::string> parse_adapter_spec(const std::string& spec);

/// RAII: turns LoRA dropout on for this thread (training) with a CPU generator seeded by `seed`,
/// so a recompute that reseeds identically (segmented backward's on_segment) draws the same masks.
/// Masks are drawn on CPU (then moved to x's device): reproducible across devices, not fast.
/// Outside a scope LoRA dropout is off (inference, evaluation).
class LoraDropoutScope {
 public:
  explicit LoraDropoutScope(uint64_t seed);
  ~LoraDropoutScope();
  LoraDropoutScope(const LoraDropoutScope&) = delete;
  LoraDropoutScope& operator=(const LoraDropoutScope&) = delete;
  /// Restarts the mask stream of the active scope from `seed` (no-op outside a scope).
  static void reseed(uint64_t seed);
  /// Whether dropout is on for the calling thread.
  static bool enabled();
};

class Linear {
 public:
  Linear() = default;
  /// Dense: weight [out, in], optional bias [out].
  explicit Linear(at::Tensor weight, std::optional<at::Tensor> bias = std::nullopt);
  /// Quantized: packed weight + optional bias [out].
  explicit Linear(QuantizedWeight qweight, std::optional<at::Tensor> bias = std::nullopt);

  /// Loads module `path` ("model.layers.0.self_attn.q_proj") from `src`: quantized when
  /// "<path>.scales" exists (then `spec` is required: throws if nullopt), else dense
  /// "<path>.weight" [out, in]; "<path>.bias" [out] is read when `bias`. Shapes are checked
  /// against in/out: "<file>: tensor <name> has shape [..], expected [..]".
  static Linear load(const ParamSource& src, const std::string& path, int64_t in, int64_t out, bool bias,
                     const std::optional<QuantSpec>& spec, const LoadOptions& opts);

  /// y [..., out] = x [..., in] · Wᵀ + b, then each adapter active on this thread (ActiveAdapters)
  /// that this Linear holds adds scale · (dropout(x) Aᵀ) Bᵀ, computed in the adapter's dtype and
  /// cast to y's (PEFT's op order: each product, the scale and the sum rounded in turn; for CUDA
  /// inference with the fused kernels on, (x Aᵀ) then y + scale·(x Aᵀ) Bᵀ in one addmm, rounded
  /// once: 2 launches instead of 4; and where x is one row on the decode GEMV's path and the Linear
  /// holds one adapter of the selection, h = x·Aᵀ in one launch (for all Linears of a forward_many
  /// group) and scale·h·Bᵀ added in the base GEMV's epilogue before its one rounding: 1 launch
  /// for the group; HEARTH_GEMV_LORA=0 keeps the addmm). Inside a RowAdapters scope each row gets
  /// its own selection's adapters instead. A Linear without adapters does no adapter work at all.
  at::Tensor forward(const at::Tensor& x) const;

  /// {ls[0]->forward(x), ls[1]->forward(x), ...} for Linears that read the same x (q/k/v,
  /// gate/up): one GEMV launch for all base products on a decode-sized CUDA x when none has a
  /// bias and their weights share one format (nn/decode_gemv.h), each Linear's active adapters
  /// then added to its own product as forward() adds them; else each forward in turn.
  static std::vector<at::Tensor> forward_many(const at::Tensor& x, std::initializer_list<const Linear*> ls);

  /// An input still to be normalised: norm(x + residual), or norm(x) without a residual.
  struct NormedInput {
    at::Tensor x;         // [..., in]
    at::Tensor residual;  // x's shape, or undefined
    const RMSNorm* norm = nullptr;
  };
  /// What forward_many_normed returns: the sum the norm read, the normed input, the products.
  struct NormedProducts {
    at::Tensor sum;              // x + residual (x itself without a residual)
    at::Tensor normed;           // norm(sum)
    std::vector<at::Tensor> ys;  // ls[i]->forward(normed) each
  };
  /// {sum, normed, forward_many(normed, ls)} with normed = in.norm->forward_add(in.x, in.residual)
  /// (or forward(in.x)): on a decode-sized CUDA input with at most kGemvNormMaxRows output rows in
  /// all the norm runs inside the GEMV launch (nn/decode_gemv.h decode_gemv_normed: the same sum
  /// and normed bits, products within summation order; one launch fewer), each Linear's active
  /// adapters then added from `normed` as forward() adds them; otherwise the norm and forward_many
  /// in turn. With adapters in forward()'s epilogue case (one row), the norm runs inside the small
  /// x·Aᵀ launch instead, whatever the output rows, and the base products take the adapters'
  /// terms in their epilogue. 1 ≤ |ls| ≤ 3. Throws what forward_many and the norm throw.
  static NormedProducts forward_many_normed(const NormedInput& in, std::initializer_list<const Linear*> ls);

  bool quantized() const { return qweight_.has_value(); }
  int64_t in_features() const;
  int64_t out_features() const;
  /// The dense weight [out, in] (throws when quantized: use dequantized_weight()).
  const at::Tensor& weight() const;
  /// The weight as a dense [out, in] tensor (dequantized when quantized).
  at::Tensor dequantized_weight() const;
  const std::optional<at::Tensor>& bias() const { return bias_; }
  const std::optional<QuantizedWeight>& qweight() const { return qweight_; }

  // --- LoRA ---------------------------------------------------------------------------------
  /// Adds adapter `id` (tensors used as given: the caller places them on the weight's device).
  /// Throws hearth::Error when A/B do not fit [out, in] (A [r, in], B [out, r]) or `id` is held.
  /// Not thread-safe against a concurrent forward: mount from the thread that runs the model.
  void add_adapter(const std::string& id, LoraAdapter adapter);
  /// Removes adapter `id`; false when not held.
  bool remove_adapter(const std::string& id);
  /// Adapter `id`, or nullptr.
  const LoraAdapter* find_adapter(const std::string& id) const;
  bool has_adapters() const { return !adapters_.empty(); }
  void clear_adapters() { adapters_.clear(); }
  /// Held adapters in insertion order.
  const std::vector<std::pair<std::string, LoraAdapter>>& adapters() const { return adapters_; }

  /// Bytes held by the base weight (+ bias), for memory accounting.
  int64_t nbytes() const;

 private:
  // y plus the adapters active on this thread (or each row's, inside a RowAdapters scope): the
  // adapter half of forward(), also applied by forward_many to grouped base products.
  at::Tensor add_adapters(const at::Tensor& x, at::Tensor y) const;
  // The RowAdapters path of forward(): y plus each row's adapters' deltas (delta(adapter, x_rows)).
  at::Tensor add_row_adapters(const at::Tensor& x, at::Tensor y,
                              const std::function<at::Tensor(const LoraAdapter&, const at::Tensor&)>& delta) const;

  at::Tensor weight_;
  std::optional<QuantizedWeight> qweight_;
  std::optional<at::Tensor> bias_;
  std::vector<std::pair<std::string, LoraAdapter>> adapters_;
};

/// Loads an MLX-quantized [out, in] matrix "<path>.weight/.scales/.biases" with shape checks.
QuantizedWeight load_quantized(const ParamSource& src, const std::string& path, int64_t in, int64_t out,
                               const QuantSpec& spec, const LoadOptions& opts);

}  // namespace hearth::nn
