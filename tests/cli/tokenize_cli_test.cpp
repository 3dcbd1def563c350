// `hearth tokenize` end to end: encode prints a one-line JSON array, --decode reads ids back,
// bad input exits non-zero with one line. Expected ids come from the tiny golden tokenizer's
// HF-made golden file (tests/golden/tokenizer/tiny.json), not from our own code.
#include <gtest/gtest.h>

#include "../test_util.h"
#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include "test_paths.h"

namespace fs = std::filesystem;

namespace {
using hearth::testing::CliResult;
CliResult run_tokenize(const std::string& args, bool merge_stderr = true) {
  return hearth::testing::run_hearth(args, merge_stderr);
}
std::string quote(const std::string& s) { return hearth::testing::shell_quote(s); }
}  // namespace

TEST(TokenizeCli, EncodeAndDecodeMatchGolden) {
  fs::path dir = fs::path(HEARTH_SOURCE_DIR) / "tests/golden/tokenizer";
  ASSERT_TRUE(fs::exists(dir / "tiny.json")) << "missing tiny tokenizer golden";
  nlohmann::json g = nlohmann::json::parse(std::ifstream(dir / "tiny.json"));
  std::string model = quote((dir / "tiny").string());
  int checked = 0;
  for (const auto& c : g["cases"]) {
    std::string text = c["text"];
    if (text.empty() || text.size() > 200 || text.find('\0') != std::string::npos || text[0] == '-') continue;
    CliResult enc = run_tokenize("tokenize --model " + model + " --special -- " + quote(text));
    ASSERT_EQ(enc.rc, 0) << enc.out;
    EXPECT_EQ(enc.out, c["ids"].dump() + "\n") << text;
    CliResult dec = run_tokenize("tokenize --model " + model + " --decode --special " + quote(c["ids"].dump()));
    ASSERT_EQ(dec.rc, 0) << dec.out;
    EXPECT_EQ(dec.out, c["decoded"].get<std::string>() + "\n") << text;
    if (++checked == 5) break;
  }
  EXPECT_EQ(checked, 5);
}

TEST(TokenizeCli, BadInputIsOneLineError) {
  std::string model = quote((fs::path(HEARTH_SOURCE_DIR) / "tests/golden/tokenizer/tiny").string());
  CliResult r = run_tokenize("tokenize --model " + model + " --decode '[1, \"x\"]'");
  EXPECT_NE(r.rc, 0);
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_NE(r.out.find("not a token id"), std::string::npos) << r.out;
  CliResult m = run_tokenize("tokenize --model /nonexistent x");
  EXPECT_NE(m.rc, 0);
  EXPECT_NE(m.out.find("/nonexistent: model folder not found"), std::string::npos) << m.out;
  // a file given as the folder (it said ".../config.json/tokenizer.json: cannot open")
  const std::string file = (fs::path(HEARTH_SOURCE_DIR) / "tests/golden/tokenizer/tiny/tokenizer.json").string();
  CliResult f = run_tokenize("tokenize --model " + quote(file) + " x");
  EXPECT_NE(f.rc, 0);
  EXPECT_NE(f.out.find(file + ": is a file, not a model folder"), std::string::npos) << f.out;
}
