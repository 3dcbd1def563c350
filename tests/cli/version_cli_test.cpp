// `hearth env` and `--version` through the built binary (src/cli/version.cpp, main.cpp): what a
// bug report needs, each on its own line.
#include <gtest/gtest.h>

#include <string>

#include "cli_run_util.h"
#include "core/threads.h"

namespace {

TEST(VersionCli, EnvNamesHearthTorchCudaAndTheCores) {
  hearth::testing::TempDir d;
  const auto r = hearth::testing::run_hearth_cli("env", d);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out.rfind("hearth 0.1.0\ntorch ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("\ncuda "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\ncpu physical cores " + std::to_string(hearth::physical_cores()) + " (the default --threads)\n"),
            std::string::npos)
      << r.out;
  const auto v = hearth::testing::run_hearth_cli("--version", d);
  EXPECT_EQ(v.rc, 0);
  EXPECT_EQ(v.out, "hearth 0.1.0\n");
}

}  // namespace
