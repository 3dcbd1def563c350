// tune_host_malloc: its opt-outs, and that after it a freed multi-MiB block is reused from the heap
// instead of being mapped afresh (glibc).
#include "core/host_malloc.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace {

// Sets (or unsets, value nullptr) an environment variable for the scope's life.
class HostMallocEnv {
 public:
  HostMallocEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~HostMallocEnv() {
    if (had_) setenv(name_, old_.c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

}  // namespace

TEST(HostMalloc, OptOutsLeaveMallocAlone) {
#if !defined(__GLIBC__)
  GTEST_SKIP() << "glibc only";
#else
  HostMallocEnv a("GLIBC_TUNABLES", nullptr), b("MALLOC_MMAP_THRESHOLD_", nullptr), c("MALLOC_TRIM_THRESHOLD_", nullptr);
  {
    HostMallocEnv off("HEARTH_MALLOC_TUNING", "0");
    EXPECT_FALSE(hearth::tune_host_malloc());
  }
  {
    HostMallocEnv theirs("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1000");
    EXPECT_FALSE(hearth::tune_host_malloc());
  }
  {
    HostMallocEnv theirs("MALLOC_TRIM_THRESHOLD_", "1000");
    EXPECT_FALSE(hearth::tune_host_malloc());
  }
  {
    HostMallocEnv other("GLIBC_TUNABLES", "glibc.pthread.rseq=0");  // not a malloc tunable
    EXPECT_TRUE(hearth::tune_host_malloc());
  }
#endif
}

TEST(HostMalloc, FreedBlocksStayInTheHeap) {
#if !defined(__GLIBC__)
  GTEST_SKIP() << "glibc only";
#else
  HostMallocEnv a("GLIBC_TUNABLES", nullptr), b("HEARTH_MALLOC_TUNING", nullptr);
  ASSERT_TRUE(hearth::tune_host_malloc());
  // 16 MiB: above glibc's default mmap threshold (128 KiB, adaptive up to 32 MiB) but below 32 MiB.
  const size_t n = size_t{16} << 20;
  const size_t mapped_before = mallinfo2().hblkhd;
  void* p = std::malloc(n);
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, n);
  EXPECT_LT(mallinfo2().hblkhd, mapped_before + n) << "the block was mmapped";
  std::free(p);
#endif
}
