// `hearth serve` flags through the built binary: an empty --api-key is an error, binding a
// non-loopback address without a key warns on stderr (fake engine), and a --context-length above
// the model's is refused at start-up (tiny golden model), and SIGHUP is a clean stop.
#include <gtest/gtest.h>

#include <regex>

#include "../io/io_test_util.h"
#include "../test_util.h"
#include "test_paths.h"

namespace {

namespace fs = std::filesystem;
using hearth::testing::TempDir;

TEST(ServeCli, EmptyApiKeyIsAnError) {
  for (const char* key : {"''", "'a b'"}) {
    auto r = hearth::testing::run_hearth(std::string("serve --fake-engine --port 0 --api-key ") + key);
    EXPECT_NE(r.rc, 0) << r.out;
    EXPECT_NE(r.out.find("--api-key"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("serving"), std::string::npos) << r.out;
  }
}

TEST(ServeCli, AContextLengthAboveTheModelsIsRefusedInOneLineUnlessAllowed) {
  const std::string model = (fs::path(HEARTH_SOURCE_DIR) / "tests/golden/models/llama_mha").string();  // 256 positions
  auto r = hearth::testing::run_hearth("serve --model " + model + " --device cpu --port 0 --max-model-len 4096");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("--context-length (--max-model-len) 4096 is above the model's maximum context of 256 tokens "
                       "(config.json: max_position_embeddings 256)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("--allow-long-context"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("serving"), std::string::npos) << r.out;
  // A negative one is refused too (an attack found -5 served with the default).
  r = hearth::testing::run_hearth("serve --model " + model + " --device cpu --port 0 --context-length -5");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("--context-length: must be >= 0 (0 = the model's limit), got -5"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("serving"), std::string::npos) << r.out;
}

// Starts `hearth serve ARGS`, waits for its "serving" line, stops it, and returns its output.
std::string serve_output(const std::string& args, const TempDir& tmp) {
  const std::string log = (tmp.path() / "serve.log").string();
  const pid_t pid = hearth::testing::start_process(std::string(HEARTH_BINARY) + " serve --fake-engine --port 0 " + args, log);
  EXPECT_GT(pid, 0);
  const std::string url = hearth::testing::wait_for_log(log, std::regex(R"(serving \S+ on (http://\S+))"), pid, 60);
  EXPECT_FALSE(url.empty()) << hearth::testing::read_text(log);
  hearth::testing::stop_process(pid, SIGTERM, 10);
  return hearth::testing::read_text(log);
}

TEST(ServeCli, NonLoopbackBindWithoutAKeyWarns) {
  TempDir tmp;
  std::string out = serve_output("--host 0.0.0.0", tmp);
  EXPECT_NE(out.find("warning: serving on 0.0.0.0 without --api-key"), std::string::npos) << out;
  fs::remove(tmp.path() / "serve.log");
  out = serve_output("--host 0.0.0.0 --api-key k", tmp);
  EXPECT_EQ(out.find("warning"), std::string::npos) << out;
  fs::remove(tmp.path() / "serve.log");
  out = serve_output("--host 127.0.0.1", tmp);
  EXPECT_EQ(out.find("warning"), std::string::npos) << out;
}

// An IPv6 address is printed in brackets (curl could not use "http://::1:PORT"), "[::1]" binds
// ::1 (it was "cannot bind"), and an empty --host is refused (it bound and printed "http://:PORT").
TEST(ServeCli, Ipv6HostsAreBracketedInUrlsAndAnEmptyHostIsRefused) {
  auto r = hearth::testing::run_hearth("serve --fake-engine --port 0 --host ''");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("--host is empty"), std::string::npos) << r.out;
  if (std::system("grep -q '^00000000000000000000000000000001 ' /proc/net/if_inet6 2>/dev/null") != 0)
    GTEST_SKIP() << "no IPv6 loopback on this machine";
  TempDir tmp;
  for (const char* host : {"::1", "'[::1]'"}) {
    const std::string out = serve_output(std::string("--host ") + host, tmp);
    EXPECT_TRUE(std::regex_search(out, std::regex(R"(serving \S+ on http://\[::1\]:\d+ )"))) << out;
    fs::remove(tmp.path() / "serve.log");
  }
}

// SIGHUP (a closed terminal or ssh session) stops the server cleanly as SIGTERM does: it ended
// the process at once (exit 129), cutting open streams.
TEST(ServeCli, SighupIsACleanStop) {
  TempDir tmp;
  const std::string log = (tmp.path() / "serve.log").string();
  const pid_t pid = hearth::testing::start_process(std::string(HEARTH_BINARY) + " serve --fake-engine --port 0", log);
  ASSERT_GT(pid, 0);
  ASSERT_FALSE(hearth::testing::wait_for_log(log, std::regex(R"(serving \S+ on (http://\S+))"), pid, 60).empty())
      << hearth::testing::read_text(log);
  const int status = hearth::testing::stop_process(pid, SIGHUP, 20);
  ASSERT_TRUE(WIFEXITED(status)) << status << "\n" << hearth::testing::read_text(log);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_NE(hearth::testing::read_text(log).find("hearth: stopping (signal 1; a second one exits at once)"),
            std::string::npos)
      << hearth::testing::read_text(log);
}

}  // namespace
