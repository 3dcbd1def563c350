// The one translation unit compiled with the source tree's path (see source_dir.h).
#include "core/source_dir.h"

namespace hearth {

const char* source_dir() { return HEARTH_SOURCE_DIR_LITERAL; }

}  // namespace hearth
