// `scripts/setup run|test` in dry-run mode (HEARTH_SETUP_DRY_RUN=1) on a pretend machine where no
// package is installed (a stub dpkg-query, a PATH without node/npm): `run` would install only what
// building and running need, `test` everything the test suite uses. Installs nothing: the PATH
// it runs with holds no apt-get or sudo.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "../io/io_test_util.h"
#include "../test_util.h"
#include "test_paths.h"

namespace {

namespace fs = std::filesystem;
using hearth::testing::shell_quote;

const std::set<std::string> kRunPackages = {"build-essential", "cmake",       "ninja-build",        "pkg-config",
                                            "libtorch-dev",    "libcpp-httplib-dev", "nlohmann-json3-dev",
                                            "libpcre2-dev",    "libicu-dev",  "libcli11-dev",       "libopenblas0-pthread",
                                            "libgloo-dev"};

struct SetupRun {
  int rc;
  std::string out;
  std::set<std::string> would_install;  // the words after "would install:"
};

// Runs `bash scripts/setup ARGS` with PATH = a folder holding only dirname, grep and a dpkg-query
// that reports every package as not installed; stdout and stderr merged.
SetupRun dry_setup(const std::string& args) {
  hearth::testing::TempDir tmp;
  const fs::path bin = tmp.path() / "bin";
  fs::create_directories(bin);
  for (const char* tool : {"dirname", "grep"}) {
    for (const char* dir : {"/usr/bin/", "/bin/"}) {
      if (fs::exists(std::string(dir) + tool)) {
        fs::create_symlink(std::string(dir) + tool, bin / tool);
        break;
      }
    }
  }
  {
    std::ofstream f(bin / "dpkg-query");
    f << "#!/bin/sh\nexit 1\n";
  }
  fs::permissions(bin / "dpkg-query", fs::perms::owner_all);
  const std::string cmd = "env -i PATH=" + shell_quote(bin.string()) + " HEARTH_SETUP_DRY_RUN=1 /bin/bash " +
                          shell_quote((fs::path(HEARTH_SOURCE_DIR) / "scripts/setup").string()) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  SetupRun r{WEXITSTATUS(pclose(p)), out, {}};
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    const auto at = line.find("would install: ");
    if (at == std::string::npos) continue;
    std::istringstream words(line.substr(at + 15));
    for (std::string w; words >> w;) r.would_install.insert(w);
  }
  return r;
}

TEST(ScriptsSetup, RunModeWouldInstallOnlyWhatBuildingAndRunningNeed) {
  const auto r = dry_setup("run");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.would_install, kRunPackages) << r.out;
  EXPECT_NE(r.out.find("npm assets: not needed"), std::string::npos) << r.out;
}

TEST(ScriptsSetup, TestModeWouldInstallWhatTheTestsUseToo) {
  const auto r = dry_setup("test");
  ASSERT_EQ(r.rc, 0) << r.out;
  for (const auto& p : kRunPackages) EXPECT_TRUE(r.would_install.count(p)) << p << "\n" << r.out;
  for (const char* p : {"chromium", "libgtest-dev", "libgmock-dev", "libbenchmark-dev", "nodejs", "npm"})
    EXPECT_TRUE(r.would_install.count(p)) << p << "\n" << r.out;
  EXPECT_EQ(r.would_install.size(), kRunPackages.size() + 8) << r.out;  // + libcurl4-openssl-dev, xz-utils
}

TEST(ScriptsSetup, NoModeMeansTestAndAnUnknownModeIsRefused) {
  EXPECT_EQ(dry_setup("").would_install, dry_setup("test").would_install);
  const auto bad = dry_setup("tset");
  EXPECT_EQ(bad.rc, 2);
  EXPECT_NE(bad.out.find("unknown mode 'tset'"), std::string::npos) << bad.out;
  EXPECT_TRUE(bad.would_install.empty());
}

TEST(ScriptsSetup, RunAndTestScriptsAskForTheirMode) {
  const auto read = [](const char* name) {
    return hearth::testing::read_text((fs::path(HEARTH_SOURCE_DIR) / "scripts" / name).string());
  };
  EXPECT_NE(read("run").find("scripts/setup\" run"), std::string::npos);
  const std::string test = read("test");
  EXPECT_NE(test.find("scripts/setup\" test"), std::string::npos);
  // A build folder that scripts/run configured without GoogleTest gets the test suite.
  EXPECT_NE(test.find("HEARTH_REQUIRE_TESTS=1"), std::string::npos);
}

}  // namespace
