// Launcher of Hearth's decode GEMV (kernels/gemv.cu): y = x · Wᵀ for a few rows of x (M ≤ 8) and
// dense (fp32/fp16/bf16) or MLX affine 4/8-bit weights, for up to three weights that share x in one
// launch (q/k/v, gate/up). Plain C++ (raw pointers, no ATen) so the .cu compiles standalone with
// nvcc. Not the dispatch (nn/linear.cpp, nn/quant.cpp decide when it applies) and not a GEMM.
// A row is split over 4..256 lanes (up to the 8 warps of a block: a dense row gets ~2 chunks of 16
// bytes a lane), each lane's share loaded in one ordered tile where it fits; the layout and the
// H200 numbers behind it are in gemv.cu.
#pragma once
#include <cstdint>

#include "norm_act.h"  // NormWeight
#include "quantized_matmul.h"

namespace hearth::kernels {

/// How a weight is stored: dense rows in the x dtype, or MLX affine codes (nn/quant.h layout).
enum class WeightFormat : int { kDense = 0, kAffine4 = 4, kAffine8 = 8 };

/// One weight of a grouped GEMV and its output. Device pointers, contiguous, 16-byte aligned.
struct GemvSegment {
  const void* w = nullptr;       // dense: [out, in] in x_dtype; affine: [out, in*bits/32] uint32 codes
  const void* scales = nullptr;  // affine only: [out, in/group_size] in s_dtype
  const void* biases = nullptr;  // affine only: [out, in/group_size] in s_dtype
  void* y = nullptr;             // [M, out] in x_dtype
  int64_t out = 0;
  // Optional LoRA term in the epilogue (nn::Linear's inference path, PEFT's LoraLayer): the rows get
  // y = x · Wᵀ + lora_scale · h · Bᵀ, rounded once, where h = x · Aᵀ was computed (and rounded to
  // x_dtype) by an earlier launch. Any format of W; B and h are dense in x_dtype.
  const void* lora_b = nullptr;  // [out, lora_rank] in x_dtype, contiguous
  const void* lora_h = nullptr;  // [M, lora_rank] in x_dtype, contiguous
  int lora_rank = 0;             // 0: no LoRA term; else 1..kGemvMaxLoraRank
  float lora_scale = 0.f;
};

/// The largest LoRA rank the GEMV epilogue takes (hearth's own adapters go up to 1024).
constexpr int kGemvMaxLoraRank = 4096;

/// An RMSNorm applied to x inside the GEMV launch (its prologue), instead of a norm kernel before it:
/// the segments then multiply by normed = norm(x (+ residual)) with rms_norm's arithmetic and
/// roundings (kernels/norm_act.h, the same bits as rms_norm with this mode: both walk a row as
/// kernels/rms_row.cuh does). Every block computes the norm of x's M rows for itself (M·in elements
/// read again from L2 per block) and stages it in shared memory; block 0 writes `sum` and `normed`.
/// Saves a dependent launch per norm in a decode step. `sum` and `normed` may not alias x or residual.
struct GemvNorm {
  bool on = false;
  const void* residual = nullptr;  // [M, in] in x_dtype, or nullptr (no add before the norm)
  void* sum = nullptr;             // [M, in] out: x + residual rounded to x_dtype (required with residual)
  void* normed = nullptr;          // [M, in] out: the normalised x in x_dtype, or nullptr
  const void* weight = nullptr;    // [in] in x_dtype (unused with NormWeight::kNone)
  NormWeight mode = NormWeight::kAfterRound;
  float offset = 0.f;              // kFp32 only
  float eps = 1e-6f;
};

/// One launch: every segment reads the same x [M, in] and uses the same format.
struct GemvArgs {
  const void* x = nullptr;  // [M, in] in x_dtype, contiguous, 16-byte aligned
  QDtype x_dtype = QDtype::kFloat32;
  int64_t M = 0, in = 0;
  WeightFormat format = WeightFormat::kDense;
  int group_size = 64;                 // affine only: 32, 64 or 128
  QDtype s_dtype = QDtype::kFloat32;   // affine only: x_dtype or kFloat32
  GemvSegment seg[3];
  int n_seg = 1;                       // 1..3
  GemvNorm norm;                       // off by default: x is used as given
  void* stream = nullptr;              // cudaStream_t; nullptr = the legacy default stream
};

/// True when gemv handles this shape: 1 <= M <= 8, 1 <= n_seg <= 3, every out >= 1 (with a LoRA
/// term: M = 1, 1 <= lora_rank <= kGemvMaxLoraRank, lora_b and lora_h set), in a positive
/// multiple of one 16-byte chunk of the format (8 bf16/f16 or 4 fp32 values, 32 4-bit or 16 8-bit
/// codes) and, for affine weights, of group_size (32/64/128) with s_dtype x_dtype or fp32. With
/// norm.on also: a weight (unless kNone), `sum` when there is a residual, and the normed x of the M
/// rows fitting the kernel's 48 KB of shared memory as padded fp32 (M·in·(1 + 4/codes per chunk)·4
/// bytes, plus the affine chunk sums: e.g. bf16 in = 2048 up to M = 3, in = 4096 at M = 1).
bool gemv_supported(const GemvArgs& a);

/// y_s = x · W_sᵀ (+ lora_scale · h_s · B_sᵀ) for each segment s, accumulated in fp32 and rounded
/// once to x_dtype (the LoRA sum is added after the base sum is complete); affine
/// weights decode as W[o, k] = scale[o, k/gs] · q[o, k] + bias[o, k/gs] (mlx's affine dequantize).
/// A row's result depends only on that row and its matrix's shape (not on M, the other segments or
/// the launch shape; a row over several warps adds their sums in warp order), so grouped and
/// separate calls and any batch size give the same bits. Affine launches run kernels/gemv_affine.cuh's
/// kernel (4 rows a warp, codes entering the FMA as fp32 subnormals; x must stay below 2^63 in
/// magnitude), dense launches gemv.cu's. Asynchronous on `stream`.
/// Returns nullptr on success, else a one-line reason (unsupported case, misaligned pointer, or the
/// CUDA launch error string).
const char* gemv(const GemvArgs& a);

}  // namespace hearth::kernels
