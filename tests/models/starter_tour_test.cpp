// The shipped starter as a tour guide (issue 13): greedy answers of models/starter to a greeting,
// a question about itself, a Hearth how-to asked in a phrasing the training data holds out, and an
// out-of-scope question — non-empty, and naming what they must (measured on the whole held-out set
// by tools/eval_tour_guide.py: models/starter/MODEL_CARD.md). Guards against the v1 failure: an
// empty reply to "Hello".
#include <gtest/gtest.h>

#include <string>

#include "../test_util.h"
#include "test_paths.h"

namespace {

std::string starter_tour_answer(const std::string& question) {
  const std::string src = HEARTH_SOURCE_DIR;
  const auto r = hearth::testing::run_hearth("generate --model " + hearth::testing::shell_quote(src + "/models/starter") +
                                                 " --device cpu --max-tokens 60 --prompt " +
                                                 hearth::testing::shell_quote(question),
                                             /*merge_stderr=*/false);
  EXPECT_EQ(r.rc, 0) << r.out;
  return r.out;
}

}  // namespace

TEST(StarterTour, GreetsSaysWhatItIsAndAnswersHowTos) {
  const std::string hello = starter_tour_answer("Hello! How are you today?");
  EXPECT_NE(hello.find("Hearth"), std::string::npos) << hello;
  const std::string what = starter_tour_answer("What are you?");
  EXPECT_NE(what.find("starter model"), std::string::npos) << what;
  // "how would I put a model behind an API" is not a training phrasing of the serve topic.
  const std::string serve = starter_tour_answer("how would I put a model behind an API?");
  EXPECT_NE(serve.find("hearth serve"), std::string::npos) << serve;
  const std::string france = starter_tour_answer("What is the capital of France?");
  EXPECT_NE(france.find("only knows Hearth"), std::string::npos) << france;
  EXPECT_EQ(france.find("Paris"), std::string::npos) << france;
}
