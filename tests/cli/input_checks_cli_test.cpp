// CLI input checks from the issue-2 attack, through the built binary: each bad input is exit 1 and
// ONE stderr line naming the file or flag — config.json ranges and types (`info` and `generate`
// say the same), `convert --dtype` of an already-quantized model (packed codes untouched, the
// result loads and matches), `--dtype float16` on the CPU, `train --adapter-path` on a file,
// `generate --system` without a chat template, `bench` beyond the context.
#include <gtest/gtest.h>
#include <c10/core/GradMode.h>

#include <cstdlib>
#include <fstream>

#include "../io/io_test_util.h"
#include "cli_run_util.h"
#include "../test_util.h"
#include "io/atomic_file.h"
#include "io/hf_config.h"
#include "io/weights.h"
#include "models/registry.h"
#include "nn/param_source.h"
#include "test_paths.h"
#include "nn/quant_config.h"

namespace {

namespace fs = std::filesystem;
using hearth::testing::shell_quote;
using hearth::testing::TempDir;
using J = nlohmann::json;

fs::path golden_model(const std::string& variant) { return fs::path(HEARTH_SOURCE_DIR) / "tests/golden/models" / variant; }

using CliRun = hearth::testing::CliRunResult;

CliRun hearth_run(const std::string& args, const TempDir& scratch) { return hearth::testing::run_hearth_cli(args, scratch); }

// Exit 1 and exactly one stderr line, "hearth: error: ..." containing `needle`.
void expect_one_line_error(const CliRun& r, const std::string& needle) { hearth::testing::expect_one_line_cli_error(r, needle); }

// A copy of a golden model whose config.json gets `patch` merged in.
fs::path patched_model(const TempDir& d, const std::string& name, const J& patch) {
  const fs::path dir = d / name;
  fs::copy(golden_model("llama_mha"), dir, fs::copy_options::recursive);
  J cfg = hearth::io::read_json(dir / "config.json");
  cfg.update(patch);
  std::ofstream(dir / "config.json") << cfg.dump(1);
  return dir;
}

TEST(InputChecksCli, BadConfigValuesAreOneLineAndInfoAgreesWithGenerate) {
  TempDir d;
  const std::vector<std::pair<J, std::string>> cases = {
      {{{"rope_theta", "x"}}, "config.json: 'rope_theta' must be a number, got \"x\""},
      {{{"rms_norm_eps", -1e-5}}, "config.json: 'rms_norm_eps' must be a number > 0, got -1e-05"},
      {{{"rms_norm_eps", 0}}, "config.json: 'rms_norm_eps' must be a number > 0, got 0"},
      {{{"head_dim", 0}}, "config.json: 'head_dim' must be a positive integer, got 0"},
      {{{"rope_theta", -1.0}}, "config.json: 'rope_theta' must be > 0, got -1.0"},
  };
  int i = 0;
  for (const auto& [patch, expected] : cases) {
    const fs::path m = patched_model(d, "m" + std::to_string(i++), patch);
    const CliRun info = hearth_run("info --model " + shell_quote(m.string()), d);
    expect_one_line_error(info, (m / expected).string());
    EXPECT_EQ(info.err.find("json.exception"), std::string::npos) << info.err;
    const CliRun gen = hearth_run("generate --model " + shell_quote(m.string()) + " --prompt hi --device cpu --max-tokens 2", d);
    EXPECT_EQ(gen.rc, 1);
    EXPECT_EQ(gen.err, info.err);  // the same validation, the same line
  }
  // The untouched model passes both.
  const fs::path ok = patched_model(d, "ok", J::object());
  EXPECT_EQ(hearth_run("info --model " + shell_quote(ok.string()), d).rc, 0);
}

TEST(InputChecksCli, ConvertDtypeOfAQuantizedModelKeepsPackedCodesAndStillMatches) {
  TempDir d;
  const fs::path src = golden_model("mlx_q4"), out = d / "bf16";
  const CliRun r = hearth_run("convert --dtype bf16 --model " + shell_quote(src.string()) + " --out " + shell_quote(out.string()), d);
  ASSERT_EQ(r.rc, 0) << r.err;
  const hearth::io::WeightStore a = hearth::io::WeightStore::open(src), b = hearth::io::WeightStore::open(out);
  ASSERT_EQ(a.names(), b.names());
  int packed = 0;
  for (const auto& name : a.names()) {
    if (a.info(name).dtype == hearth::io::DType::U32) {
      ++packed;
      EXPECT_EQ(b.info(name).dtype, hearth::io::DType::U32) << name;  // not relabelled I32
      EXPECT_TRUE(at::equal(a.get(name), b.get(name))) << name;       // bytes untouched
    } else {
      EXPECT_EQ(b.info(name).dtype, hearth::io::DType::BF16) << name;  // weights, scales and biases alike
      EXPECT_TRUE(at::equal(a.get(name).to(at::kBFloat16), b.get(name))) << name;
    }
  }
  EXPECT_EQ(packed, 15);
  EXPECT_EQ(hearth::io::read_json(out / "config.json")["quantization"], hearth::io::read_json(src / "config.json")["quantization"]);
  // info still sees a quantized model with the same logical parameter count.
  const CliRun ia = hearth_run("info --model " + shell_quote(src.string()), d);
  const CliRun ib = hearth_run("info --model " + shell_quote(out.string()), d);
  ASSERT_EQ(ib.rc, 0) << ib.err;
  auto line = [](const std::string& text, const std::string& key) {
    const size_t p = text.find(key);
    return p == std::string::npos ? std::string() : text.substr(p, text.find('\n', p) - p);
  };
  EXPECT_EQ(line(ib.out, "parameters:"), line(ia.out, "parameters:"));
  EXPECT_EQ(line(ib.out, "quantization:"), line(ia.out, "quantization:"));
  EXPECT_NE(line(ib.out, "quantization:").find("4-bit affine"), std::string::npos) << ib.out;
  // Loaded in bf16, both give the same logits (the scales were cast to bf16 either way).
  c10::NoGradGuard no_grad;
  auto ma = hearth::models::load_model(src, {at::kCPU, at::kBFloat16});
  auto mb = hearth::models::load_model(out, {at::kCPU, at::kBFloat16});
  const at::Tensor ids = at::arange(1, 13, at::kLong).unsqueeze(0);
  const at::Tensor la = ma->forward(ids, 0, nullptr), lb = mb->forward(ids, 0, nullptr);
  EXPECT_TRUE(at::equal(la, lb)) << (la.to(at::kFloat) - lb.to(at::kFloat)).abs().max().item<float>();
  // In float32 it is exactly the source model with every float tensor rounded through bf16 and
  // the packed codes as they were (built here from the source's tensors, not the converted file).
  std::map<std::string, at::Tensor> rounded;
  for (const auto& name : a.names()) {
    at::Tensor t = a.get(name);
    rounded[name] = t.is_floating_point() ? t.to(at::kBFloat16).to(at::kFloat) : t;
  }
  const J cfg = hearth::io::read_json(src / "config.json");
  hearth::nn::TensorMapSource rsrc(rounded, "rounded");
  auto fr = hearth::models::build_model({cfg, "config.json", rsrc,
                                         hearth::nn::QuantizationConfig::from_config(cfg, "config.json"), {at::kCPU, at::kFloat}});
  auto fb = hearth::models::load_model(out, {at::kCPU, at::kFloat});
  EXPECT_TRUE(at::equal(fr->forward(ids, 0, nullptr), fb->forward(ids, 0, nullptr)));
}

TEST(InputChecksCli, Float16OnTheCpuRunsOrIsAOneLineError) {
  TempDir d;
  const CliRun r = hearth_run("generate --model " + shell_quote(golden_model("llama_mha").string()) +
                               " --prompt hi --device cpu --dtype float16 --max-tokens 2",
                           d);
  if (r.rc == 0) return;  // this libtorch has CPU half matmuls (PyTorch 2.x)
  expect_one_line_error(r, "--dtype float16: this libtorch has no float16 matrix multiply on the CPU");
  EXPECT_EQ(r.err.find("addmm"), std::string::npos) << r.err;
}

TEST(InputChecksCli, TrainAdapterPathOnARegularFileIsOneLine) {
  TempDir d;
  const fs::path file = d / "adapter.txt";
  hearth::io::write_file_atomic(file, "keep me");
  const CliRun r = hearth_run("train --model " + shell_quote(golden_model("llama_mha").string()) + " --data " +
                               shell_quote((d / "data").string()) + " --adapter-path " + shell_quote(file.string()) +
                               " --iters 1 --device cpu",
                           d);
  expect_one_line_error(r, "--adapter-path " + file.string() + ": exists and is not a folder");
  EXPECT_EQ(hearth::io::read_file(file), "keep me");
  // A path under that file: refused before the model loads (a filesystem error after it, rc 2).
  const fs::path under = file / "sub";
  expect_one_line_error(hearth_run("train --model " + shell_quote(golden_model("llama_mha").string()) + " --data " +
                                       shell_quote((d / "data").string()) + " --adapter-path " + shell_quote(under.string()) +
                                       " --iters 1 --device cpu",
                                   d),
                        "--adapter-path " + under.string() + ": " + file.string() + " is not a folder");
  // info on a file says so (it said "model folder not found").
  expect_one_line_error(hearth_run("info --model " + shell_quote(file.string()), d), file.string() + ": not a folder");
  EXPECT_EQ(hearth::io::read_file(file), "keep me");
}

TEST(InputChecksCli, GenerateSystemWithoutAChatTemplateIsAnError) {
  TempDir d;
  const std::string model = " --model " + shell_quote(golden_model("llama_mha").string()) + " --device cpu --max-tokens 2";
  const CliRun r = hearth_run("generate" + model + " --prompt hi --system 'be brief'", d);
  expect_one_line_error(r, "--system: model 'llama_mha' has no chat template");
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(hearth_run("generate" + model + " --prompt hi", d).rc, 0);
  // With a template, --ignore-chat-template drops the system message: also refused.
  const fs::path t = d / "t";
  fs::copy(golden_model("llama_mha"), t, fs::copy_options::recursive);
  hearth::io::write_file_atomic(t / "chat_template.jinja", "{% for m in messages %}{{ m.content }}\n{% endfor %}");
  const std::string tmodel = " --model " + shell_quote(t.string()) + " --device cpu --max-tokens 2 --prompt hi --system sys";
  EXPECT_EQ(hearth_run("generate" + tmodel, d).rc, 0) << hearth_run("generate" + tmodel, d).err;
  expect_one_line_error(hearth_run("generate" + tmodel + " --ignore-chat-template", d),
                        "--system: --ignore-chat-template sends the raw prompt");
}

// --prompt - reads stdin: an empty one, or a closed one, is an error (it generated from BOS, rc 0).
TEST(InputChecksCli, GeneratePromptFromAnEmptyOrClosedStdinIsAnError) {
  TempDir d;
  const std::string gen = "generate --model " + shell_quote(golden_model("llama_mha").string()) + " --device cpu --max-tokens 2 --prompt -";
  expect_one_line_error(hearth_run(gen, d), "--prompt -: stdin held no text");  // stdin is /dev/null
  const fs::path err = d / "closed_stderr.txt";
  const int status = std::system((std::string(HEARTH_BINARY) + " " + gen + " <&- 2>" + shell_quote(err.string()) + " >/dev/null").c_str());
  EXPECT_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 1);
  EXPECT_NE(hearth::io::read_file(err).find("--prompt -: cannot read the prompt from stdin (Bad file descriptor)"), std::string::npos)
      << hearth::io::read_file(err);
  const std::string piped = std::string("printf hello | ") + HEARTH_BINARY + " " + gen + " 2>/dev/null";
  FILE* p = ::popen(piped.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[256];
  while (std::fread(buf, 1, sizeof buf, p) > 0) {
  }
  const int piped_status = ::pclose(p);
  EXPECT_EQ(WIFEXITED(piped_status) ? WEXITSTATUS(piped_status) : -1, 0);
  // --max-tokens states its range (CLI11's PositiveNumber printed DBL_MAX's 310 digits and said 0 was in it).
  const CliRun bad = hearth_run("generate --model " + shell_quote(golden_model("llama_mha").string()) + " --max-tokens 0 --prompt hi", d);
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.err.find("--max-tokens: Value 0 not in range 1 to 2147483647"), std::string::npos) << bad.err;
}

TEST(InputChecksCli, BenchBeyondTheContextIsOneLine) {
  TempDir d;
  const std::string model = "bench --model " + shell_quote(golden_model("llama_mha").string()) + " --device cpu --runs 1";
  expect_one_line_error(hearth_run(model + " --prompt-tokens 300 --gen-tokens 1", d),
                        "bench: --prompt-tokens 300 + --gen-tokens 1 = 301 tokens exceed the model's context length 256");
  expect_one_line_error(hearth_run(model + " --prompt-tokens 200 --gen-tokens 100", d), "context length 256");
  const CliRun ok = hearth_run(model + " --prompt-tokens 8 --gen-tokens 2", d);
  EXPECT_EQ(ok.rc, 0) << ok.err;
  EXPECT_NE(ok.out.find("prompt 8 tokens (prefill chunks of 2048), generate 2 tokens"), std::string::npos) << ok.out;
  // A prompt in chunks of 3 tokens (three forwards) is still measured; a step of 0 is refused.
  const CliRun chunked = hearth_run(model + " --prompt-tokens 8 --gen-tokens 2 --prefill-step-size 3", d);
  EXPECT_EQ(chunked.rc, 0) << chunked.err;
  EXPECT_NE(chunked.out.find("prompt 8 tokens (prefill chunks of 3)"), std::string::npos) << chunked.out;
  const CliRun zero = hearth_run(model + " --prompt-tokens 8 --prefill-step-size 0", d);
  EXPECT_NE(zero.rc, 0);
  EXPECT_NE(zero.err.find("--prefill-step-size: Value 0 not in range 1"), std::string::npos) << zero.err;
}

// --op-trace: a folder that is missing, a folder for the file, --batch are refused before the
// model loads; a good path gets a Chrome trace of the prefill's ATen ops, written whole.
TEST(InputChecksCli, BenchOpTraceRefusesBadPathsAndWritesATrace) {
  TempDir d;
  const std::string model = "bench --model " + shell_quote(golden_model("llama_mha").string()) +
                            " --device cpu --runs 1 --prompt-tokens 8 --gen-tokens 2";
  const std::string missing = (d.path() / "no" / "t.json").string();
  expect_one_line_error(hearth_run(model + " --op-trace " + shell_quote(missing), d), "does not exist");
  expect_one_line_error(hearth_run(model + " --op-trace " + shell_quote(d.path().string()), d),
                        "is a folder; give a file path");
  expect_one_line_error(hearth_run(model + " --batch 2 --op-trace " + shell_quote((d.path() / "b.json").string()), d),
                        "does not combine with --batch");
  const auto trace = d.path() / "t.json";
  const CliRun ok = hearth_run(model + " --op-trace " + shell_quote(trace.string()), d);
  ASSERT_EQ(ok.rc, 0) << ok.err;
  const nlohmann::json j = hearth::io::read_json(trace);
  const nlohmann::json& events = j.is_object() ? j["traceEvents"] : j;
  ASSERT_TRUE(events.is_array());
  int64_t silu = 0, embedding = 0;
  for (const auto& e : events) {
    const std::string name = e.value("name", "");
    silu += name == "aten::silu";  // SwiGLU's, in each of the 2 layers on the CPU
    embedding += name == "aten::embedding";
  }
  EXPECT_EQ(embedding, 1);
  EXPECT_GE(silu, 2);
}

// bench --batch with one or two generated tokens: every token comes from the prefill phase, so the
// decode line says there is nothing to time (it printed "0.0 tok/s" before); three tokens time it.
TEST(InputChecksCli, BenchBatchSaysWhenNothingIsLeftToTimeAsDecode) {
  TempDir d;
  const std::string model = "bench --model " + shell_quote(golden_model("llama_mha").string()) +
                            " --device cpu --runs 1 --prompt-tokens 8 --batch 2 --gen-tokens ";
  for (const char* n : {"1", "2"}) {
    const CliRun r = hearth_run(model + n, d);
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_NE(r.out.find(std::string("decode: none (with --gen-tokens ") + n), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("tok/s"), std::string::npos) << r.out;
  }
  const CliRun r3 = hearth_run(model + "3", d);
  ASSERT_EQ(r3.rc, 0) << r3.err;
  EXPECT_NE(r3.out.find("decode (aggregate over the batch"), std::string::npos) << r3.out;
  EXPECT_EQ(r3.out.find(" 0.0 tok/s"), std::string::npos) << r3.out;
}

TEST(InputChecksCli, BenchRunsWithAnAdapterAndRefusesBadOnes) {
  TempDir d;
  const std::string bench = "bench --model " + shell_quote(golden_model("llama_mha").string()) +
                            " --device cpu --runs 1 --prompt-tokens 8 --gen-tokens 4";
  const CliRun r = hearth_run(bench + " --lora-rank 4", d);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("adapter: random LoRA of rank 4, active on every step"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("decode: "), std::string::npos) << r.out;
  const CliRun batched = hearth_run(bench + " --lora-rank 4 --batch 2", d);
  ASSERT_EQ(batched.rc, 0) << batched.err;
  EXPECT_NE(batched.out.find("adapter: random LoRA of rank 4, active on every step"), std::string::npos) << batched.out;
  const CliRun zero = hearth_run(bench + " --lora-rank 0", d);
  EXPECT_NE(zero.rc, 0);
  EXPECT_NE(zero.err.find("--lora-rank"), std::string::npos) << zero.err;
  EXPECT_NE(zero.err.find("not in range 1 to 1024"), std::string::npos) << zero.err;
  // Not a number: said so, not reported as out of range.
  const CliRun word = hearth_run(bench + " --lora-rank abc", d);
  EXPECT_NE(word.rc, 0);
  EXPECT_NE(word.err.find("--lora-rank: Failed parsing abc"), std::string::npos) << word.err;
  const CliRun both = hearth_run(bench + " --lora-rank 4 --adapter-path x", d);
  EXPECT_NE(both.rc, 0);
  EXPECT_NE(both.err.find("excludes"), std::string::npos) << both.err;
  const CliRun empty_path = hearth_run(bench + " --adapter-path ''", d);
  EXPECT_NE(empty_path.rc, 0);
  EXPECT_NE(empty_path.err.find("--adapter-path"), std::string::npos) << empty_path.err;
  const CliRun missing = hearth_run(bench + " --adapter-path " + shell_quote((d / "no-adapter").string()), d);
  EXPECT_NE(missing.rc, 0);
  EXPECT_NE(missing.err.find("no-adapter"), std::string::npos) << missing.err;
}

// --seed takes any int64 (a negative one as its bits, like the server's `seed`); past int64 it is
// refused (it wrapped silently), on every verb that has one.
TEST(InputChecksCli, SeedPastInt64IsRefusedOnEveryVerb) {
  TempDir d;
  const std::string model = " --model " + shell_quote(golden_model("llama_mha").string()) + " --device cpu";
  const std::string big = " --seed 18446744073709551616";
  for (const std::string verb : {"generate --prompt hi --max-tokens 2", "chat --max-tokens 2"}) {
    const CliRun r = hearth_run(verb + model + big, d);
    EXPECT_NE(r.rc, 0) << verb;
    EXPECT_NE(r.err.find("--seed"), std::string::npos) << verb << ": " << r.err;
  }
  fs::create_directories(d / "data");
  hearth::io::write_file_atomic(d / "data" / "train.jsonl", "{\"text\": \"hello\"}\n");
  const CliRun train = hearth_run("train" + model + " --data " + shell_quote((d / "data").string()) +
                                      " --adapter-path " + shell_quote((d / "ad").string()) + big, d);
  EXPECT_NE(train.err.find("--seed"), std::string::npos) << train.err;
  const fs::path src = golden_model("llama_mha");
  const CliRun init = hearth_run("init-model --config " + shell_quote((src / "config.json").string()) + " --tokenizer " +
                                     shell_quote(src.string()) + " --out " + shell_quote((d / "m").string()) + big, d);
  EXPECT_NE(init.err.find("--seed"), std::string::npos) << init.err;
  EXPECT_FALSE(fs::exists(d / "ad"));
  EXPECT_FALSE(fs::exists(d / "m"));
  EXPECT_EQ(hearth_run("generate --prompt hi --max-tokens 2 --temp 1" + model + " --seed -1", d).rc, 0);
}

// Every integer option reads decimal with its overflow checked: CLI11 2.1 clamped a number past 64
// bits to the limit and read a leading zero as octal ("--max-tokens 010" generated 8 tokens).
TEST(InputChecksCli, IntegerOptionsAreDecimalAndNeverClamped) {
  TempDir d;
  const std::string gen = "generate --model " + shell_quote(golden_model("llama_mha").string()) +
                          " --device cpu --prompt hi --temp 0 --max-tokens ";
  const CliRun ten = hearth_run(gen + "010", d);
  ASSERT_EQ(ten.rc, 0) << ten.err;
  EXPECT_NE((ten.out + ten.err).find("Generation: 10 tokens"), std::string::npos) << ten.out << ten.err;
  const CliRun huge = hearth_run("train --model m --data d --adapter-path a --iters 99999999999999999999", d);
  EXPECT_NE(huge.rc, 0);
  EXPECT_NE(huge.err.find("--iters: Value 99999999999999999999 not in range of a 64-bit integer"), std::string::npos)
      << huge.err;
  // Not a base-10 integer: refused by every option alike (CLI11 read "0x10" as 16 where no range
  // check stood, while number_in refused it).
  const CliRun hex = hearth_run(gen + "0x10", d);
  EXPECT_NE(hex.rc, 0);
  EXPECT_NE(hex.err.find("--max-tokens: Failed parsing 0x10 as a INT"), std::string::npos) << hex.err;
}

// A stdout that cannot be written (a full disk) is an error that stops the generation: it exited 0
// with the text lost.
TEST(InputChecksCli, GenerateToAFullStdoutFails) {
  TempDir d;
  const CliRun r = hearth_run("generate --model " + shell_quote(golden_model("llama_mha").string()) +
                                  " --device cpu --prompt hi --temp 0 --max-tokens 20 >/dev/full",
                              d);
  expect_one_line_error(r, "stdout: writing the generated text failed (No space left on device); generation stopped");
}

}  // namespace
