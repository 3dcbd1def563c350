// --threads: one value for whichever verb was chosen, applied by main().
#include "cli/threads_option.h"

namespace hearth::cli {

namespace {
int64_t& threads_value() {
  static int64_t v = 0;
  return v;
}
}  // namespace

void add_threads_option(CLI::App& app) {
  app.add_option("--threads", threads_value(),
                 "CPU compute threads (default 0 = the physical cores; OMP_NUM_THREADS, when set, stands)");
}

int64_t threads_option() { return threads_value(); }

}  // namespace hearth::cli
