// The shipped starter (models/starter, MLX 8-bit) against transformers: tokenization of the golden
// prompts, the top-10 logits at the last prompt position and the 32-token greedy continuation,
// from tests/golden/starter/golden.json (tools/gen_starter_golden.py: transformers fp32 eager on
// the dequantized weights). Hearth runs its own quantized path on the CPU in fp32.
#include <gtest/gtest.h>

#include <filesystem>

#include "generate/generate.h"
#include "io/hf_config.h"
#include "models/registry.h"
#include "tokenizer/tokenizer.h"
#include "test_paths.h"

namespace fs = std::filesystem;

namespace {
const fs::path kStarter = fs::path(HEARTH_SOURCE_DIR) / "models/starter";
const fs::path kStarterGolden = fs::path(HEARTH_SOURCE_DIR) / "tests/golden/starter/golden.json";
}  // namespace

TEST(Starter, GreedyContinuationMatchesTransformers) {
  ASSERT_TRUE(fs::exists(kStarter / "config.json")) << kStarter << " is missing: the starter ships in the repo";
  ASSERT_TRUE(fs::exists(kStarterGolden)) << kStarterGolden << " is missing (tools/gen_starter_golden.py)";
  const auto golden = hearth::io::read_json(kStarterGolden);
  auto model = hearth::models::load_model(kStarter, {at::kCPU, at::kFloat});
  const auto tok = hearth::tokenizer::Tokenizer::from_dir(kStarter);
  for (const auto& p : golden["prompts"]) {
    const std::string text = p["text"].get<std::string>();
    SCOPED_TRACE(text);
    const auto ids32 = tok.encode(text, /*add_special_tokens=*/true);
    const std::vector<int64_t> ids(ids32.begin(), ids32.end());
    ASSERT_EQ(ids, p["ids"].get<std::vector<int64_t>>());
    const int64_t T = static_cast<int64_t>(ids.size());
    auto caches = model->make_cache();
    const at::Tensor logits = model->forward(at::tensor(ids, at::kLong).view({1, T}), 0, &caches)[0][-1];
    double worst = 0;
    for (const auto& pair : p["last_logits_top"]) {
      const int64_t id = pair[0].get<int64_t>();
      worst = std::max(worst, std::abs(logits[id].item<double>() - pair[1].get<double>()));
    }
    EXPECT_LE(worst, 1e-3) << "top-10 logits differ from transformers";
    EXPECT_EQ(logits.argmax().item<int64_t>(), p["last_logits_top"][0][0].get<int64_t>());
    hearth::generate::GenerateOptions opts;
    opts.max_tokens = 32;
    auto fresh = hearth::models::load_model(kStarter, {at::kCPU, at::kFloat});
    const auto result = hearth::generate::generate(*fresh, ids, opts);
    EXPECT_EQ(result.tokens, p["greedy_ids"].get<std::vector<int64_t>>());
    std::cout << "[starter] " << text << ": max |dlogit| (top 10) " << worst << ", min greedy gap "
              << p["min_gap"].get<double>() << "\n";
  }
}
