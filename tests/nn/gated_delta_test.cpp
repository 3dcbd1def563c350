// The gated delta rule: chunked (several chunks, padding, initial state, GQA heads) == recurrent
// token by token == a naive per-head loop written from the recurrence; causal conv1d in pieces
// with state == in one go; gradients flow through the chunked form.
#include "nn/gated_delta.h"

#include <gtest/gtest.h>

#include "../test_util.h"

using namespace hearth::nn;

namespace {

struct Inputs {
  at::Tensor q, k, v, g, beta, s0;
};

Inputs random_inputs(int64_t B, int64_t T, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv, uint64_t seed) {
  at::manual_seed(seed);
  Inputs in;
  in.q = at::randn({B, T, Hk, Dk});
  in.k = at::randn({B, T, Hk, Dk});
  in.v = at::randn({B, T, Hv, Dv});
  in.g = -at::rand({B, T, Hv}) * 2.0;  // log decay <= 0
  in.beta = at::rand({B, T, Hv});
  in.s0 = at::randn({B, Hv, Dk, Dv}) * 0.3;
  return in;
}

// The recurrence written plainly, per batch row and value head (float64).
std::pair<at::Tensor, at::Tensor> naive_gated_delta(const Inputs& in, bool with_state) {
  const int64_t B = in.v.size(0), T = in.v.size(1), Hv = in.v.size(2), Dk = in.k.size(3), Dv = in.v.size(3);
  const int64_t rep = Hv / in.k.size(2);
  at::Tensor out = at::zeros({B, T, Hv, Dv}, at::kDouble);
  at::Tensor S = with_state ? in.s0.to(at::kDouble).clone() : at::zeros({B, Hv, Dk, Dv}, at::kDouble);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hv; ++h) {
      at::Tensor s = S[b][h];
      for (int64_t t = 0; t < T; ++t) {
        at::Tensor q = in.q[b][t][h / rep].to(at::kDouble), k = in.k[b][t][h / rep].to(at::kDouble);
        q = q / q.norm() / std::sqrt(static_cast<double>(Dk));
        k = k / k.norm();
        s = s * std::exp(in.g[b][t][h].item<double>());
        at::Tensor delta = (in.v[b][t][h].to(at::kDouble) - at::matmul(k, s)) * in.beta[b][t][h].item<double>();
        s = s + at::outer(k, delta);
        out[b][t][h] = at::matmul(q, s);
      }
      S[b][h] = s;
    }
  return {out, S};
}

double maxdiff(const at::Tensor& a, const at::Tensor& b) { return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>(); }

}  // namespace

TEST(GatedDelta, ChunkedEqualsRecurrentEqualsNaive) {
  // T = 150 with chunk 64: three chunks, the last padded; Hv/Hk = 2.
  Inputs in = random_inputs(2, 150, 2, 4, 16, 8, 1);
  for (bool with_state : {false, true}) {
    at::Tensor s0 = with_state ? in.s0 : at::Tensor();
    GatedDeltaOut c = chunk_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, s0);
    GatedDeltaOut r = recurrent_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, s0);
    auto [want, want_state] = naive_gated_delta(in, with_state);
    ASSERT_EQ(c.out.sizes(), (std::vector<int64_t>{2, 150, 4, 8}));
    ASSERT_EQ(c.state.sizes(), (std::vector<int64_t>{2, 4, 16, 8}));
    EXPECT_EQ(c.state.scalar_type(), at::kFloat);
    EXPECT_LT(maxdiff(c.out, want), 1e-4) << with_state;
    EXPECT_LT(maxdiff(r.out, want), 1e-4) << with_state;
    EXPECT_LT(maxdiff(c.state, want_state), 1e-4) << with_state;
    EXPECT_LT(maxdiff(r.state, want_state), 1e-4) << with_state;
    EXPECT_LT(maxdiff(c.out, r.out), 1e-5) << with_state;
  }
}

TEST(GatedDelta, ChunkSizesAndPiecesAgree) {
  Inputs in = random_inputs(1, 70, 3, 3, 8, 8, 2);
  GatedDeltaOut whole = chunk_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, at::Tensor());
  GatedDeltaOut small = chunk_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, at::Tensor(), 16);
  EXPECT_LT(maxdiff(whole.out, small.out), 1e-5);
  // Two pieces, the second starting from the first's state (a split prefill).
  auto piece = [&](const at::Tensor& x, int64_t a, int64_t n) { return x.narrow(1, a, n); };
  GatedDeltaOut p1 = chunk_gated_delta_rule(piece(in.q, 0, 33), piece(in.k, 0, 33), piece(in.v, 0, 33),
                                            piece(in.g, 0, 33), piece(in.beta, 0, 33), at::Tensor());
  GatedDeltaOut p2 = chunk_gated_delta_rule(piece(in.q, 33, 37), piece(in.k, 33, 37), piece(in.v, 33, 37),
                                            piece(in.g, 33, 37), piece(in.beta, 33, 37), p1.state);
  EXPECT_LT(maxdiff(at::cat({p1.out, p2.out}, 1), whole.out), 1e-5);
  EXPECT_LT(maxdiff(p2.state, whole.state), 1e-5);
}

TEST(GatedDelta, CausalConvInPiecesEqualsWhole) {
  at::manual_seed(3);
  const int64_t B = 2, C = 6, T = 11, K = 4;
  at::Tensor x = at::randn({B, C, T}), w = at::randn({C, K});
  auto [whole, whole_state] = causal_conv1d(x, w, at::Tensor());
  // Naive: out[c, t] = silu(sum_j w[c, j] · x[c, t - (K-1) + j]), zeros before the start.
  at::Tensor padded = at::cat({at::zeros({B, C, K - 1}), x}, -1);
  at::Tensor naive_gated_delta = at::zeros({B, C, T});
  for (int64_t t = 0; t < T; ++t) naive_gated_delta.select(2, t).copy_((padded.narrow(2, t, K) * w).sum(-1));
  EXPECT_LT(maxdiff(whole, at::silu(naive_gated_delta)), 1e-6);
  EXPECT_TRUE(whole_state.equal(x.narrow(2, T - (K - 1), K - 1)));
  at::Tensor state;
  std::vector<at::Tensor> outs;
  for (auto [a, n] : std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {1, 2}, {3, 1}, {4, 7}}) {
    auto [o, s] = causal_conv1d(x.narrow(2, a, n), w, state);
    outs.push_back(o);
    state = s;
  }
  EXPECT_LT(maxdiff(at::cat(outs, 2), whole), 1e-6);
  EXPECT_TRUE(state.equal(whole_state));
  EXPECT_NE(hearth::testing::error_of([&] { causal_conv1d(x, at::randn({C + 1, K}), at::Tensor()); }), "");
  EXPECT_NE(hearth::testing::error_of([&] { causal_conv1d(x, w, at::zeros({B, C, K})); }), "");
}

TEST(GatedDelta, ChunkedIsDifferentiable) {
  Inputs in = random_inputs(1, 20, 1, 2, 4, 4, 4);
  in.v.requires_grad_(true);
  in.q.requires_grad_(true);
  GatedDeltaOut c = chunk_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, at::Tensor(), 8);
  c.out.sum().backward();
  ASSERT_TRUE(in.v.grad().defined());
  ASSERT_TRUE(in.q.grad().defined());
  // d sum(out) / d v matches the recurrent form's.
  at::Tensor gv = in.v.grad().clone();
  in.v.mutable_grad() = at::Tensor();
  recurrent_gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, at::Tensor()).out.sum().backward();
  EXPECT_LT(maxdiff(gv, in.v.grad()), 1e-5);
}
