// The fine-tuning loop: LoRA or full fine-tune of a loaded Model on jsonl data, with gradient
// accumulation, clipping, AdamW + schedule, periodic evaluation, checkpoints, resume and a stop
// flag. Follows mlx-lm's tuner/trainer.py loop. Not the data formats (dataset.h), the backward
// (segmented.h) or the CLI (cli/train.cpp).
#pragma once
#include <ATen/ATen.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "models/model.h"
#include "tokenizer/tokenizer.h"
#include "train/segmented.h"

namespace hearth::train {

class DataParallel;

/// Every knob of a run (names follow mlx_lm.lora's flags; defaults are mlx-lm's).
struct TrainConfig {
  std::filesystem::path data_dir;      // train.jsonl (+ valid.jsonl)
  std::string method = "sft";          // sft | dpo | orpo (preference rows for dpo / orpo)
  double beta = 0.1;                   // DPO β
  double orpo_lambda = 0.1;            // ORPO λ
  std::string sft_scope = "response";  // ORPO NLL term over: response | full (prompt + response)
  std::filesystem::path adapter_path;  // output folder: adapter, checkpoint, metrics.jsonl
  std::filesystem::path resume;        // a checkpoint folder to continue from ("" = fresh)
  std::string fine_tune_type = "lora"; // lora | full
  int64_t num_layers = -1;             // train the last N blocks; -1 = all (full: + embed/head); mlx-bun's default
  int64_t lora_rank = 8;
  double lora_scale = 20.0;
  double lora_dropout = 0.0;
  std::vector<std::string> lora_keys;  // module suffixes; empty = q,k,v,o,gate,up,down projections
  int64_t batch_size = 4;
  int64_t iters = 1000;                // optimizer steps (each of grad_accumulation_steps micro-batches)
  double learning_rate = 1e-5;
  std::string lr_schedule = "constant";  // constant | cosine
  int64_t warmup = 0;
  double weight_decay = 0.0;
  int64_t grad_accumulation_steps = 1;
  double grad_clip = 0.0;              // global L2 norm; 0 = off
  int64_t max_seq_length = 2048;
  int64_t steps_per_report = 10;
  int64_t steps_per_eval = 200;
  int64_t val_batches = 25;            // -1 = the whole validation set
  int64_t save_every = 100;            // checkpoint every N steps; 0 = only at the end
  uint64_t seed = 0;
  int64_t segment_size = 0;            // layers per backward segment; 0 = full backward
  int64_t loss_chunk = 1024;           // positions per loss-head chunk
  /// --offload-boundaries: with segment_size > 0, the saved segment boundaries live in host memory
  /// (pinned on CUDA) between forward and backward (BackwardOptions::offload_boundaries).
  bool offload_boundaries = false;
  double offload_host_limit_gb = 0.0;  // host GB (1e9 bytes) those copies may take; 0 = no limit
  /// --mlp-chunk: positions per chunk of the MLPs (nn/mlp_chunk.h) in training and evaluation
  /// forwards and in the backward; 0 = off. Refused with lora_dropout > 0.
  int64_t mlp_chunk = 0;
  std::string adapter_format = "mlx";  // mlx | peft
  /// none | bf16: fp32 master weights, grads and AdamW state; forward/backward in the model's bf16
  /// (the model must be loaded in bfloat16); the loss over the vocabulary in fp32. LoRA: A/B fp32
  /// over a frozen bf16 base. See mixed_precision.h. fp16 is refused (needs loss scaling).
  std::string mixed_precision = "none";
  /// Mixed precision: fp32 starting values of the masters by HF name (an fp32 checkpoint's own
  /// tensors, so the masters do not start from their bf16 rounding); names absent here, and every
  /// tensor when empty, start from the model's bf16 values upcast. A resumed run's come from its checkpoint.
  std::map<std::string, at::Tensor> master_init;
  /// Checked before each micro-batch and each validation batch: when set, the step under way is
  /// dropped (its accumulated gradients unused, the data order rewound to its start, so a resumed
  /// run replays it), a last checkpoint of the steps done is written and run() returns.
  /// Data-parallel ranks agree on it.
  const std::atomic<bool>* stop = nullptr;
  /// Test hook: called before each micro-batch with (step, micro-batch index from 0), and before
  /// batch i of the validation that precedes a step with (step, -1 - i). May be empty.
  std::function<void(int64_t, int64_t)> on_micro_batch;
  /// One-line notes for the person running (e.g. data rows skipped); the CLI prints them. May be empty.
  std::function<void(const std::string&)> on_note;
  /// Test hook: called between the steps of writing a checkpoint with the step just done
  /// ("weights", "optimizer", "manifest", "cleanup"); throwing there leaves the folder as a crash
  /// at that point would. Empty in normal runs.
  std::function<void(const std::string&)> checkpoint_hook;
  /// Data-parallel rank (distributed.h); null = one process. batch_size stays the global batch.
  std::shared_ptr<DataParallel> data_parallel;
  /// Data-parallel: start each backward segment's gradient all-reduce as soon as the last
  /// micro-batch's backward is done with it, overlapping the earlier segments' backward
  /// (StepGradReduce); false (--no-overlap-grad-reduce): reduce every gradient after the backward.
  /// The same gradients either way. On only when every rank asks for it.
  bool overlap_grad_reduce = true;
};

/// One progress report (also a metrics.jsonl line).
struct Report {
  int64_t step = 0;
  std::optional<double> train_loss;  // mean of micro-batch token-mean losses since the last report
  std::optional<double> val_loss;    // token-mean over val_batches, when evaluated at this step
  double learning_rate = 0.0;
  double tokens_per_second = 0.0;    // supervised tokens / training time since the last report
  int64_t trained_tokens = 0;
  int64_t peak_memory_bytes = 0;
  /// Preference runs: window means of accuracy, margin (+ nll, or for ORPO), in that order.
  std::vector<std::pair<std::string, double>> metrics;
};

/// What a run did.
struct TrainResult {
  int64_t steps_done = 0;            // last completed optimizer step
  bool interrupted = false;          // stopped by the stop flag
  std::vector<double> step_losses;   // train loss of each step run in this call
  std::vector<Report> reports;
};

/// A named trainable tensor and where the model uses it.
struct TrainableParam {
  std::string name;   // HF name ("model.layers.0.self_attn.q_proj.weight") or adapter key
  at::Tensor tensor;  // requires_grad leaf, owned by the model
  int64_t layer = -1; // decoder layer index; -1 = not in a layer
  bool in_embed = false, in_head = false;
};

/// Makes the full fine-tune parameters of `model` trainable: every dense weight of the last
/// `num_layers` blocks (-1: all blocks plus embeddings, final norm and lm_head), by HF name.
/// Throws hearth::Error for a quantized model.
std::vector<TrainableParam> full_parameters(models::Model& model, int64_t num_layers);

/// The LayerStack of `model` (embed / forward_layers without cache / head) over `params`.
LayerStack make_layer_stack(models::Model& model, const std::vector<TrainableParam>& params);

/// The largest --max-seq-length accepted (2^24 tokens): far past any sequence a run here fits
/// (128K tokens of an 8B model take 42 GB), so a larger value is a typo, refused before any load.
inline constexpr int64_t kMaxSeqLength = int64_t{1} << 24;

/// Validates the run's options alone, before anything is loaded: every numeric flag's range (LoRA
/// rank in [1, 65536] and scale in (0, 1e4] as the adapter loader accepts, dropout in [0, 1), --max-seq-length in [2, kMaxSeqLength], learning
/// rate, weight decay and clip finite >= 0, counts >= 1 ...), the names (method, schedule, formats),
/// --adapter-path not an existing regular file. run_training calls it first, the CLI before loading
/// the model. Throws hearth::Error, one line naming the flag and its allowed range.
void check_config(const TrainConfig& cfg);

/// The step a run of `cfg` starts from: 0 for a fresh run (cfg.resume empty), else the step of
/// <cfg.resume>/checkpoint.json (only that file is read). A result equal to cfg.iters means
/// nothing is left to train: run_training then returns at once (steps_done = that step) and writes
/// nothing. Throws hearth::Error when checkpoint.json is absent or malformed (naming the file and
/// field), when cfg cannot continue it (another fine-tune type, method, seed, batch size,
/// gradient accumulation, --num-layers or LoRA rank / scale / keys: checkpoint.h), or when its step
/// is past cfg.iters (a run cannot go back; naming both).
int64_t start_step(const TrainConfig& cfg);

/// Runs the loop. `model` and `tok` are loaded by the caller (on the device and dtype wanted).
/// cfg.method "dpo" / "orpo" trains on preference rows (preference_data.h) with the losses of
/// preference.h; the train loss is then the mean over pairs, each micro-batch weighs 1/N. DPO's
/// reference: with LoRA, the same model with the adapter switched off, per micro-batch, no grad;
/// with a full fine-tune (whose weights change in place), the base's summed response log-probs of
/// every train/valid pair, computed once before the first step (before a resumed checkpoint's
/// weights are loaded, so the model given must be the base).
/// Checkpoints (<adapter_path>/checkpoint.json + the optimizer file it names) are complete or
/// absent: each is written as a new optimizer.<step>.safetensors beside the previous one, then
/// checkpoint.json (atomic rename) switches to it, then older optimizer files are removed. On start
/// it removes stale "*.tmp.<pid>" files of dead processes in adapter_path, and truncates
/// metrics.jsonl to the lines of steps <= the resumed step (0 for a fresh run). Data rows with no
/// target token (prompt >= max_seq_length) are skipped with a note through cfg.on_note.
/// Gradient accumulation follows mlx-lm: each micro-batch's loss is its own token mean and the
/// step's gradient is the average over micro-batches (Σ_m ∇mean_m / N). Reports go to
/// `on_report` (may be empty) and to <adapter_path>/metrics.jsonl. Throws hearth::Error on bad
/// config, data or checkpoint.
/// With cfg.data_parallel (distributed.h), each rank trains on its share of every global batch of
/// cfg.batch_size, scaled by the global normalizer (SFT: 1 / global target tokens; DPO: 1 / ranks
/// per share's pair mean), gradients summed over the ranks on the last micro-batch (each backward
/// segment's as soon as its VJP is done, overlapping the earlier segments, unless
/// cfg.overlap_grad_reduce is off; the embedding's and head's after the backward), so the steps
/// equal one process's; validation is split and reduced; the stop flag is OR-reduced per step; rank 0
/// alone writes files. Throws for a batch not divisible by the ranks.
TrainResult run_training(const TrainConfig& cfg, models::Model& model, const tokenizer::Tokenizer& tok,
                         const std::function<void(const Report&)>& on_report = {});

/// The step recorded in <dir>/checkpoint.json; throws hearth::Error when absent or malformed
/// (one line naming the file and the field).
int64_t checkpoint_step(const std::filesystem::path& dir);

}  // namespace hearth::train
