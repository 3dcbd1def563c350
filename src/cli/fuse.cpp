// `hearth fuse`: merges a LoRA adapter (mlx-lm or PEFT layout), or puts a full fine-tune's trained
// tensors, into a model folder's weights and writes a new, complete model folder (mlx_lm.fuse). Not runtime mounting (generate/serve
// --adapter-path) and not a GGUF exporter.
#include <c10/core/GradMode.h>
#include <iostream>

#include "adapters/adapter.h"
#include "adapters/fuse.h"
#include "adapters/full.h"
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
  app.add_option("--adapter-path,--adapter", a->adapter, "Adapter folder (adapters.safetensors or adapter_model.safetensors; LoRA or a full fine-tune)")
      ->required();
  app.add_option("--out,--save-path,-o", a->out, "Output model folder (must not exist)")->required();
  app.add_flag("--dequantize,--de-quantize", a->dequantize,
               "Write dense weights for quantized modules and drop config.json's quantization block");
  return [a] {
    c10::NoGradGuard no_grad;
    hearth::adapters::FuseOptions opts;
    opts.dequantize = a->dequantize;
    if (hearth::adapters::is_full_finetune(a->adapter)) {
      hearth::adapters::fuse_full_model(a->model, a->adapter, a->out, opts);
      std::cerr << "fused the full fine-tune " << a->adapter << " into " << a->out << "\n";
      return 0;
    }
    const auto adapter = hearth::adapters::load_adapter(a->adapter);
    hearth::adapters::fuse_model(a->model, adapter, a->out, opts);
    std::cerr << "fused " << adapter.modules.size() << " modules of adapter '" << adapter.id << "' into " << a->out
              << "\n";
    return 0;
  };
}

}  // namespace
HEARTH_REGISTER_VERB(fuse, "fuse", "Merge a LoRA adapter or a full fine-tune into a model's weights (writes a new folder)", setup_fuse);
