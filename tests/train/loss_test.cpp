// Chunked CE + VJP equals the one-shot cross-entropy and its autograd gradient, for any chunk size.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "core/error.h"
#include "train/loss.h"

using namespace hearth::train;

namespace {
struct LossBatch {
  at::Tensor hidden, labels, w;  // [B, T, C], [B, T], [V, C]
};
LossBatch make(int64_t B, int64_t T, int64_t C, int64_t V) {
  at::manual_seed(3);
  LossBatch s{at::randn({B, T, C}, at::kDouble), at::randint(0, V, {B, T}, at::kLong), at::randn({V, C}, at::kDouble)};
  s.labels.index_put_({0, at::indexing::Slice(0, 3)}, kIgnoreIndex);  // prompt of row 0
  s.labels.index_put_({1, at::indexing::Slice(T - 2, T)}, kIgnoreIndex);  // padding of row 1
  return s;
}
}  // namespace

TEST(Loss, ShiftLabelsMovesTargetsLeft) {
  at::Tensor l = at::tensor({5, 6, 7, -100}, at::kLong).reshape({1, 4});
  at::Tensor t = shift_labels(l);
  EXPECT_TRUE(at::equal(t, at::tensor({6, 7, -100, -100}, at::kLong).reshape({1, 4})));
}

TEST(Loss, ChunkedVjpMatchesFullAutograd) {
  LossBatch s = make(2, 11, 8, 13);
  at::Tensor targets = shift_labels(s.labels);
  // Reference: at::cross_entropy with ignore_index, mean over supervised tokens, full autograd.
  at::Tensor h = s.hidden.clone().requires_grad_(true);
  at::Tensor w = s.w.clone().requires_grad_(true);
  at::Tensor logits = at::matmul(h, w.t());
  at::Tensor ref = at::cross_entropy_loss(logits.reshape({-1, 13}), targets.reshape({-1}), {}, at::Reduction::Mean,
                                          kIgnoreIndex);
  auto g = torch::autograd::grad({ref}, {h, w});
  for (int64_t chunk : {1, 3, 4, 11, 64}) {
    at::Tensor w2 = s.w.clone().requires_grad_(true);
    const int64_t n = targets.ne(kIgnoreIndex).sum().item<int64_t>();
    HeadVjp r = chunked_cross_entropy_vjp(s.hidden, targets, [&](const at::Tensor& x) { return at::matmul(x, w2.t()); },
                                          chunk, 1.0 / n, {w2});
    EXPECT_EQ(r.n_tokens, n);
    EXPECT_NEAR(r.loss_sum / r.n_tokens, ref.item<double>(), 1e-12) << "chunk " << chunk;
    EXPECT_LT((r.grad_hidden - g[0]).abs().max().item<double>(), 1e-12) << "chunk " << chunk;
    EXPECT_LT((w2.grad() - g[1]).abs().max().item<double>(), 1e-12) << "chunk " << chunk;
    HeadVjp e = chunked_cross_entropy(s.hidden, targets, [&](const at::Tensor& x) { return at::matmul(x, s.w.t()); }, chunk);
    EXPECT_NEAR(e.loss_sum, r.loss_sum, 1e-9);
  }
}

TEST(Loss, BadShapesAreErrors) {
  auto head = [](const at::Tensor& x) { return x; };
  EXPECT_THROW(chunked_cross_entropy(at::zeros({2, 3}), at::zeros({2, 3}, at::kLong), head, 4), hearth::Error);
  EXPECT_THROW(chunked_cross_entropy(at::zeros({2, 3, 4}), at::zeros({2, 2}, at::kLong), head, 4), hearth::Error);
  EXPECT_THROW(chunked_cross_entropy(at::zeros({2, 3, 4}), at::zeros({2, 3}, at::kLong), head, 0), hearth::Error);
}
