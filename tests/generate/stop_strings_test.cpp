// StopMatcher: matches across token boundaries, holds back partial matches, releases them.
#include <gtest/gtest.h>

#include "generate/stop_strings.h"

namespace hearth::generate {
namespace {

// Pushes every piece, returns the concatenated emitted text (plus flush when no stop matched).
std::string run_stop(StopMatcher& m, const std::vector<std::string>& pieces, std::vector<std::string>* emitted = nullptr) {
  std::string out;
  for (const auto& p : pieces) {
    auto r = m.push(p);
    if (emitted) emitted->push_back(r.text);
    out += r.text;
    if (r.stopped) return out;
  }
  return out + m.flush();
}

TEST(StopMatcher, NoStopsPassesEverythingThrough) {
  StopMatcher m({});
  EXPECT_EQ(m.push("abc").text, "abc");
  EXPECT_EQ(m.held(), 0u);
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, EmptyStopStringsAreIgnored) {
  StopMatcher m({"", "X"});
  ASSERT_EQ(m.stops().size(), 1u);
  EXPECT_EQ(run_stop(m, {"aXb"}), "a");
}

TEST(StopMatcher, MatchInsideOnePiece) {
  StopMatcher m({"END"});
  auto r = m.push("Hello END world");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "Hello ");
  EXPECT_EQ(r.rest, " world");
  EXPECT_TRUE(m.stopped());
  EXPECT_FALSE(m.push("more").stopped);
  EXPECT_EQ(m.push("more").text, "");
}

TEST(StopMatcher, MatchAcrossTokenBoundariesHoldsBackPrefix) {
  StopMatcher m({"END"});
  std::vector<std::string> emitted;
  std::string out = run_stop(m, {"Hel", "lo E", "N", "D!"}, &emitted);
  EXPECT_EQ(out, "Hello ");
  ASSERT_EQ(emitted.size(), 4u);
  EXPECT_EQ(emitted[0], "Hel");
  EXPECT_EQ(emitted[1], "lo ");  // "E" held back
  EXPECT_EQ(emitted[2], "");     // "EN" held back
  EXPECT_EQ(emitted[3], "");     // "END" matched; "!" dropped
  EXPECT_TRUE(m.stopped());
}

TEST(StopMatcher, HeldTextIsReleasedWhenItStopsMatching) {
  StopMatcher m({"END"});
  EXPECT_EQ(m.push("xEN").text, "x");
  EXPECT_EQ(m.held(), 2u);
  EXPECT_EQ(m.push("X").text, "ENX");
  EXPECT_EQ(m.held(), 0u);
}

TEST(StopMatcher, OverlappingPrefixes) {
  // "aab" inside "aaab": the first 'a' can never start the match that completes.
  StopMatcher m({"aab"});
  std::vector<std::string> emitted;
  EXPECT_EQ(run_stop(m, {"a", "a", "a", "b", "tail"}, &emitted), "a");
  EXPECT_EQ(emitted, (std::vector<std::string>{"", "", "a", ""}));
}

TEST(StopMatcher, EarliestMatchWinsAmongSeveralStops) {
  StopMatcher m({"world", "lo"});
  auto r = m.push("hello world");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "hel");
  EXPECT_EQ(r.stop_index, 1u);
}

TEST(StopMatcher, SameStartPrefersTheFirstListed) {
  StopMatcher m({"ab", "abc"});
  auto r = m.push("xabc");
  EXPECT_EQ(r.text, "x");
  EXPECT_EQ(r.stop_index, 0u);
  EXPECT_EQ(r.rest, "c");
}

TEST(StopMatcher, LongestPossiblePrefixIsHeldForSeveralStops) {
  StopMatcher m({"###", "#!"});
  EXPECT_EQ(m.push("a##").text, "a");
  EXPECT_EQ(m.held(), 2u);
  auto r = m.push("!");  // "##!" contains "#!" at 1
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "#");
  EXPECT_EQ(r.stop_index, 1u);
}

TEST(StopMatcher, FlushReleasesHeldTailAtTheEnd) {
  StopMatcher m({"###"});
  EXPECT_EQ(m.push("a#").text, "a");
  EXPECT_EQ(m.push("#").text, "");
  EXPECT_EQ(m.flush(), "##");
  EXPECT_EQ(m.held(), 0u);
}

TEST(StopMatcher, Utf8StopAcrossPieces) {
  StopMatcher m({"→ fin"});
  EXPECT_EQ(run_stop(m, {"café ", "→", " f", "in", " après"}), "café ");
}

TEST(StopMatcher, SameOutputRegardlessOfPieceSplit) {
  const std::string text = "one two <stop> three";
  for (size_t n = 1; n <= text.size(); ++n) {
    StopMatcher m({"<stop>", "zzz"});
    std::vector<std::string> pieces;
    for (size_t i = 0; i < text.size(); i += n) pieces.push_back(text.substr(i, n));
    EXPECT_EQ(run_stop(m, pieces), "one two ") << "piece size " << n;
  }
}

}  // namespace
}  // namespace hearth::generate
