// The --dtype default every loading verb shares (nn::resolve_placement / default_dtype): on CUDA the
// checkpoint's declared torch_dtype (bf16/fp16; float32 when it says float32 or nothing), float32
// on the CPU. The CUDA branch is decided from the device value alone, so it is tested here without a GPU.
#include <gtest/gtest.h>

#include <string>

#include "../io/io_test_util.h"
#include "io/atomic_file.h"
#include "core/error.h"
#include "nn/param_source.h"

namespace {

namespace fs = std::filesystem;
using hearth::testing::TempDir;

fs::path model_with(const TempDir& d, const std::string& name, const std::string& config_json) {
  const fs::path dir = d / name;
  fs::create_directories(dir);
  hearth::io::write_file_atomic(dir / "config.json", config_json);
  return dir;
}

}  // namespace

TEST(DefaultDtype, CudaFollowsTheCheckpointCpuIsFloat32) {
  TempDir d;
  const at::Device cuda(at::kCUDA, 0), cpu(at::kCPU);
  const fs::path bf16 = model_with(d, "bf16", R"({"model_type": "llama", "torch_dtype": "bfloat16"})");
  const fs::path fp16 = model_with(d, "fp16", R"({"model_type": "llama", "torch_dtype": "float16"})");
  const fs::path fp32 = model_with(d, "fp32", R"({"model_type": "llama", "torch_dtype": "float32"})");
  const fs::path none = model_with(d, "none", R"({"model_type": "llama"})");
  const fs::path v5 = model_with(d, "v5", R"({"model_type": "llama", "dtype": "bfloat16"})");  // transformers 5.x key
  const fs::path nested = model_with(d, "nested", R"({"model_type": "gemma3", "text_config": {"torch_dtype": "float16"}})");
  const fs::path odd = model_with(d, "odd", R"({"model_type": "llama", "torch_dtype": 5})");

  EXPECT_EQ(hearth::nn::default_dtype(cuda, bf16), at::kBFloat16);
  EXPECT_EQ(hearth::nn::default_dtype(cuda, fp16), at::kHalf);
  EXPECT_EQ(hearth::nn::default_dtype(cuda, fp32), at::kFloat);  // was bf16 whatever the checkpoint said
  EXPECT_EQ(hearth::nn::default_dtype(cuda, none), at::kFloat);
  EXPECT_EQ(hearth::nn::default_dtype(cuda, v5), at::kBFloat16);
  EXPECT_EQ(hearth::nn::default_dtype(cuda, nested), at::kHalf);
  EXPECT_EQ(hearth::nn::default_dtype(cuda, odd), at::kFloat);
  EXPECT_EQ(hearth::nn::default_dtype(cuda, d / "missing"), at::kFloat);
  for (const fs::path& m : {bf16, fp16, fp32, none}) EXPECT_EQ(hearth::nn::default_dtype(cpu, m), at::kFloat) << m;

  EXPECT_EQ(hearth::nn::checkpoint_dtype(bf16), at::kBFloat16);
  EXPECT_FALSE(hearth::nn::checkpoint_dtype(none).has_value());

  // the flags: "" takes the default, an explicit dtype wins over the checkpoint
  EXPECT_EQ(hearth::nn::resolve_placement("cpu", "", bf16).dtype, at::kFloat);
  EXPECT_EQ(hearth::nn::resolve_placement("cpu", "bfloat16", fp32).dtype, at::kBFloat16);
  EXPECT_THROW(hearth::nn::resolve_placement("cpu", "float64", fp32), hearth::Error);
}
