// Attaching LoRA adapters to a model's nn::Linear modules (by Hugging Face module path): checking
// an adapter against a model, mounting/unmounting for inference, and creating trainable adapters.
// Not file formats (adapter.h) and not selection per request (nn::ActiveAdapters).
#pragma once
#include <cstdint>
#include <string>

#include "adapters/adapter.h"
#include "models/model.h"

namespace hearth::adapters {

/// Checks that every module of `adapter` exists in `model.linear_modules()`, that A is [r, in] and
/// B is [out, r] for that Linear with r > 0 equal in both, that the id is a valid, unmounted id (no
/// '+', ',' or control characters: check_adapter_id), and that the adapter has at least one module. Throws hearth::Error naming the
/// adapter id, the module and the problem ("adapter 'x': model.layers.9.self_attn.q_proj: no such
/// module in the model").
void validate_against(const Adapter& adapter, models::Model& model);

/// {in_features, out_features} of every Linear of `model` by module path, for
/// LoadAdapterOptions::shapes (so an adapter is checked against the model from its header alone).
ModuleShapes module_shapes(models::Model& model);

/// Validates, then adds the adapter under `adapter.id` to every targeted Linear, with A/B cast to
/// the model's placement (device, dtype). All-or-nothing: on any error the model is unchanged.
/// Mounted adapters apply only inside an nn::ActiveAdapters scope naming the id. Call from the
/// thread that runs the model (or with it idle).
void mount(models::Model& model, const Adapter& adapter);

/// Removes adapter `id` from every Linear; returns how many modules held it (0: not mounted).
int64_t unmount(models::Model& model, const std::string& id);

/// Creates a trainable LoRA adapter on the modules selected by `config` (keys, num_layers) and
/// mounts it under `id`. A [r, in] ~ U(-1/sqrt(in), 1/sqrt(in)) — PEFT's kaiming_uniform(a=√5),
/// which is the same distribution as mlx-lm's init — drawn from a CPU generator seeded with
/// `seed`, module by module in sorted path order (so the draw does not depend on model order);
/// B [out, r] = 0. Both are requires_grad leaves in the model's placement dtype/device (fp32 in
/// tests; bf16 models give bf16 leaves — keep fp32 master copies in the optimizer if needed).
/// The returned Adapter's tensors ARE those leaves: update them in place (under NoGradGuard).
/// Throws hearth::Error when no module matches or rank <= 0, and InvalidArgument naming a key that
/// matches no module when config.every_key_must_match.
Adapter attach_trainable(models::Model& model, const LoraConfig& config, uint64_t seed,
                         const std::string& id = "train");

/// The trainable tensors of `adapter` ([A, B] per module in path order) whose module path lies in
/// decoder layers [begin, end) ("model.layers.N."), for train::LayerStack::layer_params; modules
/// outside the blocks (lm_head) are returned by head_params().
std::vector<at::Tensor> layer_params(const Adapter& adapter, int64_t begin, int64_t end);
/// The trainable tensors of `adapter` outside the decoder blocks (e.g. lm_head).
std::vector<at::Tensor> head_params(const Adapter& adapter);

}  // namespace hearth::adapters
