// LoRA glue for the trainer (lora_params.h) over src/adapters and nn::Linear's adapter scopes.
#include "io/atomic_file.h"
#include "train/lora_params.h"

#include "adapters/adapter.h"
#include "adapters/mount.h"
#include "core/error.h"
#include "nn/linear.h"
#include "train/trainer.h"

namespace hearth::train {

namespace {
const char* kTrainId = "train";
}

struct LoraRun::Impl {
  models::Model& model;
  adapters::Adapter adapter;
  std::unique_ptr<nn::ActiveAdapters> active;
  std::unique_ptr<nn::LoraDropoutScope> dropout;
  uint64_t seed = 0;
};

LoraRun::LoraRun(models::Model& model, const TrainConfig& cfg) {
  adapters::LoraConfig lc;
  lc.rank = cfg.lora_rank;
  lc.scale = cfg.lora_scale;
  lc.dropout = cfg.lora_dropout;
  lc.keys = cfg.lora_keys;
  lc.every_key_must_match = !cfg.lora_keys.empty();  // named by the user (or a checkpoint), not the defaults
  lc.num_layers = cfg.num_layers;
  HEARTH_CHECK(cfg.lora_dropout >= 0 && cfg.lora_dropout < 1, "--lora-dropout must be in [0, 1), got ",
               cfg.lora_dropout);
  impl_ = std::unique_ptr<Impl>(new Impl{model, adapters::attach_trainable(model, lc, cfg.seed, kTrainId), {}, {}, cfg.seed});
  impl_->active = std::make_unique<nn::ActiveAdapters>(std::vector<std::string>{kTrainId});
}

LoraRun::~LoraRun() {
  impl_->dropout.reset();
  impl_->active.reset();
  adapters::unmount(impl_->model, kTrainId);
}

std::vector<TrainableParam> LoraRun::params() const {
  std::vector<TrainableParam> out;
  for (const auto& [path, ad] : impl_->adapter.modules) {
    const int64_t layer = adapters::layer_index(path);
    for (const auto& [suffix, t] : {std::pair<const char*, at::Tensor>{".lora_A", ad.a}, {".lora_B", ad.b}}) {
      TrainableParam p{path + suffix, t, layer};
      p.in_head = layer < 0;  // lm_head: used by the head
      out.push_back(std::move(p));
    }
  }
  return out;
}

void LoraRun::save(const std::filesystem::path& dir, const std::string& format) const {
  // save_adapter replaces its whole folder: write into a scratch folder, then move the files
  // (each rename atomic) beside the checkpoint files.
  const auto scratch = dir / ".adapter.tmp";
  hearth::io::remove_tree(scratch);
  adapters::save_adapter(scratch, impl_->adapter, format == "peft" ? adapters::Format::Peft : adapters::Format::Mlx);
  for (const auto& e : std::filesystem::directory_iterator(scratch))
    std::filesystem::rename(e.path(), dir / e.path().filename());
  hearth::io::remove_tree(scratch);
  // A folder that held the other layout's weights (--overwrite with another --adapter-format):
  // remove them once these are in place, or a loader preferring that layout would read the old ones.
  std::error_code ec;
  std::filesystem::remove(dir / (format == "peft" ? "adapters.safetensors" : "adapter_model.safetensors"), ec);
}

void LoraRun::set_training(bool on) {
  if (on && !impl_->dropout) impl_->dropout = std::make_unique<nn::LoraDropoutScope>(impl_->seed);
  if (!on) impl_->dropout.reset();
}

void LoraRun::reseed(uint64_t seed) { nn::LoraDropoutScope::reseed(seed); }

}  // namespace hearth::train
