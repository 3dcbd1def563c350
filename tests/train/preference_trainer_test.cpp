// Preference data (tokenization of text / messages prompts and text / message responses, left
// truncation, doubled BOS, one-line errors naming file:line and field) and preference training
// through run_training and `hearth train --method dpo|orpo` on the tiny golden model: the loss
// falls, metrics are reported, the adapter is written; DPO with a full fine-tune; resume.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "adapters/adapter.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "io/hf_config.h"
#include "train/loss.h"
#include "train/preference_data.h"
#include "train/trainer.h"
#include "train_test_util.h"
#include "test_paths.h"

using namespace hearth::train;
using namespace hearth::train::testing;
namespace fs = std::filesystem;

namespace {

struct PrefTempDir {
  fs::path path;
  explicit PrefTempDir(const std::string& name) : path(fs::temp_directory_path() / ("hearth_pref_" + name)) {
    hearth::io::remove_tree(path);
    fs::create_directories(path);
  }
  ~PrefTempDir() { hearth::io::remove_tree(path); }
  fs::path write(const std::string& file, const std::string& text) const {
    hearth::io::write_file_atomic(path / file, text);
    return path / file;
  }
};

const fs::path kPrefTiny = golden("models/llama_mha");
hearth::tokenizer::Tokenizer pref_tiny() { return hearth::tokenizer::Tokenizer::from_dir(kPrefTiny); }

hearth::tokenizer::Tokenizer pref_tiny_chat(const PrefTempDir& d) {
  fs::copy_file(kPrefTiny / "tokenizer.json", d.path / "tokenizer.json", fs::copy_options::overwrite_existing);
  d.write("tokenizer_config.json", R"({"bos_token": "<|bos|>", "eos_token": "<|endoftext|>", "chat_template":
    "{% for m in messages %}<|bos|>{{ m.role }}:\n{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<|bos|>assistant:\n{% endif %}"})");
  return hearth::tokenizer::Tokenizer::from_dir(d.path);
}

std::string tail_text(const hearth::tokenizer::Tokenizer& tok, const Example& e) {
  return tok.decode(std::vector<int32_t>(e.tokens.begin() + e.prompt_len, e.tokens.end()), false);
}

std::string pref_error_of(const fs::path& file, const hearth::tokenizer::Tokenizer& tok, int64_t max_len = 512) {
  try {
    load_preference_jsonl(file, tok, max_len);
  } catch (const hearth::Error& e) {
    return e.what();
  }
  return "(no error)";
}

const char* kPairs[][3] = {
    {"Q: the color of the sky?", " blue", " the sky is made of green cheese"},
    {"Q: two plus two?", " four", " seven and a half"},
    {"Q: the opposite of hot?", " cold", " a very loud trumpet"},
    {"Q: a baby cat is a?", " kitten", " large truck"},
    {"Q: the capital of France?", " Paris", " a small purple sock"},
    {"Q: ice is frozen?", " water", " thunder over the hills"},
};

void write_pairs(const fs::path& dir) {
  std::string train;
  for (const auto& p : kPairs)
    train += nlohmann::json{{"prompt", p[0]}, {"chosen", p[1]}, {"rejected", p[2]}}.dump() + "\n";
  hearth::io::write_file_atomic(dir / "train.jsonl", train);
  hearth::io::write_file_atomic(dir / "valid.jsonl",
                                nlohmann::json{{"prompt", "Q: grass is?"}, {"chosen", " green"}, {"rejected", " loud"}}.dump() +
                                    "\n" + nlohmann::json{{"prompt", "Q: one plus one?"}, {"chosen", " two"}, {"rejected", " fish"}}.dump() + "\n");
}

TrainConfig pref_config(const fs::path& data, const fs::path& out, const std::string& method) {
  TrainConfig c;
  c.data_dir = data;
  c.adapter_path = out;
  c.method = method;
  c.lora_rank = 4;
  c.batch_size = 2;
  c.iters = 8;
  c.learning_rate = 2e-3;
  c.steps_per_report = 1;
  c.steps_per_eval = 4;
  c.save_every = 0;
  c.seed = 3;
  c.max_seq_length = 64;
  return c;
}

}  // namespace

TEST(PreferenceData, TextPromptAndTextResponses) {
  PrefTempDir d("text");
  auto tok = pref_tiny();
  auto ds = load_preference_jsonl(
      d.write("train.jsonl", R"({"prompt": "Question: one", "chosen": " two", "rejected": " three four"})" "\n"), tok, 512);
  ASSERT_EQ(ds.pairs.size(), 1u);
  const auto& p = ds.pairs[0];
  const auto prompt = tok.encode("Question: one", true);
  EXPECT_EQ(p.chosen.prompt_len, static_cast<int64_t>(prompt.size()));
  EXPECT_EQ(p.rejected.prompt_len, static_cast<int64_t>(prompt.size()));
  auto want = tok.encode("Question: one two", true);
  want.push_back(*tok.eos_id());
  EXPECT_EQ(p.chosen.tokens, want);
  EXPECT_EQ(tail_text(tok, p.rejected), " three four<|endoftext|>");
  EXPECT_TRUE(p.chosen.loss_mask.empty());
  EXPECT_EQ(ds.lengths(), std::vector<int64_t>{static_cast<int64_t>(p.rejected.tokens.size())});

  // A batch: chosen rows first, rejected after, labels on responses, full labels on every real token.
  PreferenceBatch b = make_preference_batch(ds, {0});
  ASSERT_EQ(b.input_ids.size(0), 2);
  EXPECT_EQ(b.pairs, 1);
  const int64_t nc = static_cast<int64_t>(p.chosen.tokens.size());
  EXPECT_EQ(b.labels[0].ne(kIgnoreIndex).sum().item<int64_t>(), nc - p.chosen.prompt_len);
  EXPECT_EQ(b.full_labels[0].ne(kIgnoreIndex).sum().item<int64_t>(), nc);
  EXPECT_EQ(b.full_labels[1].ne(kIgnoreIndex).sum().item<int64_t>(), static_cast<int64_t>(p.rejected.tokens.size()));
  EXPECT_EQ(b.labels[0][p.chosen.prompt_len].item<int64_t>(), p.chosen.tokens[p.chosen.prompt_len]);
  EXPECT_EQ(b.labels[0][p.chosen.prompt_len - 1].item<int64_t>(), kIgnoreIndex);
}

TEST(PreferenceData, MessagesPromptWithTextAndMessageResponses) {
  PrefTempDir d("chat");
  auto tok = pref_tiny_chat(d);
  auto ds = load_preference_jsonl(
      d.write("train.jsonl",
              R"({"prompt": [{"role": "user", "content": "hi"}], "chosen": "hello", "rejected": {"role": "assistant", "content": "go away"}})"
              "\n"
              R"({"messages": [{"role": "user", "content": "hi"}], "chosen": [{"role": "assistant", "content": "yo"}], "rejected": "no"})"
              "\n"),
      tok, 512);
  ASSERT_EQ(ds.pairs.size(), 2u);
  const std::string prompt = "<|bos|>user:\nhi\n<|bos|>assistant:\n";
  const auto pids = tok.encode(prompt, false);
  // text response: the rendered prompt + the text, EOS appended
  EXPECT_EQ(ds.pairs[0].chosen.prompt_len, static_cast<int64_t>(pids.size()));
  EXPECT_EQ(tail_text(tok, ds.pairs[0].chosen), "hello<|endoftext|>");
  // message response: the template over prompt + message (its own turn end, no EOS added)
  EXPECT_EQ(ds.pairs[0].rejected.tokens, tok.encode("<|bos|>user:\nhi\n<|bos|>assistant:\ngo away\n", false));
  EXPECT_EQ(tail_text(tok, ds.pairs[0].rejected), "go away\n");
  EXPECT_EQ(tail_text(tok, ds.pairs[1].chosen), "yo\n");
  EXPECT_EQ(tail_text(tok, ds.pairs[1].rejected), "no<|endoftext|>");
}

TEST(PreferenceData, LeftTruncationAndDoubledBos) {
  PrefTempDir d("trunc");
  auto tok = pref_tiny();
  const std::string prompt = "one two three four five six seven eight nine ten";
  auto file = d.write("train.jsonl", nlohmann::json{{"prompt", prompt}, {"chosen", " yes"}, {"rejected", " no no no no"}}.dump() + "\n");
  auto full = load_preference_jsonl(file, tok, 512);
  const auto& c = full.pairs[0].chosen;
  const int64_t n = static_cast<int64_t>(c.tokens.size());
  // Cut 3 tokens: they come off the prompt's front.
  auto cut = load_preference_jsonl(file, tok, n - 3);
  EXPECT_EQ(cut.pairs[0].chosen.tokens, std::vector<int32_t>(c.tokens.begin() + 3, c.tokens.end()));
  EXPECT_EQ(cut.pairs[0].chosen.prompt_len, c.prompt_len - 3);
  EXPECT_EQ(cut.prompt_dropped, 0);
  // Cut into the response: the last max_len tokens, prompt_len 0, counted.
  const int64_t resp_r = static_cast<int64_t>(full.pairs[0].rejected.tokens.size()) - full.pairs[0].rejected.prompt_len;
  auto deep = load_preference_jsonl(file, tok, resp_r - 1);
  EXPECT_EQ(deep.pairs[0].rejected.prompt_len, 0);
  EXPECT_EQ(static_cast<int64_t>(deep.pairs[0].rejected.tokens.size()), resp_r - 1);
  EXPECT_EQ(deep.prompt_dropped, 1);
  // A prompt whose text starts with BOS, encoded with specials: one BOS kept.
  auto bos = load_preference_jsonl(
      d.write("bos.jsonl", nlohmann::json{{"prompt", "<|bos|>hi"}, {"chosen", " a"}, {"rejected", " b"}}.dump() + "\n"), tok, 512);
  ASSERT_GE(bos.pairs[0].chosen.tokens.size(), 2u);
  EXPECT_EQ(bos.pairs[0].chosen.tokens[0], *tok.bos_id());
  EXPECT_NE(bos.pairs[0].chosen.tokens[1], *tok.bos_id());
  auto want = tok.encode("hi a", true);
  want.push_back(*tok.eos_id());
  EXPECT_EQ(bos.pairs[0].chosen.tokens, want);
  EXPECT_EQ(bos.pairs[0].chosen.prompt_len, static_cast<int64_t>(tok.encode("hi", true).size()));
}

TEST(PreferenceData, BadRowsNameFileLineAndField) {
  PrefTempDir d("bad");
  auto tok = pref_tiny();
  const std::string ok = R"({"prompt": "a", "chosen": " b", "rejected": " c"})";
  struct Case {
    std::string row, want;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"prompt": "a", "chosen": " b"})", "train.jsonl:2: missing key \"rejected\""},
           {R"({"chosen": " b", "rejected": " c"})", "train.jsonl:2: missing key \"prompt\""},
           {R"({"prompt": 5, "chosen": " b", "rejected": " c"})", "train.jsonl:2: \"prompt\": must be a string or a non-empty messages array"},
           {R"({"prompt": "a", "chosen": 3, "rejected": " c"})", "train.jsonl:2: \"chosen\": must be a string, an assistant message"},
           {R"({"prompt": "a", "chosen": " b", "rejected": {"role": "assistant", "content": "x"}})",
            "train.jsonl:2: \"rejected\": is a message, but \"prompt\" is text"},
           {R"({"prompt": [{"role": "user", "content": "a"}], "chosen": " b", "rejected": " c"})",
            "train.jsonl:2: \"prompt\": is a messages array, but the tokenizer has no chat template"},
           {R"({"prompt": "a", "chosen": " b", "rejected": " c")", "train.jsonl:2: not valid JSON"},
           {R"([1, 2])", "train.jsonl:2: row must be a JSON object"},
       }) {
    const std::string e = pref_error_of(d.write("train.jsonl", ok + "\n" + c.row + "\n"), tok);
    EXPECT_EQ(e.rfind(c.want, 0), 0u) << "got: " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  // A message response with the wrong role (chat template present).
  PrefTempDir dc("bad_chat");
  auto chat = pref_tiny_chat(dc);
  const std::string e = pref_error_of(
      dc.write("train.jsonl", R"({"prompt": [{"role": "user", "content": "a"}], "chosen": {"role": "user", "content": "b"}, "rejected": "c"})" "\n"),
      chat);
  EXPECT_EQ(e, "train.jsonl:1: \"chosen\": a message response must have \"role\": \"assistant\"");
  EXPECT_EQ(pref_error_of(d.write("empty.jsonl", "\n"), tok).find("no rows") != std::string::npos, true);
  // SFT data refuses preference rows with a pointer to --method.
  try {
    load_jsonl(d.write("train.jsonl", ok + "\n"), tok, {});
    ADD_FAILURE() << "no error";
  } catch (const hearth::Error& err) {
    EXPECT_NE(std::string(err.what()).find("--method dpo"), std::string::npos) << err.what();
  }
}

TEST(PreferenceTrainer, DpoAndOrpoLoraLossFallsAndMetricsAreReported) {
  PrefTempDir d("lora");
  write_pairs(d.path);
  auto tok = pref_tiny();
  for (const char* method : {"dpo", "orpo"}) {
    for (int64_t seg : {0, 1}) {
      const fs::path out = d.path / (std::string(method) + std::to_string(seg));
      TrainConfig c = pref_config(d.path, out, method);
      c.segment_size = seg;
      if (std::string(method) == "orpo") c.learning_rate = 5e-3;
      auto model = hearth::models::load_model(kPrefTiny, {});
      TrainResult r = run_training(c, *model, tok);
      ASSERT_EQ(r.step_losses.size(), 8u);
      std::printf("[%s seg %lld] losses:", method, static_cast<long long>(seg));
      for (double l : r.step_losses) std::printf(" %.4f", l);
      std::printf("\n");
      if (std::string(method) == "dpo") EXPECT_NEAR(r.step_losses[0], std::log(2.0), 1e-6);  // B = 0: policy = reference
      const double first = (r.step_losses[0] + r.step_losses[1] + r.step_losses[2]) / 3;
      const double last = (r.step_losses[5] + r.step_losses[6] + r.step_losses[7]) / 3;
      EXPECT_LT(last, first) << method << " seg " << seg;
      const Report& rep = r.reports.back();
      ASSERT_EQ(rep.metrics.size(), std::string(method) == "orpo" ? 4u : 2u);
      EXPECT_EQ(rep.metrics[0].first, "accuracy");
      EXPECT_EQ(rep.metrics[1].first, "margin");
      EXPECT_GT(rep.metrics[1].second, 0) << method << ": the chosen side should be winning by the end";
      EXPECT_TRUE(rep.val_loss.has_value());
      EXPECT_GT(rep.tokens_per_second, 0);
      auto ad = hearth::adapters::load_adapter(out);
      EXPECT_EQ(ad.modules.size(), 14u);
      const std::string metrics = hearth::io::read_file(out / "metrics.jsonl");
      EXPECT_NE(metrics.find("\"accuracy\""), std::string::npos);
      if (std::string(method) == "orpo") EXPECT_NE(metrics.find("\"nll\""), std::string::npos);
    }
  }
}

TEST(PreferenceTrainer, SegmentedRunGivesTheSameLosses) {
  PrefTempDir d("seg_eq");
  write_pairs(d.path);
  auto tok = pref_tiny();
  std::vector<double> losses[2];
  for (int64_t seg : {0, 1}) {
    TrainConfig c = pref_config(d.path, d.path / ("o" + std::to_string(seg)), "dpo");
    c.iters = 4;
    c.segment_size = seg;
    auto model = hearth::models::load_model(kPrefTiny, {});
    losses[seg] = run_training(c, *model, tok).step_losses;
  }
  for (size_t i = 0; i < losses[0].size(); ++i) EXPECT_NEAR(losses[1][i], losses[0][i], 1e-6 * losses[0][i]) << i;
}

TEST(PreferenceTrainer, DpoFullFineTuneUsesThePrecomputedBaseReference) {
  PrefTempDir d("full");
  write_pairs(d.path);
  auto tok = pref_tiny();
  TrainConfig c = pref_config(d.path, d.path / "out", "dpo");
  c.fine_tune_type = "full";
  c.learning_rate = 1e-3;
  c.iters = 6;
  std::vector<std::string> notes;
  c.on_note = [&](const std::string& s) { notes.push_back(s); };
  auto model = hearth::models::load_model(kPrefTiny, {});
  TrainResult r = run_training(c, *model, tok);
  ASSERT_EQ(r.step_losses.size(), 6u);
  EXPECT_NEAR(r.step_losses[0], std::log(2.0), 1e-5);  // untouched weights: policy = reference
  EXPECT_LT(r.step_losses.back(), r.step_losses[0]);
  bool noted = false;
  for (const auto& n : notes) noted |= n.find("reference log-probs of 6 train + 2 valid pair(s)") != std::string::npos;
  EXPECT_TRUE(noted);
  EXPECT_TRUE(fs::exists(d.path / "out" / "adapters.safetensors"));
}

TEST(PreferenceTrainer, ResumeContinuesAndRefusesAnotherMethod) {
  PrefTempDir d("resume");
  write_pairs(d.path);
  auto tok = pref_tiny();
  TrainConfig c = pref_config(d.path, d.path / "whole", "orpo");
  c.iters = 6;
  auto m1 = hearth::models::load_model(kPrefTiny, {});
  const auto whole = run_training(c, *m1, tok).step_losses;
  TrainConfig a = c;
  a.adapter_path = d.path / "part";
  a.iters = 3;
  auto m2 = hearth::models::load_model(kPrefTiny, {});
  run_training(a, *m2, tok);
  TrainConfig b = c;
  b.adapter_path = d.path / "part";
  b.resume = d.path / "part";
  auto m3 = hearth::models::load_model(kPrefTiny, {});
  const auto rest = run_training(b, *m3, tok).step_losses;
  ASSERT_EQ(rest.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(rest[i], whole[3 + i], 1e-6 * whole[3 + i]) << i;
  TrainConfig other = b;
  other.method = "dpo";
  auto m4 = hearth::models::load_model(kPrefTiny, {});
  try {
    run_training(other, *m4, tok);
    ADD_FAILURE() << "no error";
  } catch (const hearth::Error& e) {
    EXPECT_NE(std::string(e.what()).find("trained with --method orpo, this run is --method dpo"), std::string::npos)
        << e.what();
  }
}

TEST(PreferenceTrainer, BadOptionsNameTheFlag) {
  TrainConfig c;
  c.adapter_path = "/tmp/hearth_pref_unused";
  const auto err = [&](const TrainConfig& x) {
    try {
      check_config(x);
    } catch (const hearth::Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  TrainConfig m = c;
  m.method = "ppo";
  EXPECT_EQ(err(m), "--method: 'ppo' is not sft, dpo or orpo");
  TrainConfig b = c;
  b.beta = 0;
  EXPECT_EQ(err(b).rfind("--beta must be", 0), 0u);
  TrainConfig l = c;
  l.orpo_lambda = -1;
  EXPECT_EQ(err(l).rfind("--orpo-lambda must be", 0), 0u);
  TrainConfig s = c;
  s.sft_scope = "prompt";
  EXPECT_EQ(err(s), "--sft-scope: 'prompt' is not response or full");
}

#ifdef HEARTH_BINARY
TEST(PreferenceCli, DpoRunsLossFallsAdapterWritten) {
  PrefTempDir d("cli");
  write_pairs(d.path);
  const fs::path out = d.path / "out";
  const std::string cmd = std::string(HEARTH_BINARY) + " train --method dpo --beta 0.2 --model " + kPrefTiny.string() +
                          " --data " + d.path.string() + " --adapter-path " + out.string() +
                          " --iters 10 --batch-size 2 --lora-rank 4 --learning-rate 2e-3 --steps-per-report 1"
                          " --segment-size 1 --device cpu > " + (d.path / "log.txt").string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  const std::string log = hearth::io::read_file(d.path / "log.txt");
  ASSERT_EQ(rc, 0) << log;
  std::printf("%s", log.c_str());
  EXPECT_NE(log.find("method dpo"), std::string::npos) << log;
  EXPECT_NE(log.find("accuracy"), std::string::npos) << log;
  EXPECT_NE(log.find("margin"), std::string::npos) << log;
  std::ifstream m(out / "metrics.jsonl");
  std::vector<double> train;
  for (std::string l; std::getline(m, l);) {
    auto j = nlohmann::json::parse(l);
    if (j.contains("train_loss")) train.push_back(j["train_loss"].get<double>());
  }
  ASSERT_EQ(train.size(), 10u);
  EXPECT_NEAR(train.front(), std::log(2.0), 1e-5);
  EXPECT_LT(train.back(), train.front());
  EXPECT_TRUE(fs::exists(out / "adapters.safetensors"));
  EXPECT_TRUE(fs::exists(out / "adapter_config.json"));

  // A bad row: one line naming the file, the line and the field; non-zero exit.
  hearth::io::write_file_atomic(d.path / "train.jsonl", R"({"prompt": "a", "chosen": 1, "rejected": "b"})" "\n");
  const std::string bad = std::string(HEARTH_BINARY) + " train --method orpo --model " + kPrefTiny.string() + " --data " +
                          d.path.string() + " --adapter-path " + (d.path / "bad").string() + " --device cpu > " +
                          (d.path / "bad.txt").string() + " 2>&1";
  EXPECT_NE(std::system(bad.c_str()), 0);
  EXPECT_NE(hearth::io::read_file(d.path / "bad.txt").find("train.jsonl:1: \"chosen\": must be a string"), std::string::npos)
      << hearth::io::read_file(d.path / "bad.txt");
  // --help lists the preference flags.
  const std::string help = std::string(HEARTH_BINARY) + " train --help > " + (d.path / "help.txt").string() + " 2>&1";
  std::system(help.c_str());
  const std::string h = hearth::io::read_file(d.path / "help.txt");
  for (const char* flag : {"--method", "--beta", "--orpo-lambda", "--sft-scope"}) EXPECT_NE(h.find(flag), std::string::npos) << flag;
}
#endif
