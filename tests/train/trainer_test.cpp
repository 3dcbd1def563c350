// The training loop on the tiny golden model: resume continues with the same losses as an
// uninterrupted run, SIGINT to a `hearth train` child leaves a loadable checkpoint and exit 0,
// an end-to-end run lowers the loss, schedules and AdamW state round trips.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <stdexcept>
#include <fstream>
#include <map>
#include <optional>
#include <thread>
#include <utility>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/hf_config.h"
#include "adapters/adapter.h"
#include "io/safetensors.h"
#include "train/optimizer.h"
#include "train/trainer.h"
#include "train_test_util.h"
#include "test_paths.h"

using namespace hearth::train;
using namespace hearth::train::testing;
namespace fs = std::filesystem;

namespace {

struct TrainerTempDir {
  fs::path path;
  explicit TrainerTempDir(const std::string& name) : path(fs::temp_directory_path() / ("hearth_tr_" + name)) {
    hearth::io::remove_tree(path);
    fs::create_directories(path);
  }
  ~TrainerTempDir() { hearth::io::remove_tree(path); }
};

const char* kRows[] = {"the quick brown fox jumps over the lazy dog", "a stitch in time saves nine",
                       "all that glitters is not gold",        "the early bird catches the worm",
                       "actions speak louder than words",       "practice makes perfect every day",
                       "where there is smoke there is fire",    "the pen is mightier than the sword"};

void write_data(const fs::path& dir) {
  std::string train, valid;
  for (const char* r : kRows) train += std::string("{\"text\": \"") + r + "\"}\n";
  valid = "{\"text\": \"the lazy dog sleeps\"}\n{\"text\": \"time saves nine\"}\n";
  hearth::io::write_file_atomic(dir / "train.jsonl", train);
  hearth::io::write_file_atomic(dir / "valid.jsonl", valid);
}

TrainConfig base_config(const fs::path& data, const fs::path& out) {
  TrainConfig c;
  c.data_dir = data;
  c.adapter_path = out;
  c.fine_tune_type = "full";
  c.num_layers = -1;
  c.batch_size = 2;
  c.iters = 6;
  c.learning_rate = 3e-3;
  c.lr_schedule = "cosine";
  c.warmup = 2;
  c.weight_decay = 0.01;
  c.grad_accumulation_steps = 2;
  c.grad_clip = 1.0;
  c.steps_per_report = 1;
  c.steps_per_eval = 2;
  c.val_batches = -1;
  c.save_every = 0;
  c.seed = 7;
  c.max_seq_length = 12;  // full fine-tune packs text rows: several 12-token pieces
  return c;
}

std::unique_ptr<hearth::models::Model> tiny_model() { return hearth::models::load_model(golden("models/llama_mha"), {}); }
hearth::tokenizer::Tokenizer tiny_tok() { return hearth::tokenizer::Tokenizer::from_dir(golden("models/llama_mha")); }

}  // namespace

TEST(Schedule, WarmupConstantCosine) {
  Schedule s;
  s.peak = 1.0;
  s.warmup = 4;
  s.total = 14;
  EXPECT_DOUBLE_EQ(s.lr(1), 0.25);
  EXPECT_DOUBLE_EQ(s.lr(4), 1.0);
  EXPECT_DOUBLE_EQ(s.lr(9), 1.0);
  s.kind = Schedule::Kind::kCosine;
  s.min_lr = 0.1;
  EXPECT_DOUBLE_EQ(s.lr(5), 1.0);
  EXPECT_NEAR(s.lr(10), 0.1 + 0.45 * (1 + std::cos(M_PI * 5 / 10)), 1e-12);  // halfway: 0.55
  EXPECT_NEAR(s.lr(15), 0.1, 1e-12);
  EXPECT_THROW(Schedule::parse("linear"), hearth::Error);
}

TEST(ClipGradNorm, ScalesToMaxNorm) {
  at::Tensor a = at::zeros({2}).requires_grad_(true), b = at::zeros({1}).requires_grad_(true);
  a.mutable_grad() = at::tensor({3.0f, 0.0f});
  b.mutable_grad() = at::tensor({4.0f});
  EXPECT_NEAR(clip_grad_norm({a, b}, 10.0), 5.0, 1e-9);
  EXPECT_FLOAT_EQ(a.grad()[0].item<float>(), 3.0f);  // under the limit: untouched
  EXPECT_NEAR(clip_grad_norm({a, b}, 1.0), 5.0, 1e-9);
  EXPECT_NEAR(a.grad()[0].item<float>(), 0.6f, 1e-6);
  EXPECT_NEAR(b.grad()[0].item<float>(), 0.8f, 1e-6);
}

// A damaged state is named when it is read (it resumed, then was reported as a diverged run).
TEST(NamedAdamW, DamagedStateIsRefusedNamingTheTensor) {
  at::Tensor w = at::zeros({2}).requires_grad_(true);
  NamedAdamW opt({{"w", w}}, AdamWConfig{});
  w.mutable_grad() = at::ones({2});
  opt.step();
  const auto good = opt.state_tensors();
  auto refused = [&](const std::string& key, const at::Tensor& value) {
    auto st = good;
    st[key] = value;
    NamedAdamW fresh({{"w", w}}, AdamWConfig{});
    try {
      fresh.load_state_tensors(st, 1, "opt.safetensors");
    } catch (const hearth::Error& e) {
      return std::string(e.what());
    }
    return std::string("loaded");
  };
  EXPECT_NE(refused("w.exp_avg", at::full({2}, NAN)).find("opt.safetensors: optimizer state w.exp_avg is not finite"),
            std::string::npos);
  EXPECT_NE(refused("w.exp_avg_sq", at::full({2}, -1.0)).find("w.exp_avg_sq must be finite and non-negative"),
            std::string::npos);
  EXPECT_NE(refused("w.step", at::full({1}, -3, at::kLong)).find("w.step is -3, expected 1 to the checkpoint's 1"),
            std::string::npos);
  EXPECT_NE(refused("v.exp_avg", at::zeros({2})).find("optimizer state v.exp_avg belongs to no trained parameter"),
            std::string::npos);
  EXPECT_EQ(refused("w.step", at::full({1}, 1, at::kLong)), "loaded");
}

TEST(NamedAdamW, StateRoundTripContinuesIdentically) {
  auto run = [](int split) {
    at::Tensor w = at::arange(6, at::kFloat).reshape({2, 3}).requires_grad_(true);
    AdamWConfig cfg;
    cfg.lr = 0.1;
    cfg.weight_decay = 0.05;
    auto opt = std::make_unique<NamedAdamW>(std::vector<std::pair<std::string, at::Tensor>>{{"w", w}}, cfg);
    for (int s = 0; s < 5; ++s) {
      if (s == split) {  // save, rebuild the optimizer, restore
        auto st = opt->state_tensors();
        opt = std::make_unique<NamedAdamW>(std::vector<std::pair<std::string, at::Tensor>>{{"w", w}}, cfg);
        opt->load_state_tensors(st, s, "test");
      }
      w.mutable_grad() = (w.detach() * w.detach() - 2).sin();
      opt->step();
      opt->zero_grad();
    }
    return w.detach().clone();
  };
  at::Tensor straight = run(-1), resumed = run(3);
  EXPECT_TRUE(straight.equal(resumed));
  // and AdamW actually moved the weights
  EXPECT_GT((straight - at::arange(6, at::kFloat).reshape({2, 3})).abs().max().item<float>(), 0.1f);
}

// stop_at (step, m): the stop flag is set by the test hook there instead of after step 3's report —
// (4, 1) between step 4's two micro-batches (step 4 is dropped and the resumed run replays it), (4, -1)
// before the first batch of the validation that precedes step 4.
void check_resume(TrainConfig c, const TrainerTempDir& d, std::optional<std::pair<int64_t, int64_t>> stop_at = {}) {
  const bool stop_in_step = stop_at.has_value();
  c.adapter_path = d.path / "straight";
  auto tok = tiny_tok();
  TrainResult straight;
  {
    auto m = tiny_model();
    straight = run_training(c, *m, tok);
  }
  ASSERT_EQ(straight.step_losses.size(), 6u);
  // first half: stop after step 3 through the stop flag
  std::atomic<bool> stop{false};
  c.adapter_path = d.path / "split";
  c.stop = &stop;
  int64_t val_hook_calls = 0;
  if (stop_in_step) {
    ASSERT_EQ(c.grad_accumulation_steps, 2);
    c.on_micro_batch = [&](int64_t step, int64_t m) {
      val_hook_calls += m < 0;
      if (std::make_pair(step, m) == *stop_at) stop = true;
    };
  }
  TrainResult first;
  {
    auto m = tiny_model();
    first = run_training(c, *m, tok, [&](const Report& r) {
      if (r.step == 3 && !stop_in_step) stop = true;
    });
  }
  c.on_micro_batch = nullptr;
  if (stop_in_step) EXPECT_EQ(val_hook_calls, 3);  // the validations before steps 1 and 2, then 4's first batch
  EXPECT_TRUE(first.interrupted);
  EXPECT_EQ(first.steps_done, 3);
  EXPECT_EQ(checkpoint_step(c.adapter_path), 3);
  c.stop = nullptr;
  c.resume = c.adapter_path;
  TrainResult second;
  {
    auto m = tiny_model();
    second = run_training(c, *m, tok);
  }
  ASSERT_EQ(first.step_losses.size(), 3u);
  ASSERT_EQ(second.step_losses.size(), 3u);
  for (int i = 0; i < 6; ++i) {
    const double got = i < 3 ? first.step_losses[i] : second.step_losses[i - 3];
    EXPECT_EQ(got, straight.step_losses[i]) << "step " << i + 1;
    std::printf("[resume] step %d: straight %.9f resumed %.9f\n", i + 1, straight.step_losses[i], got);
  }
  // the final weights agree too
  auto a = hearth::io::SafetensorsFile::open(d.path / "straight/adapters.safetensors");
  EXPECT_GT(a->tensors().size(), 0u);
  auto b = hearth::io::SafetensorsFile::open(d.path / "split/adapters.safetensors");
  for (const auto& info : a->tensors()) EXPECT_TRUE(a->tensor(info.name).equal(b->tensor(info.name))) << info.name;
  // val loss is reported at steps 1, 2, 4, 6 and metrics.jsonl has a line per report
  int val_reports = 0;
  for (const auto& r : straight.reports) val_reports += r.val_loss.has_value();
  EXPECT_EQ(val_reports, 4);
  std::ifstream m(d.path / "straight/metrics.jsonl");
  int lines = 0;
  for (std::string l; std::getline(m, l);) ++lines;
  EXPECT_EQ(lines, 6);
}

TEST(Trainer, ResumeGivesTheSameLossesFull) {
  TrainerTempDir d("resume_full");
  write_data(d.path);
  check_resume(base_config(d.path, d.path), d);
}

TEST(Trainer, StopInsideAStepDropsItAndTheResumedRunReplaysIt) {
  TrainerTempDir d("resume_mid_step");
  write_data(d.path);
  check_resume(base_config(d.path, d.path), d, std::make_pair(int64_t{4}, int64_t{1}));
}

// A long validation hears the stop flag before each of its batches (it ran to its end: a Ctrl-C
// waited for the whole validation set).
TEST(Trainer, StopDuringValidationEndsTheRunBeforeItsStep) {
  TrainerTempDir d("resume_in_validation");
  write_data(d.path);
  check_resume(base_config(d.path, d.path), d, std::make_pair(int64_t{4}, int64_t{-1}));
}

// Validation scores every row whatever --batch-size is: a valid.jsonl smaller than a batch was
// dropped without a word, and a short last batch was left out (the val loss moved with it).
TEST(Trainer, ValidationScoresEveryRowWhateverTheBatchSize) {
  TrainerTempDir d("valid_rows");
  write_data(d.path);
  hearth::io::write_file_atomic(d.path / "valid.jsonl",
                                "{\"text\": \"the lazy dog sleeps\"}\n{\"text\": \"time saves nine\"}\n"
                                "{\"text\": \"a much longer row about the quick brown fox and the lazy dog\"}\n");
  auto tok = tiny_tok();
  auto val_loss = [&](int64_t batch_size) {
    TrainConfig c = base_config(d.path, d.path / ("out" + std::to_string(batch_size)));
    c.fine_tune_type = "lora";  // rows stay rows (a full fine-tune packs text)
    c.lora_rank = 4;
    c.learning_rate = 0;
    c.iters = 1;
    c.grad_accumulation_steps = 1;
    c.batch_size = batch_size;
    auto m = tiny_model();
    const TrainResult r = run_training(c, *m, tok);
    EXPECT_TRUE(!r.reports.empty() && r.reports.front().val_loss.has_value()) << "batch size " << batch_size;
    return r.reports.empty() ? -1.0 : r.reports.front().val_loss.value_or(-1.0);
  };
  const double one = val_loss(1);
  EXPECT_GT(one, 0);
  EXPECT_NEAR(val_loss(2), one, 1e-5);  // two batches, the second one row
  EXPECT_NEAR(val_loss(4), one, 1e-5);  // one short batch of three
}

TEST(Trainer, ResumeGivesTheSameLossesLoraWithDropout) {
  TrainerTempDir d("resume_lora");
  write_data(d.path);
  TrainConfig c = base_config(d.path, d.path);
  c.fine_tune_type = "lora";
  c.lora_rank = 4;
  c.lora_dropout = 0.1;
  c.learning_rate = 1e-2;
  c.segment_size = 1;  // dropout masks replayed in the recompute
  check_resume(c, d);
}

TEST(Trainer, LoraSavesMlxAndPeftAdaptersThatLoad) {
  TrainerTempDir d("lora_save");
  write_data(d.path);
  auto tok = tiny_tok();
  for (const char* fmt : {"mlx", "peft"}) {
    TrainConfig c = base_config(d.path, d.path / fmt);
    c.fine_tune_type = "lora";
    c.iters = 2;
    c.learning_rate = 1e-2;
    c.adapter_format = fmt;
    auto m = tiny_model();
    run_training(c, *m, tok);
    auto ad = hearth::adapters::load_adapter(d.path / fmt);
    EXPECT_EQ(ad.modules.size(), 14u) << fmt;  // 7 projections x 2 layers
    double bnorm = 0;
    for (const auto& [path, lm] : ad.modules) bnorm += lm.b.norm().item<double>();
    EXPECT_GT(bnorm, 0) << fmt << ": B left at its zero init";
    EXPECT_TRUE(fs::exists(d.path / fmt / "checkpoint.json"));
  }
}

TEST(Trainer, BadConfigAndCheckpointErrors) {
  TrainerTempDir d("bad");
  write_data(d.path);
  auto tok = tiny_tok();
  auto m = tiny_model();
  TrainConfig c = base_config(d.path, d.path / "out");
  c.fine_tune_type = "qlora";
  EXPECT_THROW(run_training(c, *m, tok), hearth::Error);
  c = base_config(d.path, d.path / "out");
  c.resume = d.path / "nowhere";
  EXPECT_THROW(run_training(c, *m, tok), hearth::Error);
  c = base_config(d.path, d.path / "out");
  c.batch_size = 100;
  EXPECT_THROW(run_training(c, *m, tok), hearth::Error);
}


namespace {

// steps of metrics.jsonl, in file order
std::vector<int64_t> metric_steps(const fs::path& file) {
  std::vector<int64_t> steps;
  std::ifstream m(file);
  for (std::string l; std::getline(m, l);) steps.push_back(nlohmann::json::parse(l)["step"].get<int64_t>());
  return steps;
}

int count_optimizer_files(const fs::path& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.path().filename().string().rfind("optimizer", 0) == 0;
  return n;
}

}  // namespace

// Issue 16 items 11-12: a crash at any point of writing a checkpoint leaves the last complete one,
// --resume reproduces the loss trajectory from it, and metrics.jsonl has each step once.
TEST(Trainer, CrashWhileCheckpointingResumesFromTheLastCompleteOne) {
  TrainerTempDir d("crash_ckpt");
  write_data(d.path);
  auto tok = tiny_tok();
  TrainConfig c = base_config(d.path, d.path / "straight");
  c.save_every = 2;  // checkpoints at 2 and 4, the crash comes while writing the one at 4
  TrainResult straight;
  {
    auto m = tiny_model();
    straight = run_training(c, *m, tok);
  }
  ASSERT_EQ(straight.step_losses.size(), 6u);
  for (const std::string stage : {"weights", "optimizer", "manifest", "cleanup"}) {
    SCOPED_TRACE("crash after " + stage);
    TrainConfig k = c;
    k.adapter_path = d.path / stage;
    int seen = 0;
    k.checkpoint_hook = [&](const std::string& s) {
      if (s == stage && ++seen == 2) throw std::runtime_error("simulated kill -9");
    };
    {
      auto m = tiny_model();
      EXPECT_THROW(run_training(k, *m, tok), std::runtime_error);
    }
    // before checkpoint.json switches, the one at step 2 is intact; after, the one at 4 is complete
    const int64_t want = stage == "weights" || stage == "optimizer" ? 2 : 4;
    ASSERT_EQ(checkpoint_step(k.adapter_path), want);
    k.checkpoint_hook = nullptr;
    k.resume = k.adapter_path;
    TrainResult r;
    {
      auto m = tiny_model();
      r = run_training(k, *m, tok);
    }
    ASSERT_EQ(r.step_losses.size(), static_cast<size_t>(6 - want));
    for (size_t i = 0; i < r.step_losses.size(); ++i)
      EXPECT_EQ(r.step_losses[i], straight.step_losses[want + i]) << "step " << want + 1 + i;
    // the killed run logged steps 1-4; the lines after the checkpoint are not repeated
    EXPECT_EQ(metric_steps(k.adapter_path / "metrics.jsonl"), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
    EXPECT_EQ(count_optimizer_files(k.adapter_path), 1);  // only the last checkpoint's
  }
  // a checkpoint of the layout before optimizer files were named per step still resumes
  TrainConfig old = c;
  old.adapter_path = d.path / "old_layout";
  old.save_every = 0;
  std::atomic<bool> stop{false};
  old.stop = &stop;
  {
    auto m = tiny_model();
    run_training(old, *m, tok, [&](const Report& r) {
      if (r.step == 4) stop = true;
    });
  }
  old.stop = nullptr;
  ASSERT_EQ(checkpoint_step(old.adapter_path), 4);
  nlohmann::json ck = hearth::io::read_json(old.adapter_path / "checkpoint.json");
  fs::rename(old.adapter_path / ck["optimizer"].get<std::string>(), old.adapter_path / "optimizer.safetensors");
  ck.erase("optimizer");
  hearth::io::write_file_atomic(old.adapter_path / "checkpoint.json", ck.dump());
  old.resume = old.adapter_path;
  auto m = tiny_model();
  TrainResult r = run_training(old, *m, tok);
  ASSERT_EQ(r.step_losses.size(), 2u);
  EXPECT_EQ(r.step_losses[0], straight.step_losses[4]);
}

// A fresh run into a folder holding another run's files (the CLI's --overwrite) leaves them whole
// until its own first save: a run that fails (diverges) or dies before it keeps the previous run
// resumable; one that saves replaces it all.
TEST(Trainer, AFreshRunLeavesThePreviousRunUntilItsFirstSave) {
  TrainerTempDir d("overwrite");
  write_data(d.path);
  auto tok = tiny_tok();
  TrainConfig c = base_config(d.path, d.path / "out");
  c.save_every = 2;
  {
    auto m = tiny_model();
    run_training(c, *m, tok);
  }
  std::map<std::string, std::string> before;
  for (const auto& e : fs::directory_iterator(c.adapter_path)) before[e.path().filename()] = hearth::io::read_file(e.path());
  ASSERT_TRUE(before.count("checkpoint.json") && before.count("metrics.jsonl") && before.count("adapters.safetensors"));
  auto unchanged = [&](const std::string& what) {
    std::map<std::string, std::string> now;
    for (const auto& e : fs::directory_iterator(c.adapter_path)) now[e.path().filename()] = hearth::io::read_file(e.path());
    EXPECT_TRUE(now == before) << what;
  };
  TrainConfig again = c;
  again.save_every = 4;
  {
    auto m = tiny_model();
    EXPECT_THROW(run_training(again, *m, tok, [](const Report& r) {
                   if (r.step == 3) throw std::runtime_error("killed before the first save");
                 }),
                 std::runtime_error);
  }
  unchanged("after a run that died before its first save");
  again.learning_rate = 1e30;
  {
    auto m = tiny_model();
    EXPECT_THROW(run_training(again, *m, tok), hearth::Error);
  }
  unchanged("after a run that diverged");
  TrainConfig fresh = c;
  fresh.iters = 3;
  fresh.save_every = 0;
  {
    auto m = tiny_model();
    run_training(fresh, *m, tok);
  }
  EXPECT_EQ(metric_steps(c.adapter_path / "metrics.jsonl"), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(checkpoint_step(c.adapter_path), 3);
  EXPECT_EQ(count_optimizer_files(c.adapter_path), 1);
}

TEST(Trainer, ResumeChecksCheckpointFieldsAndRemovesStaleTemporaries) {
  TrainerTempDir d("resume_checks");
  write_data(d.path);
  auto tok = tiny_tok();
  TrainConfig c = base_config(d.path, d.path / "out");
  c.iters = 2;
  {
    auto m = tiny_model();
    run_training(c, *m, tok);
  }
  auto error_of = [&](TrainConfig k) -> std::string {
    try {
      auto m = tiny_model();
      run_training(k, *m, tok);
    } catch (const hearth::Error& e) {
      return e.what();
    }
    return "";
  };
  const std::string ck_file = (c.adapter_path / "checkpoint.json").string();
  TrainConfig k = c;
  k.iters = 3;
  k.resume = c.adapter_path;
  k.grad_accumulation_steps = 3;
  EXPECT_EQ(error_of(k), ck_file + ": --grad-accumulation-steps 3 differs from the checkpoint's 2 (resume with the "
                                   "checkpoint's value)");
  // wrong-typed fields: one line naming the file and the field, not the JSON library's message
  const nlohmann::json good = hearth::io::read_json(c.adapter_path / "checkpoint.json");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"("step": "2")", "\"step\" must be a non-negative integer, got a string"},
      {R"("seed": -1)", "\"seed\" must be a non-negative integer, got -1"},
      {R"("batch_index": 1.5)", "\"batch_index\" must be a non-negative integer, got 1.5"},
      {R"("fine_tune_type": ["full"])", "\"fine_tune_type\" must be a string, got an array"},
      {R"("optimizer": "../../etc/passwd")", "\"optimizer\" must name an optimizer file"},
      {R"("epoch": null)", "\"epoch\" must be a non-negative integer, got null"}};
  for (const auto& [field, want] : cases) {
    nlohmann::json bad = good;
    nlohmann::json patch = nlohmann::json::parse("{" + field + "}");
    bad.update(patch);
    hearth::io::write_file_atomic(c.adapter_path / "checkpoint.json", bad.dump());
    k.grad_accumulation_steps = 2;
    const std::string e = error_of(k);
    EXPECT_EQ(e.rfind(ck_file + ": " + want, 0), 0u) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  hearth::io::write_file_atomic(c.adapter_path / "checkpoint.json", good.dump());
  // temporaries of a dead writer go; those of a running process stay
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  waitpid(child, nullptr, 0);
  const fs::path stale = c.adapter_path / ("adapters.safetensors.tmp." + std::to_string(child));
  const fs::path live = c.adapter_path / ("checkpoint.json.tmp." + std::to_string(getppid()));
  const fs::path other = c.adapter_path / "notes.tmp.txt";
  for (const fs::path& p : {stale, live, other}) hearth::io::write_file_atomic(p, "x");
  std::vector<std::string> notes;
  k.on_note = [&](const std::string& n) { notes.push_back(n); };
  EXPECT_EQ(error_of(k), "");
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(other));
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("removed 1 temporary file(s)"), std::string::npos) << notes[0];
  EXPECT_EQ(checkpoint_step(c.adapter_path), 3);
}

// Issue 16 item 26: the default trains every layer (mlx-bun's num_layers -1), so models with fewer
// than 16 layers train without flags; a larger explicit value stays an error.
TEST(Trainer, DefaultNumLayersIsAll) {
  EXPECT_EQ(TrainConfig{}.num_layers, -1);
  TrainerTempDir d("num_layers");
  write_data(d.path);
  auto tok = tiny_tok();
  TrainConfig c = base_config(d.path, d.path / "out");
  c.num_layers = TrainConfig{}.num_layers;
  c.fine_tune_type = "lora";
  c.iters = 1;
  auto m = tiny_model();
  EXPECT_NO_THROW(run_training(c, *m, tok));
  c.num_layers = m->num_layers() + 1;
  EXPECT_THROW(run_training(c, *m, tok), hearth::Error);
}

#ifdef HEARTH_BINARY
namespace {

// Runs `hearth train ...` with stdout to a pipe; returns pid and the read end.
pid_t spawn(const std::vector<std::string>& args, int* out_fd) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fds[1]);
  *out_fd = fds[0];
  return pid;
}

}  // namespace

TEST(TrainCli, SigintWritesALoadableCheckpointAndExitsZero) {
  TrainerTempDir d("sigint");
  write_data(d.path);
  const fs::path out = d.path / "out";
  int fd = -1;
  pid_t pid = spawn({HEARTH_BINARY, "train", "--model", golden("models/llama_mha").string(), "--data", d.path.string(),
                     "--adapter-path", out.string(), "--fine-tune-type", "full", "--num-layers", "-1", "--iters",
                     "100000", "--batch-size", "2", "--max-seq-length", "12", "--steps-per-report", "1", "--save-every", "0", "--device", "cpu"},
                    &fd);
  ASSERT_GT(pid, 0);
  FILE* f = fdopen(fd, "r");
  char line[512];
  int steps_seen = 0;
  while (fgets(line, sizeof line, f))
    if (std::string(line).rfind("step ", 0) == 0 && ++steps_seen == 3) break;
  ASSERT_EQ(steps_seen, 3) << "the child printed no progress";
  kill(pid, SIGINT);
  std::string rest;
  while (fgets(line, sizeof line, f)) rest += line;
  fclose(f);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_NE(rest.find("interrupted: checkpoint at step"), std::string::npos) << rest;
  const int64_t step = checkpoint_step(out);
  EXPECT_GE(step, 3);
  // loadable: resume it in-process for one more step
  TrainConfig c = base_config(d.path, out);
  c.batch_size = 2;
  c.grad_accumulation_steps = 1;
  c.seed = 0;
  c.lr_schedule = "constant";
  c.warmup = 0;
  c.iters = step + 1;
  c.resume = out;
  auto m = tiny_model();
  auto tok = tiny_tok();
  TrainResult r = run_training(c, *m, tok);
  EXPECT_EQ(r.steps_done, step + 1);
  EXPECT_EQ(r.step_losses.size(), 1u);
}

// The stop handler is one-shot: the first signal asks for a checkpoint at the next micro-batch, a
// second ends the process at once — here while the data is read (the flag is not looked at there:
// one 27 MB validation row takes seconds to tokenize). A first signal that lands after the read (a
// fast machine) ends the run gracefully; then it is tried again sooner.
TEST(TrainCli, ASecondSigintQuitsAtOnce) {
  TrainerTempDir d("sigint2");
  write_data(d.path);
  std::string row;
  for (int i = 0; i < 1000000; ++i) row += "the lazy dog sleeps " + std::to_string(i) + " ";
  hearth::io::write_file_atomic(d.path / "valid.jsonl", "{\"text\": \"" + row + "\"}\n");
  int status = 0;
  for (int wait_ms : {300, 50}) {
    hearth::io::remove_tree(d.path / "out");
    int fd = -1;
    pid_t pid = spawn({HEARTH_BINARY, "train", "--model", golden("models/llama_mha").string(), "--data", d.path.string(),
                       "--adapter-path", (d.path / "out").string(), "--iters", "1", "--batch-size", "2",
                       "--max-seq-length", "12", "--device", "cpu"},
                      &fd);
    ASSERT_GT(pid, 0);
    FILE* f = fdopen(fd, "r");
    char line[512];
    bool started = false;
    while (!started && fgets(line, sizeof line, f)) started = std::string(line).rfind("training ", 0) == 0;
    ASSERT_TRUE(started) << "the child printed no start line";
    std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));  // inside the data read
    kill(pid, SIGINT);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    kill(pid, SIGINT);
    waitpid(pid, &status, 0);
    fclose(f);
    if (WIFSIGNALED(status)) break;
  }
  ASSERT_TRUE(WIFSIGNALED(status)) << "exited with " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), SIGINT);
}

// A first SIGINT during a long validation (10^5 batches) stops the run at the validation's next
// batch with a last checkpoint: it waited for the whole validation.
TEST(TrainCli, ASigintDuringValidationStopsAtItsNextBatch) {
  TrainerTempDir d("sigint_val");
  write_data(d.path);
  std::string valid;
  for (int i = 0; i < 200000; ++i) valid += "{\"text\": \"the lazy dog sleeps " + std::to_string(i) + "\"}\n";
  hearth::io::write_file_atomic(d.path / "valid.jsonl", valid);
  int fd = -1;
  pid_t pid = spawn({HEARTH_BINARY, "train", "--model", golden("models/llama_mha").string(), "--data", d.path.string(),
                     "--adapter-path", (d.path / "out").string(), "--iters", "1", "--batch-size", "2",
                     "--max-seq-length", "12", "--steps-per-eval", "1", "--val-batches", "-1", "--device", "cpu"},
                    &fd);
  ASSERT_GT(pid, 0);
  FILE* f = fdopen(fd, "r");
  std::string out;
  char line[512];
  while (out.find("training ") == std::string::npos && fgets(line, sizeof line, f)) out += line;
  std::this_thread::sleep_for(std::chrono::milliseconds(3000));  // past the read, inside the validation
  kill(pid, SIGINT);
  while (fgets(line, sizeof line, f)) out += line;
  int status = 0;
  waitpid(pid, &status, 0);
  fclose(f);
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_NE(out.find("interrupted: checkpoint at step 0"), std::string::npos) << out;
  EXPECT_EQ(out.find("val loss"), std::string::npos) << out;  // the validation did not finish
}

// Items 23 and 26 through the CLI: no --num-layers on a 2-layer model trains (the default used to
// be 16), and rows whose prompt fills --max-seq-length are skipped with a count in the log.
TEST(TrainCli, DefaultsTrainASmallModelAndSkippedRowsAreLogged) {
  TrainerTempDir d("cli_defaults");
  std::string rows;
  for (const char* r : kRows) rows += std::string("{\"prompt\": \"") + r + "\", \"completion\": \" yes\"}\n";
  std::string long_prompt;
  for (int i = 0; i < 6; ++i) long_prompt += "one two three four five six seven eight nine ten ";
  rows += "{\"prompt\": \"" + long_prompt + "\", \"completion\": \" no\"}\n";
  hearth::io::write_file_atomic(d.path / "train.jsonl", rows);
  const fs::path out = d.path / "out";
  const std::string cmd = std::string(HEARTH_BINARY) + " train --model " + golden("models/llama_mha").string() +
                          " --data " + d.path.string() + " --adapter-path " + out.string() +
                          " --iters 2 --batch-size 2 --max-seq-length 40 --device cpu > " +
                          (d.path / "log.txt").string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  const std::string log = hearth::io::read_file(d.path / "log.txt");
  ASSERT_EQ(rc, 0) << log;
  EXPECT_NE(log.find("train.jsonl: skipped 1 row(s) whose prompt alone fills --max-seq-length 40"), std::string::npos)
      << log;
  EXPECT_EQ(checkpoint_step(out), 2);
}

TEST(TrainCli, EndToEndLossFalls) {
  TrainerTempDir d("e2e");
  write_data(d.path);
  const fs::path out = d.path / "out";
  const std::string cmd = std::string(HEARTH_BINARY) + " train --model " + golden("models/llama_mha").string() +
                          " --data " + d.path.string() + " --adapter-path " + out.string() +
                          " --fine-tune-type full --num-layers -1 --iters 30 --batch-size 4 --max-seq-length 16 --learning-rate 1e-3"
                          " --steps-per-report 5 --steps-per-eval 10 --device cpu > " +
                          (d.path / "log.txt").string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << hearth::io::read_file(d.path / "log.txt");
  std::ifstream m(out / "metrics.jsonl");
  std::vector<double> train;
  for (std::string l; std::getline(m, l);) {
    auto j = nlohmann::json::parse(l);
    if (j.contains("train_loss")) train.push_back(j["train_loss"].get<double>());
  }
  ASSERT_GE(train.size(), 6u);
  std::printf("%s", hearth::io::read_file(d.path / "log.txt").c_str());
  EXPECT_LT(train.back(), 0.5 * train.front()) << "first " << train.front() << " last " << train.back();
  EXPECT_TRUE(fs::exists(out / "adapters.safetensors"));
  EXPECT_TRUE(fs::exists(out / "adapter_config.json"));
}
#endif
