#include "core/env.h"

#include <cstdlib>
#include <cstring>

namespace hearth {

bool env_equals(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

bool env_switch_on(const char* name) { return !env_equals(name, "0"); }

}  // namespace hearth
