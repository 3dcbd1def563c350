// `hearth train` / `hearth bench-train` guards from the issue 12/14 attack, through the built binary:
// a folder holding a trained adapter is not overwritten without --resume or --overwrite; a resume
// at or past --iters says so in one line; every bad numeric flag is one stderr line naming the
// flag and its range, before any model loads (these runs name a model folder that does not exist);
// bench-train's unsegmented cell under --max-backward-segments is not labelled PARTIAL.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <utility>
#include <vector>

#include "../io/io_test_util.h"
#include "cli_run_util.h"
#include "../test_util.h"
#include "io/atomic_file.h"
#include "io/hf_config.h"
#include "test_paths.h"

namespace {

namespace fs = std::filesystem;
using hearth::testing::shell_quote;
using hearth::testing::TempDir;

using GuardRun = hearth::testing::CliRunResult;

GuardRun run_guard_cli(const std::string& args, const TempDir& scratch) { return hearth::testing::run_hearth_cli(args, scratch); }

// Exit 1 and exactly one stderr line, "hearth: error: ..." containing `needle`.
void expect_guard_error(const GuardRun& r, const std::string& needle) { hearth::testing::expect_one_line_cli_error(r, needle); }

std::string guard_model() { return shell_quote((fs::path(HEARTH_SOURCE_DIR) / "tests/golden/models/llama_mha").string()); }

std::string guard_q(const fs::path& p) { return shell_quote(p.string()); }

// A data folder with four short text rows.
fs::path guard_data(const TempDir& d) {
  const fs::path dir = d / "data";
  fs::create_directories(dir);
  std::string rows;
  for (int i = 0; i < 4; ++i) rows += R"({"text": "The cat sat on the mat. The dog ran far away."})" "\n";
  hearth::io::write_file_atomic(dir / "train.jsonl", rows);
  return dir;
}

// A small LoRA run's flags on the tiny model (CPU), writing into `out`.
std::string guard_train(const fs::path& data, const fs::path& out, const std::string& model = guard_model()) {
  return "train --model " + model + " --data " + guard_q(data) + " --adapter-path " + guard_q(out) +
         " --batch-size 2 --max-seq-length 64 --learning-rate 1e-2 --device cpu ";
}

}  // namespace

TEST(TrainGuardsCli, AFolderHoldingATrainedAdapterIsNotOverwritten) {
  TempDir d;
  const fs::path data = guard_data(d), out = d / "out";
  const GuardRun first = run_guard_cli(guard_train(data, out) + "--iters 2 --seed 1", d);
  ASSERT_EQ(first.rc, 0) << first.out << first.err;
  const std::string adapter = hearth::io::read_file(out / "adapters.safetensors");
  const std::string checkpoint = hearth::io::read_file(out / "checkpoint.json");
  const std::string metrics = hearth::io::read_file(out / "metrics.jsonl");
  const std::string want = "train: --adapter-path " + out.string() +
                           " already holds a trained adapter (adapters.safetensors); pass --resume " + out.string() +
                           " to continue it, a new --adapter-path, or --overwrite to replace it";
  // The same command again (another seed): refused, before the model loads, nothing touched.
  expect_guard_error(run_guard_cli(guard_train(data, out) + "--iters 2 --seed 2", d), want);
  expect_guard_error(run_guard_cli(guard_train(data, out, guard_q(d / "no_model")) + "--iters 2", d), want);
  EXPECT_TRUE(hearth::io::read_file(out / "adapters.safetensors") == adapter) << "the adapter was overwritten";
  EXPECT_EQ(hearth::io::read_file(out / "checkpoint.json"), checkpoint);
  EXPECT_EQ(hearth::io::read_file(out / "metrics.jsonl"), metrics);
  // A PEFT adapter alone, or a checkpoint alone, counts too; an empty folder does not.
  const fs::path peft = d / "peft", ck = d / "ck", empty = d / "empty";
  for (const fs::path& p : {peft, ck, empty}) fs::create_directories(p);
  fs::copy_file(out / "adapters.safetensors", peft / "adapter_model.safetensors");
  fs::copy_file(out / "checkpoint.json", ck / "checkpoint.json");
  expect_guard_error(run_guard_cli(guard_train(data, peft, guard_q(d / "no_model")) + "--iters 2", d),
                     "(adapter_model.safetensors); pass --resume");
  expect_guard_error(run_guard_cli(guard_train(data, ck, guard_q(d / "no_model")) + "--iters 2", d),
                     "(checkpoint.json); pass --resume");
  expect_guard_error(run_guard_cli(guard_train(data, empty, guard_q(d / "no_model")) + "--iters 2", d), "no_model");
  // --overwrite and --resume of the same folder contradict each other.
  expect_guard_error(run_guard_cli(guard_train(data, out) + "--iters 3 --seed 1 --resume " + guard_q(out) + " --overwrite", d),
                     "--overwrite and --resume " + out.string() + " name the same folder");
  // --resume of that folder continues it; --overwrite starts afresh and replaces it.
  const GuardRun resumed = run_guard_cli(guard_train(data, out) + "--iters 3 --seed 1 --resume " + guard_q(out), d);
  ASSERT_EQ(resumed.rc, 0) << resumed.out << resumed.err;
  EXPECT_EQ(hearth::io::read_json(out / "checkpoint.json")["step"], 3);
  const GuardRun fresh = run_guard_cli(guard_train(data, out) + "--iters 1 --seed 2 --overwrite", d);
  ASSERT_EQ(fresh.rc, 0) << fresh.out << fresh.err;
  EXPECT_EQ(hearth::io::read_json(out / "checkpoint.json")["step"], 1);
  EXPECT_FALSE(hearth::io::read_file(out / "adapters.safetensors") == adapter) << "--overwrite did not replace it";
  // metrics.jsonl holds this run's one step alone, not the replaced run's steps 1-3
  const std::string fresh_metrics = hearth::io::read_file(out / "metrics.jsonl");
  ASSERT_EQ(std::count(fresh_metrics.begin(), fresh_metrics.end(), '\n'), 1) << fresh_metrics;
  EXPECT_EQ(nlohmann::json::parse(fresh_metrics)["step"], 1) << fresh_metrics;
  // --overwrite in the other layout: the old layout's weights go, so no loader can pick them up.
  const GuardRun peft_run = run_guard_cli(guard_train(data, out) + "--iters 1 --overwrite --adapter-format peft", d);
  ASSERT_EQ(peft_run.rc, 0) << peft_run.out << peft_run.err;
  EXPECT_TRUE(fs::exists(out / "adapter_model.safetensors"));
  EXPECT_FALSE(fs::exists(out / "adapters.safetensors"));
}

TEST(TrainGuardsCli, ResumeAtOrPastItersSaysSoInOneLine) {
  TempDir d;
  const fs::path data = guard_data(d), out = d / "out";
  const GuardRun first = run_guard_cli(guard_train(data, out) + "--iters 2", d);
  ASSERT_EQ(first.rc, 0) << first.out << first.err;
  const std::string adapter = hearth::io::read_file(out / "adapters.safetensors");
  const std::string metrics = hearth::io::read_file(out / "metrics.jsonl");
  // At --iters: nothing to train, exit 0 with one stdout line, before any model loads, nothing written.
  const GuardRun at = run_guard_cli(guard_train(data, out, guard_q(d / "no_model")) + "--iters 2 --resume " + guard_q(out), d);
  EXPECT_EQ(at.rc, 0) << at.err;
  EXPECT_EQ(at.out, "nothing to train: the checkpoint in " + out.string() +
                        " is already at step 2 = --iters (pass a larger --iters to train further); nothing was written\n");
  EXPECT_EQ(at.err, "");
  // Past --iters: an error naming both steps.
  expect_guard_error(run_guard_cli(guard_train(data, out, guard_q(d / "no_model")) + "--iters 1 --resume " + guard_q(out), d),
                     "--resume " + out.string() + ": its checkpoint is at step 2, past --iters 1 (a run cannot go back)");
  // A folder with no checkpoint to resume: one line naming checkpoint.json, before the model loads.
  fs::create_directories(d / "none");
  expect_guard_error(run_guard_cli(guard_train(data, d / "none", guard_q(d / "no_model")) + "--resume " + guard_q(d / "none"), d),
                     (d / "none" / "checkpoint.json").string());
  EXPECT_TRUE(hearth::io::read_file(out / "adapters.safetensors") == adapter) << "the adapter was rewritten";
  EXPECT_EQ(hearth::io::read_file(out / "metrics.jsonl"), metrics);
  EXPECT_EQ(hearth::io::read_json(out / "checkpoint.json")["step"], 2);
}

TEST(TrainGuardsCli, BadNumericFlagsFailBeforeTheModelLoads) {
  TempDir d;
  const fs::path data = guard_data(d);
  // The model folder does not exist: each flag's error must come first. (The flags checked before
  // the model loads already, --iters, --batch-size, --learning-rate ..., are in LongContextCli and
  // TrainConfigCheck; these were found only after it loaded, or not at all.)
  const std::string base = "train --model " + guard_q(d / "no_model") + " --data " + guard_q(data) + " --adapter-path " +
                           guard_q(d / "out") + " --device cpu ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--lora-dropout 1", "--lora-dropout must be in [0, 1), got 1"},
      {"--lora-dropout -0.1", "--lora-dropout must be in [0, 1), got -0.1"},
      {"--max-seq-length 0", "--max-seq-length must be in [2, 16777216] tokens, got 0"},
      {"--max-seq-length 99999999999", "--max-seq-length must be in [2, 16777216] tokens, got 99999999999"},
      {"--lora-rank 0", "--lora-rank must be in [1, 65536], got 0"},
      {"--lora-rank 65537", "--lora-rank must be in [1, 65536], got 65537"},
      {"--lora-scale 0", "--lora-scale must be a number in (0, 10000], got 0"},
      {"--lora-scale 20000", "--lora-scale must be a number in (0, 10000], got 20000"},
      {"--weight-decay -1", "--weight-decay must be a finite number >= 0, got -1"},
      {"--grad-clip inf", "--grad-clip must be a finite number >= 0 (0 = off)"},
      {"--lr-schedule linear", "--lr-schedule: 'linear' is not constant or cosine"},
      // An empty key list used to train the default keys silently.
      {"--lora-keys ''", "train: --lora-keys '' names no module"},
      {"--lora-keys ,", "train: --lora-keys ',' names no module"},
  };
  for (const auto& [flags, want] : cases) {
    SCOPED_TRACE(flags);
    expect_guard_error(run_guard_cli(base + flags, d), want);
  }
  // Good flags, no train.jsonl: named before the model loads too.
  expect_guard_error(run_guard_cli(guard_train(d / "nodata", d / "out", guard_q(d / "no_model")), d),
                     "train: --data " + (d / "nodata").string() + ": no such folder");
  fs::create_directories(d / "nodata" / "train.jsonl");  // a folder where the file should be
  expect_guard_error(run_guard_cli(guard_train(d / "nodata", d / "out", guard_q(d / "no_model")), d),
                     "train: --data " + (d / "nodata").string() + ": train.jsonl is not a regular file");
  hearth::io::write_file_atomic(d / "rows.jsonl", "{\"text\": \"x\"}\n");  // --data naming the file itself
  expect_guard_error(run_guard_cli(guard_train(d / "rows.jsonl", d / "out", guard_q(d / "no_model")), d),
                     "train: --data " + (d / "rows.jsonl").string() + ": not a folder");
  EXPECT_FALSE(fs::exists(d / "out"));
}

TEST(TrainGuardsCli, BenchTrainSaysWhatItMeasuredInEachCell) {
  TempDir d;
  const std::string base = "bench-train --model " + guard_model() + " --device cpu --seq-lens 48 --segment-sizes 0 1 ";
  const GuardRun one = run_guard_cli(base + "--max-backward-segments 1", d);
  ASSERT_EQ(one.rc, 0) << one.err;
  EXPECT_NE(one.out.find("one step stopped after 1 backward segment(s) per cell"), std::string::npos) << one.out;
  // The unsegmented cell ran its whole backward: not PARTIAL, and its time covers the backward.
  EXPECT_NE(one.out.find("     48      off  WHOLE BACKWARD (full backward: no segments to stop after): forward + loss "
                         "head + backward "),
            std::string::npos)
      << one.out;
  EXPECT_EQ(one.out.find("PARTIAL: 0 of"), std::string::npos) << one.out;
  EXPECT_NE(one.out.find("     48        1  PARTIAL: 1 of 2 backward segments; forward + loss head "), std::string::npos)
      << one.out;
  // More segments allowed than the cell has: its whole backward ran, and the line says so.
  const GuardRun all = run_guard_cli(base + "--max-backward-segments 5", d);
  ASSERT_EQ(all.rc, 0) << all.err;
  EXPECT_NE(all.out.find("     48        1  WHOLE BACKWARD: all 2 of 2 backward segments; forward + loss head "),
            std::string::npos)
      << all.out;
  EXPECT_EQ(all.out.find("PARTIAL"), std::string::npos) << all.out;
}

// A run that diverges (a learning rate of 1e30 makes the loss or the weights non-finite) ends with
// one error line and writes nothing more: the adapter and checkpoint it resumed stay as they were
// (an attack found a NaN run replacing a good adapter and exiting 0). With --save-every, the saves
// before the loss turned non-finite are kept; only finite weights are ever written.
TEST(TrainGuardsCli, ADivergedRunSavesNothing) {
  TempDir d;
  const fs::path data = guard_data(d), out = d / "out";
  const GuardRun first = run_guard_cli(guard_train(data, out) + "--iters 2 --seed 1", d);
  ASSERT_EQ(first.rc, 0) << first.out << first.err;
  const std::string adapter = hearth::io::read_file(out / "adapters.safetensors");
  const std::string checkpoint = hearth::io::read_file(out / "checkpoint.json");
  const GuardRun bad = run_guard_cli("train --model " + guard_model() + " --data " + guard_q(data) +
                                         " --adapter-path " + guard_q(out) + " --resume " + guard_q(out) +
                                         " --batch-size 2 --max-seq-length 64 --learning-rate 1e30 --seed 1 --device cpu"
                                         " --iters 6",
                                     d);
  expect_guard_error(bad, "(training diverged: lower --learning-rate");
  EXPECT_NE(bad.err.find("nothing was saved to " + out.string()), std::string::npos) << bad.err;
  EXPECT_TRUE(hearth::io::read_file(out / "adapters.safetensors") == adapter) << "a diverged run replaced the adapter";
  EXPECT_EQ(hearth::io::read_file(out / "checkpoint.json"), checkpoint);
  // A run that saved before diverging says where its last checkpoint is ("nothing was saved" was
  // false then: with --overwrite the previous run had been replaced by it).
  const GuardRun saved = run_guard_cli("train --model " + guard_model() + " --data " + guard_q(data) +
                                           " --adapter-path " + guard_q(out) + " --batch-size 2 --max-seq-length 64"
                                           " --learning-rate 1e20 --device cpu --iters 20 --seed 1 --overwrite --save-every 1",
                                       d);
  expect_guard_error(saved, "(training diverged: lower --learning-rate");
  EXPECT_EQ(saved.err.find("nothing was saved"), std::string::npos) << saved.err;
  EXPECT_NE(saved.err.find("(this run's last) is in " + out.string()), std::string::npos) << saved.err;
}
