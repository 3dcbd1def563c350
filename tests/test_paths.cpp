// The one test translation unit compiled with the hearth binary's path (see test_paths.h).
#include "test_paths.h"

namespace hearth::test {

const char* hearth_binary() { return HEARTH_BINARY_LITERAL; }

}  // namespace hearth::test
