// Fusing a LoRA adapter into a model folder's weights (mlx-lm's `fuse`): W' = W + scale · B A,
// written as a new, complete model folder. Works on the safetensors files directly (any family
// whose Linear weights use HF names). Not runtime mounting (mount.h).
#pragma once
#include <filesystem>

#include "adapters/adapter.h"

namespace hearth::adapters {

struct FuseOptions {
  /// Write every MLX-quantized tensor (fused or not) as a dense weight in its scales' dtype and
  /// drop the quantization block from config.json (mlx-lm's --de-quantize writes float16; we keep
  /// the checkpoint's dtype).
  bool dequantize = false;
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

}  // namespace hearth::adapters
