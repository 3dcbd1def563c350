// `hearth fuse`: merges a LoRA adapter (mlx-lm or PEFT layout) into a model folder's weights and
// writes a new, complete model folder (mlx_lm.fuse). Not runtime mounting (generate/serve
// --adapter-path) and not a GGUF exporter.
#include <iostream>

#include "adapters/adapter.h"
#include "adapters/fuse.h"
#include "cli/verb.h"
#include "core/error.h"

namespace {

struct FuseArgs {
  std::string model, adapter, out;
  bool dequantize = false;
};

std::function<int()> setup_fuse(CLI::App& app) {
  auto a = std::make_shared<FuseArgs>();
  app.add_option("--model,-m", a->model, "Base model folder (config.json, *.safetensors, tokenizer files)")->required();
  app.add_option("--adapter-path,--adapter", a->adapter, "Adapter folder (adapters.safetensors or adapter_model.safetensors)")
      ->required();
  app.add_option("--out,--save-path,-o", a->out, "Output model folder (must not exist)")->required();
  app.add_flag("--dequantize,--de-quantize", a->dequantize,
               "Write dense weights for quantized modules and drop config.json's quantization block");
  return [a] {
    at::NoGradGuard no_grad;
    const auto adapter = hearth::adapters::load_adapter(a->adapter);
    hearth::adapters::FuseOptions opts;
    opts.dequantize = a->dequantize;
    hearth::adapters::fuse_model(a->model, adapter, a->out, opts);
    std::cerr << "fused " << adapter.modules.size() << " modules of adapter '" << adapter.id << "' into " << a->out
              << "\n";
    return 0;
  };
}

}  // namespace
HEARTH_REGISTER_VERB(fuse, "fuse", "Merge a LoRA adapter into a model's weights (writes a new folder)", setup_fuse);
