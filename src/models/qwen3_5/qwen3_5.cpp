// The Qwen3.5 forward pass, module for module as transformers' modeling_qwen3_5.py
// (Qwen3_5RMSNorm, Qwen3_5RMSNormGated, Qwen3_5Attention, Qwen3_5GatedDeltaNet,
// Qwen3_5DecoderLayer, Qwen3_5TextModel, Qwen3_5ForCausalLM); qwen3_next's fused projections as
// its fix_query_key_value_ordering. Loading and parameter lists are in load.cpp.
#include "models/qwen3_5/qwen3_5.h"

#include <algorithm>
#include <tuple>

#include "core/error.h"
#include "nn/fused_ops.h"
#include "nn/gated_delta.h"
#include "nn/lean_grad.h"

namespace hearth::models::qwen3_5 {

at::Tensor ZeroCenteredRMSNorm::forward(const at::Tensor& x) const {
  if (at::Tensor y = nn::fused_rms_norm(x, weight, eps, nn::NormScale::kFp32, offset); y.defined()) return y;
  // While autograd records, the lean Function (nn/lean_grad.h): these ops' values, no fp32 copy of x kept.
  if (nn::lean_grad_enabled() && nn::records_grad(x, weight)) return nn::rms_norm_lean_fp32w(x, weight, eps, offset);
  at::Tensor h = x.to(at::kFloat);
  h = h * at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  at::Tensor w = weight.to(at::kFloat);
  if (offset != 0.0) w = w + offset;  // transformers: output * (1.0 + self.weight.float())
  return (h * w).to(x.scalar_type());
}

at::Tensor RMSNormGated::forward(const at::Tensor& hidden, const at::Tensor& gate) const {
  if (at::Tensor y = nn::fused_rms_norm(hidden, weight, eps, nn::NormScale::kAfterRound, 0.0, gate); y.defined())
    return y;
  // While autograd records, the lean Function (nn/lean_grad.h): these ops' values, no fp32 copies kept.
  if (nn::lean_grad_enabled() && nn::records_grad(hidden, gate, weight))
    return nn::rms_norm_gated_lean(hidden, gate, weight, eps);
  const auto input_dtype = hidden.scalar_type();
  at::Tensor h = hidden.to(at::kFloat);
  at::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * at::rsqrt(variance + eps);  // norm before gate
  h = weight * h.to(input_dtype);
  h = h * at::silu(gate.to(at::kFloat));
  return h.to(input_dtype);
}

at::Tensor Attention::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t offset,
                              cache::KVCacheBase* cache, const at::Tensor& mask) const {
  const int64_t B = x.size(0), T = x.size(1), D = head_dim;
  // q_proj → [B, T, H, 2D], split per head into queries [.., :D] and the output gate [.., D:].
  const std::vector<at::Tensor> qkv = nn::Linear::forward_many(x, {&q_proj, &k_proj, &v_proj});
  at::Tensor qg = qkv[0].view({B, T, -1, 2 * D});
  at::Tensor q = qg.narrow(-1, 0, D);
  at::Tensor gate = qg.narrow(-1, D, D).reshape({B, T, -1});  // [B, T, H·D]
  q = q_norm.forward(q).transpose(1, 2);                                       // [B, H, T, D]
  at::Tensor k = k_norm.forward(qkv[1].view({B, T, -1, D})).transpose(1, 2);  // [B, Hkv, T, D]
  at::Tensor v = qkv[2].view({B, T, -1, D}).transpose(1, 2);
  q = nn::apply_rotary(q, cos, sin);
  k = nn::apply_rotary(k, cos, sin);
  cache::KVView kv{k, v, offset};
  if (cache) kv = cache->update(k, v);
  nn::AttentionParams p;
  p.scale = scaling;
  p.q_pos0 = offset;
  p.k_pos0 = kv.pos0;
  p.backend = backend;
  p.mask = mask;
  at::Tensor out = nn::attention(q, kv.keys, kv.values, p);  // [B, H, T, D]
  out = out.transpose(1, 2).contiguous().reshape({B, T, -1});
  out = out * at::sigmoid(gate);
  return o_proj.forward(out);
}

at::Tensor GatedDeltaNet::forward(const at::Tensor& x, cache::RecurrentCache* cache) const {
  const int64_t B = x.size(0), T = x.size(1);
  const int64_t Dk = head_k_dim, Dv = head_v_dim, kd = key_dim(), vd = value_dim();
  const bool has_state = cache && cache->conv_state().defined();

  at::Tensor mixed_qkv, z, b, a;  // [B, T, convDim], [B, T, Hv, Dv], [B, T, Hv], [B, T, Hv]
  if (!fused) {
    std::vector<at::Tensor> p = nn::Linear::forward_many(x, {&in_proj_qkv, &in_proj_z, &in_proj_b});
    mixed_qkv = p[0];
    z = p[1].reshape({B, T, -1, Dv});
    b = p[2];
    a = in_proj_a.forward(x);
  } else {
    // qwen3_next: per key head [q (Dk), k (Dk), v (r·Dv), z (r·Dv)] and [b (r), a (r)], r = Hv/Hk.
    const int64_t r = num_v_heads / num_k_heads;
    at::Tensor qkvz = in_proj_qkvz.forward(x).view({B, T, num_k_heads, 2 * Dk + 2 * r * Dv});
    at::Tensor ba = in_proj_ba.forward(x).view({B, T, num_k_heads, 2 * r});
    at::Tensor q = qkvz.narrow(3, 0, Dk), k = qkvz.narrow(3, Dk, Dk);
    at::Tensor v = qkvz.narrow(3, 2 * Dk, r * Dv).reshape({B, T, -1, Dv});
    z = qkvz.narrow(3, 2 * Dk + r * Dv, r * Dv).reshape({B, T, -1, Dv});
    b = ba.narrow(3, 0, r).reshape({B, T, num_v_heads});
    a = ba.narrow(3, r, r).reshape({B, T, num_v_heads});
    mixed_qkv = at::cat({q.reshape({B, T, -1}), k.reshape({B, T, -1}), v.reshape({B, T, -1})}, -1);
  }

  at::Tensor core;  // [B, T, Hv, Dv]: the rule's output
  if (has_state && T == 1) {
    // One cached token: on CUDA the conv update, the l2norms, β, g and the recurrent rule below
    // run as one kernel, the state updated in place in a static cache (nn::fused_gated_delta_step;
    // undefined where it does not apply, then the ops below).
    auto* st = dynamic_cast<cache::StaticRecurrentCache*>(cache);
    nn::GatedDeltaStep s = nn::fused_gated_delta_step(mixed_qkv, conv1d_weight.squeeze(1), cache->conv_state(), a, b,
                                                      A_log, dt_bias, cache->recurrent_state(), num_k_heads, Dk, Dv,
                                                      /*in_place=*/st != nullptr);
    if (s.out.defined()) {
      if (st) st->write(s.conv_state, s.state);  // the state is already in place: copies the conv window only
      else cache->update(s.conv_state, s.state, T);
      core = s.out;
    }
  }
  if (!core.defined()) {
    // Causal conv1d over time with the cached window: [B, convDim, T] in, same out.
    auto [conv_out, new_conv_state] = nn::causal_conv1d(mixed_qkv.transpose(1, 2), conv1d_weight.squeeze(1),
                                                        has_state ? cache->conv_state() : at::Tensor());
    mixed_qkv = conv_out.transpose(1, 2);  // [B, T, convDim]
    at::Tensor query = mixed_qkv.narrow(-1, 0, kd).reshape({B, T, -1, Dk});
    at::Tensor key = mixed_qkv.narrow(-1, kd, kd).reshape({B, T, -1, Dk});
    at::Tensor value = mixed_qkv.narrow(-1, 2 * kd, vd).reshape({B, T, -1, Dv});

    at::Tensor beta = b.sigmoid();
    // g = -exp(A_log) · softplus(a + dt_bias), in float32 (log decay per token and value head).
    at::Tensor g = -A_log.to(at::kFloat).exp() * at::softplus(a.to(at::kFloat) + dt_bias);

    nn::GatedDeltaOut r = (has_state && T == 1)
                              ? nn::recurrent_gated_delta_rule(query, key, value, g, beta, cache->recurrent_state())
                              : nn::chunk_gated_delta_rule(query, key, value, g, beta,
                                                           has_state ? cache->recurrent_state() : at::Tensor());
    if (auto* st = dynamic_cast<cache::StaticRecurrentCache*>(cache)) st->write(new_conv_state, r.state);
    else if (cache) cache->update(new_conv_state, r.state, T);
    core = r.out;
  }

  core = norm.forward(core.reshape({-1, Dv}), z.reshape({-1, Dv}));
  core = core.reshape({B, T, -1});
  return out_proj.forward(core);
}

at::Tensor DecoderLayer::mlp_residual(const at::Tensor& residual, const at::Tensor& mixed) const {
  const ZeroCenteredRMSNorm& n = post_attention_layernorm;
  if (auto [h, normed] = nn::fused_add_rms_norm(mixed, residual, n.weight, n.eps, nn::NormScale::kFp32, n.offset);
      h.defined())
    return h + mlp.forward(normed);  // the add and the norm below in one kernel (inference on CUDA)
  at::Tensor h = residual + mixed;
  return h + mlp.forward(post_attention_layernorm.forward(h));
}

Boundary Qwen3_5Model::embed(const at::Tensor& input_ids) {
  HEARTH_CHECK(input_ids.dim() == 2, model_type(), ": input_ids must be [B, T], got ", input_ids.sizes());
  return Boundary(embed_tokens_.forward(input_ids.to(placement_.device, at::kLong)));
}

Boundary Qwen3_5Model::forward_layers(const Boundary& in, int64_t begin, int64_t end, const Positions& pos,
                                      cache::Caches* caches) {
  const at::Tensor& hidden = in.hidden;
  const std::string& who = model_type();
  HEARTH_CHECK(pos.batch() == hidden.size(0), who, ": ", pos.batch(), " positions for a batch of ", hidden.size(0));
  HEARTH_CHECK(0 <= begin && begin <= end && end <= num_layers(), who, ": layer range [", begin, ", ", end,
               ") outside [0, ", num_layers(), ")");
  HEARTH_CHECK(!caches || static_cast<int64_t>(caches->size()) == num_layers(), who, ": got ",
               caches ? caches->size() : 0, " caches for ", num_layers(), " layers");
  // One group of all rows, or (a ragged batch: continuous batching) one group per row, each with its
  // own position and caches; the token mixers run per group, the MLPs on all rows at once.
  if (caches)
    for (int64_t i = begin; i < end; ++i) {
      cache::LayerCache* c = (*caches)[i].get();
      if (auto* kv = dynamic_cast<cache::StaticKVCache*>(c)) return forward_static(in, begin, end, *kv->state(), *caches);
      if (auto* rc = dynamic_cast<cache::StaticRecurrentCache*>(c))
        return forward_static(in, begin, end, *rc->state(), *caches);
    }
  const std::vector<RowGroup> groups = row_groups(pos, caches, who.c_str());
  const int64_t T = hidden.size(1);
  std::vector<std::pair<at::Tensor, at::Tensor>> rope(groups.size());
  const auto first = config_.layer_types.begin() + begin, last = config_.layer_types.begin() + end;
  if (std::find(first, last, LayerKind::kFull) != last)  // RoPE tables only where a full layer runs
    for (size_t g = 0; g < groups.size(); ++g) rope[g] = rotary_emb_.cos_sin(groups[g].offset, T, hidden.scalar_type());
  at::Tensor h = hidden;
  for (int64_t i = begin; i < end; ++i) {
    DecoderLayer& l = layers_[i];
    at::Tensor residual = h;
    at::Tensor x = l.input_layernorm.forward(h);
    std::vector<at::Tensor> outs;
    for (size_t g = 0; g < groups.size(); ++g) {
      const RowGroup& rg = groups[g];
      at::Tensor xg = groups.size() == 1 ? x : x.narrow(0, rg.begin, rg.count);
      cache::LayerCache* c = caches ? group_cache((*caches)[i].get(), rg) : nullptr;
      if (caches) {
        HEARTH_CHECK(c, who, ": layer ", i, " has no cache");
        HEARTH_CHECK(c->offset() == rg.offset, who, ": layer ", i, " cache offset ", c->offset(),
                     " != forward offset ", rg.offset);
      }
      if (l.kind == LayerKind::kLinear) {
        auto* rc = dynamic_cast<cache::RecurrentCache*>(c);
        HEARTH_CHECK(!c || rc, who, ": layer ", i, " (linear attention) needs a recurrent cache, got ", c->kind());
        outs.push_back(l.linear_attn->forward(xg, rc));
      } else {
        auto* kv = dynamic_cast<cache::KVCacheBase*>(c);
        HEARTH_CHECK(!c || kv, who, ": layer ", i, " (full attention) needs a KV cache, got ", c->kind());
        outs.push_back(l.self_attn->forward(xg, rope[g].first, rope[g].second, rg.offset, kv));
      }
    }
    h = l.mlp_residual(residual, outs.size() == 1 ? outs[0] : at::cat(outs, 0));
  }
  return Boundary(h);
}

Boundary Qwen3_5Model::forward_static(const Boundary& in, int64_t begin, int64_t end, cache::StaticState& st,
                                      cache::Caches& caches) {
  const std::string& who = model_type();
  const at::Tensor& hidden = in.hidden;
  const int64_t B = hidden.size(0), S = st.capacity;
  HEARTH_CHECK(hidden.size(1) == 1, who, ": a static step takes one token per row, got ", hidden.size(1));
  HEARTH_CHECK(st.positions.defined() && st.positions.numel() == B, who, ": static positions for ",
               st.positions.defined() ? st.positions.numel() : 0, " rows, batch ", B);
  const auto dtype = hidden.scalar_type();
  if (!st.cos_table.defined()) std::tie(st.cos_table, st.sin_table) = rotary_emb_.cos_sin(0, S, dtype);
  st.family_ran_static = true;
  // Device-side only (graph-safe): each row's RoPE row and its additive mask over the capacity.
  at::Tensor cos = st.cos_table.index_select(0, st.positions).view({B, 1, 1, -1});
  at::Tensor sin = st.sin_table.index_select(0, st.positions).view({B, 1, 1, -1});
  at::Tensor allowed = at::arange(S, st.positions.options()).view({1, S}) <= st.positions.view({B, 1});
  at::Tensor mask = at::where(allowed, at::zeros({}, hidden.options()), at::full({}, nn::mask_min(dtype), hidden.options()))
                        .view({B, 1, 1, S});
  at::Tensor h = hidden;
  for (int64_t i = begin; i < end; ++i) {
    DecoderLayer& l = layers_[i];
    at::Tensor residual = h;
    at::Tensor x = l.input_layernorm.forward(h);
    if (l.kind == LayerKind::kLinear) {
      auto* rc = dynamic_cast<cache::StaticRecurrentCache*>(caches[i].get());
      HEARTH_CHECK(rc, who, ": layer ", i, " (linear attention) is not a static recurrent cache in a static step");
      x = l.linear_attn->forward(x, rc);
    } else {
      auto* kv = dynamic_cast<cache::StaticKVCache*>(caches[i].get());
      HEARTH_CHECK(kv, who, ": layer ", i, " (full attention) is not a static KV cache in a static step");
      x = l.self_attn->forward(x, cos, sin, st.host_offset, kv, mask);
    }
    h = l.mlp_residual(residual, x);
  }
  return Boundary(h);
}

at::Tensor Qwen3_5Model::head(const at::Tensor& hidden) { return lm_head_.forward(norm_.forward(hidden)); }

cache::Caches Qwen3_5Model::make_cache() const {
  cache::Caches caches;
  for (LayerKind k : config_.layer_types) {
    if (k == LayerKind::kFull) caches.push_back(std::make_unique<cache::KVCache>());
    else caches.push_back(std::make_unique<cache::RecurrentCache>());
  }
  return caches;
}

std::vector<int64_t> Qwen3_5Model::isolated_layers() const {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < num_layers(); ++i)
    if (config_.layer_types[i] == LayerKind::kFull) out.push_back(i);
  return out;
}

void Qwen3_5Model::set_attention_backend(nn::AttentionBackend backend) {
  for (auto& l : layers_)
    if (l.self_attn) l.self_attn->backend = backend;
}

void check_config(const nlohmann::json& config, const std::string& origin) { Qwen3_5Config::from_json(config, origin); }

std::unique_ptr<Model> create(const BuildArgs& args) {
  return std::make_unique<Qwen3_5Model>(Qwen3_5Config::from_json(args.config, args.origin), args.weights,
                                        args.quantization, args.placement, args.origin);
}

}  // namespace hearth::models::qwen3_5
