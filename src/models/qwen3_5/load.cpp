// Qwen3_5Model construction from a checkpoint (transformers or mlx-community layout, dense or
// MLX-quantized), and the lists the trainer and adapters use (linear_modules, named_parameters).
// Not the forward pass (qwen3_5.cpp).
#include "core/error.h"
#include "models/qwen3_5/qwen3_5.h"
#include "models/dense_params.h"
#include "nn/quant_config.h"

#include <cmath>

namespace hearth::models::qwen3_5 {

std::string WeightLayout::name(const std::string& path) const {
  if (path.rfind("lm_head", 0) == 0) return head + path.substr(std::string("lm_head").size());
  HEARTH_CHECK(path.rfind("model.", 0) == 0, "qwen3_5: '", path, "' is not a text-model path");
  return prefix + path.substr(std::string("model.").size());
}

WeightLayout detect_layout(const Qwen3_5Config& c, const nn::ParamSource& w, bool quantized, const std::string& origin) {
  WeightLayout L;
  bool found = false;
  for (const char* p : {"model.language_model.", "language_model.model.", "model."})
    if (w.contains(std::string(p) + "embed_tokens.weight")) {
      L.prefix = p;
      found = true;
      break;
    }
  HEARTH_CHECK(found, origin, ": the weights have no embed_tokens.weight under model., model.language_model. or "
               "language_model.model.");
  L.head = w.contains("language_model.lm_head.weight") ? "language_model.lm_head" : "lm_head";
  // mlx-lm's sanitize moves conv1d to [C, K, 1] and shifts the zero-centred norms by +1 in one go;
  // a conv1d still [C, 1, K] marks a transformers checkpoint (mlx-lm's has_unsanitized_conv1d).
  L.mlx = quantized;
  const int64_t C = c.conv_dim(), K = c.linear_conv_kernel_dim;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    if (c.layer_types[i] != LayerKind::kLinear) continue;
    const std::string name = cat(L.prefix, "layers.", i, ".linear_attn.conv1d.weight");
    at::Tensor t = w.get(name);
    const bool hf = t.dim() == 3 && t.size(0) == C && t.size(1) == 1 && t.size(2) == K;
    const bool mlx = t.dim() == 3 && t.size(0) == C && t.size(1) == K && t.size(2) == 1;
    HEARTH_CHECK(hf || mlx, origin, ": linear_conv_kernel_dim = ", K, " and conv dim ", C, ", but ",
                 name, " has shape ", nn::shape_str(t.sizes()), " (expected [", C, ", 1, ", K, "] or [", C, ", ", K,
                 ", 1])");
    if (K != 1) L.mlx = mlx;
    break;
  }
  return L;
}

Qwen3_5Model::Qwen3_5Model(Qwen3_5Config config, const nn::ParamSource& w,
                           const std::optional<nn::QuantizationConfig>& quant, const nn::LoadOptions& placement,
                           const std::string& origin)
    : config_(std::move(config)), placement_(placement) {
  const Qwen3_5Config& c = config_;
  layout_ = detect_layout(c, w, quant.has_value(), origin);
  auto name = [&](const std::string& canon) { return layout_.name(canon); };
  auto spec = [&](const std::string& actual) -> std::optional<nn::QuantSpec> {
    return quant ? quant->spec_for(actual) : std::nullopt;
  };
  auto linear = [&](const std::string& canon, int64_t in, int64_t out, bool bias) {
    const std::string a = name(canon);
    return nn::Linear::load(w, a, in, out, bias, spec(a), placement_);
  };
  auto dense = [&](const std::string& canon, std::vector<int64_t> shape) {
    return nn::place(w.get(name(canon), shape), placement_);
  };
  const double norm_offset = layout_.mlx ? 0.0 : 1.0;
  auto znorm = [&](const std::string& canon, int64_t dim) {
    return ZeroCenteredRMSNorm{dense(canon + ".weight", {dim}), c.rms_norm_eps, norm_offset};
  };
  const int64_t C = c.hidden_size, D = c.head_dim, H = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const int64_t L = c.num_hidden_layers;
  embed_tokens_ = nn::Embedding::load(w, name("model.embed_tokens"), c.vocab_size, C, spec(name("model.embed_tokens")),
                                      placement_);
  HEARTH_CHECK(w.contains(name(cat("model.layers.", L - 1, ".input_layernorm.weight"))), origin,
               ": num_hidden_layers = ", L, ", but the weights have no layer ", L - 1);
  HEARTH_CHECK(!w.contains(name(cat("model.layers.", L, ".input_layernorm.weight"))), origin,
               ": num_hidden_layers = ", L, ", but the weights have more layers");
  const bool fused = c.model_type == "qwen3_next";
  layers_.resize(L);
  for (int64_t i = 0; i < L; ++i) {
    const std::string p = cat("model.layers.", i, ".");
    DecoderLayer& l = layers_[i];
    l.kind = c.layer_types[i];
    l.input_layernorm = znorm(p + "input_layernorm", C);
    l.post_attention_layernorm = znorm(p + "post_attention_layernorm", C);
    if (l.kind == LayerKind::kFull) {
      Attention& a = l.self_attn.emplace();
      a.q_proj = linear(p + "self_attn.q_proj", C, H * D * 2, c.attention_bias);
      a.k_proj = linear(p + "self_attn.k_proj", C, Hkv * D, c.attention_bias);
      a.v_proj = linear(p + "self_attn.v_proj", C, Hkv * D, c.attention_bias);
      a.o_proj = linear(p + "self_attn.o_proj", H * D, C, c.attention_bias);
      a.q_norm = znorm(p + "self_attn.q_norm", D);
      a.k_norm = znorm(p + "self_attn.k_norm", D);
      a.num_heads = H;
      a.num_kv_heads = Hkv;
      a.head_dim = D;
      a.scaling = std::pow(static_cast<double>(D), -0.5);
    } else {
      GatedDeltaNet& g = l.linear_attn.emplace();
      const std::string q = p + "linear_attn.";
      g.num_k_heads = c.linear_num_key_heads;
      g.num_v_heads = c.linear_num_value_heads;
      g.head_k_dim = c.linear_key_head_dim;
      g.head_v_dim = c.linear_value_head_dim;
      const int64_t Hv = g.num_v_heads, vd = g.value_dim();
      g.fused = fused;
      if (fused) {
        g.in_proj_qkvz = linear(q + "in_proj_qkvz", C, 2 * g.key_dim() + 2 * vd, false);
        g.in_proj_ba = linear(q + "in_proj_ba", C, 2 * Hv, false);
      } else {
        g.in_proj_qkv = linear(q + "in_proj_qkv", C, c.conv_dim(), false);
        g.in_proj_z = linear(q + "in_proj_z", C, vd, false);
        g.in_proj_b = linear(q + "in_proj_b", C, Hv, false);
        g.in_proj_a = linear(q + "in_proj_a", C, Hv, false);
      }
      g.out_proj = linear(q + "out_proj", vd, C, false);
      at::Tensor conv = w.get(name(q + "conv1d.weight"));  // shape checked by detect_layout's rule below
      const int64_t K = c.linear_conv_kernel_dim, CD = c.conv_dim();
      const bool as_hf = conv.dim() == 3 && conv.size(0) == CD && conv.size(1) == 1 && conv.size(2) == K;
      const bool as_mlx = conv.dim() == 3 && conv.size(0) == CD && conv.size(1) == K && conv.size(2) == 1;
      HEARTH_CHECK(as_hf || as_mlx, origin, ": linear_conv_kernel_dim = ", K, " and conv dim ", CD, ", but ",
                   name(q + "conv1d.weight"), " has shape ", nn::shape_str(conv.sizes()), " (expected [", CD, ", 1, ",
                   K, "] or [", CD, ", ", K, ", 1])");
      if (!as_hf) conv = conv.permute({0, 2, 1});  // MLX [C, K, 1] → [C, 1, K]
      g.conv1d_weight = nn::place(conv.contiguous(), placement_);
      g.A_log = dense(q + "A_log", {Hv});
      g.dt_bias = dense(q + "dt_bias", {Hv});
      g.norm = RMSNormGated{dense(q + "norm.weight", {g.head_v_dim}), c.rms_norm_eps};
    }
    l.mlp.gate_proj = linear(p + "mlp.gate_proj", C, c.intermediate_size, false);
    l.mlp.up_proj = linear(p + "mlp.up_proj", C, c.intermediate_size, false);
    l.mlp.down_proj = linear(p + "mlp.down_proj", c.intermediate_size, C, false);
  }
  norm_ = znorm("model.norm", C);
  if (c.tie_word_embeddings) {
    lm_head_ = embed_tokens_.as_linear();
  } else {
    HEARTH_CHECK(w.contains(layout_.head + ".weight"), origin,
                 ": tie_word_embeddings is false, but the weights have no ", layout_.head, ".weight");
    lm_head_ = linear("lm_head", C, c.vocab_size, false);
  }
  rotary_emb_ = nn::RotaryEmbedding(c.rope, D, c.max_position_embeddings, placement_.device);
}

int64_t Qwen3_5Model::weight_bytes() const {
  int64_t n = embed_tokens_.nbytes() + norm_.weight.nbytes();
  if (!config_.tie_word_embeddings) n += lm_head_.nbytes();
  for (const auto& l : layers_) {
    n += l.input_layernorm.weight.nbytes() + l.post_attention_layernorm.weight.nbytes();
    if (l.self_attn) {
      const auto& a = *l.self_attn;
      n += a.q_proj.nbytes() + a.k_proj.nbytes() + a.v_proj.nbytes() + a.o_proj.nbytes();
      n += a.q_norm.weight.nbytes() + a.k_norm.weight.nbytes();
    }
    if (l.linear_attn) {
      const auto& g = *l.linear_attn;
      if (g.fused) n += g.in_proj_qkvz.nbytes() + g.in_proj_ba.nbytes();
      else n += g.in_proj_qkv.nbytes() + g.in_proj_z.nbytes() + g.in_proj_b.nbytes() + g.in_proj_a.nbytes();
      n += g.out_proj.nbytes() + g.conv1d_weight.nbytes() + g.A_log.nbytes() + g.dt_bias.nbytes() +
           g.norm.weight.nbytes();
    }
    n += l.mlp.gate_proj.nbytes() + l.mlp.up_proj.nbytes() + l.mlp.down_proj.nbytes();
  }
  return n;
}

std::vector<std::pair<std::string, nn::Linear*>> Qwen3_5Model::linear_modules() {
  std::vector<std::pair<std::string, nn::Linear*>> out;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const std::string p = cat("model.layers.", i, ".");
    DecoderLayer& l = layers_[i];
    if (l.self_attn) {
      Attention& a = *l.self_attn;
      out.emplace_back(p + "self_attn.q_proj", &a.q_proj);
      out.emplace_back(p + "self_attn.k_proj", &a.k_proj);
      out.emplace_back(p + "self_attn.v_proj", &a.v_proj);
      out.emplace_back(p + "self_attn.o_proj", &a.o_proj);
    }
    if (l.linear_attn) {
      GatedDeltaNet& g = *l.linear_attn;
      if (g.fused) {
        out.emplace_back(p + "linear_attn.in_proj_qkvz", &g.in_proj_qkvz);
        out.emplace_back(p + "linear_attn.in_proj_ba", &g.in_proj_ba);
      } else {
        out.emplace_back(p + "linear_attn.in_proj_qkv", &g.in_proj_qkv);
        out.emplace_back(p + "linear_attn.in_proj_z", &g.in_proj_z);
        out.emplace_back(p + "linear_attn.in_proj_b", &g.in_proj_b);
        out.emplace_back(p + "linear_attn.in_proj_a", &g.in_proj_a);
      }
      out.emplace_back(p + "linear_attn.out_proj", &g.out_proj);
    }
    out.emplace_back(p + "mlp.gate_proj", &l.mlp.gate_proj);
    out.emplace_back(p + "mlp.up_proj", &l.mlp.up_proj);
    out.emplace_back(p + "mlp.down_proj", &l.mlp.down_proj);
  }
  out.emplace_back("lm_head", &lm_head_);
  for (auto& [path, lin] : out) path = layout_.name(path);
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> Qwen3_5Model::named_parameters() {
  std::vector<std::pair<std::string, at::Tensor>> out;
  auto dense = [&](const std::string& path, const nn::Linear& lin) { append_dense(out, path, lin); };
  dense("model.embed_tokens", embed_tokens_.as_linear());
  for (size_t i = 0; i < layers_.size(); ++i) {
    const std::string p = cat("model.layers.", i, ".");
    const DecoderLayer& l = layers_[i];
    out.emplace_back(p + "input_layernorm.weight", l.input_layernorm.weight);
    if (l.self_attn) {
      const Attention& a = *l.self_attn;
      dense(p + "self_attn.q_proj", a.q_proj);
      dense(p + "self_attn.k_proj", a.k_proj);
      dense(p + "self_attn.v_proj", a.v_proj);
      dense(p + "self_attn.o_proj", a.o_proj);
      out.emplace_back(p + "self_attn.q_norm.weight", a.q_norm.weight);
      out.emplace_back(p + "self_attn.k_norm.weight", a.k_norm.weight);
    }
    if (l.linear_attn) {
      const GatedDeltaNet& g = *l.linear_attn;
      const std::string q = p + "linear_attn.";
      if (g.fused) {
        dense(q + "in_proj_qkvz", g.in_proj_qkvz);
        dense(q + "in_proj_ba", g.in_proj_ba);
      } else {
        dense(q + "in_proj_qkv", g.in_proj_qkv);
        dense(q + "in_proj_z", g.in_proj_z);
        dense(q + "in_proj_b", g.in_proj_b);
        dense(q + "in_proj_a", g.in_proj_a);
      }
      out.emplace_back(q + "conv1d.weight", g.conv1d_weight);
      out.emplace_back(q + "dt_bias", g.dt_bias);
      out.emplace_back(q + "A_log", g.A_log);
      out.emplace_back(q + "norm.weight", g.norm.weight);
      dense(q + "out_proj", g.out_proj);
    }
    out.emplace_back(p + "post_attention_layernorm.weight", l.post_attention_layernorm.weight);
    dense(p + "mlp.gate_proj", l.mlp.gate_proj);
    dense(p + "mlp.up_proj", l.mlp.up_proj);
    dense(p + "mlp.down_proj", l.mlp.down_proj);
  }
  out.emplace_back("model.norm.weight", norm_.weight);
  if (!config_.tie_word_embeddings) dense("lm_head", lm_head_);
  for (auto& [path, t] : out) path = layout_.name(path);
  return out;
}

}  // namespace hearth::models::qwen3_5
