// `hearth eval chunk` end to end on the tiny random model (tests/golden/models/llama_mha), with a
// chat template added and without one: the score is 100 × the mean of the per-example F1s it
// writes, the valid-JSON share matches the rows, and each output is exactly what `hearth generate`
// produces greedily for the same prompt (the engine's prompt path, not a copy of it).
#include <gtest/gtest.h>

#include "../test_util.h"
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>

#include "io/atomic_file.h"
#include "io/hf_config.h"
#include "test_paths.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
using hearth::testing::CliResult;
CliResult run_eval(const std::string& args, bool merge_stderr = true) {
  return hearth::testing::run_hearth(args, merge_stderr);
}
std::string quote_eval(const std::string& s) { return hearth::testing::shell_quote(s); }

}  // namespace

// Outside the anonymous namespace: the TEST_Fs derive from it (GCC's -Wsubobject-linkage in a
// unity batch otherwise).
class EvalChunkCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("hearth_evalchunk_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    hearth::io::remove_tree(dir_);
    fs::create_directories(dir_);
    prompts_ = {"Split: The cat sat. It purred.", "Split: Rain fell all day. We stayed in. Nobody minded.",
                "Split: \"Yes,\" she said. \"Go.\""};
    std::ofstream data(dir_ / "test.jsonl");
    data << json{{"prompt", prompts_[0]}, {"completion", R"(["The cat sat.", "It purred."])"}}.dump() << "\n"
         << json{{"prompt", prompts_[1]}, {"completion", R"(["Rain fell all day.", "We stayed in.", "Nobody minded."])"}}.dump() << "\n"
         << json{{"messages", {{{"role", "user"}, {"content", prompts_[2]}},
                               {{"role", "assistant"}, {"content", R"(["\"Yes,\" she said.", "\"Go.\""])"}}}}}.dump() << "\n";
  }
  void TearDown() override { hearth::io::remove_tree(dir_); }

  // Copies the tiny model, optionally adding a chat template to its tokenizer_config.json.
  fs::path model(bool with_template) {
    fs::path m = dir_ / (with_template ? "tmpl" : "raw");
    fs::copy(fs::path(HEARTH_SOURCE_DIR) / "tests/golden/models/llama_mha", m, fs::copy_options::recursive);
    if (with_template) {
      json cfg = hearth::io::read_json(m / "tokenizer_config.json");
      cfg["chat_template"] =
          "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
          "{% else %} {{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}";
      std::ofstream(m / "tokenizer_config.json") << cfg.dump();
    }
    return m;
  }

  void check(const fs::path& m, bool chat) {
    const fs::path res = dir_ / (m.filename().string() + "_res.jsonl");
    CliResult r = run_eval("eval chunk --model " + m.string() + " --data " + (dir_ / "test.jsonl").string() +
                      " --max-tokens 12 --device cpu --quiet --out " + res.string());
    ASSERT_EQ(r.rc, 0) << r.out;
    std::smatch sm;
    ASSERT_TRUE(std::regex_search(r.out, sm, std::regex(R"(chunk score: ([0-9.]+)/100 over 3 examples; valid JSON: ([0-9.]+)% \((\d)/3\))")))
        << r.out;
    const double score = std::stod(sm[1]), valid_pct = std::stod(sm[2]);
    const int valid = std::stoi(sm[3]);
    EXPECT_GE(score, 0.0);
    EXPECT_LE(score, 100.0);

    std::ifstream in(res);
    std::string line;
    double f1_sum = 0;
    int rows = 0, valid_rows = 0;
    while (std::getline(in, line)) {
      json row = json::parse(line);
      ASSERT_EQ(row["index"], rows);
      const double f1 = row["f1"];
      EXPECT_GE(f1, 0.0);
      EXPECT_LE(f1, 1.0);
      if (!row["valid_json"].get<bool>()) {
        EXPECT_EQ(f1, 0.0);
      }
      f1_sum += f1;
      valid_rows += row["valid_json"].get<bool>() ? 1 : 0;
      EXPECT_FALSE(row["reference"].empty());
      // The same greedy continuation `hearth generate` prints for this prompt.
      CliResult g = run_eval("generate --model " + m.string() + " --prompt " + quote_eval(prompts_[rows]) +
                            " --max-tokens 12 --temp 0 --device cpu" + (chat ? "" : " --ignore-chat-template"),
                        /*merge_stderr=*/false);
      ASSERT_EQ(g.rc, 0);
      EXPECT_EQ(row["output"].get<std::string>() + "\n", g.out) << rows;
      ++rows;
    }
    EXPECT_EQ(rows, 3);
    EXPECT_EQ(valid, valid_rows);
    EXPECT_NEAR(valid_pct, 100.0 * valid_rows / 3, 0.01);
    EXPECT_NEAR(score, 100.0 * f1_sum / 3, 0.01);
  }
  fs::path dir_;
  std::vector<std::string> prompts_;
};

TEST_F(EvalChunkCli, WithChatTemplate) { check(model(true), true); }

TEST_F(EvalChunkCli, RawPromptWithoutTemplate) { check(model(false), false); }

TEST_F(EvalChunkCli, BadInputIsOneLineError) {
  std::ofstream(dir_ / "bad.jsonl") << "{\"prompt\": \"x\", \"completion\": \"nope\"}\n";
  CliResult r = run_eval("eval chunk --model " + model(false).string() + " --data " + (dir_ / "bad.jsonl").string());
  EXPECT_NE(r.rc, 0);
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_NE(r.out.find("bad.jsonl:1: the completion is not a JSON array of strings"), std::string::npos) << r.out;
}

TEST_F(EvalChunkCli, PromptOverTheContextIsCountedNotHidden) {
  std::string prompt;
  for (int i = 0; i < 400; ++i) prompt += "word ";  // far beyond the tiny models' 256-token context
  std::ofstream(dir_ / "long.jsonl") << json{{"prompt", prompt}, {"completion", R"(["a"])"}}.dump() << "\n";
  CliResult r = run_eval("eval chunk --model " + model(false).string() + " --data " + (dir_ / "long.jsonl").string());
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("chunk score: 0.00/100 over 1 examples"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1 prompt(s) filled the 256-token context"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(prompt fills the context: not answered)"), std::string::npos) << r.out;
}

TEST_F(EvalChunkCli, OutCannotBeTheDataFile) {
  const fs::path data = dir_ / "same.jsonl";
  const std::string row = R"({"prompt": "x", "completion": "[\"a\"]"})";
  std::ofstream(data) << row << "\n" << row << "\n";
  const std::string m = model(false).string();
  CliResult r = run_eval("eval chunk --model " + m + " --data " + data.string() + " --out " + data.string() + " --max-tokens 2");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("is the --data file"), std::string::npos) << r.out;
  std::ifstream in(data);
  std::string all((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(all, row + "\n" + row + "\n");  // untouched
  // A folder, or a path in a missing folder, is refused before the evaluation (it failed at the
  // end, after every example, with "(Success)" as the reason).
  r = run_eval("eval chunk --model " + m + " --data " + data.string() + " --out " + dir_.string());
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("is a folder; give the path of a file to write"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("[1/"), std::string::npos) << r.out;
  r = run_eval("eval chunk --model " + m + " --data " + data.string() + " --out " + (dir_ / "no" / "such.jsonl").string());
  EXPECT_NE(r.out.find("does not exist"), std::string::npos) << r.out;
  // --data naming a folder said "no rows".
  r = run_eval("eval chunk --model " + m + " --data " + dir_.string());
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find(dir_.string() + ": is a folder; --data names a .jsonl file"), std::string::npos) << r.out;
}
