// Parity with transformers (tier 1, CPU fp32): for every tiny model under tests/golden/models/
// (made by tools/gen_tiny_models.py with transformers, eager attention), the prompt logits match
// within 1e-4 and the 32-token greedy continuation through the KV cache is identical. Calls are
// made in the reference's order on one model instance (prompt 0 forward + decode, then prompt 1),
// which matters for dynamic RoPE whose state carries across calls exactly as in transformers.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "exact_logits.h"
#include "generate/generate.h"
#include "io/hf_config.h"
#include "models/registry.h"
#include "test_paths.h"

namespace fs = std::filesystem;

namespace {

const fs::path kLlamaGolden = fs::path(HEARTH_SOURCE_DIR) / "tests/golden/models";

std::vector<std::string> variants() {
  std::vector<std::string> out;
  if (fs::exists(kLlamaGolden))
    for (const auto& e : fs::directory_iterator(kLlamaGolden))
      if (fs::exists(e.path() / "golden.json") && e.path().filename().string().rfind("gemma4", 0) != 0)
        out.push_back(e.path().filename().string());  // gemma4_*: tests/models/gemma4_parity_test.cpp
  std::sort(out.begin(), out.end());
  if (out.empty()) out.push_back("none");
  return out;
}

}  // namespace

// Outside the anonymous namespace: a TEST_P's class derives from it (GCC's -Wsubobject-linkage
// in a unity batch otherwise).
class LlamaParity : public ::testing::TestWithParam<std::string> {};

TEST_P(LlamaParity, LogitsAndGreedyMatchTransformers) {
  if (GetParam() == "none") GTEST_SKIP() << "no goldens under " << kLlamaGolden;
  const fs::path dir = kLlamaGolden / GetParam();
  auto golden = hearth::io::read_json(dir / "golden.json");
  auto model = hearth::models::load_model(dir, {at::kCPU, at::kFloat});
  for (const auto& p : golden["prompts"]) {
    std::vector<int64_t> ids = p["ids"].get<std::vector<int64_t>>();
    const int64_t T = static_cast<int64_t>(ids.size());
    at::Tensor want = hearth::testing::read_golden_logits(dir / p["logits"].get<std::string>(), T);
    auto caches = model->make_cache();
    at::Tensor input = at::tensor(ids, at::kLong).view({1, T});
    at::Tensor logits = model->forward(input, 0, &caches)[0];
    const double diff = (logits - want).abs().max().item<double>();
    EXPECT_LE(diff, 1e-4) << GetParam() << " prompt of " << T << " tokens";
    std::vector<int64_t> greedy;
    at::Tensor last = logits[-1];
    for (int i = 0; i < 32; ++i) {
      const int64_t next = last.argmax().item<int64_t>();
      greedy.push_back(next);
      last = model->forward(at::full({1, 1}, next, at::kLong), T + i, &caches)[0][-1];
    }
    EXPECT_EQ(greedy, p["greedy_ids"].get<std::vector<int64_t>>()) << GetParam();
    std::cout << "[parity] " << GetParam() << " T=" << T << " max|dlogit|=" << diff << "\n";
  }
  // The generation loop (fresh model: same state history as the reference for prompt 0).
  auto fresh = hearth::models::load_model(dir, {at::kCPU, at::kFloat});
  const auto& p0 = golden["prompts"][0];
  hearth::generate::GenerateOptions opts;
  opts.max_tokens = 32;
  auto result = hearth::generate::generate(*fresh, p0["ids"].get<std::vector<int64_t>>(), opts);
  EXPECT_EQ(result.tokens, p0["greedy_ids"].get<std::vector<int64_t>>()) << GetParam() << " via generate()";
}

INSTANTIATE_TEST_SUITE_P(Golden, LlamaParity, ::testing::ValuesIn(variants()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });
