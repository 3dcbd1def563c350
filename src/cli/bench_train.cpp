// `hearth bench-train`: training speed and peak memory of LoRA SFT steps on random tokens, for a
// grid of sequence lengths × segment sizes (0 = plain full backward). Each cell: one warmup step,
// then timed steps (backward + AdamW), the allocator's peak measured from a reset. A cell that runs
// out of memory prints "OOM" and the grid goes on. Not a trainer (`hearth train`).
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "cli/verb.h"
#include "core/error.h"
#include "core/torch_compat.h"
#include "models/registry.h"
#include "nn/linear.h"
#include "nn/param_source.h"
#include "train/loss.h"
#include "train/lora_params.h"
#include "train/optimizer.h"
#include "train/segmented.h"
#include "train/trainer.h"

namespace {

struct BenchTrainArgs {
  std::string model, device, dtype;
  std::vector<int64_t> seq_lens{2048, 8192};
  std::vector<int64_t> segment_sizes{0, 4, 1};
  int64_t steps = 2, lora_rank = 8, loss_chunk = 1024;
};

struct Cell {
  bool oom = false;
  double tokens_per_s = 0;
  int64_t peak_bytes = 0;
};

Cell run_cell(hearth::models::Model& model, const BenchTrainArgs& a, int64_t T, int64_t seg) {
  using namespace hearth;
  const at::Device dev = model.placement().device;
  train::TrainConfig cfg;
  cfg.lora_rank = a.lora_rank;
  train::LoraRun lora(model, cfg);
  lora.set_training(true);
  auto params = lora.params();
  train::LayerStack stack = train::make_layer_stack(model, params);
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& p : params) named.emplace_back(p.name, p.tensor);
  train::NamedAdamW opt(named, {1e-5});
  at::Tensor ids = at::randint(2, model.vocab_size(), {1, T}, at::TensorOptions().dtype(at::kLong).device(dev));
  at::Tensor targets = train::shift_labels(ids);
  train::BackwardOptions o;
  o.segment_size = seg;
  o.loss_chunk = a.loss_chunk;
  Cell c;
  try {
    train::backward(stack, ids, targets, o);  // warmup (allocator, kernels)
    opt.step();
    opt.zero_grad();
    compat::synchronize(dev);
    compat::reset_peak_memory(dev);
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t s = 0; s < a.steps; ++s) {
      train::backward(stack, ids, targets, o);
      opt.step();
      opt.zero_grad();
    }
    compat::synchronize(dev);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    c.tokens_per_s = static_cast<double>(T * a.steps) / secs;
    c.peak_bytes = compat::peak_memory_bytes(dev);
  } catch (const c10::Error& e) {
    if (std::string(e.what()).find("out of memory") == std::string::npos) throw;
    c.oom = true;
  }
  return c;
}

std::function<int()> setup_bench_train(CLI::App& app) {
  auto a = std::make_shared<BenchTrainArgs>();
  app.add_option("--model", a->model, "Model folder")->required();
  app.add_option("--seq-lens", a->seq_lens, "Sequence lengths (default 2048 8192)");
  app.add_option("--segment-sizes", a->segment_sizes, "Layers per backward segment; 0 = full (default 0 4 1)");
  app.add_option("--steps", a->steps, "Timed steps per cell after one warmup (default 2)");
  app.add_option("--lora-rank", a->lora_rank, "LoRA rank on q,k,v,o,gate,up,down (default 8)");
  app.add_option("--loss-chunk", a->loss_chunk, "Positions per loss-head chunk (default 1024)");
  app.add_option("--device", a->device, "cpu | cuda (default: cuda when available)");
  app.add_option("--dtype", a->dtype, "float32 | bfloat16 | float16 (default: the checkpoint's torch_dtype on cuda, float32 on cpu)");
  return [a] {
    HEARTH_CHECK(a->steps >= 1, "--steps must be >= 1, got ", a->steps);
    for (int64_t t : a->seq_lens) HEARTH_CHECK(t >= 2, "--seq-lens: each length must be >= 2, got ", t);
    for (int64_t s : a->segment_sizes) HEARTH_CHECK(s >= 0, "--segment-sizes: each must be >= 0, got ", s);
    auto model = hearth::models::load_model(a->model, hearth::nn::resolve_placement(a->device, a->dtype, a->model));
    std::cout << "model: " << a->model << " (" << model->num_layers() << " layers) on "
              << model->placement().device << " " << model->placement().dtype << ", LoRA rank " << a->lora_rank
              << ", " << a->steps << " timed steps per cell\n";
    std::cout << "seq_len  segment  tokens/s   peak GB\n";
    for (int64_t T : a->seq_lens) {
      for (int64_t seg : a->segment_sizes) {
        Cell c = run_cell(*model, *a, T, seg);
        std::ostringstream line;
        line << std::setw(7) << T << "  " << std::setw(7) << (seg == 0 ? std::string("off") : std::to_string(seg)) << "  ";
        if (c.oom) line << "OOM";
        else line << std::setw(9) << std::fixed << std::setprecision(1) << c.tokens_per_s << "  " << std::setprecision(3)
                  << static_cast<double>(c.peak_bytes) / 1e9;
        std::cout << line.str() << std::endl;
      }
    }
    return 0;
  };
}

}  // namespace

HEARTH_REGISTER_VERB(bench_train, "bench-train", "Measure LoRA training speed and peak memory over sequence lengths and segment sizes",
                     setup_bench_train);
