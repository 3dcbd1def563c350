// Launchers of the gated delta rule's CUDA kernels (Gated DeltaNet linear attention, Qwen3.5 /
// qwen3_next), in plain C++ (raw pointers, no ATen) so the .cu compiles standalone with nvcc:
// the inter-chunk scan of the chunked form (prefill) and the fused one-token decode step. Not the
// dispatch (nn/gated_delta.cpp picks these kernels or their tensor-op references), not the
// intra-chunk precomputation (tensor ops there) and no backward: inference only.
//
// Sources: transformers' modeling_qwen3_5.py (5.17) torch_chunk_gated_delta_rule,
// torch_recurrent_gated_delta_rule and causal_conv1d_update; the chunked (WY/UT) form from Yang,
// Kautz, Hatamizadeh, "Gated Delta Networks: Improving Mamba2 with Delta Rule" (2024), as in
// flash-linear-attention's chunk_gated_delta_rule.
#pragma once
#include <cstdint>

#include "quantized_matmul.h"  // QDtype

namespace hearth::kernels {

/// The chunked rule's inter-chunk scan for one layer: BH = B·H independent (batch row, value
/// head) pairs of N chunks of 64 tokens. Device memory on the current CUDA device, float32,
/// contiguous row-major; every pointer 16-byte aligned.
struct ChunkScanArgs {
  const float* new_values = nullptr;     // [BH, N, 64, dv]: the UT transform of β·v (u in the paper)
  const float* k_cumdecay = nullptr;     // [BH, N, 64, dk]: the UT transform of β·k·exp(cum g) (w)
  const float* q = nullptr;              // [BH, N, 64, dk]: q (l2-normalised, ·dk^-½) · exp(cum g)
  const float* intra = nullptr;          // [BH, N, 64, 64]: (q kᵀ) ⊙ exp(cum_i − cum_j), 0 above the diagonal
  const float* k = nullptr;              // [BH, N, 64, dk]: k · exp(cum_last − cum): decayed to the chunk's end
  const float* chunk_decay = nullptr;    // [BH, N]: exp(cum g at the chunk's last token)
  const float* initial_state = nullptr;  // [BH, dk, dv], or nullptr = zeros
  float* out = nullptr;                  // [BH, N, 64, dv] out (may not alias an input)
  float* final_state = nullptr;          // [BH, dk, dv] out (may alias initial_state)
  int64_t BH = 0, N = 0, dk = 0, dv = 0;
  int sm_count = 0;                      // multiprocessors of the device (picks the column slice); 0 = ask CUDA
  void* stream = nullptr;                // cudaStream_t; nullptr = the legacy default stream
};

/// Per (b·h) and chunk i, with S the [dk, dv] state (initial_state, then carried):
///   v_new = new_values_i − k_cumdecay_i·S;  out_i = q_i·S + intra_i·v_new;
///   S ← S·chunk_decay_i + k_iᵀ·v_new
/// — the loop of torch_chunk_gated_delta_rule after its batched precomputation, in one launch.
/// Each value column of S evolves on its own, so a block owns (b·h, a slice of 8/16/32 columns),
/// keeps that slice of S in shared memory and walks the N chunks, prefetching the next chunk's
/// operands (cp.async) while it computes. float32 FMAs throughout; the sums run in another order
/// than cuBLAS's, so results differ from the tensor ops by float32 rounding (~1e-6 relative).
/// Needs dk % 4 == 0, 1 <= dk <= 128, dv >= 1, N >= 1 and 16-byte aligned pointers. Asynchronous
/// on `stream`; returns nullptr on success, else a one-line reason (bad sizes or the CUDA error).
const char* chunk_scan(const ChunkScanArgs& a);

/// One decode step of a Gated DeltaNet layer (Qwen3_5GatedDeltaNet with a cached state and one
/// token per row): B rows. Device memory on the current CUDA device; `dtype` is the activations',
/// conv weight's and conv state's dtype (all one), the recurrent state is float32.
struct GatedDeltaStepArgs {
  const void* mixed_qkv = nullptr;   // [B, convDim] at batch stride x_sb (channels contiguous):
  int64_t x_sb = 0;                  //   the projection before the conv, [q (Hk·dk) | k (Hk·dk) | v (Hv·dv)]
  const void* conv_state = nullptr;  // [B, convDim, K-1] contiguous: the last K-1 inputs, oldest first
  const void* conv_weight = nullptr; // [convDim, K] contiguous
  void* conv_state_out = nullptr;    // [B, convDim, K-1] out: the window shifted by this token (may not alias conv_state)
  const void* a = nullptr;           // [B, Hv] at batch stride a_sb: the decay projection
  const void* b = nullptr;           // [B, Hv] at batch stride b_sb: the β projection (before the sigmoid)
  int64_t a_sb = 0, b_sb = 0;
  const void* A_log = nullptr;       // [Hv] in A_log_dtype
  const void* dt_bias = nullptr;     // [Hv] in dt_bias_dtype
  QDtype A_log_dtype = QDtype::kFloat32, dt_bias_dtype = QDtype::kFloat32;
  const float* state = nullptr;      // [B, Hv, dk, dv] float32 contiguous
  float* state_out = nullptr;        // [B, Hv, dk, dv] out (may alias state: updated in place)
  void* out = nullptr;               // [B, Hv, dv] out in dtype: the rule's output before the gated norm
  int64_t B = 0, Hk = 0, Hv = 0, dk = 0, dv = 0, K = 0;
  QDtype dtype = QDtype::kBFloat16;
  void* stream = nullptr;            // cudaStream_t; nullptr = the legacy default stream
};

/// Per row b and value head h (key head h / (Hv/Hk), shared without a copy), in one launch:
///   x = silu(round(conv over [conv_state, mixed_qkv])) rounded to dtype (causal_conv1d_update);
///   conv_state_out = the window's last K-1 inputs; q, k = l2norm(x_q), l2norm(x_k) (eps 1e-6),
///   q ·= dk^-½; β = round(sigmoid(b)); g = −exp(A_log)·softplus(a + dt_bias) in float32;
///   S ← S·exp(g); δ = (v − Sᵀk)·β; S ← S + k δᵀ; out = round(Sᵀq)
/// with transformers' roundings to dtype (the conv's output, silu's, sigmoid's), so it matches
/// the tensor ops up to float32 summation order. One block per (row, head, 32 value columns).
/// No allocation and no host sync: safe inside a CUDA graph. Needs 2 <= K <= 8, 1 <= dk <= 256,
/// dv >= 1, Hv % Hk == 0. Asynchronous on `stream`; returns nullptr on success, else a one-line
/// reason (bad sizes or the CUDA launch error).
const char* gated_delta_step(const GatedDeltaStepArgs& a);

}  // namespace hearth::kernels
