// Sequence::run_static: greedy decode through static caches and a recorded step (a CUDA graph on
// the GPU: one launch per token instead of hundreds). Not the eager loop (batch.cpp), which stays
// the reference and the fallback.
#include <c10/core/GradMode.h>

#include <chrono>
#include <memory>
#include <typeinfo>
#include <utility>
#include <vector>

#include "cache/static_kv_cache.h"
#include "cache/static_recurrent_cache.h"
#include "core/cuda_graph.h"
#include "core/error.h"
#include "core/torch_compat.h"
#include "generate/batch.h"
#include "generate/sampler.h"
#include "generate/static_decode_util.h"
#include "nn/linear.h"

namespace hearth::generate {

namespace {
int64_t round_up(int64_t n, int64_t step) { return (n + step - 1) / step * step; }
}  // namespace

bool Sequence::run_static(models::Model& model) {
  if (done_ || prefilling() || pending_ < 0) return false;
  const at::Device device = model.placement().device;
  if (env_equals("HEARTH_CUDA_GRAPHS", "0")) return false;
  if (!device.is_cuda() && !env_equals("HEARTH_STATIC_DECODE", "1")) return false;
  if (!greedy_without_processors(opts_.sampling)) return false;
  // Growing and sliding-window KV caches and recurrent states have static forms; a null entry (a
  // layer without state of its own: Gemma 4's KV-sharing layers) stays null.
  for (const auto& c : caches_)
    if (c && typeid(*c) != typeid(cache::KVCache) && typeid(*c) != typeid(cache::RotatingKVCache) &&
        typeid(*c) != typeid(cache::RecurrentCache))
      return false;
  c10::NoGradGuard no_grad;
  nn::ActiveAdapters adapters(adapters_);
  const auto lopt = at::TensorOptions().dtype(at::kLong).device(device);
  at::Tensor ids = at::full({1, 1}, pending_, lopt);  // the token fed by the next step
  bool first_round = true;
  compat::HostReadback readback;  // the step's token, read while the next step runs
  while (!done_) {
    const auto setup0 = std::chrono::steady_clock::now();
    // Static buffers for the next stretch: at least twice what is held (the attention reads the
    // whole capacity each step, so it grows with the sequence instead of being the context).
    const int64_t remaining = opts_.max_tokens - static_cast<int64_t>(result_.tokens.size());
    const int64_t capacity = round_up(std::min(offset_ + remaining + 1, std::max<int64_t>(2 * offset_, offset_ + 256)), 64);
    auto st = std::make_shared<cache::StaticState>();
    st->capacity = capacity;
    st->host_offset = offset_;
    st->positions = at::full({1}, offset_, lopt);
    cache::Caches stat;
    for (const auto& c : caches_) {
      if (!c)
        stat.push_back(nullptr);
      else if (auto* rc = dynamic_cast<const cache::RecurrentCache*>(c.get()))
        stat.push_back(std::make_unique<cache::StaticRecurrentCache>(st, *rc));
      else if (auto* wc = dynamic_cast<const cache::RotatingKVCache*>(c.get()))
        stat.push_back(std::make_unique<cache::StaticKVCache>(st, *wc));  // buffers made by the first step
      else
        stat.push_back(std::make_unique<cache::StaticKVCache>(st, static_cast<const cache::KVCache&>(*c)));
    }
    // A recurrent state advances each time the step runs, unlike a KV write (the same position
    // rewritten): the capture's warm-up runs the step once more, so its states are kept to rewind.
    std::vector<std::pair<cache::StaticRecurrentCache*, std::pair<at::Tensor, at::Tensor>>> rewind;
    for (auto& c : stat)
      if (auto* rc = dynamic_cast<cache::StaticRecurrentCache*>(c.get()))
        rewind.push_back({rc, {rc->conv_state().clone(), rc->recurrent_state().clone()}});
    at::Tensor logits, next;
    auto fn = [&] {
      at::Tensor lg = model.forward(ids, st->host_offset, &stat)[0][-1].to(at::kFloat);
      if (!logits.defined()) {
        logits = at::empty_like(lg);
        next = at::empty({1, 1}, lopt);
      }
      logits.copy_(lg);
      next.copy_(argmax_last(lg).view({1, 1}));
    };
    fn();  // eager: allocates the outputs, builds the RoPE tables, and proves the family's static path
    if (first_round && !st->family_ran_static) return false;
    first_round = false;
    // HEARTH_CUDA_GRAPHS=nocapture: the same static step, replayed eagerly (tests compare the two).
    std::unique_ptr<compat::RecordedStep> recorded;
    const bool capture = !env_equals("HEARTH_CUDA_GRAPHS", "nocapture");
    if (capture) {
      try {
        recorded = std::make_unique<compat::RecordedStep>(fn, device, /*warmup=*/1);
      } catch (const Error&) {
        recorded.reset();  // a capture the backend refused: the same step, eagerly
      }
    }
    if (!recorded) recorded = std::make_unique<compat::RecordedStep>(fn, at::Device(at::kCPU), 0);
    if (capture && device.is_cuda() && !rewind.empty()) {
      // The warm-up advanced the recurrent states past this step: back to before it, then the step
      // again (through the recording), which leaves logits/next and the states as the eager call did.
      for (auto& [rc, saved] : rewind) rc->write(saved.first, saved.second);
      recorded->replay();
    }
    const bool has_recurrent = !rewind.empty();
    rewind.clear();
    compat::synchronize(device);  // the setup's work, not the first token's, ends here
    result_.stats.static_setup_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - setup0).count();
    result_.stats.static_decode = true;
    result_.stats.cuda_graph = recorded->captured();
    // Pipelined on a captured graph: the step for token t+1 is queued (fed from `next` on the
    // device) before the host waits for token t, so the GPU runs it while the host streams t. When
    // t ends the sequence, that step was spent for nothing: its cache write at position offset_
    // lies past what the caches keep (to_kv_cache / extend take offset_ tokens). A recurrent state
    // would have advanced past it, so hybrid families keep the one-step-at-a-time order.
    const bool run_ahead = recorded->captured() && !has_recurrent && !env_equals("HEARTH_DECODE_RUN_AHEAD", "0");
    bool queued = offset_ + 1 < capacity;  // the step for `ids` ran already (logits/next hold it)
    while (queued) {
      at::Tensor lp;
      if (opts_.logprobs) lp = at::log_softmax(logits, -1);  // queued before the next step rewrites logits
      readback.start(next);
      offset_ += 1;
      st->host_offset = offset_;
      const int64_t emitted = static_cast<int64_t>(result_.tokens.size()) + 1;  // after this token
      queued = offset_ + 1 < capacity;
      ids.copy_(next);
      st->positions.add_(1);
      const bool ahead = run_ahead && queued && emitted < opts_.max_tokens;
      if (ahead) recorded->replay();
      emit_together({{this, readback.wait().item<int64_t>(), lp}});
      if (done_) break;
      if (queued && !ahead) recorded->replay();
    }
    // Back to growing caches: the eager loop, the prompt cache and the next stretch read them. A
    // sliding-window cache was left as it was (the static one copied it): it takes the new tokens.
    for (size_t i = 0; i < caches_.size(); ++i) {
      if (!stat[i]) continue;
      if (auto* rc = dynamic_cast<const cache::StaticRecurrentCache*>(stat[i].get()))
        caches_[i] = rc->to_recurrent_cache(offset_);
      else if (auto* wc = dynamic_cast<cache::RotatingKVCache*>(caches_[i].get()))
        static_cast<const cache::StaticKVCache&>(*stat[i]).extend(*wc, offset_);
      else
        caches_[i] = static_cast<const cache::StaticKVCache&>(*stat[i]).to_kv_cache(offset_);
    }
  }
  finish_stats(model);
  return true;
}

}  // namespace hearth::generate
