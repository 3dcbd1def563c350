// Launcher of Hearth's split-K decode attention (kernels/decode_attention.cu, "flash-decoding"):
// out = softmax(q kᵀ · scale + mask) v for a few query rows per kv head (a decode step, T·n_rep ≤ 64)
// over a long key sequence, the keys cut into splits that run as separate blocks (so B·Hkv·splits
// blocks fill the GPU instead of B·Hkv), each with FlashAttention-2's online softmax, then merged by
// their (max, sum) in a second kernel. Plain C++ (raw pointers, no ATen) so the .cu compiles
// standalone with nvcc; the host-side planning below is inline so that CPU tests can check it.
// Not the dispatch (nn/decode_attention.cpp decides when it applies) and no backward.
//
// Sources: Dao, Haziza, Massa, Sizov, "Flash-Decoding for long-context inference" (2023): split the
// keys, attend per split, rescale-and-sum by log-sum-exp; Dao, "FlashAttention-2" (2023): the
// online softmax (running max m, running sum l, accumulator rescaled by exp(m_old − m_new)).
#pragma once
#include <cstdint>

#include "quantized_matmul.h"  // QDtype

namespace hearth::kernels {

/// Threads of one split block (4 warps).
constexpr int kDecodeAttentionThreads = 128;
/// Largest number of query rows per kv head (n_rep·T) and of rows · head dim (the query rows are
/// held in shared memory as float32: 64 rows of 64, 32 of 128 or 16 of 256).
constexpr int64_t kDecodeAttentionMaxRows = 64;
constexpr int64_t kDecodeAttentionMaxRowsTimesD = 4096;

/// Keys per shared-memory tile of the split kernel: one tile of keys (and one of values) is 8 KB
/// when rows ≤ 8, 4 KB above (the query rows then take the room), so 8192/(D·elem_bytes) or half:
/// bf16/fp16 D = 64/128/256 → 64/32/16 keys, float32 → 32/16/8 (halved for > 8 rows). The kernel
/// uses this same function for its compile-time tile, so host planning and device agree.
constexpr int decode_attention_tile_keys(int elem_bytes, int head_dim, int64_t rows) {
  return (rows <= 8 ? 8192 : 4096) / (head_dim * elem_bytes);
}

/// Bytes of one element of `dt`.
constexpr int decode_attention_elem_bytes(QDtype dt) { return dt == QDtype::kFloat32 ? 4 : 2; }

/// How the keys are cut: n_split blocks per (batch row, kv head), split s attending keys
/// [s·keys_per_split, min(S, (s+1)·keys_per_split)); every split holds at least one key.
struct DecodeAttentionPlan {
  int n_split = 1;
  int64_t keys_per_split = 0;
};

/// The split count for `bh` = B·Hkv (batch row, kv head) pairs over S keys (S ≥ 1) with the tile
/// size `tile_keys` on a GPU of `sm_count` multiprocessors: enough splits that bh·n_split reaches
/// about 4 blocks per multiprocessor (≥ 2 waves of one block per SM; about 5 blocks of this kernel
/// fit on an SM at once), no split shorter than S/16 keys capped at 256 (and at least one tile);
/// keys_per_split is a multiple of tile_keys. A block's tiles run one after another at ~4.7 µs each
/// on the H200 (1B shape, bf16), so a short cache is split too: the 1B's 704-key cache took 22.2 µs
/// per layer in 3 splits of 256 keys and 9.9 µs in 11 of 64, the merge kernel included
/// (bench/decode_step_bench.cu); S/16 keeps a short cache to about 16 splits (the merge walks the
/// splits one after another) and long caches at the 256-key splits measured before (4,160 keys: 17
/// splits of 256, 26.6 µs; 22 of 192, 24.7; finer ones not measured). One split (S ≤ one tile, or
/// bh alone filling the GPU) writes the output directly (no merge kernel, no workspace). E.g. H200
/// (132 SMs), B·Hkv = 8: S = 32768 → 64 splits of 512, S = 704 → 11 of 64, S = 512 → 8 of 64.
/// sm_count ≤ 0 is treated as 1.
inline DecodeAttentionPlan decode_attention_plan(int64_t bh, int64_t S, int tile_keys, int sm_count) {
  DecodeAttentionPlan p;
  if (bh < 1 || S < 1 || tile_keys < 1) return p;
  const int64_t sms = sm_count > 0 ? sm_count : 1;
  const int64_t target_blocks = 4 * sms;
  int64_t min_keys = (S + 15) / 16;  // about 16 splits at most for a short cache
  if (min_keys > 256) min_keys = 256;
  if (min_keys < tile_keys) min_keys = tile_keys;
  int64_t n = (target_blocks + bh - 1) / bh;
  const int64_t by_len = (S + min_keys - 1) / min_keys;
  if (n > by_len) n = by_len;
  if (n > 1024) n = 1024;
  if (n < 1) n = 1;
  int64_t kps = (S + n - 1) / n;
  kps = (kps + tile_keys - 1) / tile_keys * tile_keys;
  p.keys_per_split = kps;
  p.n_split = static_cast<int>((S + kps - 1) / kps);  // ≤ n; no empty split
  return p;
}

/// One launch. Pointers are device memory on the current CUDA device; strides are in elements;
/// every tensor is in `dtype` except the float32 workspace. Query row r of kv head g (r < R =
/// n_rep·T, n_rep = H/Hkv) is head g·n_rep + r/T at token r%T (attention_grouped's row order).
struct DecodeAttentionArgs {
  const void* q = nullptr;  // [B, H, T, D], head dim contiguous; any other strides
  int64_t q_sb = 0, q_sh = 0, q_st = 0;
  const void* k = nullptr;  // [B, Hkv, S, D], head dim contiguous, other strides multiples of 16 bytes
  int64_t k_sb = 0, k_sh = 0, k_ss = 0;  //   (a view of a larger [B, Hkv, C, D] static cache is fine)
  const void* v = nullptr;  // [B, Hkv, S, D], as k
  int64_t v_sb = 0, v_sh = 0, v_ss = 0;
  const void* mask = nullptr;  // additive [B or 1, 1, T, S] with keys contiguous; nullptr = none
  int64_t m_sb = 0, m_st = 0;  //   m_sb = 0 broadcasts one mask over the batch
  void* out = nullptr;         // [B, H, T, D], head dim contiguous, strides multiples of 16 bytes
  int64_t o_sb = 0, o_sh = 0, o_st = 0;
  float* workspace = nullptr;  // decode_attention_workspace_floats() floats (16-byte aligned) when n_split > 1
  int64_t B = 0, H = 0, Hkv = 0, T = 0, S = 0, D = 0;
  float scale = 1.0f;
  QDtype dtype = QDtype::kBFloat16;
  DecodeAttentionPlan plan;    // from decode_attention_plan with this shape's tile_keys
  void* stream = nullptr;      // cudaStream_t; nullptr = the legacy default stream
};

/// float32 elements of the workspace a plan needs: per (b·Hkv, split, row) the unnormalised
/// accumulator [D] and (max, sum); 0 for one split.
inline int64_t decode_attention_workspace_floats(int64_t bh, int n_split, int64_t rows, int64_t D) {
  return n_split > 1 ? bh * n_split * rows * (D + 2) : 0;
}

/// True when the kernel handles these arguments: D ∈ {64, 128, 256}; B, T, S ≥ 1; H a positive
/// multiple of Hkv ≥ 1; R = n_rep·T ≤ 64 and R·D ≤ 4096; B·Hkv ≤ 65535; k/v/out strides (batch,
/// head, key/token) multiples of one 16-byte chunk (8 bf16/fp16 or 4 float32 values); a plan whose
/// splits each hold ≥ 1 key, keys_per_split a multiple of the tile, n_split ≤ 1024, and a workspace
/// when n_split > 1. Pointer alignment (16 bytes: k, v, out, workspace) is checked at launch.
inline bool decode_attention_supported(const DecodeAttentionArgs& a) {
  if (a.D != 64 && a.D != 128 && a.D != 256) return false;
  if (a.B < 1 || a.T < 1 || a.S < 1 || a.Hkv < 1 || a.H < a.Hkv || a.H % a.Hkv != 0) return false;
  const int64_t R = a.H / a.Hkv * a.T;
  if (R > kDecodeAttentionMaxRows || R * a.D > kDecodeAttentionMaxRowsTimesD || a.B * a.Hkv > 65535) return false;
  const int64_t vec = 16 / decode_attention_elem_bytes(a.dtype);
  for (int64_t s : {a.k_sb, a.k_sh, a.k_ss, a.v_sb, a.v_sh, a.v_ss, a.o_sb, a.o_sh, a.o_st})
    if (s % vec != 0) return false;
  const int tk = decode_attention_tile_keys(decode_attention_elem_bytes(a.dtype), static_cast<int>(a.D), R);
  const DecodeAttentionPlan& p = a.plan;
  if (p.n_split < 1 || p.n_split > 1024 || p.keys_per_split < 1 || p.keys_per_split % tk != 0) return false;
  if (static_cast<int64_t>(p.n_split - 1) * p.keys_per_split >= a.S || p.n_split * p.keys_per_split < a.S) return false;
  return p.n_split == 1 || a.workspace != nullptr;
}

/// out = softmax(q kᵀ · scale + mask) v per query row, scores, softmax and the weighted sum in
/// float32 (the inputs converted exactly, the output rounded once to dtype). A masked key (mask
/// finfo.min, or −65504 for fp16) gets weight exactly 0 when the row sees any key; a row whose
/// every key is masked gets, as from PyTorch's SDPA with that additive mask, the softmax of the
/// masked scores (for bf16/fp32 masks: equal weights, the mean of v). −inf mask entries are allowed;
/// a row that is −inf everywhere gives 0 (not NaN). One split per block of 128 threads: keys and
/// values stream through shared memory in tiles (cp.async, double-buffered), scores per row and
/// key, the online softmax per row, the weighted sum per (row, 16-byte column chunk); with several
/// splits a second kernel merges them (out = Σ e^{m_s−M} o_s / Σ e^{m_s−M} l_s). No allocation, no
/// host sync: safe inside a CUDA graph (the plan and shapes are host values fixed at capture).
/// Asynchronous on `stream`. Returns nullptr on success, else a one-line reason (unsupported
/// arguments, a misaligned pointer, or the CUDA launch error string).
const char* decode_attention(const DecodeAttentionArgs& a);

}  // namespace hearth::kernels
