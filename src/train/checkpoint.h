// checkpoint.json of a training run (trainer.h): its fields, writing and reading them (one-line
// errors naming the file and field), what a resumed run must share with the checkpoint, and the
// names of the optimizer files a checkpoint points at. Not the writing of the weights and optimizer
// state themselves, nor the loop (trainer.cpp).
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace hearth::train {

struct TrainConfig;

/// The fields of checkpoint.json. The adapter's shape settings (num_layers, and for LoRA
/// lora_rank, lora_scale, lora_keys) are absent from checkpoints written before they were
/// recorded: nullopt then, and only the per-parameter check of the optimizer file guards them.
struct CheckpointRecord {
  int64_t step = 0, epoch = 0, batch_index = 0, batch_size = 0, grad_accumulation_steps = 0;
  uint64_t seed = 0;
  std::string fine_tune_type, optimizer;
  std::string method = "sft";  // absent in checkpoints from before preference training
  std::optional<int64_t> num_layers;                    // --num-layers (-1 = all)
  std::optional<int64_t> lora_rank;                     // LoRA only
  std::optional<double> lora_scale;                     // LoRA only
  std::optional<std::vector<std::string>> lora_keys;    // LoRA only: the keys in effect (defaults spelled out)
  std::optional<int64_t> batches;                       // batches per epoch of the data it trained on
};

/// The text of checkpoint.json for `cfg` at optimizer step `step`, data position (`epoch`,
/// `batch_index`) in `batches` batches per epoch, and optimizer file `optimizer`: every field of
/// CheckpointRecord.
std::string checkpoint_json(const TrainConfig& cfg, int64_t step, int64_t epoch, int64_t batch_index,
                            int64_t batches, const std::string& optimizer);

/// Reads <dir>/checkpoint.json. Throws hearth::Error (one line naming the file and the field) when
/// it is missing, not a JSON object, a field is missing or of the wrong type / range, or
/// "optimizer" does not name an optimizer file.
CheckpointRecord read_checkpoint(const std::filesystem::path& dir);

/// Throws hearth::Error unless the run `cfg` may continue the checkpoint `ck` read from `dir`: the
/// same fine-tune type and method, seed, batch size, gradient accumulation, and (when the
/// checkpoint records them) --num-layers, --lora-rank, --lora-scale and --lora-keys (compared as
/// sets, an empty cfg.lora_keys meaning the defaults). One line naming checkpoint.json, the flag
/// and both values (for --lora-keys also the keys only one side has).
void check_checkpoint_matches(const CheckpointRecord& ck, const TrainConfig& cfg, const std::filesystem::path& dir);

/// The optimizer file of the checkpoint at `step`: "optimizer.<step>.safetensors" (a new name per
/// step, so writing it never touches the file the current checkpoint.json names).
std::string optimizer_file(int64_t step);

/// Whether `name` is an optimizer file a checkpoint may name ("optimizer.safetensors" from before
/// per-step names, or "optimizer.<digits>.safetensors").
bool is_optimizer_file(const std::string& name);

}  // namespace hearth::train
