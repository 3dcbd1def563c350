// Building a Gemma4Model from checkpoint tensors (the module tree of Gemma4TextModel /
// Gemma4ForCausalLM under the checkpoint's prefix), its RoPE tables, and the module and
// parameter lists (linear_modules, named_parameters, weight_bytes). The forward pass is in gemma4.cpp.
#include <cmath>

#include "core/error.h"
#include "models/gemma4/gemma4.h"
#include "models/dense_params.h"
#include "nn/quant_config.h"

namespace hearth::models::gemma4 {

namespace {

// inv_freq [D/2] float32 of one layer type: Gemma4TextRotaryEmbedding.compute_default_rope_parameters
// ("default": every frequency) or transformers' _compute_proportional_rope_parameters
// ("proportional": the first floor(partial_rotary_factor·D / 2) frequencies, zeros after, / factor).
at::Tensor rope_inv_freq(const Gemma4Rope& rope, int64_t D, at::Device device) {
  const bool proportional = rope.type == "proportional";
  const int64_t angles =
      proportional ? static_cast<int64_t>(std::floor(rope.partial_rotary_factor * double(D) / 2.0)) : D / 2;
  at::Tensor exponents = at::arange(0, 2 * angles, 2, at::TensorOptions().dtype(at::kLong)).to(at::kFloat) / D;
  at::Tensor inv_freq = at::reciprocal(at::pow(rope.theta, exponents)) * 1.0;  // 1.0 / (base ** exponents)
  if (proportional) {
    if (D / 2 > angles) inv_freq = at::cat({inv_freq, at::zeros({D / 2 - angles}, at::kFloat)});
    inv_freq = inv_freq / rope.factor;
  }
  return inv_freq.to(device);
}

}  // namespace

Gemma4Model::Gemma4Model(Gemma4Config config, const nn::ParamSource& w, const std::optional<nn::QuantizationConfig>& quant,
                         const nn::LoadOptions& placement)
    : config_(std::move(config)), placement_(placement) {
  const Gemma4Config& c = config_;
  for (const char* p : {"model.language_model.", "language_model.model.", "model."})
    if (w.contains(cat(p, "embed_tokens.weight"))) {
      prefix_ = p;
      break;
    }
  HEARTH_CHECK(!prefix_.empty(), "Gemma 4 weights: no embed_tokens.weight under model.language_model., ",
               "language_model.model. or model.");
  const std::string& pre = prefix_;
  auto spec = [&](const std::string& path) -> std::optional<nn::QuantSpec> {
    return quant ? quant->spec_for(path) : std::nullopt;
  };
  auto linear = [&](const std::string& path, int64_t in, int64_t out, bool bias = false) {
    return nn::Linear::load(w, path, in, out, bias, spec(path), placement_);
  };
  auto norm = [&](const std::string& path, int64_t dim) {
    return Gemma4RMSNorm{nn::place(w.get(path + ".weight", {dim}), placement_), c.rms_norm_eps};
  };
  const int64_t C = c.hidden_size, H = c.num_attention_heads, L = c.num_hidden_layers;
  const int64_t P = c.hidden_size_per_layer_input;
  embed_tokens_ = nn::Embedding::load(w, pre + "embed_tokens", c.vocab_size, C, spec(pre + "embed_tokens"), placement_);
  if (P > 0) {
    embed_tokens_per_layer_ = nn::Embedding::load(w, pre + "embed_tokens_per_layer", c.vocab_size_per_layer_input,
                                                  L * P, spec(pre + "embed_tokens_per_layer"), placement_);
    per_layer_model_projection_ = linear(pre + "per_layer_model_projection", C, L * P);
    per_layer_projection_norm_ = norm(pre + "per_layer_projection_norm", P);
  }
  HEARTH_CHECK(w.contains(cat(pre, "layers.", L - 1, ".input_layernorm.weight")), "config.json: num_hidden_layers = ",
               L, ", but the weights have no layer ", L - 1);
  HEARTH_CHECK(!w.contains(cat(pre, "layers.", L, ".input_layernorm.weight")), "config.json: num_hidden_layers = ", L,
               ", but the weights have more layers");
  layers_.resize(L);
  for (int64_t i = 0; i < L; ++i) {
    const std::string p = cat(pre, "layers.", i, ".");
    const int64_t D = c.layer_head_dim(i), Hkv = c.layer_kv_heads(i), I = c.layer_intermediate(i);
    Gemma4DecoderLayer& l = layers_[i];
    l.input_layernorm = norm(p + "input_layernorm", C);
    l.post_attention_layernorm = norm(p + "post_attention_layernorm", C);
    l.pre_feedforward_layernorm = norm(p + "pre_feedforward_layernorm", C);
    l.post_feedforward_layernorm = norm(p + "post_feedforward_layernorm", C);
    Gemma4Attention& a = l.self_attn;
    a.num_heads = H;
    a.num_kv_heads = Hkv;
    a.head_dim = D;
    if (c.sliding[i]) a.sliding_window = c.sliding_window;
    a.q_proj = linear(p + "self_attn.q_proj", C, H * D, c.attention_bias);
    a.q_norm = norm(p + "self_attn.q_norm", D);
    a.has_kv = !c.kv_shared(i);
    a.has_v_proj = a.has_kv && !c.k_eq_v(i);
    if (a.has_kv) {
      a.k_proj = linear(p + "self_attn.k_proj", C, Hkv * D, c.attention_bias);
      if (a.has_v_proj) a.v_proj = linear(p + "self_attn.v_proj", C, Hkv * D, c.attention_bias);
      a.k_norm = norm(p + "self_attn.k_norm", D);
      a.v_norm = Gemma4RMSNorm{std::nullopt, c.rms_norm_eps};
    }
    a.o_proj = linear(p + "self_attn.o_proj", H * D, C, c.attention_bias);
    l.mlp.gate_proj = linear(p + "mlp.gate_proj", C, I);
    l.mlp.up_proj = linear(p + "mlp.up_proj", C, I);
    l.mlp.down_proj = linear(p + "mlp.down_proj", I, C);
    if (P > 0) {
      l.has_per_layer_input = true;
      l.per_layer_input_gate = linear(p + "per_layer_input_gate", C, P);
      l.per_layer_projection = linear(p + "per_layer_projection", P, C);
      l.post_per_layer_input_norm = norm(p + "post_per_layer_input_norm", C);
    }
    if (w.contains(p + "layer_scalar")) l.layer_scalar = nn::place(w.get(p + "layer_scalar", {1}), placement_);
  }
  norm_ = norm(pre + "norm", C);
  if (c.tie_word_embeddings) lm_head_ = embed_tokens_.as_linear();
  else lm_head_ = linear(pre == "language_model.model." ? "language_model.lm_head" : "lm_head", C, c.vocab_size);
  int64_t sliding_dim = 0, full_dim = 0;
  for (int64_t i = 0; i < L; ++i) (c.sliding[i] ? sliding_dim : full_dim) = c.layer_head_dim(i);
  if (sliding_dim) sliding_rotary_.inv_freq = rope_inv_freq(c.sliding_rope, sliding_dim, placement_.device);
  if (full_dim) full_rotary_.inv_freq = rope_inv_freq(c.full_rope, full_dim, placement_.device);
}

int64_t Gemma4Model::weight_bytes() const {
  auto norm_bytes = [](const Gemma4RMSNorm& n) { return n.weight ? n.weight->nbytes() : int64_t{0}; };
  int64_t n = embed_tokens_.nbytes() + norm_bytes(norm_);
  if (!config_.tie_word_embeddings) n += lm_head_.nbytes();
  if (config_.hidden_size_per_layer_input > 0)
    n += embed_tokens_per_layer_.nbytes() + per_layer_model_projection_.nbytes() + norm_bytes(per_layer_projection_norm_);
  for (const auto& l : layers_) {
    for (const Gemma4RMSNorm* m : {&l.input_layernorm, &l.post_attention_layernorm, &l.pre_feedforward_layernorm,
                                   &l.post_feedforward_layernorm, &l.post_per_layer_input_norm, &l.self_attn.q_norm,
                                   &l.self_attn.k_norm})
      n += norm_bytes(*m);
    const Gemma4Attention& a = l.self_attn;
    n += a.q_proj.nbytes() + a.o_proj.nbytes() + l.mlp.gate_proj.nbytes() + l.mlp.up_proj.nbytes() +
         l.mlp.down_proj.nbytes();
    if (a.has_kv) n += a.k_proj.nbytes();
    if (a.has_v_proj) n += a.v_proj.nbytes();
    if (l.has_per_layer_input) n += l.per_layer_input_gate.nbytes() + l.per_layer_projection.nbytes();
    if (l.layer_scalar) n += l.layer_scalar->nbytes();
  }
  return n;
}

std::vector<std::pair<std::string, nn::Linear*>> Gemma4Model::linear_modules() {
  std::vector<std::pair<std::string, nn::Linear*>> out;
  if (config_.hidden_size_per_layer_input > 0)
    out.emplace_back(prefix_ + "per_layer_model_projection", &per_layer_model_projection_);
  for (size_t i = 0; i < layers_.size(); ++i) {
    const std::string p = cat(prefix_, "layers.", i, ".");
    Gemma4DecoderLayer& l = layers_[i];
    Gemma4Attention& a = l.self_attn;
    out.emplace_back(p + "self_attn.q_proj", &a.q_proj);
    if (a.has_kv) out.emplace_back(p + "self_attn.k_proj", &a.k_proj);
    if (a.has_v_proj) out.emplace_back(p + "self_attn.v_proj", &a.v_proj);
    out.emplace_back(p + "self_attn.o_proj", &a.o_proj);
    out.emplace_back(p + "mlp.gate_proj", &l.mlp.gate_proj);
    out.emplace_back(p + "mlp.up_proj", &l.mlp.up_proj);
    out.emplace_back(p + "mlp.down_proj", &l.mlp.down_proj);
    if (l.has_per_layer_input) {
      out.emplace_back(p + "per_layer_input_gate", &l.per_layer_input_gate);
      out.emplace_back(p + "per_layer_projection", &l.per_layer_projection);
    }
  }
  out.emplace_back("lm_head", &lm_head_);
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> Gemma4Model::named_parameters() {
  std::vector<std::pair<std::string, at::Tensor>> out;
  auto dense = [&](const std::string& path, const nn::Linear& lin) { append_dense(out, path, lin); };
  auto norm = [&](const std::string& path, const Gemma4RMSNorm& n) {
    if (n.weight) out.emplace_back(path + ".weight", *n.weight);
  };
  const std::string& pre = prefix_;
  dense(pre + "embed_tokens", embed_tokens_.as_linear());
  if (config_.hidden_size_per_layer_input > 0) {
    dense(pre + "embed_tokens_per_layer", embed_tokens_per_layer_.as_linear());
    dense(pre + "per_layer_model_projection", per_layer_model_projection_);
    norm(pre + "per_layer_projection_norm", per_layer_projection_norm_);
  }
  for (size_t i = 0; i < layers_.size(); ++i) {
    const std::string p = cat(pre, "layers.", i, ".");
    const Gemma4DecoderLayer& l = layers_[i];
    const Gemma4Attention& a = l.self_attn;
    norm(p + "input_layernorm", l.input_layernorm);
    dense(p + "self_attn.q_proj", a.q_proj);
    norm(p + "self_attn.q_norm", a.q_norm);
    if (a.has_kv) {
      dense(p + "self_attn.k_proj", a.k_proj);
      if (a.has_v_proj) dense(p + "self_attn.v_proj", a.v_proj);
      norm(p + "self_attn.k_norm", a.k_norm);
    }
    dense(p + "self_attn.o_proj", a.o_proj);
    norm(p + "post_attention_layernorm", l.post_attention_layernorm);
    norm(p + "pre_feedforward_layernorm", l.pre_feedforward_layernorm);
    dense(p + "mlp.gate_proj", l.mlp.gate_proj);
    dense(p + "mlp.up_proj", l.mlp.up_proj);
    dense(p + "mlp.down_proj", l.mlp.down_proj);
    norm(p + "post_feedforward_layernorm", l.post_feedforward_layernorm);
    if (l.has_per_layer_input) {
      dense(p + "per_layer_input_gate", l.per_layer_input_gate);
      dense(p + "per_layer_projection", l.per_layer_projection);
      norm(p + "post_per_layer_input_norm", l.post_per_layer_input_norm);
    }
  }
  norm(pre + "norm", norm_);
  if (!config_.tie_word_embeddings) dense("lm_head", lm_head_);
  return out;
}

}  // namespace hearth::models::gemma4
