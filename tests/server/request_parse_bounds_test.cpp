// Integer request fields at the edge of int64: a float just past INT64_MAX (2^63, which INT64_MAX
// rounds to as a double) is refused instead of going through an undefined float → int64 cast.
#include <gtest/gtest.h>

#include "server/api_error.h"
#include "server/request_parse.h"

using namespace hearth::server;

TEST(RequestParseBounds, SeedPastInt64IsRefused) {
  const std::string m = R"("model": "x", "messages": [{"role": "user", "content": "hi"}])";
  for (const char* seed : {"9223372036854775808.0", "9.3e18", "1e300", "9223372036854775808"}) {
    try {
      parse_chat_request(parse_body("{" + m + ", \"seed\": " + seed + "}"));
      ADD_FAILURE() << "accepted seed " << seed;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      EXPECT_EQ(e.param(), "seed") << seed;
    }
  }
  auto r = parse_chat_request(parse_body("{" + m + R"(, "seed": -9223372036854775808.0})"));
  EXPECT_EQ(r.sampling.seed.value(), INT64_MIN);
  r = parse_chat_request(parse_body("{" + m + R"(, "seed": 9223372036854775807})"));
  EXPECT_EQ(r.sampling.seed.value(), INT64_MAX);
}
