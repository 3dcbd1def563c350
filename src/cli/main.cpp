// `hearth` entry point: builds the CLI from the self-registered verbs, runs the chosen one (none:
// the main job, cli/starter.h), and turns every error into one line on stderr and a non-zero exit
// code.
#include <c10/util/Exception.h>

#include <iostream>
#include <map>

#include "cli/number_option.h"
#include "cli/starter.h"
#include "cli/threads_option.h"
#include "cli/verb.h"
#include "core/error.h"
#include "core/host_malloc.h"
#include "core/threads.h"

namespace hearth::cli {
std::vector<Verb>& verbs() {
  static std::vector<Verb> v;
  return v;
}
}  // namespace hearth::cli

int main(int argc, char** argv) {
  using namespace hearth;
  tune_host_malloc();  // before the first activation is allocated (core/host_malloc.h)
  CLI::App app{"Hearth: run, serve and fine-tune language models locally"};
  app.require_subcommand(0, 1);
  app.set_version_flag("--version", std::string("hearth ") + cli::kVersion);
  app.footer(
      "With no verb, hearth serves the bundled starter model (models/starter next to the build folder, or\n"
      "$HEARTH_STARTER) with its adapters on http://127.0.0.1:8080 ($HEARTH_PORT); `hearth serve --model DIR`\n"
      "serves any other model folder.");
  std::map<std::string, std::function<int()>> actions;
  std::map<std::string, CLI::App*> subs;
  for (auto& verb : cli::verbs()) {
    CLI::App* sub = app.add_subcommand(verb.name, verb.help);
    subs[verb.name] = sub;
    actions[verb.name] = verb.setup(*sub);
    cli::guard_integer_options(*sub);  // no silent clamp past 64 bits, no octal "010"
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    apply_threads(cli::threads_option());  // physical cores unless --threads / OMP_NUM_THREADS say otherwise
    for (auto& [name, sub] : subs)
      if (sub->parsed()) return actions[name]();
    return cli::run_starter();
  } catch (const hearth::Error& e) {
    std::cerr << "hearth: error: " << e.what() << "\n";
    return 1;
  } catch (const c10::Error& e) {
    std::cerr << "hearth: error: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "hearth: error: " << e.what() << "\n";
    return 2;
  }
}
