// The chunked MLP checkpoint (nn/mlp_chunk.h) against the plain GatedMLP (CPU fp32): the same
// output and the same gradients of x, of LoRA A/B and of dense weights, for uneven last chunks,
// T < chunk and a chunk of one position; through torch::autograd::grad the way the segmented
// backward's vjp() uses it (parameter gradients counted once, also when x is a constant); a
// backward on another thread (as CUDA's autograd device thread) still applies the adapters; LoRA
// dropout is refused.
#include <gtest/gtest.h>

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>

#include <thread>

#include "core/error.h"
#include "nn/linear.h"
#include "nn/mlp.h"
#include "nn/mlp_chunk.h"

using hearth::nn::ActiveAdapters;
using hearth::nn::GatedMLP;
using hearth::nn::Linear;
using hearth::nn::LoraAdapter;

namespace {

// A GatedMLP C 8 → I 12 → C 8 with LoRA "t" (rank 3) on every projection; `dense_grad`: the
// dense weights are trainable too (a full fine-tune).
struct ChunkMlpFixture {
  GatedMLP mlp;
  std::vector<at::Tensor> trainable;
  explicit ChunkMlpFixture(bool dense_grad, double dropout = 0.0) {
    at::manual_seed(11);
    auto lin = [&](int64_t in, int64_t out) {
      at::Tensor w = at::randn({out, in}) * 0.4;
      if (dense_grad) w.requires_grad_(true), trainable.push_back(w);
      Linear l(w);
      LoraAdapter ad;
      ad.a = (at::randn({3, in}) * 0.3).requires_grad_(true);
      ad.b = (at::randn({out, 3}) * 0.3).requires_grad_(true);
      ad.scale = 1.5;
      ad.dropout = dropout;
      trainable.push_back(ad.a);
      trainable.push_back(ad.b);
      l.add_adapter("t", ad);
      return l;
    };
    mlp.gate_proj = lin(8, 12);
    mlp.up_proj = lin(8, 12);
    mlp.down_proj = lin(12, 8);
  }
  void zero() {
    for (auto& t : trainable) t.mutable_grad() = at::Tensor();
  }
  std::vector<at::Tensor> grads() const {
    std::vector<at::Tensor> g;
    for (const auto& t : trainable) g.push_back(t.grad().defined() ? t.grad().clone() : at::Tensor());
    return g;
  }
  hearth::nn::PositionWiseFn whole() const {
    return [this](const at::Tensor& x) { return mlp.forward_whole(x); };
  }
  std::vector<const Linear*> linears() const { return {&mlp.gate_proj, &mlp.up_proj, &mlp.down_proj}; }
};

double rel_chunk(const at::Tensor& a, const at::Tensor& b) {
  return ((a - b).norm() / b.norm().clamp_min(1e-30)).item<double>();
}

// Output and gradients of Σ (y · w) for y = mlp(x) plain, then chunked by `chunk`; compares.
void expect_chunked_equals_plain(bool dense_grad, int64_t chunk, const std::vector<int64_t>& shape) {
  ChunkMlpFixture f(dense_grad);
  ActiveAdapters active({"t"});
  at::Tensor x0 = at::randn(shape);
  std::vector<int64_t> out_shape = shape;
  at::Tensor w = at::randn(out_shape);
  at::Tensor x = x0.clone().requires_grad_(true);
  at::Tensor y_ref = f.mlp.forward_whole(x);
  (y_ref * w).sum().backward();
  const at::Tensor gx_ref = x.grad().clone();
  const auto g_ref = f.grads();
  f.zero();
  at::Tensor xc = x0.clone().requires_grad_(true);
  at::Tensor y = hearth::nn::checkpoint_chunks(xc, f.whole(), f.linears(), chunk);
  ASSERT_EQ(y.sizes(), y_ref.sizes());
  EXPECT_LT(rel_chunk(y, y_ref), 1e-6) << "chunk " << chunk;
  (y * w).sum().backward();
  EXPECT_LT(rel_chunk(xc.grad(), gx_ref), 1e-6) << "chunk " << chunk;
  const auto g = f.grads();
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_TRUE(g[i].defined()) << "param " << i;
    EXPECT_LT(rel_chunk(g[i], g_ref[i]), 1e-6) << "chunk " << chunk << " param " << i;
  }
}

}  // namespace

TEST(ChunkedMlp, LoraGradsEqualPlainForUnevenAndOversizedChunks) {
  for (int64_t chunk : {1, 5, 7, 26, 100}) expect_chunked_equals_plain(false, chunk, {2, 13, 8});  // N = 26
}

TEST(ChunkedMlp, DenseWeightGradsEqualPlain) {
  for (int64_t chunk : {4, 9}) expect_chunked_equals_plain(true, chunk, {1, 17, 8});
}

// The scope switches GatedMLP::forward to chunks only above the chunk size, with or without grad.
TEST(ChunkedMlp, ScopeChunksOnlyLongInputsAndNoGradValuesAgree) {
  ChunkMlpFixture f(false);
  ActiveAdapters active({"t"});
  at::Tensor x = at::randn({1, 10, 8});
  const at::Tensor ref = f.mlp.forward_whole(x);
  {
    hearth::nn::MlpChunkScope scope(3);
    EXPECT_EQ(hearth::nn::MlpChunkScope::current(), 3);
    {
      hearth::nn::MlpChunkScope inner(0);
      EXPECT_EQ(hearth::nn::MlpChunkScope::current(), 0);
    }
    EXPECT_EQ(hearth::nn::MlpChunkScope::current(), 3);
    c10::NoGradGuard no_grad;
    EXPECT_LT(rel_chunk(f.mlp.forward(x), ref), 1e-6);
  }
  EXPECT_EQ(hearth::nn::MlpChunkScope::current(), 0);
  at::Tensor xg = x.clone().requires_grad_(true);
  {
    hearth::nn::MlpChunkScope scope(3);
    at::Tensor y = f.mlp.forward(xg);
    ASSERT_TRUE(y.grad_fn());  // ViewBackward0 → the checkpoint node
    ASSERT_FALSE(y.grad_fn()->next_edges().empty());
    const std::string node = y.grad_fn()->next_edges()[0].function->name();
    EXPECT_NE(node.find("ChunkedCheckpoint"), std::string::npos) << node;
  }
  {
    hearth::nn::MlpChunkScope scope(10);  // T == chunk: the plain formula
    at::Tensor y = f.mlp.forward(xg);
    EXPECT_EQ(y.grad_fn()->name().find("ChunkedCheckpoint"), std::string::npos) << y.grad_fn()->name();
    for (const auto& e : y.grad_fn()->next_edges())
      if (e.function) EXPECT_EQ(e.function->name().find("ChunkedCheckpoint"), std::string::npos) << e.function->name();
  }
  EXPECT_THROW(hearth::nn::MlpChunkScope(-5), hearth::Error);
}

// torch::autograd::grad over the chunked node, as segmented.cpp's vjp() takes it: the parameters'
// gradients arrive in .grad (inner backward), grad() returns none of them, and .grad + returned ==
// the plain gradients — each counted once. With x a constant (no input gradient wanted), the node
// must still run (grad(inputs = params) reaches it through the anchor input).
TEST(ChunkedMlp, AutogradGradCountsParameterGradsOnceAlsoWithConstantInput) {
  for (bool x_grad : {true, false}) {
    ChunkMlpFixture f(false);
    ActiveAdapters active({"t"});
    at::Tensor x0 = at::randn({2, 11, 8});
    at::Tensor g_out = at::randn({2, 11, 8});
    at::Tensor x = x0.clone().requires_grad_(x_grad);
    torch::autograd::backward({f.mlp.forward_whole(x)}, {g_out});
    const auto ref = f.grads();
    f.zero();
    at::Tensor xc = x0.clone().requires_grad_(x_grad);
    at::Tensor y = hearth::nn::checkpoint_chunks(xc, f.whole(), f.linears(), 4);
    std::vector<at::Tensor> inputs;
    if (x_grad) inputs.push_back(xc);
    inputs.insert(inputs.end(), f.trainable.begin(), f.trainable.end());
    auto got = torch::autograd::grad({y}, inputs, {g_out}, false, false, /*allow_unused=*/true);
    const size_t off = x_grad ? 1 : 0;
    for (size_t i = 0; i < f.trainable.size(); ++i) {
      at::Tensor total = f.trainable[i].grad();
      ASSERT_TRUE(total.defined()) << "x_grad " << x_grad << " param " << i << ": the node did not run";
      if (got[off + i].defined()) total = total + got[off + i];  // what vjp()'s add_grads adds
      EXPECT_LT(rel_chunk(total, ref[i]), 1e-6) << "x_grad " << x_grad << " param " << i;
    }
  }
}

// CUDA's autograd engine runs a CUDA node's backward on its device thread, where the caller's
// ActiveAdapters scope does not exist: the node reinstates the forward's selection.
TEST(ChunkedMlp, BackwardOnAnotherThreadStillAppliesTheAdapters) {
  ChunkMlpFixture f(false);
  at::Tensor x0 = at::randn({1, 9, 8}), g_out = at::randn({1, 9, 8});
  at::Tensor y_ref, y;
  at::Tensor x = x0.clone().requires_grad_(true), xc = x0.clone().requires_grad_(true);
  {
    ActiveAdapters active({"t"});
    y_ref = f.mlp.forward_whole(x);
    y = hearth::nn::checkpoint_chunks(xc, f.whole(), f.linears(), 2);
  }
  torch::autograd::backward({y_ref}, {g_out});
  const auto ref = f.grads();
  f.zero();
  std::thread t([&] { torch::autograd::backward({y}, {g_out}); });  // no adapter scope on this thread
  t.join();
  EXPECT_LT(rel_chunk(xc.grad(), x.grad()), 1e-6);
  const auto g = f.grads();
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_TRUE(g[i].defined()) << i;
    EXPECT_LT(rel_chunk(g[i], ref[i]), 1e-6) << i;
  }
}

TEST(ChunkedMlp, LoraDropoutIsRefusedWithGrad) {
  ChunkMlpFixture f(false, 0.1);
  ActiveAdapters active({"t"});
  hearth::nn::LoraDropoutScope dropout(3);
  at::Tensor x = at::randn({1, 6, 8}).requires_grad_(true);
  try {
    hearth::nn::checkpoint_chunks(x, f.whole(), f.linears(), 2);
    FAIL() << "no error";
  } catch (const hearth::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--lora-dropout 0"), std::string::npos) << e.what();
  }
  c10::NoGradGuard no_grad;  // without grad nothing is recomputed: allowed
  EXPECT_EQ(hearth::nn::checkpoint_chunks(x, f.whole(), f.linears(), 2).sizes(), x.sizes());
}
