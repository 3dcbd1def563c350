// `hearth bench`: end-to-end prefill/decode speed of a model folder on random prompt ids,
// greedy, median over runs after one warmup. Not a micro-benchmark of kernels (bench/).
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/profiler_legacy.h>
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <iostream>

#include "adapters/adapter.h"
#include "adapters/mount.h"
#include "cli/number_option.h"
#include "cli/threads_option.h"
#include "cli/verb.h"
#include "core/env.h"
#include "core/error.h"
#include "core/torch_compat.h"
#include "generate/batch.h"
#include "generate/decode_slots.h"
#include "generate/generate.h"
#include "io/atomic_file.h"
#include "io/hf_config.h"
#include "models/registry.h"
#include "nn/linear.h"
#include "nn/param_source.h"

namespace {

struct BenchArgs {
  std::string model, device, dtype;
  int64_t prompt_tokens = 512, gen_tokens = 128;
  int runs = 3;
  int64_t batch = 1;  // sequences decoded together (continuous batching's step)
  int64_t prefill_step_size = hearth::generate::GenerateOptions{}.prefill_step_size;
  std::string op_trace;  // a Chrome trace of one more prefill's host-side ATen ops, when set
  std::string adapter_path;  // a LoRA adapter folder, active on every step
  int64_t lora_rank = 0;     // > 0: a random LoRA adapter of this rank instead, active on every step
};

// The LoRA adapter the bench runs with (mounted on `model`): the folder's, or a random one of
// `rank` on the default targets (A as attach_trainable draws it, B ~ N(0, 0.01²): a nonzero delta
// through the same code as a trained adapter's). Returns the ids to activate; none without one.
std::vector<std::string> bench_adapter(hearth::models::Model& model, const BenchArgs& a) {
  if (!a.adapter_path.empty()) {
    const hearth::adapters::Adapter ad = hearth::adapters::load_adapter(a.adapter_path);
    hearth::adapters::mount(model, ad);
    return {ad.id};
  }
  if (a.lora_rank <= 0) return {};
  hearth::adapters::LoraConfig config;
  config.rank = a.lora_rank;
  hearth::adapters::Adapter ad = hearth::adapters::attach_trainable(model, config, 0, "bench");
  c10::NoGradGuard no_grad;
  for (auto& [path, m] : ad.modules) {
    m.b.normal_(0.0, 0.01);
    m.a.requires_grad_(false);
    m.b.requires_grad_(false);
  }
  return {ad.id};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Aggregate decode speed of `batch` sequences stepped together (generate/batch.h): all prefilled
// first, then timed from the step after every first token to the last token. Through decode slots
// (generate/decode_slots.h) unless HEARTH_DECODE_SLOTS=0 or the model cannot use them.
// Every sequence carries `adapters` (the server's per-row LoRA path: nn::RowAdapters, and an eager
// decode-slot step rather than a graph, generate/decode_slots.h).
int bench_batch(hearth::models::Model& model, const std::vector<int64_t>& prompt,
                const hearth::generate::GenerateOptions& opts, int64_t batch, int runs,
                const std::vector<std::string>& adapters) {
  using Clock = std::chrono::steady_clock;
  std::vector<double> rates, prefill_ms;
  std::unique_ptr<hearth::generate::DecodeSlots> slots;
  std::string why = "HEARTH_DECODE_SLOTS=0";
  if (hearth::env_switch_on("HEARTH_DECODE_SLOTS"))
    slots = hearth::generate::DecodeSlots::create(model, batch, static_cast<int64_t>(prompt.size()) + opts.max_tokens + 1, &why);
  for (int r = 0; r <= runs; ++r) {
    std::vector<std::unique_ptr<hearth::generate::Sequence>> seqs;
    std::vector<hearth::generate::Sequence*> live;
    for (int64_t b = 0; b < batch; ++b) {
      seqs.push_back(std::make_unique<hearth::generate::Sequence>(prompt, opts, hearth::cache::Caches{}, adapters, nullptr));
      live.push_back(seqs.back().get());
    }
    auto prefilling = [&] {
      return std::any_of(live.begin(), live.end(), [](auto* s) { return s->prefilling(); });
    };
    hearth::compat::synchronize(model.placement().device);
    const auto p0 = Clock::now();
    while (prefilling()) hearth::generate::step(model, live, opts.prefill_step_size, slots.get());
    hearth::compat::synchronize(model.placement().device);
    if (r > 0) prefill_ms.push_back(1e3 * std::chrono::duration<double>(Clock::now() - p0).count());
    int64_t before = 0;
    for (auto* s : live) before += static_cast<int64_t>(s->result().tokens.size());
    hearth::compat::synchronize(model.placement().device);
    const auto t0 = Clock::now();
    while (std::any_of(live.begin(), live.end(), [](auto* s) { return !s->done(); })) {
      std::vector<hearth::generate::Sequence*> running;
      for (auto* s : live)
        if (!s->done()) running.push_back(s);
      hearth::generate::step(model, running, opts.prefill_step_size, slots.get());
    }
    hearth::compat::synchronize(model.placement().device);
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    int64_t after = 0;
    for (auto* s : live) after += static_cast<int64_t>(s->result().tokens.size());
    if (r > 0) rates.push_back((after - before) / std::max(secs, 1e-9));
  }
  std::printf("batch %lld: prompt %lld tokens each, generate %lld tokens each, median of %d runs\n",
              static_cast<long long>(batch), static_cast<long long>(prompt.size()),
              static_cast<long long>(opts.max_tokens), runs);
  std::printf("prefill (every prompt, batched steps, their first tokens and the first decode step): %.2f ms\n",
              median(prefill_ms));
  if (opts.max_tokens <= 2)  // the first two tokens come from the prefill phase: nothing left to time
    std::printf("decode: none (with --gen-tokens %lld every token comes from the prefill and the first decode "
                "step; --gen-tokens 3 or more times decode)\n",
                static_cast<long long>(opts.max_tokens));
  else if (slots)
    std::printf("decode (aggregate over the batch, decode slots, %s): %.1f tok/s\n",
                slots->graph_steps() > 0 ? "CUDA graphs" : "eager static step", median(rates));
  else
    std::printf("decode (aggregate over the batch, ragged batched step; no slots: %s): %.1f tok/s\n", why.c_str(),
                median(rates));
  return 0;
}

std::function<int()> setup_bench(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  app.add_option("--model", a->model, "Model folder")->required();
  app.add_option("--prompt-tokens", a->prompt_tokens,
                 "Random prompt length (default 512; with --gen-tokens, at most the model's context)");
  app.add_option("--gen-tokens", a->gen_tokens, "Tokens to generate (default 128)");
  app.add_option("--runs", a->runs, "Timed runs after one warmup (default 3)");
  app.add_option("--batch", a->batch,
                 "Sequences decoded together in one batched step, as the server's continuous batching does "
                 "(default 1: the single-sequence path); reports the aggregate decode tok/s")
      ->check(hearth::cli::number_in(1, 1024));
  app.add_option("--prefill-step-size", a->prefill_step_size,
                 "Prompt tokens per prefill forward (default 2048, mlx-lm's); a longer prompt is prefilled in "
                 "chunks, each attending to the cache of the ones before")
      ->check(hearth::cli::number_in(int64_t{1}, int64_t{1} << 24));
  app.add_option("--op-trace", a->op_trace,
                 "After the timed runs, one more prefill (the prompt, one token generated) under PyTorch's "
                 "legacy profiler: its ATen ops with host start/duration, as a Chrome trace in this file "
                 "(tools/op_trace_summary.py sums it by op); the host cost of the eager forward. On CUDA with "
                 "PyTorch 2.x, Kineto's trace with the GPU kernels too (tools/trace_gaps.py: where the GPU waited)")
      ->check(CLI::Validator(
          [](std::string& v) { return v.empty() ? std::string("needs a file path") : std::string(); }, "FILE"));
  app.add_option("--adapter-path,--adapter", a->adapter_path,
                 "LoRA adapter folder (mlx-lm or PEFT layout), active on every prefill and decode step")
      ->check(CLI::Validator(
          [](std::string& v) { return v.empty() ? std::string("needs a folder path") : std::string(); }, "DIR"));
  app.add_option("--lora-rank", a->lora_rank,
                 "Run with a random LoRA adapter of this rank on q/k/v/o/gate/up/down, active on every step "
                 "(the cost of an adapter without a file)")
      ->check(hearth::cli::number_in(1, 1024))
      ->excludes("--adapter-path");
  app.add_option("--device", a->device, "cpu | cuda (default: cuda when available)");
  hearth::cli::add_threads_option(app);
  app.add_option("--dtype", a->dtype, "float32 | bfloat16 | float16 (default: the checkpoint's torch_dtype on cuda, float32 on cpu)");
  return [a] {
    HEARTH_CHECK(a->prompt_tokens > 0 && a->gen_tokens > 0 && a->runs > 0,
                 "bench: --prompt-tokens, --gen-tokens and --runs must be positive");
    constexpr int64_t kMaxTokens = int64_t{1} << 31;  // keeps their sum below overflow for the context check
    HEARTH_CHECK(a->prompt_tokens <= kMaxTokens && a->gen_tokens <= kMaxTokens, "bench: --prompt-tokens and ",
                 "--gen-tokens must be at most ", kMaxTokens);
    if (!a->op_trace.empty()) {
      // Checked before the model loads and the timed runs, not after them.
      HEARTH_CHECK(a->batch == 1, "bench: --op-trace traces one sequence's prefill; it does not combine with --batch");
      const std::filesystem::path trace(a->op_trace);
      const std::filesystem::path dir = trace.has_parent_path() ? trace.parent_path() : std::filesystem::path(".");
      HEARTH_CHECK(std::filesystem::is_directory(dir), "bench: --op-trace ", a->op_trace, ": folder ", dir.string(),
                   " does not exist");
      HEARTH_CHECK(!std::filesystem::is_directory(trace), "bench: --op-trace ", a->op_trace,
                   " is a folder; give a file path");
    }
    // Positions past the trained context are not a measurement of the model: refuse them.
    const std::filesystem::path cfg_path = std::filesystem::path(a->model) / "config.json";
    const nlohmann::json cfg = hearth::io::read_json(cfg_path);
    for (const nlohmann::json* c : {&cfg, cfg.contains("text_config") ? &cfg["text_config"] : nullptr}) {
      if (!c || !c->is_object() || !c->contains("max_position_embeddings")) continue;
      const nlohmann::json& m = (*c)["max_position_embeddings"];
      if (!m.is_number_integer()) break;  // load_model names the bad value
      const int64_t ctx = m.get<int64_t>();
      HEARTH_CHECK(a->prompt_tokens + a->gen_tokens <= ctx, "bench: --prompt-tokens ", a->prompt_tokens,
                   " + --gen-tokens ", a->gen_tokens, " = ", a->prompt_tokens + a->gen_tokens,
                   " tokens exceed the model's context length ", ctx, " (", cfg_path.string(),
                   " max_position_embeddings)");
      break;
    }
    c10::NoGradGuard no_grad;
    const hearth::nn::LoadOptions where = hearth::nn::resolve_placement(a->device, a->dtype, a->model);
    auto model = hearth::models::load_model(a->model, where);
    const std::vector<std::string> adapter_ids = bench_adapter(*model, *a);
    at::manual_seed(0);
    at::Tensor ids = at::randint(model->vocab_size(), {a->prompt_tokens}, at::TensorOptions().dtype(at::kLong));
    std::vector<int64_t> prompt(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + a->prompt_tokens);
    hearth::generate::GenerateOptions opts;
    opts.max_tokens = a->gen_tokens;  // greedy, no EOS: always the full count
    opts.prefill_step_size = a->prefill_step_size;
    if (!adapter_ids.empty())
      std::printf("adapter: %s, active on every step\n",
                  a->lora_rank > 0 ? ("random LoRA of rank " + std::to_string(a->lora_rank)).c_str() : a->adapter_path.c_str());
    if (a->batch > 1) return bench_batch(*model, prompt, opts, a->batch, a->runs, adapter_ids);
    const hearth::nn::ActiveAdapters active(adapter_ids);  // the single-sequence loop's selection
    std::vector<double> prefill, decode, ttft, steady, setup_ms;
    int64_t peak = 0;
    const char* path = "eager";
    for (int r = 0; r <= a->runs; ++r) {
      auto res = hearth::generate::generate(*model, prompt, opts);
      path = res.stats.cuda_graph ? "static caches + CUDA graph" : res.stats.static_decode ? "static caches" : "eager";
      if (r == 0) continue;  // warmup
      prefill.push_back(res.stats.prompt_tps);
      decode.push_back(res.stats.generation_tps);
      // The same tokens without the static path's one-off setup (caches copied, graph recorded).
      const double gen_s = res.stats.generation_tps > 0 ? (res.stats.generation_tokens - 1) / res.stats.generation_tps : 0;
      steady.push_back(gen_s > res.stats.static_setup_s ? (res.stats.generation_tokens - 1) / (gen_s - res.stats.static_setup_s) : 0);
      setup_ms.push_back(res.stats.static_setup_s * 1e3);
      ttft.push_back(res.stats.ttft_s * 1e3);
      peak = std::max(peak, res.stats.peak_memory_bytes);
    }
    std::printf("model: %s (%s, %lld layers) on %s %s\n", a->model.c_str(), model->model_type().c_str(),
                static_cast<long long>(model->num_layers()), where.device.str().c_str(),
                where.dtype == at::kBFloat16 ? "bfloat16" : where.dtype == at::kHalf ? "float16" : "float32");
    std::printf("prompt %lld tokens (prefill chunks of %lld), generate %lld tokens, median of %d runs\n",
                static_cast<long long>(a->prompt_tokens), static_cast<long long>(a->prefill_step_size),
                static_cast<long long>(a->gen_tokens), a->runs);
    std::printf("decode path: %s%s\n", path,
                where.device.is_cuda() ? " (HEARTH_CUDA_GRAPHS=0 forces the eager loop)" : "");
    if (a->gen_tokens > 1) std::printf("prefill: %.1f tok/s\ndecode: %.1f tok/s\n", median(prefill), median(decode));
    else std::printf("prefill: %.1f tok/s\ndecode: none (one generated token; --gen-tokens 2 or more times decode)\n", median(prefill));
    if (median(setup_ms) > 0)
      std::printf("decode without the static setup: %.1f tok/s (setup %.1f ms per run: caches copied, step recorded)\n",
                  median(steady), median(setup_ms));
    std::printf("TTFT: %.1f ms\npeak memory: %.3f GB\n", median(ttft), peak / 1e9);
    if (!a->op_trace.empty()) {
      hearth::generate::GenerateOptions one = opts;
      one.max_tokens = 1;
      auto run = [&] {
        hearth::generate::generate(*model, prompt, one);
        hearth::compat::synchronize(where.device);
      };
      // On CUDA with PyTorch 2.x, Kineto's trace: host ops and GPU kernels (tools/trace_gaps.py
      // finds where the GPU waited). Else the legacy profiler's host ops, written beside the path
      // and renamed over it (io/atomic_file.h): a failed write leaves nothing half-written.
      const bool kernels = where.device.is_cuda() && hearth::compat::trace_with_kernels(a->op_trace, run);
      if (!kernels)
        hearth::io::write_file_atomic(a->op_trace, [&](std::ostream& out) {
          torch::autograd::profiler::RecordProfile trace(out);
          run();
        });
      std::printf("op trace%s: %s\n", kernels ? " (host ops and GPU kernels)" : "", a->op_trace.c_str());
    }
    return 0;
  };
}

}  // namespace
HEARTH_REGISTER_VERB(bench, "bench", "Measure prefill/decode speed of a model on random prompts", setup_bench);
