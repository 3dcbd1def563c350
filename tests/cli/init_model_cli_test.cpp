// `hearth init-model` end to end: the folder loads with models::load_model and runs; weight
// statistics follow transformers' _init_weights (normal(0, initializer_range) for Linear and
// Embedding, ones for RMSNorm); tied embeddings write no lm_head; the seed decides the weights;
// the written chat template renders Llama-2-chat style with one BOS and an EOS after the answer,
// and a prompt tokenizes as a prefix of prompt + answer; bad input is a one-line error.
#include <gtest/gtest.h>

#include "../test_util.h"
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "chat/chat_template.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "models/registry.h"
#include "tokenizer/tokenizer.h"
#include "test_paths.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
using hearth::testing::CliResult;
CliResult run_init_model(const std::string& args, bool merge_stderr = true) {
  return hearth::testing::run_hearth(args, merge_stderr);
}

const fs::path kTokDir = fs::path(HEARTH_SOURCE_DIR) / "tests/golden/models/llama_mha";  // vocab 512

}  // namespace

// Outside the anonymous namespace: the TEST_Fs derive from it (GCC's -Wsubobject-linkage in a
// unity batch otherwise).
class InitModelCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("hearth_init_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    hearth::io::remove_tree(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { hearth::io::remove_tree(dir_); }
  fs::path write_config(const std::string& name, const json& cfg) {
    fs::path p = dir_ / name;
    std::ofstream(p) << cfg.dump();
    return p;
  }
  static json tiny_config(bool tied) {
    return {{"model_type", "llama"},       {"vocab_size", 512},         {"hidden_size", 128},
            {"intermediate_size", 256},    {"num_hidden_layers", 2},    {"num_attention_heads", 4},
            {"num_key_value_heads", 2},    {"max_position_embeddings", 256}, {"rms_norm_eps", 1e-5},
            {"tie_word_embeddings", tied}, {"initializer_range", 0.02}};
  }
  fs::path dir_;
};

namespace {
double std_of(const at::Tensor& t) { return t.to(at::kDouble).std().item<double>(); }
double mean_of(const at::Tensor& t) { return t.to(at::kDouble).mean().item<double>(); }
}  // namespace

TEST_F(InitModelCli, LoadsRunsAndFollowsTheInit) {
  fs::path cfg = write_config("c.json", tiny_config(false));
  fs::path out = dir_ / "m";
  CliResult r = run_init_model("init-model --config " + cfg.string() + " --tokenizer " + kTokDir.string() + " --out " +
                    out.string() + " --seed 7");
  ASSERT_EQ(r.rc, 0) << r.out;
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"})
    EXPECT_TRUE(fs::exists(out / f)) << f;
  EXPECT_FALSE(fs::exists(out.string() + ".tmp." + std::to_string(::getpid())));

  auto st = hearth::io::SafetensorsFile::open(out / "model.safetensors");
  // 2·(C·C + 2·C·(C/2) + C·C) attention + 2·3·C·I MLP + embed V·C + lm_head V·C + norms (2·2+1)·C
  const int64_t C = 128, I = 256, V = 512;
  int64_t numel = 0;
  for (const auto& t : st->tensors()) {
    int64_t n = 1;
    for (auto d : t.shape) n *= d;
    numel += n;
  }
  EXPECT_EQ(numel, 2 * (C * C + 2 * C * (C / 2) + C * C) + 2 * 3 * C * I + 2 * V * C + 5 * C);
  EXPECT_TRUE(st->contains("lm_head.weight"));
  for (const char* name : {"model.embed_tokens.weight", "lm_head.weight", "model.layers.0.self_attn.q_proj.weight",
                           "model.layers.1.self_attn.k_proj.weight", "model.layers.1.mlp.down_proj.weight"}) {
    at::Tensor w = st->tensor(name);
    EXPECT_EQ(w.scalar_type(), at::kFloat) << name;
    EXPECT_NEAR(std_of(w), 0.02, 0.02 * 0.05) << name;  // ≥ 8k samples: sampling error < 1.6%
    EXPECT_NEAR(mean_of(w), 0.0, 0.002) << name;
  }
  for (const char* name : {"model.norm.weight", "model.layers.0.input_layernorm.weight",
                           "model.layers.1.post_attention_layernorm.weight"})
    EXPECT_TRUE(st->tensor(name).eq(1.0f).all().item<bool>()) << name;

  json config = hearth::io::read_json(out / "config.json");
  EXPECT_EQ(config["hidden_size"], 128);
  EXPECT_EQ(config["torch_dtype"], "float32");
  json gen = hearth::io::read_json(out / "generation_config.json");
  hearth::tokenizer::Tokenizer tok = hearth::tokenizer::Tokenizer::from_dir(out);
  EXPECT_EQ(gen["bos_token_id"], *tok.bos_id());
  EXPECT_EQ(gen["eos_token_id"], *tok.eos_id());

  auto model = hearth::models::load_model(out, hearth::nn::LoadOptions{});
  at::Tensor logits = model->forward(at::arange(5, at::kLong).unsqueeze(0), 0, nullptr);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{1, 5, V}));
  EXPECT_TRUE(logits.isfinite().all().item<bool>());
  // Random init: logits are near zero (|logit| ≈ std of a sum of C·0.02-scaled terms), not degenerate.
  EXPECT_GT(logits.abs().max().item<float>(), 0.0f);
}

TEST_F(InitModelCli, TiedSeededAndBf16) {
  fs::path cfg = write_config("c.json", tiny_config(true));
  auto init = [&](const std::string& name, const std::string& extra) {
    return run_init_model("init-model --config " + cfg.string() + " --tokenizer " + kTokDir.string() + " --out " +
               (dir_ / name).string() + " " + extra);
  };
  ASSERT_EQ(init("a", "--seed 1").rc, 0);
  ASSERT_EQ(init("b", "--seed 1").rc, 0);
  ASSERT_EQ(init("c", "--seed 2").rc, 0);
  CliResult bf = init("d", "--seed 1 --dtype bfloat16");
  ASSERT_EQ(bf.rc, 0) << bf.out;
  auto a = hearth::io::SafetensorsFile::open(dir_ / "a/model.safetensors");
  auto b = hearth::io::SafetensorsFile::open(dir_ / "b/model.safetensors");
  auto c = hearth::io::SafetensorsFile::open(dir_ / "c/model.safetensors");
  auto d = hearth::io::SafetensorsFile::open(dir_ / "d/model.safetensors");
  EXPECT_FALSE(a->contains("lm_head.weight"));
  const std::string q = "model.layers.0.self_attn.q_proj.weight";
  EXPECT_TRUE(a->tensor(q).equal(b->tensor(q)));
  EXPECT_FALSE(a->tensor(q).equal(c->tensor(q)));
  EXPECT_EQ(d->tensor(q).scalar_type(), at::kBFloat16);
  EXPECT_TRUE(d->tensor(q).to(at::kFloat).equal(a->tensor(q).to(at::kBFloat16).to(at::kFloat)));
  EXPECT_EQ(hearth::io::read_json(dir_ / "d/config.json")["torch_dtype"], "bfloat16");

  // Tied: the head is the embedding, so logits = final hidden · embedᵀ.
  auto model = hearth::models::load_model(dir_ / "a", hearth::nn::LoadOptions{});
  at::Tensor ids = at::tensor({3, 9, 27}, at::kLong).unsqueeze(0);
  at::Tensor h = model->forward_layers(model->embed(ids), 0, model->num_layers(), hearth::models::Positions::uniform(0, ids.size(0)), nullptr).hidden;
  at::Tensor logits = model->head(h);
  auto fresh = hearth::io::SafetensorsFile::open(dir_ / "a/model.safetensors");
  at::Tensor E = fresh->tensor("model.embed_tokens.weight");
  at::Tensor normed = h * at::rsqrt(h.pow(2).mean(-1, true) + 1e-5);  // model.norm weight is ones
  EXPECT_TRUE(at::allclose(logits, at::matmul(normed, E.t()), 1e-4, 1e-5));
}

TEST_F(InitModelCli, ChatTemplateAndEosAreConsistent) {
  fs::path cfg = write_config("c.json", tiny_config(true));
  fs::path out = dir_ / "m";
  ASSERT_EQ(run_init_model("init-model --config " + cfg.string() + " --tokenizer " + kTokDir.string() + " --out " + out.string()).rc, 0);
  hearth::tokenizer::Tokenizer tok = hearth::tokenizer::Tokenizer::from_dir(out);
  ASSERT_FALSE(tok.chat_template().empty());
  using ojson = nlohmann::ordered_json;
  ojson user = ojson::array({ojson{{"role", "user"}, {"content", "Split: A. B."}}});
  ojson both = user;
  both.push_back(ojson{{"role", "assistant"}, {"content", "[\"A.\", \"B.\"]"}});
  const std::string bos = tok.bos_token(), eos = tok.eos_token();
  ASSERT_EQ(bos, "<|bos|>");
  ASSERT_EQ(eos, "<|endoftext|>");
  const std::string prompt = hearth::chat::render_chat_template(tok.chat_template(), user, ojson(), true, ojson::object(), bos, eos);
  const std::string full = hearth::chat::render_chat_template(tok.chat_template(), both, ojson(), false, ojson::object(), bos, eos);
  EXPECT_EQ(prompt, "<|bos|>[INST] Split: A. B. [/INST]");
  EXPECT_EQ(full, "<|bos|>[INST] Split: A. B. [/INST] [\"A.\", \"B.\"]<|endoftext|>");
  // hearth train encodes the full render without special tokens; the prompt must be a prefix.
  auto p = tok.encode(prompt, false), f = tok.encode(full, false);
  ASSERT_LT(p.size(), f.size());
  EXPECT_TRUE(std::equal(p.begin(), p.end(), f.begin()));
  EXPECT_EQ(f.front(), *tok.bos_id());
  EXPECT_EQ(f.back(), *tok.eos_id());
  EXPECT_EQ(hearth::io::read_json(out / "generation_config.json")["eos_token_id"], *tok.eos_id());
}

TEST_F(InitModelCli, BadInputIsOneLineError) {
  auto expect_error = [&](const CliResult& r, const std::string& needle) {
    EXPECT_NE(r.rc, 0) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
    EXPECT_NE(r.out.find(needle), std::string::npos) << r.out;
  };
  json wrong_vocab = tiny_config(true);
  wrong_vocab["vocab_size"] = 1000;
  fs::path c1 = write_config("v.json", wrong_vocab);
  expect_error(run_init_model("init-model --config " + c1.string() + " --tokenizer " + kTokDir.string() + " --out " + (dir_ / "x").string()),
               "vocab_size 1000 does not match the tokenizer's 512");
  json missing = tiny_config(true);
  missing.erase("hidden_size");
  fs::path c2 = write_config("h.json", missing);
  expect_error(run_init_model("init-model --config " + c2.string() + " --tokenizer " + kTokDir.string() + " --out " + (dir_ / "x").string()),
               "hidden_size");
  json heads = tiny_config(true);
  heads["num_attention_heads"] = 3;
  fs::path c3 = write_config("n.json", heads);
  expect_error(run_init_model("init-model --config " + c3.string() + " --tokenizer " + kTokDir.string() + " --out " + (dir_ / "x").string()),
               c3.string());
  fs::path good = write_config("g.json", tiny_config(true));
  expect_error(run_init_model("init-model --config " + good.string() + " --tokenizer " + kTokDir.string() + " --out " + dir_.string()),
               "already exists");
  expect_error(run_init_model("init-model --config " + good.string() + " --tokenizer " + kTokDir.string() + " --out " +
                   (dir_ / "x").string() + " --dtype int8"),
               "--dtype");
  // More than the machine's memory is refused before any allocation (libtorch's allocator
  // error named nothing), and no OUT.tmp.PID is left.
  json huge = tiny_config(true);
  huge["hidden_size"] = 10000000;
  huge["intermediate_size"] = 10000000;
  huge["num_attention_heads"] = 1;
  huge["num_key_value_heads"] = 1;
  fs::path c4 = write_config("big.json", huge);
  expect_error(run_init_model("init-model --config " + c4.string() + " --tokenizer " + kTokDir.string() + " --out " + (dir_ / "x").string()),
               "GB of memory");
  EXPECT_FALSE(fs::exists(dir_ / "x"));
  for (const auto& e : fs::directory_iterator(dir_)) EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}
