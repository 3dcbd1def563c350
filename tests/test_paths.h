// Paths the tests need that differ per build folder: the hearth binary under test. Kept out of
// the tests' compile flags (only test_paths.cpp gets it) so checkouts share compiler-cache entries.
#pragma once
#include "core/source_dir.h"

namespace hearth::test {

/// Absolute path of the `hearth` executable built beside these tests.
const char* hearth_binary();

}  // namespace hearth::test

/// The hearth executable under test, as a `const char*` expression.
#define HEARTH_BINARY (::hearth::test::hearth_binary())
