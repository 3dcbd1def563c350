// Self-registering CLI verbs: each src/cli/<verb>.cpp defines one Verb and registers it with
// HEARTH_REGISTER_VERB. main.cpp builds the CLI11 app from the registry; there is no verb switch.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace hearth::cli {

/// Hearth's version, as `--version` and `env` print it.
inline constexpr const char* kVersion = "0.1.0";

/// One verb: `setup` adds options to its subcommand and returns the action run when the verb is
/// chosen (the action returns the process exit code).
struct Verb {
  std::string name;
  std::string help;
  std::function<std::function<int()>(CLI::App&)> setup;
};

/// All registered verbs, in registration order.
std::vector<Verb>& verbs();

struct VerbRegistrar {
  explicit VerbRegistrar(Verb v) { verbs().push_back(std::move(v)); }
};

}  // namespace hearth::cli

#define HEARTH_REGISTER_VERB(ident, ...) \
  static ::hearth::cli::VerbRegistrar hearth_verb_##ident{::hearth::cli::Verb{__VA_ARGS__}}
