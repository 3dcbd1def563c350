// `hearth serve`'s options and runner, shared by the serve verb (cli/serve.cpp) and the no-verb
// main job (cli/starter.cpp). Not the HTTP server itself (server/server.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "server/model_engine.h"
#include "server/server.h"

namespace hearth::cli {

struct ServeArgs {
  std::string model;
  server::ModelEngineOptions engine;
  std::vector<std::string> adapters;  // NAME=PATH
  std::vector<std::string> adapter_dirs;
  server::ServerOptions server;
  bool fake_engine = false;
  int fake_delay_ms = 0;
  int64_t fake_context = 4096;
  /// --memory-budget: "auto" (90% of the GPU's free memory after loading, or half the CPU's
  /// available memory), "0" (no budget), or bytes with an optional K/M/G suffix.
  std::string memory_budget = "auto";
  /// Capture every decode-slot bucket's CUDA graph at start-up (--no-cuda-graph-warmup: false,
  /// each is captured at its first use, inside that request's latency).
  bool cuda_graph_warmup = true;
  bool fake_think_tags = false;  ///< fake engine: split <think>...</think> into reasoning_content
  /// JSON body of the ready-to-paste curl line printed at start ("" = a one-message "Hello!" chat).
  /// Must hold no single quote (it is printed inside '...').
  std::string example_body;
};

/// Loads the engine, binds, prints the URL, the web chat address and a curl line to stdout, and
/// serves until SIGINT/SIGTERM (then returns 0). Throws hearth::Error on a bad model, adapter or
/// port (before serving).
int run_serve(const ServeArgs& a);

}  // namespace hearth::cli
