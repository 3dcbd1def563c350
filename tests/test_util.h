// Small helpers shared by tests of several folders. Not used by library code.
#pragma once
#include <functional>
#include <string>

#include "core/error.h"

namespace hearth::testing {

/// The message of the hearth::Error that `f` throws, or "" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const hearth::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace hearth::testing
