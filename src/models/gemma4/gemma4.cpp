// The Gemma 4 forward pass, module for module as transformers' modeling_gemma4.py
// (Gemma4RMSNorm, Gemma4TextRotaryEmbedding, Gemma4TextAttention, Gemma4TextMLP,
// Gemma4TextDecoderLayer, Gemma4TextModel, Gemma4ForCausalLM), with the K/V of sharing layers
// passed as Boundary streams. Weight loading and the module lists are in gemma4_load.cpp, the
// static decode step in gemma4_static.cpp.
#include "models/gemma4/gemma4.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "nn/fused_ops.h"
#include "nn/lean_grad.h"
#include "nn/mlp_chunk.h"
#include "nn/rope.h"

namespace hearth::models::gemma4 {

namespace {

// The Boundary streams a KV donor hands its sharers.
std::string kv_stream(bool sliding, const char* part) {
  return cat("shared_kv.", Gemma4Config::type_name(sliding), ".", part);
}

}  // namespace

at::Tensor Gemma4RMSNorm::forward(const at::Tensor& x) const {
  if (at::Tensor y = nn::fused_rms_norm(x, weight ? *weight : at::Tensor(), eps,
                                        weight ? nn::NormScale::kFp32 : nn::NormScale::kNone);
      y.defined())
    return y;
  const at::Tensor w = weight ? *weight : at::Tensor();
  // While autograd records, the lean Function (nn/lean_grad.h): these ops' values, no fp32 copy of x kept.
  if (nn::lean_grad_enabled() && nn::records_grad(x, w))
    return nn::rms_norm_lean_fp32w(x, w, eps, 0.0, nn::RstdOp::kPowMinusHalf);
  at::Tensor h = x.to(at::kFloat);
  at::Tensor mean_squared = h.pow(2).mean(-1, /*keepdim=*/true) + eps;
  h = h * at::pow(mean_squared, -0.5);
  if (weight) h = h * weight->to(at::kFloat);
  return h.to(x.scalar_type());
}

at::Tensor Gemma4RMSNorm::forward_add(const at::Tensor& x, const at::Tensor& residual) const {
  if (at::Tensor y = nn::fused_rms_norm(x, weight ? *weight : at::Tensor(), eps,
                                        weight ? nn::NormScale::kFp32 : nn::NormScale::kNone, 0.0, {}, residual);
      y.defined())
    return y;
  return residual + forward(x);
}

std::pair<at::Tensor, at::Tensor> Gemma4Rotary::cos_sin(int64_t offset, int64_t T, at::ScalarType dtype) const {
  return cos_sin_at(at::arange(offset, offset + T, at::TensorOptions().dtype(at::kLong).device(inv_freq.device())),
                    dtype);
}

std::pair<at::Tensor, at::Tensor> Gemma4Rotary::cos_sin_at(const at::Tensor& positions, at::ScalarType dtype) const {
  // [N, D/2]: one product per entry, as the reference's matmul
  at::Tensor freqs = at::outer(positions.to(at::kFloat), inv_freq);
  at::Tensor emb = at::cat({freqs, freqs}, -1);
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

at::Tensor Gemma4Attention::query(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) const {
  const int64_t B = x.size(0), T = x.size(1);
  at::Tensor q = q_norm.forward(q_proj.forward(x).view({B, T, -1, head_dim}));
  return nn::apply_rotary(q.transpose(1, 2), cos, sin);  // [B, H, T, D]
}

std::pair<at::Tensor, at::Tensor> Gemma4Attention::key_value(const at::Tensor& x, const at::Tensor& cos,
                                                             const at::Tensor& sin) const {
  HEARTH_CHECK(has_kv, "Gemma4Attention: a KV-sharing layer was run without its donor's K/V");
  const int64_t B = x.size(0), T = x.size(1);
  at::Tensor k_raw, v_raw;
  if (has_v_proj) {
    const std::vector<at::Tensor> kv = nn::Linear::forward_many(x, {&k_proj, &v_proj});
    k_raw = kv[0].view({B, T, -1, head_dim});
    v_raw = kv[1].view({B, T, -1, head_dim});
  } else {
    k_raw = v_raw = k_proj.forward(x).view({B, T, -1, head_dim});
  }
  at::Tensor k = nn::apply_rotary(k_norm.forward(k_raw).transpose(1, 2), cos, sin);  // [B, Hkv, T, D]
  at::Tensor v = v_norm.forward(v_raw).transpose(1, 2);
  return {k, v};
}

at::Tensor Gemma4Attention::attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   nn::AttentionParams p) const {
  const int64_t B = q.size(0), T = q.size(2);
  p.scale = 1.0;
  p.backend = backend;
  at::Tensor out = nn::attention(q, k, v, p);  // [B, H, T, D]
  out = out.transpose(1, 2).contiguous().reshape({B, T, -1});
  return o_proj.forward(out);
}

at::Tensor Gemma4Attention::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t offset,
                                    cache::KVCacheBase* cache, const SharedKV* shared, SharedKV* own) const {
  at::Tensor q = query(x, cos, sin);
  SharedKV kv;
  if (shared) {
    kv = *shared;
  } else {
    auto [k, v] = key_value(x, cos, sin);
    cache::KVView view{k, v, offset};
    if (cache) view = cache->update(k, v);
    if (sliding_window) {
      // transformers' DynamicSlidingWindowLayer.update returns only the last window-1 cached
      // tokens plus the new ones; attending over exactly those keys (not older, masked ones the
      // rotating cache still holds) keeps the softmax and matmul reductions the same length, so
      // bf16 decode steps match bit for bit. Those keys are all any query here can see.
      const int64_t first = std::max(view.pos0, offset - *sliding_window + 1);
      const int64_t drop = first - view.pos0;
      if (drop > 0) {
        const int64_t keep = view.keys.size(2) - drop;
        view = {view.keys.narrow(2, drop, keep), view.values.narrow(2, drop, keep), first};
      }
    }
    kv = {view.keys, view.values, view.pos0};
    if (own) *own = kv;
  }
  nn::AttentionParams p;
  p.q_pos0 = offset;
  p.k_pos0 = kv.pos0;
  p.sliding_window = sliding_window;
  return attend(q, kv.k, kv.v, p);
}

at::Tensor Gemma4MLP::forward(const at::Tensor& x) const {
  auto whole = [this](const at::Tensor& h) {
    const std::vector<at::Tensor> gu = nn::Linear::forward_many(h, {&gate_proj, &up_proj});
    return down_proj.forward(at::gelu(gu[0], "tanh") * gu[1]);
  };
  if (nn::MlpChunkScope::current() <= 0) return whole(x);
  return nn::position_wise_chunked(x, whole, {&gate_proj, &up_proj, &down_proj});  // long training inputs
}

at::Tensor Gemma4DecoderLayer::forward(const at::Tensor& x, const at::Tensor& per_layer_input, const at::Tensor& cos,
                                       const at::Tensor& sin, int64_t offset, cache::KVCacheBase* cache,
                                       const SharedKV* shared, SharedKV* own) const {
  return around_attention(x, self_attn.forward(input_layernorm.forward(x), cos, sin, offset, cache, shared, own),
                          per_layer_input);
}

at::Tensor Gemma4DecoderLayer::around_attention(const at::Tensor& x, const at::Tensor& attn,
                                                const at::Tensor& per_layer_input) const {
  // transformers: residual = x; h = post_attention_layernorm(attn); h = residual + h; (and so on)
  at::Tensor h = post_attention_layernorm.forward_add(attn, x);

  at::Tensor residual = h;
  h = pre_feedforward_layernorm.forward(h);
  h = mlp.forward(h);
  h = post_feedforward_layernorm.forward_add(h, residual);

  if (has_per_layer_input) {
    residual = h;
    h = per_layer_input_gate.forward(h);
    h = at::gelu(h, "tanh");
    h = h * per_layer_input;
    h = per_layer_projection.forward(h);
    h = post_per_layer_input_norm.forward_add(h, residual);
  }
  if (layer_scalar) h = h * *layer_scalar;
  return h;
}

Boundary Gemma4Model::embed(const at::Tensor& input_ids) {
  HEARTH_CHECK(input_ids.dim() == 2, "Gemma4Model: input_ids must be [B, T], got ", input_ids.sizes());
  const at::Tensor ids = input_ids.to(placement_.device, at::kLong);
  const Gemma4Config& c = config_;
  // Gemma4TextScaledWordEmbedding: the fp32 scale is cast to the weight dtype before multiplying.
  // Made on the device (a fill, no host-to-device copy), so a CUDA graph can capture the step.
  auto scaled = [](const at::Tensor& e, int64_t width) {
    return e * at::full({}, std::sqrt(double(width)), e.options().dtype(at::kFloat)).to(e.scalar_type());
  };
  at::Tensor h = scaled(embed_tokens_.forward(ids), c.hidden_size);
  Boundary b(h);
  if (c.hidden_size_per_layer_input > 0) {
    const int64_t B = ids.size(0), T = ids.size(1), L = c.num_hidden_layers, P = c.hidden_size_per_layer_input;
    // A token past the per-layer table (vocab_size_per_layer_input < vocab_size) looks up row 0, as
    // mlx-lm's and vLLM's Gemma 4 do (transformers' text model would index out of range).
    const at::Tensor pl_ids = c.vocab_size_per_layer_input < c.vocab_size
                                  ? at::where(ids < c.vocab_size_per_layer_input, ids, at::zeros_like(ids))
                                  : ids;
    // get_per_layer_inputs, then project_per_layer_inputs.
    at::Tensor tok = scaled(embed_tokens_per_layer_.forward(pl_ids), P).reshape({B, T, L, P});
    at::Tensor proj = per_layer_model_projection_.forward(h) * std::pow(double(c.hidden_size), -0.5);
    proj = per_layer_projection_norm_.forward(proj.reshape({B, T, L, P}));
    b.set("per_layer_inputs", (proj + tok) * std::pow(2.0, -0.5));
  }
  return b;
}

Boundary Gemma4Model::forward_layers(const Boundary& in, int64_t begin, int64_t end, const Positions& pos,
                                     cache::Caches* caches) {
  const Gemma4Config& c = config_;
  HEARTH_CHECK(pos.batch() == in.hidden.size(0), "Gemma4Model: ", pos.batch(), " positions for a batch of ",
               in.hidden.size(0));
  const int64_t offset = pos.common("Gemma4Model");
  HEARTH_CHECK(0 <= begin && begin <= end && end <= num_layers(), "Gemma4Model: layer range [", begin, ", ", end,
               ") outside [0, ", num_layers(), ")");
  HEARTH_CHECK(!caches || static_cast<int64_t>(caches->size()) == num_layers(), "Gemma4Model: got ",
               caches ? caches->size() : 0, " caches for ", num_layers(), " layers");
  if (caches && begin < end)  // the static step: the first cache decides (sharers' entries are null)
    for (const auto& entry : *caches)
      if (entry) {
        if (auto* sc = dynamic_cast<cache::StaticKVCache*>(entry.get()))
          return forward_static(in, begin, end, *sc->state(), *caches);
        break;
      }
  const int64_t T = in.hidden.size(1);
  const at::ScalarType dtype = in.hidden.scalar_type();
  std::pair<at::Tensor, at::Tensor> rope[2];  // [0] full, [1] sliding; made on first use
  Boundary out = in;
  const at::Tensor per_layer_inputs = per_layer_stream(in);
  at::Tensor h = in.hidden;
  for (int64_t i = begin; i < end; ++i) {
    const bool sliding = c.sliding[i];
    if (!rope[sliding].first.defined())
      rope[sliding] = (sliding ? sliding_rotary_ : full_rotary_).cos_sin(offset, T, dtype);
    cache::KVCacheBase* kv = nullptr;
    if (caches) {
      cache::LayerCache* entry = (*caches)[i].get();
      if (c.kv_shared(i)) {
        HEARTH_CHECK(!entry, "Gemma4Model: layer ", i, " shares K/V and takes no cache of its own");
      } else {
        kv = dynamic_cast<cache::KVCacheBase*>(entry);
        HEARTH_CHECK(kv, "Gemma4Model: layer ", i, " cache is not a KV cache");
        HEARTH_CHECK(kv->offset() == offset, "Gemma4Model: layer ", i, " cache offset ", kv->offset(),
                     " != forward offset ", offset);
      }
    }
    SharedKV shared, own;
    if (c.kv_shared(i)) {
      const at::Tensor* k = out.find(kv_stream(sliding, "k"));
      const at::Tensor* v = out.find(kv_stream(sliding, "v"));
      const at::Tensor* p0 = out.find(kv_stream(sliding, "pos0"));
      HEARTH_CHECK(k && v && p0, "Gemma4Model: layer ", i, " reads the K/V of layer ", c.kv_source(i),
                   ", which is not in the boundary (run the layers from ", c.kv_source(i), " on in one pass)");
      shared = {*k, *v, p0->item<int64_t>()};
    }
    const at::Tensor pli = per_layer_inputs.defined() ? per_layer_inputs.select(2, i) : at::Tensor();
    h = layers_[i].forward(h, pli, rope[sliding].first, rope[sliding].second, offset, kv,
                           c.kv_shared(i) ? &shared : nullptr, c.kv_donor(i) ? &own : nullptr);
    if (c.kv_donor(i)) {
      out.set(kv_stream(sliding, "k"), own.k);
      out.set(kv_stream(sliding, "v"), own.v);
      out.set(kv_stream(sliding, "pos0"), at::scalar_tensor(own.pos0, at::kLong));
    }
  }
  out.hidden = h;
  return out;
}

at::Tensor Gemma4Model::per_layer_stream(const Boundary& in) const {
  if (config_.hidden_size_per_layer_input <= 0) return at::Tensor();
  const at::Tensor* pli = in.find("per_layer_inputs");
  HEARTH_CHECK(pli && pli->dim() == 4 && pli->size(2) == config_.num_hidden_layers,
               "Gemma4Model: the boundary has no per_layer_inputs [B, T, L, P] stream (made by embed)");
  return *pli;
}

at::Tensor Gemma4Model::head(const at::Tensor& hidden) {
  at::Tensor logits = lm_head_.forward(norm_.forward(hidden));
  if (config_.final_logit_softcapping) {
    const double cap = *config_.final_logit_softcapping;
    logits = at::tanh(logits / cap) * cap;
  }
  return logits;
}

cache::Caches Gemma4Model::make_cache() const {
  cache::Caches caches;
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    if (config_.kv_shared(i)) caches.push_back(nullptr);
    else if (config_.sliding[i]) caches.push_back(std::make_unique<cache::RotatingKVCache>(config_.sliding_window));
    else caches.push_back(std::make_unique<cache::KVCache>());
  }
  return caches;
}

void Gemma4Model::set_attention_backend(nn::AttentionBackend backend) {
  for (auto& l : layers_) l.self_attn.backend = backend;
}

void check_config(const nlohmann::json& config, const std::string& origin) { Gemma4Config::from_json(config, origin); }

std::unique_ptr<Model> create(const BuildArgs& args) {
  return std::make_unique<Gemma4Model>(Gemma4Config::from_json(args.config, args.origin), args.weights,
                                       args.quantization, args.placement);
}

}  // namespace hearth::models::gemma4
