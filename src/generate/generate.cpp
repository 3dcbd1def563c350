// generate(): one sequence through the continuous-batching step of batch.h.
#include "generate/generate.h"


#include "core/torch_compat.h"
#include "generate/batch.h"
#include "nn/linear.h"

namespace hearth::generate {

GenerationResult generate(models::Model& model, const std::vector<int64_t>& prompt, const GenerateOptions& opts,
                          const TokenCallback& on_token) {
  StepCallback step;
  if (on_token) step = [&](int64_t token, const StepLogprobs*) { return on_token(token); };
  return generate(model, prompt, opts, step);
}

GenerationResult generate(models::Model& model, const std::vector<int64_t>& prompt, const GenerateOptions& opts,
                          const StepCallback& on_step) {
  cache::Caches caches;
  return generate(model, prompt, opts, caches, on_step);
}

GenerationResult generate(models::Model& model, const std::vector<int64_t>& prompt, const GenerateOptions& opts,
                          cache::Caches& caches, const StepCallback& on_step) {
  // One sequence through the continuous-batching step (batch.h): the same loop the server runs for many.
  compat::reset_peak_memory(model.placement().device);
  Sequence seq(prompt, opts, std::move(caches), nn::ActiveAdapters::current(), on_step);
  bool tried_static = false;
  while (!seq.done()) {
    step(model, {&seq}, opts.prefill_step_size);
    // Once the first token is out, the rest may run on the static (CUDA graph) path.
    if (!tried_static && !seq.done() && !seq.prefilling()) {
      tried_static = true;
      if (seq.run_static(model)) break;
    }
  }
  caches = std::move(seq.caches());
  return seq.result();
}

}  // namespace hearth::generate
