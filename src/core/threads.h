// How many threads Hearth's CPU compute uses (ATen's intra-op pool, which its own kernels and
// single-threaded GEMM blocks share): physical cores by default, as llama.cpp and PyTorch do, or
// what the user asked. Not the server's HTTP threads (server/http_transport.h).
#pragma once
#include <cstdint>
#include <string>

namespace hearth {

/// Physical cores among the CPUs this process may run on (sched_getaffinity): distinct
/// (physical_package_id, core_id) pairs under /sys/devices/system/cpu/cpuN/topology/, so the SMT
/// siblings of a core count once. Falls back to the count of usable CPUs where that topology is not
/// readable, and to 1 when nothing is. Never throws.
int64_t physical_cores();

/// Sets the compute threads (at::set_num_threads) for a verb's `--threads` value: n ≥ 1 uses n;
/// 0 (the default) uses physical_cores() unless OMP_NUM_THREADS is set (the user's setting then
/// stands). Returns the count in use. Throws hearth::InvalidArgument naming `--threads` when n < 0
/// or n > 4096.
int64_t apply_threads(int64_t n);

}  // namespace hearth
