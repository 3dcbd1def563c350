// Gemma 4's static decode step (cache::StaticKVCache, captured in a CUDA graph by
// generate/graph_decode.cpp): one token per row at device-held positions, every layer over
// fixed full-capacity buffers under additive masks. Not the eager forward (gemma4.cpp), which is
// the reference: the step reuses its projections, norms, RoPE and block ops.
#include "core/error.h"
#include "models/gemma4/gemma4.h"

namespace hearth::models::gemma4 {

at::Tensor Gemma4Attention::forward_static(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                           const at::Tensor& mask, cache::StaticKVCache* cache,
                                           const cache::StaticKVCache* shared) const {
  at::Tensor q = query(x, cos, sin);
  at::Tensor keys, values;
  if (shared) {
    HEARTH_CHECK(!cache && shared->keys().defined(), "Gemma4Attention: a sharer's static step needs its donor's ",
                 "static buffers, written earlier in the step");
    keys = shared->keys();
    values = shared->values();
  } else {
    HEARTH_CHECK(cache, "Gemma4Attention: a static step without a static cache");
    auto [k, v] = key_value(x, cos, sin);
    const cache::KVView view = cache->update(k, v);  // the whole buffers; the mask hides the rest
    keys = view.keys;
    values = view.values;
  }
  nn::AttentionParams p;
  p.mask = mask;
  return attend(q, keys, values, p);
}

Boundary Gemma4Model::forward_static(const Boundary& in, int64_t begin, int64_t end, cache::StaticState& st,
                                     cache::Caches& caches) {
  const Gemma4Config& c = config_;
  const at::Tensor& hidden = in.hidden;
  const int64_t B = hidden.size(0), S = st.capacity;
  HEARTH_CHECK(hidden.size(1) == 1, "Gemma4Model: a static step takes one token per row, got ", hidden.size(1));
  HEARTH_CHECK(st.positions.defined() && st.positions.numel() == B, "Gemma4Model: static positions for ",
               st.positions.defined() ? st.positions.numel() : 0, " rows, batch ", B);
  const auto dtype = hidden.scalar_type();
  st.family_ran_static = true;
  // Device-side only (graph-safe): the masks over the capacity, and each type's RoPE rows computed
  // from the positions exactly as the eager path computes its [1, D] rows (Gemma4Rotary::cos_sin).
  at::Tensor kp = at::arange(S, st.positions.options()).view({1, S});
  at::Tensor qp = st.positions.view({B, 1});
  at::Tensor allowed = kp <= qp;
  at::Tensor zero = at::zeros({}, hidden.options());
  at::Tensor low = at::full({}, nn::mask_min(dtype), hidden.options());
  const at::Tensor mask_full = at::where(allowed, zero, low).view({B, 1, 1, S});
  // Key p is visible to the query at q iff q - W < p <= q (nn::AttentionParams::sliding_window):
  // positions a rotating cache had dropped (zeros in the buffers) are always below that.
  const at::Tensor mask_window =
      at::where(allowed.logical_and(kp > qp - c.sliding_window), zero, low).view({B, 1, 1, S});
  std::pair<at::Tensor, at::Tensor> rope[2];  // [0] full, [1] sliding; made on first use
  const at::Tensor per_layer_inputs = per_layer_stream(in);
  at::Tensor h = hidden;
  for (int64_t i = begin; i < end; ++i) {
    const bool sliding = c.sliding[i];
    if (!rope[sliding].first.defined()) {
      auto [cos, sin] = (sliding ? sliding_rotary_ : full_rotary_).cos_sin_at(st.positions, dtype);
      rope[sliding] = {cos.view({B, 1, 1, -1}), sin.view({B, 1, 1, -1})};
    }
    cache::StaticKVCache* own = nullptr;
    const cache::StaticKVCache* donor = nullptr;
    if (c.kv_shared(i)) {
      HEARTH_CHECK(!caches[i], "Gemma4Model: layer ", i, " shares K/V and takes no cache of its own");
      donor = dynamic_cast<const cache::StaticKVCache*>(caches[c.kv_source(i)].get());
      HEARTH_CHECK(donor, "Gemma4Model: layer ", i, " reads layer ", c.kv_source(i),
                   "'s K/V, which is not a static cache in a static step");
    } else {
      own = dynamic_cast<cache::StaticKVCache*>(caches[i].get());
      HEARTH_CHECK(own, "Gemma4Model: layer ", i, " is not a static cache in a static step");
    }
    const Gemma4DecoderLayer& l = layers_[i];
    const at::Tensor pli = per_layer_inputs.defined() ? per_layer_inputs.select(2, i) : at::Tensor();
    at::Tensor attn = l.self_attn.forward_static(l.input_layernorm.forward(h), rope[sliding].first,
                                                 rope[sliding].second, sliding ? mask_window : mask_full,
                                                 own, donor);
    h = l.around_attention(h, attn, pli);
  }
  return Boundary(h);
}

}  // namespace hearth::models::gemma4
