// ModelEngine: prompt building (chat template + tokenizer, no double BOS), sampling defaults,
// the generation loop with streaming detokenization and logprobs, per-request LoRA selection and
// adapter mount/unmount. Not HTTP, not JSON beyond what the chat template consumes.
#include "server/model_engine.h"

#include <c10/core/GradMode.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <limits>

#include "adapters/adapter.h"
#include "adapters/full.h"
#include "adapters/mount.h"
#include "core/env.h"
#include "core/error.h"
#include "core/json_nesting.h"
#include "core/torch_compat.h"
#include "io/hf_config.h"
#include "models/registry.h"
#include "server/api_error.h"
#include "server/context_limit.h"
#include "generate/batch.h"
#include "server/marker_decoder.h"
#include "server/structured_output.h"
#include "tokenizer/unicode.h"

namespace hearth::server {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

// A fresh per-request seed: clock bits mixed with a per-process Weyl sequence (as mlx-bun), so
// two requests in the same nanosecond still differ.
uint64_t fresh_seed() {
  static std::atomic<uint64_t> weyl{0};
  const uint64_t now = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return now ^ (weyl.fetch_add(0x9e3779b97f4a7c15ULL) + 0x9e3779b97f4a7c15ULL);
}

// One message as transformers' apply_chat_template sees it.
ojson message_json(const ChatMessage& m) {
  ojson j = {{"role", m.role}};
  j["content"] = m.content ? ojson(*m.content) : ojson(nullptr);
  if (m.reasoning_content) j["reasoning_content"] = *m.reasoning_content;
  if (!m.name.empty()) j["name"] = m.name;
  if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
  if (!m.tool_calls.empty()) {
    ojson calls = ojson::array();
    for (const auto& tc : m.tool_calls) {
      // OpenAI sends arguments as a JSON string; templates expect the object (mlx-lm parses it).
      // Too deep to convert safely (request_parse refuses it first): the template gets the string.
      ojson args = json_nesting_violation(tc.arguments_json)
                       ? ojson(tc.arguments_json)
                       : ojson::parse(tc.arguments_json, nullptr, /*allow_exceptions=*/false);
      if (args.is_discarded()) args = tc.arguments_json;
      ojson call = {{"id", tc.id}, {"type", "function"}, {"function", {{"name", tc.name}, {"arguments", std::move(args)}}}};
      calls.push_back(std::move(call));
    }
    j["tool_calls"] = std::move(calls);
  }
  return j;
}

int64_t read_context_length(const fs::path& dir, const tokenizer::Tokenizer& tok) {
  nlohmann::json cfg = io::read_json(dir / "config.json");
  for (const auto* c : {&cfg, cfg.contains("text_config") ? &cfg["text_config"] : nullptr}) {
    if (c && c->contains("max_position_embeddings") && (*c)["max_position_embeddings"].is_number_integer())
      return (*c)["max_position_embeddings"].get<int64_t>();
  }
  if (auto m = tok.model_max_length(); m && *m > 0 && *m < (int64_t{1} << 24)) return *m;
  return 4096;
}

// Whether config.json (or its text_config) asks for dynamic-NTK RoPE in rope_scaling (4.x) or
// rope_parameters (5.x, possibly one object per layer type).
bool uses_dynamic_rope(const nlohmann::json& cfg) {
  auto is_dynamic = [](const nlohmann::json& s) {
    for (const char* k : {"rope_type", "type"})
      if (s.contains(k) && s[k].is_string() && s[k].get<std::string>() == "dynamic") return true;
    return false;
  };
  for (const auto* c : {&cfg, cfg.contains("text_config") ? &cfg["text_config"] : nullptr}) {
    if (!c || !c->is_object()) continue;
    for (const char* key : {"rope_scaling", "rope_parameters"}) {
      if (!c->contains(key) || !(*c)[key].is_object()) continue;
      const auto& s = (*c)[key];
      if (is_dynamic(s)) return true;
      for (const auto& [_, v] : s.items())
        if (v.is_object() && is_dynamic(v)) return true;
    }
  }
  return false;
}

// eos_token_id of config.json (top level, then text_config): an int or a list of ints; anything
// else is a one-line error naming the file.
std::vector<int64_t> config_eos_ids(const nlohmann::json& cfg, const fs::path& file) {
  std::vector<int64_t> ids;
  for (const auto* c : {&cfg, cfg.contains("text_config") ? &cfg["text_config"] : nullptr}) {
    if (!c || !c->is_object() || !c->contains("eos_token_id") || (*c)["eos_token_id"].is_null()) continue;
    const auto& e = (*c)["eos_token_id"];
    const bool ok = e.is_number_integer() ||
                    (e.is_array() && std::all_of(e.begin(), e.end(), [](const auto& v) { return v.is_number_integer(); }));
    HEARTH_CHECK(ok, file.string(), ": eos_token_id must be an integer or a list of integers, got ", e.dump());
    if (e.is_number_integer()) ids.push_back(e.get<int64_t>());
    else
      for (const auto& v : e) ids.push_back(v.get<int64_t>());
  }
  return ids;
}

// The prompt cache's namespace for an adapter selection: ids joined by '+' ("" = base model).
std::string selection_key(const std::vector<std::string>& ids) {
  std::string k;
  for (const auto& id : ids) k += (k.empty() ? "" : "+") + id;
  return k;
}

bool under(const fs::path& p, const fs::path& root) {
  fs::path rel = p.lexically_relative(root);
  return !rel.empty() && *rel.begin() != "..";
}

}  // namespace

void use_adapter_path(ModelEngineOptions& opts, const fs::path& dir, const std::string& id) {
  if (adapters::is_full_finetune(dir)) {
    opts.full_finetune = dir;
    return;
  }
  opts.adapters.emplace_back(id, dir);
  opts.default_adapter = id;
}

ModelEngine::ModelEngine(ModelEngineOptions opts)
    : opts_(std::move(opts)), tokenizer_(tokenizer::Tokenizer::from_dir(opts_.model_dir)) {
  c10::NoGradGuard no_grad;
  HEARTH_CHECK_T(InvalidArgument, opts_.prefill_step_size > 0, "prefill_step_size must be positive, got ",
                 opts_.prefill_step_size);
  const fs::path dir = fs::weakly_canonical(opts_.model_dir);
  model_id_ = dir.filename().string();
  if (opts_.context_length > 0) {
    const std::string err = context_length_error(opts_.context_length, derive_context_limit(io::read_json(dir / "config.json")),
                                                 opts_.allow_long_context || long_context_allowed_by_env());
    HEARTH_CHECK_T(InvalidArgument, err.empty(), err);
  }
  const nn::LoadOptions placement = nn::resolve_placement(opts_.device, opts_.dtype, dir);
  model_ = opts_.full_finetune.empty() ? models::load_model(dir, placement)
                                       : adapters::load_model_with_full_finetune(dir, opts_.full_finetune, placement);
  gen_config_ = io::GenerationConfig::load(dir);
  context_length_ = opts_.context_length > 0 ? opts_.context_length : read_context_length(dir, tokenizer_);
  // Twice the longest vocabulary entry: a normalizer (NFKC, accent stripping) may shrink text.
  for (int32_t id = 0; id < tokenizer_.vocab_size(); ++id)
    max_token_bytes_ = std::max<int64_t>(max_token_bytes_, 2 * static_cast<int64_t>(tokenizer_.id_to_token(id).size()));
  if (!tokenizer_.chat_template().empty()) {
    chat_template_ = std::make_unique<chat::ChatTemplate>(tokenizer_.chat_template());
    tool_format_ = chat::detect_tool_call_format(tokenizer_.chat_template());
    if (tool_format_ == chat::ToolCallFormat::None) tool_format_ = chat::ToolCallFormat::Hermes;
  }
  const nlohmann::json config = io::read_json(dir / "config.json");
  eos_ids_ = config_eos_ids(config, dir / "config.json");
  eos_ids_.insert(eos_ids_.end(), gen_config_.eos_token_ids.begin(), gen_config_.eos_token_ids.end());
  if (auto eos = tokenizer_.eos_id()) eos_ids_.push_back(*eos);
  std::sort(eos_ids_.begin(), eos_ids_.end());
  eos_ids_.erase(std::unique(eos_ids_.begin(), eos_ids_.end()), eos_ids_.end());
  reasoning_format_ = chat::detect_reasoning_format([&](std::string_view t) { return tokenizer_.token_to_id(t).has_value(); });
  {
    const chat::ReasoningMarkers& rm = chat::reasoning_markers(reasoning_format_);
    std::vector<std::string> markers{rm.open, rm.close};
    if (tool_format_ == chat::ToolCallFormat::Gemma4)
      for (const char* m : {"<|tool_call>", "<tool_call|>", "<|\"|>"}) markers.emplace_back(m);
    visible_markers_ = special_marker_ids(tokenizer_, markers);
  }

  roots_.push_back(fs::weakly_canonical(dir / "adapters"));
  for (const auto& r : opts_.adapter_roots) roots_.push_back(fs::weakly_canonical(fs::absolute(r)));
  for (const auto& [id, path] : opts_.adapters) {
    adapters::Adapter a = adapters::load_adapter(path);
    a.id = id;
    try {
      adapters::mount(*model_, a);
    } catch (const Error& e) {  // name the folder: the id may be an internal one (generate's "cli")
      throw InvalidArgument(cat(path.string(), ": ", e.what()));
    }
    AdapterInfo info{id, fs::weakly_canonical(fs::absolute(path)).string(),
                     a.format == adapters::Format::Peft ? "peft" : "mlx", 0,
                     static_cast<int64_t>(a.modules.size()), a.config.scale};
    for (const auto& [_, m] : a.modules) info.rank = std::max(info.rank, m.a.size(0));
    adapters_.push_back(std::move(info));
  }
  int64_t pc_bytes = opts_.prompt_cache_bytes;
  if (pc_bytes < 0) pc_bytes = model_->placement().device.is_cuda() ? (int64_t{2} << 30) : (int64_t{512} << 20);
  batching_ = !uses_dynamic_rope(config);
  {
    // One token through fresh caches: growing KV caches then hold `capacity` tokens' worth.
    cache::Caches probe = model_->make_cache();
    model_->forward(at::zeros({1, 1}, at::TensorOptions().dtype(at::kLong).device(model_->placement().device)), 0, &probe);
    // A sliding-window cache holds up to window - 1 + T tokens while a T-token chunk goes through
    // (then keeps its buffer): charged per token up to window - 1 + one prefill chunk.
    double per_token = 0, window_per_token = 0;
    int64_t window = 0;
    for (const auto& c : probe) {
      if (!c) continue;
      hybrid_ = hybrid_ || c->kind() == "recurrent";
      if (const auto* kv = dynamic_cast<const cache::KVCache*>(c.get()); kv && kv->capacity() > 0) {
        per_token += static_cast<double>(kv->nbytes()) / static_cast<double>(kv->capacity());
      } else if (const auto* rot = dynamic_cast<const cache::RotatingKVCache*>(c.get()); rot && rot->capacity() > 0) {
        window_per_token += static_cast<double>(rot->nbytes()) / static_cast<double>(rot->capacity());
        window = std::max(window, rot->window());
      } else {
        fixed_state_bytes_ += c->nbytes();
      }
    }
    kv_bytes_per_token_ = static_cast<int64_t>(per_token + 0.5);
    window_bytes_per_token_ = static_cast<int64_t>(window_per_token + 0.5);
    window_tokens_ = window > 0 ? window - 1 + opts_.prefill_step_size : 0;
  }
  if (pc_bytes > 0 && !uses_dynamic_rope(config))
    prompt_cache_ = std::make_unique<cache::PromptCache>(pc_bytes);
  if (!opts_.default_adapter.empty()) {
    CompletionRequest probe;
    selected_adapters(probe);  // throws when the default names an adapter that is not mounted
  }
}

ModelEngine::~ModelEngine() = default;

std::vector<std::string> ModelEngine::selected_adapters(const CompletionRequest& req) const {
  // An empty selection read as the base model; "none" says that (and an empty id may be a typo).
  // ApiError naming the field wherever it is checked (prepare, and again on the engine thread,
  // where an unmount since prepare() is found): one error shape either way.
  if (req.adapter && req.adapter->empty())
    throw ApiError(400, "adapter: empty; name a mounted adapter, \"a+b\", or \"none\" for the base model", "adapter",
                   "invalid_value");
  std::vector<std::string> ids;
  try {
    ids = nn::parse_adapter_spec(req.adapter ? *req.adapter : opts_.default_adapter);
  } catch (const InvalidArgument& e) {
    throw ApiError(400, e.what(), "adapter", "invalid_value");
  }
  std::lock_guard<std::mutex> lock(adapters_mu_);
  for (const auto& id : ids) {
    bool found = std::any_of(adapters_.begin(), adapters_.end(), [&](const AdapterInfo& a) { return a.id == id; });
    if (found) continue;
    std::string mounted;
    for (const auto& a : adapters_) mounted += (mounted.empty() ? "" : ", ") + a.id;
    throw ApiError(400,
                   cat("adapter: unknown adapter \"", id, "\" (mounted: ", mounted.empty() ? "none" : mounted,
                       "; use \"none\" for the base model)"),
                   "adapter", "invalid_value");
  }
  return ids;
}

void ModelEngine::check_logit_bias(const CompletionRequest& req) const {
  for (const auto& [id, b] : req.sampling.logit_bias)
    if (id >= model_->vocab_size())
      throw ApiError(400, "Invalid 'logit_bias': token id " + std::to_string(id) + " is outside the vocabulary (" +
                              std::to_string(model_->vocab_size()) + " tokens).",
                     "logit_bias", "invalid_value");
}

Prompt ModelEngine::prepare(const CompletionRequest& req) {
  selected_adapters(req);
  check_logit_bias(req);  // here, so the client gets a 400 before generation starts
  check_structured_output(req, tool_format_);
  Prompt p;
  if (req.chat) {
    HEARTH_CHECK_T(InvalidArgument, chat_template_, "model '", model_id_,
                   "' has no chat template (tokenizer_config.json chat_template or chat_template.jinja); "
                   "use /v1/completions with a raw prompt, or add a template to the model folder");
    chat::ChatInputs in;
    for (const auto& m : req.messages) in.messages.push_back(message_json(m));
    if (req.tools_active()) in.tools = req.tools;
    in.add_generation_prompt = true;
    in.extra_kwargs = req.chat_template_kwargs;
    if (opts_.thinking && !in.extra_kwargs.contains("enable_thinking")) in.extra_kwargs["enable_thinking"] = *opts_.thinking;
    in.bos_token = tokenizer_.bos_token();
    in.eos_token = tokenizer_.eos_token();
    in.null_content_as_empty = true;  // vLLM: content null beside tool_calls reaches templates as ""
    try {
      p.text = chat_template_->render(in);
    } catch (const Error& e) {  // the template refused or could not render these messages (or tools)
      throw ApiError(400, cat("Invalid 'messages': the model's chat template could not render them: ", e.what()), "messages",
                     "invalid_value");
    }
  } else if (!req.prompt_ids.empty()) {
    // Token ids as given (vLLM: no BOS added, each id checked against the model's vocabulary).
    std::vector<int32_t> given;
    for (size_t i = 0; i < req.prompt_ids.size(); ++i) {
      const int64_t id = req.prompt_ids[i];
      if (id >= model_->vocab_size())
        throw ApiError(400, cat("Invalid 'prompt[", i, "]': token id ", id, " is outside the vocabulary (",
                                model_->vocab_size(), " tokens)."),
                       cat("prompt[", i, "]"), "invalid_value");
      given.push_back(static_cast<int32_t>(id));
    }
    p.text = tokenizer_.decode(given, /*skip_special_tokens=*/false);
    p.ids = req.prompt_ids;
    return p;
  } else {
    p.text = req.prompt;
  }
  std::vector<int32_t> ids = tokenizer_.encode(p.text, /*add_special_tokens=*/true);
  // The template may write the BOS itself and the post-processor add another: keep one.
  if (auto bos = tokenizer_.bos_id(); bos && ids.size() >= 2 && ids[0] == *bos && ids[1] == *bos) ids.erase(ids.begin());
  HEARTH_CHECK_T(InvalidArgument, !ids.empty(), req.chat ? "messages" : "prompt", ": the prompt has no tokens");
  p.ids.assign(ids.begin(), ids.end());
  p.reasoning_open = req.chat && chat::prompt_opens_reasoning(p.text, reasoning_format_);
  return p;
}

generate::SamplingParams ModelEngine::resolve_sampling(const CompletionRequest& req) const {
  const SamplingOptions& r = req.sampling;
  const SamplingDefaults& d = opts_.defaults;
  const io::GenerationConfig& g = gen_config_;
  generate::SamplingParams sp;
  sp.temperature = r.temperature ? *r.temperature : d.temperature ? *d.temperature : g.temperature.value_or(0.7);
  auto thinking = req.chat_template_kwargs.find("enable_thinking");
  const bool thinking_off = thinking != req.chat_template_kwargs.end()
                                ? thinking->is_boolean() && !thinking->get<bool>()
                                : opts_.thinking.has_value() && !*opts_.thinking;
  if (!r.temperature && thinking_off) sp.temperature = std::min(sp.temperature, 0.7);
  sp.top_p = r.top_p ? *r.top_p : d.top_p ? *d.top_p : g.top_p.value_or(0.0);
  sp.top_k = r.top_k ? *r.top_k : d.top_k ? *d.top_k : g.top_k.value_or(0);
  sp.min_p = r.min_p ? *r.min_p : d.min_p.value_or(0.0);
  sp.repetition_penalty =
      r.repetition_penalty ? *r.repetition_penalty : d.repetition_penalty ? *d.repetition_penalty : g.repetition_penalty.value_or(0.0);
  sp.presence_penalty = r.presence_penalty.value_or(0.0);
  sp.frequency_penalty = r.frequency_penalty.value_or(0.0);
  check_logit_bias(req);
  sp.logit_bias = r.logit_bias;
  sp.seed = r.seed ? static_cast<uint64_t>(*r.seed) : fresh_seed();
  sp.constraint = make_constraint(req, tokenizer_, eos_ids_, tool_format_);
  return sp;
}

// One request in a continuous batch: the generate::Sequence plus what turns its tokens into
// TokenEvents (the detokenizer against the prompt's tail, logprobs) and the prompt-cache key.
struct ModelEngine::Running : ActiveSequence {
  static constexpr size_t kContext = 4;  // ids a token is decoded against
  std::unique_ptr<generate::Sequence> seq;
  TokenCallback on_token;
  std::unique_ptr<MarkerStreamDecoder> decoder;
  std::vector<int32_t> context;  // the last kContext ids before the next token
  std::string ns;                // the prompt cache namespace: the adapter selection
  bool logprobs = false;
  bool stopped = false;          // on_token returned false
  bool constrained = false;      // a TokenConstraint (structured output) restricts its sampling
  bool done() const override { return seq->done(); }
};

std::unique_ptr<ActiveSequence> ModelEngine::start_sequence(const Prompt& prompt, const CompletionRequest& req,
                                                            TokenCallback on_token) {
  return start_choice(prompt, req, std::move(on_token), 0);
}

std::vector<std::unique_ptr<ActiveSequence>> ModelEngine::start_sequences(const Prompt& prompt, const CompletionRequest& req,
                                                                          std::vector<TokenCallback> on_tokens) {
  std::vector<std::unique_ptr<ActiveSequence>> out;
  for (size_t i = 0; i < on_tokens.size(); ++i) {
    out.push_back(start_choice(prompt, req, std::move(on_tokens[i]), static_cast<int>(i)));
    // Choices after the first wait for the first one's prefill and start from a copy of its caches.
    if (i > 0)
      static_cast<Running&>(*out[0]).seq->share_prefill(*static_cast<Running&>(*out.back()).seq);
  }
  return out;
}

std::unique_ptr<ActiveSequence> ModelEngine::start_choice(const Prompt& prompt, const CompletionRequest& req,
                                                          TokenCallback on_token, int choice) {
  generate::GenerateOptions o;
  const int64_t room = context_length_ - static_cast<int64_t>(prompt.ids.size());
  o.max_tokens = std::min(req.max_tokens.value_or(room), room);
  o.sampling = resolve_sampling(req);
  if (choice > 0 && req.sampling.seed) o.sampling.seed = static_cast<uint64_t>(*choice_seed(req.sampling.seed, choice));
  if (!req.ignore_eos) o.eos_ids = eos_ids_;  // vLLM's ignore_eos: max_tokens / stop strings end it
  o.logprobs = req.logprobs;
  o.top_logprobs = req.logprobs ? req.top_logprobs : 0;
  o.keep_caches = prompt_cache_ != nullptr;  // finish() stores them in the prompt cache, nothing else reads them
  o.prefill_step_size = opts_.prefill_step_size;
  if (const std::atomic<bool>* flag = req.cancelled)
    o.cancelled = [flag] { return flag->load(std::memory_order_relaxed); };
  // The selection made now stays this sequence's for its whole generation; unmounts wait until no
  // sequence runs (EngineLoop).
  const std::vector<std::string> selection = selected_adapters(req);
  auto r = std::make_unique<Running>();
  r->ns = selection_key(selection);
  r->on_token = std::move(on_token);
  r->logprobs = req.logprobs;
  r->constrained = o.sampling.constraint != nullptr;
  cache::Caches caches;
  if (prompt_cache_ && choice == 0) caches = prompt_cache_->take(r->ns, prompt.ids).caches;
  // Generated text continues the prompt: each token is decoded against the ids before it
  // (decode(context + id) minus decode(context), as vLLM), so a SentencePiece "▁a" right after
  // the prompt keeps its space and logprob tokens/bytes add up to the text.
  r->context.assign(prompt.ids.end() - static_cast<std::ptrdiff_t>(std::min(Running::kContext, prompt.ids.size())),
                    prompt.ids.end());
  r->decoder = std::make_unique<MarkerStreamDecoder>(tokenizer_, req.chat ? visible_markers_ : std::vector<int32_t>{},
                                                     r->context);
  Running* self = r.get();
  r->seq = std::make_unique<generate::Sequence>(prompt.ids, std::move(o), std::move(caches), selection,
                                                [this, self](int64_t id, const generate::StepLogprobs* lp) { return on_step(*self, id, lp); });
  if (prompt_cache_ && hybrid_)
    // Recurrent states cannot be trimmed back to a shared prefix: keep them where one may be wanted.
    r->seq->on_snapshot(opts_.prompt_cache_snapshot_every,
                        [this, ns = r->ns, ids = prompt.ids](int64_t n, cache::Caches snapshot) {
                          prompt_cache_->put(ns, std::vector<int64_t>(ids.begin(), ids.begin() + n), std::move(snapshot));
                        });
  return r;
}

bool ModelEngine::on_step(Running& r, int64_t id, const generate::StepLogprobs* logprobs) {
  auto fill = [&](int64_t tok, std::string& token, std::string& bytes) {
    bytes = tokenizer_.continuation_bytes(r.context, static_cast<int32_t>(tok));
    token = tokenizer::unicode::to_valid_utf8(bytes);
  };
  TokenEvent ev;
  ev.id = id;
  ev.text = r.decoder->push(static_cast<int32_t>(id));
  if (r.logprobs && logprobs) {
    // Host values already (the step read every row's in one copy): no device read here.
    fill(id, ev.token, ev.bytes);
    ev.logprob = logprobs->logprob;
    for (size_t i = 0; i < logprobs->top_ids.size(); ++i) {
      TopLogprob alt;
      alt.id = logprobs->top_ids[i];
      fill(alt.id, alt.token, alt.bytes);
      alt.logprob = logprobs->top_values[i];
      ev.top_logprobs.push_back(std::move(alt));
    }
  }
  r.context.push_back(static_cast<int32_t>(id));
  if (r.context.size() > Running::kContext) r.context.erase(r.context.begin());
  if (!r.on_token(ev)) {
    r.stopped = true;
    return false;
  }
  return true;
}

void ModelEngine::step(const std::vector<ActiveSequence*>& seqs) {
  std::vector<generate::Sequence*> v;
  for (ActiveSequence* a : seqs) v.push_back(static_cast<Running*>(a)->seq.get());
  generate::step(*model_, v, opts_.prefill_step_size, slots_.get());
}

int64_t ModelEngine::start_decode_slots(int64_t num_seqs, int64_t memory_budget, std::string* why) {
  auto off = [&](std::string reason) {
    if (why) *why = std::move(reason);
    return int64_t{0};
  };
  slots_.reset();
  if (!opts_.decode_slots || !env_switch_on("HEARTH_DECODE_SLOTS")) return off("switched off by --no-decode-slots or HEARTH_DECODE_SLOTS=0");
  if (!batching_) return off("this model's RoPE (dynamic NTK) does not batch");
  if (num_seqs < 1) return off("no sequences to hold");
  int64_t capacity = context_length_;
  if (memory_budget > 0) {
    // The pool takes at most half the budget and leaves one full-context request its room. A slot
    // holds every KV layer per token, sliding-window ones included (by absolute position), so its
    // cost is measured on the slot layout, not on the growing caches' (state_bytes).
    const int64_t share = std::min(memory_budget / 2, memory_budget - state_bytes(context_length_));
    const generate::DecodeSlots::SlotBytes cost = generate::DecodeSlots::slot_bytes(*model_);
    const int64_t per_slot = share / num_seqs - cost.fixed;
    if (per_slot <= 0) return off("the memory budget leaves no room for decode slots");
    if (cost.per_token > 0) capacity = std::min(capacity, per_slot / cost.per_token);
  } else {
    capacity = std::min<int64_t>(capacity, 4096);
  }
  if (capacity > 128) capacity = capacity / 64 * 64;  // aligned length buckets for the attention kernels
  if (capacity < 128)
    return off(cat("decode slots of ", capacity, " tokens are too short to be worth it (raise --context-length or --memory-budget)"));
  std::string reason;
  slots_ = generate::DecodeSlots::create(*model_, num_seqs, capacity, &reason);
  if (!slots_) return off(reason);
  return slots_->nbytes();
}

generate::DecodeSlots::Warmup ModelEngine::warm_up_decode_slots(bool run_eager) {
  if (!slots_) return {};
  return slots_->warm_up(run_eager);
}

Finish ModelEngine::finish_sequence(ActiveSequence& a) {
  Running& r = static_cast<Running&>(a);
  if (const std::string& err = r.seq->error(); !err.empty()) {
    // Its own sampling failed (the other requests of the batch went on). A grammar that outgrew
    // its limits is the request's doing: a 400 naming response_format; anything else is ours.
    if (r.constrained)
      throw ApiError(400, "The response_format / forced tool call could not be followed: " + err +
                              ". Simplify the schema (fewer or shorter enum values, smaller maxLength).",
                     "response_format", "response_format_too_complex");
    throw Error("sampling failed: " + err);
  }
  const generate::GenerationResult& result = r.seq->result();
  if (std::string rest = r.decoder->flush(); !rest.empty() && !r.stopped && !result.stats.cancelled) {
    TokenEvent ev;
    ev.text_only = true;
    ev.text = std::move(rest);
    r.on_token(ev);
  }
  last_stats_ = result.stats;
  cache::Caches& caches = r.seq->caches();
  if (prompt_cache_ && !caches.empty()) {
    // The caches hold the prompt and every generated token that was fed back (not a final EOS,
    // nor the last token when the limit or the callback stopped it).
    std::vector<int64_t> history = r.seq->prompt();
    history.insert(history.end(), result.tokens.begin(), result.tokens.end());
    history.resize(static_cast<size_t>(std::min<int64_t>(cache::offset_of(caches), history.size())));
    prompt_cache_->put(r.ns, std::move(history), std::move(caches));
  }
  Finish f;
  f.cached_tokens = result.stats.cached_tokens;
  f.completion_tokens = static_cast<int64_t>(result.tokens.size()) + (result.stats.stopped_by_eos ? 1 : 0);
  f.reason = r.stopped                     ? Finish::Reason::kStopped
             : result.stats.cancelled      ? Finish::Reason::kAborted  // req.cancelled: cut, never "stop"
             : result.stats.stopped_by_eos ? Finish::Reason::kEos
                                           : Finish::Reason::kLength;
  return f;
}

int64_t ModelEngine::state_bytes(int64_t tokens) const {
  // Saturating: a context of 2^62 tokens (a config's max_position_embeddings) must read as "more
  // than any budget", not wrap to a small or negative charge that admits the request.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  auto rounded = [](int64_t n) {
    n = std::max<int64_t>(n, 1);
    return n > kMax - kStateRoundTo ? kMax / kStateRoundTo * kStateRoundTo : (n + kStateRoundTo - 1) / kStateRoundTo * kStateRoundTo;
  };
  int64_t kv = 0, win = 0, sum = 0;
  if (__builtin_mul_overflow(kv_bytes_per_token_, rounded(tokens), &kv) ||
      __builtin_mul_overflow(window_bytes_per_token_, rounded(std::min(tokens, window_tokens_)), &win) ||
      __builtin_add_overflow(fixed_state_bytes_, kv, &sum) || __builtin_add_overflow(sum, win, &sum))
    return kMax;
  return sum;
}

int64_t ModelEngine::held_bytes(const ActiveSequence& seq) const {
  return static_cast<const Running&>(seq).seq->cache_bytes();
}

Finish ModelEngine::generate(const Prompt& prompt, const CompletionRequest& req, const TokenCallback& on_token) {
  c10::NoGradGuard no_grad;
  compat::reset_peak_memory(model_->placement().device);
  std::unique_ptr<ActiveSequence> seq = start_sequence(prompt, req, on_token);
  while (!seq->done()) step({seq.get()});
  return finish_sequence(*seq);
}

size_t ModelEngine::tool_call_holdback_start(const std::string& text) const {
  return chat::tool_call_holdback_start(text, tool_format_);
}

ParsedToolCalls ModelEngine::parse_tool_calls(const std::string& text, const nlohmann::ordered_json& tools) const {
  return to_server(chat::parse_tool_calls(text, tool_format_, tools));
}

std::unique_ptr<chat::ReasoningSplitter> ModelEngine::reasoning_splitter(const CompletionRequest& req,
                                                                         const Prompt& prompt) const {
  if (!req.chat || req.output_constrained() || reasoning_format_ == chat::ReasoningFormat::None) return nullptr;
  std::vector<std::string> ends;
  if (req.tools_active()) ends.push_back(chat::tool_call_start_marker(tool_format_));
  return std::make_unique<chat::ReasoningSplitter>(reasoning_format_, output_starts_in_reasoning(req, prompt),
                                                      std::move(ends));
}

std::vector<AdapterInfo> ModelEngine::list_adapters() const {
  std::lock_guard<std::mutex> lock(adapters_mu_);
  return adapters_;
}

AdapterInfo ModelEngine::mount_adapter(const std::string& id, const std::string& path) {
  try {
    adapters::check_adapter_id(id);  // also no control characters (a NUL would cut messages short)
  } catch (const Error& e) {
    throw ApiError(400, e.what(), "id");
  }
  if (id == model_id_)  // 'model' would keep selecting the base model: the adapter could not be named
    throw ApiError(409, "The id '" + id + "' is the served model's; mount the adapter under another id.", "id",
                   "adapter_exists");
  {
    std::lock_guard<std::mutex> lock(adapters_mu_);
    for (const auto& a : adapters_)
      if (a.id == id)
        throw ApiError(409, "An adapter with id '" + id + "' is already mounted (from " + a.path + "); DELETE it first.", "id",
                       "adapter_exists");
  }
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(fs::absolute(path), ec);
  const bool allowed = !ec && std::any_of(roots_.begin(), roots_.end(), [&](const fs::path& r) { return under(p, r); });
  if (!allowed) {
    std::string roots;
    for (const auto& r : roots_) roots += (roots.empty() ? "" : ", ") + r.string();
    throw ApiError(403, "Adapter path '" + path + "' is outside the allowed adapter folders (" + roots +
                            "); start the server with --adapter-dir to allow another folder.", "path");
  }
  if (!fs::is_directory(p, ec)) throw ApiError(404, "No adapter folder at '" + path + "'.", "path", "adapter_not_found");
  adapters::Adapter a;
  try {
    // Every file must resolve inside the allowed folders (a symlinked file must not read /etc), and
    // shapes are checked against the model from the header before any tensor data is copied.
    const adapters::ModuleShapes shapes = adapters::module_shapes(*model_);
    adapters::LoadAdapterOptions load_opts;
    load_opts.roots = roots_;
    load_opts.shapes = &shapes;
    a = adapters::load_adapter(p, load_opts);
    a.id = id;
    adapters::mount(*model_, a);  // validates first; all-or-nothing
  } catch (const Error& e) {
    throw ApiError(400, e.what(), "path");
  }
  AdapterInfo info{id, p.string(), a.format == adapters::Format::Peft ? "peft" : "mlx", 0,
                   static_cast<int64_t>(a.modules.size()), a.config.scale};
  for (const auto& [_, m] : a.modules) info.rank = std::max(info.rank, m.a.size(0));
  std::lock_guard<std::mutex> lock(adapters_mu_);
  adapters_.push_back(info);
  return info;
}

bool ModelEngine::unmount_adapter(const std::string& id) {
  std::lock_guard<std::mutex> lock(adapters_mu_);
  auto it = std::find_if(adapters_.begin(), adapters_.end(), [&](const AdapterInfo& a) { return a.id == id; });
  if (it == adapters_.end()) return false;
  const std::vector<std::string> defaults = nn::parse_adapter_spec(opts_.default_adapter);
  if (std::find(defaults.begin(), defaults.end(), id) != defaults.end())
    throw ApiError(409, "Adapter '" + id + "' is part of the server's default adapter selection (--default-adapter \"" +
                            opts_.default_adapter + "\"), which requests without \"adapter\" use; it cannot be "
                            "unmounted while the server runs (restart without it, or mount another id).",
                   "id", "adapter_in_use");
  adapters::unmount(*model_, id);
  adapters_.erase(it);
  if (prompt_cache_) {
    // Unmount runs on the engine thread (between generations), like every prompt cache access.
    prompt_cache_->drop_if([&](const std::string& ns) {
      const auto ids = nn::parse_adapter_spec(ns);
      return std::find(ids.begin(), ids.end(), id) != ids.end();
    });
  }
  return true;
}

}  // namespace hearth::server
