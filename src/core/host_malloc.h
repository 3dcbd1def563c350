// The process's malloc settings for inference on the CPU: glibc's malloc otherwise hands every
// freed activation above its (adaptive) mmap threshold back to the kernel and page-faults it in
// again on the next op. Not the ATen allocator and not device memory (core/device_memory.h).
#pragma once

namespace hearth {

/// Keeps freed host memory in the process (glibc only): mallopt M_MMAP_THRESHOLD = 32 MiB (the
/// most glibc takes; allocations below it come from the heap, not fresh mmaps) and
/// M_TRIM_THRESHOLD = 256 MiB (up to that much free heap stays mapped instead of being returned).
/// Measured on the 2-core CPU: the starter's 128-token prefill went from ~2,400 to ~3,900 tok/s
/// (page faults of fresh activations were ~20 % of its time; docs/benchmarks.md). Call it once,
/// early in main(). Does nothing, returning false, when HEARTH_MALLOC_TUNING=0, when the user set
/// glibc's own malloc tunables (GLIBC_TUNABLES with glibc.malloc.*, MALLOC_MMAP_THRESHOLD_,
/// MALLOC_TRIM_THRESHOLD_: theirs win), or off glibc; true when applied. Never throws.
bool tune_host_malloc();

}  // namespace hearth
