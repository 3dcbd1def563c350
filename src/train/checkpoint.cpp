// checkpoint.json of a training run (checkpoint.h): writing, reading with one-line errors, and the
// resume compatibility check.
#include "train/checkpoint.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "adapters/adapter.h"
#include "core/error.h"
#include "io/hf_config.h"
#include "train/trainer.h"

namespace hearth::train {

namespace {

std::string ckpt_describe(const nlohmann::json& v) {
  if (v.is_string()) return "a string";
  if (v.is_object()) return "an object";
  if (v.is_array()) return "an array";
  std::string d = v.dump();
  return d.size() > 40 ? d.substr(0, 40) + "..." : d;
}

const nlohmann::json& ckpt_need(const nlohmann::json& ck, const char* key, const std::string& origin) {
  auto it = ck.find(key);
  HEARTH_CHECK(it != ck.end(), origin, ": missing \"", key, "\"");
  return *it;
}

uint64_t ckpt_count(const nlohmann::json& ck, const char* key, const std::string& origin) {
  const nlohmann::json& v = ckpt_need(ck, key, origin);
  HEARTH_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0), origin, ": \"", key,
               "\" must be a non-negative integer, got ", ckpt_describe(v));
  return v.get<uint64_t>();
}

int64_t ckpt_index(const nlohmann::json& ck, const char* key, const std::string& origin) {
  const uint64_t v = ckpt_count(ck, key, origin);
  HEARTH_CHECK(v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), origin, ": \"", key, "\" is too large: ", v);
  return static_cast<int64_t>(v);
}

std::string ckpt_string(const nlohmann::json& ck, const char* key, const std::string& origin) {
  const nlohmann::json& v = ckpt_need(ck, key, origin);
  HEARTH_CHECK(v.is_string(), origin, ": \"", key, "\" must be a string, got ", ckpt_describe(v));
  return v.get<std::string>();
}

// The LoRA keys a run of `cfg` targets, the defaults spelled out.
std::vector<std::string> ckpt_keys_in_effect(const TrainConfig& cfg) {
  return cfg.lora_keys.empty() ? adapters::default_keys() : cfg.lora_keys;
}

std::string ckpt_join(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) out += (out.empty() ? "" : ",") + k;
  return out;
}

}  // namespace

std::string optimizer_file(int64_t step) { return "optimizer." + std::to_string(step) + ".safetensors"; }

bool is_optimizer_file(const std::string& name) {
  static const std::string kPre = "optimizer.", kSuf = ".safetensors";
  if (name == "optimizer.safetensors") return true;
  if (name.size() <= kPre.size() + kSuf.size() || name.rfind(kPre, 0) != 0 ||
      name.compare(name.size() - kSuf.size(), kSuf.size(), kSuf) != 0)
    return false;
  const std::string mid = name.substr(kPre.size(), name.size() - kPre.size() - kSuf.size());
  return std::all_of(mid.begin(), mid.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string checkpoint_json(const TrainConfig& cfg, int64_t step, int64_t epoch, int64_t batch_index,
                            int64_t batches, const std::string& optimizer) {
  nlohmann::json ck = {{"step", step},
                       {"epoch", epoch},
                       {"batch_index", batch_index},
                       {"batches", batches},
                       {"seed", cfg.seed},
                       {"fine_tune_type", cfg.fine_tune_type},
                       {"method", cfg.method},
                       {"batch_size", cfg.batch_size},
                       {"grad_accumulation_steps", cfg.grad_accumulation_steps},
                       {"num_layers", cfg.num_layers},
                       {"optimizer", optimizer}};
  if (cfg.fine_tune_type == "lora") {
    ck["lora_rank"] = cfg.lora_rank;
    ck["lora_scale"] = cfg.lora_scale;
    ck["lora_keys"] = ckpt_keys_in_effect(cfg);
  }
  return ck.dump(2) + "\n";
}

CheckpointRecord read_checkpoint(const std::filesystem::path& dir) {
  const std::string origin = (dir / "checkpoint.json").string();
  const nlohmann::json ck = io::read_json(dir / "checkpoint.json");
  HEARTH_CHECK(ck.is_object(), origin, ": must be a JSON object, got ", ckpt_describe(ck));
  CheckpointRecord r;
  r.step = ckpt_index(ck, "step", origin);
  r.epoch = ckpt_index(ck, "epoch", origin);
  r.batch_index = ckpt_index(ck, "batch_index", origin);
  r.batch_size = ckpt_index(ck, "batch_size", origin);
  r.grad_accumulation_steps = ckpt_index(ck, "grad_accumulation_steps", origin);
  r.seed = ckpt_count(ck, "seed", origin);
  r.fine_tune_type = ckpt_string(ck, "fine_tune_type", origin);
  if (ck.contains("method")) r.method = ckpt_string(ck, "method", origin);
  // checkpoints from before per-step optimizer files name none: theirs is optimizer.safetensors
  r.optimizer = ck.contains("optimizer") ? ckpt_string(ck, "optimizer", origin) : "optimizer.safetensors";
  HEARTH_CHECK(is_optimizer_file(r.optimizer), origin, ": \"optimizer\" must name an optimizer file in the folder "
               "(optimizer.<step>.safetensors), got '", r.optimizer.substr(0, 80), "'");
  // The adapter's shape settings, recorded since resumes were checked against them.
  if (auto it = ck.find("num_layers"); it != ck.end()) {
    HEARTH_CHECK(it->is_number_integer() && (it->get<int64_t>() == -1 || it->get<int64_t>() >= 1), origin,
                 ": \"num_layers\" must be -1 or an integer >= 1, got ", ckpt_describe(*it));
    r.num_layers = it->get<int64_t>();
  }
  if (ck.contains("lora_rank")) r.lora_rank = ckpt_index(ck, "lora_rank", origin);
  if (ck.contains("batches")) r.batches = ckpt_index(ck, "batches", origin);
  if (auto it = ck.find("lora_scale"); it != ck.end()) {
    HEARTH_CHECK(it->is_number() && std::isfinite(it->get<double>()), origin,
                 ": \"lora_scale\" must be a number, got ", ckpt_describe(*it));
    r.lora_scale = it->get<double>();
  }
  if (auto it = ck.find("lora_keys"); it != ck.end()) {
    HEARTH_CHECK(it->is_array() && std::all_of(it->begin(), it->end(), [](const nlohmann::json& k) { return k.is_string(); }),
                 origin, ": \"lora_keys\" must be an array of strings, got ", ckpt_describe(*it));
    r.lora_keys = it->get<std::vector<std::string>>();
  }
  return r;
}

void check_checkpoint_matches(const CheckpointRecord& ck, const TrainConfig& cfg, const std::filesystem::path& dir) {
  const std::string origin = (dir / "checkpoint.json").string();
  HEARTH_CHECK(ck.fine_tune_type == cfg.fine_tune_type, origin, ": the checkpoint is a ", ck.fine_tune_type,
               " fine-tune, this run is ", cfg.fine_tune_type);
  HEARTH_CHECK(ck.method == cfg.method, origin, ": the checkpoint was trained with --method ", ck.method,
               ", this run is --method ", cfg.method);
  HEARTH_CHECK(ck.seed == cfg.seed, origin, ": --seed ", cfg.seed, " differs from the checkpoint's ", ck.seed,
               " (resume with the checkpoint's value)");
  HEARTH_CHECK(ck.batch_size == cfg.batch_size, origin, ": --batch-size ", cfg.batch_size,
               " differs from the checkpoint's ", ck.batch_size, " (resume with the checkpoint's value)");
  HEARTH_CHECK(ck.grad_accumulation_steps == cfg.grad_accumulation_steps, origin, ": --grad-accumulation-steps ",
               cfg.grad_accumulation_steps, " differs from the checkpoint's ", ck.grad_accumulation_steps,
               " (resume with the checkpoint's value)");
  // Which weights are trained: another set would drop or miss some of the checkpoint's.
  HEARTH_CHECK(!ck.num_layers || *ck.num_layers == cfg.num_layers, origin, ": --num-layers ", cfg.num_layers,
               " differs from the checkpoint's ", ck.num_layers.value_or(0), " (resume with the checkpoint's value)");
  if (cfg.fine_tune_type != "lora") return;
  HEARTH_CHECK(!ck.lora_rank || *ck.lora_rank == cfg.lora_rank, origin, ": --lora-rank ", cfg.lora_rank,
               " differs from the checkpoint's ", ck.lora_rank.value_or(0), " (resume with the checkpoint's value)");
  HEARTH_CHECK(!ck.lora_scale || *ck.lora_scale == cfg.lora_scale, origin, ": --lora-scale ", cfg.lora_scale,
               " differs from the checkpoint's ", ck.lora_scale.value_or(0), " (resume with the checkpoint's value)");
  if (ck.lora_keys) {
    const std::vector<std::string> mine = ckpt_keys_in_effect(cfg);
    const std::set<std::string> a(mine.begin(), mine.end()), b(ck.lora_keys->begin(), ck.lora_keys->end());
    if (a != b) {
      // Name the keys that differ, each side's in its own order (long default lists hide them).
      std::vector<std::string> only_ck, only_run;
      for (const auto& k : *ck.lora_keys)
        if (!a.count(k) && std::find(only_ck.begin(), only_ck.end(), k) == only_ck.end()) only_ck.push_back(k);
      for (const auto& k : mine)
        if (!b.count(k) && std::find(only_run.begin(), only_run.end(), k) == only_run.end()) only_run.push_back(k);
      throw Error(cat(origin, ": --lora-keys ", ckpt_join(mine), " differs from the checkpoint's ", ckpt_join(*ck.lora_keys),
                      only_ck.empty() ? "" : "; only the checkpoint trains " + ckpt_join(only_ck),
                      only_run.empty() ? "" : "; only this run targets " + ckpt_join(only_run),
                      " (resume with the checkpoint's value)"));
    }
  }
}

}  // namespace hearth::train
