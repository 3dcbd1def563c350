// DPO / ORPO losses as loss heads over the final hidden stream, and the DPO reference pass
// (preference.h).
#include "train/preference.h"

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include "core/error.h"
#include "nn/linear.h"
#include "train/loss.h"

namespace hearth::train {

Method parse_method(const std::string& s) {
  if (s == "sft") return Method::kSft;
  if (s == "dpo") return Method::kDpo;
  if (s == "orpo") return Method::kOrpo;
  throw Error(cat("--method: '", s, "' is not sft, dpo or orpo"));
}

std::vector<std::pair<std::string, double>> PreferenceStats::named(Method m) const {
  std::vector<std::pair<std::string, double>> v{{"loss", loss}, {"accuracy", accuracy}, {"margin", margin}};
  if (m == Method::kOrpo) {
    v.emplace_back("nll", nll);
    v.emplace_back("or", odds_ratio);
  }
  return v;
}

namespace {

// The positions of one chunk that are scored and their log-probs: logits [N, t, V], tgt [N, t]
// → (flat indices into N·t, log p of the targets there, fp32 or wider).
std::pair<at::Tensor, at::Tensor> chunk_logp(const at::Tensor& logits, const at::Tensor& tgt) {
  at::Tensor lf = logits.to(at::promote_types(logits.scalar_type(), at::kFloat)).reshape({-1, logits.size(-1)});
  at::Tensor t = tgt.reshape({-1});
  at::Tensor idx = t.ne(kIgnoreIndex).nonzero().squeeze(1);
  at::Tensor sel = lf.index_select(0, idx);
  at::Tensor picked = sel.gather(1, t.index_select(0, idx).unsqueeze(1)).squeeze(1);
  return {idx, picked - at::logsumexp(sel, -1)};
}

void check_hidden(const at::Tensor& hidden, const at::Tensor& targets, int64_t chunk) {
  HEARTH_CHECK(hidden.dim() == 3, "preference loss: hidden must be [N, T, C], got ", hidden.sizes());
  HEARTH_CHECK(targets.dim() == 2 && targets.size(0) == hidden.size(0) && targets.size(1) == hidden.size(1),
               "preference loss: targets must be [N, T] = ", hidden.sizes().slice(0, 2), ", got ", targets.sizes());
  HEARTH_CHECK(chunk >= 1, "preference loss: chunk must be >= 1, got ", chunk);
}

// log(1 − e^x) for x < 0 (log1p(−exp(x)) in TRL); x is kept below 0 so a row predicted with
// certainty gives a large finite value instead of −inf.
at::Tensor log1mexp(const at::Tensor& x) { return at::log(-at::expm1(x.clamp_max(-1e-12))); }

// The scored targets and masks of a batch (CPU).
struct Masks {
  at::Tensor targets;  // [2B, T] int64, shifted
  at::Tensor resp;     // [2B, T] fp32: 1 on response targets
  at::Tensor nll;      // [B, T] fp32: 1 on the chosen positions of the ORPO NLL term
};

Masks masks(const PreferenceBatch& batch, const PreferenceOptions& opts) {
  Masks m;
  const int64_t B = batch.pairs;
  at::Tensor resp_t = shift_labels(batch.labels);
  m.resp = resp_t.ne(kIgnoreIndex).to(at::kFloat);
  if (opts.method == Method::kOrpo && opts.sft_full) {
    at::Tensor full = shift_labels(batch.full_labels);
    m.targets = resp_t.clone();
    m.targets.narrow(0, 0, B).copy_(full.narrow(0, 0, B));
    m.nll = full.narrow(0, 0, B).ne(kIgnoreIndex).to(at::kFloat);
  } else {
    m.targets = resp_t;
    m.nll = m.resp.narrow(0, 0, B).clone();
  }
  return m;
}

}  // namespace

at::Tensor token_logps(const at::Tensor& hidden, const at::Tensor& targets,
                       const std::function<at::Tensor(const at::Tensor&)>& head, int64_t chunk) {
  check_hidden(hidden, targets, chunk);
  c10::NoGradGuard no_grad;
  const int64_t N = hidden.size(0), T = hidden.size(1);
  at::Tensor out = at::zeros({N, T}, hidden.options().dtype(at::kFloat));
  at::Tensor tg = targets.to(hidden.device());
  for (int64_t s = 0; s < T; s += chunk) {
    const int64_t n = std::min(chunk, T - s);
    at::Tensor t = tg.narrow(1, s, n);
    if (t.ne(kIgnoreIndex).sum().item<int64_t>() == 0) continue;
    auto [idx, lp] = chunk_logp(head(hidden.narrow(1, s, n)), t);
    at::Tensor c = at::zeros({N * n}, out.options());
    c.index_copy_(0, idx, lp.to(at::kFloat));
    out.narrow(1, s, n).copy_(c.view({N, n}));
  }
  return out;
}

at::Tensor preference_loss(const at::Tensor& logp, const at::Tensor& resp, const at::Tensor& nll,
                           const at::Tensor& ref, const PreferenceOptions& opts, PreferenceStats* stats) {
  HEARTH_CHECK(logp.dim() == 2 && logp.size(0) % 2 == 0 && logp.size(0) > 0,
               "preference loss: logp must be [2B, T], got ", logp.sizes());
  const int64_t B = logp.size(0) / 2;
  const auto dev = logp.device();
  at::Tensor lp = logp.to(at::kDouble);
  at::Tensor r = resp.to(dev, at::kDouble);
  at::Tensor seq = (lp * r).sum(1);  // [2B] summed response log-probs
  at::Tensor loss;
  PreferenceStats st;
  if (opts.method == Method::kDpo) {
    HEARTH_CHECK(ref.defined() && ref.numel() == 2 * B, "DPO: reference log-probs must be [2B] = ", 2 * B);
    at::Tensor rf = ref.to(dev, at::kDouble);
    at::Tensor pc = seq.narrow(0, 0, B), pr = seq.narrow(0, B, B);
    at::Tensor rc = rf.narrow(0, 0, B), rr = rf.narrow(0, B, B);
    at::Tensor z = opts.beta * ((pc - pr) - (rc - rr));
    loss = (-at::log_sigmoid(z)).mean();
    if (stats) {
      at::Tensor wc = (opts.beta * (pc - rc)).detach(), wr = (opts.beta * (pr - rr)).detach();
      st.accuracy = wc.gt(wr).to(at::kDouble).mean().item<double>();
      st.margin = (wc - wr).mean().item<double>();
    }
  } else {
    HEARTH_CHECK(opts.method == Method::kOrpo, "preference loss: method must be dpo or orpo");
    at::Tensor ell = seq / r.sum(1);  // length-normalised log-probs
    at::Tensor lc = ell.narrow(0, 0, B), lr = ell.narrow(0, B, B);
    at::Tensor log_odds = (lc - lr) - (log1mexp(lc) - log1mexp(lr));
    at::Tensor or_term = (-at::log_sigmoid(log_odds)).mean();
    at::Tensor m = nll.to(dev, at::kDouble);
    at::Tensor count = opts.nll_count > 0 ? at::scalar_tensor(opts.nll_count, m.options()) : m.sum();
    at::Tensor nll_term = -(lp.narrow(0, 0, B) * m).sum() / count;
    loss = nll_term + opts.orpo_lambda * or_term;
    if (stats) {
      st.accuracy = lc.detach().gt(lr.detach()).to(at::kDouble).mean().item<double>();
      st.margin = log_odds.detach().mean().item<double>();
      st.nll = nll_term.item<double>();
      st.odds_ratio = or_term.item<double>();
    }
  }
  if (stats) {
    st.loss = loss.item<double>();
    *stats = st;
  }
  return loss;
}

double orpo_nll_tokens(const PreferenceBatch& batch, const PreferenceOptions& opts) {
  return masks(batch, opts).nll.sum().item<double>();
}

at::Tensor preference_targets(const PreferenceBatch& batch, const PreferenceOptions& opts) {
  return masks(batch, opts).targets;
}

at::Tensor reference_logps(models::Model& model, const PreferenceBatch& batch, int64_t chunk) {
  nn::ActiveAdapters base_only({});  // no adapter: the base weights are the reference
  c10::NoGradGuard no_grad;
  const at::Tensor& ids = batch.input_ids;
  at::Tensor h = model.forward_layers(model.embed(ids), 0, model.num_layers(),
                                      models::Positions::uniform(0, ids.size(0)), nullptr).hidden;
  at::Tensor lp = token_logps(h, shift_labels(batch.labels), [&](const at::Tensor& x) { return model.head(x); }, chunk);
  return lp.to(at::kDouble).sum(1);
}

LossHead preference_head(const PreferenceBatch& batch, const at::Tensor& ref, const PreferenceOptions& opts,
                         const std::function<at::Tensor(const at::Tensor&)>& head,
                         const std::vector<at::Tensor>& head_params, double scale, PreferenceStats* stats) {
  const Masks m = masks(batch, opts);
  return [m, ref, opts, head, head_params, scale, stats](const at::Tensor& hidden) {
    check_hidden(hidden, m.targets, opts.loss_chunk);
    const auto dev = hidden.device();
    // 1. token log-probs without a graph; 2. the loss and its gradient W w.r.t. them.
    at::Tensor lp = token_logps(hidden, m.targets, head, opts.loss_chunk).to(at::kDouble).detach().requires_grad_(true);
    c10::AutoGradMode grad_on(true);
    at::Tensor loss = preference_loss(lp, m.resp, m.nll, ref, opts, stats);
    at::Tensor W = torch::autograd::grad({loss * scale}, {lp})[0].to(at::kFloat);
    // 3. the VJP of Σ W·logp through the head, chunk by chunk.
    HeadVjp r;
    r.loss_sum = loss.item<double>();
    r.n_tokens = static_cast<int64_t>(m.resp.sum().item<double>());
    r.grad_hidden = at::zeros_like(hidden);
    at::Tensor tg = m.targets.to(dev);
    const int64_t T = hidden.size(1);
    for (int64_t s = 0; s < T; s += opts.loss_chunk) {
      const int64_t n = std::min(opts.loss_chunk, T - s);
      at::Tensor t = tg.narrow(1, s, n);
      if (t.ne(kIgnoreIndex).sum().item<int64_t>() == 0) continue;
      at::Tensor h = hidden.narrow(1, s, n).detach().requires_grad_(true);
      auto [idx, lps] = chunk_logp(head(h), t);
      at::Tensor w = W.narrow(1, s, n).reshape({-1}).index_select(0, idx);
      at::Tensor obj = (lps * w.to(lps.scalar_type())).sum();
      std::vector<at::Tensor> inputs{h};
      inputs.insert(inputs.end(), head_params.begin(), head_params.end());
      auto grads = torch::autograd::grad({obj}, inputs, {}, /*retain_graph=*/false, /*create_graph=*/false,
                                         /*allow_unused=*/true);
      r.grad_hidden.narrow(1, s, n).copy_(grads[0]);
      for (size_t i = 0; i < head_params.size(); ++i) {
        if (!grads[i + 1].defined()) continue;
        at::Tensor p = head_params[i];
        if (p.grad().defined()) p.mutable_grad().add_(grads[i + 1]);
        else p.mutable_grad() = grads[i + 1].clone();
      }
    }
    return r;
  };
}

PreferenceStats preference_eval(models::Model& model, const PreferenceBatch& batch, const at::Tensor& ref,
                                const PreferenceOptions& opts) {
  c10::NoGradGuard no_grad;
  const Masks m = masks(batch, opts);
  const at::Tensor& ids = batch.input_ids;
  at::Tensor h = model.forward_layers(model.embed(ids), 0, model.num_layers(),
                                      models::Positions::uniform(0, ids.size(0)), nullptr).hidden;
  at::Tensor lp = token_logps(h, m.targets, [&](const at::Tensor& x) { return model.head(x); }, opts.loss_chunk);
  PreferenceStats st;
  preference_loss(lp, m.resp, m.nll, ref, opts, &st);
  return st;
}

}  // namespace hearth::train
