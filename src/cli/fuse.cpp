// `hearth fuse`: merges a LoRA adapter (mlx-lm or PEFT layout), or puts a full fine-tune's trained
// tensors, into a model folder's weights and writes a new, complete model folder (mlx_lm.fuse). Not runtime mounting (generate/serve
// --adapter-path) and not a GGUF exporter.
#include <c10/core/GradMode.h>
#include <iostream>

#include "adapters/adapter.h"
#include "adapters/fuse.h"
#include "adapters/full.h"
#include "cli/output_folder.h"
#include "cli/verb.h"
#include "core/error.h"

namespace {

struct FuseArgs {
  std::string model, adapter, out;
  bool dequantize = false;
};

// The output folder follows convert's rules (cli/output_folder.h): --model/--adapter-path/--out
// not empty, --out not (inside) the model or adapter folder, not existing, not a dangling symlink,
// its parent existing, all before any work; written as OUT.tmp.PID and renamed into place, removed
// on an error or SIGINT/SIGTERM (exit 128 + the signal), or by the next run when a kill left it.
int run_fuse(const FuseArgs& a) {
  namespace fs = std::filesystem;
  using hearth::cli::same_or_inside;
  HEARTH_CHECK(!a.out.empty(), "fuse: --out is empty (name the new folder to write)");
  HEARTH_CHECK(!a.model.empty(), "fuse: --model is empty (name the model folder to read)");
  HEARTH_CHECK(!a.adapter.empty(), "fuse: --adapter-path is empty (name the adapter or fine-tune folder to fuse)");
  const fs::path model = hearth::cli::without_trailing_slash(a.model), out = hearth::cli::without_trailing_slash(a.out),
                 adapter_dir = hearth::cli::without_trailing_slash(a.adapter);
  std::error_code ec;
  HEARTH_CHECK_T(hearth::NotFound, fs::is_directory(model, ec), model.string(), ": model folder not found");
  HEARTH_CHECK(!same_or_inside(out, model), "fuse: --out ", out.string(), " is (or lies inside) the --model folder ",
               model.string(), ": the fused model would be written among the base model's files; pass another folder");
  HEARTH_CHECK(!same_or_inside(out, adapter_dir), "fuse: --out ", out.string(), " is (or lies inside) the --adapter-path folder ",
               adapter_dir.string(), ": pass another folder");
  hearth::cli::check_new_output_folder("fuse", out);
  c10::NoGradGuard no_grad;
  hearth::adapters::FuseOptions opts;
  opts.dequantize = a.dequantize;
  opts.between_tensors = hearth::cli::check_output_signal;
  std::string done;
  const int rc = hearth::cli::write_new_folder("fuse", out, [&] {
    if (hearth::adapters::is_full_finetune(adapter_dir)) {
      hearth::adapters::fuse_full_model(model, adapter_dir, out, opts);
      done = "fused the full fine-tune " + adapter_dir.string() + " into " + out.string();
      return;
    }
    const auto adapter = hearth::adapters::load_adapter(adapter_dir);
    opts.between_tensors();
    hearth::adapters::fuse_model(model, adapter, out, opts);
    done = hearth::cat("fused ", adapter.modules.size(), " modules of adapter '", adapter.id, "' into ", out.string());
  });
  if (rc == 0) std::cerr << done << "\n";
  return rc;
}

std::function<int()> setup_fuse(CLI::App& app) {
  auto a = std::make_shared<FuseArgs>();
  app.add_option("--model,-m", a->model, "Base model folder (config.json, *.safetensors, tokenizer files)")->required();
  app.add_option("--adapter-path,--adapter", a->adapter, "Adapter folder (adapters.safetensors or adapter_model.safetensors; LoRA or a full fine-tune)")
      ->required();
  app.add_option("--out,--save-path,-o", a->out,
                 "Output model folder (must not exist; written as OUT.tmp.PID, then renamed)")
      ->required();
  app.add_flag("--dequantize,--de-quantize", a->dequantize,
               "Write dense weights for quantized modules and drop config.json's quantization block");
  return [a] { return run_fuse(*a); };
}

}  // namespace
HEARTH_REGISTER_VERB(fuse, "fuse", "Merge a LoRA adapter or a full fine-tune into a model's weights (writes a new folder)", setup_fuse);
