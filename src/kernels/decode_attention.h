// Launcher of Hearth's split-K decode attention (kernels/decode_attention.cu, "flash-decoding"):
// out = softmax(q kᵀ · scale + mask) v for a few query rows per kv head (a decode step, T·n_rep ≤ 64)
// over a long key sequence, the keys cut into splits that run as separate blocks (so B·Hkv·splits
// blocks fill the GPU instead of B·Hkv), each with FlashAttention-2's online softmax, then merged by
// their (max, sum) in a second kernel. Three split kernels: bf16/fp16 with head dim 64 or 128 and
// R = n_rep·T ≤ 16 rows run the tensor-core kernel (kernels/decode_attention_mma.cuh: both products
// as mma.sync, k/v loaded straight into registers); other bf16/fp16 with R ≤ 8 the register kernel
// (kernels/decode_attention_regs.cuh: a warp per run of keys, scores by shuffle sums); fp32 and the
// rest the shared-memory tile kernel.
// Plain C++ (raw pointers, no ATen) so the .cu compiles standalone with nvcc; the host-side planning
// below is inline so that CPU tests can check it. Not the dispatch (nn/decode_attention.cpp decides
// when it applies) and no backward.
//
// Sources: Dao, Haziza, Massa, Sizov, "Flash-Decoding for long-context inference" (2023): split the
// keys, attend per split, rescale-and-sum by log-sum-exp; Dao, "FlashAttention-2" (2023): the
// online softmax (running max m, running sum l, accumulator rescaled by exp(m_old − m_new)).
// Measured on one H200 (bench/decode_step_bench.cu: Llama-3.2-1B shape, bf16, D = 64, 4 rows per kv
// head, 8 kv heads, B = T = 1; 16 layers in one CUDA graph, µs per layer with the merge): 704 keys,
// the tile kernel 9.81 µs (11 splits of 64) → the register design 6.55 µs (11 of 64); 4,160 keys,
// tile kernel 26.5 µs (17 of 256; 19.2 in 65 of 64) → register design 13.14 µs (33 of 128; 22 of
// 192: 14.3, 65 of 64: 17.2); same outputs bit for bit. The register numbers are the bench's
// candidate (namespace cand there: that shape only), which the register kernel generalises.
#pragma once
#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "quantized_matmul.h"  // QDtype

namespace hearth::kernels {

/// Threads of one split block (4 warps).
constexpr int kDecodeAttentionThreads = 128;
/// Most splits of one (batch row, kv head): the plan's cap (the merge stages their (max, sum)).
constexpr int kDecodeAttentionMaxSplits = 1024;
/// Largest number of query rows per kv head (n_rep·T) and of rows · head dim (the query rows are
/// held in shared memory as float32: 64 rows of 64, 32 of 128 or 16 of 256).
constexpr int64_t kDecodeAttentionMaxRows = 64;
constexpr int64_t kDecodeAttentionMaxRowsTimesD = 4096;

/// Most query rows per kv head (R = n_rep·T) of the register kernel: R is padded to 1, 2, 4 or 8.
constexpr int64_t kDecodeAttentionRegsMaxRows = 8;

/// True when the register kernel runs: 2-byte elements (bf16, fp16) and R ≤ 8 rows.
constexpr bool decode_attention_uses_regs(int elem_bytes, int64_t rows) {
  return elem_bytes == 2 && rows >= 1 && rows <= kDecodeAttentionRegsMaxRows;
}

/// The register kernel's row bucket for R rows: 1, 2, 4 or 8 (the kernel's template argument).
constexpr int decode_attention_regs_rows(int64_t rows) { return rows <= 1 ? 1 : rows <= 2 ? 2 : rows <= 4 ? 4 : 8; }

/// Loads of k (and of v) per lane per step in the register kernel: 4, or 2 for the 8-row bucket,
/// whose q and accumulators alone take 128 registers (ptxas, sm_90: 2 → 238..255 registers, no
/// spill; 4 → 255 and a 12-byte spill with a mask row per token; not timed).
constexpr int decode_attention_regs_loads(int64_t rows) { return decode_attention_regs_rows(rows) == 8 ? 2 : 4; }

/// Keys per shared-memory tile of the tile kernel: one tile of keys (and one of values) is 8 KB
/// when rows ≤ 8, 4 KB above (the query rows then take the room), so 8192/(D·elem_bytes) or half:
/// float32 D = 64/128/256 → 32/16/8 keys (halved for > 8 rows), bf16/fp16 with > 8 rows → 32/16/8.
constexpr int decode_attention_smem_tile_keys(int elem_bytes, int head_dim, int64_t rows) {
  return (rows <= 8 ? 8192 : 4096) / (head_dim * elem_bytes);
}

/// Keys a split block walks per step (its "tile"): for the register kernel, 4 warps × loads per
/// lane × keys per warp load (32 lanes over D/8 16-byte chunks per key: 256/D keys), i.e. bf16/fp16
/// D = 64/128/256 → 64/32/16 keys for ≤ 4 rows, 32/16/8 for 5..8 rows; else the shared-memory tile
/// above. The kernels use this same function for their compile-time tile, so host planning and
/// device agree.
constexpr int decode_attention_tile_keys(int elem_bytes, int head_dim, int64_t rows) {
  return decode_attention_uses_regs(elem_bytes, rows)
             ? kDecodeAttentionThreads / 32 * decode_attention_regs_loads(rows) * (256 / head_dim)
             : decode_attention_smem_tile_keys(elem_bytes, head_dim, rows);
}

/// Keys a block of the tensor-core kernel walks per step (4 warps × 16): its plan granularity.
constexpr int kDecodeAttentionMmaStepKeys = 64;

/// True when the tensor-core kernel (kernels/decode_attention_mma.cuh) can run: 2-byte elements
/// (bf16, fp16), head dim 64 or 128, 1 ≤ R ≤ 16 rows.
constexpr bool decode_attention_uses_mma(int elem_bytes, int64_t head_dim, int64_t rows) {
  return elem_bytes == 2 && (head_dim == 64 || head_dim == 128) && rows >= 1 && rows <= 16;
}

/// Which split kernel runs. kAuto: the tensor-core kernel where decode_attention_uses_mma, else
/// the CUDA-core ones (the register kernel for bf16/fp16 with R ≤ 8, else the shared-memory tile
/// kernel). kCudaCores forces the latter (the reference the tensor-core kernel is tested against,
/// and a benchmark's A/B); kTensorCores where it cannot run is unsupported.
enum class DecodeAttentionKernel { kAuto, kCudaCores, kTensorCores };

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
/// `blocks_per_sm` blocks per multiprocessor (the split kernel's occupancy: one full wave, none
/// left over for a second; ≤ 0 is taken as 4), but no split shorter than
/// ⌈2·√S⌉ keys (and at least one tile); keys_per_split is a multiple of tile_keys. Why √S: a block
/// walks its split's tiles one after another and the merge walks the splits one after another, so
/// time ≈ a + b·(tiles per split) + c·n_split is least near n_split = √(b·S / (c·tile)). Fitted to
/// the register kernel on the H200 (1B shape, bf16, 8 kv heads, µs per layer with the merge: 704
/// keys in 11 splits of 64: 6.55; 4,160 keys in 65 of 64: 17.2, 33 of 128: 13.14, 22 of 192: 14.3):
/// a ≈ 4.4 µs (a split's first tile), b ≈ 2.5 µs per further tile, c ≈ 0.2 µs per split, so the best
/// split is about 2.3·√S keys; 2·√S reproduces both measured optima (704 → 11 splits of 64, 4,160 →
/// 33 of 128) and keeps a long cache with few (row, head) pairs from piling hundreds of splits onto
/// the merge. Measured for D = 64 only. One split (S ≤ one tile, or bh alone filling the GPU)
/// writes the output directly (no merge kernel, no workspace). E.g. H200 (132 SMs), B·Hkv = 8, tile
/// 64, 4 blocks per SM: S = 32768 → 64 splits of 512, S = 4160 → 33 of 128, S = 704 → 11 of 64, S
/// = 512 → 8 of 64; 3 blocks per SM (the register and tensor-core kernels for 4 rows of 64):
/// 32768 → 47 splits of 704 (376 blocks ≤ 396 resident; 64 × 8 = 512 would run a second wave of 116).
/// sm_count ≤ 0 is treated as 1.
inline DecodeAttentionPlan decode_attention_plan(int64_t bh, int64_t S, int tile_keys, int sm_count,
                                                 int blocks_per_sm = 4) {
  DecodeAttentionPlan p;
  if (bh < 1 || S < 1 || tile_keys < 1) return p;
  const int64_t sms = sm_count > 0 ? sm_count : 1;
  const int64_t target_blocks = (blocks_per_sm > 0 ? blocks_per_sm : 4) * sms;
  int64_t min_keys = static_cast<int64_t>(std::sqrt(4.0 * static_cast<double>(S)));  // ⌈2·√S⌉, exactly:
  while (min_keys * min_keys < 4 * S) ++min_keys;                                     // the least m with
  while (min_keys > 1 && (min_keys - 1) * (min_keys - 1) >= 4 * S) --min_keys;        // m² ≥ 4·S
  if (min_keys < tile_keys) min_keys = tile_keys;
  int64_t n = (target_blocks + bh - 1) / bh;
  const int64_t by_len = (S + min_keys - 1) / min_keys;
  if (n > by_len) n = by_len;
  if (n > kDecodeAttentionMaxSplits) n = kDecodeAttentionMaxSplits;
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
  DecodeAttentionPlan plan;    // from decode_attention_plan with decode_attention_step_keys(*this)
  DecodeAttentionKernel kernel = DecodeAttentionKernel::kAuto;
  void* stream = nullptr;      // cudaStream_t; nullptr = the legacy default stream
};

/// True when the tensor-core kernel runs for `a` (kAuto where it can, or forced).
inline bool decode_attention_runs_mma(const DecodeAttentionArgs& a) {
  return a.kernel != DecodeAttentionKernel::kCudaCores &&
         decode_attention_uses_mma(decode_attention_elem_bytes(a.dtype), a.D, a.H / (a.Hkv > 0 ? a.Hkv : 1) * a.T);
}

/// The plan granularity (tile_keys of decode_attention_plan) of the kernel `a` selects: 64 for
/// the tensor-core kernel, decode_attention_tile_keys for the others.
inline int decode_attention_step_keys(const DecodeAttentionArgs& a) {
  if (decode_attention_runs_mma(a)) return kDecodeAttentionMmaStepKeys;
  return decode_attention_tile_keys(decode_attention_elem_bytes(a.dtype), static_cast<int>(a.D),
                                    a.H / (a.Hkv > 0 ? a.Hkv : 1) * a.T);
}

/// float32 elements of the workspace a plan needs: per (b·Hkv, split, row) the unnormalised
/// accumulator [D] and (max, sum); 0 for one split.
inline int64_t decode_attention_workspace_floats(int64_t bh, int n_split, int64_t rows, int64_t D) {
  return n_split > 1 ? bh * n_split * rows * (D + 2) : 0;
}

/// True when the kernels handle these arguments: D ∈ {64, 128, 256}; B, T ≥ 1; 1 ≤ S ≤ 2^30; H a positive
/// multiple of Hkv ≥ 1; R = n_rep·T ≤ 64 and R·D ≤ 4096; B·Hkv ≤ 65535; k/v/out strides (batch,
/// head, key/token) multiples of one 16-byte chunk (8 bf16/fp16 or 4 float32 values); a plan whose
/// splits each hold ≥ 1 key, n_split ≤ 1024, keys_per_split a multiple of the tile for the CUDA-core
/// kernels (any length for the tensor-core kernel: it masks a split's ragged last step), and a
/// workspace when n_split > 1; kTensorCores only where decode_attention_uses_mma. Pointer alignment
/// (16 bytes: k, v, out, workspace) is checked at launch.
inline bool decode_attention_supported(const DecodeAttentionArgs& a) {
  if (a.D != 64 && a.D != 128 && a.D != 256) return false;
  if (a.B < 1 || a.T < 1 || a.S < 1 || a.S > (int64_t{1} << 30) || a.Hkv < 1 || a.H < a.Hkv || a.H % a.Hkv != 0) return false;
  const int64_t R = a.H / a.Hkv * a.T;
  if (R > kDecodeAttentionMaxRows || R * a.D > kDecodeAttentionMaxRowsTimesD || a.B * a.Hkv > 65535) return false;
  const int64_t vec = 16 / decode_attention_elem_bytes(a.dtype);
  for (int64_t s : {a.k_sb, a.k_sh, a.k_ss, a.v_sb, a.v_sh, a.v_ss, a.o_sb, a.o_sh, a.o_st})
    if (s % vec != 0) return false;
  const bool mma = decode_attention_runs_mma(a);
  if (a.kernel == DecodeAttentionKernel::kTensorCores && !mma) return false;
  const int tk = mma ? 1 : decode_attention_tile_keys(decode_attention_elem_bytes(a.dtype), static_cast<int>(a.D), R);
  const DecodeAttentionPlan& p = a.plan;
  if (p.n_split < 1 || p.n_split > kDecodeAttentionMaxSplits || p.keys_per_split < 1 || p.keys_per_split % tk != 0) return false;
  if (static_cast<int64_t>(p.n_split - 1) * p.keys_per_split >= a.S || p.n_split * p.keys_per_split < a.S) return false;
  return p.n_split == 1 || a.workspace != nullptr;
}

/// out = softmax(q kᵀ · scale + mask) v per query row, scores, softmax and the weighted sum in
/// float32 (the inputs converted exactly, the output rounded once to dtype). A masked key (mask
/// finfo.min, or −65504 for fp16) gets weight exactly 0 when the row sees any key; a row whose
/// every key is masked gets, as from PyTorch's SDPA with that additive mask, the softmax of the
/// masked scores (for bf16/fp32 masks: equal weights, the mean of v). −inf mask entries are allowed;
/// a row that is −inf everywhere gives 0 (not NaN). One split per block of 128 threads (4 warps).
/// Tensor-core kernel (bf16/fp16, D 64/128, R ≤ 16): see kernels/decode_attention_mma.cuh; the
/// weights enter P·V as two products (hi and lo parts), ~16 bits of each weight.
/// Register kernel (bf16/fp16, R ≤ 8): per step of tile_keys keys each warp takes its run of keys,
/// D/8 lanes per key (lane = one 16-byte column chunk of the key's k and v rows), loads all of the
/// step's k, v and mask values into registers before any arithmetic and the next step's before this
/// one's arithmetic; scores by xor-shuffle sums over a key's lanes, the online softmax per warp in
/// registers, one barrier at the end to merge the 4 warps. With T > 1 and a mask row per token, the
/// key's lane r loads row r's mask value and the others take it by shuffle. Tile kernel (fp32, or
/// R > 8): keys and values stream through shared memory in tiles (cp.async, double-buffered), scores
/// per row and key, the online softmax per row, the weighted sum per (row, 16-byte column chunk).
/// With several splits a second kernel merges them (out = Σ e^{m_s−M} o_s / Σ e^{m_s−M} l_s, in a
/// fixed order — 8 interleaved groups of splits, then the groups — so deterministic). No allocation, no host sync: safe inside a CUDA graph (the plan
/// and shapes are host values fixed at capture).
/// Asynchronous on `stream`. Returns nullptr on success, else a one-line reason (unsupported
/// arguments, a misaligned pointer, or the CUDA launch error string).
const char* decode_attention(const DecodeAttentionArgs& a);

/// Blocks of the split kernel `a` selects that fit on one multiprocessor of the current CUDA device
/// (cudaOccupancyMaxActiveBlocksPerMultiprocessor, asked once per kernel instance): the
/// blocks_per_sm of decode_attention_plan. a.plan and the pointers are not looked at; 0 when the
/// shape is unsupported or the query fails.
int decode_attention_blocks_per_sm(const DecodeAttentionArgs& a);

}  // namespace hearth::kernels
