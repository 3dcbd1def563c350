// The chunked checkpoint of position-wise MLPs (see mlp_chunk.h): a custom autograd Function whose
// forward runs the MLP over chunks of positions without a graph and whose backward recomputes each
// chunk with grad and back-propagates into it (torch.utils.checkpoint, use_reentrant=True).
#include "nn/mlp_chunk.h"

#include <ATen/core/ivalue.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <string>
#include <utility>

#include "core/error.h"

namespace hearth::nn {

namespace {

thread_local int64_t t_mlp_chunk = 0;

// What the backward needs besides x: the function, the chunk size, the adapter selection the
// forward ran with, and whether x's own gradient is wanted (x may be a constant).
struct ChunkedFn : torch::CustomClassHolder {
  PositionWiseFn f;
  int64_t chunk = 0;
  std::vector<std::string> adapters;
  bool x_grad = false;
};

// f over x [N, C] in chunks of `chunk` rows → [N, C'] (N > 0).
at::Tensor run_chunks(const at::Tensor& x, const PositionWiseFn& f, int64_t chunk) {
  const int64_t N = x.size(0);
  at::Tensor y;
  for (int64_t s = 0; s < N; s += chunk) {
    const int64_t n = std::min(chunk, N - s);
    at::Tensor yc = f(x.narrow(0, s, n));
    HEARTH_CHECK(yc.dim() == 2 && yc.size(0) == n, "chunked MLP: the function gave ", yc.sizes(), " for ", n,
                 " positions (it must be position-wise)");
    if (!y.defined()) y = at::empty({N, yc.size(1)}, yc.options());
    y.narrow(0, s, n).copy_(yc);
  }
  return y;
}

// `anchor`: a trainable tensor of f (or x itself), an input only so that the node is part of every
// graph that reaches f's tensors — torch::autograd::grad(inputs = {..., f's tensors}) runs only the
// nodes on a path to its inputs, and x may be a constant. Its gradient is never returned here.
struct ChunkedCheckpoint : torch::autograd::Function<ChunkedCheckpoint> {
  // Runs with grad off (Function::apply); x [N, C] → [N, C'].
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& anchor,
                            c10::intrusive_ptr<ChunkedFn> fn) {
    ctx->save_for_backward({x});
    at::Tensor y = run_chunks(x, fn->f, fn->chunk);
    ctx->saved_data["fn"] = c10::IValue::make_capsule(std::move(fn));
    return y;
  }

  // grads[0] [N, C'] → {dx [N, C] (undefined when x's gradient is not wanted), nothing for anchor and fn};
  // the gradients of f's own tensors are accumulated into their .grad by the inner backward.
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const c10::intrusive_ptr<torch::CustomClassHolder> holder = ctx->saved_data["fn"].toCapsule();
    const auto* fn = static_cast<const ChunkedFn*>(holder.get());
    const at::Tensor x = ctx->get_saved_variables()[0];
    const at::Tensor& gy = grads[0];
    if (!gy.defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    // The engine may run this node on its device thread: the adapters must be the forward's.
    ActiveAdapters adapters(fn->adapters);
    c10::AutoGradMode grad_on(true);
    const int64_t N = x.size(0);
    at::Tensor gx = fn->x_grad ? at::empty_like(x) : at::Tensor();
    for (int64_t s = 0; s < N; s += fn->chunk) {
      const int64_t n = std::min(fn->chunk, N - s);
      at::Tensor xc = x.narrow(0, s, n).detach();
      if (fn->x_grad) xc.requires_grad_(true);
      at::Tensor yc = fn->f(xc);
      if (yc.requires_grad()) torch::autograd::backward({yc}, {gy.narrow(0, s, n)});
      if (fn->x_grad) {
        if (xc.grad().defined()) gx.narrow(0, s, n).copy_(xc.grad());
        else gx.narrow(0, s, n).zero_();
      }
    }
    return {gx, at::Tensor(), at::Tensor()};
  }
};

// A tensor of `linears` that requires grad — an active adapter's first, then a dense weight or
// bias, then any adapter's — or an undefined tensor when none does.
at::Tensor find_trainable(const std::vector<const Linear*>& linears) {
  auto rg = [](const at::Tensor& t) { return t.defined() && t.requires_grad(); };
  for (const std::string& id : ActiveAdapters::current())
    for (const Linear* l : linears)
      if (const LoraAdapter* a = l->find_adapter(id)) {
        if (rg(a->a)) return a->a;
        if (rg(a->b)) return a->b;
      }
  for (const Linear* l : linears) {
    if (!l->quantized() && rg(l->weight())) return l->weight();
    if (l->bias() && rg(*l->bias())) return *l->bias();
  }
  for (const Linear* l : linears)
    for (const auto& [id, ad] : l->adapters()) {
      if (rg(ad.a)) return ad.a;
      if (rg(ad.b)) return ad.b;
    }
  return {};
}

}  // namespace

MlpChunkScope::MlpChunkScope(int64_t tokens) : saved_(t_mlp_chunk) {
  HEARTH_CHECK(tokens >= 0, "MLP chunk: the number of positions per chunk must be >= 0 (0 = off), got ", tokens);
  t_mlp_chunk = tokens;
}

MlpChunkScope::~MlpChunkScope() { t_mlp_chunk = saved_; }

int64_t MlpChunkScope::current() { return t_mlp_chunk; }

at::Tensor checkpoint_chunks(const at::Tensor& x, const PositionWiseFn& f, const std::vector<const Linear*>& linears,
                             int64_t chunk) {
  HEARTH_CHECK(chunk > 0, "chunked MLP: chunk must be > 0, got ", chunk);
  HEARTH_CHECK(x.dim() >= 1, "chunked MLP: x must have a feature dimension, got a 0-dim tensor");
  const int64_t C = x.size(-1);
  if (C == 0 || x.numel() == 0) return f(x);
  const int64_t N = x.numel() / C;
  const at::Tensor x2 = x.reshape({N, C});
  const at::Tensor anchor = c10::GradMode::is_enabled() ? find_trainable(linears) : at::Tensor();
  at::Tensor y2;
  if (!c10::GradMode::is_enabled() || !(x.requires_grad() || anchor.defined())) {
    y2 = run_chunks(x2, f, chunk);
  } else {
    if (LoraDropoutScope::enabled())
      for (const std::string& id : ActiveAdapters::current())
        for (const Linear* l : linears)
          if (const LoraAdapter* a = l->find_adapter(id); a && a->dropout > 0)
            throw Error(cat("chunked MLP: adapter '", id, "' has LoRA dropout ", a->dropout,
                            ", whose masks the chunked checkpoint cannot replay in its backward; use --lora-dropout 0 "
                            "or --mlp-chunk 0"));
    auto fn = c10::make_intrusive<ChunkedFn>();
    fn->f = f;
    fn->chunk = chunk;
    fn->adapters = ActiveAdapters::current();
    fn->x_grad = x.requires_grad();
    y2 = ChunkedCheckpoint::apply(x2, anchor.defined() ? anchor : x2, fn);
  }
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = y2.size(1);
  return y2.view(shape);
}

at::Tensor position_wise_chunked(const at::Tensor& x, const PositionWiseFn& f, const std::vector<const Linear*>& linears) {
  const int64_t chunk = MlpChunkScope::current();
  if (chunk <= 0 || x.dim() == 0 || x.size(-1) == 0 || x.numel() / x.size(-1) <= chunk) return f(x);
  return checkpoint_chunks(x, f, linears, chunk);
}

}  // namespace hearth::nn
