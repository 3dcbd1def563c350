// core/env.h: the environment switches' two readings.
#include <gtest/gtest.h>

#include <cstdlib>

#include "core/env.h"

TEST(Env, EqualsAndDefaultOnSwitch) {
  const char* name = "HEARTH_ENV_TEST_SWITCH";
  ::unsetenv(name);
  EXPECT_FALSE(hearth::env_equals(name, "0"));
  EXPECT_TRUE(hearth::env_switch_on(name));  // unset: on
  ::setenv(name, "0", 1);
  EXPECT_TRUE(hearth::env_equals(name, "0"));
  EXPECT_FALSE(hearth::env_switch_on(name));
  ::setenv(name, "", 1);
  EXPECT_TRUE(hearth::env_switch_on(name));  // empty: on
  ::setenv(name, "00", 1);
  EXPECT_TRUE(hearth::env_switch_on(name));  // only exactly "0" switches it off
  EXPECT_FALSE(hearth::env_equals(name, "0"));
  ::setenv(name, "nocapture", 1);
  EXPECT_TRUE(hearth::env_equals(name, "nocapture"));
  EXPECT_FALSE(hearth::env_equals(name, "nocap"));
  ::unsetenv(name);
}
