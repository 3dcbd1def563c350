// tune_host_malloc: glibc mallopt thresholds for CPU inference (see the header).
#include "core/host_malloc.h"

#include <cstdlib>
#include <cstring>

#include "core/env.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace hearth {

bool tune_host_malloc() {
#if defined(__GLIBC__)
  if (!env_switch_on("HEARTH_MALLOC_TUNING")) return false;
  if (const char* t = std::getenv("GLIBC_TUNABLES"); t != nullptr && std::strstr(t, "glibc.malloc.") != nullptr)
    return false;
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr || std::getenv("MALLOC_TRIM_THRESHOLD_") != nullptr) return false;
  const int mmap_ok = mallopt(M_MMAP_THRESHOLD, 32 << 20);
  const int trim_ok = mallopt(M_TRIM_THRESHOLD, 256 << 20);
  return mmap_ok == 1 && trim_ok == 1;
#else
  return false;
#endif
}

}  // namespace hearth
