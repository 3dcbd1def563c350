// Causal (optionally sliding-window) GQA/MQA attention over already-projected, already-rotated
// q/k/v: a plain-libtorch path that is transformers' eager_attention_forward op for op, and an
// SDPA path where libtorch has it. Not the projections or RoPE (the model's attention module).
#pragma once
#include <ATen/ATen.h>

#include <optional>

namespace hearth::nn {

enum class AttentionBackend { kAuto, kPlain, kSdpa };

struct AttentionParams {
  double scale = 1.0;                     // usually head_dim^-0.5
  int64_t q_pos0 = 0;                     // absolute position of q[:, :, 0]
  int64_t k_pos0 = 0;                     // absolute position of k[:, :, 0]
  std::optional<int64_t> sliding_window;  // key j visible to query i iff i - W < j <= i
  AttentionBackend backend = AttentionBackend::kAuto;  // kAuto: SDPA when compat::kHasSdpa
  // When defined: the additive mask [B or 1, 1, T, S] (0 = attend, a large negative = masked) used
  // instead of one built from the positions above (a static decode step: positions on the device).
  at::Tensor mask;
};

/// transformers' repeat_kv: [B, Hkv, S, D] → [B, Hkv·n_rep, S, D] (head h uses kv head h / n_rep).
at::Tensor repeat_kv(const at::Tensor& x, int64_t n_rep);

/// The "masked" value of additive masks in `dtype`: torch.finfo(dtype).min as transformers uses.
/// Throws hearth::Error for a non-floating dtype.
double mask_min(at::ScalarType dtype);

/// Additive mask [T, S] in `dtype` (0 = attend, finfo(dtype).min = masked) for queries at
/// q_pos0.. and keys at k_pos0..; undefined tensor when every key is visible to every query.
at::Tensor attention_mask(int64_t T, int64_t S, const AttentionParams& p, at::ScalarType dtype, at::Device device);

/// Sliding-window attention by query blocks of `block` positions, for long windowed prefills and
/// training: each block of queries attends only the keys its windows can reach (at most block + W - 1
/// of them, with a [block, keys] mask), so memory and work are O(T·(block + W)) instead of the [T, S]
/// mask and scores of one call. q [B, H, T, D], k/v [B, Hkv, S, D] → [B, H, T, D], equal to
/// attention() within rounding (a hidden key adds exactly 0 either way; the reductions are shorter)
/// and differentiable. Undefined tensor when it does not apply: no window, an explicit mask,
/// block < 1, T ≤ block, or a query with no visible key (attention() then gives it equal weights
/// over all keys; the blocks cannot). Used by attention() when the [T, S] mask would pass 16M
/// entries and the window is under a quarter of S (the prompts of the goldens stay unblocked).
at::Tensor attention_sliding_blocked(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const AttentionParams& p, int64_t block);

/// softmax(q kᵀ · scale + mask) v for q [B, H, T, D], k/v [B, Hkv, S, D] (H % Hkv == 0)
/// → [B, H, T, D]. Plain path: scores and softmax as transformers' eager path (softmax in fp32,
/// cast back to q's dtype). Throws hearth::Error on shape mismatch or kSdpa without SDPA.
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionParams& p);

}  // namespace hearth::nn
