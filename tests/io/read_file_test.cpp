// io/read_file: regular files only (a FIFO fails at once, a device is refused), per-kind size caps
// checked before reading (a sparse file costs nothing), symlink loops named as such, confinement of
// real paths to allowed folders, and JSON errors that do not quote the file.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <functional>

#include "core/error.h"
#include "io/hf_config.h"
#include "io/read_file.h"
#include "io/safetensors.h"
#include "io_test_util.h"

namespace {
namespace fs = std::filesystem;
using hearth::testing::TempDir;
using hearth::testing::write_bytes;

std::string read_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const hearth::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(ReadFile, ReadsRegularFiles) {
  TempDir d;
  write_bytes(d / "a.json", "{\"x\": 1}");
  EXPECT_EQ(hearth::io::read_file(d / "a.json"), "{\"x\": 1}");
  EXPECT_EQ(hearth::io::read_json(d / "a.json")["x"], 1);
  write_bytes(d / "empty", "");
  EXPECT_EQ(hearth::io::read_file(d / "empty"), "");
}

TEST(ReadFile, FifoFailsAtOnceInsteadOfHanging) {
  TempDir d;
  ASSERT_EQ(::mkfifo((d / "config.json").c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = read_error_of([&] { hearth::io::read_json(d / "config.json"); });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_NE(msg.find("config.json: not a regular file (a FIFO)"), std::string::npos) << msg;
  EXPECT_NE(read_error_of([&] { hearth::io::SafetensorsFile::open(d / "config.json"); }).find("not a regular file (a FIFO)"),
            std::string::npos);
}

TEST(ReadFile, DeviceBehindSymlinkIsRefused) {
  TempDir d;
  fs::create_symlink("/dev/zero", d / "tokenizer.json");
  const std::string msg = read_error_of([&] { hearth::io::read_file(d / "tokenizer.json", hearth::io::FileKind::kTokenizer); });
  EXPECT_NE(msg.find("tokenizer.json: not a regular file (a character device)"), std::string::npos) << msg;
  fs::create_symlink("/dev/zero", d / "model.safetensors");
  EXPECT_NE(read_error_of([&] { hearth::io::SafetensorsFile::open(d / "model.safetensors"); }).find("character device"),
            std::string::npos);
}

TEST(ReadFile, SizeCapIsCheckedBeforeReading) {
  TempDir d;
  // A sparse 1 GiB file: over every cap, costs no disk and must cost no memory.
  {
    write_bytes(d / "big.json", "{}");
    ASSERT_EQ(::truncate((d / "big.json").c_str(), off_t{1} << 30), 0);
  }
  const std::string msg = read_error_of([&] { hearth::io::read_json(d / "big.json"); });
  EXPECT_NE(msg.find("big.json: 1073741824 bytes, over the 64 MiB limit for a config file"), std::string::npos) << msg;
  EXPECT_NE(read_error_of([&] { hearth::io::read_file(d / "big.json", hearth::io::FileKind::kText); }).find("16 MiB"),
            std::string::npos);
  EXPECT_EQ(hearth::io::max_bytes(hearth::io::FileKind::kTokenizer), uint64_t{256} << 20);
}

TEST(ReadFile, SymlinkLoopIsNamed) {
  TempDir d;
  fs::create_symlink(d / "b.json", d / "a.json");
  fs::create_symlink(d / "a.json", d / "b.json");
  const std::string msg = read_error_of([&] { hearth::io::read_json(d / "a.json"); });
  EXPECT_NE(msg.find("a.json: cannot open (symlink loop"), std::string::npos) << msg;
  EXPECT_TRUE(hearth::io::entry_exists(d / "a.json"));
  // A missing file is still NotFound.
  EXPECT_THROW(hearth::io::read_file(d / "nope.json"), hearth::NotFound);
  EXPECT_NE(read_error_of([&] { hearth::io::read_file(d / "nope.json"); }).find("nope.json: cannot open (no such file)"),
            std::string::npos);
  EXPECT_NE(read_error_of([&] { hearth::io::read_file(d.path()); }).find("not a regular file (a folder)"), std::string::npos);
}

TEST(ReadFile, RootsConfineTheRealPath) {
  TempDir d;
  fs::create_directories(d / "allowed" / "ad");
  fs::create_directories(d / "outside");
  write_bytes(d / "outside" / "secret.json", "{\"secret\": 1}");
  write_bytes(d / "allowed" / "ad" / "ok.json", "{\"ok\": 1}");
  fs::create_symlink(d / "outside" / "secret.json", d / "allowed" / "ad" / "link.json");
  fs::create_symlink(d / "allowed" / "ad" / "ok.json", d / "allowed" / "ad" / "inner_link.json");
  const hearth::io::Roots roots = {d / "allowed"};
  EXPECT_EQ(hearth::io::read_json(d / "allowed" / "ad" / "ok.json", hearth::io::FileKind::kConfig, roots)["ok"], 1);
  EXPECT_EQ(hearth::io::read_json(d / "allowed" / "ad" / "inner_link.json", hearth::io::FileKind::kConfig, roots)["ok"],
            1);
  const std::string msg = read_error_of(
      [&] { hearth::io::read_json(d / "allowed" / "ad" / "link.json", hearth::io::FileKind::kConfig, roots); });
  EXPECT_NE(msg.find("link.json: resolves (through a symlink) to a file outside the allowed folders"), std::string::npos)
      << msg;
  EXPECT_EQ(msg.find("secret"), std::string::npos) << msg;
  // "/allowedX" is not under "/allowed".
  EXPECT_TRUE(hearth::io::path_is_under("/a/b/c", "/a/b"));
  EXPECT_TRUE(hearth::io::path_is_under("/a/b", "/a/b/"));
  EXPECT_FALSE(hearth::io::path_is_under("/a/bc", "/a/b"));
  EXPECT_FALSE(hearth::io::path_is_under("/a", "/a/b"));
}

TEST(ReadFile, JsonErrorsDoNotQuoteTheFile) {
  TempDir d;
  write_bytes(d / "adapter_config.json", "root:x:0:0:root:/root:/bin/bash\n");
  const std::string msg = read_error_of([&] { hearth::io::read_json(d / "adapter_config.json"); });
  EXPECT_NE(msg.find("adapter_config.json: invalid JSON (parse error at line 1, column 1"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("root"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("last read"), std::string::npos) << msg;
}
