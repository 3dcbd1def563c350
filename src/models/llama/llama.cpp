// The llama family forward pass, module for module as transformers' modeling_llama.py
// (LlamaAttention, LlamaDecoderLayer, LlamaModel, LlamaForCausalLM), with qwen2/qwen3/mistral
// differences taken from the config.
#include "models/llama/llama.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "core/error.h"
#include "models/dense_params.h"
#include "nn/fused_ops.h"
#include "nn/quant_config.h"

namespace hearth::models::llama {

namespace {
// A static decode step (all rows, one token, buffers made) takes RoPE and the cache write in one
// kernel (nn::rope_cache_write, bit-identical to apply_rotary + update): fills q_rot and kv and
// returns true; false (the kernel does not apply) leaves both to the tensor ops.
bool fused_static_write(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionRows& g,
                        at::Tensor& q_rot, cache::KVView& kv) {
  auto* sc = dynamic_cast<cache::StaticKVCache*>(g.cache);
  if (!sc || !sc->keys().defined() || q.size(2) != 1) return false;
  q_rot = nn::rope_cache_write(q, k, v, g.cos, g.sin, sc->state()->positions, sc->flat_keys(), sc->flat_values(),
                               sc->row_stride());
  if (!q_rot.defined()) return false;
  kv = cache::KVView{sc->keys(), sc->values(), 0};
  return true;
}
}  // namespace

at::Tensor LlamaAttention::forward(const at::Tensor& x, const std::vector<AttentionRows>& groups) const {
  return forward_projected(nn::Linear::forward_many(x, {&q_proj, &k_proj, &v_proj}), groups);
}

at::Tensor LlamaAttention::forward_projected(const std::vector<at::Tensor>& qkv,
                                             const std::vector<AttentionRows>& groups) const {
  const int64_t B = qkv[0].size(0), T = qkv[0].size(1);
  at::Tensor q = qkv[0].view({B, T, -1, head_dim});
  at::Tensor k = qkv[1].view({B, T, -1, head_dim});
  at::Tensor v = qkv[2].view({B, T, -1, head_dim}).transpose(1, 2);
  if (q_norm) q = q_norm->forward(q);
  if (k_norm) k = k_norm->forward(k);
  q = q.transpose(1, 2);  // [B, H, T, D]
  k = k.transpose(1, 2);  // [B, Hkv, T, D]
  if (groups.size() > 1 && T == 1) return o_proj.forward(decode_rows(q, k, v, groups).transpose(1, 2).reshape({B, T, -1}));
  std::vector<at::Tensor> outs;
  for (const AttentionRows& g : groups) {
    const bool all = g.rows.count == B;
    at::Tensor qg;
    cache::KVView kv;
    if (!(all && fused_static_write(q, k, v, g, qg, kv))) {
      qg = nn::apply_rotary(all ? q : q.narrow(0, g.rows.begin, g.rows.count), g.cos, g.sin);
      at::Tensor kg = nn::apply_rotary(all ? k : k.narrow(0, g.rows.begin, g.rows.count), g.cos, g.sin);
      at::Tensor vg = all ? v : v.narrow(0, g.rows.begin, g.rows.count);
      kv = cache::KVView{kg, vg, g.rows.offset};
      if (g.cache) kv = g.cache->update(kg, vg);
    }
    nn::AttentionParams p;
    p.scale = scaling;
    p.q_pos0 = g.rows.offset;
    p.k_pos0 = kv.pos0;
    p.sliding_window = sliding_window;
    p.backend = backend;
    if (g.mask_full.defined()) p.mask = sliding_window ? g.mask_window : g.mask_full;
    outs.push_back(nn::attention(qg, kv.keys, kv.values, p));  // [b, H, T, D]
  }
  at::Tensor out = outs.size() == 1 ? outs[0] : at::cat(outs, 0);
  out = out.transpose(1, 2).contiguous().reshape({B, T, -1});
  return o_proj.forward(out);
}

at::Tensor LlamaAttention::decode_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const std::vector<AttentionRows>& groups) const {
  const int64_t B = q.size(0), Hkv = k.size(1), D = k.size(3);
  std::vector<at::Tensor> cos, sin;
  for (const AttentionRows& g : groups) {
    cos.push_back(g.cos);
    sin.push_back(g.sin);
  }
  at::Tensor cos_b = at::cat(cos, 0).view({B, 1, 1, -1}), sin_b = at::cat(sin, 0).view({B, 1, 1, -1});
  at::Tensor qr = nn::apply_rotary(q, cos_b, sin_b), kr = nn::apply_rotary(k, cos_b, sin_b);
  // Each row appends to its own cache; its keys are then laid side by side, left-aligned, in one
  // padded batch, and a mask hides each row's padding (and what its sliding window excludes).
  std::vector<cache::KVView> views;
  int64_t S = 0;
  for (int64_t b = 0; b < B; ++b) {
    const AttentionRows& g = groups[b];
    at::Tensor kb = kr.narrow(0, b, 1), vb = v.narrow(0, b, 1);
    views.push_back(g.cache ? g.cache->update(kb, vb) : cache::KVView{kb, vb, g.rows.offset});
    S = std::max(S, views.back().keys.size(2));
  }
  at::Tensor keys = at::zeros({B, Hkv, S, D}, kr.options()), values = at::zeros({B, Hkv, S, D}, v.options());
  std::vector<uint8_t> allowed(static_cast<size_t>(B * S), 0);
  for (int64_t b = 0; b < B; ++b) {
    const cache::KVView& kv = views[b];
    const int64_t n = kv.keys.size(2), q_pos = groups[b].rows.offset;
    keys[b].narrow(1, 0, n).copy_(kv.keys[0]);
    values[b].narrow(1, 0, n).copy_(kv.values[0]);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t k_pos = kv.pos0 + j;
      allowed[b * S + j] = k_pos <= q_pos && (!sliding_window || k_pos > q_pos - *sliding_window);
    }
  }
  at::Tensor ok = at::from_blob(allowed.data(), {B, 1, 1, S}, at::kByte).to(q.device(), at::kBool);
  nn::AttentionParams p;
  p.scale = scaling;
  p.backend = backend;
  p.mask = at::where(ok, at::zeros({}, q.options()), at::full({}, nn::mask_min(q.scalar_type()), q.options()));
  return nn::attention(qr, keys, values, p);  // [B, H, 1, D]
}

at::Tensor LlamaDecoderLayer::forward(const at::Tensor& x, const std::vector<AttentionRows>& groups) const {
  auto [sum, delta] = forward_unadded(x, at::Tensor(), groups);
  return sum + delta;
}

std::pair<at::Tensor, at::Tensor> LlamaDecoderLayer::forward_unadded(const at::Tensor& x, const at::Tensor& pending,
                                                                     const std::vector<AttentionRows>& groups) const {
  // x + pending, then the norm, then q/k/v (on the decode path the norm runs inside the GEMV).
  const nn::Linear::NormedInput in = pending.defined() ? nn::Linear::NormedInput{pending, x, &input_layernorm}
                                                       : nn::Linear::NormedInput{x, at::Tensor(), &input_layernorm};
  nn::Linear::NormedProducts qkv =
      nn::Linear::forward_many_normed(in, {&self_attn.q_proj, &self_attn.k_proj, &self_attn.v_proj});
  const at::Tensor h = self_attn.forward_projected(qkv.ys, groups);
  return mlp.forward_normed({h, qkv.sum, &post_attention_layernorm});  // residual + h, the norm, the MLP
}

namespace {
// The hidden state after layers whose last residual add was left pending (forward_unadded).
at::Tensor add_pending(const at::Tensor& h, const at::Tensor& pending) { return pending.defined() ? h + pending : h; }
}  // namespace

LlamaModel::LlamaModel(LlamaConfig config, const nn::ParamSource& w, const std::optional<nn::QuantizationConfig>& quant,
                       const nn::LoadOptions& placement)
    : config_(std::move(config)), placement_(placement) {
  const LlamaConfig& c = config_;
  auto spec = [&](const std::string& path) -> std::optional<nn::QuantSpec> {
    return quant ? quant->spec_for(path) : std::nullopt;
  };
  auto linear = [&](const std::string& path, int64_t in, int64_t out, bool bias) {
    return nn::Linear::load(w, path, in, out, bias, spec(path), placement_);
  };
  const int64_t C = c.hidden_size, D = c.head_dim, H = c.num_attention_heads, Hkv = c.num_key_value_heads;
  embed_tokens_ = nn::Embedding::load(w, "model.embed_tokens", c.vocab_size, C, spec("model.embed_tokens"), placement_);
  // The checkpoint must hold exactly num_hidden_layers blocks: checked before allocating them.
  HEARTH_CHECK(c.num_hidden_layers >= 1 && w.contains(cat("model.layers.", c.num_hidden_layers - 1, ".input_layernorm.weight")),
               "config.json: num_hidden_layers = ", c.num_hidden_layers, ", but the weights have no layer ",
               c.num_hidden_layers - 1);
  HEARTH_CHECK(!w.contains(cat("model.layers.", c.num_hidden_layers, ".input_layernorm.weight")),
               "config.json: num_hidden_layers = ", c.num_hidden_layers, ", but the weights have more layers");
  layers_.resize(c.num_hidden_layers);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = cat("model.layers.", i, ".");
    LlamaDecoderLayer& l = layers_[i];
    l.input_layernorm = nn::RMSNorm::load(w, p + "input_layernorm", C, c.rms_norm_eps, placement_);
    l.post_attention_layernorm = nn::RMSNorm::load(w, p + "post_attention_layernorm", C, c.rms_norm_eps, placement_);
    LlamaAttention& a = l.self_attn;
    a.q_proj = linear(p + "self_attn.q_proj", C, H * D, c.qkv_bias);
    a.k_proj = linear(p + "self_attn.k_proj", C, Hkv * D, c.qkv_bias);
    a.v_proj = linear(p + "self_attn.v_proj", C, Hkv * D, c.qkv_bias);
    a.o_proj = linear(p + "self_attn.o_proj", H * D, C, c.o_bias);
    if (c.qk_norm) {
      a.q_norm = nn::RMSNorm::load(w, p + "self_attn.q_norm", D, c.rms_norm_eps, placement_);
      a.k_norm = nn::RMSNorm::load(w, p + "self_attn.k_norm", D, c.rms_norm_eps, placement_);
    }
    a.num_heads = H;
    a.num_kv_heads = Hkv;
    a.head_dim = D;
    a.scaling = std::pow(double(D), -0.5);
    a.sliding_window = c.layer_windows[i];
    l.mlp.gate_proj = linear(p + "mlp.gate_proj", C, c.intermediate_size, c.mlp_bias);
    l.mlp.up_proj = linear(p + "mlp.up_proj", C, c.intermediate_size, c.mlp_bias);
    l.mlp.down_proj = linear(p + "mlp.down_proj", c.intermediate_size, C, c.mlp_bias);
  }
  norm_ = nn::RMSNorm::load(w, "model.norm", C, c.rms_norm_eps, placement_);
  if (c.tie_word_embeddings) lm_head_ = embed_tokens_.as_linear();
  else lm_head_ = linear("lm_head", C, c.vocab_size, false);
  rotary_emb_ = nn::RotaryEmbedding(c.rope, D, c.max_position_embeddings, placement_.device);
}

Boundary LlamaModel::embed(const at::Tensor& input_ids) {
  HEARTH_CHECK(input_ids.dim() == 2, "LlamaModel: input_ids must be [B, T], got ", input_ids.sizes());
  return Boundary(embed_tokens_.forward(input_ids.to(placement_.device, at::kLong)));
}

Boundary LlamaModel::forward_layers(const Boundary& in, int64_t begin, int64_t end, const Positions& pos,
                                    cache::Caches* caches) {
  const at::Tensor& hidden = in.hidden;
  HEARTH_CHECK(pos.batch() == hidden.size(0), "LlamaModel: ", pos.batch(), " positions for a batch of ",
               hidden.size(0));
  HEARTH_CHECK(0 <= begin && begin <= end && end <= num_layers(), "LlamaModel: layer range [", begin, ", ", end,
               ") outside [0, ", num_layers(), ")");
  HEARTH_CHECK(!caches || static_cast<int64_t>(caches->size()) == num_layers(), "LlamaModel: got ",
               caches ? caches->size() : 0, " caches for ", num_layers(), " layers");
  if (caches && begin < end)
    if (auto* sc = dynamic_cast<cache::StaticKVCache*>((*caches)[begin].get()))
      return forward_static(in, begin, end, *sc->state(), *caches);
  const int64_t T = hidden.size(1);
  // Prompt chunks (T > 1) of rows at one position attend together; one-token rows go through
  // decode_rows, which takes one group per row.
  const std::vector<RowGroup> rows = row_groups(pos, caches, "LlamaModel", /*merge=*/T > 1);
  std::vector<AttentionRows> groups;
  for (const RowGroup& g : rows) {
    auto [cos, sin] = rotary_emb_.cos_sin(g.offset, T, hidden.scalar_type());
    groups.push_back(AttentionRows{g, cos, sin, nullptr, {}, {}});
  }
  at::Tensor h = hidden, pending;
  for (int64_t i = begin; i < end; ++i) {
    for (AttentionRows& g : groups) {
      if (!caches) break;
      cache::LayerCache* c = group_cache((*caches)[i].get(), g.rows);
      g.cache = dynamic_cast<cache::KVCacheBase*>(c);
      HEARTH_CHECK(g.cache, "LlamaModel: layer ", i, " cache is not a KV cache");
      HEARTH_CHECK(g.cache->offset() == g.rows.offset, "LlamaModel: layer ", i, " cache offset ", g.cache->offset(),
                   " != forward offset ", g.rows.offset);
    }
    std::tie(h, pending) = layers_[i].forward_unadded(h, pending, groups);
  }
  return Boundary(add_pending(h, pending));
}

Boundary LlamaModel::forward_static(const Boundary& in, int64_t begin, int64_t end, cache::StaticState& st,
                                    cache::Caches& caches) {
  const at::Tensor& hidden = in.hidden;
  const int64_t B = hidden.size(0), S = st.capacity;
  HEARTH_CHECK(hidden.size(1) == 1, "LlamaModel: a static step takes one token per row, got ", hidden.size(1));
  HEARTH_CHECK(st.positions.defined() && st.positions.numel() == B, "LlamaModel: static positions for ",
               st.positions.defined() ? st.positions.numel() : 0, " rows, batch ", B);
  const auto dtype = hidden.scalar_type();
  if (!st.cos_table.defined()) std::tie(st.cos_table, st.sin_table) = rotary_emb_.cos_sin(0, S, dtype);
  st.family_ran_static = true;
  AttentionRows g;
  g.rows = RowGroup{0, B, 0};
  g.cos = st.cos_table.index_select(0, st.positions).view({B, 1, 1, -1});
  g.sin = st.sin_table.index_select(0, st.positions).view({B, 1, 1, -1});
  at::Tensor kp = at::arange(S, st.positions.options()).view({1, S});
  at::Tensor qp = st.positions.view({B, 1});
  at::Tensor allowed = kp <= qp;
  const double lowest = nn::mask_min(dtype);
  at::Tensor zero = at::zeros({}, hidden.options());
  at::Tensor low = at::full({}, lowest, hidden.options());
  g.mask_full = at::where(allowed, zero, low).view({B, 1, 1, S});
  std::optional<int64_t> window;
  for (const auto& w : config_.layer_windows) {
    if (!w) continue;
    HEARTH_CHECK(!window || *window == *w, "LlamaModel: a static step takes one sliding-window width, got ", *window,
                 " and ", *w);
    window = w;
  }
  if (window) {
    at::Tensor w = allowed.logical_and(kp > qp - *window);
    g.mask_window = at::where(w, zero, low).view({B, 1, 1, S});
  }
  at::Tensor h = hidden, pending;
  for (int64_t i = begin; i < end; ++i) {
    g.cache = dynamic_cast<cache::StaticKVCache*>(caches[i].get());
    HEARTH_CHECK(g.cache, "LlamaModel: layer ", i, " is not a static cache in a static step");
    std::tie(h, pending) = layers_[i].forward_unadded(h, pending, {g});
  }
  return Boundary(add_pending(h, pending));
}

at::Tensor LlamaModel::head(const at::Tensor& hidden) { return lm_head_.forward(norm_.forward(hidden)); }

cache::Caches LlamaModel::make_cache() const {
  cache::Caches caches;
  for (const auto& w : config_.layer_windows) {
    if (w) caches.push_back(std::make_unique<cache::RotatingKVCache>(*w));
    else caches.push_back(std::make_unique<cache::KVCache>());
  }
  return caches;
}

int64_t LlamaModel::weight_bytes() const {
  int64_t n = embed_tokens_.nbytes() + norm_.weight().nbytes();
  if (!config_.tie_word_embeddings) n += lm_head_.nbytes();
  for (const auto& l : layers_) {
    const auto& a = l.self_attn;
    n += l.input_layernorm.weight().nbytes() + l.post_attention_layernorm.weight().nbytes();
    n += a.q_proj.nbytes() + a.k_proj.nbytes() + a.v_proj.nbytes() + a.o_proj.nbytes();
    if (a.q_norm) n += a.q_norm->weight().nbytes() + a.k_norm->weight().nbytes();
    n += l.mlp.gate_proj.nbytes() + l.mlp.up_proj.nbytes() + l.mlp.down_proj.nbytes();
  }
  return n;
}

std::vector<std::pair<std::string, nn::Linear*>> LlamaModel::linear_modules() {
  std::vector<std::pair<std::string, nn::Linear*>> out;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const std::string p = cat("model.layers.", i, ".");
    LlamaAttention& a = layers_[i].self_attn;
    nn::GatedMLP& m = layers_[i].mlp;
    out.emplace_back(p + "self_attn.q_proj", &a.q_proj);
    out.emplace_back(p + "self_attn.k_proj", &a.k_proj);
    out.emplace_back(p + "self_attn.v_proj", &a.v_proj);
    out.emplace_back(p + "self_attn.o_proj", &a.o_proj);
    out.emplace_back(p + "mlp.gate_proj", &m.gate_proj);
    out.emplace_back(p + "mlp.up_proj", &m.up_proj);
    out.emplace_back(p + "mlp.down_proj", &m.down_proj);
  }
  out.emplace_back("lm_head", &lm_head_);
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> LlamaModel::named_parameters() {
  std::vector<std::pair<std::string, at::Tensor>> out;
  auto dense = [&](const std::string& path, const nn::Linear& lin) { append_dense(out, path, lin); };
  dense("model.embed_tokens", embed_tokens_.as_linear());
  for (size_t i = 0; i < layers_.size(); ++i) {
    const std::string p = cat("model.layers.", i, ".");
    const auto& l = layers_[i];
    out.emplace_back(p + "input_layernorm.weight", l.input_layernorm.weight());
    dense(p + "self_attn.q_proj", l.self_attn.q_proj);
    dense(p + "self_attn.k_proj", l.self_attn.k_proj);
    dense(p + "self_attn.v_proj", l.self_attn.v_proj);
    dense(p + "self_attn.o_proj", l.self_attn.o_proj);
    if (l.self_attn.q_norm) {
      out.emplace_back(p + "self_attn.q_norm.weight", l.self_attn.q_norm->weight());
      out.emplace_back(p + "self_attn.k_norm.weight", l.self_attn.k_norm->weight());
    }
    out.emplace_back(p + "post_attention_layernorm.weight", l.post_attention_layernorm.weight());
    dense(p + "mlp.gate_proj", l.mlp.gate_proj);
    dense(p + "mlp.up_proj", l.mlp.up_proj);
    dense(p + "mlp.down_proj", l.mlp.down_proj);
  }
  out.emplace_back("model.norm.weight", norm_.weight());
  if (!config_.tie_word_embeddings) dense("lm_head", lm_head_);
  return out;
}

void LlamaModel::set_attention_backend(nn::AttentionBackend backend) {
  for (auto& l : layers_) l.self_attn.backend = backend;
}

void check_config(const nlohmann::json& config, const std::string& origin) { LlamaConfig::from_json(config, origin); }

std::unique_ptr<Model> create(const BuildArgs& args) {
  return std::make_unique<LlamaModel>(LlamaConfig::from_json(args.config, args.origin), args.weights,
                                      args.quantization, args.placement);
}

}  // namespace hearth::models::llama
