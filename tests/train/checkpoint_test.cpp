// checkpoint.json's record of what a run trains (src/train/checkpoint.cpp): a resume with another
// --lora-keys, --num-layers, --lora-rank or --lora-scale than the checkpoint is refused in one
// line naming the flag and both values, before anything loads; a checkpoint from before those were
// recorded is still guarded, by the per-parameter check of its optimizer file, in both directions
// (a checkpoint weight the run would not train had been silently dropped).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "io/hf_config.h"
#include "test_util.h"
#include "train/trainer.h"
#include "train_test_util.h"

namespace {

namespace fs = std::filesystem;
using hearth::train::TrainConfig;

struct CkptTestDir {
  fs::path path;
  explicit CkptTestDir(const std::string& name) : path(fs::temp_directory_path() / ("hearth_ckpt_" + name)) {
    hearth::io::remove_tree(path);
    fs::create_directories(path / "data");
    std::string rows;
    for (int i = 0; i < 4; ++i) rows += R"({"text": "the quick brown fox jumps over the lazy dog"})" "\n";
    hearth::io::write_file_atomic(path / "data" / "train.jsonl", rows);
  }
  ~CkptTestDir() { hearth::io::remove_tree(path); }
};

TrainConfig ckpt_lora_config(const fs::path& root) {
  TrainConfig c;
  c.data_dir = root / "data";
  c.adapter_path = root / "out";
  c.batch_size = 2;
  c.iters = 2;
  c.max_seq_length = 16;
  c.learning_rate = 1e-2;
  c.save_every = 0;
  c.lora_rank = 4;
  return c;
}

std::unique_ptr<hearth::models::Model> ckpt_model() {
  return hearth::models::load_model(hearth::train::testing::golden("models/llama_mha"), {});
}
hearth::tokenizer::Tokenizer ckpt_tok() {
  return hearth::tokenizer::Tokenizer::from_dir(hearth::train::testing::golden("models/llama_mha"));
}

}  // namespace

TEST(TrainCheckpoint, ResumeWithOtherAdapterSettingsIsRefusedNamingBothValues) {
  CkptTestDir d("settings");
  TrainConfig c = ckpt_lora_config(d.path);
  {
    auto m = ckpt_model();
    hearth::train::run_training(c, *m, ckpt_tok());
  }
  const std::string ck = (c.adapter_path / "checkpoint.json").string();
  TrainConfig k = c;
  k.resume = c.adapter_path;
  k.iters = 3;
  EXPECT_EQ(hearth::train::start_step(k), 2);  // the same settings continue
  // The defaults spelled out, in another order, are the same keys.
  k.lora_keys = {"mlp.down_proj", "mlp.up_proj", "mlp.gate_proj", "self_attn.o_proj", "self_attn.v_proj",
                 "self_attn.k_proj", "self_attn.q_proj"};
  EXPECT_EQ(hearth::train::start_step(k), 2);
  const std::string tail = " (resume with the checkpoint's value)";
  const std::string defaults =
      "self_attn.q_proj,self_attn.k_proj,self_attn.v_proj,self_attn.o_proj,mlp.gate_proj,mlp.up_proj,mlp.down_proj";
  struct Case {
    std::function<void(TrainConfig&)> set;
    std::string want;
  };
  const std::vector<Case> cases = {
      {[](TrainConfig& t) { t.lora_keys = {"self_attn.q_proj", "self_attn.v_proj"}; },
       ck + ": --lora-keys self_attn.q_proj,self_attn.v_proj differs from the checkpoint's " + defaults +
           "; only the checkpoint trains self_attn.k_proj,self_attn.o_proj,mlp.gate_proj,mlp.up_proj,mlp.down_proj" + tail},
      {[](TrainConfig& t) {
         t.lora_keys = {"mlp.down_proj", "mlp.up_proj", "mlp.gate_proj", "self_attn.o_proj", "self_attn.v_proj",
                        "self_attn.k_proj", "mlp.experts", "self_attn.q_proj", "mlp.experts"};
       },
       ck + ": --lora-keys mlp.down_proj,mlp.up_proj,mlp.gate_proj,self_attn.o_proj,self_attn.v_proj,self_attn.k_proj,"
            "mlp.experts,self_attn.q_proj,mlp.experts differs from the checkpoint's " + defaults +
           "; only this run targets mlp.experts" + tail},
      {[](TrainConfig& t) { t.num_layers = 1; }, ck + ": --num-layers 1 differs from the checkpoint's -1" + tail},
      {[](TrainConfig& t) { t.lora_rank = 8; }, ck + ": --lora-rank 8 differs from the checkpoint's 4" + tail},
      {[](TrainConfig& t) { t.lora_scale = 10; }, ck + ": --lora-scale 10 differs from the checkpoint's 20" + tail},
      {[](TrainConfig& t) { t.fine_tune_type = "full"; },
       ck + ": the checkpoint is a lora fine-tune, this run is full"},
  };
  for (const auto& cs : cases) {
    TrainConfig t = c;
    t.resume = c.adapter_path;
    t.iters = 3;
    cs.set(t);
    EXPECT_EQ(hearth::testing::error_of([&] { hearth::train::start_step(t); }), cs.want);
    // run_training refuses the same way, before a step runs or a file changes.
    const std::string before = hearth::io::read_file(c.adapter_path / "adapters.safetensors");
    auto m = ckpt_model();
    EXPECT_EQ(hearth::testing::error_of([&] { hearth::train::run_training(t, *m, ckpt_tok()); }), cs.want);
    EXPECT_TRUE(hearth::io::read_file(c.adapter_path / "adapters.safetensors") == before);
  }
}

TEST(TrainCheckpoint, AnOldCheckpointWithoutTheSettingsIsGuardedByItsParameters) {
  CkptTestDir d("old");
  TrainConfig c = ckpt_lora_config(d.path);
  {
    auto m = ckpt_model();
    hearth::train::run_training(c, *m, ckpt_tok());
  }
  nlohmann::json ck = hearth::io::read_json(c.adapter_path / "checkpoint.json");
  for (const char* key : {"num_layers", "lora_rank", "lora_scale", "lora_keys"}) {
    ASSERT_TRUE(ck.contains(key)) << key;
    ck.erase(key);
  }
  hearth::io::write_file_atomic(c.adapter_path / "checkpoint.json", ck.dump());
  const std::string opt = (c.adapter_path / ck["optimizer"].get<std::string>()).string();
  auto resume_error = [&](const std::function<void(TrainConfig&)>& set) {
    TrainConfig t = c;
    t.resume = c.adapter_path;
    t.iters = 3;
    set(t);
    EXPECT_EQ(hearth::train::start_step(t), 2);  // nothing recorded to compare
    auto m = ckpt_model();
    return hearth::testing::error_of([&] { hearth::train::run_training(t, *m, ckpt_tok()); });
  };
  const std::string hint = " (resume with the --num-layers / --lora-keys / --lora-rank of the run that wrote it)";
  // Fewer keys or layers: the checkpoint's other weights would have been dropped without a word.
  EXPECT_EQ(resume_error([](TrainConfig& t) { t.lora_keys = {"self_attn.q_proj"}; }),
            opt + ": holds parameter model.layers.0.mlp.down_proj.lora_A, which this run does not train" + hint);
  EXPECT_EQ(resume_error([](TrainConfig& t) { t.num_layers = 1; }),
            opt + ": holds parameter model.layers.0.mlp.down_proj.lora_A, which this run does not train" + hint);
  // More keys: a weight with no saved value.
  EXPECT_EQ(resume_error([](TrainConfig& t) {
              t.lora_keys = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                             "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "lm_head"};
            }),
            opt + ": no saved value for parameter lm_head.lora_A" + hint);
  // The same settings still resume.
  EXPECT_EQ(resume_error([](TrainConfig&) {}), "");
}

// A resume over other training data is named (a shrunk file failed with "data position (0, 7) is
// outside the dataset's 2 batches"; a grown one resumed silently into another data order).
TEST(TrainCheckpoint, ResumeOverChangedDataIsRefused) {
  CkptTestDir d("data_changed");
  TrainConfig c = ckpt_lora_config(d.path);
  {
    auto m = ckpt_model();
    hearth::train::run_training(c, *m, ckpt_tok());
  }
  EXPECT_EQ(hearth::io::read_json(c.adapter_path / "checkpoint.json")["batches"], 2);  // 4 rows, batches of 2
  std::string rows;
  for (int i = 0; i < 8; ++i) rows += R"({"text": "a grown data set row"})" "\n";
  hearth::io::write_file_atomic(d.path / "data" / "train.jsonl", rows);
  c.resume = c.adapter_path;
  c.iters = 4;
  auto m = ckpt_model();
  try {
    hearth::train::run_training(c, *m, ckpt_tok());
    ADD_FAILURE() << "resumed over other data";
  } catch (const hearth::Error& e) {
    EXPECT_NE(std::string(e.what()).find("changed since this checkpoint: 2 batches per epoch then, 4 now"),
              std::string::npos)
        << e.what();
  }
}
