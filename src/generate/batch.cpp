// Sequence and step(): generate()'s prefill/sample/decode loop cut into scheduler iterations so
// that several sequences decode together. Not the server's scheduling policy (engine_loop.cpp).
#include "generate/batch.h"

#include <c10/core/GradMode.h>

#include <algorithm>

#include "core/error.h"
#include "core/torch_compat.h"
#include "generate/decode_slots.h"
#include "nn/linear.h"

namespace hearth::generate {

namespace {
using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
}  // namespace

Sequence::Sequence(std::vector<int64_t> prompt, GenerateOptions opts, cache::Caches caches,
                   std::vector<std::string> adapters, StepCallback on_step)
    : prompt_(std::move(prompt)),
      opts_(std::move(opts)),
      caches_(std::move(caches)),
      adapters_(std::move(adapters)),
      on_step_(std::move(on_step)),
      sampler_(opts_.sampling) {
  HEARTH_CHECK(!prompt_.empty(), "generate: the prompt is empty");
  HEARTH_CHECK(opts_.prefill_step_size > 0, "generate: prefill_step_size must be positive");
  tokens_ = prompt_;
  result_.stats.prompt_tokens = static_cast<int64_t>(prompt_.size());
}

Sequence::~Sequence() {
  if (slots_) slots_->release(*this, /*read_back=*/false);
  if (parent_) std::erase(parent_->forks_, this);
  for (Sequence* c : forks_) {
    c->parent_ = nullptr;
    c->done_ = true;
    c->error_ = "the sequence whose prompt prefill it shared was dropped before the prefill ended";
  }
}

cache::Caches& Sequence::caches() {
  if (slots_) slots_->release(*this, /*read_back=*/true);
  return caches_;
}

void Sequence::share_prefill(Sequence& child) {
  HEARTH_CHECK(&child != this && !started_ && !child.started_ && !child.parent_ && child.forks_.empty(),
               "generate: share_prefill needs two distinct sequences that have not started");
  HEARTH_CHECK(child.prompt_ == prompt_, "generate: share_prefill needs the same prompt");
  HEARTH_CHECK(child.adapters_ == adapters_, "generate: share_prefill needs the same adapters");
  HEARTH_CHECK(child.caches_.empty(), "generate: a sequence sharing a prefill brings no caches");
  child.parent_ = this;
  forks_.push_back(&child);
}

void Sequence::release_forks(models::Model& model, const at::Tensor& last_logits) {
  std::vector<Sequence*> forks;
  forks.swap(forks_);
  for (Sequence* c : forks) {
    c->parent_ = nullptr;
    c->caches_ = cache::clone(caches_);
    c->offset_ = offset_;
    c->started_ = true;
    c->t0_ = t0_;
    c->result_.stats.cached_tokens = result_.stats.cached_tokens;
    GenerationStats& st = c->result_.stats;
    const int64_t prefilled = offset_ - st.cached_tokens;
    if (c->opts_.max_tokens <= 0) {
      c->done_ = true;
    } else {
      c->sample_and_emit(last_logits);
    }
    c->t1_ = Clock::now();
    c->t_last_ = c->t1_;
    st.ttft_s = seconds(c->t0_, c->t1_);
    st.prompt_tps = prefilled / std::max(st.ttft_s, 1e-9);
    if (c->done_) c->finish_stats(model);
  }
}

void Sequence::check_prompt(const models::Model& model) {
  for (int64_t id : prompt_)
    HEARTH_CHECK(id >= 0 && id < model.vocab_size(), "generate: prompt token id ", id,
                 " is outside the vocabulary [0, ", model.vocab_size(), ")");
  if (caches_.empty()) caches_ = model.make_cache();
  offset_ = cache::offset_of(caches_);
  HEARTH_CHECK(offset_ < result_.stats.prompt_tokens, "generate: the caches already hold ", offset_,
               " tokens, the prompt has ", result_.stats.prompt_tokens, " (at least one prompt token must be prefilled)");
  result_.stats.cached_tokens = offset_;
  t0_ = Clock::now();
  started_ = true;
}

void Sequence::prefill_chunk(models::Model& model) {
  if (!started_) check_prompt(model);
  const int64_t n = static_cast<int64_t>(prompt_.size());
  int64_t len = std::min(opts_.prefill_step_size, n - offset_);
  if (on_snapshot_ && snapshot_every_ > 0) len = std::min(len, snapshot_every_ - offset_ % snapshot_every_);
  at::Tensor ids = at::tensor(std::vector<int64_t>(prompt_.begin() + offset_, prompt_.begin() + offset_ + len),
                              at::TensorOptions().dtype(at::kLong))
                       .view({1, len})
                       .to(model.placement().device);
  at::Tensor logits;
  {
    nn::ActiveAdapters scope(adapters_);
    logits = model.forward(ids, offset_, &caches_, /*logits_to_keep=*/offset_ + len == n ? 1 : 0);
  }
  offset_ += len;
  if (on_snapshot_ && (offset_ == n || (snapshot_every_ > 0 && offset_ % snapshot_every_ == 0))) {
    cache::Caches copy;
    for (const auto& c : caches_) copy.push_back(c ? c->clone() : nullptr);
    on_snapshot_(offset_, std::move(copy));
  }
  if (offset_ < n) return;
  GenerationStats& st = result_.stats;
  const int64_t prefilled = n - st.cached_tokens;
  if (!forks_.empty()) release_forks(model, logits[0][-1]);  // before this sequence samples or feeds anything
  if (opts_.max_tokens <= 0) {
    compat::synchronize(model.placement().device);
    st.ttft_s = seconds(t0_, Clock::now());
    st.prompt_tps = prefilled / std::max(st.ttft_s, 1e-9);
    done_ = true;
    return;
  }
  sample_and_emit(logits[0][-1]);
  t1_ = Clock::now();
  st.ttft_s = seconds(t0_, t1_);
  st.prompt_tps = prefilled / std::max(st.ttft_s, 1e-9);
  t_last_ = t1_;
}

void Sequence::sample_and_emit(const at::Tensor& last_logits) {
  int64_t next = -1;
  at::Tensor logprobs;
  try {
    at::Tensor processed = sampler_.process(last_logits, tokens_);
    if (opts_.logprobs) logprobs = at::log_softmax(processed, -1);
    next = sampler_.sample_processed(processed);
  } catch (const std::exception& e) {
    // This request's own processors (e.g. its grammar) failed: it alone ends, with the reason.
    error_ = e.what();
    pending_ = -1;
    done_ = true;
    return;
  }
  emit(next, logprobs);
}

void Sequence::emit(int64_t next, const at::Tensor& logprobs) {
  pending_ = -1;
  if (std::find(opts_.eos_ids.begin(), opts_.eos_ids.end(), next) != opts_.eos_ids.end()) {
    result_.stats.stopped_by_eos = true;
    done_ = true;
    return;
  }
  result_.tokens.push_back(next);
  tokens_.push_back(next);
  t_last_ = Clock::now();
  if ((on_step_ && !on_step_(next, logprobs)) || static_cast<int64_t>(result_.tokens.size()) >= opts_.max_tokens) {
    done_ = true;
    return;
  }
  pending_ = next;
}

void Sequence::on_snapshot(int64_t every, SnapshotFn fn) {
  snapshot_every_ = every;
  on_snapshot_ = std::move(fn);
}

void Sequence::finish_stats(const models::Model& model) {
  GenerationStats& st = result_.stats;
  st.generation_tokens = static_cast<int64_t>(result_.tokens.size());
  const double gen_s = seconds(t1_, t_last_);  // like mlx-lm: speed over the tokens after the first
  st.generation_tps = st.generation_tokens > 1 ? (st.generation_tokens - 1) / std::max(gen_s, 1e-9) : 0.0;
  st.peak_memory_bytes = compat::peak_memory_bytes(model.placement().device);
}

void step(models::Model& model, const std::vector<Sequence*>& seqs, int64_t prefill_budget, DecodeSlots* slots) {
  c10::NoGradGuard no_grad;
  // Prompt chunks first, in order, within the budget (at least one chunk).
  int64_t spent = 0;
  for (Sequence* s : seqs) {
    while (s->prefilling() && (spent == 0 || spent + s->opts_.prefill_step_size <= prefill_budget)) {
      const int64_t before = s->offset_;
      s->prefill_chunk(model);
      spent += s->offset_ - before;
      if (s->done()) s->finish_stats(model);
    }
  }
  // One token for every decoding sequence (including one whose prefill just ended).
  std::vector<Sequence*> dec;
  for (Sequence* s : seqs)
    if (!s->done() && !s->prefilling() && s->pending_ >= 0) dec.push_back(s);
  if (dec.empty()) return;
  {
    // Slotted rows decode together in place (decode_slots.h); the others take the ragged path.
    std::vector<Sequence*> slotted, ragged;
    for (Sequence* s : dec) {
      if (s->slots_ && s->slots_ != slots) s->slots_->release(*s, /*read_back=*/true);  // another pool's
      if (slots && !s->slots_ && slots->fits(*s)) slots->admit(*s);
      (s->slots_ ? slotted : ragged).push_back(s);
    }
    if (slots) slots->decode(slotted);
    dec.swap(ragged);
    if (dec.empty()) return;
  }
  const at::Device device = model.placement().device;
  auto feed = [&](const std::vector<Sequence*>& rows) {
    const int64_t B = static_cast<int64_t>(rows.size());
    std::vector<int64_t> ids;
    models::Positions pos;
    std::vector<cache::Caches*> caches;
    std::vector<std::vector<std::string>> adapters;
    for (Sequence* s : rows) {
      ids.push_back(s->pending_);
      pos.offsets.push_back(s->offset_);
      caches.push_back(&s->caches_);
      adapters.push_back(s->adapters_);
    }
    at::Tensor x = at::tensor(ids, at::TensorOptions().dtype(at::kLong)).view({B, 1}).to(device);
    at::Tensor logits;
    if (B == 1) {
      nn::ActiveAdapters scope(rows[0]->adapters_);
      logits = model.forward(x, pos, &rows[0]->caches_);
    } else {
      cache::Caches view = cache::rows_view(caches);
      nn::RowAdapters scope(std::move(adapters));
      logits = model.forward(x, pos, &view);
    }
    for (int64_t b = 0; b < B; ++b) {
      Sequence* s = rows[b];
      s->offset_ += 1;
      s->sample_and_emit(logits[b][-1]);
      if (s->done()) s->finish_stats(model);
    }
  };
  if (model.ragged_batches()) {
    feed(dec);
  } else {
    for (Sequence* s : dec) feed({s});
  }
}

}  // namespace hearth::generate
