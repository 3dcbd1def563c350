// Launcher of the fused decode-step kernel that applies rotary embeddings to one token's queries
// and keys and writes its keys and values into a static cache, in plain C++ (raw pointers, no
// ATen) so the .cu compiles standalone with nvcc. Not the dispatch (nn/fused_ops.h picks this
// kernel or its tensor-op reference) and no backward: inference only.
#pragma once
#include <cstdint>

#include "quantized_matmul.h"  // QDtype

namespace hearth::kernels {

/// One decode step's operands: B rows of one token each. Device memory on the current CUDA
/// device, all of one dtype; strides in elements, the head dim always contiguous.
struct RopeCacheArgs {
  const void* q = nullptr;  // [B, Hq, D] at q_sb / q_sh
  const void* k = nullptr;  // [B, Hk, D] at k_sb / k_sh
  const void* v = nullptr;  // [B, Hk, D] at v_sb / v_sh
  int64_t q_sb = 0, q_sh = 0, k_sb = 0, k_sh = 0, v_sb = 0, v_sh = 0;
  const void* cos = nullptr;  // [B, rot] contiguous: each row's cos(position · inv_freq), halves repeated
  const void* sin = nullptr;  // [B, rot] likewise
  const int64_t* positions = nullptr;  // [B]: the cache index each row's token goes to
  void* q_out = nullptr;      // [B, Hq, D] out at qo_sb / qo_sh (may not alias q)
  int64_t qo_sb = 0, qo_sh = 0;
  void* k_cache = nullptr;    // [B·Hk·row_stride, D] contiguous: token p of (b, h) at row (b·Hk + h)·row_stride + p
  void* v_cache = nullptr;    // likewise
  int64_t row_stride = 0;
  int64_t B = 0, Hq = 0, Hk = 0, D = 0, rot = 0;  // rot: rotated dims (even, <= D); the rest pass through
  QDtype dtype = QDtype::kFloat32;
  void* stream = nullptr;     // cudaStream_t; nullptr = the legacy default stream
};

/// q_out = rope(q); k_cache[b, h, positions[b]] = rope(k); v_cache[b, h, positions[b]] = v, in one
/// launch (one block per (row, head)). rope(x) = x·cos + rotate_half(x)·sin on the first `rot`
/// dims (rotate_half(x) = [−x₂, x₁], the halves of those dims), the rest copied: transformers'
/// apply_rotary_pos_emb with PyTorch's roundings — each product and the sum rounded to dtype, no
/// fused multiply-add — so the results are bit-identical to the tensor ops (nn::apply_rotary, then
/// index_copy_ into the cache). Positions are not checked against the buffers (the caller's
/// StaticState keeps them below capacity). Asynchronous on `stream`; returns nullptr on success,
/// else a one-line reason (bad sizes or the CUDA launch error string).
const char* rope_cache_write(const RopeCacheArgs& a);

/// One tensor's RoPE over any number of tokens (a prompt chunk): x [B, H, T, D] in, y of the same
/// shape out, both at their own strides (elements, the head dim contiguous). cos/sin rows of `rot`
/// contiguous values, row (b, t) at b·cs_b + t·cs_t (a stride 0 broadcasts: [T, rot] tables shared
/// by every row have cs_b = 0).
struct RopeArgs {
  const void* x = nullptr;
  int64_t x_sb = 0, x_sh = 0, x_st = 0;
  void* y = nullptr;  // may not alias x
  int64_t y_sb = 0, y_sh = 0, y_st = 0;
  const void* cos = nullptr;
  const void* sin = nullptr;
  int64_t cs_b = 0, cs_t = 0;
  int64_t B = 0, H = 0, T = 0, D = 0, rot = 0;  // rot: rotated dims (even, <= D); the rest copied
  QDtype dtype = QDtype::kFloat32;
  void* stream = nullptr;  // cudaStream_t; nullptr = the legacy default stream
};

/// y = rope(x) in one launch (one block per (row, token)) where the tensor ops launch seven (two
/// narrows, neg, cat, two muls, an add): the same roundings as rope_cache_write, so bit-identical
/// to nn::apply_rotary's tensor ops (16-byte vectors where D, rot / 2, the strides and the
/// operands' alignment allow). Asynchronous on `stream`; nullptr on success, else a one-line
/// reason (bad sizes or the CUDA launch error string).
const char* rope(const RopeArgs& a);

}  // namespace hearth::kernels
