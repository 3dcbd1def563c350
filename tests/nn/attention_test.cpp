// Attention: the plain path against a naive per-element loop in double, causal and sliding
// masks by absolute position, GQA ≡ MHA with repeated KV heads, SDPA ≡ plain (PyTorch ≥ 2.1),
// sliding-window attention by query blocks ≡ one masked call (values and gradients).
#include "nn/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include <torch/csrc/autograd/autograd.h>

#include "core/torch_compat.h"

using namespace hearth::nn;

namespace {

// Naive softmax attention in double: query i (absolute q0+i) sees key j (absolute k0+j) iff
// k0+j <= q0+i and (no window or k0+j > q0+i-W); head h uses kv head h / (H / Hkv).
at::Tensor naive(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionParams& p) {
  auto Q = q.to(at::kDouble), K = k.to(at::kDouble), V = v.to(at::kDouble);
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), S = k.size(2), rep = H / k.size(1);
  at::Tensor out = at::zeros({B, H, T, D}, at::kDouble);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> w(S, 0.0);
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j < S; ++j) {
          const int64_t qi = p.q_pos0 + i, kj = p.k_pos0 + j;
          bool ok = kj <= qi && (!p.sliding_window || kj > qi - *p.sliding_window);
          w[j] = ok ? (Q[b][h][i] * K[b][h / rep][j]).sum().item<double>() * p.scale : -INFINITY;
          mx = std::max(mx, w[j]);
        }
        for (auto& x : w) sum += (x = std::exp(x - mx));
        for (int64_t j = 0; j < S; ++j) out[b][h][i] += V[b][h / rep][j] * (w[j] / sum);
      }
  return out;
}

}  // namespace

TEST(Attention, PlainMatchesNaiveCausal) {
  at::manual_seed(1);
  auto q = at::randn({1, 4, 5, 8}), k = at::randn({1, 2, 5, 8}), v = at::randn({1, 2, 5, 8});
  AttentionParams p;
  p.scale = 1 / std::sqrt(8.0);
  p.backend = AttentionBackend::kPlain;
  auto got = attention(q, k, v, p);
  EXPECT_LT((got.to(at::kDouble) - naive(q, k, v, p)).abs().max().item<double>(), 1e-6);
  // The first query sees only the first key: its output is exactly v[0].
  EXPECT_LT((got[0][0][0] - v[0][0][0]).abs().max().item<float>(), 1e-6);
}

TEST(Attention, OffsetsAndSlidingWindow) {
  at::manual_seed(2);
  // 3 queries at positions 10..12 over keys at positions 6..12, window 4.
  auto q = at::randn({2, 2, 3, 4}), k = at::randn({2, 1, 7, 4}), v = at::randn({2, 1, 7, 4});
  AttentionParams p;
  p.scale = 0.5;
  p.q_pos0 = 10;
  p.k_pos0 = 6;
  p.sliding_window = 4;
  p.backend = AttentionBackend::kPlain;
  EXPECT_LT((attention(q, k, v, p).to(at::kDouble) - naive(q, k, v, p)).abs().max().item<double>(), 1e-6);
  auto m = attention_mask(3, 7, p, at::kFloat, at::kCPU);
  // Query at 10 sees keys 7..10 (indices 1..4): index 0 (pos 6) and 5 (pos 11) masked.
  EXPECT_EQ(m[0][1].item<float>(), 0.f);
  EXPECT_EQ(m[0][4].item<float>(), 0.f);
  EXPECT_LT(m[0][0].item<float>(), -1e38f);
  EXPECT_LT(m[0][5].item<float>(), -1e38f);
  // A single query over keys all inside its window needs no mask.
  AttentionParams d = p;
  d.q_pos0 = 12;
  d.k_pos0 = 9;
  EXPECT_FALSE(attention_mask(1, 4, d, at::kFloat, at::kCPU).defined());
}

TEST(Attention, GqaEqualsMhaWithRepeatedHeads) {
  at::manual_seed(3);
  auto q = at::randn({1, 6, 4, 8}), k = at::randn({1, 2, 4, 8}), v = at::randn({1, 2, 4, 8});
  AttentionParams p;
  p.scale = 0.3;
  p.backend = AttentionBackend::kPlain;
  auto gqa = attention(q, k, v, p);
  auto mha = attention(q, repeat_kv(k, 3), repeat_kv(v, 3), p);
  EXPECT_TRUE(at::allclose(gqa, mha, 0, 1e-6));
  // repeat_kv order: head h uses kv head h / 3.
  EXPECT_TRUE(at::equal(repeat_kv(k, 3)[0][4], k[0][1]));
  // MQA (one kv head).
  auto mqa = attention(q, k.narrow(1, 0, 1), v.narrow(1, 0, 1), p);
  EXPECT_LT((mqa.to(at::kDouble) - naive(q, k.narrow(1, 0, 1), v.narrow(1, 0, 1), p)).abs().max().item<double>(), 1e-6);
}

TEST(Attention, SdpaMatchesPlain) {
  if (!hearth::compat::kHasSdpa) GTEST_SKIP() << "libtorch " << hearth::compat::torch_version() << " has no SDPA";
  at::manual_seed(4);
  auto q = at::randn({1, 4, 6, 8}), k = at::randn({1, 2, 9, 8}), v = at::randn({1, 2, 9, 8});
  for (auto window : {std::optional<int64_t>{}, std::optional<int64_t>{3}}) {
    AttentionParams p;
    p.scale = 0.35;
    p.q_pos0 = 3;
    p.sliding_window = window;
    p.backend = AttentionBackend::kPlain;
    auto plain = attention(q, k, v, p);
    p.backend = AttentionBackend::kSdpa;
    EXPECT_TRUE(at::allclose(attention(q, k, v, p), plain, 1e-5, 1e-5));
  }
  AttentionParams sq;  // square causal (is_causal path)
  sq.scale = 0.35;
  sq.backend = AttentionBackend::kPlain;
  auto plain = attention(q, k.narrow(2, 0, 6), v.narrow(2, 0, 6), sq);
  sq.backend = AttentionBackend::kSdpa;
  EXPECT_TRUE(at::allclose(attention(q, k.narrow(2, 0, 6), v.narrow(2, 0, 6), sq), plain, 1e-5, 1e-5));
}

// CUDA inference of a square causal GQA prompt: attention() makes transformers' call (enable_gqa,
// each kv head read in place), whose output is bit-identical to the repeated call's (what Hearth
// made before), for bf16 and fp16, head dims 64 and 128, GQA 4:1 and MQA, and a batch of rows.
TEST(Attention, CudaInferenceGqaIsTheRepeatedCall) {
  if (!hearth::compat::cuda_available()) GTEST_SKIP() << "needs CUDA (GPU machine)";
  if (!hearth::compat::kHasSdpaGqa) GTEST_SKIP() << "libtorch " << hearth::compat::torch_version() << " has no enable_gqa";
  struct Case {
    int64_t B, H, Hkv, T, D;
  };
  for (at::ScalarType st : {at::kBFloat16, at::kHalf}) {
    for (Case c : {Case{1, 32, 8, 128, 64}, Case{3, 8, 2, 77, 128}, Case{2, 4, 1, 300, 64}}) {
      at::manual_seed(c.T);
      const auto o = at::TensorOptions().dtype(st).device(at::kCUDA);
      // [B, T, H, D] projections viewed [B, H, T, D], as the attention modules pass them.
      const at::Tensor q = at::randn({c.B, c.T, c.H, c.D}, o).transpose(1, 2);
      const at::Tensor k = at::randn({c.B, c.T, c.Hkv, c.D}, o).transpose(1, 2);
      const at::Tensor v = at::randn({c.B, c.T, c.Hkv, c.D}, o).transpose(1, 2);
      AttentionParams p;
      p.scale = 1.0 / std::sqrt(static_cast<double>(c.D));
      p.backend = AttentionBackend::kSdpa;
      const at::Tensor got = attention(q, k, v, p);
      const int64_t rep = c.H / c.Hkv;
      const at::Tensor want = hearth::compat::sdpa(q, repeat_kv(k, rep), repeat_kv(v, rep), c10::nullopt, true, p.scale);
      EXPECT_TRUE(at::equal(got, want)) << c10::toString(st) << " H " << c.H << " Hkv " << c.Hkv << " T " << c.T
                                        << " D " << c.D << ": max |d| "
                                        << (got.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<double>();
    }
  }
}

// A later prompt chunk (T queries after S - T cached keys) takes flash attention aligned
// lower-right (compat::flash_causal_lower_right): the same values as the plain path in fp32 on the
// same bf16/fp16 inputs (within the kernel's rounding of its output), GQA read in place; a chunk
// with a hidden key wrongly visible (upper-left alignment) would be off by ~0.1-1.
TEST(Attention, CudaLaterChunkTakesFlashAlignedLowerRight) {
  if (!hearth::compat::cuda_available()) GTEST_SKIP() << "needs CUDA (GPU machine)";
  if (!hearth::compat::kHasSdpaGqa) GTEST_SKIP() << "libtorch " << hearth::compat::torch_version() << " is older than 2.5";
  struct Case {
    int64_t B, H, Hkv, T, S, D;
  };
  for (at::ScalarType st : {at::kBFloat16, at::kHalf}) {
    for (Case c : {Case{1, 32, 8, 128, 384, 128}, Case{2, 8, 2, 77, 100, 64}, Case{1, 4, 4, 70, 300, 64}}) {
      at::manual_seed(c.S);
      const auto o = at::TensorOptions().dtype(st).device(at::kCUDA);
      const at::Tensor q = at::randn({c.B, c.T, c.H, c.D}, o).transpose(1, 2);
      const at::Tensor k = at::randn({c.B, c.S, c.Hkv, c.D}, o).transpose(1, 2);
      const at::Tensor v = at::randn({c.B, c.S, c.Hkv, c.D}, o).transpose(1, 2);
      const at::Tensor direct = hearth::compat::flash_causal_lower_right(q, k, v, 0.125);
      ASSERT_TRUE(direct.defined());
      AttentionParams p;
      p.scale = 0.125;
      p.q_pos0 = 1000 + c.S - c.T;
      p.k_pos0 = 1000;
      p.backend = AttentionBackend::kSdpa;
      const at::Tensor got = attention(q, k, v, p);
      EXPECT_TRUE(at::equal(got, direct)) << "attention() did not take the flash chunk path";
      AttentionParams plain = p;
      plain.backend = AttentionBackend::kPlain;
      const at::Tensor want = attention(q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat), plain);
      const double err = (got.to(at::kFloat) - want).abs().max().item<double>();
      EXPECT_LT(err, st == at::kHalf ? 4e-3 : 2e-2) << c10::toString(st) << " T " << c.T << " S " << c.S;
    }
  }
  // Not a lower-right chunk (its last query is not at the last key): not taken.
  const auto o = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  EXPECT_FALSE(hearth::compat::flash_causal_lower_right(at::randn({1, 2, 9, 64}, o), at::randn({1, 2, 8, 64}, o),
                                                        at::randn({1, 2, 8, 64}, o), 0.125)
                   .defined());
}

// Long windowed blocks go by query blocks (attention_sliding_blocked): the same values and
// gradients as one masked call, for square training blocks and for a chunk of queries after cached
// keys, with the last block shorter than the others. Inputs in double; the plain path's softmax is
// fp32 (as transformers' eager), so both agree to its rounding (a wrongly masked key: ~0.1).
TEST(Attention, SlidingBlocksEqualOneMaskedCall) {
  at::manual_seed(5);
  struct Case { int64_t T, S, q0, k0, W, block; };
  for (const Case c : {Case{50, 50, 0, 0, 6, 8}, Case{23, 60, 37, 0, 9, 5}, Case{40, 40, 100, 100, 7, 7}}) {
    auto opts = at::TensorOptions().dtype(at::kDouble);
    auto q = at::randn({2, 4, c.T, 8}, opts).requires_grad_(true);
    auto k = at::randn({2, 2, c.S, 8}, opts).requires_grad_(true);
    auto v = at::randn({2, 2, c.S, 8}, opts).requires_grad_(true);
    AttentionParams p;
    p.scale = 0.4;
    p.q_pos0 = c.q0;
    p.k_pos0 = c.k0;
    p.sliding_window = c.W;
    p.backend = AttentionBackend::kPlain;
    at::Tensor blocked = attention_sliding_blocked(q, k, v, p, c.block);
    ASSERT_TRUE(blocked.defined()) << "T " << c.T;
    at::Tensor whole = attention(q, k, v, p);
    EXPECT_LT((blocked - whole).abs().max().item<double>(), 2e-6) << "T " << c.T;
    EXPECT_LT((blocked - naive(q.detach(), k.detach(), v.detach(), p)).abs().max().item<double>(), 2e-6);
    auto w = at::randn_like(whole);
    auto gb = torch::autograd::grad({(blocked * w).sum()}, {q, k, v});
    auto gw = torch::autograd::grad({(whole * w).sum()}, {q, k, v});
    for (int i = 0; i < 3; ++i) EXPECT_LT((gb[i] - gw[i]).abs().max().item<double>(), 2e-6) << "grad " << i;
  }
  // Where it does not apply: no window, one block, queries before every key.
  auto q = at::randn({1, 2, 16, 4}), k = at::randn({1, 2, 16, 4}), v = at::randn({1, 2, 16, 4});
  AttentionParams p;
  p.backend = AttentionBackend::kPlain;
  EXPECT_FALSE(attention_sliding_blocked(q, k, v, p, 4).defined());
  p.sliding_window = 3;
  EXPECT_FALSE(attention_sliding_blocked(q, k, v, p, 16).defined());
  p.k_pos0 = 5;
  EXPECT_FALSE(attention_sliding_blocked(q, k, v, p, 4).defined());
}

// Decode steps under an explicit additive mask on the CPU (the decode slots' [B, 1, T, S] over a
// length bucket) take attention_decode_cpu: only the span from each row's first to last visible
// key, K/V read in place. Same as the plain path: rows of different lengths, a sliding window, a
// hole inside the span, two queries per row, and a row with no visible key (plain's answer).
TEST(Attention, MaskedDecodeOnCpuMatchesPlain) {
  at::manual_seed(6);
  const float low = std::numeric_limits<float>::lowest();
  for (int64_t T : {1, 2}) {
    auto q = at::randn({3, 4, T, 16}), k = at::randn({3, 2, 24, 16}), v = at::randn({3, 2, 24, 16});
    at::Tensor mask = at::full({3, 1, T, 24}, low);
    mask.index_put_({0, 0, at::indexing::Slice(), at::indexing::Slice(0, 5)}, 0.0f);    // a short row
    mask.index_put_({1, 0, at::indexing::Slice(), at::indexing::Slice()}, 0.0f);        // the whole bucket
    mask.index_put_({2, 0, at::indexing::Slice(), at::indexing::Slice(6, 13)}, 0.0f);   // a window
    mask.index_put_({2, 0, at::indexing::Slice(), 9}, low);                              // a hole
    if (T == 2) mask.index_put_({0, 0, 1, 5}, 0.0f);                                     // query 2 sees one more
    AttentionParams p;
    p.scale = 0.25;
    p.mask = mask;
    const at::Tensor fast = attention(q, k, v, p);
    p.backend = AttentionBackend::kPlain;
    const at::Tensor plain = attention(q, k, v, p);
    EXPECT_LT((fast - plain).abs().max().item<float>(), 1e-5) << "T " << T;
    // Row 0's keys past its span do not matter at all (they are not even read).
    auto k2 = k.clone(), v2 = v.clone();
    k2.narrow(2, 8, 16).fill_(1e30);
    v2.narrow(2, 8, 16).fill_(1e30);
    p.backend = AttentionBackend::kAuto;
    EXPECT_TRUE(at::equal(attention(q, k2, v2, p)[0], fast[0])) << "T " << T;
  }
  // A row with nothing visible: the plain path's uniform weights, not a division by zero.
  auto q = at::randn({1, 2, 1, 8}), k = at::randn({1, 1, 4, 8}), v = at::randn({1, 1, 4, 8});
  AttentionParams p;
  p.mask = at::full({1, 1, 1, 4}, low);
  const at::Tensor got = attention(q, k, v, p);
  p.backend = AttentionBackend::kPlain;
  EXPECT_TRUE(at::allclose(got, attention(q, k, v, p)));
  EXPECT_FALSE(got.isnan().any().item<bool>());
}
