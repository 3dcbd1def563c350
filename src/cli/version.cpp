// `hearth env`: prints Hearth's version, the build's libtorch version, whether CUDA is usable and
// the CPU's physical cores (the default --threads): a setup check, and what a bug report needs.
#include <iostream>

#include "cli/verb.h"
#include "core/threads.h"
#include "core/torch_compat.h"

namespace {
std::function<int()> setup_env(CLI::App& app) {
  return [] {
    std::cout << "hearth " << hearth::cli::kVersion << "\n"
              << "torch " << hearth::compat::torch_version() << "\n"
              << "cuda " << (hearth::compat::cuda_available() ? "available" : "unavailable") << "\n"
              << "cpu physical cores " << hearth::physical_cores() << " (the default --threads)\n";
    return 0;
  };
}
}  // namespace
HEARTH_REGISTER_VERB(env, "env", "Print build and device information", setup_env);
