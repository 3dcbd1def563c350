// Segmented backward == full backward == plain autograd, on a toy LoRA layer stack (fp32, 1e-6
// relative), for segment sizes 1, 2, a non-divisor, the whole stack, and with isolated layers;
// and on a toy that carries extra boundary streams like Gemma 4 (a constant per-layer input made
// by the embedding, and "donor" streams made by one layer and read by every later one); offloaded
// boundaries (BackwardOptions::offload_boundaries) give bit-identical gradients on both toys.
#include <gtest/gtest.h>

#include "core/error.h"
#include "train/loss.h"
#include "train/segmented.h"

using namespace hearth::train;
using hearth::models::Boundary;

namespace {

// L layers: h ← h + tanh(norm(h) (W + s·B A)ᵀ), with frozen W [C, C] and trainable A [r, C], B [C, r].
// With `streams`: the embedding also makes "pli" = tanh(emb2[ids]) that every layer adds; layer
// 1 makes "kv.a" and layer 3 "kv.b" (donors), which every later layer reads (sharers), and a
// layer range passes every stream it does not replace through unchanged.
struct Toy {
  int64_t L, C, V, r = 2;
  bool streams = false;
  at::Tensor emb, emb2, head_w, norm_w;
  std::vector<at::Tensor> W, A, B;
  Toy(int64_t L_, int64_t C_, int64_t V_, bool train_ends, bool streams_ = false)
      : L(L_), C(C_), V(V_), streams(streams_) {
    at::manual_seed(5);
    emb = at::randn({V, C}) * 0.5;
    head_w = at::randn({V, C}) * 0.3;
    norm_w = 1 + 0.1 * at::randn({C});
    emb2 = at::randn({V, C}) * 0.5;
    for (int64_t l = 0; l < L; ++l) {
      W.push_back(at::randn({C, C}) * 0.3);
      A.push_back((at::randn({r, C}) * 0.3).requires_grad_(true));
      B.push_back((at::randn({C, r}) * 0.3).requires_grad_(true));
    }
    if (train_ends) {
      emb.requires_grad_(true);
      if (streams) emb2.requires_grad_(true);
      head_w.requires_grad_(true);
    }
  }
  Boundary streamed_layer(const Boundary& in, int64_t l) const {
    Boundary out = in;
    out.hidden = layer(in.hidden, l) + 0.1 * *in.find("pli");
    if (l == 1 || l == 3) {
      at::Tensor n = out.hidden * at::rsqrt(out.hidden.pow(2).mean(-1, true) + 1e-5);
      out.set(l == 1 ? "kv.a" : "kv.b", at::tanh(at::matmul(n, W[l]) + 0.5 * at::matmul(at::matmul(n, A[l].t()), B[l].t())));
    }
    if (l > 1) out.hidden = out.hidden + 0.2 * *out.find("kv.a") * at::sigmoid(out.hidden);
    if (l > 3) out.hidden = out.hidden + 0.2 * *out.find("kv.b");
    return out;
  }
  at::Tensor layer(const at::Tensor& h, int64_t l) const {
    at::Tensor n = h * at::rsqrt(h.pow(2).mean(-1, true) + 1e-5);
    at::Tensor y = at::matmul(n, W[l].t()) + 0.5 * at::matmul(at::matmul(n, A[l].t()), B[l].t());
    return h + at::tanh(y);
  }
  LayerStack stack() {
    LayerStack s;
    s.embed = [this](const at::Tensor& ids) {
      Boundary b(at::embedding(emb, ids));
      if (streams) b.set("pli", at::tanh(at::embedding(emb2, ids)));
      return b;
    };
    s.layers = [this](const Boundary& in, int64_t b, int64_t e) {
      Boundary x = in;
      for (int64_t l = b; l < e; ++l) {
        if (streams) x = streamed_layer(x, l);
        else x.hidden = layer(x.hidden, l);
      }
      return x;
    };
    s.head = [this](const at::Tensor& h) {
      return at::matmul(h * at::rsqrt(h.pow(2).mean(-1, true) + 1e-5) * norm_w, head_w.t());
    };
    s.num_layers = L;
    s.layer_params = [this](int64_t b, int64_t e) {
      std::vector<at::Tensor> p;
      for (int64_t l = b; l < e; ++l) p.insert(p.end(), {A[l], B[l]});
      return p;
    };
    if (emb.requires_grad()) {
      s.embed_params = {emb};
      if (streams) s.embed_params.push_back(emb2);
      s.head_params = {head_w};
    }
    return s;
  }
  std::vector<at::Tensor> params() const {
    std::vector<at::Tensor> p;
    for (int64_t l = 0; l < L; ++l) p.insert(p.end(), {A[l], B[l]});
    if (emb.requires_grad()) p.insert(p.end(), {emb, head_w});
    if (emb2.requires_grad()) p.push_back(emb2);
    return p;
  }
  void zero_grad() {
    for (auto& p : params()) p.mutable_grad() = at::Tensor();
  }
  std::vector<at::Tensor> grads() const {
    std::vector<at::Tensor> g;
    for (auto& p : params()) g.push_back(p.grad().clone());
    return g;
  }
};

double rel_segmented(const at::Tensor& a, const at::Tensor& b) {
  return ((a - b).norm() / b.norm().clamp_min(1e-30)).item<double>();
}

std::vector<at::Tensor> reference_grads(Toy& toy, const at::Tensor& ids, const at::Tensor& targets, double* loss) {
  toy.zero_grad();
  LayerStack s = toy.stack();
  at::Tensor logits = s.head(s.layers(s.embed(ids), 0, toy.L).hidden);
  at::Tensor l = at::cross_entropy_loss(logits.reshape({-1, toy.V}), targets.reshape({-1}), {}, at::Reduction::Mean,
                                        kIgnoreIndex);
  l.backward();
  *loss = l.item<double>();
  return toy.grads();
}

void check_all_segmentations(bool train_ends, bool streams = false) {
  Toy toy(7, 16, 23, train_ends, streams);
  at::Tensor ids = at::randint(0, 23, {2, 13}, at::kLong);
  at::Tensor labels = ids.clone();
  labels.index_put_({0, at::indexing::Slice(0, 4)}, kIgnoreIndex);
  at::Tensor targets = shift_labels(labels);
  double ref_loss = 0;
  auto ref = reference_grads(toy, ids, targets, &ref_loss);
  struct Case { int64_t seg; std::vector<int64_t> iso; };
  // Cuts that put the donors (1, 3) and their readers in the same and in different segments.
  for (const Case& c : std::vector<Case>{{0, {}}, {1, {}}, {2, {}}, {3, {}}, {4, {}}, {7, {}}, {3, {1, 5}}, {6, {3}}}) {
    toy.zero_grad();
    BackwardOptions o;
    o.segment_size = c.seg;
    o.isolate = c.iso;
    o.loss_chunk = 5;
    BackwardResult r = backward(toy.stack(), ids, targets, o);
    EXPECT_NEAR(r.loss_sum / r.n_tokens, ref_loss, 1e-6 * std::abs(ref_loss)) << "segment " << c.seg;
    auto g = toy.grads();
    ASSERT_EQ(g.size(), ref.size());
    for (size_t i = 0; i < g.size(); ++i) EXPECT_LT(rel_segmented(g[i], ref[i]), 1e-6) << "segment " << c.seg << " param " << i;
  }
}

// Offloaded boundaries: bit-identical losses and gradients (CPU fp32: the same ops on copies of
// the boundaries), every boundary byte in host memory, a stream passed through several edges
// counted once; and with a host limit, the later edges kept on the device, gradients unchanged.
void check_offload_identical(bool train_ends, bool streams) {
  Toy toy(7, 16, 23, train_ends, streams);
  at::Tensor ids = at::randint(0, 23, {2, 13}, at::kLong);
  at::Tensor targets = shift_labels(ids);
  const int64_t edge = 2 * 13 * 16 * 4;  // one [2, 13, 16] fp32 field
  for (int64_t seg : {1, 2, 3}) {
    BackwardOptions o;
    o.segment_size = seg;
    o.loss_chunk = 5;
    toy.zero_grad();
    const BackwardResult kept = backward(toy.stack(), ids, targets, o);
    const auto g_kept = toy.grads();
    if (seg == 1) EXPECT_EQ(kept.boundary_device_bytes, (streams ? 10 : 7) * edge);  // 7 hidden (+ pli, kv.a, kv.b once)
    for (int64_t limit : {int64_t{0}, kept.boundary_device_bytes / 2}) {
      o.offload_boundaries = true;
      o.offload_host_limit_bytes = limit;
      toy.zero_grad();
      const BackwardResult off = backward(toy.stack(), ids, targets, o);
      EXPECT_EQ(off.loss_sum, kept.loss_sum) << "segment " << seg;
      const auto g = toy.grads();
      for (size_t i = 0; i < g.size(); ++i)
        EXPECT_TRUE(at::equal(g[i], g_kept[i])) << "segment " << seg << " limit " << limit << " param " << i;
      if (limit == 0) {
        // On the device: only what is being brought back (one boundary; plus shared streams).
        if (!streams) EXPECT_EQ(off.boundary_device_bytes, edge) << "segment " << seg;
        EXPECT_LT(off.boundary_device_bytes, kept.boundary_device_bytes) << "segment " << seg;
        EXPECT_EQ(off.boundary_host_bytes, kept.boundary_device_bytes) << "segment " << seg;
      } else {
        EXPECT_GT(off.boundary_host_bytes, 0);
        EXPECT_LE(off.boundary_host_bytes, limit);
        EXPECT_GT(off.boundary_device_bytes, 0);
      }
    }
  }
}

}  // namespace

TEST(SegmentedOffload, LoraGradsBitIdentical) { check_offload_identical(false, false); }
TEST(SegmentedOffload, StreamsWithTrainableEndsBitIdentical) { check_offload_identical(true, true); }
TEST(SegmentedOffload, StreamsBitIdentical) { check_offload_identical(false, true); }

TEST(SegmentPlan, SizesNonDivisorsAndIsolation) {
  using P = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(plan_segments(7, 3), (P{{0, 3}, {3, 6}, {6, 7}}));
  EXPECT_EQ(plan_segments(4, 1), (P{{0, 1}, {1, 2}, {2, 3}, {3, 4}}));
  EXPECT_EQ(plan_segments(4, 0), (P{{0, 4}}));
  EXPECT_EQ(plan_segments(4, 9), (P{{0, 4}}));
  EXPECT_EQ(plan_segments(8, 3, {3, 7}), (P{{0, 3}, {3, 4}, {4, 7}, {7, 8}}));
  EXPECT_THROW(plan_segments(4, 2, {4}), hearth::Error);
}

TEST(SegmentedBackward, LoraGradsEqualFullAutograd) { check_all_segmentations(false); }

TEST(SegmentedBackward, EmbeddingAndHeadGradsEqualFullAutograd) { check_all_segmentations(true); }

// Boundary streams (Gemma 4's per-layer inputs and shared donor K/V): the cotangent of a donor's
// stream is gathered from every later segment that reads it before the donor's segment runs.
TEST(SegmentedBackward, StreamsCarriedAcrossSegmentsGiveFullGrads) { check_all_segmentations(false, true); }
TEST(SegmentedBackward, StreamsWithTrainableEmbeddingGiveFullGrads) { check_all_segmentations(true, true); }

TEST(SegmentedBackward, OnlyBoundariesAreKept) {
  Toy toy(6, 16, 23, false);
  at::Tensor ids = at::randint(0, 23, {1, 9}, at::kLong);
  at::Tensor targets = shift_labels(ids);
  BackwardOptions o;
  o.segment_size = 2;
  BackwardResult r = backward(toy.stack(), ids, targets, o);
  EXPECT_EQ(r.boundary_device_bytes, 3 * 9 * 16 * 4);  // one [1, 9, 16] fp32 boundary per segment
  EXPECT_EQ(r.boundary_host_bytes, 0);
}

// BackwardOptions::on_segment_grads: called once per segment, last first, with its layer range,
// when that segment's gradients are already final (bit-equal to the ones the call ends with, Gemma
// 4-like shared streams and trainable ends included); the full backward is one segment; a batch
// with no supervised token still makes every call (data-parallel ranks stay in step).
TEST(SegmentedBackward, SegmentGradsHookSeesFinalGrads) {
  using P = std::vector<std::pair<int64_t, int64_t>>;
  Toy toy(7, 16, 23, /*train_ends=*/true, /*streams=*/true);
  at::Tensor ids = at::randint(0, 23, {2, 11}, at::kLong);
  at::Tensor targets = shift_labels(ids);
  struct Case { int64_t seg; std::vector<int64_t> iso; P calls; };
  for (const Case& c : std::vector<Case>{{0, {3}, {{0, 7}}},
                                         {1, {}, {{6, 7}, {5, 6}, {4, 5}, {3, 4}, {2, 3}, {1, 2}, {0, 1}}},
                                         {3, {1, 5}, {{6, 7}, {5, 6}, {2, 5}, {1, 2}, {0, 1}}}}) {
    for (bool empty : {false, true}) {
      toy.zero_grad();
      LayerStack s = toy.stack();
      P calls;
      std::vector<std::vector<at::Tensor>> seen;  // each call's layer_params(begin, end) and their .grad then
      std::vector<std::vector<at::Tensor>> seen_grads;
      BackwardOptions o;
      o.segment_size = c.seg;
      o.isolate = c.iso;
      o.loss_chunk = 5;
      o.on_segment_grads = [&](int64_t b, int64_t e) {
        calls.emplace_back(b, e);
        seen.push_back(s.layer_params(b, e));
        seen_grads.emplace_back();
        for (const auto& p : seen.back()) seen_grads.back().push_back(p.grad().defined() ? p.grad().clone() : p.grad());
      };
      backward(s, ids, empty ? at::full_like(targets, kIgnoreIndex) : targets, o);
      EXPECT_EQ(calls, c.calls) << "segment " << c.seg << (empty ? " no tokens" : "");
      for (size_t k = 0; k < seen.size(); ++k)
        for (size_t i = 0; i < seen[k].size(); ++i) {
          ASSERT_EQ(seen_grads[k][i].defined(), !empty) << "segment " << c.seg << " call " << k;
          if (!empty) EXPECT_TRUE(at::equal(seen_grads[k][i], seen[k][i].grad())) << "segment " << c.seg << " call " << k;
        }
    }
  }
}
