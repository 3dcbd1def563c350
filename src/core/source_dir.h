// Where the source tree of this build lives (for the bundled starter model and for tests' golden
// files). Kept out of every translation unit's compile flags so that builds of different
// checkouts share compiler-cache entries; only source_dir.cpp is compiled with the path.
#pragma once

namespace hearth {

/// The absolute path of the source tree this binary was built from (CMAKE_SOURCE_DIR), e.g.
/// "/home/me/hearth". Never null; the folder may have moved since the build.
const char* source_dir();

}  // namespace hearth

/// The source tree as a `const char*` expression (fs::path(HEARTH_SOURCE_DIR) / "tests/...").
#define HEARTH_SOURCE_DIR (::hearth::source_dir())
