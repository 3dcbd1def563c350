// Mounting LoRA adapters onto a model's Linear modules, and creating trainable ones (mount.h).
// Not file formats (adapter.cpp) or weight merging (fuse.cpp).
#include "adapters/mount.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <map>
#include <regex>
#include <set>

#include "core/error.h"
#include "nn/param_source.h"

namespace hearth::adapters {

namespace {

std::map<std::string, nn::Linear*> module_map(models::Model& model) {
  std::map<std::string, nn::Linear*> out;
  for (auto& [path, lin] : model.linear_modules()) out[path] = lin;
  return out;
}

// The model's Linear that adapter module `path` names (resolve_module_path: another wrapping of
// the same checkpoint is accepted), or null.
nn::Linear* find_module(const std::map<std::string, nn::Linear*>& modules, const std::string& path) {
  if (auto it = modules.find(path); it != modules.end()) return it->second;
  std::vector<std::string> names;  // sorted, as the map is
  for (const auto& [n, lin] : modules) names.push_back(n);
  const auto name = resolve_module_path(path, names);
  return name ? modules.at(*name) : nullptr;
}

}  // namespace

ModuleShapes module_shapes(models::Model& model) {
  ModuleShapes out;
  for (auto& [path, lin] : model.linear_modules()) out[path] = {lin->in_features(), lin->out_features()};
  return out;
}

void validate_against(const Adapter& adapter, models::Model& model) {
  check_adapter_id(adapter.id);
  const std::string who = cat("adapter '", adapter.id, "'");
  HEARTH_CHECK_T(InvalidArgument, !adapter.modules.empty(), who, ": has no modules");
  const auto modules = module_map(model);
  std::set<const nn::Linear*> seen;
  for (const auto& [path, m] : adapter.modules) {
    const nn::Linear* found = find_module(modules, path);
    HEARTH_CHECK_T(InvalidArgument, found, who, ": ", path, ": no such module in the model (", model.model_type(),
                   ", ", model.num_layers(), " layers)");
    HEARTH_CHECK_T(InvalidArgument, seen.insert(found).second, who, ": ", path,
                   ": names a module that another of its entries names too (the same layer under two prefixes)");
    const nn::Linear& lin = *found;
    HEARTH_CHECK_T(InvalidArgument, m.a.defined() && m.b.defined() && m.a.dim() == 2 && m.b.dim() == 2, who, ": ",
                   path, ": A and B must be 2-D");
    const int64_t r = m.a.size(0);
    HEARTH_CHECK_T(InvalidArgument, r > 0 && m.b.size(1) == r, who, ": ", path, ": rank mismatch: A ",
                   nn::shape_str(m.a.sizes()), " vs B ", nn::shape_str(m.b.sizes()));
    // In features, not a layout's shapes: mlx-lm stores A transposed ([in, r]), PEFT as [r, in].
    HEARTH_CHECK_T(InvalidArgument, m.a.size(1) == lin.in_features(), who, ": ", path, ": LoRA A (rank ", r,
                   ") takes ", m.a.size(1), " input features, the model's Linear ", lin.in_features(),
                   " (an adapter of another model?)");
    HEARTH_CHECK_T(InvalidArgument, m.b.size(0) == lin.out_features(), who, ": ", path, ": LoRA B (rank ", r,
                   ") gives ", m.b.size(0), " output features, the model's Linear ", lin.out_features(),
                   " (an adapter of another model?)");
    HEARTH_CHECK_T(InvalidArgument, std::isfinite(m.scale), who, ": ", path, ": scale is not finite");
    HEARTH_CHECK_T(InvalidArgument, !lin.find_adapter(adapter.id), who, ": already mounted (unmount it first)");
  }
}

void mount(models::Model& model, const Adapter& adapter) {
  validate_against(adapter, model);
  const nn::LoadOptions& where = model.placement();
  // Place every tensor before touching the model, so a failure (e.g. out of memory) changes nothing.
  std::vector<std::pair<nn::Linear*, nn::LoraAdapter>> placed;
  const auto modules = module_map(model);
  for (const auto& [path, m] : adapter.modules) {
    nn::LoraAdapter p = m;
    // Trainable leaves are used as they are (they must stay the same tensors as the optimizer's).
    if (!m.a.requires_grad()) p.a = m.a.to(where.device, where.dtype).contiguous();
    if (!m.b.requires_grad()) p.b = m.b.to(where.device, where.dtype).contiguous();
    placed.emplace_back(find_module(modules, path), std::move(p));
  }
  for (auto& [lin, p] : placed) lin->add_adapter(adapter.id, std::move(p));
}

int64_t unmount(models::Model& model, const std::string& id) {
  int64_t n = 0;
  for (auto& [path, lin] : model.linear_modules()) n += lin->remove_adapter(id) ? 1 : 0;
  return n;
}

Adapter attach_trainable(models::Model& model, const LoraConfig& config, uint64_t seed, const std::string& id) {
  HEARTH_CHECK_T(InvalidArgument, config.rank > 0, "attach_trainable: rank must be positive, got ", config.rank);
  HEARTH_CHECK_T(InvalidArgument, config.dropout >= 0.0 && config.dropout < 1.0,
                 "attach_trainable: dropout must be in [0, 1), got ", config.dropout);
  const std::vector<std::string>& keys = config.keys.empty() ? default_keys() : config.keys;
  const int64_t first_layer = config.num_layers < 0 ? 0 : std::max<int64_t>(0, model.num_layers() - config.num_layers);
  Adapter ad;
  ad.id = id;
  ad.config = config;
  if (ad.config.keys.empty()) ad.config.keys = keys;
  const auto modules = module_map(model);  // sorted by path: the draw order
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const nn::LoadOptions& where = model.placement();
  for (const auto& [path, lin] : modules) {
    const int64_t layer = layer_index(path);
    if (layer >= 0 && layer < first_layer) continue;
    bool match = false;
    for (const auto& k : keys) match = match || key_matches(path, k);
    if (!match) continue;
    const int64_t in = lin->in_features(), out = lin->out_features();
    // PEFT: nn.init.kaiming_uniform_(A, a=sqrt(5)) → bound = sqrt(6 / ((1 + 5) · in)) = 1/sqrt(in).
    const double bound = 1.0 / std::sqrt(double(in));
    at::Tensor a = at::empty({config.rank, in}, at::kFloat);
    a.uniform_(-bound, bound, gen);
    a = a.to(where.device, where.dtype).contiguous();
    at::Tensor b = at::zeros({out, config.rank}, at::TensorOptions().dtype(where.dtype).device(where.device));
    a.set_requires_grad(true);
    b.set_requires_grad(true);
    ad.modules[path] = nn::LoraAdapter{a, b, config.scale, config.dropout};
  }
  // With every_key_must_match (keys a user typed: --lora-keys), a key that matches no module
  // anywhere in the model is a typo even when the other keys match (it used to be dropped
  // silently). Otherwise PEFT's rule: only no match at all is an error (below).
  for (const auto& k : config.every_key_must_match ? config.keys : std::vector<std::string>{}) {
    bool any = false;
    for (const auto& [path, lin] : modules) any = any || key_matches(path, k);
    if (any) continue;
    static const std::regex layer_prefix(R"(^(.*\.)?layers\.\d+\.)");
    std::set<std::string> names;  // module paths without their "….layers.N." prefix, for the message
    for (const auto& [path, lin] : modules) names.insert(std::regex_replace(path, layer_prefix, ""));
    std::string known;
    for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
    throw InvalidArgument(cat("attach_trainable: LoRA key '", k, "' matches no module of the model (its modules: ", known, ")"));
  }
  if (ad.modules.empty()) {
    std::string joined;
    for (const auto& k : keys) joined += (joined.empty() ? "" : ", ") + k;
    throw InvalidArgument(cat("attach_trainable: no module of the model matches keys [", joined, "]"));
  }
  mount(model, ad);
  return ad;
}

std::vector<at::Tensor> layer_params(const Adapter& adapter, int64_t begin, int64_t end) {
  std::vector<at::Tensor> out;
  for (const auto& [path, m] : adapter.modules) {
    const int64_t l = layer_index(path);
    if (l >= begin && l < end) {
      out.push_back(m.a);
      out.push_back(m.b);
    }
  }
  return out;
}

std::vector<at::Tensor> head_params(const Adapter& adapter) {
  std::vector<at::Tensor> out;
  for (const auto& [path, m] : adapter.modules) {
    if (layer_index(path) < 0) {
      out.push_back(m.a);
      out.push_back(m.b);
    }
  }
  return out;
}

}  // namespace hearth::adapters
