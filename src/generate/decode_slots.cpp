// DecodeSlots: the slot pool of decode_slots.h — admission into slots, the bucketed static step
// (recorded once per bucket), sampling of the slotted rows, and reading slots back into growing
// caches. Not the ragged path or prefill (batch.cpp).
#include "generate/decode_slots.h"

#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <typeinfo>

#include "core/error.h"
#include "core/torch_compat.h"
#include "generate/batch.h"
#include "generate/sampler.h"
#include "generate/slot_rows_cache.h"
#include "generate/static_decode_util.h"
#include "generate/step_trace.h"
#include "nn/linear.h"

namespace hearth::generate {

namespace {
// The smallest entry of `ladder` (ascending) that is >= need; the last one when none is.
int64_t pick_bucket(const std::vector<int64_t>& ladder, int64_t need) {
  for (int64_t v : ladder)
    if (v >= need) return v;
  return ladder.back();
}
}  // namespace

std::vector<int64_t> DecodeSlots::batch_buckets(int64_t slots) {
  std::vector<int64_t> out;
  for (int64_t b = 1; b < slots; b *= 2) out.push_back(b);
  out.push_back(slots);
  return out;
}

std::vector<int64_t> DecodeSlots::length_buckets(int64_t capacity) {
  std::vector<int64_t> out;
  for (int64_t l = 128; l < capacity; l *= 2) out.push_back(l);
  out.push_back(capacity);
  return out;
}

std::pair<int64_t, int64_t> DecodeSlots::bucket_for(int64_t slots, int64_t capacity, int64_t top_slot, int64_t longest) {
  return {pick_bucket(batch_buckets(slots), top_slot + 1), pick_bucket(length_buckets(capacity), longest + 1)};
}

std::vector<std::pair<int64_t, int64_t>> DecodeSlots::all_buckets(int64_t slots, int64_t capacity) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t b : batch_buckets(slots))
    for (int64_t l : length_buckets(capacity)) out.emplace_back(b, l);
  return out;
}

DecodeSlots::DecodeSlots(models::Model& model, int64_t slots, int64_t capacity)
    : model_(model), slots_(slots), capacity_(capacity), device_(model.placement().device) {}

struct DecodeSlots::LayerProto {
  Kind kind = Kind::kShared;
  at::Tensor a, b;  // one row: keys, values [1, Hkv, *, D] (kKV, kWindow); conv, state (kRecurrent)
  int64_t window = 0;  // kWindow: the RotatingKVCache's window
};

std::vector<DecodeSlots::LayerProto> DecodeSlots::probe(models::Model& model, at::Tensor* logits, std::string* why) {
  auto unusable = [&](std::string reason) {
    if (why) *why = std::move(reason);
    return std::vector<LayerProto>{};
  };
  c10::NoGradGuard no_grad;
  cache::Caches grown = model.make_cache();
  std::vector<LayerProto> out(grown.size());
  bool windows = false;
  for (size_t i = 0; i < grown.size(); ++i) {
    const cache::LayerCache* c = grown[i].get();
    if (!c) continue;  // a layer without state of its own (Gemma 4's KV sharers)
    if (typeid(*c) == typeid(cache::KVCache)) out[i].kind = Kind::kKV;
    else if (typeid(*c) == typeid(cache::RecurrentCache)) out[i].kind = Kind::kRecurrent;
    else if (typeid(*c) == typeid(cache::RotatingKVCache)) out[i].kind = Kind::kWindow;
    else
      return unusable(cat("layer ", i, "'s cache is ", c->kind(),
                          " (slots hold KV caches, sliding-window KV caches and recurrent states)"));
    if (out[i].kind == Kind::kWindow) {
      out[i].window = static_cast<const cache::RotatingKVCache&>(*c).window();
      windows = true;
    }
  }
  const at::Device device = model.placement().device;
  const auto lopt = at::TensorOptions().dtype(at::kLong).device(device);
  *logits = model.forward(at::zeros({1, 1}, lopt), 0, &grown);  // shapes and dtypes of every layer
  for (size_t i = 0; i < grown.size(); ++i) {
    if (out[i].kind == Kind::kKV) {
      const auto& kv = static_cast<const cache::KVCache&>(*grown[i]);
      out[i].a = kv.keys_buffer();
      out[i].b = kv.values_buffer();
    } else if (out[i].kind == Kind::kRecurrent) {
      const auto& rc = static_cast<const cache::RecurrentCache&>(*grown[i]);
      out[i].a = rc.conv_state();
      out[i].b = rc.recurrent_state();
    }
  }
  if (windows) {
    // A sliding-window cache does not expose its buffers: one static step from the probe's caches
    // (the single-sequence runner's conversion, graph_decode.cpp) makes full-capacity static ones,
    // whose buffers give the shapes; it also proves the family's static path.
    try {
      auto st = std::make_shared<cache::StaticState>();
      st->capacity = 2;
      st->host_offset = 1;
      st->positions = at::full({1}, 1, lopt);
      cache::Caches stat;
      for (size_t i = 0; i < grown.size(); ++i) {
        const cache::LayerCache* c = grown[i].get();
        switch (out[i].kind) {
          case Kind::kShared: stat.push_back(nullptr); break;
          case Kind::kKV:
            stat.push_back(std::make_unique<cache::StaticKVCache>(st, static_cast<const cache::KVCache&>(*c)));
            break;
          case Kind::kWindow:
            stat.push_back(std::make_unique<cache::StaticKVCache>(st, static_cast<const cache::RotatingKVCache&>(*c)));
            break;
          case Kind::kRecurrent:
            stat.push_back(
                std::make_unique<cache::StaticRecurrentCache>(st, static_cast<const cache::RecurrentCache&>(*c)));
            break;
        }
      }
      model.forward(at::zeros({1, 1}, lopt), 1, &stat);
      if (!st->family_ran_static) return unusable(model.model_type() + " has no static decode step");
      for (size_t i = 0; i < grown.size(); ++i)
        if (out[i].kind == Kind::kWindow) {
          const auto& sc = static_cast<const cache::StaticKVCache&>(*stat[i]);
          out[i].a = sc.keys();
          out[i].b = sc.values();
        }
    } catch (const std::exception& e) {
      return unusable(model.model_type() + "'s static decode step failed: " + e.what());
    }
  }
  return out;
}

DecodeSlots::SlotBytes DecodeSlots::slot_bytes(models::Model& model) {
  at::Tensor logits;
  SlotBytes out;
  for (const LayerProto& l : probe(model, &logits, nullptr)) {
    if (l.kind == Kind::kKV || l.kind == Kind::kWindow)
      out.per_token += l.a.size(1) * l.a.size(3) * l.a.element_size() + l.b.size(1) * l.b.size(3) * l.b.element_size();
    else if (l.kind == Kind::kRecurrent)
      out.fixed += l.a.nbytes() / l.a.size(0) + l.b.nbytes() / l.b.size(0);
  }
  return out;
}

std::unique_ptr<DecodeSlots> DecodeSlots::create(models::Model& model, int64_t slots, int64_t capacity, std::string* why) {
  HEARTH_CHECK(slots >= 1 && capacity >= 2, "decode slots: need at least one slot of two tokens, got ", slots,
               " slots of ", capacity);
  auto unusable = [&](std::string reason) -> std::unique_ptr<DecodeSlots> {
    if (why) *why = std::move(reason);
    return nullptr;
  };
  c10::NoGradGuard no_grad;
  at::Tensor probe_logits;
  std::string reason;
  const std::vector<LayerProto> layers = probe(model, &probe_logits, &reason);
  if (layers.empty()) return unusable(reason);
  const at::Device device = model.placement().device;
  const auto lopt = at::TensorOptions().dtype(at::kLong).device(device);
  std::unique_ptr<DecodeSlots> p(new DecodeSlots(model, slots, capacity));
  p->capture_ = !env_equals("HEARTH_CUDA_GRAPHS", "0") && !env_equals("HEARTH_CUDA_GRAPHS", "nocapture");
  p->positions_ = at::zeros({slots}, lopt);
  p->ids_ = at::zeros({slots, 1}, lopt);
  p->logits_ = at::zeros({slots, probe_logits.size(-1)}, probe_logits.options().dtype(at::kFloat));
  p->next_ = at::zeros({slots}, lopt);
  p->occupant_.assign(static_cast<size_t>(slots), nullptr);
  p->kept_.resize(static_cast<size_t>(slots));
  p->full_state_ = std::make_shared<cache::StaticState>();
  p->full_state_->positions = p->positions_;
  p->full_state_->capacity = capacity;
  p->prefill_in_slots_ = env_switch_on("HEARTH_SLOT_PREFILL") && !layers.empty() &&
                         std::all_of(layers.begin(), layers.end(), [](const LayerProto& l) { return l.kind == Kind::kKV; });
  for (const LayerProto& l : layers) {
    p->kinds_.push_back(l.kind);
    p->windows_.push_back(l.window);
    if (l.kind == Kind::kShared) {
      p->full_.push_back(nullptr);
      p->buffers_.emplace_back();
    } else if (l.kind == Kind::kRecurrent) {
      const at::Tensor& cs = l.a;
      const at::Tensor& rs = l.b;
      at::Tensor conv = at::zeros({slots, cs.size(1), cs.size(2)}, cs.options());
      at::Tensor rec = at::zeros({slots, rs.size(1), rs.size(2), rs.size(3)}, rs.options());
      p->full_.push_back(std::make_unique<cache::StaticRecurrentCache>(p->full_state_, conv, rec));
      p->buffers_.emplace_back(conv, rec);
      p->nbytes_ += conv.nbytes() + rec.nbytes();
    } else {
      const at::Tensor& k = l.a;
      const at::Tensor& v = l.b;
      at::Tensor keys = at::empty({slots, k.size(1), capacity, k.size(3)}, k.options());  // see ensure_zeroed
      at::Tensor values = at::empty({slots, v.size(1), capacity, v.size(3)}, v.options());
      p->full_.push_back(std::make_unique<cache::StaticKVCache>(p->full_state_, keys, values));
      p->buffers_.emplace_back(keys, values);
      p->nbytes_ += keys.nbytes() + values.nbytes();
    }
  }
  // One eager step over the first bucket (its rows are free: garbage at position 0) proves the
  // family's static path; a family that treats the static caches as ordinary ones, or refuses
  // them, cannot use slots.
  try {
    p->ensure_zeroed(length_buckets(capacity).front());
    Bucket& bk = p->bucket(1, length_buckets(capacity).front());
    p->forward(bk);
    if (!bk.state->family_ran_static) return unusable(model.model_type() + " has no static decode step");
  } catch (const std::exception& e) {
    return unusable(model.model_type() + "'s static decode step failed: " + e.what());
  }
  p->buckets_.clear();
  return p;
}

void DecodeSlots::ensure_zeroed(int64_t tokens) {
  tokens = std::min(tokens, capacity_);
  if (tokens <= zeroed_) return;
  for (size_t i = 0; i < buffers_.size(); ++i)
    if (kinds_[i] == Kind::kKV || kinds_[i] == Kind::kWindow) {
      buffers_[i].first.narrow(2, zeroed_, tokens - zeroed_).zero_();
      buffers_[i].second.narrow(2, zeroed_, tokens - zeroed_).zero_();
    }
  zeroed_ = tokens;
}

DecodeSlots::~DecodeSlots() {
  for (Sequence* s : occupant_) {
    if (!s) continue;
    try {
      release(*s, /*read_back=*/true);
    } catch (const std::exception&) {
      s->slots_ = nullptr;  // its caches are lost; it must not touch this pool again
      s->slot_ = -1;
    }
  }
}

int64_t DecodeSlots::occupied() const {
  return std::count_if(occupant_.begin(), occupant_.end(), [](const Sequence* s) { return s != nullptr; });
}

bool DecodeSlots::fits(const Sequence& s) const {
  if (s.slots_ || s.done_ || s.pending_ < 0 || s.caches_.size() != full_.size()) return false;
  if (std::find(occupant_.begin(), occupant_.end(), nullptr) == occupant_.end()) return false;
  for (size_t i = 0; i < full_.size(); ++i) {
    const cache::LayerCache* c = s.caches_[i].get();
    switch (kinds_[i]) {
      case Kind::kShared:
        if (c) return false;
        break;
      case Kind::kKV:
        if (!c || typeid(*c) != typeid(cache::KVCache) ||
            static_cast<const cache::KVCache&>(*c).keys_buffer().size(0) != 1)
          return false;
        break;
      case Kind::kWindow:
        // One row (write_row checks the shapes), the pool's window (the family masks with it).
        if (!c || typeid(*c) != typeid(cache::RotatingKVCache) ||
            static_cast<const cache::RotatingKVCache&>(*c).window() != windows_[i])
          return false;
        break;
      case Kind::kRecurrent:
        if (!c || typeid(*c) != typeid(cache::RecurrentCache)) return false;
        break;
    }
  }
  // Tokens still to feed: one per token still to generate (the last one is never fed).
  const int64_t remaining = s.opts_.max_tokens - static_cast<int64_t>(s.result_.tokens.size());
  return s.offset_ + remaining <= capacity_;
}

bool DecodeSlots::fits_prefill(const Sequence& s) const {
  if (!prefill_in_slots_ || s.slots_ || s.done_ || !s.prefilling() || s.parent_ || !s.forks_.empty() ||
      s.on_snapshot_ || s.caches_.size() != full_.size() || s.opts_.max_tokens < 1)
    return false;
  if (std::find(occupant_.begin(), occupant_.end(), nullptr) == occupant_.end()) return false;
  for (const auto& c : s.caches_) {
    if (!c || typeid(*c) != typeid(cache::KVCache)) return false;
    const auto& kv = static_cast<const cache::KVCache&>(*c);
    if (kv.offset() > 0 && kv.keys_buffer().size(0) != 1) return false;
  }
  // As fits() once the prompt is in and the first token sampled: the last token is never fed.
  return static_cast<int64_t>(s.prompt_.size()) + s.opts_.max_tokens - 1 <= capacity_;
}

cache::Caches DecodeSlots::prefill_view(const std::vector<Sequence*>& rows) {
  std::vector<int64_t> slots, offsets;
  for (const Sequence* s : rows) {
    HEARTH_CHECK(s->slots_ == this, "decode slots: a prefill row is not in this pool");
    slots.push_back(s->slot_);
    offsets.push_back(s->offset_);
  }
  const at::Tensor slots_device = ids_to(slots, device_);  // one copy for every layer of the forward
  cache::Caches view;
  for (const auto& [keys, values] : buffers_)
    view.push_back(std::make_unique<SlotRowsCache>(keys, values, slots, slots_device, offsets));
  return view;
}

void DecodeSlots::admit(Sequence& s) {
  const int64_t slot = std::find(occupant_.begin(), occupant_.end(), nullptr) - occupant_.begin();
  HEARTH_CHECK(slot < slots_ && (fits(s) || fits_prefill(s)), "decode slots: admit of a sequence that does not fit");
  // Every length bucket this sequence can reach reads finite values in every row (before its own
  // tokens are written: the fill covers all rows). A prefilling one reaches its whole prompt first.
  const int64_t remaining = s.opts_.max_tokens - static_cast<int64_t>(s.result_.tokens.size());
  const int64_t fed = std::max<int64_t>(s.offset_, static_cast<int64_t>(s.prompt_.size()));
  ensure_zeroed(pick_bucket(length_buckets(capacity_), fed + remaining));
  for (size_t i = 0; i < full_.size(); ++i) {
    const cache::LayerCache* c = s.caches_[i].get();
    switch (kinds_[i]) {
      case Kind::kShared: break;
      case Kind::kKV:
        if (c->offset() == 0) break;  // a prompt not prefilled yet: prefill_view writes it
        static_cast<cache::StaticKVCache&>(*full_[i]).write_row(slot, static_cast<const cache::KVCache&>(*c));
        break;
      case Kind::kWindow:
        static_cast<cache::StaticKVCache&>(*full_[i]).write_row(slot, static_cast<const cache::RotatingKVCache&>(*c));
        break;
      case Kind::kRecurrent:
        static_cast<cache::StaticRecurrentCache&>(*full_[i])
            .write_row(slot, static_cast<const cache::RecurrentCache&>(*c));
        break;
    }
  }
  // The slot holds them now (read back by release), except the sliding-window caches, kept as they
  // are: release appends the positions decoded in the slot to them.
  cache::Caches& kept = kept_[static_cast<size_t>(slot)];
  kept.clear();
  kept.resize(full_.size());
  for (size_t i = 0; i < full_.size(); ++i)
    if (kinds_[i] == Kind::kWindow) kept[i] = std::move(s.caches_[i]);
  occupant_[static_cast<size_t>(slot)] = &s;
  s.slots_ = this;
  s.slot_ = slot;
  if (s.prefilling()) ++prefilled_in_slots_;
  s.caches_.clear();
  s.result_.stats.static_decode = true;
}

void DecodeSlots::release(Sequence& s, bool read_back) {
  HEARTH_CHECK(s.slots_ == this && s.slot_ >= 0 && s.slot_ < slots_, "decode slots: release of a sequence not in this pool");
  cache::Caches& kept = kept_[static_cast<size_t>(s.slot_)];
  if (read_back) {
    cache::Caches out;
    for (size_t i = 0; i < full_.size(); ++i) {
      switch (kinds_[i]) {
        case Kind::kShared: out.push_back(nullptr); break;
        case Kind::kKV:
          out.push_back(static_cast<const cache::StaticKVCache&>(*full_[i]).read_row(s.slot_, s.offset_));
          break;
        case Kind::kWindow: {
          HEARTH_CHECK(i < kept.size() && kept[i], "decode slots: layer ", i, "'s sliding-window cache was not kept");
          auto& rc = static_cast<cache::RotatingKVCache&>(*kept[i]);
          static_cast<const cache::StaticKVCache&>(*full_[i]).read_row(s.slot_, rc, s.offset_);
          out.push_back(std::move(kept[i]));
          break;
        }
        case Kind::kRecurrent:
          out.push_back(static_cast<const cache::StaticRecurrentCache&>(*full_[i]).read_row(s.slot_, s.offset_));
          break;
      }
    }
    s.caches_ = std::move(out);
  }
  kept.clear();
  occupant_[static_cast<size_t>(s.slot_)] = nullptr;
  s.slots_ = nullptr;
  s.slot_ = -1;
}

DecodeSlots::Bucket& DecodeSlots::bucket(int64_t b, int64_t len) {
  auto& entry = buckets_[{b, len}];
  if (entry) return *entry;
  auto bk = std::make_unique<Bucket>();
  bk->b = b;
  bk->state = std::make_shared<cache::StaticState>();
  bk->state->positions = positions_.narrow(0, 0, b);
  bk->state->capacity = len;
  for (size_t i = 0; i < buffers_.size(); ++i) {
    const auto& [x, y] = buffers_[i];
    if (kinds_[i] == Kind::kShared) bk->caches.push_back(nullptr);  // reads its donor's buffers
    else if (kinds_[i] == Kind::kRecurrent)
      bk->caches.push_back(std::make_unique<cache::StaticRecurrentCache>(bk->state, x, y));
    else bk->caches.push_back(std::make_unique<cache::StaticKVCache>(bk->state, x, y));
  }
  entry = std::move(bk);
  return *entry;
}

void DecodeSlots::forward(Bucket& bk) {
  const int64_t b = bk.b;
  at::Tensor lg = model_.forward(ids_.narrow(0, 0, b), models::Positions::uniform(0, b), &bk.caches);  // [b, 1, V]
  at::Tensor out = logits_.narrow(0, 0, b);
  out.copy_(lg.select(1, 0));
  next_.narrow(0, 0, b).copy_(argmax_last(out));
}

void DecodeSlots::run_step(Bucket& bk, const std::vector<Sequence*>& rows) {
  const int64_t b = bk.b;
  // Inputs: each row's pending token and position; free rows feed token 0 at position 0.
  std::vector<int64_t> host(static_cast<size_t>(2 * b), 0);
  bool lora = false;
  for (const Sequence* s : rows) {
    host[static_cast<size_t>(s->slot_)] = s->pending_;
    host[static_cast<size_t>(b + s->slot_)] = s->offset_;
    lora = lora || !s->adapters_.empty();
  }
  at::Tensor h = at::tensor(host, at::TensorOptions().dtype(at::kLong));
  ids_.narrow(0, 0, b).copy_(h.narrow(0, 0, b).view({b, 1}));
  positions_.narrow(0, 0, b).copy_(h.narrow(0, b, b));
  if (lora) {
    // Per-row adapters: eager, through the same buffers (a graph would bake in one assignment).
    std::vector<std::vector<std::string>> adapters(static_cast<size_t>(b));
    for (const Sequence* s : rows) adapters[static_cast<size_t>(s->slot_)] = s->adapters_;
    nn::RowAdapters scope(std::move(adapters));
    forward(bk);
    ++eager_steps_;
    return;
  }
  record(bk);
  bk.recorded->replay();
  if (bk.recorded->captured()) ++graph_steps_;
  else ++eager_steps_;
}

void DecodeSlots::record(Bucket& bk) {
  const int64_t b = bk.b;
  if (!bk.recorded) {
    auto fn = [this, p = &bk] { forward(*p); };
    if (device_.is_cuda() && capture_) {
      // The capture's warm-up runs the step once more: a recurrent state advances each time (a KV
      // write rewrites the same position), so the states of rows [0, b) are put back after it.
      std::vector<std::pair<at::Tensor, at::Tensor>> saved;
      for (size_t i = 0; i < buffers_.size(); ++i)
        if (kinds_[i] == Kind::kRecurrent)
          saved.emplace_back(buffers_[i].first.narrow(0, 0, b).clone(), buffers_[i].second.narrow(0, 0, b).clone());
      compat::synchronize(device_);  // the warm-up runs on a side stream: inputs and saved states first
      try {
        // One memory pool for all buckets: steps run one at a time and write their results into
        // the pool-independent buffers (logits_, next_, the caches), so their temporaries can
        // share memory — the pool holds the largest step's, not the sum over up to ~60 graphs.
        bk.recorded = std::make_unique<compat::RecordedStep>(fn, device_, /*warmup=*/1, &graph_pool_);
      } catch (const Error&) {
        bk.recorded.reset();  // a capture the backend refused: the same step, eagerly
      }
      size_t j = 0;
      for (size_t i = 0; i < buffers_.size(); ++i)
        if (kinds_[i] == Kind::kRecurrent) {
          buffers_[i].first.narrow(0, 0, b).copy_(saved[j].first);
          buffers_[i].second.narrow(0, 0, b).copy_(saved[j].second);
          ++j;
        }
    }
    if (!bk.recorded) bk.recorded = std::make_unique<compat::RecordedStep>(fn, at::Device(at::kCPU), 0);
  }
}

DecodeSlots::Warmup DecodeSlots::warm_up(bool run_eager) {
  const auto t0 = std::chrono::steady_clock::now();
  Warmup w;
  HEARTH_CHECK(occupied() == 0, "decode slots: warm_up needs an empty pool (", occupied(), " slots are occupied)");
  const bool graphs = device_.is_cuda() && capture_;
  if (!graphs && !run_eager) return w;
  c10::NoGradGuard no_grad;
  ensure_zeroed(capacity_);  // every length bucket reads finite keys
  ids_.zero_();              // free rows: token 0 at position 0, as in any step
  positions_.zero_();
  // Largest first (as vLLM captures): the shared pool reaches its size at the first capture and
  // the smaller steps reuse its blocks.
  const auto buckets = all_buckets(slots_, capacity_);
  for (auto it = buckets.rbegin(); it != buckets.rend(); ++it) {
    const auto [b, len] = *it;
    Bucket& bk = bucket(b, len);
    if (bk.recorded) continue;
    record(bk);
    bk.recorded->replay();  // the first replay's one-off costs (graph upload) are paid here too
    ++w.buckets;
    if (bk.recorded->captured()) ++w.captured;
  }
  compat::synchronize(device_);
  w.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return w;
}

int64_t DecodeSlots::recorded_buckets() const {
  return std::count_if(buckets_.begin(), buckets_.end(), [](const auto& e) { return e.second && e.second->recorded; });
}

void DecodeSlots::decode(const std::vector<Sequence*>& rows) {
  if (rows.empty()) return;
  int64_t top = 0, longest = 0;
  for (const Sequence* s : rows) {
    top = std::max(top, s->slot_);
    longest = std::max(longest, s->offset_);
  }
  const auto [b, len] = bucket_for(slots_, capacity_, top, longest);
  Bucket& bk = bucket(b, len);
  std::optional<StepTrace::Scope> step_time(StepTrace::kSlotStep);
  run_step(bk, rows);
  const bool graph = bk.recorded && bk.recorded->captured();
  // Outputs to the host: the argmax of every row at once; on a GPU, the logits of the rows that
  // sample on the host (non-greedy, no logprobs) in one copy instead of one per row.
  at::Tensor next_host = next_.narrow(0, 0, bk.b).to(at::kCPU);
  step_time.reset();
  const StepTrace::Scope emit_time(StepTrace::kSlotEmit);
  std::vector<int64_t> host_rows;
  for (const Sequence* s : rows)
    if (!plain_greedy(s->opts_) && !s->opts_.logprobs && device_.is_cuda()) host_rows.push_back(s->slot_);
  at::Tensor host_logits;
  if (!host_rows.empty())
    host_logits = logits_.index_select(0, at::tensor(host_rows, at::TensorOptions().dtype(at::kLong)).to(device_)).to(at::kCPU);
  // Greedy rows that want logprobs (no processors): their log-softmax rows in one op over all of
  // them, their tokens the step's own argmax — not a log-softmax, an argmax and a host sync per row
  // (Sequence::sample_and_emit; the same values: each row reduces alone either way).
  std::vector<int64_t> lp_rows;
  for (const Sequence* s : rows)
    if (greedy_with_logprobs(s->opts_)) lp_rows.push_back(s->slot_);
  at::Tensor lp_all;
  if (!lp_rows.empty()) {
    const at::Tensor idx = at::tensor(lp_rows, at::TensorOptions().dtype(at::kLong)).to(device_);
    lp_all = at::log_softmax(logits_.index_select(0, idx).to(at::kFloat), -1);
  }
  // Every row's token first; then the logprobs of all rows that ask for them go to the host in one
  // read (Sequence::emit_together: the chosen values and top-k of every row in one copy, not a
  // sync per row) and the tokens are emitted in row order.
  const int64_t* next = next_host.data_ptr<int64_t>();
  int64_t j = 0, k = 0;
  std::vector<Sequence::Drawn> drawn;
  bool only_greedy_logprobs = true;  // lp_all holds every logprob row: no stacking
  for (Sequence* s : rows) {
    s->offset_ += 1;
    s->result_.stats.cuda_graph = s->result_.stats.cuda_graph || graph;
    if (plain_greedy(s->opts_)) {
      drawn.push_back({s, next[s->slot_], at::Tensor()});
      continue;
    }
    if (greedy_with_logprobs(s->opts_)) {
      drawn.push_back({s, next[s->slot_], lp_all[k++]});
      continue;
    }
    const bool on_host = !s->opts_.logprobs && device_.is_cuda();
    int64_t token = -1;
    at::Tensor lp;
    if (s->sample(on_host ? host_logits[j++] : logits_[s->slot_], &token, &lp)) {
      drawn.push_back({s, token, lp});
      if (lp.defined()) only_greedy_logprobs = false;
    }
  }
  Sequence::emit_together(drawn, only_greedy_logprobs ? lp_all : at::Tensor());
  for (Sequence* s : rows)
    if (s->done()) {
      release(*s, /*read_back=*/s->opts_.keep_caches);
      s->finish_stats(model_);
    }
}

}  // namespace hearth::generate
