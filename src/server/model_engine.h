// The real server::Engine: a model folder (config + weights + tokenizer + generation_config +
// chat template) behind prepare()/generate(), with per-request LoRA selection and adapter
// mount/unmount. Not the HTTP layer (server.h) and not thread-safe beyond the Engine contract:
// prepare/generate/mount/unmount run on the one engine thread.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cache/prompt_cache.h"
#include "chat/chat_template.h"
#include "chat/reasoning.h"
#include "chat/tool_calls.h"
#include "generate/decode_slots.h"
#include "generate/generate.h"
#include "io/hf_config.h"
#include "models/model.h"
#include "server/engine.h"
#include "tokenizer/tokenizer.h"

namespace hearth::server {

/// Operator-level sampling defaults (`hearth serve --temp ...`): between the request and
/// generation_config.json in the resolution order.
struct SamplingDefaults {
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<int64_t> top_k;
};

struct ModelEngineOptions {
  std::filesystem::path model_dir;
  std::string device;         ///< "cpu" | "cuda" | "" (cuda when available)
  std::string dtype;          ///< "float32" | "bfloat16" | "float16" | "" (nn::default_dtype: the checkpoint's torch_dtype on cuda, fp32 on cpu)
  int64_t context_length = 0; ///< 0: config.json max_position_embeddings
  /// Allow a context_length above the model's (derive_context_limit, server/context_limit.h):
  /// `hearth serve --allow-long-context` or HEARTH_ALLOW_LONG_CONTEXT=1; else such a
  /// context_length is refused at construction (InvalidArgument), as vLLM refuses one.
  bool allow_long_context = false;
  SamplingDefaults defaults;
  /// Folders under which POST /v1/adapters may load adapters; the model's "adapters/" subfolder is
  /// always one.
  std::vector<std::filesystem::path> adapter_roots;
  /// Adapters mounted at start (id, folder): trusted operator input, not limited to the roots.
  std::vector<std::pair<std::string, std::filesystem::path>> adapters;
  /// A full fine-tune folder (adapters/full.h) whose trained tensors are loaded over the model's
  /// weights ("" = none); not an adapter: it cannot be selected or unmounted.
  std::filesystem::path full_finetune;
  /// Selection for requests that send no "adapter" ("" = base model), e.g. "a" or "a+b".
  std::string default_adapter;
  /// Prompt cache budget in bytes of KV (`hearth serve --prompt-cache-bytes`): -1 = the default
  /// (2 GiB on CUDA, 512 MiB on CPU), 0 = off. Always off for models with dynamic-NTK RoPE (see
  /// ModelEngine::prompt_cache()).
  int64_t prompt_cache_bytes = -1;
  /// Hybrid models (a layer with a recurrent state, e.g. Qwen3.5): besides each prompt's end, the
  /// prompt cache keeps a snapshot every this many tokens of a long prompt, so a request sharing
  /// part of it resumes from the last multiple inside the shared part (`hearth serve
  /// --prompt-cache-snapshot-every`; 0 = at the prompt's end only).
  int64_t prompt_cache_snapshot_every = 4096;
  /// `hearth serve --thinking on|off`: chat_template_kwargs.enable_thinking for chat requests that
  /// do not set it (unset: the template's own default).
  std::optional<bool> thinking;
  /// Decode slots (generate/decode_slots.h) for the batched decode step once start_decode_slots()
  /// sizes them (`hearth serve --no-decode-slots` or HEARTH_DECODE_SLOTS=0: off, every decoding
  /// row takes the ragged path as before).
  bool decode_slots = true;
  /// Prompt tokens per prefill chunk (generate::GenerateOptions::prefill_step_size), and the prompt
  /// tokens one step() prefills at most (its prefill budget): between two steps other requests
  /// decode, and a request whose client left is dropped (CompletionRequest::cancelled) at the next
  /// chunk boundary. Must be positive (InvalidArgument).
  int64_t prefill_step_size = 2048;
};

/// `--adapter-path DIR` of generate/chat/eval: a LoRA adapter is mounted as `id` and made the
/// default selection; a full fine-tune (adapters::is_full_finetune) is loaded over the weights
/// (ModelEngineOptions::full_finetune). Throws hearth::Error for bad JSON in DIR's config.
void use_adapter_path(ModelEngineOptions& opts, const std::filesystem::path& dir, const std::string& id);

class ModelEngine : public Engine {
 public:
  /// Loads the model folder (config.json, *.safetensors, tokenizer.json, optional
  /// tokenizer_config.json / chat_template.jinja / generation_config.json) and mounts
  /// opts.adapters. Throws hearth::Error naming the file on anything missing or broken, and
  /// InvalidArgument, before loading any weight, for an opts.context_length above the model's
  /// limit (context_length_error) unless opts.allow_long_context or HEARTH_ALLOW_LONG_CONTEXT=1.
  explicit ModelEngine(ModelEngineOptions opts);
  ~ModelEngine() override;

  std::string model_id() const override { return model_id_; }
  int64_t context_length() const override { return context_length_; }
  /// Twice the longest vocabulary entry in bytes, as written in tokenizer.json (byte-level and
  /// SentencePiece entries are never shorter than the text they stand for; the factor 2 leaves
  /// room for a normalizer that shrinks text).
  int64_t max_token_bytes() const override { return max_token_bytes_; }

  /// Chat: messages → JSON as transformers expects (assistant tool_calls' arguments parsed from
  /// their JSON text to objects; tool messages keep tool_call_id/name) → chat template with
  /// add_generation_prompt, tools (only when tools_active()), bos/eos tokens and
  /// chat_template_kwargs (enable_thinking from opts.thinking when the request has none) → encode
  /// with special tokens, dropping a doubled BOS (the template wrote one and the post-processor
  /// added another); Prompt::reasoning_open when the rendered prompt ends inside an open thought.
  /// Completions: encode(prompt) with special tokens. Throws hearth::InvalidArgument: no chat
  /// template, a template error, an empty prompt, or an adapter id that is not mounted.
  /// Thread-safe (tokenizer, template and the adapter list under its mutex only).
  Prompt prepare(const CompletionRequest& req) override;
  /// The adapter ids again (unknown: ApiError 400, param "adapter"), on the engine thread before generate().
  void check_request(const CompletionRequest& req) override { selected_adapters(req); }
  /// Runs generate::generate with resolve_sampling(req), the request's adapters active, EOS ids
  /// (eos_ids()); streams text through a StreamDecoder that skips special tokens except, for chat
  /// requests, the reasoning and tool-call markers (marker_decoder.h) and, when
  /// asked, the sampled token's logprob and the top req.top_logprobs alternatives (log-softmax of
  /// the processed logits, before truncation). Keeps the stats in last_stats(). With a prompt
  /// cache: starts from the cached caches of the same adapter selection sharing the longest
  /// prefix (Finish::cached_tokens of them are not prefilled), and stores the caches with the
  /// whole token history (prompt + generated) back afterwards.
  Finish generate(const Prompt& prompt, const CompletionRequest& req, const TokenCallback& on_token) override;

  /// Continuous batching: generate() is start_sequence + step until done + finish_sequence, and
  /// EngineLoop runs several sequences through step() together (llama-family models decode them in
  /// one forward; other families one forward per sequence within the step).
  bool supports_batching() const override { return batching_; }
  /// Measured at load with a one-token probe: each full-attention KV layer's bytes per token (its
  /// buffer over its capacity) times `tokens` rounded up to the caches' 256-token growth step; each
  /// sliding-window layer's bytes per token times min(tokens, window - 1 + opts.prefill_step_size)
  /// rounded up alike (what its buffer grows to while a prefill chunk joins the window, kept after);
  /// plus the fixed size of the other layers (recurrent state). An upper bound of what a
  /// sequence's caches hold at any step (held_bytes), from a prompt-cache hit too (take() hands out
  /// buffers shrunk to their tokens).
  int64_t state_bytes(int64_t tokens) const override;
  /// state_bytes' terms as measured at load: {kv bytes per token, fixed bytes, 256, sliding-window
  /// bytes per token, largest window - 1 + prefill_step_size}.
  StateCharge state_charge() const override {
    return {kv_bytes_per_token_, fixed_state_bytes_, kStateRoundTo, window_bytes_per_token_, window_tokens_};
  }
  /// Bytes the caches of `seq` (one of this engine's sequences) hold now (cache::total_bytes; a
  /// sequence in a decode slot: only what it keeps outside the pool). Engine thread only.
  int64_t held_bytes(const ActiveSequence& seq) const;
  /// The device the model runs on (for the server's default memory budget).
  at::Device device() const { return model_->placement().device; }
  /// Builds the decode-slot pool (generate::DecodeSlots) for `num_seqs` running sequences (the
  /// server's --max-num-seqs) and returns the bytes it holds, which the caller takes out of the
  /// running requests' memory budget. Each slot holds C = context_length() tokens, capped so that
  /// the pool takes at most half of `memory_budget` (at DecodeSlots::slot_bytes per slot: every KV
  /// layer, sliding-window ones included, per token) and leaves room for one request filling the
  /// context (memory_budget 0 = none: C is capped at 4096 instead); a sequence longer than C
  /// decodes through the ragged path. Returns 0, building nothing, when slots are off
  /// (opts.decode_slots false, HEARTH_DECODE_SLOTS=0, no batching, C below 128) or the model
  /// cannot use them (a family without a static step, a cache kind slots do not hold); `why`
  /// then says which. Call once, before generating.
  int64_t start_decode_slots(int64_t num_seqs, int64_t memory_budget, std::string* why = nullptr);
  /// Records every (batch, length) bucket of the pool now (generate::DecodeSlots::warm_up: CUDA
  /// graphs on CUDA, nothing on CPU) so that no request pays for a capture; `hearth serve` calls
  /// it after start_decode_slots() unless --no-cuda-graph-warmup. {} when there is no pool.
  /// Call before serving (the pool must be empty).
  generate::DecodeSlots::Warmup warm_up_decode_slots(bool run_eager = false);
  /// The pool, or nullptr when there is none.
  const generate::DecodeSlots* decode_slots() const { return slots_.get(); }
  std::unique_ptr<ActiveSequence> start_sequence(const Prompt& prompt, const CompletionRequest& req,
                                                 TokenCallback on_token) override;
  /// n > 1: choice 0 takes the prompt cache and prefills; choices 1..n-1 share that prefill
  /// (generate::Sequence::share_prefill: a copy of the caches, the same last logits, their own
  /// sampler seeded with choice_seed(req.sampling.seed, i)). Each choice is stored back in the
  /// prompt cache when it finishes.
  std::vector<std::unique_ptr<ActiveSequence>> start_sequences(const Prompt& prompt, const CompletionRequest& req,
                                                               std::vector<TokenCallback> on_tokens) override;
  void step(const std::vector<ActiveSequence*>& seqs) override;
  Finish finish_sequence(ActiveSequence& seq) override;

  size_t tool_call_holdback_start(const std::string& text) const override;
  ParsedToolCalls parse_tool_calls(const std::string& text, const nlohmann::ordered_json& tools) const override;
  /// Chat requests of a model with a reasoning format: a splitter starting inside the thought when
  /// prompt.reasoning_open; with tools active, the tool-call opening tag also ends a thought.
  std::unique_ptr<chat::ReasoningSplitter> reasoning_splitter(const CompletionRequest& req,
                                                              const Prompt& prompt) const override;

  bool supports_adapters() const override { return true; }
  std::vector<AdapterInfo> list_adapters() const override;
  /// Checks: id valid and not mounted (409), `path` (absolute, or relative to the working
  /// directory) resolves under an adapter root (403), exists (404), loads and fits the model
  /// (400; all-or-nothing).
  AdapterInfo mount_adapter(const std::string& id, const std::string& path) override;
  /// Also drops the prompt cache's entries whose selection includes `id`. Refuses (ApiError 409,
  /// code "adapter_in_use") an adapter named by the default selection (opts.default_adapter):
  /// silently switching requests that send no "adapter" to the base model would change their
  /// answers, so the operator's default stays valid for the server's lifetime.
  bool unmount_adapter(const std::string& id) override;

  /// Sampling for a request: each field from the request, else the operator default, else
  /// generation_config.json (temperature, top_p, top_k, repetition_penalty), else built-ins
  /// (temperature 0.7, the rest off). With enable_thinking == false (the request's
  /// chat_template_kwargs, else opts.thinking) and no explicit temperature, temperature = min(that, 0.7) (mlx-bun). Seed: the request's, else a
  /// fresh one per request. Presence/frequency penalties: request only (mlx-lm semantics over
  /// the last 20 tokens of prompt + output; see generate/sampler.h). logit_bias: the request's
  /// (ids checked against the vocabulary: ApiError 400).
  generate::SamplingParams resolve_sampling(const CompletionRequest& req) const;
  /// Throws ApiError 400 (param "logit_bias") for a logit_bias token id outside the vocabulary.
  void check_logit_bias(const CompletionRequest& req) const;

  const tokenizer::Tokenizer& tokenizer() const { return tokenizer_; }
  models::Model& model() { return *model_; }
  /// Stop ids: config.json eos_token_id (int or list, top level or text_config) ∪
  /// generation_config.json eos_token_id ∪ the tokenizer's eos_token; sorted, unique.
  const std::vector<int64_t>& eos_ids() const { return eos_ids_; }
  /// The model's reasoning convention (chat::detect_reasoning_format on the vocabulary).
  chat::ReasoningFormat reasoning_format() const { return reasoning_format_; }
  chat::ToolCallFormat tool_call_format() const { return tool_format_; }
  bool has_chat_template() const { return chat_template_ != nullptr; }
  /// Stats of the last generate() (timings as mlx_lm.generate prints them).
  const generate::GenerationStats& last_stats() const { return last_stats_; }
  /// The prompt cache, or nullptr when off: by option, or because the model uses dynamic-NTK RoPE,
  /// whose inv_freq depends on the longest sequence seen so far (transformers'
  /// dynamic_rope_update): keys cached under one inv_freq would not match a fresh run's, so a
  /// reused prefix could silently change the output.
  const cache::PromptCache* prompt_cache() const { return prompt_cache_.get(); }

 private:
  struct Running;
  /// The request's adapter ids (or the default selection), each mounted; else ApiError 400 with
  /// param "adapter", code "invalid_value".
  std::vector<std::string> selected_adapters(const CompletionRequest& req) const;
  std::unique_ptr<ActiveSequence> start_choice(const Prompt& prompt, const CompletionRequest& req, TokenCallback on_token,
                                               int choice);
  bool on_step(Running& r, int64_t id, const generate::StepLogprobs* logprobs);  // a token → TokenEvent → on_token

  ModelEngineOptions opts_;
  std::string model_id_;
  static constexpr int64_t kStateRoundTo = 256;  // KVCache's growth step, in tokens
  int64_t context_length_ = 0;
  int64_t max_token_bytes_ = 0;
  tokenizer::Tokenizer tokenizer_;
  std::unique_ptr<models::Model> model_;
  io::GenerationConfig gen_config_;
  std::unique_ptr<chat::ChatTemplate> chat_template_;
  chat::ToolCallFormat tool_format_ = chat::ToolCallFormat::Hermes;
  std::vector<int64_t> eos_ids_;
  chat::ReasoningFormat reasoning_format_ = chat::ReasoningFormat::None;
  std::vector<int32_t> visible_markers_;  // special tokens kept in chat output (marker_decoder.h)
  std::vector<std::filesystem::path> roots_;  // canonical adapter roots
  mutable std::mutex adapters_mu_;            // guards adapters_ (listed from HTTP threads)
  std::vector<AdapterInfo> adapters_;
  generate::GenerationStats last_stats_;
  std::unique_ptr<cache::PromptCache> prompt_cache_;
  bool hybrid_ = false;    // a layer keeps a recurrent state: snapshots for the prompt cache
  bool batching_ = true;  // off for dynamic-NTK RoPE (its tables depend on the longest row seen)
  int64_t kv_bytes_per_token_ = 0, fixed_state_bytes_ = 0;  // state_bytes()' probe
  int64_t window_bytes_per_token_ = 0, window_tokens_ = 0;    // ... its sliding-window layers
  std::unique_ptr<generate::DecodeSlots> slots_;  // after model_: destroyed first
};

}  // namespace hearth::server
