// The range check of the CLI's numeric options (bench, serve): one validator that first says when a
// value is not a number at all, then whether it is in range. Not the options themselves.
#pragma once
#include <CLI/CLI.hpp>

#include <charconv>
#include <cstdint>
#include <limits>
#include <string>
#include <system_error>
#include <type_traits>

namespace hearth::cli {

/// Reads the whole of `v` as a base-10 T (a leading '+' allowed): std::errc() when it is one,
/// result_out_of_range when it is a decimal past T's range, invalid_argument otherwise.
template <typename T>
std::errc parse_decimal(const std::string& v, T& out) {
  const char* begin = v.data() + (!v.empty() && v[0] == '+' ? 1 : 0);
  const char* end = v.data() + v.size();
  const auto [stop, ec] = std::from_chars(begin, end, out);
  return begin == end || stop != end ? std::errc::invalid_argument : ec;
}

/// A CLI11 check for an option holding a T: "Failed parsing V as a INT" (or FLOAT) when V does not
/// parse as T (CLI11's own words), else "Value V not in range lo to hi" (CLI::Range's words) when V
/// is outside [lo, hi]; empty (accepted) otherwise. Plain CLI::Range reports a word as out of
/// range, since it runs before the conversion. An integer is read in base 10 with its overflow
/// checked (CLI11 2.1 reads it with strtoll/strtoull in base 0, which clamps 2^64 to INT64_MAX
/// and wraps -1 into an unsigned option); guard_integer_options hands it on in decimal.
template <typename T>
CLI::Validator number_in(T lo, T hi) {
  const CLI::Range range(lo, hi);
  return CLI::Validator(
      [range, lo, hi](std::string& v) -> std::string {
        if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          T x{};
          const std::errc ec = parse_decimal(v, x);
          const std::string range_text = " not in range " + std::to_string(lo) + " to " + std::to_string(hi);
          if (ec == std::errc::result_out_of_range) return "Value " + v + range_text;
          if (ec != std::errc()) return "Failed parsing " + v + " as a INT";
          if (x < lo || x > hi) return "Value " + v + range_text;
          return std::string();
        } else {
          std::string e = CLI::TypeValidator<T>()(v);
          return e.empty() ? range(v) : e;
        }
      },
      range.get_description());
}

/// The check of a --seed option: any 64-bit signed integer, as the server's `seed` field takes
/// (a negative seed is used as its two's-complement bits); a number past int64 is refused instead
/// of wrapping silently.
inline CLI::Validator seed_number() {
  return number_in<int64_t>(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
}

/// Adds to every integer option of `app` (CLI11 type INT or UINT) a check that refuses a number
/// past 64 bits ("Value V not in range ...": CLI11 2.1 clamps it to the limit silently) and hands
/// a decimal on without leading zeros (CLI11 reads "010" as octal 8); anything that is not a base-10
/// integer ("0x10", "1e3") is refused, as the number_in checks refuse it. A UINT option also takes a
/// negative int64 (as --seed does: its two's-complement bits). Call after the options are added.
inline void guard_integer_options(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    const std::string type = opt->get_type_name();  // "INT", or "INT:<a check's description>"
    const auto named = [&](const std::string& t) { return type == t || type.rfind(t + ":", 0) == 0; };
    const bool is_int = named("INT"), is_uint = named("UINT");
    if (!is_int && !is_uint) continue;
    opt->transform(CLI::Validator(  // a transform: a check() runs on a copy of the value
        [is_uint](std::string& v) -> std::string {
          int64_t s = 0;
          uint64_t u = 0;
          const std::errc ec = parse_decimal(v, s);
          if (ec == std::errc()) {
            v = std::to_string(s);
            return std::string();
          }
          if (is_uint && parse_decimal(v, u) == std::errc()) {
            v = std::to_string(u);
            return std::string();
          }
          if (ec != std::errc::result_out_of_range)  // "0x10", "1e3", "ten": the number_in checks' words
            return "Failed parsing " + v + " as a " + (is_uint ? "UINT" : "INT");
          return "Value " + v + " not in range of a 64-bit " + (is_uint ? "unsigned " : "") + "integer";
        },
        ""));
  }
}

}  // namespace hearth::cli
