// train::check_config on values that would train garbage: a non-finite learning rate (inf wrote a
// NaN adapter) and every other out-of-range option are refused with one line naming the flag;
// train::start_step and a resume already at --iters (nothing trained, nothing written).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "../io/io_test_util.h"
#include "../test_util.h"
#include "io/atomic_file.h"
#include "models/registry.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"
#include "train/trainer.h"

TEST(TrainConfigCheck, LearningRateMustBeFinite) {
  hearth::train::TrainConfig c;
  c.adapter_path = std::filesystem::temp_directory_path() / "hearth_train_config_test_absent";
  EXPECT_EQ(hearth::testing::error_of([&] { hearth::train::check_config(c); }), "");
  for (double lr : {std::numeric_limits<double>::infinity(), std::nan(""), -1e-3}) {
    c.learning_rate = lr;
    EXPECT_NE(hearth::testing::error_of([&] { hearth::train::check_config(c); }).find("--learning-rate must be a finite "
                                                                                      "number >= 0"),
              std::string::npos)
        << lr;
  }
}

// Issue 14: every numeric option is range-checked by check_config (so the CLI refuses it before
// loading the model), one line naming the flag and its range.
TEST(TrainConfigCheck, EveryNumericOptionIsRangeCheckedByName) {
  using hearth::train::TrainConfig;
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  const std::vector<std::pair<std::function<void(TrainConfig&)>, std::string>> cases = {
      {[](TrainConfig& c) { c.lora_dropout = 1.0; }, "--lora-dropout must be in [0, 1), got 1"},
      {[&](TrainConfig& c) { c.lora_dropout = nan; }, "--lora-dropout must be in [0, 1)"},
      {[](TrainConfig& c) { c.max_seq_length = 1; }, "--max-seq-length must be in [2, 16777216] tokens, got 1"},
      {[](TrainConfig& c) { c.max_seq_length = hearth::train::kMaxSeqLength + 1; }, "--max-seq-length must be in [2, "},
      {[](TrainConfig& c) { c.lora_rank = 0; }, "--lora-rank must be in [1, 65536], got 0"},
      {[](TrainConfig& c) { c.lora_rank = 65537; }, "--lora-rank must be in [1, 65536], got 65537"},
      {[](TrainConfig& c) { c.lora_scale = -1; }, "--lora-scale must be a number in (0, 10000], got -1"},
      {[&](TrainConfig& c) { c.lora_scale = nan; }, "--lora-scale must be a number in (0, 10000]"},
      {[&](TrainConfig& c) { c.lora_scale = inf; }, "--lora-scale must be a number in (0, 10000]"},
      {[&](TrainConfig& c) { c.weight_decay = inf; }, "--weight-decay must be a finite number >= 0"},
      {[](TrainConfig& c) { c.weight_decay = -0.1; }, "--weight-decay must be a finite number >= 0, got -0.1"},
      {[&](TrainConfig& c) { c.grad_clip = inf; }, "--grad-clip must be a finite number >= 0 (0 = off)"},
      {[](TrainConfig& c) { c.lr_schedule = "linear"; }, "--lr-schedule: 'linear' is not constant or cosine"},
      {[](TrainConfig& c) { c.loss_chunk = 0; }, "loss chunk must be >= 1 positions, got 0"},
  };
  for (const auto& [set, want] : cases) {
    TrainConfig c;
    c.adapter_path = std::filesystem::temp_directory_path() / "hearth_train_config_test_absent";
    EXPECT_EQ(hearth::testing::error_of([&] { hearth::train::check_config(c); }), "");
    set(c);
    const std::string got = hearth::testing::error_of([&] { hearth::train::check_config(c); });
    EXPECT_NE(got.find(want), std::string::npos) << "want: " << want << "\ngot: " << got;
  }
}

// Issue 12: the step a run starts from is the checkpoint's; past --iters is refused (naming both),
// at --iters run_training returns at once and writes nothing.
TEST(TrainConfigCheck, StartStepAndAResumeAlreadyAtIters) {
  namespace fs = std::filesystem;
  hearth::testing::TempDir d;
  const fs::path ck = d / "ck";
  fs::create_directories(ck);
  hearth::io::write_file_atomic(ck / "checkpoint.json",
                                R"({"step": 4, "epoch": 0, "batch_index": 4, "seed": 0, "fine_tune_type": "lora",
                                    "method": "sft", "batch_size": 4, "grad_accumulation_steps": 1,
                                    "optimizer": "optimizer.4.safetensors"})");
  hearth::train::TrainConfig c;
  c.adapter_path = ck;
  EXPECT_EQ(hearth::train::start_step(c), 0);  // fresh
  c.resume = ck;
  c.iters = 5;
  EXPECT_EQ(hearth::train::start_step(c), 4);
  c.iters = 3;
  EXPECT_NE(hearth::testing::error_of([&] { hearth::train::start_step(c); })
                .find(": its checkpoint is at step 4, past --iters 3 (a run cannot go back)"),
            std::string::npos);
  c.iters = 5;
  c.method = "dpo";  // a checkpoint this run cannot continue: refused here too, before any load
  EXPECT_NE(hearth::testing::error_of([&] { hearth::train::start_step(c); })
                .find("checkpoint.json: the checkpoint was trained with --method sft, this run is --method dpo"),
            std::string::npos);
  c.method = "sft";
  c.iters = 4;
  c.data_dir = d / "no_data";  // never read: nothing is left to train
  const fs::path golden = fs::path(HEARTH_SOURCE_DIR) / "tests/golden/models/llama_mha";
  auto model = hearth::models::load_model(golden, {});
  auto tok = hearth::tokenizer::Tokenizer::from_dir(golden);
  std::string note;
  c.on_note = [&](const std::string& s) { note = s; };
  const auto r = hearth::train::run_training(c, *model, tok);
  EXPECT_EQ(r.steps_done, 4);
  EXPECT_TRUE(r.step_losses.empty());
  EXPECT_NE(note.find("nothing to train: the checkpoint in " + ck.string() + " is already at step 4 = --iters"),
            std::string::npos)
      << note;
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(ck)) files.push_back(e.path().filename().string());
  EXPECT_EQ(files, std::vector<std::string>{"checkpoint.json"});
}
