// `hearth env`: prints the build's libtorch version and whether CUDA is usable (a setup check).
#include <iostream>

#include "cli/verb.h"
#include "core/torch_compat.h"

namespace {
std::function<int()> setup_env(CLI::App& app) {
  return [] {
    std::cout << "torch " << hearth::compat::torch_version() << "\n"
              << "cuda " << (hearth::compat::cuda_available() ? "available" : "unavailable") << "\n";
    return 0;
  };
}
}  // namespace
HEARTH_REGISTER_VERB(env, "env", "Print build and device information", setup_env);
