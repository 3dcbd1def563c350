// io/atomic_dir.h: a folder written whole, never over one that is there.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "core/error.h"
#include "io/atomic_dir.h"
#include "io/atomic_file.h"
#include "io_test_util.h"

namespace {
namespace fs = std::filesystem;
using hearth::io::kPartialMarker;
using hearth::io::write_dir_atomic;

TEST(AtomicDir, TheTempFolderIsMarkedWhileItFillsAndTheResultIsNot) {
  hearth::testing::TempDir d;
  bool marked = false;
  write_dir_atomic(d / "out", /*replace=*/false, [&](const fs::path& tmp) {
    marked = fs::is_regular_file(tmp / kPartialMarker);
    hearth::io::write_file_atomic(tmp / "a.txt", "new");
  });
  EXPECT_TRUE(marked);
  EXPECT_EQ(hearth::io::read_file(d / "out" / "a.txt"), "new");
  EXPECT_FALSE(fs::exists(d / "out" / kPartialMarker));
  EXPECT_FALSE(fs::exists(hearth::io::temp_dir_for(d / "out")));
}

// A folder that appears at the target while the new one is written (another run to the same
// --out, a person) is kept as it is: it was moved aside and deleted. The result stays in the
// temp folder, which the error names, without the marker (no cleanup removes it).
TEST(AtomicDir, AFolderMadeWhileWritingIsNeverReplaced) {
  hearth::testing::TempDir d;
  const fs::path out = d / "out";
  const fs::path tmp = hearth::io::temp_dir_for(out);
  for (const bool empty : {false, true}) {
    SCOPED_TRACE(empty ? "empty folder" : "folder with a file");
    hearth::io::remove_tree(out);
    hearth::io::remove_tree(tmp);
    try {
      write_dir_atomic(out, /*replace=*/false, [&](const fs::path& t) {
        hearth::io::write_file_atomic(t / "a.txt", "new");
        fs::create_directories(out);
        if (!empty) hearth::io::write_file_atomic(out / "notes.txt", "mine");
      });
      ADD_FAILURE() << "no error";
    } catch (const hearth::Error& e) {
      EXPECT_NE(std::string(e.what()).find(out.string() + ": appeared while it was being written"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("the result is in " + tmp.string()), std::string::npos) << e.what();
    }
    EXPECT_EQ(fs::exists(out / "notes.txt"), !empty);
    EXPECT_FALSE(fs::exists(out / "a.txt"));
    EXPECT_EQ(hearth::io::read_file(tmp / "a.txt"), "new");
    EXPECT_FALSE(fs::exists(tmp / kPartialMarker));
  }
}

TEST(AtomicDir, ReplaceSwapsTheWholeFolder) {
  hearth::testing::TempDir d;
  const fs::path out = d / "out";
  fs::create_directories(out);
  hearth::io::write_file_atomic(out / "old.txt", "old");
  write_dir_atomic(out, /*replace=*/true,
                   [&](const fs::path& tmp) { hearth::io::write_file_atomic(tmp / "a.txt", "new"); });
  EXPECT_FALSE(fs::exists(out / "old.txt"));
  EXPECT_EQ(hearth::io::read_file(out / "a.txt"), "new");
  // not replace: a folder there before is refused before any work
  bool filled = false;
  EXPECT_THROW(write_dir_atomic(out, /*replace=*/false, [&](const fs::path&) { filled = true; }), hearth::Error);
  EXPECT_FALSE(filled);
}

}  // namespace
