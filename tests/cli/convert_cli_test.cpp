// `hearth convert` guards from the convert attack, through the built binary: tensors are checked
// against config.json before converting (the loader's checks; every golden model still converts),
// a scales tensor of the wrong rank is reported with its real shape, an empty or dangling-symlink
// --out and --q-bits/--q-group-size without -q are refused before any work, trailing slashes name
// the folder, and SIGINT (or a kill) leaves no OUT.tmp.PID behind. Then `hearth fuse`'s output
// folder by the same rules (cli/output_folder.h), and never (inside) the model or adapter folder.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <thread>

#include "cli_run_util.h"
#include "io/atomic_dir.h"
#include "io/atomic_file.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "io/weights.h"

namespace {

namespace fs = std::filesystem;
using hearth::testing::shell_quote;
using hearth::testing::TempDir;

fs::path conv_golden(const std::string& name) { return fs::path(HEARTH_SOURCE_DIR) / "tests/golden/models" / name; }

hearth::testing::CliRunResult conv_run(const std::string& args, const TempDir& d) {
  return hearth::testing::run_hearth_cli("convert " + args, d);
}

std::string conv_q(const fs::path& p) { return shell_quote(p.string()); }

// A copy of model folder `src` at `dst` with `edit` applied to its tensors (by name) and config.
void conv_copy_model(const fs::path& src, const fs::path& dst,
                     const std::function<void(std::map<std::string, at::Tensor>&, nlohmann::json&)>& edit) {
  fs::create_directories(dst);
  for (const auto& e : fs::directory_iterator(src))
    if (e.path().extension() != ".safetensors" && e.path().filename() != "config.json")
      fs::copy_file(e.path(), dst / e.path().filename());
  const hearth::io::WeightStore ws = hearth::io::WeightStore::open(src);
  std::map<std::string, at::Tensor> t;
  std::map<std::string, hearth::io::DType> stored;
  for (const auto& n : ws.names()) {
    t[n] = ws.get(n).clone();
    if (ws.info(n).dtype == hearth::io::DType::U32) stored[n] = hearth::io::DType::U32;
  }
  nlohmann::json cfg = hearth::io::read_json(src / "config.json");
  edit(t, cfg);
  hearth::io::save_safetensors(dst / "model.safetensors", t, {{"format", "pt"}}, stored);
  hearth::io::write_file_atomic(dst / "config.json", cfg.dump(2));
}

// Names directly in `dir`, sorted.
std::vector<std::string> conv_entries(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Runs `hearth <args>` (which writes d/out), sends SIGINT once its d/out.tmp.PID exists, and
// checks that it exits 130 saying it removed that folder, leaving neither it nor d/out.
void conv_expect_sigint_cleans_up(const std::string& verb, const std::string& args, const TempDir& d) {
  const std::string log = (d / "log.txt").string();
  const pid_t pid = hearth::testing::start_process(std::string(HEARTH_BINARY) + " " + verb + " " + args, log);
  ASSERT_GT(pid, 0);
  const fs::path tmp = d / ("out.tmp." + std::to_string(pid));
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fs::exists(tmp) && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(fs::exists(tmp)) << hearth::testing::read_text(log);
  ::kill(pid, SIGINT);
  const int status = hearth::testing::wait_process(pid, 60);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 130) << hearth::testing::read_text(log);
  EXPECT_NE(hearth::testing::read_text(log).find("hearth: " + verb + " interrupted (SIGINT): removed the partial " +
                                                  tmp.string() + "; nothing was written to " + (d / "out").string()),
            std::string::npos)
      << hearth::testing::read_text(log);
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_FALSE(fs::exists(d / "out"));
}

// A run killed outright leaves its folder: the next run writing d/small (`run`) removes it, only
// that name, only with write_dir_atomic's marker (not a person's dated "small.tmp.20240101"
// backup, which was removed) and only for processes that no longer run, and says so.
void conv_expect_stale_temp_removed(const std::string& verb,
                                    const std::function<hearth::testing::CliRunResult(const fs::path&)>& run,
                                    const TempDir& d) {
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  const fs::path stale = d / ("small.tmp." + std::to_string(dead));
  const fs::path live = d / ("small.tmp." + std::to_string(::getpid()));
  const fs::path other = d / ("other.tmp." + std::to_string(dead));
  const fs::path backup = d / "small.tmp.20240101";
  for (const fs::path& p : {stale, live, other, backup}) {
    fs::create_directories(p);
    hearth::io::write_file_atomic(p / "model.safetensors", "x");
    if (p != backup) hearth::io::write_file_atomic(p / hearth::io::kPartialMarker, "");
  }
  const auto r = run(d / "small");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("removed " + stale.string() + ", the partial output of a " + verb + " that was killed"),
            std::string::npos)
      << r.out;
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(other));
  EXPECT_TRUE(fs::exists(backup / "model.safetensors"));
  EXPECT_TRUE(fs::exists(d / "small" / "model.safetensors"));
  EXPECT_FALSE(fs::exists(d / "small" / hearth::io::kPartialMarker));
}

}  // namespace

TEST(ConvertCli, TensorsAreCheckedAgainstConfigBeforeConverting) {
  TempDir d;
  const std::string q = "model.layers.1.self_attn.q_proj.weight";
  conv_copy_model(conv_golden("llama_mha"), d / "m", [&](auto& t, auto&) { t[q] = at::randn({64, 32}); });
  auto r = conv_run("--model " + conv_q(d / "m") + " -o " + conv_q(d / "out"), d);
  hearth::testing::expect_one_line_cli_error(r, (d / "m" / "model.safetensors").string() + ": tensor " + q +
                                                    " has shape [64, 32], expected [64, 64]");
  EXPECT_NE(r.err.find("the converted model would not load"), std::string::npos) << r.err;
  // A config that disagrees with the tensors: vocab_size (the embedding) and num_hidden_layers.
  conv_copy_model(conv_golden("llama_mha"), d / "v", [&](auto&, auto& c) { c["vocab_size"] = 500; });
  hearth::testing::expect_one_line_cli_error(conv_run("--model " + conv_q(d / "v") + " -o " + conv_q(d / "out"), d),
                                             "tensor model.embed_tokens.weight has shape [512, 64], expected [500, 64]");
  conv_copy_model(conv_golden("llama_mha"), d / "l", [&](auto&, auto& c) { c["num_hidden_layers"] = 3; });
  hearth::testing::expect_one_line_cli_error(conv_run("--model " + conv_q(d / "l") + " -o " + conv_q(d / "out"), d),
                                             "num_hidden_layers = 3, but the weights have no layer 2");
  // A quantized model's scales, checked as the loader reads them (-d and a plain cast alike).
  const std::string sc = "model.layers.1.mlp.down_proj.scales";
  conv_copy_model(conv_golden("mlx_q4"), d / "qs", [&](auto& t, auto&) { t[sc] = t[sc].narrow(1, 0, 1).contiguous(); });
  for (const std::string flags : {"-d", "--dtype bf16"})
    hearth::testing::expect_one_line_cli_error(
        conv_run(flags + " --model " + conv_q(d / "qs") + " -o " + conv_q(d / "out"), d),
        "tensor " + sc + " has shape [64, 1], expected [64, 2]");
  EXPECT_EQ(conv_entries(d.path()), (std::vector<std::string>{"cli_stderr.txt", "l", "m", "qs", "v"}));
  // A model_type Hearth does not load passes through unchecked, as before.
  conv_copy_model(conv_golden("llama_mha"), d / "other", [&](auto& t, auto& c) {
    t[q] = at::randn({64, 32});
    c["model_type"] = "not_a_hearth_family";
  });
  r = conv_run("--model " + conv_q(d / "other") + " -o " + conv_q(d / "out"), d);
  EXPECT_EQ(r.rc, 0) << r.err;
}

TEST(ConvertCli, EveryGoldenModelPassesTheCheckAndConverts) {
  TempDir d;
  int n = 0;
  for (const auto& e : fs::directory_iterator(conv_golden(""))) {
    if (!fs::exists(e.path() / "config.json")) continue;
    const fs::path out = d / e.path().filename();
    const auto r = conv_run("--model " + conv_q(e.path()) + " -o " + conv_q(out), d);
    EXPECT_EQ(r.rc, 0) << e.path() << ": " << r.err;
    EXPECT_TRUE(fs::exists(out / "config.json")) << e.path();
    ++n;
  }
  EXPECT_GE(n, 10);
}

TEST(ConvertCli, ScalesOfTheWrongRankAreReportedWithTheirShape) {
  TempDir d;
  const std::string sc = "model.layers.1.mlp.down_proj.scales";
  // model_type unknown to Hearth: the loader's check does not run, convert -d's own does.
  const std::vector<std::pair<std::vector<int64_t>, std::string>> cases = {{{128}, "[128]"}, {{64, 2, 1}, "[64, 2, 1]"}};
  for (const auto& [shape, text] : cases) {
    hearth::io::remove_tree(d / "qs");
    conv_copy_model(conv_golden("mlx_q4"), d / "qs", [&](auto& t, auto& c) {
      t[sc] = t[sc].reshape(shape);
      c["model_type"] = "not_a_hearth_family";
    });
    hearth::testing::expect_one_line_cli_error(conv_run("-d --model " + conv_q(d / "qs") + " -o " + conv_q(d / "out"), d),
                                               sc + " has shape " + text + ", expected [64, 2] for 4-bit codes of "
                                                   "group 64 with shape [64, 16]");
  }
}

TEST(ConvertCli, BadOutAndFlagCombinationsAreRefusedBeforeAnyWork) {
  TempDir d;
  const std::string m = conv_q(conv_golden("llama_mha"));
  hearth::testing::expect_one_line_cli_error(conv_run("--model " + m + " -o ''", d),
                                             "convert: --out is empty (name the new folder to write)");
  fs::create_symlink(d / "missing", d / "link");
  hearth::testing::expect_one_line_cli_error(conv_run("--model " + m + " -o " + conv_q(d / "link"), d),
                                             (d / "link").string() + ": is a symlink to " + (d / "missing").string() +
                                                 ", which does not exist");
  EXPECT_TRUE(fs::is_symlink(d / "link"));
  EXPECT_FALSE(fs::exists(d / "missing"));
  // --q-bits / --q-group-size do nothing without -q: -d reads its specs from config.json.
  const std::string q4 = conv_q(conv_golden("mlx_q4"));
  hearth::testing::expect_one_line_cli_error(
      conv_run("-d --q-bits 8 --model " + q4 + " -o " + conv_q(d / "x"), d),
      "convert: --q-bits applies to -q/--quantize; -d/--dequantize reads each module's bits and group size from "
      "config.json's quantization block");
  hearth::testing::expect_one_line_cli_error(conv_run("-d --q-group-size 32 --model " + q4 + " -o " + conv_q(d / "x"), d),
                                             "convert: --q-group-size applies to -q/--quantize; -d/--dequantize");
  hearth::testing::expect_one_line_cli_error(conv_run("--q-bits 8 --model " + m + " -o " + conv_q(d / "x"), d),
                                             "convert: --q-bits applies to -q/--quantize (pass -q to quantize)");
  EXPECT_EQ(conv_entries(d.path()), (std::vector<std::string>{"cli_stderr.txt", "link"}));
  // A folder inside the model is never the output (fuse and train refuse it too).
  fs::copy(conv_golden("llama_mha"), d / "m");
  const std::vector<std::string> model_files = conv_entries(d / "m");
  hearth::testing::expect_one_line_cli_error(conv_run("--model " + conv_q(d / "m") + " -o " + conv_q(d / "m" / "sub"), d),
                                             "convert: --out " + (d / "m" / "sub").string() +
                                                 " is (or lies inside) the --model folder " + (d / "m").string());
  EXPECT_EQ(conv_entries(d / "m"), model_files);
  hearth::io::remove_tree(d / "m");
  // With -q they are the spec, as before; mlx_lm.convert's names are taken too (of its
  // --q-mode values, affine: MX/NV float formats are not MLX-affine weights).
  const auto r = conv_run("-q --q-bits 8 --q-group-size 32 --q-mode affine --hf-path " + m + " --mlx-path " +
                              conv_q(d / "q8"), d);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(hearth::io::read_json(d / "q8" / "config.json")["quantization"]["bits"], 8);
  const auto mx = conv_run("-q --q-mode mxfp4 --model " + m + " -o " + conv_q(d / "mx"), d);
  EXPECT_NE(mx.rc, 0);
  EXPECT_NE(mx.err.find("--q-mode: mxfp4 not in {affine}"), std::string::npos) << mx.err;
  hearth::testing::expect_one_line_cli_error(conv_run("--q-mode affine --model " + m + " -o " + conv_q(d / "x"), d),
                                             "convert: --q-mode applies to -q/--quantize (pass -q to quantize)");
  EXPECT_FALSE(fs::exists(d / "mx"));
}

TEST(ConvertCli, TrailingSlashesNameTheFolders) {
  TempDir d;
  fs::copy(conv_golden("llama_mha"), d / "m");
  const auto r = conv_run("--model " + conv_q((d / "m").string() + "/") + " -o " + conv_q((d / "out").string() + "//"), d);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(fs::is_directory(d / "out"));
  EXPECT_TRUE(fs::exists(d / "out" / "model.safetensors"));
  EXPECT_EQ(conv_entries(d.path()), (std::vector<std::string>{"cli_stderr.txt", "m", "out"}));
  // An existing folder with a slash is still "already exists", named without it.
  hearth::testing::expect_one_line_cli_error(
      conv_run("--model " + conv_q(d / "m") + " -o " + conv_q((d / "out").string() + "/"), d),
      (d / "out").string() + ": already exists");
}

// SIGINT in the middle of a convert (a model of a few hundred MB being quantized) removes the
// partial OUT.tmp.PID and exits 130; a temp folder a killed convert left is removed by the next.
TEST(ConvertCli, SigintRemovesThePartialOutput) {
  TempDir d;
  fs::create_directories(d / "big");
  {
    std::map<std::string, at::Tensor> t;
    for (int i = 0; i < 24; ++i) t["layer" + std::to_string(i) + ".weight"] = at::rand({2048, 2048});
    hearth::io::save_safetensors(d / "big" / "model.safetensors", t, {{"format", "pt"}});
    hearth::io::write_file_atomic(d / "big" / "config.json", R"({"model_type": "not_a_hearth_family"})");
  }
  conv_expect_sigint_cleans_up("convert", "-q --model " + conv_q(d / "big") + " -o " + conv_q(d / "out"), d);
  conv_expect_stale_temp_removed(
      "convert", [&](const fs::path& out) { return conv_run("--model " + conv_q(conv_golden("llama_mha")) + " -o " + conv_q(out), d); },
      d);
}

// `hearth fuse` writes its output folder by convert's rules (cli/output_folder.h).
namespace {

hearth::testing::CliRunResult fuse_run(const std::string& args, const TempDir& d) {
  return hearth::testing::run_hearth_cli("fuse " + args, d);
}

fs::path fuse_lora() { return fs::path(HEARTH_SOURCE_DIR) / "tests/golden/lora/llama_mha"; }

}  // namespace

TEST(FuseOutputCli, BadOutIsRefusedBeforeAnyWork) {
  TempDir d;
  fs::copy(conv_golden("llama_mha"), d / "m");
  const std::string m = conv_q(d / "m"), lora = " --adapter-path " + conv_q(fuse_lora());
  const std::vector<std::string> model_files = conv_entries(d / "m");
  hearth::testing::expect_one_line_cli_error(fuse_run("--model " + m + lora + " -o ''", d),
                                             "fuse: --out is empty (name the new folder to write)");
  hearth::testing::expect_one_line_cli_error(fuse_run("--model ''" + lora + " -o " + conv_q(d / "x"), d),
                                             "fuse: --model is empty (name the model folder to read)");
  hearth::testing::expect_one_line_cli_error(fuse_run("--model " + m + " --adapter-path '' -o " + conv_q(d / "x"), d),
                                             "fuse: --adapter-path is empty");
  hearth::testing::expect_one_line_cli_error(fuse_run("--model " + conv_q(d / "none") + lora + " -o " + conv_q(d / "x"), d),
                                             (d / "none").string() + ": model folder not found");
  fs::create_symlink(d / "missing", d / "link");
  hearth::testing::expect_one_line_cli_error(fuse_run("--model " + m + lora + " -o " + conv_q(d / "link"), d),
                                             (d / "link").string() + ": is a symlink to " + (d / "missing").string() +
                                                 ", which does not exist (fuse writes a new folder");
  EXPECT_TRUE(fs::is_symlink(d / "link"));
  // The model folder itself, or a folder inside it (named any way), is never the output.
  for (const std::string& out : {(d / "m").string() + "/", (d / "m" / "fused").string(), (d / "m" / "." / "a" / "b").string()})
    hearth::testing::expect_one_line_cli_error(fuse_run("--model " + m + "/" + lora + " -o " + conv_q(out), d),
                                               "is (or lies inside) the --model folder " + (d / "m").string() +
                                                   ": the fused model would be written among the base model's files");
  fs::copy(fuse_lora(), d / "lora");
  hearth::testing::expect_one_line_cli_error(
      fuse_run("--model " + m + " --adapter-path " + conv_q(d / "lora") + " -o " + conv_q(d / "lora" / "fused"), d),
      "fuse: --out " + (d / "lora" / "fused").string() + " is (or lies inside) the --adapter-path folder");
  fs::create_directories(d / "empty");
  hearth::testing::expect_one_line_cli_error(fuse_run("--model " + m + lora + " -o " + conv_q((d / "empty").string() + "/"), d),
                                             (d / "empty").string() + ": already exists (fuse writes a new folder)");
  hearth::testing::expect_one_line_cli_error(fuse_run("--model " + m + lora + " -o " + conv_q(d / "no" / "such" / "out"), d),
                                             (d / "no" / "such").string() + ": output's parent folder not found");
  EXPECT_EQ(conv_entries(d.path()), (std::vector<std::string>{"cli_stderr.txt", "empty", "link", "lora", "m"}));
  EXPECT_EQ(conv_entries(d / "m"), model_files);
  EXPECT_EQ(conv_entries(d / "lora"), conv_entries(fuse_lora()));
  EXPECT_TRUE(fs::is_empty(d / "empty"));
}

TEST(FuseOutputCli, TrailingSlashesNameTheFolders) {
  TempDir d;
  fs::copy(conv_golden("llama_mha"), d / "m");
  const auto r = fuse_run("--model " + conv_q((d / "m").string() + "/") + " --adapter-path " +
                              conv_q(fuse_lora().string() + "/") + " -o " + conv_q((d / "out").string() + "//"),
                          d);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("into " + (d / "out").string() + "\n"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(d / "out" / "model.safetensors"));
  EXPECT_EQ(conv_entries(d.path()), (std::vector<std::string>{"cli_stderr.txt", "m", "out"}));
}

// SIGINT in the middle of a fuse (a base of a few hundred MB) removes the partial OUT.tmp.PID and
// exits 130; a temp folder a killed run left is removed by the next fuse to that OUT.
TEST(FuseOutputCli, SigintRemovesThePartialOutput) {
  TempDir d;
  conv_copy_model(conv_golden("llama_mha"), d / "big", [](std::map<std::string, at::Tensor>& t, nlohmann::json&) {
    for (int i = 0; i < 24; ++i) t["extra" + std::to_string(i) + ".weight"] = at::rand({2048, 2048});
  });
  const std::string lora = " --adapter-path " + conv_q(fuse_lora());
  conv_expect_sigint_cleans_up("fuse", "--model " + conv_q(d / "big") + lora + " -o " + conv_q(d / "out"), d);
  conv_expect_stale_temp_removed(
      "fuse", [&](const fs::path& out) { return fuse_run("--model " + conv_q(conv_golden("llama_mha")) + lora + " -o " + conv_q(out), d); },
      d);
}
