// Dispatch of the split-K decode attention (kernels/decode_attention.cu): checks, strides, the
// split plan for this GPU, the launch.
#include "nn/decode_attention.h"

#include <c10/core/GradMode.h>

#include "nn/fused_ops.h"

#ifdef HEARTH_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <array>
#include <atomic>

#include "core/env.h"
#include "core/error.h"
#include "kernels/decode_attention.h"
#endif

namespace hearth::nn {

#ifdef HEARTH_WITH_CUDA_KERNELS
namespace {
// Multiprocessors of CUDA device `dev`, asked once per device (a host query, not a stream op).
int dattn_sm_count(int dev) {
  static std::array<std::atomic<int>, 64> cache{};
  if (dev < 0 || dev >= static_cast<int>(cache.size())) return 0;
  int n = cache[dev].load(std::memory_order_relaxed);
  if (n > 0) return n;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n < 1) {
    (void)cudaGetLastError();  // clear the (non-sticky) error; plan as for 1 SM: fewer splits, same result
    return 0;
  }
  cache[dev].store(n, std::memory_order_relaxed);
  return n;
}

// HEARTH_DECODE_ATTENTION=cuda-cores runs the CUDA-core split kernels where the tensor-core one
// would (a benchmark's A/B and a fallback); unset or anything else: the default choice. Read once.
kernels::DecodeAttentionKernel dattn_kernel_choice() {
  static const kernels::DecodeAttentionKernel k = env_equals("HEARTH_DECODE_ATTENTION", "cuda-cores")
                                                      ? kernels::DecodeAttentionKernel::kCudaCores
                                                      : kernels::DecodeAttentionKernel::kAuto;
  return k;
}

bool dattn_aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

kernels::QDtype dattn_qdtype(at::ScalarType st) {
  return st == at::kBFloat16 ? kernels::QDtype::kBFloat16 : st == at::kHalf ? kernels::QDtype::kFloat16
                                                                             : kernels::QDtype::kFloat32;
}
}  // namespace

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                            double scale) {
  if (!fused_decode_enabled() || !q.defined() || !k.defined() || !v.defined() || !q.is_cuda()) return {};
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4 || k.sizes() != v.sizes()) return {};
  const at::ScalarType st = q.scalar_type();
  if (st != at::kFloat && st != at::kHalf && st != at::kBFloat16) return {};
  if (k.scalar_type() != st || v.scalar_type() != st || k.device() != q.device() || v.device() != q.device()) return {};
  if (c10::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad())) return {};
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), Hkv = k.size(1), S = k.size(2);
  if (k.size(0) != B || k.size(3) != D || Hkv < 1 || H % Hkv != 0 || B < 1 || T < 1 || S < 1) return {};
  if (q.stride(3) != 1 || k.stride(3) != 1 || v.stride(3) != 1) return {};
  const int64_t R = H / Hkv * T;
  if (R > kernels::kDecodeAttentionMaxRows || R * D > kernels::kDecodeAttentionMaxRowsTimesD) return {};
  if (D != 64 && D != 128 && D != 256) return {};

  kernels::DecodeAttentionArgs a;
  at::Tensor m;
  if (mask.defined()) {
    if (!mask.is_floating_point() || mask.device() != q.device()) return {};
    m = mask.dim() == 2 ? mask.unsqueeze(0).unsqueeze(0) : mask;
    if (m.dim() != 4 || m.size(1) != 1 || (m.size(0) != 1 && m.size(0) != B) || (m.size(2) != 1 && m.size(2) != T) ||
        m.size(3) != S)
      return {};
    m = m.to(st);
    if (S > 1 && m.stride(3) != 1) m = m.contiguous();
    a.mask = m.data_ptr();
    a.m_sb = m.size(0) == 1 ? 0 : m.stride(0);
    a.m_st = m.size(2) == 1 ? 0 : m.stride(2);
  }
  a.q = q.data_ptr();
  a.q_sb = q.stride(0);
  a.q_sh = q.stride(1);
  a.q_st = q.stride(2);
  a.k = k.data_ptr();
  a.k_sb = k.stride(0);
  a.k_sh = k.stride(1);
  a.k_ss = k.stride(2);
  a.v = v.data_ptr();
  a.v_sb = v.stride(0);
  a.v_sh = v.stride(1);
  a.v_ss = v.stride(2);
  a.B = B;
  a.H = H;
  a.Hkv = Hkv;
  a.T = T;
  a.S = S;
  a.D = D;
  a.scale = static_cast<float>(scale);
  a.dtype = dattn_qdtype(st);
  // The output as [B, T, H, D] (what the callers' transpose back wants), addressed [B, H, T, D].
  a.o_sb = T * H * D;
  a.o_sh = D;
  a.o_st = H * D;
  if (!dattn_aligned16(k) || !dattn_aligned16(v)) return {};
  const c10::cuda::CUDAGuard guard(q.device());
  a.kernel = dattn_kernel_choice();
  a.plan = kernels::decode_attention_plan(B * Hkv, S, kernels::decode_attention_step_keys(a),
                                          dattn_sm_count(q.device().index()), kernels::decode_attention_blocks_per_sm(a));
  const int64_t ws_floats = kernels::decode_attention_workspace_floats(B * Hkv, a.plan.n_split, R, D);
  at::Tensor ws;
  if (ws_floats > 0) {
    ws = at::empty({ws_floats}, q.options().dtype(at::kFloat));
    a.workspace = ws.data_ptr<float>();
  }
  if (!kernels::decode_attention_supported(a)) return {};
  at::Tensor out = at::empty({B, T, H, D}, q.options());
  a.out = out.data_ptr();
  a.stream = c10::cuda::getCurrentCUDAStream(q.device().index()).stream();
  const char* err = kernels::decode_attention(a);
  HEARTH_CHECK(err == nullptr, "decode_attention: CUDA kernel failed: ", err);
  return out.permute({0, 2, 1, 3});
}
#else
at::Tensor decode_attention(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, double) {
  return {};
}
#endif

}  // namespace hearth::nn
