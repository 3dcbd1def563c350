// `hearth train`: LoRA or full fine-tuning of a model folder on jsonl data, with mlx_lm.lora's
// flag names; every flag, the output folder and the resumed checkpoint are checked before anything
// loads; prints a progress line per report, SIGINT/SIGTERM write a last checkpoint and exit 0.
// Not the training loop itself (train/trainer.h).
#include <algorithm>
#include <atomic>
#include <signal.h>
#include <unistd.h>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "cli/launch.h"
#include "cli/number_option.h"
#include "cli/output_folder.h"
#include "cli/threads_option.h"
#include "cli/verb.h"
#include "core/error.h"
#include "core/torch_compat.h"
#include "io/read_file.h"
#include "models/registry.h"
#include "nn/param_source.h"
#include "tokenizer/tokenizer.h"
#include "train/checkpoint.h"
#include "train/mixed_precision.h"
#include "train/trainer.h"

namespace {

std::atomic<bool> g_stop{false};

// SIGINT/SIGTERM: stop at the next micro-batch (a step under way is dropped, replayed by --resume)
// and save a checkpoint of the steps done. One-shot
// (SA_RESETHAND): a second signal ends the process at once, as the default action does.
extern "C" void on_signal(int) {
  g_stop.store(true);
  static const char kNote[] =
      "\nhearth: stopping at the next micro-batch to save a checkpoint of the steps done (a second Ctrl-C "
      "quits at once, saving nothing more)\n";
  [[maybe_unused]] const ssize_t n = ::write(2, kNote, sizeof kNote - 1);  // async-signal-safe
}

void set_stop_handlers(bool on) {
  struct sigaction sa {};
  sa.sa_handler = on ? on_signal : SIG_DFL;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = on ? SA_RESETHAND : 0;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

struct TrainArgs {
  std::string model, data, adapter_path, resume, device, dtype = "float32", lora_keys;
  bool grad_checkpoint = false, overwrite = false;
  bool mask_prompt = false;  // --mask-prompt: accepted, always on (see dataset.h)
  hearth::train::TrainConfig cfg;
  hearth::cli::DistOptions dist;
};

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// The first file of `dir` that holds a trained adapter or the checkpoint of one (mlx-lm / full
// weights, PEFT weights, checkpoint.json), or "" when none does.
std::string trained_file_in(const std::filesystem::path& dir) {
  std::error_code ec;
  for (const char* f : {"adapters.safetensors", "adapter_model.safetensors", "checkpoint.json"})
    if (std::filesystem::exists(dir / f, ec)) return f;
  return "";
}

// The first other file of `dir` that a training run writes (adapter_config.json, metrics.jsonl, an
// optimizer file), or "": a fresh run would replace or truncate it.
std::string run_file_in(const std::filesystem::path& dir) {
  std::error_code ec;
  for (const char* f : {"adapter_config.json", "metrics.jsonl"})
    if (std::filesystem::exists(dir / f, ec)) return f;
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (hearth::train::is_optimizer_file(name)) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names.empty() ? "" : names.front();
}

// Nothing a user had is lost: a run that does not continue the checkpoint in --adapter-path
// (--resume naming that same folder) refuses a folder that holds a trained adapter, or any other
// file a run writes there (metrics.jsonl, adapter_config.json, optimizer files), unless
// --overwrite says to replace them; and no run writes into the --model folder. Throws
// hearth::Error (one line naming the folder or file and the ways on).
void check_output_folder(const TrainArgs& a) {
  const auto& c = a.cfg;
  HEARTH_CHECK(!hearth::cli::same_or_inside(c.adapter_path, a.model), "train: --adapter-path ", c.adapter_path.string(),
               " is (or lies inside) the --model folder ", a.model,
               ": the adapter and checkpoint files would be written among the model's; pass another folder");
  std::error_code ec;
  const bool continued = !c.resume.empty() && std::filesystem::equivalent(c.resume, c.adapter_path, ec);
  HEARTH_CHECK(!(continued && a.overwrite), "train: --overwrite and --resume ", c.resume.string(),
               " name the same folder: --resume continues its checkpoint, --overwrite would start afresh; pass one");
  if (continued || a.overwrite) return;
  const std::string found = trained_file_in(c.adapter_path);
  HEARTH_CHECK(found.empty(), "train: --adapter-path ", c.adapter_path.string(), " already holds a trained adapter (",
               found, "); pass --resume ", c.adapter_path.string(),
               " to continue it, a new --adapter-path, or --overwrite to replace it");
  const std::string other = run_file_in(c.adapter_path);
  HEARTH_CHECK(other.empty(), "train: --adapter-path ", c.adapter_path.string(), " already holds ", other,
               " of another training run; pass a new --adapter-path, or --overwrite to replace it");
}

void print_report(const hearth::train::Report& r, int64_t iters) {
  std::printf("step %lld/%lld", static_cast<long long>(r.step), static_cast<long long>(iters));
  if (r.train_loss) std::printf("  train loss %.4f", *r.train_loss);
  if (r.val_loss) std::printf("  val loss %.4f", *r.val_loss);
  std::printf("  lr %.3e", r.learning_rate);
  for (const auto& [k, v] : r.metrics) std::printf("  %s %.4f", k.c_str(), v);
  if (r.train_loss) std::printf("  %.1f tok/s", r.tokens_per_second);
  std::printf("  peak mem %.3f GB\n", static_cast<double>(r.peak_memory_bytes) / 1e9);
  std::fflush(stdout);
}

// One process of a run (a rank of a data-parallel job when `env` is set: only rank 0 prints).
int run(TrainArgs& args, const hearth::train::DistEnv* env) {
  TrainArgs* a = &args;
  auto& c = a->cfg;
  const bool quiet = env && env->rank != 0;
  if (env) hearth::cli::prepare_worker(*env, a->device);
  const hearth::nn::LoadOptions where = hearth::nn::resolve_placement(a->device, a->dtype, a->model);
  auto tok = hearth::tokenizer::Tokenizer::from_dir(a->model);
  auto model = hearth::models::load_model(a->model, where);
  if (where.dtype == at::kBFloat16 && c.mixed_precision != "none" && c.fine_tune_type == "full" && c.resume.empty() &&
      hearth::nn::checkpoint_dtype(a->model) == at::kFloat) {
    // An fp32 checkpoint: its own tensors (read on the CPU) start the masters, not their bf16 rounding.
    auto f32 = hearth::models::load_model(a->model, hearth::nn::LoadOptions{at::kCPU, at::kFloat});
    for (auto& [name, t] : f32->named_parameters()) c.master_init[name] = t.detach();
  }
  set_stop_handlers(true);
  c.stop = &g_stop;
  if (env) c.data_parallel = hearth::cli::join_workers(*env, a->dist, where.device);
  c.on_note = [quiet](const std::string& note) {
    if (quiet) return;
    std::printf("%s\n", note.c_str());
    std::fflush(stdout);
  };
  if (!quiet)
    std::printf("training %s (%s, %lld layers) on %s, %s fine-tune, method %s, %lld steps\n", a->model.c_str(),
                model->model_type().c_str(), static_cast<long long>(model->num_layers()), where.device.str().c_str(),
                c.fine_tune_type.c_str(), c.method.c_str(), static_cast<long long>(c.iters));
  std::fflush(stdout);
  const int64_t iters = c.iters;
  auto res = hearth::train::run_training(c, *model, tok, [iters, quiet](const hearth::train::Report& r) {
    if (!quiet) print_report(r, iters);
  });
  set_stop_handlers(false);
  if (quiet) return 0;
  if (res.interrupted)
    std::printf("interrupted: checkpoint at step %lld in %s (continue with --resume %s)\n",
                static_cast<long long>(res.steps_done), c.adapter_path.c_str(), c.adapter_path.c_str());
  else
    std::printf("saved adapter to %s\n", c.adapter_path.c_str());
  return 0;
}

std::function<int()> setup_train(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  auto& c = a->cfg;
  app.add_option("--model", a->model, "Base model folder")->required();
  app.add_option("--data", a->data, "Folder with train.jsonl (and optionally valid.jsonl)")->required();
  app.add_option("--adapter-path", a->adapter_path,
                 "Output folder (adapter, checkpoint, metrics.jsonl); one that already holds an adapter, checkpoint "
                 "or any file a run writes is refused unless --resume names it or --overwrite is given; never inside "
                 "the --model folder");
  app.add_option("--method", c.method,
                 "sft | dpo | orpo (default sft). dpo/orpo train on rows {\"prompt\", \"chosen\", \"rejected\"}; "
                 "DPO's reference is the base (LoRA: the adapter switched off; full: the base's log-probs taken "
                 "once before training)");
  app.add_option("--beta", c.beta, "DPO beta: loss -logsigmoid(beta * (chosen - rejected log-ratio margin)) (default 0.1)");
  app.add_option("--orpo-lambda", c.orpo_lambda, "ORPO lambda: loss = NLL + lambda * odds-ratio term (default 0.1)");
  app.add_option("--sft-scope", c.sft_scope,
                 "ORPO NLL term over the chosen response only, or the prompt too: response | full (default response)");
  app.add_option("--fine-tune-type", c.fine_tune_type, "lora | full (default lora)");
  app.add_option("--num-layers", c.num_layers, "Train the last N blocks; -1 = all (default -1)");
  app.add_option("--lora-rank", c.lora_rank, "LoRA rank, 1 to 65536 (default 8)");
  app.add_option("--lora-scale", c.lora_scale, "LoRA scale, in (0, 10000] (default 20)");
  app.add_option("--lora-dropout", c.lora_dropout, "LoRA input dropout, in [0, 1) (default 0)");
  CLI::Option* lora_keys_opt =
      app.add_option("--lora-keys", a->lora_keys, "Comma list of module names (default q,k,v,o,gate,up,down _proj)");
  app.add_option("--batch-size", c.batch_size, "Examples per micro-batch (default 4)");
  app.add_option("--iters", c.iters, "Optimizer steps (default 1000)");
  app.add_option("--learning-rate", c.learning_rate, "Peak learning rate (default 1e-5)");
  app.add_option("--lr-schedule", c.lr_schedule, "constant | cosine (default constant)");
  app.add_option("--warmup", c.warmup, "Linear warmup steps (default 0)");
  app.add_option("--weight-decay", c.weight_decay, "AdamW decoupled weight decay, >= 0 (default 0)");
  app.add_option("--grad-accumulation-steps", c.grad_accumulation_steps, "Micro-batches per step (default 1)");
  app.add_option("--grad-clip", c.grad_clip, "Clip the global gradient norm to this, >= 0 (default 0 = off)");
  app.add_option("--max-seq-length", c.max_seq_length,
                 "Truncate examples to this many tokens, 2 to 16777216 (default 2048)");
  app.add_option("--steps-per-report", c.steps_per_report, "Steps between progress lines (default 10)");
  app.add_option("--steps-per-eval", c.steps_per_eval, "Steps between validations (default 200)");
  app.add_option("--val-batches", c.val_batches, "Validation batches; -1 = all (default 25)");
  app.add_option("--save-every", c.save_every, "Checkpoint every N steps (default 100)");
  app.add_option("--resume", a->resume,
                 "Continue from the checkpoint in this folder up to --iters (also the output folder unless "
                 "--adapter-path says otherwise). A checkpoint already at --iters: prints that there is nothing to "
                 "train and exits 0, writing nothing; past --iters: an error. The checkpoint must have been trained "
                 "with the same --fine-tune-type, --method, --seed, --batch-size, --grad-accumulation-steps, "
                 "--num-layers and LoRA rank, scale and keys");
  app.add_flag("--overwrite", a->overwrite,
               "Start afresh in an --adapter-path that holds an adapter, checkpoint or metrics: its checkpoint is "
               "dropped and metrics.jsonl emptied when training starts, its adapter files are replaced (each "
               "atomically) at the first save. Refused with --resume of the same folder (continue or start afresh: "
               "pass one), whatever step its checkpoint is at");
  app.add_option("--seed", c.seed, "Seed for data order and LoRA init (default 0)")->check(hearth::cli::seed_number());
  app.add_flag("--mask-prompt", a->mask_prompt, "Loss on completions only (always on for chat/completion rows)");
  app.add_flag("--grad-checkpoint", a->grad_checkpoint, "Recompute activations per layer (= --segment-size 1)");
  app.add_option("--segment-size", c.segment_size, "Layers per backward segment (0 = full backward)");
  app.add_flag("--offload-boundaries", c.offload_boundaries,
               "With --segment-size: keep the saved segment boundaries (one [B, T, C] hidden stream per segment, "
               "plus family streams) in host memory, pinned on CUDA, instead of on the device; each is copied back "
               "one segment ahead of its recompute, overlapping compute. Costs host RAM of that size and one "
               "device-host round trip per boundary per step");
  app.add_option("--offload-host-limit", c.offload_host_limit_gb,
                 "With --offload-boundaries: host GB the copies may take; the boundaries past it stay on the device "
                 "(default 0 = no limit)");
  app.add_option("--mlp-chunk", c.mlp_chunk,
                 "Run the MLPs this many positions at a time when a sequence is longer (with grad: a chunked "
                 "checkpoint that saves only the MLP input, recomputing each chunk in the backward: about one more "
                 "MLP forward per step); 0 = off (default). Needs --lora-dropout 0");
  app.add_option("--device", a->device, "cpu | cuda (default: cuda when available)");
  hearth::cli::add_threads_option(app);
  app.add_option("--dtype", a->dtype, "float32 | bfloat16 | float16 (default float32)");
  app.add_option("--adapter-format", c.adapter_format, "mlx | peft (default mlx)");
  hearth::cli::add_dist_options(app, a->dist);
  app.add_flag("!--no-overlap-grad-reduce", c.overlap_grad_reduce,
               "Data-parallel: sum the gradients over the processes after the whole backward, instead of starting "
               "each --segment-size segment's all-reduce as soon as the last micro-batch's backward is done with it "
               "(overlapping the earlier segments' backward; the default). Same gradients; for A/B timing");
  app.add_option("--mixed-precision", c.mixed_precision,
                 "none | bf16 (default none). bf16: the model computes in bfloat16 while the optimizer keeps fp32 "
                 "master weights, gradients and state; the loss is taken in fp32. LoRA: fp32 A/B over a bf16 base. "
                 "fp16 is refused (it needs loss scaling)");
  return [a, lora_keys_opt] {
    auto& c = a->cfg;
    c.data_dir = a->data;
    c.resume = a->resume;
    c.adapter_path = !a->adapter_path.empty() ? a->adapter_path : a->resume;
    HEARTH_CHECK(!c.adapter_path.empty(), "train: --adapter-path is required");
    if (lora_keys_opt->count() > 0) {
      c.lora_keys = split_commas(a->lora_keys);
      // An empty list used to mean the defaults silently.
      HEARTH_CHECK(!c.lora_keys.empty(), "train: --lora-keys '", a->lora_keys,
                   "' names no module (a comma list such as q_proj,v_proj; leave the flag out for the defaults)");
    }
    if (a->grad_checkpoint) {
      HEARTH_CHECK(c.segment_size <= 1, "train: --grad-checkpoint and --segment-size ", c.segment_size,
                   " disagree (--grad-checkpoint is --segment-size 1)");
      c.segment_size = 1;
    }
    hearth::train::check_config(c);  // bad flags fail before the model loads
    if (hearth::train::parse_mixed_precision(c.mixed_precision)) {
      // The model is loaded as the bf16 copy it computes with; the trainer makes the fp32 masters.
      HEARTH_CHECK(a->dtype == "float32" || a->dtype == "bfloat16", "train: --mixed-precision ", c.mixed_precision,
                   " computes in bfloat16 with fp32 masters; --dtype ", a->dtype, " contradicts it (leave --dtype out)");
      a->dtype = "bfloat16";
    }
    const auto env = hearth::train::dist_env_from();  // torchrun's variables: this process is one rank
    hearth::cli::check_dist_options(a->dist);
    hearth::train::check_data_parallel(c.batch_size, c.method, env ? env->world_size : a->dist.nproc_per_node);
    // The output folder, the checkpoint and the data, still before anything loads. The folder
    // first: --overwrite with --resume of the same folder is refused even when nothing is left.
    check_output_folder(*a);
    if (const int64_t at = hearth::train::start_step(c); at == c.iters) {
      if (!env || env->rank == 0)
        std::printf("nothing to train: the checkpoint in %s is already at step %lld = --iters (pass a larger --iters "
                    "to train further); nothing was written\n",
                    c.resume.string().c_str(), static_cast<long long>(at));
      return 0;
    }
    std::error_code ec;
    const auto data_st = std::filesystem::status(c.data_dir, ec);
    HEARTH_CHECK(std::filesystem::is_directory(data_st), "train: --data ", a->data,
                 std::filesystem::exists(data_st) ? ": not a folder (--data names a folder holding train.jsonl)"
                                                  : ": no such folder");
    for (const char* file : {"train.jsonl", "valid.jsonl"}) {
      const std::filesystem::path p = c.data_dir / file;
      const bool train = std::string(file) == "train.jsonl";
      if (!train && !hearth::io::entry_exists(p)) continue;  // no validation set
      const auto st = std::filesystem::status(p, ec);
      HEARTH_CHECK(std::filesystem::is_regular_file(st), "train: --data ", a->data, ": ",
                   !std::filesystem::exists(st) ? (hearth::io::entry_exists(p) ? hearth::cat(file, " is a dangling symlink")
                                                                               : hearth::cat("no ", file, " in it"))
                                                : hearth::cat(file, " is not a regular file"),
                   train ? " (the training rows, one JSON object per line)" : "");
    }
    if (!env && a->dist.nproc_per_node > 1) return hearth::cli::launch_workers(a->dist);
    const bool dp = env && env->world_size > 1;
    return hearth::cli::with_rank_prefix(dp ? env->rank : -1, [&] { return run(*a, dp ? &*env : nullptr); });
  };
}

}  // namespace
HEARTH_REGISTER_VERB(train, "train", "Fine-tune a model (LoRA or full; SFT, DPO or ORPO) on jsonl data", setup_train);
