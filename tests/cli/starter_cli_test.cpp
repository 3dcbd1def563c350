// `hearth` with no verb (the main job, cli/starter.h) as a process: it serves a stand-in starter
// (a tiny golden model with a chat template and a 2-step LoRA adapter trained here by `hearth
// train` into adapters/chunk) found through HEARTH_STARTER on HEARTH_PORT=0, prints the URL and a
// curl line for the chunk adapter, answers a chat completion with "adapter": "chunk", and exits 0
// on SIGINT. Also: a missing starter or a bad HEARTH_PORT is one clear line and a non-zero exit,
// and `hearth --help` still prints the verbs.
#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>

#include "../io/io_test_util.h"
#include "../test_util.h"
#include "io/atomic_file.h"
#include "io/hf_config.h"
#include "test_paths.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using hearth::testing::run_hearth;
using hearth::testing::shell_quote;
using hearth::testing::TempDir;

const char* kTemplate =
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{% else %} {{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}";

// models/starter's shape from a golden model: the model files plus a chat template, and a LoRA
// adapter (mlx layout, as the real one) trained for 2 steps at adapters/chunk.
fs::path make_stand_in(const fs::path& root) {
  const fs::path starter = root / "starter";
  fs::copy(fs::path(HEARTH_SOURCE_DIR) / "tests/golden/models/llama_mha", starter, fs::copy_options::recursive);
  json cfg = hearth::io::read_json(starter / "tokenizer_config.json");
  cfg["chat_template"] = kTemplate;
  std::ofstream(starter / "tokenizer_config.json") << cfg.dump();
  fs::create_directories(root / "data");
  std::ofstream data(root / "data" / "train.jsonl");
  for (int i = 0; i < 4; ++i)
    data << json{{"prompt", "Split: The dog ran. It was fast."}, {"completion", R"(["The dog ran.","It was fast."])"}}.dump()
         << "\n";
  data.close();
  auto r = run_hearth("train --model " + shell_quote(starter.string()) + " --data " + shell_quote((root / "data").string()) +
                      " --adapter-path " + shell_quote((root / "run").string()) +
                      " --iters 2 --batch-size 2 --lora-rank 4 --num-layers -1 --learning-rate 1e-3 --device cpu");
  EXPECT_EQ(r.rc, 0) << r.out;
  fs::create_directories(starter / "adapters" / "chunk");
  for (const char* f : {"adapters.safetensors", "adapter_config.json"})
    fs::copy_file(root / "run" / f, starter / "adapters" / "chunk" / f);
  return starter;
}

// `env ENV hearth` (no verb), stdout and stderr merged; stdin closed.
hearth::testing::CliResult run_hearth_with_env(const std::string& env) {
  const std::string cmd = "env " + env + " " + std::string(HEARTH_BINARY) + " </dev/null 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  return {WEXITSTATUS(pclose(p)), out};
}

TEST(StarterCli, ServesTheStarterWithItsAdaptersAndStopsOnSigint) {
  TempDir tmp;
  const fs::path starter = make_stand_in(tmp.path());
  const std::string log = (tmp.path() / "hearth.log").string();
  const pid_t pid = hearth::testing::start_process(std::string(HEARTH_BINARY), log,
                                                   {{"HEARTH_STARTER", starter.string()}, {"HEARTH_PORT", "0"}});
  ASSERT_GT(pid, 0);
  const std::string port =
      hearth::testing::wait_for_log(log, std::regex(R"(serving starter on http://127\.0\.0\.1:(\d+))"), pid, 120);
  if (port.empty()) {
    hearth::testing::stop_process(pid, SIGKILL, 10);
    FAIL() << "no 'serving' line; log:\n" << hearth::testing::read_text(log);
  }
  // The printed curl line targets the same server and the chunk adapter, and is valid JSON.
  hearth::testing::wait_for_log(log, std::regex("curl http"), pid, 10);
  const std::string text = hearth::testing::read_text(log);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(text, m, std::regex("curl (http://127\\.0\\.0\\.1:" + port +
                                                    "/v1/chat/completions) -H 'Content-Type: application/json' -d ('[^\\n]*')")))
      << text;
  EXPECT_NE(text.find("http://127.0.0.1:" + port + "/"), std::string::npos) << text;  // the web chat address
  // What a shell makes of the printed -d argument (the body has apostrophes: quoting must hold).
  std::string shell_body;
  {
    FILE* p = popen(("printf '%s' " + m[2].str()).c_str(), "r");
    ASSERT_NE(p, nullptr);
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) shell_body.append(buf, n);
    ASSERT_EQ(pclose(p), 0) << m[2].str();
  }
  const json example = json::parse(shell_body);
  EXPECT_EQ(example["adapter"], "chunk");
  EXPECT_EQ(example["model"], "starter");
  EXPECT_EQ(example["messages"][0]["role"], "user");

  httplib::Client cl("127.0.0.1", std::stoi(port));
  cl.set_read_timeout(120, 0);
  auto health = cl.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  auto adapters = cl.Get("/v1/adapters");
  ASSERT_TRUE(adapters);
  ASSERT_EQ(adapters->status, 200) << adapters->body;
  const json list = json::parse(adapters->body);
  ASSERT_EQ(list["adapters"].size(), 1u) << adapters->body;
  EXPECT_EQ(list["adapters"][0]["id"], "chunk");

  json body = example;
  body["max_tokens"] = 8;
  auto r = cl.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json ans = json::parse(r->body);
  ASSERT_TRUE(ans["choices"][0]["message"]["content"].is_string()) << r->body;
  const json& usage = ans["usage"];
  EXPECT_GT(usage["prompt_tokens"].get<int>(), 20) << r->body;  // the chunking prompt
  EXPECT_GE(usage["completion_tokens"].get<int>(), 1) << r->body;
  EXPECT_LE(usage["completion_tokens"].get<int>(), 8) << r->body;
  EXPECT_EQ(usage["total_tokens"].get<int>(), usage["prompt_tokens"].get<int>() + usage["completion_tokens"].get<int>());
  // An adapter that is not mounted is the client's error.
  body["adapter"] = "ghost";
  r = cl.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;

  const int status = hearth::testing::stop_process(pid, SIGINT, 30);
  ASSERT_NE(status, -1) << "did not stop on SIGINT; log:\n" << hearth::testing::read_text(log);
  ASSERT_TRUE(WIFEXITED(status)) << hearth::testing::read_text(log);
  EXPECT_EQ(WEXITSTATUS(status), 0) << hearth::testing::read_text(log);
}

TEST(StarterCli, MissingStarterIsOneLineNamingTheFolderAndTheWayOut) {
  TempDir tmp;
  const std::string missing = (tmp.path() / "no_such_model").string();
  auto [rc, out] = run_hearth_with_env("HEARTH_STARTER=" + shell_quote(missing));
  EXPECT_EQ(rc, 1) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_NE(out.find("no starter model at " + missing), std::string::npos) << out;
  EXPECT_NE(out.find("hearth serve --model DIR"), std::string::npos) << out;
  EXPECT_NE(out.find("HEARTH_STARTER"), std::string::npos) << out;
}

TEST(StarterCli, BadPortAndHelp) {
  TempDir tmp;
  const fs::path starter = tmp.path() / "starter";
  fs::copy(fs::path(HEARTH_SOURCE_DIR) / "tests/golden/models/llama_mha", starter, fs::copy_options::recursive);
  auto [rc, out] = run_hearth_with_env("HEARTH_STARTER=" + shell_quote(starter.string()) + " HEARTH_PORT=80x");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("HEARTH_PORT='80x'"), std::string::npos) << out;

  auto help = run_hearth("--help");
  EXPECT_EQ(help.rc, 0) << help.out;
  for (const char* verb : {"serve", "generate", "train", "fuse"}) EXPECT_NE(help.out.find(verb), std::string::npos) << verb;
  EXPECT_NE(help.out.find("With no verb"), std::string::npos) << help.out;
}

}  // namespace
