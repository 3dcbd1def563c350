// The option checks of a training run (trainer.h): check_config's ranges and names, made before
// any model or data is loaded. Not the loop or the checkpoint (trainer.cpp, with start_step), nor
// the CLI's folder checks (cli/train.cpp).
#include <cmath>
#include <filesystem>

#include "adapters/adapter.h"
#include "core/error.h"
#include "train/mixed_precision.h"
#include "train/optimizer.h"
#include "train/preference.h"
#include "train/trainer.h"

namespace hearth::train {

void check_config(const TrainConfig& c) {
  parse_method(c.method);
  HEARTH_CHECK(std::isfinite(c.beta) && c.beta > 0, "--beta must be a finite number > 0, got ", c.beta);
  HEARTH_CHECK(std::isfinite(c.orpo_lambda) && c.orpo_lambda >= 0, "--orpo-lambda must be a finite number >= 0, got ",
               c.orpo_lambda);
  HEARTH_CHECK(c.sft_scope == "response" || c.sft_scope == "full", "--sft-scope: '", c.sft_scope,
               "' is not response or full");
  HEARTH_CHECK(c.fine_tune_type == "lora" || c.fine_tune_type == "full", "--fine-tune-type: '", c.fine_tune_type,
               "' is not lora or full");
  // The ranges the adapter loader accepts (adapters/adapter.h), so the adapter trained can be loaded.
  HEARTH_CHECK(c.lora_rank >= 1 && c.lora_rank <= adapters::kMaxLoraRank, "--lora-rank must be in [1, ",
               adapters::kMaxLoraRank, "], got ", c.lora_rank);
  HEARTH_CHECK(std::isfinite(c.lora_scale) && c.lora_scale > 0 && c.lora_scale <= adapters::kMaxLoraScale,
               "--lora-scale must be a number in (0, ", adapters::kMaxLoraScale, "], got ", c.lora_scale);
  HEARTH_CHECK(c.lora_dropout >= 0 && c.lora_dropout < 1, "--lora-dropout must be in [0, 1), got ", c.lora_dropout);
  HEARTH_CHECK(c.max_seq_length >= 2 && c.max_seq_length <= kMaxSeqLength, "--max-seq-length must be in [2, ",
               kMaxSeqLength, "] tokens, got ", c.max_seq_length);
  HEARTH_CHECK(c.loss_chunk >= 1, "loss chunk must be >= 1 positions, got ", c.loss_chunk);
  HEARTH_CHECK(c.batch_size >= 1, "--batch-size must be >= 1, got ", c.batch_size);
  HEARTH_CHECK(c.iters >= 1, "--iters must be >= 1, got ", c.iters);
  HEARTH_CHECK(c.grad_accumulation_steps >= 1, "--grad-accumulation-steps must be >= 1, got ",
               c.grad_accumulation_steps);
  HEARTH_CHECK(std::isfinite(c.learning_rate) && c.learning_rate >= 0, "--learning-rate must be a finite number >= 0, got ",
               c.learning_rate);
  Schedule::parse(c.lr_schedule);
  HEARTH_CHECK(c.warmup >= 0, "--warmup must be >= 0, got ", c.warmup);
  HEARTH_CHECK(std::isfinite(c.weight_decay) && c.weight_decay >= 0, "--weight-decay must be a finite number >= 0, got ",
               c.weight_decay);
  HEARTH_CHECK(c.steps_per_report >= 1, "--steps-per-report must be >= 1, got ", c.steps_per_report);
  HEARTH_CHECK(c.steps_per_eval >= 1, "--steps-per-eval must be >= 1, got ", c.steps_per_eval);
  HEARTH_CHECK(c.save_every >= 0, "--save-every must be >= 0, got ", c.save_every);
  HEARTH_CHECK(c.segment_size >= 0, "--segment-size must be >= 0, got ", c.segment_size);
  HEARTH_CHECK(!c.offload_boundaries || c.segment_size > 0,
               "--offload-boundaries needs --segment-size >= 1 (the full backward keeps no boundaries to offload)");
  HEARTH_CHECK(std::isfinite(c.offload_host_limit_gb) && c.offload_host_limit_gb >= 0,
               "--offload-host-limit must be a number of GB >= 0 (0 = no limit), got ", c.offload_host_limit_gb);
  HEARTH_CHECK(c.offload_host_limit_gb == 0 || c.offload_boundaries, "--offload-host-limit needs --offload-boundaries");
  HEARTH_CHECK(c.mlp_chunk >= 0, "--mlp-chunk must be >= 0 (0 = off), got ", c.mlp_chunk);
  HEARTH_CHECK(c.mlp_chunk == 0 || c.lora_dropout == 0, "--mlp-chunk ", c.mlp_chunk,
               " recomputes the MLP in the backward and cannot replay LoRA dropout masks: use --lora-dropout 0 or "
               "--mlp-chunk 0");
  HEARTH_CHECK(c.num_layers == -1 || c.num_layers >= 1, "--num-layers must be -1 (all) or >= 1, got ", c.num_layers);
  HEARTH_CHECK(std::isfinite(c.grad_clip) && c.grad_clip >= 0, "--grad-clip must be a finite number >= 0 (0 = off), got ",
               c.grad_clip);
  HEARTH_CHECK(c.val_batches == -1 || c.val_batches >= 1, "--val-batches must be -1 (all) or >= 1, got ",
               c.val_batches);
  parse_mixed_precision(c.mixed_precision);
  HEARTH_CHECK(c.adapter_format == "mlx" || c.adapter_format == "peft", "--adapter-format: '", c.adapter_format,
               "' is not mlx or peft");
  HEARTH_CHECK(!c.adapter_path.empty(), "--adapter-path is required");
  std::error_code ec;
  HEARTH_CHECK(!std::filesystem::exists(c.adapter_path, ec) || std::filesystem::is_directory(c.adapter_path, ec),
               "--adapter-path ", c.adapter_path.string(), ": exists and is not a folder (the adapter, checkpoints and "
               "metrics.jsonl are written into a folder)");
  // The folder is created at the first write: an existing ancestor that is a file would fail then,
  // after the model has loaded, with a bare filesystem error.
  for (std::filesystem::path p = c.adapter_path.parent_path(); !p.empty(); p = p.parent_path()) {
    if (std::filesystem::exists(p, ec)) {
      HEARTH_CHECK(std::filesystem::is_directory(p, ec), "--adapter-path ", c.adapter_path.string(), ": ", p.string(),
                   " is not a folder");
      break;
    }
    if (p == p.parent_path()) break;
  }
}

}  // namespace hearth::train
