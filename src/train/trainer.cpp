// The fine-tuning loop (trainer.h): parameters, steps with accumulation, evaluation, reports,
// checkpoints and resume.
#include <c10/core/GradMode.h>
#include "train/trainer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "adapters/adapter.h"
#include "core/error.h"
#include "core/torch_compat.h"
#include "io/atomic_file.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "nn/fused_ops.h"
#include "nn/mlp_chunk.h"
#include "train/checkpoint.h"
#include "train/dataset.h"
#include "train/distributed.h"
#include "train/evaluation.h"
#include "train/loss.h"
#include "train/lora_params.h"
#include "train/mixed_precision.h"
#include "train/optimizer.h"
#include "train/preference.h"

namespace hearth::train {

namespace {

// Seed for the randomness (LoRA dropout) of one segment of one micro-batch of one step, so the
// segmented recompute replays the forward's masks and a resumed run draws what it would have.
uint64_t rng_seed(uint64_t seed, int64_t step, int64_t micro, size_t segment) {
  uint64_t h = seed * 0x9E3779B97F4A7C15ull;
  for (uint64_t v : {static_cast<uint64_t>(step), static_cast<uint64_t>(micro), static_cast<uint64_t>(segment)}) {
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  }
  return h & 0x7FFFFFFFFFFFFFFFull;
}

}  // namespace

namespace {

// Writes the trained weights in the adapter folder: LoRA via the adapters module; full as
// adapters.safetensors of HF-named weights + adapter_config.json (mlx-lm's full layout).
void save_weights(const TrainConfig& cfg, const std::vector<TrainableParam>& params, LoraRun* lora) {
  std::filesystem::create_directories(cfg.adapter_path);
  if (lora) {
    lora->save(cfg.adapter_path, cfg.adapter_format);
    return;
  }
  std::map<std::string, at::Tensor> w;
  for (const auto& p : params) w[p.name] = p.tensor.detach();
  io::save_safetensors(cfg.adapter_path / "adapters.safetensors", w, {{"format", "pt"}});
  nlohmann::json ac = {{"fine_tune_type", "full"}, {"num_layers", cfg.num_layers}};
  io::write_file_atomic(cfg.adapter_path / "adapter_config.json", ac.dump(2) + "\n");
}

// Writes a checkpoint so that a crash at any point leaves the last complete one loadable: the
// optimizer file under a new name beside the old, then checkpoint.json (atomic rename; it names
// its optimizer file, so it is the switch), then the files no checkpoint names any more.
void save_checkpoint(const TrainConfig& cfg, int64_t step, const Batcher& batcher, const NamedAdamW& opt,
                     const std::vector<TrainableParam>& params, LoraRun* lora) {
  const auto hook = [&](const char* stage) {
    if (cfg.checkpoint_hook) cfg.checkpoint_hook(stage);
  };
  save_weights(cfg, params, lora);  // the adapter output; the checkpoint keeps its own copy below
  hook("weights");
  std::map<std::string, at::Tensor> st = opt.state_tensors();
  for (const auto& p : params) st["param." + p.name] = p.tensor.detach();
  const std::string opt_name = optimizer_file(step);
  io::save_safetensors(cfg.adapter_path / opt_name, st, {{"step", std::to_string(step)}});
  hook("optimizer");
  io::write_file_atomic(cfg.adapter_path / "checkpoint.json",
                        checkpoint_json(cfg, step, batcher.epoch(), batcher.index(), batcher.num_batches(), opt_name));
  hook("manifest");
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(cfg.adapter_path, ec)) {
    const std::string name = e.path().filename().string();
    if (name != opt_name && is_optimizer_file(name)) std::filesystem::remove(e.path(), ec);
  }
  hook("cleanup");
}

// Restores parameters, optimizer state and data position; returns the checkpoint's step.
int64_t load_checkpoint(const TrainConfig& cfg, Batcher& batcher, NamedAdamW& opt,
                        const std::vector<TrainableParam>& params) {
  const auto dir = cfg.resume;
  const CheckpointRecord ck = read_checkpoint(dir);
  const int64_t step = ck.step;
  check_checkpoint_matches(ck, cfg, dir);
  auto f = io::SafetensorsFile::open(dir / ck.optimizer);
  auto it = f->metadata().find("step");
  HEARTH_CHECK(it != f->metadata().end() && it->second == std::to_string(step), f->path().string(),
               ": written for another step than checkpoint.json's ", step);
  std::map<std::string, at::Tensor> st;
  for (const auto& info : f->tensors()) st[info.name] = f->tensor(info.name);
  {
    c10::NoGradGuard no_grad;
    // The same set both ways (checkpoints from before checkpoint.json recorded --num-layers and
    // the LoRA settings rely on this): a checkpoint weight this run does not train would be lost.
    const char* hint = " (resume with the --num-layers / --lora-keys / --lora-rank of the run that wrote it)";
    std::set<std::string> mine;
    for (const auto& p : params) {
      mine.insert("param." + p.name);
      auto t = st.find("param." + p.name);
      HEARTH_CHECK(t != st.end(), f->path().string(), ": no saved value for parameter ", p.name, hint);
      HEARTH_CHECK(t->second.sizes() == p.tensor.sizes(), f->path().string(), ": parameter ", p.name, " has shape ",
                   t->second.sizes(), ", the model's ", p.tensor.sizes(), hint);
      p.tensor.copy_(t->second);
    }
    for (const auto& [name, t] : st)
      HEARTH_CHECK(name.rfind("param.", 0) != 0 || mine.count(name), f->path().string(), ": holds parameter ",
                   name.substr(6), ", which this run does not train", hint);
  }
  std::map<std::string, at::Tensor> opt_state;  // the file's AdamW entries (not its "param." values)
  for (const auto& [name, t] : st)
    if (name.rfind("param.", 0) != 0) opt_state.emplace(name, t);
  opt.load_state_tensors(opt_state, step, f->path().string());
  // The data order continues only over the same batches (older checkpoints have no count).
  const std::string data_changed = cat((dir / "checkpoint.json").string(), ": the training data in ",
                                       cfg.data_dir.string(), " changed since this checkpoint: ");
  HEARTH_CHECK(!ck.batches || *ck.batches == batcher.num_batches(), data_changed, *ck.batches,
               " batches per epoch then, ", batcher.num_batches(), " now (resume with the data it trained on)");
  HEARTH_CHECK(ck.batch_index <= batcher.num_batches(), data_changed, "its position (epoch ", ck.epoch, ", batch ",
               ck.batch_index, ") is past the ", batcher.num_batches(), " batches per epoch now");
  batcher.seek(ck.epoch, ck.batch_index);
  return step;
}

// Keeps the metrics.jsonl lines of steps <= `step` (atomically): a resumed run logs the steps after
// its checkpoint again, and a line torn by a kill is dropped.
void truncate_metrics(const std::filesystem::path& path, int64_t step) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return;
  std::istringstream in(io::read_file(path));
  std::string kept;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
    if (j["step"].get<int64_t>() <= step) kept += line + "\n";
  }
  io::write_file_atomic(path, kept);
}

void append_metrics(const std::filesystem::path& path, const Report& r) {
  nlohmann::json j = {{"step", r.step}, {"learning_rate", r.learning_rate}, {"tokens_per_second", r.tokens_per_second},
                      {"trained_tokens", r.trained_tokens}, {"peak_memory_bytes", r.peak_memory_bytes}};
  if (r.train_loss) j["train_loss"] = *r.train_loss;
  if (r.val_loss) j["val_loss"] = *r.val_loss;
  for (const auto& [k, v] : r.metrics) j[k] = v;
  std::ofstream out(path, std::ios::app);
  HEARTH_CHECK(out, path.string(), ": cannot append");
  out << j.dump() << "\n";
}

}  // namespace

std::vector<TrainableParam> full_parameters(models::Model& model, int64_t num_layers) {
  const int64_t L = model.num_layers();
  const int64_t first = num_layers < 0 ? 0 : std::max<int64_t>(0, L - num_layers);
  auto named = model.named_parameters();
  bool has_lm_head = false;
  for (const auto& [n, t] : named) has_lm_head |= n.rfind("lm_head.", 0) == 0;
  std::vector<TrainableParam> out;
  for (auto& [name, t] : named) {
    TrainableParam p{name, t, adapters::layer_index(name)};  // "….layers.N.…", any prefix
    if (p.layer < 0) {
      if (num_layers >= 0 && num_layers < L) continue;  // embed/norm/head only with all layers
      // Used by Model::embed: the token tables and Gemma 4's per-layer-input projection and norm.
      p.in_embed = name.find("embed_tokens") != std::string::npos ||
                   name.find("per_layer_model_projection") != std::string::npos ||
                   name.find("per_layer_projection_norm") != std::string::npos;
      p.in_head = !p.in_embed || !has_lm_head;  // a tied table is also the head
    } else if (p.layer < first) {
      continue;
    }
    HEARTH_CHECK(at::isFloatingType(t.scalar_type()), name, ": not a floating tensor, cannot be trained");
    p.tensor.requires_grad_(true);
    out.push_back(std::move(p));
  }
  return out;
}

LayerStack make_layer_stack(models::Model& model, const std::vector<TrainableParam>& params) {
  LayerStack s;
  s.num_layers = model.num_layers();
  s.embed = [&model](const at::Tensor& ids) { return model.embed(ids); };
  s.layers = [&model](const models::Boundary& x, int64_t b, int64_t e) {
    return model.forward_layers(x, b, e, models::Positions::uniform(0, x.hidden.size(0)), nullptr);
  };
  s.head = [&model](const at::Tensor& h) { return model.head(h); };
  auto per_layer = std::make_shared<std::vector<std::vector<at::Tensor>>>(s.num_layers);
  for (const auto& p : params) {
    if (p.layer >= 0) {
      HEARTH_CHECK(p.layer < s.num_layers, p.name, ": layer ", p.layer, " outside the model's ", s.num_layers);
      (*per_layer)[p.layer].push_back(p.tensor);
    }
    if (p.in_embed) s.embed_params.push_back(p.tensor);
    if (p.in_head) s.head_params.push_back(p.tensor);
  }
  s.layer_params = [per_layer](int64_t b, int64_t e) {
    std::vector<at::Tensor> v;
    for (int64_t l = b; l < e; ++l) v.insert(v.end(), (*per_layer)[l].begin(), (*per_layer)[l].end());
    return v;
  };
  return s;
}

int64_t checkpoint_step(const std::filesystem::path& dir) { return read_checkpoint(dir).step; }

int64_t start_step(const TrainConfig& cfg) {
  if (cfg.resume.empty()) return 0;
  const CheckpointRecord ck = read_checkpoint(cfg.resume);
  check_checkpoint_matches(ck, cfg, cfg.resume);
  HEARTH_CHECK(ck.step <= cfg.iters, "--resume ", cfg.resume.string(), ": its checkpoint is at step ", ck.step,
               ", past --iters ", cfg.iters, " (a run cannot go back): pass --iters above ", ck.step,
               " to train further, or use that folder's adapter as it is");
  return ck.step;
}

TrainResult run_training(const TrainConfig& cfg, models::Model& model, const tokenizer::Tokenizer& tok,
                         const std::function<void(const Report&)>& on_report) {
  check_config(cfg);
  if (const int64_t at = start_step(cfg); at == cfg.iters) {
    if (cfg.on_note)
      cfg.on_note(cat("nothing to train: the checkpoint in ", cfg.resume.string(), " is already at step ", at,
                      " = --iters (pass a larger --iters to train further); nothing was written"));
    TrainResult done;
    done.steps_done = at;
    return done;
  }
  nn::MlpChunkScope mlp_chunk(cfg.mlp_chunk);  // training, evaluation and reference forwards alike
  const nn::FusedDecodeOff reference_ops;       // no-grad forwards round as their recomputation (nn/fused_ops.h)
  HEARTH_CHECK(cfg.num_layers <= model.num_layers(), "--num-layers ", cfg.num_layers, " exceeds the model's ",
               model.num_layers(), " layers (-1 = all)");
  const bool full = cfg.fine_tune_type == "full";
  DataOptions dopt;
  dopt.max_seq_length = cfg.max_seq_length;
  dopt.pack_text = full;
  const auto note = [&](const std::string& s) {
    if (cfg.on_note) cfg.on_note(s);
  };
  const auto note_skipped = [&](const Dataset& d, const char* file) {
    if (d.skipped_no_target > 0)
      note(cat(file, ": skipped ", d.skipped_no_target, " row(s) whose prompt alone fills --max-seq-length ",
               cfg.max_seq_length, " (no target token to train on)"));
  };
  const Method method = parse_method(cfg.method);
  const bool pref = method != Method::kSft;
  DataParallel* dp = cfg.data_parallel.get();  // null: one process
  const bool writer = !dp || dp->is_writer();  // rank 0 alone writes files
  if (dp) check_data_parallel(cfg.batch_size, cfg.method, dp->world_size());
  PreferenceOptions popt;
  popt.method = method;
  popt.beta = cfg.beta;
  popt.orpo_lambda = cfg.orpo_lambda;
  popt.sft_full = cfg.sft_scope == "full";
  popt.loss_chunk = cfg.loss_chunk;
  std::optional<Dataset> train, valid;
  std::optional<PreferenceDataset> ptrain, pvalid;
  const bool has_valid = std::filesystem::exists(cfg.data_dir / "valid.jsonl");
  if (pref) {
    const auto note_dropped = [&](const PreferenceDataset& d, const char* file) {
      if (d.prompt_dropped > 0)
        note(cat(file, ": ", d.prompt_dropped, " pair(s) longer than --max-seq-length ", cfg.max_seq_length,
                 " lost their whole prompt to left truncation (scored on the response alone)"));
    };
    ptrain = load_preference_jsonl(cfg.data_dir / "train.jsonl", tok, cfg.max_seq_length);
    note_dropped(*ptrain, "train.jsonl");
    if (has_valid) {
      pvalid = load_preference_jsonl(cfg.data_dir / "valid.jsonl", tok, cfg.max_seq_length);
      note_dropped(*pvalid, "valid.jsonl");
    }
  } else {
    train = load_jsonl(cfg.data_dir / "train.jsonl", tok, dopt);
    note_skipped(*train, "train.jsonl");
    if (has_valid) {
      valid = load_jsonl(cfg.data_dir / "valid.jsonl", tok, dopt);
      note_skipped(*valid, "valid.jsonl");
    }
  }

  std::unique_ptr<LoraRun> lora;
  std::vector<TrainableParam> params;
  if (full) {
    params = full_parameters(model, cfg.num_layers);
  } else {
    lora = std::make_unique<LoraRun>(model, cfg);
    params = lora->params();
  }
  const bool mixed = parse_mixed_precision(cfg.mixed_precision);
  if (mixed) {
    HEARTH_CHECK(model.placement().dtype == at::kBFloat16, "--mixed-precision bf16: the model must be loaded in "
                 "bfloat16 (the copy it computes with; the fp32 masters are made from it), it is ",
                 model.placement().dtype);
    if (lora) make_fp32(params);  // LoRA A/B are their own fp32 masters over the frozen bf16 base
  }
  const LayerStack stack = make_layer_stack(model, params);
  // The optimizer, clipping and checkpoints see the masters (the params themselves unless mixed).
  MasterWeights mw(params, mixed, cfg.master_init);
  const std::vector<at::Tensor> tensors = mw.tensors();
  AdamWConfig acfg;
  acfg.lr = cfg.learning_rate;
  acfg.weight_decay = cfg.weight_decay;
  NamedAdamW opt(mw.named(), acfg);
  Schedule sched;
  sched.kind = Schedule::parse(cfg.lr_schedule);
  sched.peak = cfg.learning_rate;
  sched.warmup = cfg.warmup;
  sched.total = cfg.iters;
  Batcher batcher = pref ? Batcher(ptrain->lengths(), cfg.batch_size, cfg.seed) : Batcher(*train, cfg.batch_size, cfg.seed);
  // DPO with a full fine-tune: the weights change in place, so the reference is the base's
  // log-probs of every pair, taken now (before a checkpoint's weights are loaded).
  std::vector<double> ref_train, ref_valid;
  if (method == Method::kDpo && full) {
    note(cat("DPO with a full fine-tune: computing the base model's reference log-probs of ", ptrain->pairs.size(),
             " train", pvalid ? cat(" + ", pvalid->pairs.size(), " valid") : std::string(), " pair(s) once"));
    ref_train = reference_table(model, *ptrain, cfg.batch_size, cfg.loss_chunk);
    if (pvalid) ref_valid = reference_table(model, *pvalid, cfg.batch_size, cfg.loss_chunk);
  }

  TrainResult res;
  int64_t start = 0;
  if (!cfg.resume.empty()) start = load_checkpoint(cfg, batcher, opt, mw.masters());
  if (dp) dp->broadcast_from_rank0(tensors);  // as DDP: every rank starts from rank 0's values
  // The step's gradient all-reduce. Overlapped only when every rank asks for it: the ranks must
  // issue the same collectives in the same order.
  std::optional<StepGradReduce> reduce;
  if (dp) reduce.emplace(*dp, tensors);
  const bool overlap = dp && dp->sum(static_cast<int64_t>(cfg.overlap_grad_reduce)) == dp->world_size();
  if (dp)
    note(overlap ? "data-parallel: each backward segment's gradient all-reduce starts as soon as the step's last "
                   "micro-batch is done with it (--no-overlap-grad-reduce: after the whole backward)"
                 : "data-parallel: gradients are all-reduced after the whole backward");
  if (!cfg.resume.empty() || dp) mw.copy_to_model();
  res.steps_done = start;
  const auto metrics = cfg.adapter_path / "metrics.jsonl";
  bool previous_run_pending = false;  // a fresh run's folder still holds the previous run's files
  std::vector<Report> held_reports;   // this run's report lines until then
  // Before a fresh run's first save: the previous run's metrics and checkpoint.json go (so no later
  // --resume pairs that checkpoint with this run's metrics), this run's held report lines are
  // written; the previous adapter and optimizer files are then replaced by the save itself.
  const auto drop_previous_run = [&]() {
    if (!previous_run_pending) return;
    truncate_metrics(metrics, 0);
    std::error_code ec;
    std::filesystem::remove(cfg.adapter_path / "checkpoint.json", ec);
    for (const Report& r : held_reports) append_metrics(metrics, r);
    held_reports.clear();
    previous_run_pending = false;
  };
  if (writer) {
    std::filesystem::create_directories(cfg.adapter_path);
    if (const int64_t n = io::remove_stale_temporaries(cfg.adapter_path); n > 0)
      note(cat(cfg.adapter_path.string(), ": removed ", n, " temporary file(s) left by a killed run"));
    std::error_code ec;
    const bool continued = !cfg.resume.empty() && std::filesystem::equivalent(cfg.resume, cfg.adapter_path, ec);
    // A run that continues this folder's checkpoint drops the killed run's lines after it. A fresh
    // run into a folder that held another (the CLI's --overwrite) leaves that run whole until its
    // own first save (drop_previous_run): a run that fails before it keeps the user's checkpoint.
    if (continued) truncate_metrics(metrics, start);
    else
      previous_run_pending = std::filesystem::exists(metrics, ec) || std::filesystem::exists(cfg.adapter_path / "checkpoint.json", ec);
  }
  if (lora) lora->set_training(true);
  const at::Device device = model.placement().device;

  BackwardOptions bopt;
  bopt.segment_size = cfg.segment_size;
  bopt.isolate = model.isolated_layers();
  bopt.loss_chunk = cfg.loss_chunk;
  bopt.defer_loss = true;  // losses stay on the device until a report reads them
  bopt.offload_boundaries = cfg.offload_boundaries;
  bopt.offload_host_limit_bytes = static_cast<int64_t>(cfg.offload_host_limit_gb * 1e9);
  std::vector<std::pair<std::string, double>> window_metrics;  // sums over the window's steps
  double window_loss = 0, window_time = 0;
  int64_t window_steps = 0, window_tokens = 0, trained_tokens = 0;
  std::optional<double> pending_val;
  // The hot loop never waits for the device: step losses are kept as device scalars and read at
  // reports and checkpoints; training time is measured between those syncs (evaluation and
  // checkpoint writing excluded).
  std::vector<at::Tensor> pending_losses;
  auto tic = std::chrono::steady_clock::now();
  const auto pause = [&] {
    compat::synchronize(device);
    window_time += std::chrono::duration<double>(std::chrono::steady_clock::now() - tic).count();
  };
  const auto resume = [&] { tic = std::chrono::steady_clock::now(); };
  // A loss or a weight that is no longer finite ends the run before anything more is written:
  // the folder keeps what it held (this run's last checkpoint, if it saved one, else the previous
  // run's files), and the message says which.
  int64_t saved_step = -1;
  const auto diverged = [&](const std::string& what) {
    const std::string kept = saved_step >= 0 ? cat("the checkpoint of step ", saved_step, " (this run's last) is in ",
                                                   cfg.adapter_path.string(), "; --resume continues from it")
                                             : cat("nothing was saved to ", cfg.adapter_path.string());
    throw Error(cat("train: ", what, " by step ", res.steps_done, " (training diverged: lower --learning-rate, ",
                    "--weight-decay or set --grad-clip); ", kept));
  };
  const auto check_weights = [&] {
    for (const TrainableParam& p : mw.masters())
      if (!at::isfinite(p.tensor.detach()).all().item<bool>()) diverged(cat("parameter ", p.name, " is not finite"));
  };
  const auto flush_losses = [&] {
    for (const at::Tensor& l : pending_losses) {
      const double v = l.item<double>();
      if (!std::isfinite(v)) diverged(cat("the training loss became ", v));
      res.step_losses.push_back(v);
      window_loss += v;
    }
    pending_losses.clear();
  };
  compat::synchronize(device);
  resume();
  const auto stop_requested = [&] {
    const bool stop = cfg.stop && cfg.stop->load();
    return dp ? dp->any(stop) : stop;  // every rank stops at the same micro-batch
  };
  for (int64_t step = start + 1; step <= cfg.iters; ++step) {
    if (cfg.on_micro_batch) cfg.on_micro_batch(step, 0);
    if (stop_requested()) {
      res.interrupted = true;
      break;
    }
    if ((valid || pvalid) && (step == 1 || step % cfg.steps_per_eval == 0 || step == cfg.iters)) {
      pause();
      if (lora) lora->set_training(false);
      const auto stop_at = [&](int64_t batch) {  // a long validation hears the stop flag too
        if (cfg.on_micro_batch) cfg.on_micro_batch(step, -1 - batch);
        return stop_requested();
      };
      pending_val = pref ? evaluate_preference(model, *pvalid, cfg.batch_size, cfg.val_batches, popt, ref_valid, dp,
                                               stop_at)
                         : evaluate(model, *valid, cfg.batch_size, cfg.val_batches, cfg.loss_chunk, dp, stop_at);
      if (lora) lora->set_training(true);
      if (!pending_val) {  // stopped before the step began: nothing of it to drop
        res.interrupted = true;
        break;
      }
      resume();
    }
    double pref_loss = 0;
    at::Tensor step_loss;  // Σ over micro-batches of their token-mean loss (fp64, on the device)
    int64_t counted = 0;
    std::vector<std::pair<std::string, double>> step_metrics;
    const int64_t step_epoch = batcher.epoch(), step_index = batcher.index();
    for (int64_t m = 0; m < cfg.grad_accumulation_steps; ++m) {
      if (m > 0) {
        if (cfg.on_micro_batch) cfg.on_micro_batch(step, m);
        if (stop_requested()) {
          res.interrupted = true;
          break;
        }
      }
      bopt.on_segment = [&, step, m](size_t s, bool) {
        const uint64_t seed = rng_seed(cfg.seed, step, dp ? m * dp->world_size() + dp->rank() : m, s);
        at::manual_seed(seed);
        LoraRun::reseed(seed);
      };
      // The last micro-batch: a segment's gradients are final for the step once its VJP is done
      // (the same fp32 additions into the masters as mw.accumulate_grads below, done early), so
      // their all-reduce starts while the earlier segments compute.
      bopt.on_segment_grads = nullptr;
      if (overlap && m + 1 == cfg.grad_accumulation_steps)
        bopt.on_segment_grads = [&](int64_t begin, int64_t end) {
          reduce->start(mw.accumulate_grads_of(stack.layer_params(begin, end)));
        };
      if (pref) {
        const auto idx = dp ? dp->share(batcher.next_indices()) : batcher.next_indices();
        PreferenceBatch pb = make_preference_batch(*ptrain, idx);
        const double ranks = dp ? static_cast<double>(dp->world_size()) : 1.0;  // a share's pair mean weighs 1/ranks
        at::Tensor ref =
            method == Method::kDpo ? batch_reference(model, pb, idx, ref_train, cfg.loss_chunk) : at::Tensor();
        PreferenceStats st;
        BackwardResult r = backward_with_head(
            stack, pb.input_ids,
            preference_head(pb, ref, share_options(popt, pb, dp), stack.head, stack.head_params,
                            1.0 / (static_cast<double>(cfg.grad_accumulation_steps) * ranks), &st),
            bopt);
        mw.accumulate_grads();
        auto named = st.named(method);
        if (dp)
          for (auto& [k, v] : named) v = dp->sum(v) / ranks;  // equal shares: the mean of means is the batch's
        pref_loss += named.front().second;
        ++counted;
        window_tokens += dp ? dp->sum(r.n_tokens) : r.n_tokens;
        named.erase(named.begin());  // the loss is reported as train_loss
        if (step_metrics.empty()) step_metrics = named;
        else
          for (size_t i = 0; i < named.size(); ++i) step_metrics[i].second += named[i].second;
        continue;
      }
      Batch batch = dp ? dp->next_share(batcher, *train) : batcher.next();
      at::Tensor targets = shift_labels(batch.labels);  // CPU: counting its tokens needs no sync
      const int64_t own = targets.ne(kIgnoreIndex).sum().item<int64_t>();
      const int64_t ntok = dp ? dp->sum(own) : own;  // the global batch's target tokens
      if (ntok == 0) continue;  // a batch of prompts only: nothing to learn from
      bopt.scale = 1.0 / (static_cast<double>(ntok) * static_cast<double>(cfg.grad_accumulation_steps));
      // A share with no target token still runs backward() when it starts reductions: it then calls
      // on_segment_grads for every segment, as the other ranks' backward does.
      BackwardResult r = own > 0 || bopt.on_segment_grads
                             ? backward(stack, to_device_async(batch.input_ids, device), targets, bopt)
                             : BackwardResult{};
      mw.accumulate_grads();
      // The token mean over the global batch: data-parallel ranks sum their shares (a sync they
      // make anyway for the token count); one process keeps it on the device.
      at::Tensor mean = dp ? at::scalar_tensor(dp->sum(r.loss.defined() ? r.loss.item<double>() : 0.0) /
                                                   static_cast<double>(ntok),
                                               at::kDouble)
                           : r.loss / static_cast<double>(ntok);
      step_loss = step_loss.defined() ? step_loss + mean : mean;
      ++counted;
      window_tokens += ntok;
    }
    if (res.interrupted) {  // stopped inside the step: drop it, and replay its data when resumed
      opt.zero_grad();
      batcher.seek(step_epoch, step_index);
      break;
    }
    if (pref || !step_loss.defined()) step_loss = at::scalar_tensor(pref_loss, at::kDouble);
    pending_losses.push_back(counted > 0 ? step_loss / static_cast<double>(counted) : step_loss);
    for (auto& [k, v] : step_metrics) v /= static_cast<double>(std::max<int64_t>(counted, 1));
    if (window_metrics.empty()) window_metrics = step_metrics;
    else
      for (size_t i = 0; i < step_metrics.size(); ++i) window_metrics[i].second += step_metrics[i].second;
    if (dp && counted > 0) reduce->finish();  // Σ of token-weighted shares = the global gradient
    if (cfg.grad_clip > 0) clip_grad_norm_async(tensors, cfg.grad_clip);
    const double lr = sched.lr(step);
    opt.set_lr(lr);
    opt.step();
    mw.copy_to_model();
    opt.zero_grad();
    ++window_steps;
    res.steps_done = step;

    const bool report = step % cfg.steps_per_report == 0 || step == cfg.iters || pending_val;
    const bool save = cfg.save_every > 0 && step % cfg.save_every == 0 && step < cfg.iters;
    if (report || save) {
      pause();
      flush_losses();
    }
    if (report) {
      Report rep;
      rep.step = step;
      rep.learning_rate = lr;
      rep.val_loss = pending_val;
      if (step % cfg.steps_per_report == 0 || step == cfg.iters) {
        rep.train_loss = window_loss / static_cast<double>(window_steps);
        rep.tokens_per_second = window_time > 0 ? static_cast<double>(window_tokens) / window_time : 0.0;
        for (auto& [k, v] : window_metrics) rep.metrics.emplace_back(k, v / static_cast<double>(window_steps));
        window_metrics.clear();
        trained_tokens += window_tokens;
        window_loss = window_time = 0;
        window_steps = window_tokens = 0;
      }
      rep.trained_tokens = trained_tokens;
      rep.peak_memory_bytes = compat::peak_memory_bytes(device);
      pending_val.reset();
      if (writer && previous_run_pending) held_reports.push_back(rep);
      else if (writer) append_metrics(metrics, rep);
      if (on_report) on_report(rep);
      res.reports.push_back(rep);
    }
    if (writer && save) {
      check_weights();
      drop_previous_run();
      save_checkpoint(cfg, step, batcher, opt, mw.masters(), lora.get());
      saved_step = step;
    }
    if (report || save) resume();
  }
  flush_losses();
  if (writer) {
    check_weights();
    drop_previous_run();
    save_checkpoint(cfg, res.steps_done, batcher, opt, mw.masters(), lora.get());
  }
  return res;
}

}  // namespace hearth::train
