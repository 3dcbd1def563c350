// Full fine-tunes as weights over a base model (mlx-lm's fine_tune_type "full": adapters.safetensors
// holds every trained tensor under its Hugging Face name; adapter_config.json says "full"):
// detecting one, the tensor edits it makes to a base folder (dense or MLX-quantized), and loading a
// model with them. Not LoRA (adapter.h, mount.h); fuse.h writes the edited folder.
#pragma once
#include <ATen/ATen.h>

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "io/hf_config.h"
#include "models/model.h"
#include "nn/param_source.h"
#include "nn/quant_config.h"

namespace hearth::io {
class WeightStore;
}

namespace hearth::adapters {

/// True when `dir`/adapter_config.json exists, is a JSON object and its fine_tune_type is "full".
/// Never throws for a missing or unreadable config (false); throws hearth::Error for bad JSON.
bool is_full_finetune(const std::filesystem::path& dir);

/// The trained tensors of full fine-tune folder `dir` (adapters.safetensors), by HF name, as CPU
/// copies in the file's dtype. Throws hearth::Error naming the file: not a full fine-tune, the file
/// missing, no tensors, or a tensor that is not floating point.
std::map<std::string, at::Tensor> load_full_finetune(const std::filesystem::path& dir);

/// What a full fine-tune changes in a base folder: tensors to write instead of (or in addition to)
/// the base's, and base tensors to drop.
struct WeightEdits {
  std::map<std::string, at::Tensor> replaced;
  std::set<std::string> dropped;
};

/// The edits that put `trained` (HF name → tensor) over `base`. Each name must be a base tensor
/// with the same shape, or "<module>.weight" of an MLX-quantized base module (".scales" present)
/// with the module's dense [out, in] shape. Dense base tensors: the trained tensor cast to the base
/// tensor's dtype (one dtype per folder, as a LoRA fuse casts once). Quantized modules: the trained
/// tensor, cast to the scales' dtype, quantized with the module's own spec from `quant` (as a LoRA
/// fuse requantizes, mlx-lm LoRALinear.fuse); with `dequantize`, written dense in the scales' dtype
/// and the module's .scales/.biases dropped instead. Throws hearth::Error naming `who` and the
/// tensor for an unknown name or a shape mismatch.
WeightEdits full_finetune_edits(const io::WeightStore& base, const std::optional<nn::QuantizationConfig>& quant,
                                const std::map<std::string, at::Tensor>& trained, bool dequantize,
                                const std::string& who);

/// A ParamSource that answers from `edits` first (dropped names are absent), else from `base`.
class EditedSource : public nn::ParamSource {
 public:
  EditedSource(const nn::ParamSource& base, const WeightEdits& edits, std::string origin)
      : base_(base), edits_(edits), origin_(std::move(origin)) {}
  bool contains(const std::string& name) const override;
  at::Tensor get(const std::string& name, const std::vector<int64_t>& expected = {}) const override;

 private:
  const nn::ParamSource& base_;
  const WeightEdits& edits_;
  std::string origin_;
};

/// Loads `model_dir` with the full fine-tune in `finetune_dir` over its weights (the edits of
/// full_finetune_edits without dequantize: the model is what `hearth fuse` writes, loaded without
/// writing it). Throws like models::load_model and full_finetune_edits.
std::unique_ptr<models::Model> load_model_with_full_finetune(const std::filesystem::path& model_dir,
                                                             const std::filesystem::path& finetune_dir,
                                                             const nn::LoadOptions& opts);

}  // namespace hearth::adapters
