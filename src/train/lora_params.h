// LoRA glue for the trainer: attaches a trainable adapter to a Model through src/adapters,
// lists its A/B leaves as TrainableParams by layer, switches LoRA dropout for training, and
// saves the adapter (mlx-lm or PEFT layout). Not the adapter formats themselves (adapters/).
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "models/model.h"

namespace hearth::train {

struct TrainConfig;
struct TrainableParam;

/// A trainable LoRA adapter mounted on a model for the length of a run (unmounted on destruction).
class LoraRun {
 public:
  /// Attaches adapter "train" with cfg's rank, scale, dropout, keys and num_layers, A drawn from
  /// cfg.seed, B = 0. Throws hearth::Error when no module matches.
  LoraRun(models::Model& model, const TrainConfig& cfg);
  ~LoraRun();
  LoraRun(const LoraRun&) = delete;
  LoraRun& operator=(const LoraRun&) = delete;

  /// The A/B leaves as "<module path>.lora_A" [r, in] / ".lora_B" [out, r], in path order.
  std::vector<TrainableParam> params() const;
  /// Writes the adapter into `dir` ("mlx": adapters.safetensors + adapter_config.json;
  /// "peft": adapter_model.safetensors + adapter_config.json), each file renamed into place;
  /// then removes the other layout's weights file if `dir` held one (so no loader reads it).
  void save(const std::filesystem::path& dir, const std::string& format) const;
  /// true: the adapter is active with dropout on (training); false: active, dropout off (eval).
  void set_training(bool on);
  /// Restarts the dropout mask stream (called per backward segment so recompute replays it).
  static void reseed(uint64_t seed);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace hearth::train
