// The `--threads` option the compute verbs share (generate, chat, serve, bench, bench-train,
// train, eval). Not what the value does (core/threads.h).
#pragma once
#include <CLI/CLI.hpp>

#include <cstdint>

namespace hearth::cli {

/// Adds `--threads N` to a verb's options: CPU compute threads, 0 = the physical cores (the
/// default; OMP_NUM_THREADS, when set, stands instead). main() applies it (apply_threads) before
/// any verb runs, so the verbs need not.
void add_threads_option(CLI::App& app);

/// The value parsed into any verb's --threads (0 when none was given).
int64_t threads_option();

}  // namespace hearth::cli
