// `hearth chat` through the built binary (src/cli/chat.cpp): a template that refuses a turn ends
// neither the session nor its history, and one that refuses --system says so at start-up.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "cli_run_util.h"
#include "io/atomic_file.h"

namespace {

namespace fs = std::filesystem;
using hearth::testing::shell_quote;
using hearth::testing::TempDir;

// Runs `hearth chat ARGS` with INPUT on stdin: exit code, stdout, stderr.
hearth::testing::CliRunResult chat(const std::string& input, const std::string& args, const TempDir& d) {
  const fs::path in = d / "chat_in.txt";
  hearth::io::write_file_atomic(in, input);
  return hearth::testing::run_hearth_cli("chat " + args, d, in.string());
}

// The tiny golden llama with a template that refuses system turns (as Gemma 2's does) and any
// message containing "bad".
fs::path refusing_model(const TempDir& d) {
  const fs::path dir = d / "m";
  fs::copy(fs::path(HEARTH_SOURCE_DIR) / "tests/golden/models/llama_mha", dir, fs::copy_options::recursive);
  fs::remove(dir / "chat_template.jinja");
  hearth::io::write_file_atomic(
      dir / "chat_template.jinja",
      "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
      "{% if 'bad' in m.content %}{{ raise_exception('no bad words') }}{% endif %}"
      "{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}");
  return dir;
}

TEST(ChatCli, ATurnTheTemplateRefusesLeavesTheSessionGoing) {
  TempDir d;
  const std::string model = "--model " + shell_quote(refusing_model(d).string()) + " --device cpu --max-tokens 3";
  // It exited 2 at the refused turn, the history lost, with the HTTP field's words.
  const auto r = chat("a bad word\nhello\n", model, d);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("hearth chat: the model's chat template could not render the conversation: "), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("no bad words"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("'messages'"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_FALSE(r.out.empty());  // the second turn was answered
  const auto s = chat("hello\n", model + " --system " + shell_quote("be nice"), d);
  hearth::testing::expect_one_line_cli_error(s, "--system: the model's chat template could not render the conversation: ");
  EXPECT_NE(s.err.find("System role not supported"), std::string::npos) << s.err;
}

}  // namespace
