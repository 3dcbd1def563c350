// RoPE: each scaling type's inv_freq against the formula of transformers' modeling_rope_utils.py
// evaluated here in double precision (expected values are the formula, not our code's output),
// config parsing in both conventions, the dynamic-NTK update, and rotate_half.
#include "nn/rope.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"

using hearth::nn::compute_rope_init;
using hearth::nn::RopeParams;

namespace {

// theta^(-2i/dim) for i in [0, dim/2): the original RoPE frequencies.
std::vector<double> default_freqs(double theta, int64_t dim) {
  std::vector<double> f;
  for (int64_t i = 0; i < dim / 2; ++i) f.push_back(std::pow(theta, -2.0 * i / dim));
  return f;
}

void expect_close(const at::Tensor& got, const std::vector<double>& want, double rel = 2e-6) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  auto a = got.to(at::kDouble).contiguous();
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(a.data_ptr<double>()[i], want[i], rel * std::abs(want[i])) << "index " << i;
}

RopeParams parse_rope(const nlohmann::json& j) { return RopeParams::from_json(j, "config.json"); }

}  // namespace

TEST(Rope, DefaultInvFreq) {
  auto init = compute_rope_init(parse_rope({{"rope_theta", 10000.0}}), 16, 128);
  expect_close(init.inv_freq, default_freqs(10000, 16));
  EXPECT_EQ(init.attention_scaling, 1.0);
  EXPECT_NEAR(init.inv_freq[1].item<float>(), 0.31622776601683794, 1e-7);  // 10000^(-1/8)
}

TEST(Rope, LinearDividesByFactor) {
  auto p = parse_rope({{"rope_theta", 500000.0}, {"rope_scaling", {{"type", "linear"}, {"factor", 4.0}}}});
  auto want = default_freqs(500000, 16);
  for (auto& w : want) w /= 4.0;
  expect_close(compute_rope_init(p, 16, 128).inv_freq, want);
}

TEST(Rope, DynamicNtkGrowsBase) {
  auto p = parse_rope({{"rope_scaling", {{"rope_type", "dynamic"}, {"factor", 2.0}}}});
  // At or below max_position_embeddings: unchanged.
  expect_close(compute_rope_init(p, 16, 64).inv_freq, default_freqs(10000, 16));
  expect_close(compute_rope_init(p, 16, 64, 50).inv_freq, default_freqs(10000, 16));
  // seq_len 100 > 64: base' = base · (factor·s/max − (factor−1))^(dim/(dim−2)).
  const double base = 10000 * std::pow(2.0 * 100 / 64 - 1.0, 16.0 / 14.0);
  expect_close(compute_rope_init(p, 16, 64, 100).inv_freq, default_freqs(base, 16), 5e-6);
}

TEST(Rope, DynamicUpdateIsStatefulLikeTransformers) {
  auto p = parse_rope({{"rope_scaling", {{"rope_type", "dynamic"}, {"factor", 2.0}}}});
  hearth::nn::RotaryEmbedding rope(p, 16, 16, at::kCPU);
  auto original = rope.inv_freq().clone();
  rope.cos_sin(0, 20, at::kFloat);  // seq_len 20 > 16: recomputed for 20
  const double base20 = 10000 * std::pow(2.0 * 20 / 16 - 1.0, 16.0 / 14.0);
  expect_close(rope.inv_freq(), default_freqs(base20, 16), 5e-6);
  rope.cos_sin(17, 1, at::kFloat);  // seq_len 18 <= cached 20: kept
  expect_close(rope.inv_freq(), default_freqs(base20, 16), 5e-6);
  rope.cos_sin(0, 8, at::kFloat);  // below the original max: restored
  EXPECT_TRUE(at::equal(rope.inv_freq(), original));
}

TEST(Rope, Llama3ThreeRegions) {
  // dim 16, theta 1e4: wavelengths 2π·1e4^(i/8) ≈ 6.3, 20, 63, 199, 628, 1987, 6283, 19869.
  // old_len 2048, low_freq_factor 1 → low_wavelen 2048; high_freq_factor 4 → high_wavelen 512.
  auto p = parse_rope({{"rope_scaling",
                   {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                    {"original_max_position_embeddings", 2048}}}});
  auto base = default_freqs(10000, 16);
  std::vector<double> want;
  for (double f : base) {
    const double wavelen = 2 * M_PI / f;
    if (wavelen < 512) want.push_back(f);             // high frequency: kept
    else if (wavelen > 2048) want.push_back(f / 8);   // low frequency: divided by factor
    else {                                            // medium: smooth interpolation
      const double s = (2048 / wavelen - 1.0) / (4.0 - 1.0);
      want.push_back((1 - s) * f / 8 + s * f);
    }
  }
  expect_close(compute_rope_init(p, 16, 8192).inv_freq, want, 5e-6);
  EXPECT_NE(want[4], base[4]);  // region 2 really exercised
  EXPECT_NE(want[6], base[6]);
}

TEST(Rope, YarnRampAndMscale) {
  // dim 16, base 1e4, original max 64: correction dims d(r) = 16·ln(64/(2πr)) / (2 ln 1e4):
  // d(32) < 0 → low = 0; d(1) ≈ 2.016 → ceil → high = 3. Ramp r_i = clamp(i/3, 0, 1);
  // inv = interp·r + extrap·(1 − r), interp = extrap / factor; attention = 0.1·ln(4) + 1.
  auto p = parse_rope({{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 64}}}});
  auto init = compute_rope_init(p, 16, 256);
  auto base = default_freqs(10000, 16);
  std::vector<double> want;
  for (size_t i = 0; i < base.size(); ++i) {
    const double r = std::min(1.0, std::max(0.0, i / 3.0));
    want.push_back(base[i] / 4 * r + base[i] * (1 - r));
  }
  expect_close(init.inv_freq, want, 5e-6);
  EXPECT_NEAR(init.attention_scaling, 0.1 * std::log(4.0) + 1.0, 1e-12);
  // mscale / mscale_all_dim (DeepSeek style): (0.1·m·ln f + 1) / (0.1·m_all·ln f + 1).
  auto p2 = parse_rope({{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}, {"mscale", 1.0}, {"mscale_all_dim", 0.5}}}});
  EXPECT_NEAR(compute_rope_init(p2, 16, 64).attention_scaling,
              (0.1 * std::log(4.0) + 1) / (0.05 * std::log(4.0) + 1), 1e-12);
}

TEST(Rope, BothConventionsParseTheSame) {
  auto v4 = parse_rope({{"rope_theta", 500000.0},
                   {"rope_scaling",
                    {{"rope_type", "llama3"}, {"factor", 32.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                     {"original_max_position_embeddings", 8192}}}});
  auto v5 = parse_rope({{"rope_parameters",
                    {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 32.0}, {"low_freq_factor", 1.0},
                     {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}}}});
  EXPECT_EQ(v4.type, "llama3");
  EXPECT_EQ(v5.type, "llama3");
  EXPECT_EQ(v4.theta, 500000.0);
  EXPECT_EQ(v5.theta, 500000.0);
  EXPECT_TRUE(at::equal(compute_rope_init(v4, 64, 131072).inv_freq, compute_rope_init(v5, 64, 131072).inv_freq));
  auto d5 = parse_rope({{"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1000000.0}}}});
  EXPECT_EQ(d5.type, "default");
  EXPECT_EQ(d5.theta, 1000000.0);
  EXPECT_EQ(parse_rope({{"rope_scaling", nullptr}}).type, "default");
}

TEST(Rope, ErrorsNameTheField) {
  try {
    parse_rope({{"rope_scaling", {{"type", "longrope"}, {"factor", 2.0}}}});
    FAIL();
  } catch (const hearth::Error& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported rope type 'longrope'"), std::string::npos) << e.what();
  }
  try {
    parse_rope({{"rope_scaling", {{"type", "llama3"}, {"factor", 8.0}}}});
    FAIL();
  } catch (const hearth::Error& e) {
    EXPECT_NE(std::string(e.what()).find("low_freq_factor"), std::string::npos) << e.what();
  }
}

TEST(Rope, CosSinAndRotateHalf) {
  hearth::nn::RotaryEmbedding rope(parse_rope({{"rope_theta", 100.0}}), 8, 64, at::kCPU);
  auto [cos, sin] = rope.cos_sin(3, 2, at::kFloat);
  ASSERT_EQ(cos.sizes(), (std::vector<int64_t>{2, 8}));
  auto f = default_freqs(100, 8);
  for (int t = 0; t < 2; ++t)
    for (int j = 0; j < 8; ++j) {
      EXPECT_NEAR(cos[t][j].item<float>(), std::cos((3 + t) * f[j % 4]), 1e-6);
      EXPECT_NEAR(sin[t][j].item<float>(), std::sin((3 + t) * f[j % 4]), 1e-6);
    }
  at::Tensor x = at::arange(1, 5, at::kFloat);  // [1, 2, 3, 4] → [-3, -4, 1, 2]
  EXPECT_TRUE(at::equal(hearth::nn::rotate_half(x), at::tensor({-3.f, -4.f, 1.f, 2.f})));
}
