// Tests for core/error.h: messages are built as one line and carry the right exception type.
#include <gtest/gtest.h>

#include "core/error.h"

TEST(Error, CheckThrowsWithConcatenatedMessage) {
  try {
    HEARTH_CHECK(1 + 1 == 3, "config.json: field ", "hidden_size", " must be > 0, got ", -4);
    FAIL() << "no throw";
  } catch (const hearth::Error& e) {
    EXPECT_STREQ(e.what(), "config.json: field hidden_size must be > 0, got -4");
  }
}

TEST(Error, CheckTypedThrowsSubclass) {
  EXPECT_THROW(HEARTH_CHECK_T(hearth::NotFound, false, "x"), hearth::NotFound);
  EXPECT_NO_THROW(HEARTH_CHECK(true, "unused"));
}
