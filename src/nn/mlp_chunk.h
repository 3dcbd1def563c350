// Sequence-chunked position-wise MLPs for long training sequences: a thread-local "chunk size"
// setting (MlpChunkScope) and the chunked checkpoint that runs an MLP N positions at a time without
// saving its [T, I] intermediates. Not an MLP itself (nn/mlp.h, Gemma4MLP) and not a layer checkpoint
// (train/segmented.h recomputes whole layers).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "nn/linear.h"

namespace hearth::nn {

/// RAII: MLPs on this thread that call position_wise_chunked() run `tokens` positions at a time
/// when their input has more (0 = off, the default). The trainer sets it around its backward
/// (TrainConfig::mlp_chunk, `--mlp-chunk`). Thread-local; scopes nest (the previous value is
/// restored on exit). Throws hearth::Error for tokens < 0.
class MlpChunkScope {
 public:
  explicit MlpChunkScope(int64_t tokens);
  ~MlpChunkScope();
  MlpChunkScope(const MlpChunkScope&) = delete;
  MlpChunkScope& operator=(const MlpChunkScope&) = delete;
  /// The chunk size in force on the calling thread (0 = off).
  static int64_t current();

 private:
  int64_t saved_;
};

/// A position-wise function x [N, C] → [N, C'] (row i of the output depends only on row i of x).
using PositionWiseFn = std::function<at::Tensor(const at::Tensor&)>;

/// y = f(x) for x [..., C] → y [..., C'], with N = x.numel() / C positions:
/// - MlpChunkScope::current() is 0 or N <= it: f(x) as is;
/// - otherwise f runs on chunks of that many positions (the last may be shorter), each chunk's
///   result written into y. Without grad (or when neither x nor any of `linears` has a tensor that
///   requires grad) that is all. With grad it is a chunked checkpoint (torch.utils.checkpoint with
///   use_reentrant=True, per chunk): the forward saves only x; the backward recomputes each chunk of
///   f with grad and back-propagates that chunk's output cotangent with torch::autograd::backward,
///   so the gradients of the tensors f uses (LoRA A/B, dense weights: `linears`) are ADDED to their
///   .grad directly, and returns x's gradient. They are never returned through the graph: a caller
///   of torch::autograd::grad over such a graph finds them in .grad, not in grad's result
///   (train/segmented.cpp's vjp() adds what grad returns to .grad, so each is counted once). One
///   trainable tensor of `linears` is an extra input of the node (its gradient never returned), so
///   that grad(inputs = those tensors) runs the node even when x is a constant.
///   The backward reinstates the forward's ActiveAdapters selection (the autograd engine may run it
///   on another thread); it refuses (hearth::Error) LoRA dropout on any of `linears`' active adapters
///   inside a LoraDropoutScope, whose masks a recompute could not replay.
/// The same values as f(x) in every case (fp32: equal up to the GEMMs' blocking over rows).
at::Tensor position_wise_chunked(const at::Tensor& x, const PositionWiseFn& f, const std::vector<const Linear*>& linears);

/// The chunked checkpoint of position_wise_chunked() with an explicit chunk size (> 0), whatever the
/// scope says and however many positions x has (for tests and callers that choose per call).
at::Tensor checkpoint_chunks(const at::Tensor& x, const PositionWiseFn& f, const std::vector<const Linear*>& linears,
                             int64_t chunk);

}  // namespace hearth::nn
