// `hearth generate`: load a model folder, encode a raw prompt (no chat template yet), stream the
// continuation to stdout and print mlx_lm-style stats to stderr. Not a server (see `serve`).
#include <iostream>

#include "adapters/adapter.h"
#include "adapters/mount.h"
#include "cli/verb.h"
#include "core/error.h"
#include "core/torch_compat.h"
#include "generate/generate.h"
#include "io/hf_config.h"
#include "models/registry.h"
#include "tokenizer/tokenizer.h"

namespace {

struct GenerateArgs {
  std::string model, prompt, device, dtype = "float32", adapter_path;
  int64_t max_tokens = 256;
  hearth::generate::SamplingParams sampling;
};

at::ScalarType parse_dtype(const std::string& s) {
  if (s == "float32") return at::kFloat;
  if (s == "bfloat16") return at::kBFloat16;
  if (s == "float16") return at::kHalf;
  throw hearth::InvalidArgument(hearth::cat("--dtype: '", s, "' is not float32, bfloat16 or float16"));
}

at::Device parse_device(const std::string& s) {
  if (s.empty()) return hearth::compat::cuda_available() ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  if (s == "cpu") return at::kCPU;
  if (s == "cuda") {
    HEARTH_CHECK(hearth::compat::cuda_available(), "--device cuda: no CUDA device in this build/machine");
    return at::Device(at::kCUDA, 0);
  }
  throw hearth::InvalidArgument(hearth::cat("--device: '", s, "' is not cpu or cuda"));
}

std::function<int()> setup_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  app.add_option("--model", a->model, "Model folder (config.json, *.safetensors, tokenizer.json)")->required();
  app.add_option("--prompt", a->prompt, "Prompt text (raw, no chat template)")->required();
  app.add_option("--max-tokens", a->max_tokens, "Maximum tokens to generate (default 256)");
  app.add_option("--temp", a->sampling.temperature, "Sampling temperature (default 0 = greedy)");
  app.add_option("--top-p", a->sampling.top_p, "Nucleus sampling threshold (0 = off)");
  app.add_option("--top-k", a->sampling.top_k, "Keep the k most likely tokens (0 = off)");
  app.add_option("--min-p", a->sampling.min_p, "Keep tokens with p >= min_p * p_max (0 = off)");
  app.add_option("--repetition-penalty", a->sampling.repetition_penalty, "Penalty for the last 20 tokens (off)");
  app.add_option("--seed", a->sampling.seed, "Sampling seed (default 0)");
  app.add_option("--device", a->device, "cpu | cuda (default: cuda when available)");
  app.add_option("--dtype", a->dtype, "float32 | bfloat16 | float16 (default float32)");
  app.add_option("--adapter-path,--adapter", a->adapter_path, "LoRA adapter folder (mlx-lm or PEFT layout) to apply");
  return [a] {
    at::NoGradGuard no_grad;
    const hearth::nn::LoadOptions where{parse_device(a->device), parse_dtype(a->dtype)};
    auto tokenizer = hearth::tokenizer::Tokenizer::from_dir(a->model);
    auto model = hearth::models::load_model(a->model, where);
    std::vector<std::string> active;
    if (!a->adapter_path.empty()) {
      auto adapter = hearth::adapters::load_adapter(a->adapter_path);
      hearth::adapters::mount(*model, adapter);
      active.push_back(adapter.id);
    }
    hearth::nn::ActiveAdapters adapter_scope(active);
    std::vector<int32_t> ids32 = tokenizer.encode(a->prompt, /*add_special_tokens=*/true);
    std::vector<int64_t> prompt(ids32.begin(), ids32.end());
    hearth::generate::GenerateOptions opts;
    opts.max_tokens = a->max_tokens;
    opts.sampling = a->sampling;
    opts.eos_ids = hearth::io::GenerationConfig::load(a->model).eos_token_ids;
    if (auto eos = tokenizer.eos_id()) opts.eos_ids.push_back(*eos);
    hearth::tokenizer::StreamDecoder stream(tokenizer, /*skip_special_tokens=*/true);
    auto result = hearth::generate::generate(*model, prompt, opts, [&](int64_t id) {
      std::cout << stream.push(static_cast<int32_t>(id)) << std::flush;
      return true;
    });
    std::cout << stream.flush() << std::endl;
    const auto& s = result.stats;
    std::cerr << "==========\n"
              << "Prompt: " << s.prompt_tokens << " tokens, " << s.prompt_tps << " tokens-per-sec\n"
              << "Generation: " << s.generation_tokens << " tokens, " << s.generation_tps << " tokens-per-sec\n"
              << "Peak memory: " << s.peak_memory_bytes / 1e9 << " GB\n";
    return 0;
  };
}

}  // namespace
HEARTH_REGISTER_VERB(generate, "generate", "Generate text from a prompt", setup_generate);
