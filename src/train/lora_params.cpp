// LoRA glue for the trainer (lora_params.h). Placeholder until src/adapters lands.
#include "train/lora_params.h"

#include "core/error.h"
#include "train/trainer.h"

namespace hearth::train {

struct LoraRun::Impl {};

LoraRun::LoraRun(models::Model&, const TrainConfig&) {
  throw Error("--fine-tune-type lora: LoRA training needs src/adapters (not in this build); use --fine-tune-type full");
}
LoraRun::~LoraRun() = default;
std::vector<TrainableParam> LoraRun::params() const { return {}; }
void LoraRun::save(const std::filesystem::path&, const std::string&) const {}
void LoraRun::set_training(bool) {}
void LoraRun::reseed(uint64_t) {}

}  // namespace hearth::train
