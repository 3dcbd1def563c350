// Test helper: Hearth's CPU fp32 prompt logits against the float64 reference logits that
// tools/gen_exact_logits.py writes beside a golden (exact.json, prompt<i>_logits_exact.bin), and
// transformers' own fp32 distance to them (exact.json's fp32_vs_exact). Used by the Qwen3.5 and
// Gemma 4 parity tests (*Exact); read_golden_logits by every family's parity test.
#pragma once
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/hf_config.h"
#include "models/registry.h"

namespace hearth::testing {

/// Raw little-endian float32 logits [T, V] from a golden's .bin file (V = size / 4 / T).
inline at::Tensor read_golden_logits(const std::filesystem::path& p, int64_t T) {
  std::ifstream f(p, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), {});
  const int64_t n = static_cast<int64_t>(bytes.size() / 4);
  at::Tensor t = at::empty({n}, at::kFloat);
  std::memcpy(t.data_ptr(), bytes.data(), n * 4);  // little-endian host
  return t.view({T, n / T});
}

/// Worst max |Δlogit| over the prompts checked: Hearth fp32 vs float64, transformers fp32 vs float64.
struct ExactWorst {
  double hearth = 0, transformers = 0;
  int prompts = 0;  // prompts compared (0: no exact.json in any folder)
};

/// For each golden folder holding exact.json: loads the model on CPU fp32, prefills every golden
/// prompt and EXPECTs max |logits - float64 logits| <= per_prompt_tol; returns the worst values.
inline ExactWorst compare_with_exact(const std::vector<std::filesystem::path>& dirs, double per_prompt_tol) {
  ExactWorst w;
  for (const auto& dir : dirs) {
    if (!std::filesystem::exists(dir / "exact.json")) continue;
    const auto golden = io::read_json(dir / "golden.json");
    const auto exact = io::read_json(dir / "exact.json");
    EXPECT_EQ(exact["prompts"].size(), golden["prompts"].size()) << dir;
    if (exact["prompts"].size() != golden["prompts"].size()) continue;
    auto model = models::load_model(dir, {at::kCPU, at::kFloat});
    for (size_t i = 0; i < golden["prompts"].size(); ++i) {
      const auto ids = golden["prompts"][i]["ids"].get<std::vector<int64_t>>();
      const int64_t T = static_cast<int64_t>(ids.size());
      const at::Tensor want = read_golden_logits(dir / exact["prompts"][i]["logits_exact"].get<std::string>(), T);
      auto caches = model->make_cache();
      const at::Tensor got = model->forward(at::tensor(ids, at::kLong).view({1, T}), 0, &caches)[0];
      const double d = (got - want).abs().max().item<double>();
      EXPECT_LE(d, per_prompt_tol) << dir.filename() << " prompt of " << T << " tokens vs float64";
      w.hearth = std::max(w.hearth, d);
      w.transformers = std::max(w.transformers, exact["prompts"][i]["fp32_vs_exact"].get<double>());
      ++w.prompts;
    }
  }
  return w;
}

}  // namespace hearth::testing
