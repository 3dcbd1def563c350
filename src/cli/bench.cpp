// `hearth bench`: end-to-end prefill/decode speed of a model folder on random prompt ids,
// greedy, median over runs after one warmup. Not a micro-benchmark of kernels (bench/).
#include <c10/core/GradMode.h>
#include <algorithm>
#include <cstdio>
#include <iostream>

#include "cli/verb.h"
#include "core/error.h"
#include "core/torch_compat.h"
#include "generate/generate.h"
#include "io/hf_config.h"
#include "models/registry.h"
#include "nn/param_source.h"

namespace {

struct BenchArgs {
  std::string model, device, dtype;
  int64_t prompt_tokens = 512, gen_tokens = 128;
  int runs = 3;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::function<int()> setup_bench(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  app.add_option("--model", a->model, "Model folder")->required();
  app.add_option("--prompt-tokens", a->prompt_tokens,
                 "Random prompt length (default 512; with --gen-tokens, at most the model's context)");
  app.add_option("--gen-tokens", a->gen_tokens, "Tokens to generate (default 128)");
  app.add_option("--runs", a->runs, "Timed runs after one warmup (default 3)");
  app.add_option("--device", a->device, "cpu | cuda (default: cuda when available)");
  app.add_option("--dtype", a->dtype, "float32 | bfloat16 | float16 (default: the checkpoint's torch_dtype on cuda, float32 on cpu)");
  return [a] {
    HEARTH_CHECK(a->prompt_tokens > 0 && a->gen_tokens > 0 && a->runs > 0,
                 "bench: --prompt-tokens, --gen-tokens and --runs must be positive");
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
    at::manual_seed(0);
    at::Tensor ids = at::randint(model->vocab_size(), {a->prompt_tokens}, at::TensorOptions().dtype(at::kLong));
    std::vector<int64_t> prompt(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + a->prompt_tokens);
    hearth::generate::GenerateOptions opts;
    opts.max_tokens = a->gen_tokens;  // greedy, no EOS: always the full count
    std::vector<double> prefill, decode, ttft;
    int64_t peak = 0;
    const char* path = "eager";
    for (int r = 0; r <= a->runs; ++r) {
      auto res = hearth::generate::generate(*model, prompt, opts);
      path = res.stats.cuda_graph ? "static caches + CUDA graph" : res.stats.static_decode ? "static caches" : "eager";
      if (r == 0) continue;  // warmup
      prefill.push_back(res.stats.prompt_tps);
      decode.push_back(res.stats.generation_tps);
      ttft.push_back(res.stats.ttft_s * 1e3);
      peak = std::max(peak, res.stats.peak_memory_bytes);
    }
    std::printf("model: %s (%s, %lld layers) on %s %s\n", a->model.c_str(), model->model_type().c_str(),
                static_cast<long long>(model->num_layers()), where.device.str().c_str(),
                where.dtype == at::kBFloat16 ? "bfloat16" : where.dtype == at::kHalf ? "float16" : "float32");
    std::printf("prompt %lld tokens, generate %lld tokens, median of %d runs\n",
                static_cast<long long>(a->prompt_tokens), static_cast<long long>(a->gen_tokens), a->runs);
    std::printf("decode path: %s (HEARTH_CUDA_GRAPHS=0 forces the eager loop)\n", path);
    std::printf("prefill: %.1f tok/s\ndecode: %.1f tok/s\nTTFT: %.1f ms\npeak memory: %.3f GB\n", median(prefill),
                median(decode), median(ttft), peak / 1e9);
    return 0;
  };
}

}  // namespace
HEARTH_REGISTER_VERB(bench, "bench", "Measure prefill/decode speed of a model on random prompts", setup_bench);
