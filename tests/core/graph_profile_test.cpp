// core/graph_profile.h: the table's totals, and a captured graph profiled node by node (CUDA only).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "core/error.h"
#include "core/graph_profile.h"
#include "core/torch_compat.h"
#include "nn/fused_ops.h"

#ifdef HEARTH_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

using hearth::compat::GraphNodeCost;

TEST(GraphProfile, TableSumsTheNodesAndGroupsThemByName) {
  std::vector<GraphNodeCost> nodes = {{"gemv", "64 x 256", 10.0}, {"rms_norm", "1 x 1024", 2.5}, {"gemv", "64 x 256", 5.0}};
  const std::string t = hearth::compat::format_graph_profile(nodes);
  EXPECT_NE(t.find("graph profile: 3 nodes, 17.5 us per replay"), std::string::npos) << t;
  // The group line: two gemv nodes, 15.0 us, 85.7 % of 17.5; largest group first.
  const size_t gemv = t.find("      2      15.0   85.7%  gemv");
  const size_t norm = t.find("      1       2.5   14.3%  rms_norm");
  EXPECT_NE(gemv, std::string::npos) << t;
  EXPECT_NE(norm, std::string::npos) << t;
  EXPECT_LT(gemv, norm);
  EXPECT_NE(t.find("     2      5.00  64 x 256          gemv"), std::string::npos) << t;  // node 2, in run order
}

TEST(GraphProfile, ProfilesEachNodeOfACapturedGraph) {
#ifdef HEARTH_WITH_CUDA
  if (!hearth::compat::cuda_available()) GTEST_SKIP() << "needs a CUDA device";
  at::Tensor x = at::zeros({1 << 22}, at::TensorOptions().device(at::kCUDA));
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  c10::cuda::CUDAStreamGuard guard(side);
  at::cuda::CUDAGraph g(/*keep_graph=*/true);
  g.capture_begin();
  x.add_(1.0);
  x.mul_(2.0);
  x.add_(1.0);
  g.capture_end();
  const std::vector<GraphNodeCost> nodes = hearth::compat::profile_graph(g.raw_cuda_graph(), side.stream(), 5);
  ASSERT_EQ(nodes.size(), 3u);
  double sum = 0.0;
  for (const GraphNodeCost& n : nodes) {
    EXPECT_NE(n.name.find("elementwise"), std::string::npos) << n.name;  // at::native's elementwise kernels
    EXPECT_FALSE(n.launch.empty());
    sum += n.us;
  }
  EXPECT_GT(sum, 1.0);  // three passes over 16 MiB take microseconds, not nothing
  side.synchronize();
  EXPECT_TRUE(at::isfinite(x).all().item<bool>());
#else
  EXPECT_THROW(hearth::compat::profile_graph(nullptr, nullptr, 5), hearth::Error);
#endif
}

// Hearth's own kernels launch with programmatic dependent launch on sm_90: their graph edges are
// programmatic, not default ones, and the profile must read them (the 1B decode step is made of them).
TEST(GraphProfile, ReadsProgrammaticEdges) {
#ifdef HEARTH_WITH_CUDA
  if (!hearth::compat::cuda_available()) GTEST_SKIP() << "needs a CUDA device";
  const auto bf16 = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  at::Tensor x = at::randn({4, 2048}, bf16), w = at::ones({2048}, bf16);
  if (!hearth::nn::fused_rms_norm(x, w, 1e-5, hearth::nn::NormScale::kAfterRound).defined())
    GTEST_SKIP() << "the fused norm kernel is not built";
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  c10::cuda::CUDAStreamGuard guard(side);
  at::cuda::CUDAGraph g(/*keep_graph=*/true);
  g.capture_begin();
  at::Tensor y = x;
  for (int i = 0; i < 3; ++i) y = hearth::nn::fused_rms_norm(y, w, 1e-5, hearth::nn::NormScale::kAfterRound);
  g.capture_end();
  const std::vector<GraphNodeCost> nodes = hearth::compat::profile_graph(g.raw_cuda_graph(), side.stream(), 5);
  ASSERT_EQ(nodes.size(), 3u);
  for (const GraphNodeCost& n : nodes) EXPECT_NE(n.name.find("rms_norm_kernel"), std::string::npos) << n.name;
#else
  GTEST_SKIP() << "needs a CUDA build";
#endif
}
