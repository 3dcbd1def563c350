// Fusing a LoRA adapter into a model folder's weights (mlx-lm's `fuse`): W' = W + scale · B A, or a
// full fine-tune's trained tensors over the base's, written as a new, complete model folder. Works
// on the safetensors files directly (any family whose weights use HF names). Not runtime mounting
// (mount.h).
#pragma once
#include <filesystem>
#include <functional>

#include "adapters/adapter.h"

namespace hearth::adapters {

struct FuseOptions {
  /// Write every MLX-quantized tensor (fused or not) as a dense weight in its scales' dtype and
  /// drop the quantization block from config.json (mlx-lm's --de-quantize writes float16; we keep
  /// the checkpoint's dtype).
  bool dequantize = false;
  /// Called before each adapter module is merged, before each tensor is written and before the
  /// folder is renamed into place (empty: never). Whatever it throws stops the fuse: the temp
  /// folder is removed and the exception propagates (the CLI's SIGINT check, cli/output_folder.h).
  std::function<void()> between_tensors;
};

/// Reads `model_dir` (config.json + safetensors shards), merges `adapter` into the weights it
/// targets and writes the whole folder to `out_dir` (which must not exist): every top-level
/// regular file other than the shards and their index is copied; shards keep their names and
/// metadata. Merge: in fp32, W' = W + scale · (B [out, r] · A [r, in]), cast once to W's dtype;
/// a quantized module is dequantized, merged, cast to its scales' dtype and requantized with its
/// own spec (bits, group_size), as mlx-lm's LoRALinear.fuse. The folder is written under a temp
/// name beside `out_dir` and renamed into place at the end (no partial output on error).
/// Throws hearth::Error on: `out_dir` existing, a targeted module missing from the weights,
/// shape mismatches, a tied lm_head (no lm_head.weight), I/O failures.
void fuse_model(const std::filesystem::path& model_dir, const Adapter& adapter,
                const std::filesystem::path& out_dir, const FuseOptions& opts = {});

/// Writes `model_dir` with the full fine-tune in `finetune_dir` (fine_tune_type "full", see
/// full.h) over its weights to `out_dir` (which must not exist), as mlx-lm's fuse does after
/// load_adapters put the trained tensors in the model: every trained tensor replaces the base's
/// (cast to its dtype; on an MLX-quantized base, quantized with the module's own spec, or dense with
/// opts.dequantize), the rest of the folder (config, other weights, tokenizer and generation files)
/// is copied. Atomic like fuse_model. Throws hearth::Error on: `out_dir` existing, a folder that is
/// not a full fine-tune, a trained tensor the base lacks or whose shape differs, I/O failures.
void fuse_full_model(const std::filesystem::path& model_dir, const std::filesystem::path& finetune_dir,
                     const std::filesystem::path& out_dir, const FuseOptions& opts = {});

}  // namespace hearth::adapters
