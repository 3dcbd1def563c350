// Segmented backward: gradients of a layer stack's token-mean CE loss with only one segment of
// layers' activations alive at a time. Forward keeps a detached models::Boundary (the hidden
// stream and any family streams) at every segment edge; the loss head's VJP gives the cotangent
// of the last hidden stream; then, segment by segment in reverse, the segment's forward is
// recomputed and its VJP (torch::autograd::grad with grad_outputs) taken w.r.t. every floating
// field of its input boundary and its trainable parameters. A stream a segment passes through
// unchanged keeps its cotangent and adds what the segment's own uses give, so a stream made in
// one segment and read in several later ones (Gemma 4's shared K/V) gets the sum of them all.
// Follows mlx-bun's segmented-backward design notes (shared/seeds/, inventory §5). Not an
// optimizer step or a data loader (trainer.h).
#pragma once
#include <ATen/ATen.h>

#include <functional>
#include <utility>
#include <vector>

#include "models/boundary.h"
#include "train/loss.h"

namespace hearth::train {

/// The pieces of a model the backward drivers need. Hidden tensors are [B, T, C].
struct LayerStack {
  /// input_ids [B, T] int64 → the boundary before layer 0 (hidden [B, T, C] and family streams).
  std::function<models::Boundary(const at::Tensor&)> embed;
  /// Runs layers [begin, end) on a boundary → the boundary after them.
  std::function<models::Boundary(const models::Boundary&, int64_t, int64_t)> layers;
  /// Final norm + lm_head: hidden [B, t, C] → logits [B, t, V].
  std::function<at::Tensor(const at::Tensor&)> head;
  int64_t num_layers = 0;
  /// Trainable tensors used by layers [begin, end) (requires_grad leaves; may be empty).
  std::function<std::vector<at::Tensor>(int64_t, int64_t)> layer_params;
  std::vector<at::Tensor> embed_params;  // trainable tensors used by `embed` (full fine-tune)
  std::vector<at::Tensor> head_params;   // trainable tensors used by `head`
};

/// Segments [begin, end) covering [0, num_layers): consecutive runs of `segment_size` layers
/// (the last may be shorter), except that each layer in `isolate` gets a segment of its own
/// (e.g. full-attention layers of a hybrid model). segment_size <= 0 or >= num_layers gives
/// one segment. Throws hearth::Error on an isolate index out of range.
std::vector<std::pair<int64_t, int64_t>> plan_segments(int64_t num_layers, int64_t segment_size,
                                                       const std::vector<int64_t>& isolate = {});

/// Result of one backward pass.
struct BackwardResult {
  double loss_sum = 0.0;   // Σ CE over supervised positions (0 when BackwardOptions::defer_loss)
  at::Tensor loss;         // the same Σ as a 0-dim fp64 tensor on the model's device (undefined when the head gives none)
  int64_t n_tokens = 0;    // supervised positions
  /// Segmented: the most bytes the saved boundaries (the input edge of every segment) held at once
  /// on the model's device (offloaded: those being brought back), and in host memory
  /// (BackwardOptions::offload_boundaries); a stream passed through several edges counted once.
  /// 0 for the full backward.
  int64_t boundary_device_bytes = 0;
  int64_t boundary_host_bytes = 0;
};

/// Options for the backward drivers.
struct BackwardOptions {
  int64_t segment_size = 0;        // layers per segment; 0 = plain full backward
  std::vector<int64_t> isolate;    // layers that get their own segment
  int64_t loss_chunk = 1024;       // positions per loss-head chunk
  double scale = 0.0;              // multiplies Σ CE before differentiation; 0 = 1 / n_tokens
  /// backward(): leave loss_sum at 0 and return the loss only as BackwardResult::loss, so that with
  /// CPU targets the call never waits for the device (the trainer reads losses at report time).
  bool defer_loss = false;
  /// Called before each segment's forward and again before its recompute with the segment index,
  /// so stochastic layers (LoRA dropout) can replay the same randomness; may be empty.
  std::function<void(size_t segment, bool recompute)> on_segment;
  /// Called right after each segment's VJP, last segment first, with the segment's layer range
  /// [begin, end): the .grad of every tensor in LayerStack::layer_params(begin, end) then holds
  /// all this call adds to it (a later segment, the loss head or the embedding adds nothing more),
  /// so a caller can start using it (data-parallel: start its all-reduce while the earlier
  /// segments compute; train/distributed.h). The full backward is one segment [0, num_layers),
  /// called after its VJP and before the embedding's. Called for every segment of the plan even
  /// when there is nothing to differentiate (no supervised token), so every data-parallel rank sees
  /// the same calls in the same order. May be empty; what it throws propagates.
  std::function<void(int64_t begin, int64_t end)> on_segment_grads;
  /// Segmented: keep the saved boundaries' floating fields in host memory (pinned on CUDA) between
  /// the forward and the backward, each brought back one segment ahead of its recompute
  /// (train/boundary_store.h). Same gradients; costs a device↔host copy of each boundary per step
  /// (on a side stream, overlapping compute). Ignored by the full backward (segment_size 0).
  bool offload_boundaries = false;
  /// With offload_boundaries: host bytes the copies may take (0 = no limit); the boundaries past it
  /// stay on the device.
  int64_t offload_host_limit_bytes = 0;
  /// Positions per chunk of the position-wise MLPs (nn/mlp_chunk.h) while this call runs: longer
  /// inputs run chunk by chunk, saving only the MLP's input for the backward. 0 = leave the
  /// thread's setting (off by default). Same gradients (fp32 within 1e-6); refused with LoRA dropout.
  int64_t mlp_chunk = 0;
};

/// Accumulates d(scale · Σ CE)/dθ into `.grad` of every trainable tensor of `model`, for
/// input_ids [B, T] and already-shifted targets [B, T] (kIgnoreIndex where unsupervised).
/// segment_size 0: one autograd graph over the whole stack (activations of all layers alive),
/// with the loss head still chunked. Otherwise the segmented schedule described above.
/// Both give the same gradients up to floating-point reassociation (tests: fp32 within 1e-6).
BackwardResult backward(const LayerStack& model, const at::Tensor& input_ids, const at::Tensor& targets,
                        const BackwardOptions& opts);

/// Any loss that is a function of the final hidden stream: given it (hidden [B, T, C], detached),
/// returns the loss value in HeadVjp::loss_sum, a token count, and grad_hidden = d(loss)/d hidden
/// (already scaled as the caller wants), having ADDED the gradients of the head's trainable
/// tensors (LayerStack::head_params) to their .grad. The preference losses are such heads.
using LossHead = std::function<HeadVjp(const at::Tensor& hidden)>;

/// As backward() above with the loss computed by `loss_head` instead of the token-mean CE
/// (opts.scale and opts.loss_chunk are then unused: the head owns its scale and chunking).
/// Same schedules, same gradients segmented or not. BackwardResult::loss_sum / n_tokens are the
/// head's. Throws what the head throws.
BackwardResult backward_with_head(const LayerStack& model, const at::Tensor& input_ids, const LossHead& loss_head,
                                  const BackwardOptions& opts);

}  // namespace hearth::train
