// `hearth bench-train`: training speed and peak memory of LoRA SFT steps on random tokens, for a
// grid of sequence lengths × segment sizes (0 = plain full backward), optionally with offloaded
// boundaries and chunked MLPs. Each cell: one warmup step, then timed steps (backward + AdamW), the
// allocator's peak measured from a reset; or, with --max-backward-segments K, one step that stops
// after K backward segments and prints their times ("PARTIAL"; "WHOLE BACKWARD" when it had no more
// segments than K, as the unsegmented cell). A cell that runs out of memory prints "OOM" and the
// grid goes on. Not a trainer (`hearth train`).
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>

#include "cli/threads_option.h"
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
  bool offload = false;
  double offload_host_limit_gb = 0;
  int64_t mlp_chunk = 0, max_backward_segments = 0;
};

struct Cell {
  bool oom = false;
  std::string oom_what;  // the first line of the allocator's message (the size it tried)
  double tokens_per_s = 0;
  int64_t peak_bytes = 0;
  int64_t boundary_device_bytes = 0, boundary_host_bytes = 0;
  // --max-backward-segments: seconds of the forward + loss head, then of each backward segment run;
  // `stopped`: the step ended after K segments (false: its whole backward ran, and for the full
  // backward forward_s is the forward + loss head + backward).
  bool partial = false, stopped = false;
  int64_t segments = 0;
  double forward_s = 0;
  std::vector<double> segment_s;
};

struct StopBackward {};  // thrown from on_segment to end a partial step

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
  o.offload_boundaries = a.offload;
  o.offload_host_limit_bytes = static_cast<int64_t>(a.offload_host_limit_gb * 1e9);
  o.mlp_chunk = a.mlp_chunk;
  Cell c;
  try {
    if (a.max_backward_segments > 0) {
      // One step, no warmup: time the forward (+ loss head) and each backward segment, stop after K.
      c.partial = true;
      c.segments = seg > 0 ? static_cast<int64_t>(train::plan_segments(model.num_layers(), seg).size()) : 1;
      compat::synchronize(dev);
      compat::reset_peak_memory(dev);
      auto last = std::chrono::steady_clock::now();
      bool in_backward = false;
      auto lap = [&] {
        compat::synchronize(dev);
        const auto now = std::chrono::steady_clock::now();
        const double s = std::chrono::duration<double>(now - last).count();
        last = now;
        return s;
      };
      o.on_segment = [&](size_t, bool recompute) {
        if (!recompute) return;
        if (!in_backward) {
          c.forward_s = lap();
          in_backward = true;
        } else {
          c.segment_s.push_back(lap());
        }
        if (static_cast<int64_t>(c.segment_s.size()) >= a.max_backward_segments) throw StopBackward{};
      };
      try {
        train::BackwardResult r = train::backward(stack, ids, targets, o);
        if (in_backward) c.segment_s.push_back(lap());
        else c.forward_s = lap();  // the full backward: no segments
        c.boundary_device_bytes = r.boundary_device_bytes;
        c.boundary_host_bytes = r.boundary_host_bytes;
      } catch (const StopBackward&) {
        c.stopped = true;
      }
      compat::synchronize(dev);
      c.peak_bytes = compat::peak_memory_bytes(dev);
      opt.zero_grad();
      return c;
    }
    train::backward(stack, ids, targets, o);  // warmup (allocator, kernels)
    opt.step();
    opt.zero_grad();
    compat::synchronize(dev);
    compat::reset_peak_memory(dev);
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t s = 0; s < a.steps; ++s) {
      train::BackwardResult r = train::backward(stack, ids, targets, o);
      c.boundary_device_bytes = r.boundary_device_bytes;
      c.boundary_host_bytes = r.boundary_host_bytes;
      opt.step();
      opt.zero_grad();
    }
    compat::synchronize(dev);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    c.tokens_per_s = static_cast<double>(T * a.steps) / secs;
    c.peak_bytes = compat::peak_memory_bytes(dev);
  } catch (const c10::Error& e) {
    const std::string what = e.what();
    if (what.find("out of memory") == std::string::npos) throw;
    c.oom = true;
    c.oom_what = what.substr(0, std::min(what.find('\n'), size_t{160}));
  }
  return c;
}

std::string gb(int64_t bytes) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(3) << static_cast<double>(bytes) / 1e9;
  return s.str();
}

std::function<int()> setup_bench_train(CLI::App& app) {
  auto a = std::make_shared<BenchTrainArgs>();
  app.add_option("--model", a->model, "Model folder")->required();
  app.add_option("--seq-lens", a->seq_lens, "Sequence lengths (default 2048 8192)");
  app.add_option("--segment-sizes", a->segment_sizes, "Layers per backward segment; 0 = full (default 0 4 1)");
  app.add_option("--steps", a->steps, "Timed steps per cell after one warmup (default 2)");
  app.add_option("--lora-rank", a->lora_rank, "LoRA rank on q,k,v,o,gate,up,down (default 8)");
  app.add_option("--loss-chunk", a->loss_chunk, "Positions per loss-head chunk (default 1024)");
  app.add_flag("--offload-boundaries", a->offload,
               "Segmented cells: saved boundaries in host memory (pinned on CUDA), copied back one segment ahead");
  app.add_option("--offload-host-limit", a->offload_host_limit_gb,
                 "With --offload-boundaries: host GB the copies may take; the rest stay on the device (default 0 = no limit)");
  app.add_option("--mlp-chunk", a->mlp_chunk, "Positions per MLP chunk (chunked checkpoint); 0 = off (default)");
  app.add_option("--max-backward-segments", a->max_backward_segments,
                 "Partial cells: one step without warmup that stops after this many backward segments, printing the "
                 "forward time, each segment's time and the peak so far (PARTIAL); a cell with no more segments than "
                 "that, as segment size 0 (the full backward), runs its whole backward and says so (WHOLE BACKWARD) "
                 "(default 0 = whole timed steps)");
  app.add_option("--device", a->device, "cpu | cuda (default: cuda when available)");
  hearth::cli::add_threads_option(app);
  app.add_option("--dtype", a->dtype, "float32 | bfloat16 | float16 (default: the checkpoint's torch_dtype on cuda, float32 on cpu)");
  return [a] {
    HEARTH_CHECK(a->steps >= 1, "--steps must be >= 1, got ", a->steps);
    for (int64_t t : a->seq_lens) HEARTH_CHECK(t >= 2, "--seq-lens: each length must be >= 2, got ", t);
    for (int64_t s : a->segment_sizes) HEARTH_CHECK(s >= 0, "--segment-sizes: each must be >= 0, got ", s);
    HEARTH_CHECK(a->mlp_chunk >= 0, "--mlp-chunk must be >= 0 (0 = off), got ", a->mlp_chunk);
    HEARTH_CHECK(a->max_backward_segments >= 0, "--max-backward-segments must be >= 0 (0 = whole steps), got ",
                 a->max_backward_segments);
    HEARTH_CHECK(std::isfinite(a->offload_host_limit_gb) && a->offload_host_limit_gb >= 0,
                 "--offload-host-limit must be a number of GB >= 0 (0 = no limit), got ", a->offload_host_limit_gb);
    HEARTH_CHECK(a->offload_host_limit_gb == 0 || a->offload, "--offload-host-limit needs --offload-boundaries");
    auto model = hearth::models::load_model(a->model, hearth::nn::resolve_placement(a->device, a->dtype, a->model));
    std::cout << "model: " << a->model << " (" << model->num_layers() << " layers) on "
              << model->placement().device << " " << model->placement().dtype << ", LoRA rank " << a->lora_rank
              << ", "
              << (a->max_backward_segments > 0
                      ? "one step stopped after " + std::to_string(a->max_backward_segments) + " backward segment(s)"
                      : std::to_string(a->steps) + " timed steps")
              << " per cell, boundaries " << (a->offload ? "offloaded" : "on the device") << ", MLP chunk "
              << (a->mlp_chunk > 0 ? std::to_string(a->mlp_chunk) : std::string("off")) << "\n";
    if (a->max_backward_segments == 0) std::cout << "seq_len  segment  tokens/s   peak GB  boundaries GB (device / host)\n";
    for (int64_t T : a->seq_lens) {
      for (int64_t seg : a->segment_sizes) {
        Cell c = run_cell(*model, *a, T, seg);
        std::ostringstream line;
        line << std::setw(7) << T << "  " << std::setw(7) << (seg == 0 ? std::string("off") : std::to_string(seg)) << "  ";
        if (c.oom) {
          line << "OOM (" << c.oom_what << ")";
        } else if (c.partial && seg == 0) {
          line << "WHOLE BACKWARD (full backward: no segments to stop after): forward + loss head + backward "
               << std::fixed << std::setprecision(1) << c.forward_s << " s; peak " << gb(c.peak_bytes) << " GB";
        } else if (c.partial && !c.stopped) {
          line << "WHOLE BACKWARD: all " << c.segment_s.size() << " of " << c.segments
               << " backward segments; forward + loss head " << std::fixed << std::setprecision(1) << c.forward_s
               << " s; segments (from the last layer down)";
          for (double s : c.segment_s) line << " " << std::setprecision(1) << s;
          line << " s; peak " << gb(c.peak_bytes) << " GB";
        } else if (c.partial) {
          line << "PARTIAL: " << c.segment_s.size() << " of " << c.segments << " backward segments; forward + loss head "
               << std::fixed << std::setprecision(1) << c.forward_s << " s; segments (from the last layer down)";
          for (double s : c.segment_s) line << " " << std::setprecision(1) << s;
          line << " s; peak so far " << gb(c.peak_bytes) << " GB";
        } else {
          line << std::setw(9) << std::fixed << std::setprecision(1) << c.tokens_per_s << "  " << gb(c.peak_bytes)
               << "  " << gb(c.boundary_device_bytes) << " / " << gb(c.boundary_host_bytes);
        }
        std::cout << line.str() << std::endl;
      }
    }
    return 0;
  };
}

}  // namespace

HEARTH_REGISTER_VERB(bench_train, "bench-train", "Measure LoRA training speed and peak memory over sequence lengths and segment sizes",
                     setup_bench_train);
