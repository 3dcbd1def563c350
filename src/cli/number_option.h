// The range check of the CLI's numeric options (bench, serve): one validator that first says when a
// value is not a number at all, then whether it is in range. Not the options themselves.
#pragma once
#include <CLI/CLI.hpp>

#include <string>

namespace hearth::cli {

/// A CLI11 check for an option holding a T: "Failed parsing V as a INT" (or FLOAT) when V does not
/// parse as T (CLI11's own words), else CLI::Range(lo, hi)'s "Value V not in range lo to hi" when
/// V is outside [lo, hi]; empty (accepted) otherwise. Plain CLI::Range reports a word as out of
/// range, since it runs before the conversion.
template <typename T>
CLI::Validator number_in(T lo, T hi) {
  const CLI::Range range(lo, hi);
  return CLI::Validator(
      [range](std::string& v) {
        std::string e = CLI::TypeValidator<T>()(v);
        return e.empty() ? range(v) : e;
      },
      range.get_description());
}

}  // namespace hearth::cli
