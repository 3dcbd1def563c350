// `hearth train`'s output folder, through the built binary (the second train attack): --overwrite
// with --resume of the same folder is refused whatever step the checkpoint is at (it had been
// "nothing to train", exit 0); a folder holding only another run's metrics.jsonl,
// adapter_config.json or optimizer file is not replaced without --overwrite; an --adapter-path that
// is or lies inside the --model folder (symlinks, trailing slashes resolved) is refused; a resume
// with other LoRA settings than its checkpoint is refused naming both values. All before the model
// loads (most of these runs name a model folder that does not exist).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>

#include "cli_run_util.h"
#include "io/atomic_file.h"
#include "io/hf_config.h"

namespace {

namespace fs = std::filesystem;
using hearth::testing::shell_quote;
using hearth::testing::TempDir;

std::string tout_q(const fs::path& p) { return shell_quote(p.string()); }

fs::path tout_golden() { return fs::path(HEARTH_SOURCE_DIR) / "tests/golden/models/llama_mha"; }

fs::path tout_data(const TempDir& d) {
  const fs::path dir = d / "data";
  fs::create_directories(dir);
  std::string rows;
  for (int i = 0; i < 4; ++i) rows += R"({"text": "The cat sat on the mat. The dog ran far away."})" "\n";
  hearth::io::write_file_atomic(dir / "train.jsonl", rows);
  return dir;
}

std::string tout_train(const fs::path& data, const fs::path& out, const fs::path& model = tout_golden()) {
  return "train --model " + tout_q(model) + " --data " + tout_q(data) + " --adapter-path " + tout_q(out) +
         " --batch-size 2 --max-seq-length 64 --learning-rate 1e-2 --device cpu ";
}

hearth::testing::CliRunResult tout_run(const std::string& args, const TempDir& d) {
  return hearth::testing::run_hearth_cli(args, d);
}

std::vector<std::string> tout_entries(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST(TrainOutputCli, OverwriteWithResumeOfTheSameFolderIsRefusedWhateverTheStep) {
  TempDir d;
  const fs::path data = tout_data(d), out = d / "out";
  const auto first = tout_run(tout_train(data, out) + "--iters 2", d);
  ASSERT_EQ(first.rc, 0) << first.out << first.err;
  const std::string adapter = hearth::io::read_file(out / "adapters.safetensors");
  const std::string want = "train: --overwrite and --resume " + out.string() + " name the same folder";
  // At --iters (had been "nothing to train", exit 0) and past it (had been the past-iters error).
  for (const char* iters : {"2", "1", "3"})
    hearth::testing::expect_one_line_cli_error(
        tout_run(tout_train(data, out, d / "no_model") + "--iters " + iters + " --resume " + tout_q(out) + " --overwrite", d),
        want);
  // --resume alone (the adapter path defaulting to it) is the same folder.
  hearth::testing::expect_one_line_cli_error(
      tout_run("train --model " + tout_q(d / "no_model") + " --data " + tout_q(data) + " --resume " + tout_q(out) +
                   " --iters 2 --batch-size 2 --overwrite",
               d),
      want);
  EXPECT_TRUE(hearth::io::read_file(out / "adapters.safetensors") == adapter);
  EXPECT_EQ(hearth::io::read_json(out / "checkpoint.json")["step"], 2);
  // Into another folder, --overwrite is about that folder: nothing left to train is still exit 0.
  const auto other = tout_run(tout_train(data, d / "other", d / "no_model") + "--iters 2 --resume " + tout_q(out) +
                                  " --overwrite",
                              d);
  EXPECT_EQ(other.rc, 0) << other.err;
  EXPECT_NE(other.out.find("nothing to train"), std::string::npos) << other.out;
  EXPECT_FALSE(fs::exists(d / "other"));
}

TEST(TrainOutputCli, AnotherRunsMetricsOrConfigIsNotReplacedWithoutOverwrite) {
  TempDir d;
  const fs::path data = tout_data(d);
  for (const std::string file : {"metrics.jsonl", "adapter_config.json", "optimizer.7.safetensors"}) {
    SCOPED_TRACE(file);
    const fs::path out = d / ("out_" + file);
    fs::create_directories(out);
    const std::string old = "{\"step\": 7, \"train_loss\": 1.5}\n";
    hearth::io::write_file_atomic(out / file, old);
    hearth::testing::expect_one_line_cli_error(
        tout_run(tout_train(data, out, d / "no_model") + "--iters 1", d),
        "train: --adapter-path " + out.string() + " already holds " + file +
            " of another training run; pass a new --adapter-path, or --overwrite to replace it");
    EXPECT_EQ(hearth::io::read_file(out / file), old);
    EXPECT_EQ(tout_entries(out), std::vector<std::string>{file});
  }
  // --overwrite replaces them: metrics.jsonl then holds this run's step alone.
  const fs::path out = d / "out_metrics.jsonl";
  const auto r = tout_run(tout_train(data, out) + "--iters 1 --overwrite", d);
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  const std::string metrics = hearth::io::read_file(out / "metrics.jsonl");
  ASSERT_EQ(std::count(metrics.begin(), metrics.end(), '\n'), 1) << metrics;
  EXPECT_EQ(nlohmann::json::parse(metrics)["step"], 1);
}

TEST(TrainOutputCli, AnAdapterPathInTheModelFolderIsRefused) {
  TempDir d;
  const fs::path data = tout_data(d), m = d / "m";
  fs::copy(tout_golden(), m);
  fs::create_directory_symlink(m, d / "link");
  const std::vector<std::string> before = tout_entries(m);
  for (const std::string out : {m.string(), m.string() + "/", m.string() + "/adapters", (d / "link").string(),
                                (d / "link" / "sub").string(), (d / "data" / ".." / "m").string()}) {
    SCOPED_TRACE(out);
    hearth::testing::expect_one_line_cli_error(
        tout_run(tout_train(data, out, m) + "--iters 1", d),
        "train: --adapter-path " + out + " is (or lies inside) the --model folder " + m.string() +
            ": the adapter and checkpoint files would be written among the model's; pass another folder");
    // A full fine-tune, with --overwrite, too: nothing of the model may be replaced.
    hearth::testing::expect_one_line_cli_error(
        tout_run(tout_train(data, out, m) + "--iters 1 --fine-tune-type full --overwrite", d), "the --model folder");
  }
  EXPECT_EQ(tout_entries(m), before);
  // The model given through the link, the adapter path the real folder: the same folder.
  hearth::testing::expect_one_line_cli_error(tout_run(tout_train(data, m, d / "link") + "--iters 1", d),
                                             "is (or lies inside) the --model folder " + (d / "link").string());
  // A sibling folder whose name starts like the model's is not inside it.
  const auto r = tout_run(tout_train(data, d / "m2") + "--iters 1", d);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(fs::exists(d / "m2" / "adapters.safetensors"));
}

TEST(TrainOutputCli, ResumeWithOtherLoraKeysIsRefusedBeforeTheModelLoads) {
  TempDir d;
  const fs::path data = tout_data(d), out = d / "out";
  const auto first = tout_run(tout_train(data, out) + "--iters 1 --lora-keys self_attn.q_proj,self_attn.v_proj", d);
  ASSERT_EQ(first.rc, 0) << first.out << first.err;
  // The keys only one side has are named.
  const std::string ck = (out / "checkpoint.json").string() + ": --lora-keys ";
  for (const auto& [keys, want] : std::vector<std::pair<std::string, std::string>>{
           {"self_attn.q_proj", ck + "self_attn.q_proj differs from the checkpoint's self_attn.q_proj,self_attn.v_proj; "
                                     "only the checkpoint trains self_attn.v_proj (resume with the checkpoint's value)"},
           {"self_attn.k_proj,self_attn.v_proj",
            ck + "self_attn.k_proj,self_attn.v_proj differs from the checkpoint's self_attn.q_proj,self_attn.v_proj; only "
                 "the checkpoint trains self_attn.q_proj; only this run targets self_attn.k_proj (resume with the "
                 "checkpoint's value)"}})
    hearth::testing::expect_one_line_cli_error(
        tout_run(tout_train(data, out, d / "no_model") + "--iters 2 --resume " + tout_q(out) + " --lora-keys " + keys, d),
        want);
  hearth::testing::expect_one_line_cli_error(
      tout_run(tout_train(data, out, d / "no_model") + "--iters 2 --resume " + tout_q(out) +
                   " --lora-keys self_attn.q_proj,self_attn.v_proj --num-layers 1",
               d),
      ": --num-layers 1 differs from the checkpoint's -1");
  const auto ok = tout_run(tout_train(data, out) + "--iters 2 --resume " + tout_q(out) +
                               " --lora-keys self_attn.v_proj,self_attn.q_proj",
                           d);
  EXPECT_EQ(ok.rc, 0) << ok.err;
  EXPECT_EQ(hearth::io::read_json(out / "checkpoint.json")["step"], 2);
}
