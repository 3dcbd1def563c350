// `hearth serve`: the OpenAI-compatible HTTP server and web chat UI over one loaded model.
// Not the server itself (src/server/server.h); this verb parses flags, picks the engine, and
// turns SIGINT/SIGTERM/SIGHUP into a clean stop (a second signal, or a drain past 30 s, exits at once).
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <csignal>
#include <iomanip>
#include <iostream>
#include <memory>
#include <thread>

#include "cli/number_option.h"
#include "cli/serve.h"
#include "cli/threads_option.h"
#include "cli/verb.h"
#include "core/device_memory.h"
#include "core/error.h"
#include "server/fake_engine.h"
#include "server/http_guard.h"

namespace hearth::cli {

// --memory-budget: "auto", "0", or bytes with an optional K/M/G suffix (binary units).
int64_t memory_budget_bytes(const std::string& spec, const at::Device& device) {
  if (spec == "auto") {
    const int64_t free = compat::free_memory_bytes(device);
    return device.is_cuda() ? free / 10 * 9 : free / 2;
  }
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(spec, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string suffix = spec.substr(used);
  const double unit = suffix.empty() ? 1 : suffix == "K" ? 1024.0 : suffix == "M" ? 1048576.0 : suffix == "G" ? 1073741824.0 : -1;
  HEARTH_CHECK_T(InvalidArgument, used > 0 && unit > 0 && v >= 0 && std::isfinite(v) && v * unit < 9e18, "--memory-budget '",
                 spec, "': expected auto, 0, or a size in bytes with an optional K, M or G suffix (e.g. 8G)");
  return static_cast<int64_t>(v * unit);
}

int run_serve(const ServeArgs& a) {
  std::unique_ptr<server::Engine> engine;
  server::ServerOptions server_opts = a.server;
  if (a.fake_engine) {
    server::FakeEngineOptions fo{a.model.empty() ? "fake-model" : a.model, a.fake_context, a.fake_delay_ms};
    if (a.fake_think_tags) fo.reasoning = chat::ReasoningFormat::ThinkTags;
    engine = std::make_unique<server::FakeEngine>(std::move(fo));
  } else {
    HEARTH_CHECK(!a.model.empty(), "serve: --model DIR is required");
    server::ModelEngineOptions eo = a.engine;
    eo.model_dir = a.model;
    for (const auto& d : a.adapter_dirs) eo.adapter_roots.emplace_back(d);
    for (const auto& spec : a.adapters) {
      const size_t eq = spec.find('=');
      HEARTH_CHECK_T(InvalidArgument, eq != std::string::npos && eq > 0 && eq + 1 < spec.size(), "--adapter '", spec,
                     "': expected NAME=PATH");
      eo.adapters.emplace_back(spec.substr(0, eq), spec.substr(eq + 1));
    }
    std::cerr << "hearth: loading " << a.model << " ..." << std::endl;
    auto model_engine = std::make_unique<server::ModelEngine>(std::move(eo));
    server_opts.memory_budget = memory_budget_bytes(a.memory_budget, model_engine->device());
    if (server_opts.memory_budget > 0)
      std::cerr << "hearth: cache memory budget " << server_opts.memory_budget / (1 << 20) << " MiB ("
                << model_engine->state_bytes(model_engine->context_length()) / (1 << 20)
                << " MiB for one request filling the context)" << std::endl;
    std::string why;
    const int64_t slot_bytes = model_engine->start_decode_slots(static_cast<int64_t>(server_opts.max_num_seqs),
                                                                server_opts.memory_budget, &why);
    if (const generate::DecodeSlots* slots = model_engine->decode_slots()) {
      // The slots' caches are held for the server's life: they come out of the running requests' budget.
      if (server_opts.memory_budget > 0) server_opts.memory_budget -= slot_bytes;
      std::cerr << "hearth: decode slots: " << slots->slots() << " x " << slots->capacity() << " tokens ("
                << slot_bytes / (1 << 20) << " MiB)" << std::endl;
      const size_t buckets = generate::DecodeSlots::all_buckets(slots->slots(), slots->capacity()).size();
      if (!model_engine->device().is_cuda()) {
        // CPU: steps run eagerly, nothing to capture.
      } else if (!a.cuda_graph_warmup) {
        std::cerr << "hearth: CUDA graph warm-up skipped (--no-cuda-graph-warmup): each of the " << buckets
                  << " (batch, length) buckets is captured at its first use" << std::endl;
      } else {
        const int64_t free_before = compat::free_memory_bytes(model_engine->device());
        const generate::DecodeSlots::Warmup w = model_engine->warm_up_decode_slots();
        const int64_t used = free_before - compat::free_memory_bytes(model_engine->device());
        std::cerr << "hearth: CUDA graphs: captured " << w.captured << " of " << buckets
                  << " (batch, length) buckets in " << std::fixed << std::setprecision(1) << w.seconds << " s ("
                  << std::max<int64_t>(used, 0) / (1 << 20) << " MiB; --no-cuda-graph-warmup skips this)"
                  << std::defaultfloat << std::endl;
      }
    } else {
      std::cerr << "hearth: decode slots off: " << why << std::endl;
    }
    engine = std::move(model_engine);
  }

  // Signals: a handler (run on whichever thread the kernel picks; libraries start threads before
  // us, so masking is not enough) writes the signal number to a pipe; a watcher thread reads it
  // and stops the server. Writing 0 wakes the watcher when serving ended for another reason.
  static int pipe_fds[2] = {-1, -1};
  HEARTH_CHECK(pipe(pipe_fds) == 0, "serve: cannot create the signal pipe");
  struct sigaction sa {};
  sa.sa_handler = [](int sig) {
    unsigned char b = static_cast<unsigned char>(sig);
    [[maybe_unused]] auto n = write(pipe_fds[1], &b, 1);
  };
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);  // a closed terminal or ssh session: the same clean stop (as `launch`)
  std::signal(SIGPIPE, SIG_IGN);

  server::Server srv(*engine, server_opts);
  int port = srv.bind();
  if (a.server.api_key.empty() && !server::is_loopback_host(a.server.host))
    std::cerr << "hearth: warning: serving on " << a.server.host << " without --api-key: anyone who can reach this "
              << "address can use the model and mount adapters (set --api-key KEY, or bind 127.0.0.1)" << std::endl;
  for (const auto& o : a.server.allowed_origins)
    if (o == "*" && a.server.api_key.empty())
      std::cerr << "hearth: warning: --allowed-origins '*' without --api-key: any web page opened on this machine can "
                << "use the model and mount adapters" << std::endl;
  // The first signal stops the server: requests end at their next token, streams get their last
  // events. A second signal, or connections still open kDrainSeconds after the stop (a client that
  // stopped reading), end the process at once with 128 + the signal, as a default handler would.
  std::thread watcher([&] {
    constexpr int kDrainSeconds = 30;
    const auto read_byte = [](int timeout_ms, unsigned char& b) {  // 1: a byte, 0: timed out
      pollfd p{pipe_fds[0], POLLIN, 0};
      for (;;) {
        const int r = poll(&p, 1, timeout_ms);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return 0;
        if (read(pipe_fds[0], &b, 1) == 1) return 1;
        if (errno != EINTR) return 0;
      }
    };
    unsigned char sig = 0;
    read_byte(-1, sig);
    if (sig == 0) {  // serving ended for another reason
      srv.stop();
      return;
    }
    std::cerr << "hearth: stopping (signal " << int(sig) << "; a second one exits at once)" << std::endl;
    srv.stop();
    unsigned char next = 0;
    if (!read_byte(kDrainSeconds * 1000, next)) {
      std::cerr << "hearth: connections still open " << kDrainSeconds << " s after the stop; exiting" << std::endl;
      _exit(128 + sig);
    }
    if (next == 0) return;  // serve() returned: a clean exit
    std::cerr << "hearth: second signal (" << int(next) << "); exiting now" << std::endl;
    _exit(128 + next);
  });
  const bool ipv6 = a.server.host.find(':') != std::string::npos;  // a URL brackets an IPv6 address
  const std::string url =
      "http://" + (ipv6 ? "[" + a.server.host + "]" : a.server.host) + ":" + std::to_string(port);
  std::cout << "hearth: serving " << engine->model_id() << " on " << url << " (Ctrl-C to stop)" << std::endl;
  // The body goes inside '...' for the shell: each ' in it becomes '\''.
  std::string body = a.example_body.empty() ? R"({"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 64})"
                                            : a.example_body;
  for (size_t i = 0; (i = body.find('\'', i)) != std::string::npos; i += 4) body.replace(i, 1, "'\\''");
  std::cout << "hearth: web chat at " << url << "/ ; try:\n  curl " << url
            << "/v1/chat/completions -H 'Content-Type: application/json'"
            << (a.server.api_key.empty() ? "" : " -H \"Authorization: Bearer $KEY\"") << " -d '" << body << "'"
            << std::endl;
  srv.serve();
  unsigned char zero = 0;
  [[maybe_unused]] auto n = write(pipe_fds[1], &zero, 1);
  watcher.join();
  return 0;
}

}  // namespace hearth::cli

namespace {
using hearth::cli::ServeArgs;

std::function<int()> setup_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  app.add_option("--model", a->model, "Model directory (Hugging Face layout)");
  app.add_option("--host", a->server.host, "Address to bind (default 127.0.0.1: this machine only; IPv6 as ::1 or [::1])")
      ->transform(CLI::Validator(
          [](std::string& h) -> std::string {  // "[::1]", as URLs write it, binds ::1
            if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
            return h.empty() ? "--host is empty: give an address to bind (127.0.0.1, 0.0.0.0, ::1)" : "";
          },
          ""));
  app.add_option("--port", a->server.port, "Port (0 = any free port; the chosen one is printed)")
      ->check(hearth::cli::number_in(0, 65535));
  app.add_option("--api-key", a->server.api_key, "Require 'Authorization: Bearer KEY' (or 'x-api-key: KEY') on /v1/*")
      ->check([](const std::string& key) -> std::string {
        if (key.empty()) return "--api-key is empty: give a key, or leave the flag out to serve without one";
        for (char c : key)
          if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) return "--api-key must not hold spaces or control characters";
        return "";
      });
  app.add_option("--allowed-hosts", a->server.allowed_hosts,
                 "Host names accepted besides localhost and --host (comma list; '*' = any). A loopback-bound "
                 "server refuses other names (DNS rebinding)")
      ->delimiter(',');
  app.add_option("--allowed-origins", a->server.allowed_origins,
                 "Web origins (scheme://host:port, comma list; '*' = any) that may call the API from a browser, "
                 "with CORS headers. Default: same-origin only")
      ->delimiter(',');
  app.add_option("--max-connections", a->server.max_connections,
                 "Connections served at once; past it the longest-idle one is closed, else 503")
      ->check(hearth::cli::number_in(1, 4096));
  app.add_option("--max-queue", a->server.max_queue, "Requests that may wait for the engine before 429")
      ->check(hearth::cli::number_in(1, 100000));
  app.add_option("--max-num-seqs", a->server.max_num_seqs,
                 "Requests generated together, decoded in one batched step (continuous batching; 1 = one at a time)")
      ->check(hearth::cli::number_in(1, 4096));
  app.add_option("--memory-budget", a->memory_budget,
                 "Cache memory the running requests may hold together: auto (90% of free GPU memory, half of "
                 "available CPU memory), 0 (none), or a size like 8G; a request that can never fit is a 400, one "
                 "that does not fit now waits");
  app.add_option("--max-body-bytes", a->server.max_body_bytes, "Largest accepted request body (413 above)")
      ->check(hearth::cli::number_in(1024, 1 << 30));
  app.add_option("--max-tokens", a->server.default_max_tokens,
                 "Default generated-token limit for chat requests that set none (0 = context length)");
  app.add_option("--device", a->engine.device, "cpu | cuda (default: cuda when available)");
  hearth::cli::add_threads_option(app);
  app.add_option("--dtype", a->engine.dtype, "float32 | bfloat16 | float16 (default: the checkpoint's torch_dtype on cuda, float32 on cpu)");
  app.add_option("--context-length,--max-model-len", a->engine.context_length,
                 "Prompt + output token cap (default or 0: the model's max_position_embeddings; above the model's "
                 "limit only with --allow-long-context); also each decode slot's size, capped by the memory budget")
      ->check([](const std::string& v) {
        return !v.empty() && v[0] == '-' ? std::string("must be >= 0 (0 = the model's limit), got ") + v : std::string();
      });
  app.add_flag("--allow-long-context", a->engine.allow_long_context,
               "Accept a --context-length above the model's limit (config.json max_position_embeddings, times the "
               "RoPE scaling factor where one applies); HEARTH_ALLOW_LONG_CONTEXT=1 does the same");
  app.add_option("--prefill-step-size", a->engine.prefill_step_size,
                 "Prompt tokens per prefill chunk and per scheduler step (default 2048): between chunks the other "
                 "requests decode, and a request whose client left is dropped")
      ->check(hearth::cli::number_in(int64_t{1}, int64_t{1} << 24));
  app.add_flag_callback("--no-decode-slots", [a] { a->engine.decode_slots = false; },
               "Decode every running request through the ragged batched path instead of decode slots (static "
               "per-slot caches, CUDA graphs on the GPU); HEARTH_DECODE_SLOTS=0 does the same");
  app.add_flag_callback("--no-cuda-graph-warmup", [a] { a->cuda_graph_warmup = false; },
                        "Do not capture the decode slots' CUDA graphs (one per batch and length bucket) at start-up: "
                        "each is captured at its first use instead, inside that request's latency (faster start); "
                        "HEARTH_CUDA_GRAPHS=0 turns the graphs off altogether (vLLM's --enforce-eager)");
  app.add_option("--adapter", a->adapters, "Mount a LoRA adapter at start: NAME=PATH (repeatable)");
  app.add_option("--adapter-dir", a->adapter_dirs,
                 "Folder under which POST /v1/adapters may load adapters (repeatable; MODEL/adapters always is)");
  app.add_option("--default-adapter", a->engine.default_adapter,
                 "Adapter selection for requests that send none (\"id\" or \"a+b\"; default: base model)");
  app.add_option("--prompt-cache-bytes", a->engine.prompt_cache_bytes,
                 "Prompt cache budget in bytes of KV reused across requests (0 = off; default 2 GiB on CUDA, "
                 "512 MiB on CPU)")
      ->check(hearth::cli::number_in(int64_t{0}, int64_t{1} << 50));
  app.add_option("--prompt-cache-snapshot-every", a->engine.prompt_cache_snapshot_every,
                 "Hybrid models (Qwen3.5): also keep a prompt-cache snapshot every N tokens of a long prompt "
                 "(default 4096; 0 = only at each prompt's end)")
      ->check(hearth::cli::number_in(int64_t{0}, int64_t{1} << 40));
  app.add_option("--temp,--temperature", a->engine.defaults.temperature,
                 "Default temperature (else generation_config.json, else 0.7)")
      ->check(hearth::cli::number_in(0.0, 2.0));
  app.add_option("--top-p", a->engine.defaults.top_p, "Default top-p (else generation_config.json, else off)")
      ->check(hearth::cli::number_in(0.0, 1.0));
  app.add_option("--top-k", a->engine.defaults.top_k, "Default top-k (else generation_config.json, else off)")
      ->check([](const std::string& v) {
        return !v.empty() && v[0] == '-' ? std::string("must be >= 0 (0 = the model's limit), got ") + v : std::string();
      });
  app.add_option("--min-p", a->engine.defaults.min_p, "Default min-p (off)")->check(hearth::cli::number_in(0.0, 1.0));
  app.add_option("--repetition-penalty", a->engine.defaults.repetition_penalty,
                 "Default repetition penalty (else generation_config.json, else off)")
      ->check(CLI::PositiveNumber);
  auto thinking = std::make_shared<std::string>();
  app.add_option("--thinking", *thinking,
                 "on | off: enable_thinking for chat requests that do not set it in chat_template_kwargs "
                 "(default: the template's own default)")
      ->check(CLI::IsMember({"on", "off", "true", "false"}));
  app.add_flag("--fake-engine", a->fake_engine, "Serve a scripted fake engine (tests)")->group("");
  app.add_option("--fake-delay-ms", a->fake_delay_ms, "Fake engine: sleep per token")->group("");
  app.add_option("--fake-context", a->fake_context, "Fake engine: context length")->group("");
  app.add_flag("--fake-think-tags", a->fake_think_tags, "Fake engine: <think>...</think> is reasoning")->group("");
  return [a, thinking] {
    if (!thinking->empty()) a->engine.thinking = *thinking == "on" || *thinking == "true";
    return hearth::cli::run_serve(*a);
  };
}

}  // namespace
HEARTH_REGISTER_VERB(serve, "serve", "Serve a model over an OpenAI-compatible HTTP API with a web chat UI", setup_serve);
