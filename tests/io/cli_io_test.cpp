// End-to-end tests of the io CLI verbs through the built binary (HEARTH_BINARY): `hearth info` on
// good and corrupt folders (non-zero exit, one stderr line) and `hearth convert -q` round trips.
#include <gtest/gtest.h>

#include <cstdio>
#include <sys/wait.h>

#include "io/atomic_file.h"
#include "io/hf_config.h"
#include "io/weights.h"
#include "io_test_util.h"
#include "nn/quant.h"
#include "test_paths.h"

using hearth::testing::TempDir;

namespace {

struct CliIoRun {
  int code;
  std::string out;  // stdout
  std::string err;  // stderr
};

CliIoRun run_hearth(const std::string& args, const TempDir& scratch) {
  const std::string err_path = (scratch / "stderr.txt").string();
  const std::string cmd = std::string(HEARTH_BINARY) + " " + args + " 2>" + err_path;
  CliIoRun r{-1, "", ""};
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = hearth::io::read_file(err_path);
  return r;
}

// A tiny llama-shaped float model folder.
void make_model(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  at::manual_seed(5);
  hearth::io::save_safetensors(dir / "model.safetensors",
                               {{"model.embed_tokens.weight", at::randn({16, 64})},
                                {"model.layers.0.self_attn.q_proj.weight", at::randn({64, 64})},
                                {"model.layers.0.mlp.odd_proj.weight", at::randn({8, 48})},  // 48 % 32 != 0
                                {"model.layers.0.input_layernorm.weight", at::ones({64})}});
  hearth::io::write_file_atomic(dir / "config.json", R"({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
      "num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
      "vocab_size": 16, "torch_dtype": "float32"})");
  hearth::io::write_file_atomic(dir / "tokenizer.json", "{}");
  hearth::io::write_file_atomic(dir / "chat_template.jinja", "{{ messages }}");
}

}  // namespace

TEST(CliIo, InfoOnCorruptModelFailsWithOneLine) {
  TempDir d;
  make_model(d / "m");
  hearth::testing::write_bytes(d / "m" / "model.safetensors", hearth::testing::safetensors_bytes("{", ""));
  CliIoRun r = run_hearth("info --model " + (d / "m").string(), d);
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("model.safetensors: header is not valid JSON"), std::string::npos) << r.err;
  r = run_hearth("info --model " + (d / "absent").string(), d);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("absent: model folder not found"), std::string::npos) << r.err;
}

TEST(CliIo, ConvertQuantizeThenInfo) {
  TempDir d;
  make_model(d / "m");
  CliIoRun r = run_hearth("convert -q --q-bits 4 --q-group-size 32 --model " + (d / "m").string() + " --out " +
                         (d / "q").string(),
                     d);
  ASSERT_EQ(r.code, 0) << r.err;
  hearth::io::WeightStore ws = hearth::io::WeightStore::open(d / "q");
  EXPECT_EQ(ws.info("model.layers.0.self_attn.q_proj.weight").dtype, hearth::io::DType::U32);
  EXPECT_EQ(ws.info("model.layers.0.self_attn.q_proj.weight").shape, (std::vector<int64_t>{64, 8}));
  EXPECT_EQ(ws.info("model.layers.0.self_attn.q_proj.scales").shape, (std::vector<int64_t>{64, 2}));
  EXPECT_TRUE(ws.contains("model.embed_tokens.biases"));
  EXPECT_FALSE(ws.contains("model.layers.0.mlp.odd_proj.scales"));        // 48 not divisible by 32
  EXPECT_FALSE(ws.contains("model.layers.0.input_layernorm.scales"));     // 1-D norm stays float
  EXPECT_EQ(ws.files()[0]->metadata().at("format"), "mlx");
  // The stored codes decode to the original within the quantization error bound.
  hearth::io::WeightStore orig = hearth::io::WeightStore::open(d / "m");
  hearth::nn::QuantizedWeight qw{ws.get("model.layers.0.self_attn.q_proj.weight"),
                                 ws.get("model.layers.0.self_attn.q_proj.scales"),
                                 ws.get("model.layers.0.self_attn.q_proj.biases"), {4, 32}};
  at::Tensor err = (hearth::nn::dequantize(qw, at::kFloat) - orig.get("model.layers.0.self_attn.q_proj.weight")).abs();
  EXPECT_TRUE(err.view({64, 2, 32}).le(qw.scales.abs().unsqueeze(-1) + 1e-6).all().item<bool>());
  // config carries both quantization keys; companions copied.
  nlohmann::json cfg = hearth::io::read_json(d / "q" / "config.json");
  EXPECT_EQ(cfg["quantization"], (nlohmann::json{{"group_size", 32}, {"bits", 4}, {"mode", "affine"}}));
  EXPECT_EQ(cfg["quantization_config"], cfg["quantization"]);
  EXPECT_TRUE(std::filesystem::exists(d / "q" / "tokenizer.json"));
  EXPECT_TRUE(std::filesystem::exists(d / "q" / "chat_template.jinja"));

  r = run_hearth("info --model " + (d / "q").string(), d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("4-bit affine, group 32"), std::string::npos) << r.out;
  // Logical parameter count: 16*64 + 64*64 + 8*48 + 64 = 5568, same as the float model.
  EXPECT_NE(r.out.find("(5568)"), std::string::npos) << r.out;
  CliIoRun rf = run_hearth("info --model " + (d / "m").string(), d);
  EXPECT_NE(rf.out.find("(5568)"), std::string::npos) << rf.out;

  // Quantizing a quantized model, or writing over an existing folder, fails and leaves nothing.
  r = run_hearth("convert -q --model " + (d / "q").string() + " --out " + (d / "qq").string(), d);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("already quantized"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(d / "qq"));
  r = run_hearth("convert --model " + (d / "m").string() + " --out " + (d / "q").string(), d);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("already exists"), std::string::npos) << r.err;
  size_t entries = 0;
  for (auto& e : std::filesystem::directory_iterator(d.path())) (void)e, ++entries;
  EXPECT_EQ(entries, 3u);  // m, q, stderr.txt: no temp folders left behind
}

TEST(CliIo, ConvertCastsDtype) {
  TempDir d;
  make_model(d / "m");
  CliIoRun r = run_hearth("convert --dtype bf16 --model " + (d / "m").string() + " --out " + (d / "b").string(), d);
  ASSERT_EQ(r.code, 0) << r.err;
  hearth::io::WeightStore ws = hearth::io::WeightStore::open(d / "b");
  EXPECT_EQ(ws.info("model.embed_tokens.weight").dtype, hearth::io::DType::BF16);
  hearth::io::WeightStore orig = hearth::io::WeightStore::open(d / "m");
  EXPECT_TRUE(at::equal(ws.get("model.embed_tokens.weight"), orig.get("model.embed_tokens.weight").to(at::kBFloat16)));
  EXPECT_FALSE(hearth::io::read_json(d / "b" / "config.json").contains("quantization"));
  EXPECT_EQ(hearth::io::read_json(d / "b" / "config.json")["torch_dtype"], "bfloat16");  // was float32
}

// -d/--dequantize (mlx_lm.convert --dequantize): every quantized module becomes its float weight,
// exactly nn::dequantize of the stored codes; the quantization blocks leave config.json; a float
// model or -q with -d is refused in one line.
TEST(CliIo, ConvertDequantizeUndoesTheQuantizedLayout) {
  TempDir d;
  make_model(d / "m");
  CliIoRun r = run_hearth("convert -q --q-bits 8 --q-group-size 32 --model " + (d / "m").string() + " --out " +
                              (d / "q").string(),
                          d);
  ASSERT_EQ(r.code, 0) << r.err;
  r = run_hearth("convert -d --dtype f32 --model " + (d / "q").string() + " --out " + (d / "f").string(), d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("2 dequantized"), std::string::npos) << r.out;  // embed_tokens and q_proj
  hearth::io::WeightStore q = hearth::io::WeightStore::open(d / "q");
  hearth::io::WeightStore f = hearth::io::WeightStore::open(d / "f");
  for (const std::string m : {"model.embed_tokens", "model.layers.0.self_attn.q_proj"}) {
    EXPECT_FALSE(f.contains(m + ".scales")) << m;
    EXPECT_FALSE(f.contains(m + ".biases")) << m;
    EXPECT_EQ(f.info(m + ".weight").dtype, hearth::io::DType::F32) << m;
    hearth::nn::QuantizedWeight qw{q.get(m + ".weight"), q.get(m + ".scales"), q.get(m + ".biases"), {8, 32}};
    EXPECT_TRUE(at::equal(f.get(m + ".weight"), hearth::nn::dequantize(qw, at::kFloat))) << m;
  }
  // The unquantized tensors pass through; the model is float again.
  EXPECT_TRUE(at::equal(f.get("model.layers.0.mlp.odd_proj.weight"), q.get("model.layers.0.mlp.odd_proj.weight")));
  nlohmann::json cfg = hearth::io::read_json(d / "f" / "config.json");
  EXPECT_FALSE(cfg.contains("quantization"));
  EXPECT_FALSE(cfg.contains("quantization_config"));
  EXPECT_EQ(cfg["torch_dtype"], "float32");

  // Scales stored as integers are refused, naming the tensor (they had produced a garbage model).
  {
    std::map<std::string, at::Tensor> t;
    for (const auto& n : q.names()) t[n] = q.get(n);
    t["model.layers.0.self_attn.q_proj.scales"] = t["model.layers.0.self_attn.q_proj.scales"].to(at::kShort);
    std::filesystem::create_directories(d / "qi");
    hearth::io::save_safetensors(d / "qi" / "model.safetensors", t, {{"format", "mlx"}},
                                 {{"model.layers.0.self_attn.q_proj.weight", hearth::io::DType::U32},
                                  {"model.embed_tokens.weight", hearth::io::DType::U32}});
    std::filesystem::copy_file(d / "q" / "config.json", d / "qi" / "config.json");
    r = run_hearth("convert -d --model " + (d / "qi").string() + " --out " + (d / "x").string(), d);
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.err.find("model.layers.0.self_attn.q_proj.scales is stored as I16, not a floating-point type"),
              std::string::npos)
        << r.err;
  }
  r = run_hearth("convert -d --model " + (d / "m").string() + " --out " + (d / "x").string(), d);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("is not quantized"), std::string::npos) << r.err;
  r = run_hearth("convert -q -d --model " + (d / "q").string() + " --out " + (d / "x").string(), d);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("exclude each other"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(d / "x"));
}
