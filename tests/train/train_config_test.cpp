// train::check_config on values that would train garbage: a non-finite learning rate (inf wrote a
// NaN adapter) is refused with one line naming the flag.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "../test_util.h"
#include "train/trainer.h"

TEST(TrainConfigCheck, LearningRateMustBeFinite) {
  hearth::train::TrainConfig c;
  c.adapter_path = std::filesystem::temp_directory_path() / "hearth_train_config_test_absent";
  EXPECT_EQ(hearth::testing::error_of([&] { hearth::train::check_config(c); }), "");
  for (double lr : {std::numeric_limits<double>::infinity(), std::nan(""), -1e-3}) {
    c.learning_rate = lr;
    EXPECT_NE(hearth::testing::error_of([&] { hearth::train::check_config(c); }).find("--learning-rate must be a finite "
                                                                                      "number >= 0"),
              std::string::npos)
        << lr;
  }
}
