// Full fine-tunes end to end on the tiny golden model (tests/golden/models/llama_mha), through the
// CLI: `hearth train --fine-tune-type full` writes every trained tensor under its HF name;
// `hearth fuse` puts them over a dense base (exactly), an MLX-quantized base (requantized with the
// module's spec, or dense with --dequantize) and writes a complete folder; `hearth generate
// --adapter-path FT` equals generate on the fused folder; `hearth serve` refuses to mount one (at
// start and through POST /v1/adapters) with a message that names the folder and `hearth fuse`.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>

#include "../io/io_test_util.h"
#include "../test_util.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "io/weights.h"
#include "nn/quant.h"
#include "server/api_error.h"
#include "server/model_engine.h"
#include "test_paths.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using hearth::testing::run_hearth;
using hearth::testing::shell_quote;

std::string q(const fs::path& p) { return shell_quote(p.string()); }

std::map<std::string, at::Tensor> read_all(const fs::path& file) {
  auto f = hearth::io::SafetensorsFile::open(file);
  std::map<std::string, at::Tensor> out;
  for (const auto& info : f->tensors()) out[info.name] = f->tensor(info.name).clone();
  return out;
}

// greedy `hearth generate` stdout (stderr dropped); EXPECTs exit 0.
std::string generate(const std::string& args) {
  auto r = run_hearth("generate " + args + " --prompt 'The cat sat' --ignore-chat-template --max-tokens 12 --device cpu",
                      /*merge_stderr=*/false);
  EXPECT_EQ(r.rc, 0) << args;
  return r.out;
}

class FullFinetuneCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new hearth::testing::TempDir();
    base_ = tmp_->path() / "base";
    fs::copy(fs::path(HEARTH_SOURCE_DIR) / "tests/golden/models/llama_mha", base_, fs::copy_options::recursive);
    fs::create_directories(tmp_->path() / "data");
    std::ofstream data(tmp_->path() / "data" / "train.jsonl");
    for (int i = 0; i < 4; ++i) data << json{{"text", "The cat sat on the mat. The dog ran far away."}}.dump() << "\n";
    data.close();
    ft_ = tmp_->path() / "ft";
    train_out_ = run_hearth("train --model " + q(base_) + " --data " + q(tmp_->path() / "data") + " --adapter-path " +
                            q(ft_) + " --fine-tune-type full --num-layers -1 --iters 3 --batch-size 2 " +
                            "--learning-rate 0.05 --max-seq-length 64 --device cpu");
  }
  static void TearDownTestSuite() { delete tmp_; }

  static hearth::testing::TempDir* tmp_;
  static fs::path base_, ft_;
  static hearth::testing::CliResult train_out_;
};
hearth::testing::TempDir* FullFinetuneCli::tmp_ = nullptr;
fs::path FullFinetuneCli::base_, FullFinetuneCli::ft_;
hearth::testing::CliResult FullFinetuneCli::train_out_;

TEST_F(FullFinetuneCli, TrainWritesEveryTrainedTensorUnderItsHfName) {
  ASSERT_EQ(train_out_.rc, 0) << train_out_.out;
  const json cfg = hearth::io::read_json(ft_ / "adapter_config.json");
  EXPECT_EQ(cfg["fine_tune_type"], "full");
  const auto trained = read_all(ft_ / "adapters.safetensors");
  const auto base = read_all(base_ / "model.safetensors");
  std::set<std::string> tn, bn;
  for (const auto& [n, t] : trained) tn.insert(n);
  for (const auto& [n, t] : base) bn.insert(n);
  EXPECT_EQ(tn, bn);  // --num-layers -1: every tensor of the model, same names
  int changed = 0;
  for (const auto& [n, t] : trained) {
    EXPECT_EQ(t.sizes(), base.at(n).sizes()) << n;
    changed += at::equal(t, base.at(n)) ? 0 : 1;
  }
  EXPECT_GT(changed, 10);  // the 2-D weights moved (lr 0.05, 3 steps)
}

TEST_F(FullFinetuneCli, FuseOverADenseBaseWritesTheTrainedTensorsAndACompleteFolder) {
  ASSERT_EQ(train_out_.rc, 0) << train_out_.out;
  const fs::path out = tmp_->path() / "fused_dense";
  auto r = run_hearth("fuse --model " + q(base_) + " --adapter-path " + q(ft_) + " --out " + q(out));
  ASSERT_EQ(r.rc, 0) << r.out;
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                        "generation_config.json"})
    EXPECT_TRUE(fs::exists(out / f)) << f;
  const auto fused = read_all(out / "model.safetensors");
  const auto trained = read_all(ft_ / "adapters.safetensors");
  ASSERT_EQ(fused.size(), trained.size());
  for (const auto& [n, t] : trained) EXPECT_TRUE(at::equal(fused.at(n), t)) << n;
  EXPECT_EQ(hearth::io::read_json(out / "config.json"), hearth::io::read_json(base_ / "config.json"));

  // generate --adapter-path FT loads the weights over the base: the same text as the fused folder,
  // and not the base's.
  const std::string with_ft = generate("--model " + q(base_) + " --adapter-path " + q(ft_));
  EXPECT_EQ(with_ft, generate("--model " + q(out)));
  EXPECT_NE(with_ft, generate("--model " + q(base_)));
  // Existing output folder: refused, nothing overwritten.
  r = run_hearth("fuse --model " + q(base_) + " --adapter-path " + q(ft_) + " --out " + q(out));
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("already exists"), std::string::npos) << r.out;
}

TEST_F(FullFinetuneCli, FuseOverAQuantizedBaseRequantizesWithTheModulesSpec) {
  ASSERT_EQ(train_out_.rc, 0) << train_out_.out;
  const fs::path qbase = tmp_->path() / "q8";
  auto r = run_hearth("convert --model " + q(base_) + " --out " + q(qbase) + " -q --q-bits 8 --q-group-size 32 --dtype bf16");
  ASSERT_EQ(r.rc, 0) << r.out;
  const fs::path out = tmp_->path() / "fused_q8";
  r = run_hearth("fuse --model " + q(qbase) + " --adapter-path " + q(ft_) + " --out " + q(out));
  ASSERT_EQ(r.rc, 0) << r.out;
  const auto fused = read_all(out / "model.safetensors");
  const auto trained = read_all(ft_ / "adapters.safetensors");
  const auto qb = read_all(qbase / "model.safetensors");
  const std::string mod = "model.layers.1.self_attn.q_proj";
  ASSERT_TRUE(fused.count(mod + ".scales"));
  const hearth::nn::QuantizedWeight expect =
      hearth::nn::quantize(trained.at(mod + ".weight").to(at::kBFloat16), hearth::nn::QuantSpec{8, 32});
  EXPECT_TRUE(at::equal(fused.at(mod + ".weight").view(at::kInt), expect.wq)) << mod;
  EXPECT_TRUE(at::equal(fused.at(mod + ".scales"), expect.scales.to(at::kBFloat16)));
  EXPECT_TRUE(at::equal(fused.at(mod + ".biases"), expect.biases.to(at::kBFloat16)));
  EXPECT_FALSE(at::equal(fused.at(mod + ".scales"), qb.at(mod + ".scales")));  // really replaced
  // Norms stay dense, cast to the base's bf16.
  const std::string norm = "model.layers.0.input_layernorm.weight";
  EXPECT_TRUE(at::equal(fused.at(norm), trained.at(norm).to(at::kBFloat16)));
  EXPECT_TRUE(hearth::io::read_json(out / "config.json").contains("quantization"));
  EXPECT_EQ(generate("--model " + q(qbase) + " --adapter-path " + q(ft_)), generate("--model " + q(out)));

  // --dequantize: dense weights in the scales' dtype, no quantization block.
  const fs::path dense = tmp_->path() / "fused_q8_dense";
  r = run_hearth("fuse --model " + q(qbase) + " --adapter-path " + q(ft_) + " --out " + q(dense) + " --dequantize");
  ASSERT_EQ(r.rc, 0) << r.out;
  const auto dq = read_all(dense / "model.safetensors");
  EXPECT_FALSE(dq.count(mod + ".scales"));
  EXPECT_TRUE(at::equal(dq.at(mod + ".weight"), trained.at(mod + ".weight").to(at::kBFloat16)));
  EXPECT_FALSE(hearth::io::read_json(dense / "config.json").contains("quantization"));
}

TEST_F(FullFinetuneCli, FuseIntoAnotherModelNamesTheTensor) {
  ASSERT_EQ(train_out_.rc, 0) << train_out_.out;
  const fs::path other = fs::path(HEARTH_SOURCE_DIR) / "tests/golden/models/qwen3";
  auto r = run_hearth("fuse --model " + q(other) + " --adapter-path " + q(ft_) + " --out " + q(tmp_->path() / "bad"));
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("full fine-tune " + ft_.string()), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tensor "), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(tmp_->path() / "bad"));
}

TEST_F(FullFinetuneCli, ServeRefusesToMountAFullFinetune) {
  ASSERT_EQ(train_out_.rc, 0) << train_out_.out;
  // At start: one line naming the folder and the way out, exit 1 (before binding a port).
  auto r = run_hearth("serve --model " + q(base_) + " --device cpu --port 0 --adapter ft=" + q(ft_));
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find(ft_.string() + ": full fine-tune"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fuse it into a model with hearth fuse"), std::string::npos) << r.out;
  // Hot-swap (POST /v1/adapters): a 400 with the same message.
  const fs::path model = tmp_->path() / "served";
  fs::copy(base_, model, fs::copy_options::recursive);
  fs::create_directories(model / "adapters");
  fs::copy(ft_, model / "adapters" / "ft", fs::copy_options::recursive);
  hearth::server::ModelEngineOptions eo;
  eo.model_dir = model;
  eo.device = "cpu";
  eo.dtype = "float32";
  hearth::server::ModelEngine engine(eo);
  try {
    engine.mount_adapter("ft", (model / "adapters" / "ft").string());
    FAIL() << "mounted a full fine-tune";
  } catch (const hearth::server::ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(std::string(e.what()).find("full fine-tune"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("hearth fuse"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(engine.list_adapters().empty());
}

}  // namespace
