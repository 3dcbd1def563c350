// The long-context training flags through the built binary: `train` and `bench-train` reject bad
// --mlp-chunk / --offload-boundaries / --offload-host-limit / --max-backward-segments values with one
// stderr line naming the flag (before any model loads), and `bench-train` runs a cell with them on a
// tiny model on the CPU (whole steps: tokens/s, peak and boundary bytes; partial: the segment times).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "../io/io_test_util.h"
#include "cli_run_util.h"
#include "../test_util.h"
#include "io/atomic_file.h"
#include "test_paths.h"

namespace {

namespace fs = std::filesystem;
using hearth::testing::shell_quote;
using hearth::testing::TempDir;

using LongCtxRun = hearth::testing::CliRunResult;

LongCtxRun run_long_ctx_cli(const std::string& args, const TempDir& scratch) { return hearth::testing::run_hearth_cli(args, scratch); }

void expect_long_ctx_error(const LongCtxRun& r, const std::string& needle) { hearth::testing::expect_one_line_cli_error(r, needle); }

std::string long_ctx_model() { return shell_quote((fs::path(HEARTH_SOURCE_DIR) / "tests/golden/models/llama_mha").string()); }

}  // namespace

TEST(LongContextCli, TrainRejectsBadValuesInOneLine) {
  TempDir d;
  const std::string base = "train --model " + long_ctx_model() + " --data " + shell_quote((d / "data").string()) +
                           " --adapter-path " + shell_quote((d / "out").string()) + " --device cpu ";
  expect_long_ctx_error(run_long_ctx_cli(base + "--segment-size 1 --mlp-chunk -5", d), "--mlp-chunk must be >= 0 (0 = off), got -5");
  expect_long_ctx_error(run_long_ctx_cli(base + "--offload-boundaries", d), "--offload-boundaries needs --segment-size >= 1");
  expect_long_ctx_error(run_long_ctx_cli(base + "--segment-size 1 --offload-host-limit 4", d),
                        "--offload-host-limit needs --offload-boundaries");
  expect_long_ctx_error(run_long_ctx_cli(base + "--segment-size 1 --offload-boundaries --offload-host-limit -1", d),
                        "--offload-host-limit must be a number of GB >= 0");
  expect_long_ctx_error(run_long_ctx_cli(base + "--mlp-chunk 64 --lora-dropout 0.1", d), "use --lora-dropout 0 or --mlp-chunk 0");
  EXPECT_FALSE(fs::exists(d / "out"));
}

TEST(LongContextCli, BenchTrainRejectsBadValuesInOneLine) {
  TempDir d;
  const std::string base = "bench-train --model " + shell_quote((d / "no_model").string()) + " --device cpu ";
  expect_long_ctx_error(run_long_ctx_cli(base + "--mlp-chunk -5", d), "--mlp-chunk must be >= 0 (0 = off), got -5");
  expect_long_ctx_error(run_long_ctx_cli(base + "--max-backward-segments -1", d), "--max-backward-segments must be >= 0");
  expect_long_ctx_error(run_long_ctx_cli(base + "--offload-host-limit 2", d), "--offload-host-limit needs --offload-boundaries");
}

TEST(LongContextCli, BenchTrainRunsOffloadedChunkedCellsAndPartialSteps) {
  TempDir d;
  const std::string base = "bench-train --model " + long_ctx_model() +
                           " --device cpu --seq-lens 48 --segment-sizes 1 --offload-boundaries --mlp-chunk 16 ";
  const LongCtxRun whole = run_long_ctx_cli(base + "--steps 1", d);
  ASSERT_EQ(whole.rc, 0) << whole.err;
  EXPECT_NE(whole.out.find("boundaries offloaded, MLP chunk 16"), std::string::npos) << whole.out;
  EXPECT_NE(whole.out.find("peak GB  boundaries GB (device / host)"), std::string::npos) << whole.out;
  EXPECT_NE(whole.out.find("     48        1  "), std::string::npos) << whole.out;
  const LongCtxRun part = run_long_ctx_cli(base + "--max-backward-segments 1", d);
  ASSERT_EQ(part.rc, 0) << part.err;
  EXPECT_NE(part.out.find("PARTIAL: 1 of 2 backward segments; forward + loss head "), std::string::npos) << part.out;
  EXPECT_NE(part.out.find("peak so far "), std::string::npos) << part.out;
}
