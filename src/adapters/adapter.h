// LoRA adapters as data: the config, the per-module A/B tensors, and reading/writing the two
// on-disk layouts in the wild (mlx-lm's adapters.safetensors, PEFT's adapter_model.safetensors).
// Not attaching to a model (mount.h) or merging into weights (fuse.h).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "io/read_file.h"
#include "nn/linear.h"

namespace hearth::adapters {

/// LoRA hyper-parameters. `scale` is the effective multiplier of B·A: mlx-lm's
/// lora_parameters.scale; PEFT's lora_alpha / r (lora_alpha / sqrt(r) with use_rslora).
struct LoraConfig {
  int64_t rank = 8;
  double scale = 20.0;
  double dropout = 0.0;
  /// Module-path suffixes ("self_attn.q_proj", "q_proj", "lm_head"): a module matches when its
  /// path equals a key or ends with "." + key (PEFT's target_modules rule). Empty = the q, k, v, o,
  /// gate, up, down projections.
  std::vector<std::string> keys;
  /// true: every key must match some module of the model (keys a user named: `--lora-keys`), else
  /// InvalidArgument naming it; false: PEFT's rule, an error only when no key matches at all.
  bool every_key_must_match = false;
  /// Only the last N decoder blocks ("model.layers.N."); -1 = all.
  int64_t num_layers = -1;
};

/// A loaded or trained adapter: module path ("model.layers.0.self_attn.q_proj") → A [r, in],
/// B [out, r], effective scale, dropout. Tensors keep the file's dtype on CPU after load_adapter;
/// mount() places them on the model's device and dtype.
enum class Format { Mlx, Peft };

struct Adapter {
  std::string id;
  Format format = Format::Mlx;  // the layout it was read from (load_adapter) or will be written in
  std::string fine_tune_type = "lora";
  LoraConfig config;
  std::string base_model;  // base_model_name_or_path when recorded; informational
  std::map<std::string, nn::LoraAdapter> modules;
};

/// The default LoRA targets when LoraConfig::keys is empty.
const std::vector<std::string>& default_keys();

/// True when module `path` matches `key` (path == key or path ends with "." + key).
bool key_matches(const std::string& path, const std::string& key);

/// The decoder-block index of a module path "model.layers.N.…", or -1.
int64_t layer_index(const std::string& path);

/// `path` as `names` (sorted) holds it: itself when present, else the one name that is, or ends
/// with "." and, path's tail — from "layers.N." on, else path without a leading "model." — the
/// same module of a checkpoint wrapped another way ("model.layers.0.mlp.up_proj" ↔
/// "model.language_model.layers.0.mlp.up_proj" ↔ "language_model.model.layers.0.mlp.up_proj",
/// "model.embed_tokens.weight" ↔ "model.language_model.embed_tokens.weight", "lm_head" ↔
/// "language_model.lm_head"), as an adapter trained on a text-only checkpoint names a wrapped
/// one's; nullopt when absent or when two names share the tail.
std::optional<std::string> resolve_module_path(const std::string& path, const std::vector<std::string>& names);

/// Module path → {in_features, out_features} of the model's Linear modules (mount.h module_shapes).
using ModuleShapes = std::map<std::string, std::pair<int64_t, int64_t>>;

/// How load_adapter may read an adapter folder.
struct LoadAdapterOptions {
  /// When non-empty, every file read (config and weights, symlinks followed) must resolve under
  /// one of these folders (the server's allowed adapter folders).
  io::Roots roots;
  /// When given, every module must be one of these, with A/B shapes that fit it; checked from the
  /// safetensors header before any tensor data is read or copied.
  const ModuleShapes* shapes = nullptr;
};

/// Largest |effective scale| accepted (mlx-lm's default is 20; PEFT's alpha / r is usually 0.5-4):
/// beyond it B·A·scale overflows half precision or is a typo.
constexpr double kMaxLoraScale = 1e4;
/// Largest LoRA rank accepted in a config.
constexpr int64_t kMaxLoraRank = 65536;

/// Throws hearth::InvalidArgument "adapter id '<id>': ..." unless `id` is non-empty, not "none",
/// has no '+' or ',' (they separate ids in a selection) and no control characters; the id is quoted
/// with control bytes escaped.
void check_adapter_id(const std::string& id);

/// Reads an adapter folder, detecting the layout:
///   mlx-lm: adapters.safetensors ("<module>.lora_a" [in, r], "<module>.lora_b" [r, out]) +
///           adapter_config.json {fine_tune_type, num_layers, lora_parameters: {rank, scale,
///           dropout, keys?, rs_lora?}} (mlx-lm tuner/utils.py load_adapters);
///   PEFT:   adapter_model.safetensors ("base_model.model.<module>.lora_A.weight" [r, in],
///           ".lora_B.weight" [out, r]) + adapter_config.json {peft_type "LORA", r, lora_alpha,
///           target_modules, lora_dropout, use_rslora, rank_pattern, alpha_pattern, ...}.
/// `id` = the folder's name. Tensors are CPU copies in the file's dtype, PEFT orientation.
/// Throws hearth::Error (one line naming the file and module) on: missing folder/files, bad JSON,
/// unsupported variants (DoRA, a full fine-tune: "<dir>: full fine-tune ...: fuse it into a model
/// with hearth fuse ...", bias != "none", modules_to_save, fan_in_fan_out),
/// an unknown tensor name, a module with A but no B (or the reverse), non-2-D or non-float tensors,
/// A/B ranks that disagree with each other or with the config's rank (rank_pattern / alpha_pattern
/// keys matched as PEFT's get_pattern_key, bounded: adapters/pattern_key.h), ranks that are not
/// integers in [1, 65536], a scale that is not finite or over kMaxLoraScale, files that are not
/// regular or over the size caps (io/read_file.h), and whatever `options` asks to check.
/// All checks that the header allows run before tensor data is read.
Adapter load_adapter(const std::filesystem::path& dir, const LoadAdapterOptions& options = {});

/// Writes `adapter` to `dir` in `format` (tensors as stored, transposed to the layout's
/// orientation). The folder is built under a temp name and renamed into place; an existing `dir`
/// is replaced only after the new one is complete. mlx-lm: adapters.safetensors + adapter_config.json
/// with lora_parameters {rank, scale, dropout, keys} (keys relative to the block, so mlx-lm's
/// load_adapters finds every module). PEFT (loads in peft 0.21): adapter_model.safetensors +
/// adapter_config.json with r, lora_alpha = scale·r, target_modules (block-relative suffixes when
/// num_layers == -1, else full module paths), bias "none", task_type "CAUSAL_LM".
/// Throws hearth::Error on an empty adapter or I/O failure.
void save_adapter(const std::filesystem::path& dir, const Adapter& adapter, Format format);

}  // namespace hearth::adapters
