// What the two static-caches decode paths share (graph_decode.cpp: one sequence; decode_slots.cpp:
// the server's slot pool): their environment switches, the sampling they can run on the graph's
// own argmax, and host ids copied to the device without a stream sync. Internal to src/generate/;
// not the paths themselves.
#pragma once
#include <ATen/ATen.h>

#include <vector>

#include "core/env.h"
#include "generate/generate.h"
#include "generate/sampler.h"

namespace hearth::generate {

using hearth::env_equals;  // HEARTH_CUDA_GRAPHS=0 | nocapture, HEARTH_STATIC_DECODE=1 (core/env.h)

/// True when sampling with `s` is the plain argmax of the raw logits: temperature 0 and no logits
/// processor (penalties, logit bias, a constraint) — what a recorded step's argmax can stand in for.
inline bool greedy_without_processors(const SamplingParams& s) {
  return s.temperature == 0.0 && (s.repetition_penalty == 0.0 || s.repetition_penalty == 1.0) &&
         s.presence_penalty == 0.0 && s.frequency_penalty == 0.0 && s.logit_bias.empty() && !s.constraint;
}

/// Sampling that is a plain argmax of the raw logits, with nothing handed to the callback: a row's
/// token can be its step's own argmax (one device-to-host copy for every such row together).
inline bool plain_greedy(const GenerateOptions& o) { return !o.logprobs && greedy_without_processors(o.sampling); }
/// The same argmax, with the step's log-probabilities handed to the callback.
inline bool greedy_with_logprobs(const GenerateOptions& o) {
  return o.logprobs && greedy_without_processors(o.sampling);
}

/// `ids` as an int64 tensor [ids.size()] on `device`. To a GPU through pinned memory without
/// blocking: a plain copy from pageable memory waits for the stream (a device sync), which a
/// forward in flight (one per layer) or read_logprobs must not pay.
inline at::Tensor ids_to(const std::vector<int64_t>& ids, const at::Device& device) {
  at::Tensor host = at::tensor(ids, at::TensorOptions().dtype(at::kLong));
  if (!device.is_cuda()) return host.to(device);
  return host.pin_memory().to(device, /*non_blocking=*/true);
}

}  // namespace hearth::generate
