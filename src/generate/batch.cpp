// Sequence and step(): generate()'s prefill/sample/decode loop cut into scheduler iterations so
// that several sequences prefill and decode together. Not the server's scheduling policy
// (engine_loop.cpp).
#include "generate/batch.h"

#include <c10/core/GradMode.h>

#include <algorithm>
#include <limits>
#include <optional>

#include "core/error.h"
#include "core/torch_compat.h"
#include "generate/decode_slots.h"
#include "generate/static_decode_util.h"
#include "generate/step_trace.h"
#include "nn/linear.h"

namespace hearth::generate {

namespace {
using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// A planned prompt chunk: the sequence, how many of its next prompt tokens, and `room`: how many
// positions a padded forward may write into its caches (see pad_room); 0 while only planned.
struct Chunk {
  Sequence* seq;
  int64_t len;
  int64_t room = 0;
};

// Positions a padded forward may append to `caches` without any KVCache's buffer growing past what
// the sequence's own `end` tokens (prompt + max_tokens: what it reaches alone, what the server's
// memory budget charges it, Engine::state_bytes) rounded up to the growth step would make it, or
// past its present capacity when that is larger. The trim after a padded forward gives no buffer
// back, so padding past this would hold memory nobody was charged for.
int64_t pad_room(const cache::Caches& caches, int64_t end) {
  int64_t room = std::numeric_limits<int64_t>::max();
  for (const auto& c : caches)
    if (const auto* kv = dynamic_cast<const cache::KVCache*>(c.get())) {
      const int64_t most = std::max(kv->capacity(), (end + kv->step() - 1) / kv->step() * kv->step());
      room = std::min(room, most - kv->offset());
    }
  return room;
}

// Whether every layer cache is a plain KVCache, whose trim is exact (a padded prefill trims its
// padding back; a sliding window or a recurrent state could not).
bool trims_exactly(const cache::Caches& caches) {
  return std::all_of(caches.begin(), caches.end(),
                     [](const auto& c) { return !c || dynamic_cast<const cache::KVCache*>(c.get()); });
}

// Whether step() prefills several sequences in one forward: only for a model that takes ragged
// batches; by default on a GPU and not on the CPU, HEARTH_BATCH_PREFILL=1 / =0 forces it on / off.
// On an H200 (1B shape, 32 streaming clients) one padded forward per round raised the aggregate
// from 5,996 to 6,846 tok/s and cut TTFT p50 621 -> 540 ms; on the CPU, compute-bound, one padded
// forward costs what the separate ones do and holds every first token until it ends, while one
// forward per sequence streams each first token as soon as its own forward ends (docs/benchmarks.md).
bool batch_prefill(const models::Model& model) {
  if (!model.ragged_batches()) return false;
  if (env_equals("HEARTH_BATCH_PREFILL", "1")) return true;
  if (env_equals("HEARTH_BATCH_PREFILL", "0")) return false;
  return model.placement().device.is_cuda();
}

// The forwards of one round: `padded` rows together whatever their lengths (but a row padded to
// the group's longest chunk T only when T fits its room), `same` rows only with rows of the same
// length; longest first, each row into the first group it fits, a group full when its rows ×
// longest chunk would pass max(cap, longest chunk) token positions.
std::vector<std::vector<Chunk>> forward_groups(std::vector<Chunk> padded, std::vector<Chunk> same, int64_t cap) {
  std::vector<std::vector<Chunk>> groups;
  auto pack = [&](std::vector<Chunk>& chunks, bool pad) {
    std::stable_sort(chunks.begin(), chunks.end(), [](const Chunk& a, const Chunk& b) { return a.len > b.len; });
    const size_t first = groups.size();
    for (const Chunk& c : chunks) {
      auto fits = [&](const std::vector<Chunk>& g) {
        const int64_t T = g.front().len;
        return (c.len == T || (pad && T <= c.room)) && static_cast<int64_t>(g.size() + 1) * T <= std::max(cap, T);
      };
      auto g = std::find_if(groups.begin() + static_cast<std::ptrdiff_t>(first), groups.end(), fits);
      if (g != groups.end()) g->push_back(c);
      else groups.push_back({c});
    }
  };
  pack(padded, true);
  pack(same, false);
  return groups;
}

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

bool Sequence::end_if_cancelled(const models::Model& model) {
  if (done_) return true;
  if (!opts_.cancelled || !opts_.cancelled()) return false;
  done_ = true;
  pending_ = -1;  // a token emitted but not fed back stays out of the caches, as when on_step stops it
  result_.stats.cancelled = true;
  if (parent_) {
    std::erase(parent_->forks_, this);
    parent_ = nullptr;
  }
  if (!forks_.empty()) {
    // Its children wait for this prefill: the first carries it on from here, the others wait for it.
    Sequence* heir = forks_.front();
    heir->parent_ = nullptr;
    heir->forks_.assign(forks_.begin() + 1, forks_.end());
    for (Sequence* c : heir->forks_) c->parent_ = heir;
    forks_.clear();
    if (started_) {
      heir->caches_ = std::move(caches_);
      caches_.clear();
      heir->offset_ = offset_;
      heir->started_ = true;
      heir->t0_ = t0_;
      heir->result_.stats.cached_tokens = result_.stats.cached_tokens;
    }
  }
  finish_stats(model);
  return true;
}

int64_t Sequence::chunk_at(int64_t at) const {
  int64_t len = std::min(opts_.prefill_step_size, static_cast<int64_t>(prompt_.size()) - at);
  if (on_snapshot_ && snapshot_every_ > 0) len = std::min(len, snapshot_every_ - at % snapshot_every_);
  return len;
}

void Sequence::prefill_alone(models::Model& model, int64_t len) {
  const Clock::time_point t0 = Clock::now();
  const int64_t n = static_cast<int64_t>(prompt_.size());
  at::Tensor ids = at::tensor(std::vector<int64_t>(prompt_.begin() + offset_, prompt_.begin() + offset_ + len),
                              at::TensorOptions().dtype(at::kLong))
                       .view({1, len})
                       .to(model.placement().device);
  const bool last = offset_ + len == n;
  at::Tensor logits;
  {
    nn::ActiveAdapters scope(adapters_);
    logits = model.forward(ids, offset_, &caches_, /*logits_to_keep=*/1);
  }
  const Clock::time_point t1 = Clock::now();
  const at::Tensor row = last ? logits[0][-1] : at::Tensor();
  // its sampling waits for the forward (the finiteness read too: one flag, no extra wait)
  end_chunk(model, len, row, -1, !last || at::isfinite(row).all().item<bool>());
  StepTrace::prefill_forward(1, seconds(t0, t1), 0, seconds(t1, Clock::now()));
}

void Sequence::end_chunk(models::Model& model, int64_t len, const at::Tensor& last_logits, int64_t greedy,
                         bool finite) {
  const int64_t n = static_cast<int64_t>(prompt_.size());
  offset_ += len;
  ++result_.stats.prefill_chunks;
  if (on_snapshot_ && (offset_ == n || (snapshot_every_ > 0 && offset_ % snapshot_every_ == 0))) {
    cache::Caches copy;
    for (const auto& c : caches_) copy.push_back(c ? c->clone() : nullptr);
    on_snapshot_(offset_, std::move(copy));
  }
  if (offset_ < n) return;
  if (!finite) {  // broken weights (or an overflow): no token can be drawn from NaN/Inf logits
    error_ = "the model's logits for the prompt are not finite (NaN or Inf): check the model's weights";
    for (Sequence* c : forks_) {
      c->parent_ = nullptr;
      c->done_ = true;
      c->error_ = error_;
    }
    forks_.clear();
    pending_ = -1;
    done_ = true;
    return;
  }
  GenerationStats& st = result_.stats;
  const int64_t prefilled = n - st.cached_tokens;
  if (!forks_.empty()) release_forks(model, last_logits);  // before this sequence samples or feeds anything
  if (opts_.max_tokens <= 0) {
    compat::synchronize(model.placement().device);
    st.ttft_s = seconds(t0_, Clock::now());
    st.prompt_tps = prefilled / std::max(st.ttft_s, 1e-9);
    done_ = true;
    return;
  }
  if (greedy >= 0) emit(greedy, nullptr);
  else sample_and_emit(last_logits);
  t1_ = Clock::now();
  st.ttft_s = seconds(t0_, t1_);
  st.prompt_tps = prefilled / std::max(st.ttft_s, 1e-9);
  t_last_ = t1_;
}

void Sequence::prefill_together(models::Model& model, const std::vector<Sequence*>& rows,
                                const std::vector<int64_t>& lens, DecodeSlots* slots) {
  // Row b's lens[b] tokens, right-padded to T with token 0. Causal attention keeps the padding out
  // of every real token's output; its keys/values, appended to the row's caches by the forward, are
  // trimmed right after (step() pads only rows whose caches trim exactly) — or, for rows in decode
  // slots, left past the row's prompt, hidden by the decode step's masks until overwritten.
  const Clock::time_point t0 = Clock::now();
  const int64_t B = static_cast<int64_t>(rows.size()), T = *std::max_element(lens.begin(), lens.end());
  std::vector<int64_t> ids(static_cast<size_t>(B * T), 0);
  models::Positions pos;
  std::vector<cache::Caches*> caches;
  std::vector<std::vector<std::string>> adapters;
  for (int64_t b = 0; b < B; ++b) {
    const Sequence* s = rows[b];
    std::copy_n(s->prompt_.begin() + s->offset_, lens[b], ids.begin() + b * T);
    pos.offsets.push_back(s->offset_);
    caches.push_back(&rows[b]->caches_);
    adapters.push_back(s->adapters_);
  }
  const at::Device device = model.placement().device;
  at::Tensor x = ids_to(ids, device).view({B, T});
  at::Tensor hidden;  // [B, T, C]
  {
    cache::Caches view = slots ? slots->prefill_view(rows) : cache::rows_view(caches);
    nn::RowAdapters scope(adapters);
    hidden = model.forward_layers(model.embed(x), 0, model.num_layers(), pos, &view).hidden;
  }
  const Clock::time_point t1 = Clock::now();
  for (int64_t b = 0; b < B && !slots; ++b)
    HEARTH_CHECK(T == lens[b] || cache::trim_all(rows[b]->caches_, T - lens[b]),
                 "generate: a padded prefill could not trim its padding from a cache");
  // Logits only where a prompt completes, at its last real token.
  std::vector<int64_t> last_rows, last_positions;
  std::vector<std::vector<std::string>> last_adapters;
  for (int64_t b = 0; b < B; ++b)
    if (rows[b]->offset_ + lens[b] == static_cast<int64_t>(rows[b]->prompt_.size())) {
      last_rows.push_back(b);
      last_positions.push_back(b * T + lens[b] - 1);
      last_adapters.push_back(rows[b]->adapters_);
    }
  at::Tensor logits;  // [E, 1, V], E = last_rows.size()
  if (!last_rows.empty()) {
    at::Tensor where = ids_to(last_positions, device);
    at::Tensor last = hidden.reshape({B * T, hidden.size(2)}).index_select(0, where).unsqueeze(1);  // [E, 1, C]
    nn::RowAdapters scope(std::move(last_adapters));
    logits = model.head(last);
  }
  // Plain-greedy rows take their first token from one argmax over every completing row and one
  // copy to the host, not an argmax and a host sync each (the same ids: each row reduces alone).
  at::Tensor greedy;  // [E] int64 on the host
  // Which completing rows have finite logits: reduced on the device before the greedy read and
  // copied after it (one small copy, no extra wait).
  at::Tensor finite = logits.defined() ? at::isfinite(logits).flatten(1).all(1) : at::Tensor();
  for (int64_t b : last_rows)
    if (plain_greedy(rows[b]->opts_) && rows[b]->forks_.empty()) {
      greedy = logits.select(1, 0).to(at::kFloat).argmax(-1).to(at::kCPU);
      break;
    }
  if (finite.defined()) finite = finite.to(at::kCPU);
  const Clock::time_point t2 = Clock::now();  // the first tokens on the host (greedy rows), or queued
  size_t e = 0;
  for (int64_t b = 0; b < B; ++b) {
    const bool completes = e < last_rows.size() && last_rows[e] == b;
    const int64_t i = static_cast<int64_t>(e);
    const int64_t id = completes && greedy.defined() && plain_greedy(rows[b]->opts_) && rows[b]->forks_.empty()
                           ? greedy.data_ptr<int64_t>()[i]
                           : -1;
    const bool ok = !completes || finite.data_ptr<bool>()[i];
    rows[b]->end_chunk(model, lens[b], completes ? logits[static_cast<int64_t>(e++)][0] : at::Tensor(), id, ok);
    if (rows[b]->done()) rows[b]->finish_stats(model);
  }
  StepTrace::prefill_forward(B, seconds(t0, t1), seconds(t1, t2), seconds(t2, Clock::now()));
}

bool Sequence::sample(const at::Tensor& last_logits, int64_t* next, at::Tensor* logprobs) {
  try {
    at::Tensor processed = sampler_.process(last_logits, tokens_);
    if (opts_.logprobs) *logprobs = at::log_softmax(processed, -1);
    *next = sampler_.sample_processed(processed);
    return true;
  } catch (const std::exception& e) {
    // This request's own processors (e.g. its grammar) failed: it alone ends, with the reason.
    error_ = e.what();
    pending_ = -1;
    done_ = true;
    return false;
  }
}

void Sequence::sample_and_emit(const at::Tensor& last_logits) {
  int64_t next = -1;
  at::Tensor logprobs;
  if (sample(last_logits, &next, &logprobs)) emit_together({{this, next, logprobs}});
}

void Sequence::emit_together(const std::vector<Drawn>& drawn, const at::Tensor& stacked) {
  std::vector<at::Tensor> rows;
  std::vector<int64_t> tokens, top;
  for (const Drawn& d : drawn)
    if (d.logprobs.defined()) {
      rows.push_back(d.logprobs);
      tokens.push_back(d.token);
      top.push_back(d.seq->opts_.top_logprobs);
    }
  std::vector<StepLogprobs> read;
  if (!rows.empty()) {
    HEARTH_CHECK(!stacked.defined() || stacked.size(0) == static_cast<int64_t>(rows.size()),
                 "generate: ", stacked.size(0), " stacked logprob rows for ", rows.size(), " rows that ask for them");
    read = read_logprobs(stacked.defined() ? stacked : at::stack(rows), tokens, top);
  }
  size_t i = 0;
  for (const Drawn& d : drawn) {
    if (!d.logprobs.defined()) {
      d.seq->emit(d.token, nullptr);
      continue;
    }
    read[i].all = d.logprobs;
    d.seq->emit(d.token, &read[i++]);
  }
}

void Sequence::emit(int64_t next, const StepLogprobs* logprobs) {
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

std::vector<StepLogprobs> read_logprobs(const at::Tensor& logprobs, const std::vector<int64_t>& tokens,
                                        const std::vector<int64_t>& top) {
  HEARTH_CHECK(logprobs.dim() == 2 && logprobs.size(0) == static_cast<int64_t>(tokens.size()) &&
                   tokens.size() == top.size(),
               "read_logprobs: needs logprobs [R, V] and R tokens and R top counts, got ", logprobs.sizes(), ", ",
               tokens.size(), " and ", top.size());
  const int64_t R = logprobs.size(0), V = logprobs.size(1);
  std::vector<StepLogprobs> out(static_cast<size_t>(R));
  if (R == 0) return out;
  const at::Tensor lp = logprobs.to(at::kFloat).contiguous();
  const auto longs = at::TensorOptions().dtype(at::kLong);
  const at::Tensor ids = ids_to(tokens, lp.device()).view({R, 1});
  std::vector<at::Tensor> parts{lp.gather(1, ids).view({R}).to(at::kDouble)};
  // The rows that list alternatives, and the most any of them lists.
  std::vector<int64_t> top_rows, k(static_cast<size_t>(R), 0);
  int64_t K = 0;
  for (int64_t r = 0; r < R; ++r) {
    k[r] = std::clamp<int64_t>(top[r], 0, V);
    if (k[r] > 0) top_rows.push_back(r);
    K = std::max(K, k[r]);
  }
  const int64_t T = static_cast<int64_t>(top_rows.size());
  if (K > 0) {
    const at::Tensor sub =
        T == R ? lp : lp.index_select(0, ids_to(top_rows, lp.device()));  // [T, V]
    // One distinct int64 key per entry: the float's bits as an ordered signed integer (a negative
    // float's magnitude bits flipped; any NaN the largest, as at::topk ranks it) above the
    // complement of the id, so the top K are the K largest values, ties to the smaller id, and a
    // row's first k of them are its top k whatever K is.
    const at::Tensor bits = sub.view(at::kInt).to(at::kLong);
    at::Tensor order = at::where(bits < 0, bits.bitwise_xor(0x7FFFFFFF), bits);
    order = order.masked_fill(at::isnan(sub), std::numeric_limits<int32_t>::max());
    const at::Tensor low = at::arange(V, longs.device(lp.device())).neg().add(int64_t{0xFFFFFFFF});
    const at::Tensor key = order.mul(int64_t{1} << 32).add(low);
    const at::Tensor best = std::get<1>(at::topk(key, K, -1, /*largest=*/true, /*sorted=*/true));  // [T, K]
    parts.push_back(sub.gather(1, best).to(at::kDouble).flatten());
    parts.push_back(best.to(at::kDouble).flatten());  // ids < 2^53: exact in a double
  }
  // The one read: every chosen value, then the rows' top values, then their top ids.
  const at::Tensor host = at::cat(parts).to(at::kCPU);
  StepTrace::logprob_read();
  const double* h = host.data_ptr<double>();
  for (int64_t r = 0; r < R; ++r) out[r].logprob = static_cast<float>(h[r]);
  for (int64_t t = 0; t < T; ++t) {
    StepLogprobs& o = out[top_rows[t]];
    const int64_t n = k[top_rows[t]];
    const double* vals = h + R + t * K;
    const double* idx = h + R + T * K + t * K;
    for (int64_t j = 0; j < n; ++j) {
      o.top_ids.push_back(static_cast<int64_t>(idx[j]));
      o.top_values.push_back(static_cast<float>(vals[j]));
    }
  }
  return out;
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
  int64_t decoding = 0;  // rows that decode this step, for StepTrace (counted when step() returns)
  struct EndStep {
    const int64_t& rows;
    ~EndStep() { StepTrace::end_step(rows); }
  } const end_step{decoding};
  for (Sequence* s : seqs) s->end_if_cancelled(model);  // a request whose client left ends here
  // Prompt chunks first: planned in order within the budget (at least one chunk), run in rounds.
  std::vector<std::vector<Chunk>> rounds;  // round k: the k-th planned chunk of each sequence
  const bool together = batch_prefill(model);
  int64_t spent = 0;
  for (Sequence* s : seqs) {
    if (!s->prefilling()) continue;
    if (spent > 0 && spent >= prefill_budget) break;  // nothing more fits
    if (!s->started_) s->check_prompt(model);
    const int64_t n = static_cast<int64_t>(s->prompt_.size());
    int64_t at = s->offset_;
    for (int64_t k = 0; at < n; ++k) {
      const int64_t len = s->chunk_at(at);
      if (spent > 0 && spent + len > prefill_budget) break;
      if (static_cast<int64_t>(rounds.size()) <= k) rounds.emplace_back();
      rounds[k].push_back({s, len});
      spent += len;
      at += len;
    }
    // A prompt that ends in this step may prefill straight into a decode slot: it decodes in this
    // step's decode, so no decode step sees its slot half filled (DecodeSlots::fits_prefill).
    if (at == n && together && slots && slots->fits_prefill(*s)) slots->admit(*s);
  }
  std::optional<StepTrace::Scope> prefill_time;
  if (!rounds.empty()) prefill_time.emplace(StepTrace::kPrefill);
  for (const auto& round : rounds) {
    // Rows whose caches trim exactly may be padded; the others share a forward only at equal lengths;
    // rows in decode slots go together, padded up to their slot's capacity.
    std::vector<Chunk> padded, same, slotted;
    for (const Chunk& c : round) {
      Sequence* s = c.seq;
      if (s->end_if_cancelled(model)) continue;  // done, or cancelled since its last chunk
      if (s->slots_) {
        slotted.push_back({s, c.len, s->slots_->capacity() - s->offset_});
        continue;
      }
      if (!together) {
        s->prefill_alone(model, c.len);
        if (s->done()) s->finish_stats(model);
        continue;
      }
      if (!trims_exactly(s->caches_)) {
        same.push_back(c);
        continue;
      }
      const int64_t end = static_cast<int64_t>(s->prompt_.size()) + std::max<int64_t>(s->opts_.max_tokens, 0);
      padded.push_back({s, c.len, pad_room(s->caches_, end)});
    }
    auto run = [&](const std::vector<Chunk>& group, DecodeSlots* in_slots) {
      if (group.size() == 1 && !in_slots) {
        group[0].seq->prefill_alone(model, group[0].len);
        if (group[0].seq->done()) group[0].seq->finish_stats(model);
        return;
      }
      std::vector<Sequence*> rows;
      std::vector<int64_t> lens;
      for (const Chunk& c : group) {
        rows.push_back(c.seq);
        lens.push_back(c.len);
      }
      Sequence::prefill_together(model, rows, lens, in_slots);
    };
    for (const std::vector<Chunk>& group : forward_groups(padded, same, prefill_budget)) run(group, nullptr);
    for (const std::vector<Chunk>& group : forward_groups(slotted, {}, prefill_budget)) run(group, slots);
  }
  prefill_time.reset();
  // A slotted sequence that ended (its first token an EOS or its last, or cancelled) frees its slot.
  for (Sequence* s : seqs)
    if (s->done() && s->slots_) s->slots_->release(*s, /*read_back=*/s->opts_.keep_caches);
  // One token for every decoding sequence (including one whose prefill just ended).
  std::vector<Sequence*> dec;
  for (Sequence* s : seqs)
    if (!s->done() && !s->prefilling() && s->pending_ >= 0) dec.push_back(s);
  decoding = static_cast<int64_t>(dec.size());
  if (dec.empty()) return;
  {
    // Slotted rows decode together in place (decode_slots.h); the others take the ragged path.
    std::vector<Sequence*> slotted, ragged;
    std::optional<StepTrace::Scope> admit_time(StepTrace::kAdmit);
    for (Sequence* s : dec) {
      if (s->slots_ && s->slots_ != slots) s->slots_->release(*s, /*read_back=*/true);  // another pool's
      if (slots && !s->slots_ && slots->fits(*s)) slots->admit(*s);
      (s->slots_ ? slotted : ragged).push_back(s);
    }
    admit_time.reset();
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
    // Every row's token first, then their logprobs read to the host together and the tokens
    // emitted in row order (one read for the step, not one per row).
    std::vector<Sequence::Drawn> drawn;
    for (int64_t b = 0; b < B; ++b) {
      Sequence* s = rows[b];
      s->offset_ += 1;
      int64_t next = -1;
      at::Tensor lp;
      if (s->sample(logits[b][-1], &next, &lp)) drawn.push_back({s, next, lp});
    }
    Sequence::emit_together(drawn);
    for (Sequence* s : rows)
      if (s->done()) s->finish_stats(model);
  };
  StepTrace::Scope ragged_time(StepTrace::kRagged);
  if (model.ragged_batches()) {
    feed(dec);
  } else {
    for (Sequence* s : dec) feed({s});
  }
}

}  // namespace hearth::generate
