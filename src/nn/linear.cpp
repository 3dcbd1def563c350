// nn::Linear: dense or MLX-quantized weight matmul (+ bias, + active LoRA adapters), its loading,
// and the thread-local adapter selection / LoRA dropout state.
#include "nn/linear.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <tuple>

#include "core/env.h"
#include "core/error.h"
#include "nn/cpu_gemm.h"
#include "nn/decode_gemv.h"
#include "nn/fused_ops.h"

namespace hearth::nn {

namespace {
thread_local std::vector<std::string> t_active;
thread_local std::vector<std::vector<std::string>> t_rows;  // RowAdapters: a selection per batch row
thread_local bool t_rows_on = false;

struct DropoutState {
  bool on = false;
  at::Generator gen;
};
thread_local DropoutState t_dropout;

// dropout(x) as torch.nn.Dropout in training: zero with probability p, scale kept by 1/(1-p).
at::Tensor lora_dropout(const at::Tensor& x, double p) {
  if (p <= 0.0 || !t_dropout.on) return x;
  if (p >= 1.0) return at::zeros_like(x);
  at::Tensor keep = at::empty(x.sizes(), at::TensorOptions().dtype(at::kFloat));
  keep.bernoulli_(1.0 - p, t_dropout.gen);
  return x * (keep.to(x.device(), x.scalar_type()) / (1.0 - p));
}

// Whether add_adapters may add `ad` as one addmm: inference (no grad, no LoRA dropout, leaves not
// requiring grad) on CUDA with the fused kernels on, every tensor in y's dtype. Elsewhere (CPU,
// training, HEARTH_FUSED_DECODE=0: the bit-parity tier) PEFT's op order stands.
bool lora_addmm_applies(const LoraAdapter& ad, const at::Tensor& x, const at::Tensor& y) {
  return y.is_cuda() && fused_decode_enabled() && !c10::GradMode::is_enabled() && !(t_dropout.on && ad.dropout > 0.0) &&
         x.scalar_type() == y.scalar_type() && ad.a.scalar_type() == y.scalar_type() &&
         ad.b.scalar_type() == y.scalar_type() && !ad.a.requires_grad() && !ad.b.requires_grad();
}

// How a Linear's share of this thread's adapter selection can go into a decode GEMV launch (the
// GemvOperand LoRA epilogue, nn/decode_gemv.h): `ok` false when it cannot (a RowAdapters scope,
// more than one of the selection held, training or dropout, another dtype, more than one row of x);
// `ad` the one adapter to add, nullptr when the Linear holds none of the selection.
struct EpilogueLora {
  bool ok = true;
  const LoraAdapter* ad = nullptr;
};

EpilogueLora epilogue_lora(const Linear& l, const at::Tensor& x) {
  static const bool enabled = env_switch_on("HEARTH_GEMV_LORA");  // =0: the addmm path (an A/B switch)
  if (!l.has_adapters()) return {};
  if (t_rows_on || !enabled) return {false, nullptr};
  const LoraAdapter* found = nullptr;
  for (const std::string& id : t_active) {
    const LoraAdapter* ad = l.find_adapter(id);
    if (!ad) continue;
    if (found) return {false, nullptr};
    found = ad;
  }
  if (!found) return {};
  if (gemv_rows(x) != 1 || !lora_addmm_applies(*found, x, x)) return {false, nullptr};
  return {true, found};
}

// Each Linear's one active adapter (nullptr for those holding none) when every Linear of ls can take
// its share in a GEMV epilogue and at least one holds an adapter; else empty.
std::vector<const LoraAdapter*> epilogue_adapters(const at::Tensor& x, std::initializer_list<const Linear*> ls) {
  std::vector<const LoraAdapter*> ads;
  bool any = false;
  for (const Linear* l : ls) {
    const EpilogueLora e = epilogue_lora(*l, x);
    if (!e.ok) return {};
    ads.push_back(e.ad);
    any = any || e.ad != nullptr;
  }
  return any ? ads : std::vector<const LoraAdapter*>{};
}

// The adapters' A matrices as GEMV weights (in ads' order, nullptr entries skipped): x·Aᵀ of all of
// them in one launch.
std::vector<GemvOperand> lora_a_operands(const std::vector<const LoraAdapter*>& ads) {
  std::vector<GemvOperand> as;
  for (const LoraAdapter* ad : ads)
    if (ad) as.push_back(GemvOperand{ad->a, nullptr});
  return as;
}

// The base launch with each adapter's term in its epilogue: hs[k] = x·Aᵀ of the k-th non-null
// adapter of ads. Empty when the kernel declines.
std::vector<at::Tensor> gemv_with_lora(const at::Tensor& x, std::vector<GemvOperand> ops,
                                       const std::vector<const LoraAdapter*>& ads, const std::vector<at::Tensor>& hs) {
  size_t k = 0;
  for (size_t i = 0; i < ads.size(); ++i) {
    if (!ads[i]) continue;
    ops[i].lora_b = ads[i]->b;
    ops[i].lora_h = hs[k++];
    ops[i].lora_scale = ads[i]->scale;
  }
  return decode_gemv(x, ops);
}

// Linear::forward_many's products with the active adapters in the GEMV (one row of x): x·Aᵀ of
// every adapter in one launch, then the base products with B·h in their epilogue — two launches
// for the group where the addmm path takes one for the base and two per adapter. Empty when it does
// not apply (no adapter active, or any case epilogue_lora refuses): the caller's usual path.
std::vector<at::Tensor> lora_epilogue_products(const at::Tensor& x, std::initializer_list<const Linear*> ls,
                                               std::vector<GemvOperand> ops) {
  const std::vector<const LoraAdapter*> ads = epilogue_adapters(x, ls);
  if (ads.empty()) return {};
  const std::vector<at::Tensor> hs = decode_gemv(x, lora_a_operands(ads));
  if (hs.empty()) return {};
  return gemv_with_lora(x, std::move(ops), ads, hs);
}

GemvOperand gemv_operand(const Linear& l) {
  return l.quantized() ? GemvOperand{{}, &*l.qweight()} : GemvOperand{l.weight(), nullptr};
}
}  // namespace

ActiveAdapters::ActiveAdapters(std::vector<std::string> ids) : saved_(std::move(t_active)) {
  t_active = std::move(ids);
}
ActiveAdapters::~ActiveAdapters() { t_active = std::move(saved_); }
const std::vector<std::string>& ActiveAdapters::current() { return t_active; }

RowAdapters::RowAdapters(std::vector<std::vector<std::string>> rows) : saved_(std::move(t_rows)), saved_on_(t_rows_on) {
  t_rows = std::move(rows);
  t_rows_on = true;
}
RowAdapters::~RowAdapters() {
  t_rows = std::move(saved_);
  t_rows_on = saved_on_;
}

std::vector<std::string> parse_adapter_spec(const std::string& spec) {
  std::vector<std::string> ids;
  if (spec.empty() || spec == "none") return ids;
  size_t start = 0;
  while (true) {
    size_t end = spec.find_first_of("+,", start);
    std::string id = spec.substr(start, end == std::string::npos ? std::string::npos : end - start);
    HEARTH_CHECK_T(InvalidArgument, !id.empty(), "adapter selection '", spec, "': empty adapter id");
    HEARTH_CHECK_T(InvalidArgument, std::find(ids.begin(), ids.end(), id) == ids.end(), "adapter selection '", spec,
                   "': adapter '", id, "' is listed twice");
    ids.push_back(std::move(id));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return ids;
}

LoraDropoutScope::LoraDropoutScope(uint64_t seed) {
  t_dropout.on = true;
  t_dropout.gen = at::detail::createCPUGenerator(seed);
}
LoraDropoutScope::~LoraDropoutScope() { t_dropout = DropoutState{}; }
void LoraDropoutScope::reseed(uint64_t seed) {
  if (t_dropout.on) t_dropout.gen = at::detail::createCPUGenerator(seed);
}
bool LoraDropoutScope::enabled() { return t_dropout.on; }

Linear::Linear(at::Tensor weight, std::optional<at::Tensor> bias) : weight_(std::move(weight)), bias_(std::move(bias)) {
  HEARTH_CHECK(weight_.dim() == 2, "Linear: weight must be [out, in], got ", shape_str(weight_.sizes()));
}

Linear::Linear(QuantizedWeight qweight, std::optional<at::Tensor> bias)
    : qweight_(std::move(qweight)), bias_(std::move(bias)) {}

QuantizedWeight load_quantized(const ParamSource& src, const std::string& path, int64_t in, int64_t out,
                               const QuantSpec& spec, const LoadOptions& opts) {
  check_quant_spec(spec, path);
  HEARTH_CHECK(in % spec.group_size == 0 && (in * spec.bits) % 32 == 0, path, ": in_features ", in,
               " is not divisible by group_size ", spec.group_size);
  QuantizedWeight q;
  q.spec = spec;
  q.wq = src.get(path + ".weight", {out, in * spec.bits / 32}).to(opts.device).contiguous();
  if (q.wq.scalar_type() != at::kInt) q.wq = q.wq.view(at::kInt);  // U32 bits, reinterpreted
  q.scales = place(src.get(path + ".scales", {out, in / spec.group_size}), opts);
  q.biases = place(src.get(path + ".biases", {out, in / spec.group_size}), opts);
  return q;
}

Linear Linear::load(const ParamSource& src, const std::string& path, int64_t in, int64_t out, bool bias,
                    const std::optional<QuantSpec>& spec, const LoadOptions& opts) {
  std::optional<at::Tensor> b;
  if (bias) b = place(src.get(path + ".bias", {out}), opts);
  if (src.contains(path + ".scales")) {
    HEARTH_CHECK(spec.has_value(), path, ": has .scales but config.json's quantization block does not quantize it");
    return Linear(load_quantized(src, path, in, out, *spec, opts), std::move(b));
  }
  return Linear(place(src.get(path + ".weight", {out, in}), opts), std::move(b));
}

at::Tensor Linear::forward(const at::Tensor& x) const {
  if (!bias_ && !adapters_.empty()) {  // one row, an active adapter: its term in the GEMV's epilogue
    std::vector<at::Tensor> ys = lora_epilogue_products(x, {this}, {gemv_operand(*this)});
    if (!ys.empty()) return ys[0];
  }
  at::Tensor y;
  // CUDA, decode-sized (nn/decode_gemv.h). Not with a bias: addmm adds it before its one rounding,
  // and adding it to the rounded product drifted the greedy tokens of the bias parity model.
  std::vector<at::Tensor> gemv;
  if (!qweight_ && !bias_ && gemv_rows(x) <= dense_gemv_max_rows()) gemv = decode_gemv(x, {GemvOperand{weight_, nullptr}});
  if (qweight_) {
    y = quantized_matmul(x, *qweight_);
    if (bias_) y = y + *bias_;
  } else if (!gemv.empty()) {
    y = gemv[0];
  } else if (at::Tensor fast = cpu::linear(x, weight_); fast.defined()) {
    y = bias_ ? fast + *bias_ : fast;  // CPU fp32, prefill-sized (nn/cpu_gemm.h)
  } else {
    y = bias_ ? at::linear(x, weight_, *bias_) : at::linear(x, weight_);
  }
  return add_adapters(x, std::move(y));
}

at::Tensor Linear::add_adapters(const at::Tensor& x, at::Tensor y) const {
  if (adapters_.empty()) return y;
  // The two products through nn/cpu_gemm.h where it applies (CPU fp32 inference), as the base
  // product: at::linear's OpenBLAS pool spinning beside ATen's OpenMP pool made a 64-token prefill
  // of the starter with its rank-32 adapter 5× slower than without (2,630 → 485 tok/s).
  auto lin = [](const at::Tensor& a, const at::Tensor& w) {
    at::Tensor f = cpu::linear(a, w);
    return f.defined() ? f : at::linear(a, w);
  };
  auto delta = [&](const LoraAdapter& ad, const at::Tensor& in) {
    at::Tensor xin = lora_dropout(in, ad.dropout);
    if (xin.scalar_type() != ad.a.scalar_type()) xin = xin.to(ad.a.scalar_type());
    at::Tensor z = lin(lin(xin, ad.a), ad.b) * ad.scale;
    return z.scalar_type() == y.scalar_type() ? z : z.to(y.scalar_type());
  };
  if (t_rows_on) return add_row_adapters(x, y, delta);
  for (const std::string& id : t_active) {
    const LoraAdapter* ad = find_adapter(id);
    if (!ad) continue;
    if (lora_addmm_applies(*ad, x, y)) {
      // Inference on CUDA with the fused kernels on: x·Aᵀ, then y + scale·(x·Aᵀ)·Bᵀ as one addmm
      // (one rounding) — two launches where PEFT's op order takes four (·Aᵀ, ·Bᵀ, ·scale, + y).
      const at::Tensor y2 = y.reshape({-1, y.size(-1)});
      const at::Tensor h = at::mm(x.reshape({-1, x.size(-1)}), ad->a.t());
      y = at::addmm(y2, h, ad->b.t(), 1.0, ad->scale).view(y.sizes());
      continue;
    }
    y = y + delta(*ad, x);
  }
  return y;
}


std::vector<at::Tensor> Linear::forward_many(const at::Tensor& x, std::initializer_list<const Linear*> ls) {
  // The base products in one launch when every weight qualifies (no bias, one format); each
  // Linear's adapters are then added to its own product exactly as forward() adds them.
  std::vector<GemvOperand> ops;
  bool grouped = ls.size() > 1 && ls.size() <= 3;
  for (const Linear* l : ls) {
    if (!grouped || l->bias_) {
      grouped = false;
      break;
    }
    ops.push_back(l->qweight_ ? GemvOperand{{}, &*l->qweight_} : GemvOperand{l->weight_, nullptr});
  }
  if (grouped && !ops[0].quant && gemv_rows(x) > dense_gemv_max_rows()) grouped = false;  // cuBLAS (decode_gemv.h)
  std::vector<at::Tensor> ys;
  if (grouped) {
    ys = lora_epilogue_products(x, ls, ops);  // adapters inside the launch (one row)
    if (!ys.empty()) return ys;
    ys = decode_gemv(x, ops);
  }
  if (ys.empty()) {
    ys.reserve(ls.size());
    for (const Linear* l : ls) ys.push_back(l->forward(x));
    return ys;
  }
  size_t i = 0;
  for (const Linear* l : ls) {
    ys[i] = l->add_adapters(x, std::move(ys[i]));
    ++i;
  }
  return ys;
}

Linear::NormedProducts Linear::forward_many_normed(const NormedInput& in, std::initializer_list<const Linear*> ls) {
  HEARTH_CHECK(in.norm != nullptr && ls.size() >= 1 && ls.size() <= 3,
               "Linear::forward_many_normed: needs a norm and 1 to 3 Linears");
  std::vector<GemvOperand> ops;
  bool fused = gemv_norm_enabled();
  int64_t rows = 0;
  for (const Linear* l : ls) {
    rows += l->out_features();
    if (l->bias_) fused = false;
    ops.push_back(l->qweight_ ? GemvOperand{{}, &*l->qweight_} : GemvOperand{l->weight_, nullptr});
  }
  if (fused && !ops[0].quant && gemv_rows(in.x) > dense_gemv_max_rows()) fused = false;  // cuBLAS (decode_gemv.h)
  if (fused) {
    // Active adapters (one row): the norm goes into the small x·Aᵀ launch, whatever the base rows,
    // and the base products take B·h in their epilogue.
    const std::vector<const LoraAdapter*> ads = epilogue_adapters(in.x, ls);
    if (!ads.empty()) {
      NormedGemv g = decode_gemv_normed(in.x, in.residual, in.norm->weight(), in.norm->eps(), lora_a_operands(ads));
      if (!g.ys.empty()) {
        std::vector<at::Tensor> ys = gemv_with_lora(g.normed, ops, ads, g.ys);
        if (ys.empty()) ys = forward_many(g.normed, ls);
        return {std::move(g.sum), std::move(g.normed), std::move(ys)};
      }
    }
  }
  if (rows > gemv_norm_max_rows()) fused = false;  // the norm once per 8 rows costs more than its launch
  if (fused) {
    NormedGemv g = decode_gemv_normed(in.x, in.residual, in.norm->weight(), in.norm->eps(), ops);
    if (!g.ys.empty()) {
      size_t i = 0;
      for (const Linear* l : ls) {
        g.ys[i] = l->add_adapters(g.normed, std::move(g.ys[i]));
        ++i;
      }
      return {std::move(g.sum), std::move(g.normed), std::move(g.ys)};
    }
  }
  NormedProducts r;
  if (in.residual.defined()) std::tie(r.sum, r.normed) = in.norm->forward_add(in.x, in.residual);
  else r.sum = in.x, r.normed = in.norm->forward(in.x);
  r.ys = forward_many(r.normed, ls);
  return r;
}

at::Tensor Linear::add_row_adapters(const at::Tensor& x, at::Tensor y,
                                    const std::function<at::Tensor(const LoraAdapter&, const at::Tensor&)>& delta) const {
  const int64_t B = x.size(0);
  HEARTH_CHECK(static_cast<int64_t>(t_rows.size()) == B, "Linear: RowAdapters names ", t_rows.size(),
               " rows for a batch of ", B);
  // Depth d = the d-th adapter of a row's selection, so each row adds its adapters in its own order.
  size_t depth = 0;
  for (const auto& r : t_rows) depth = std::max(depth, r.size());
  for (size_t d = 0; d < depth; ++d) {
    for (const auto& [id, ad] : adapters_) {
      std::vector<int64_t> rows;
      for (int64_t b = 0; b < B; ++b)
        if (t_rows[b].size() > d && t_rows[b][d] == id) rows.push_back(b);
      if (rows.empty()) continue;
      if (static_cast<int64_t>(rows.size()) == B) {
        y = y + delta(ad, x);
        continue;
      }
      at::Tensor idx = at::tensor(rows, at::kLong).to(x.device());
      at::Tensor part = y.index_select(0, idx) + delta(ad, x.index_select(0, idx));
      y = y.index_copy(0, idx, part);
    }
  }
  return y;
}

int64_t Linear::in_features() const { return qweight_ ? qweight_->in_features() : weight_.size(1); }
int64_t Linear::out_features() const { return qweight_ ? qweight_->out_features() : weight_.size(0); }

const at::Tensor& Linear::weight() const {
  HEARTH_CHECK(!qweight_, "Linear::weight: the weight is quantized; use dequantized_weight()");
  return weight_;
}

at::Tensor Linear::dequantized_weight() const { return qweight_ ? dequantize(*qweight_) : weight_; }

void Linear::add_adapter(const std::string& id, LoraAdapter adapter) {
  HEARTH_CHECK(adapter.a.dim() == 2 && adapter.b.dim() == 2 && adapter.a.size(1) == in_features() &&
                   adapter.b.size(0) == out_features() && adapter.a.size(0) == adapter.b.size(1),
               "Linear::add_adapter: adapter '", id, "' A ", shape_str(adapter.a.sizes()), " / B ",
               shape_str(adapter.b.sizes()), " do not fit a [", out_features(), ", ", in_features(), "] linear");
  HEARTH_CHECK(!find_adapter(id), "Linear::add_adapter: adapter '", id, "' is already mounted");
  adapters_.emplace_back(id, std::move(adapter));
}

bool Linear::remove_adapter(const std::string& id) {
  auto it = std::find_if(adapters_.begin(), adapters_.end(), [&](const auto& p) { return p.first == id; });
  if (it == adapters_.end()) return false;
  adapters_.erase(it);
  return true;
}

const LoraAdapter* Linear::find_adapter(const std::string& id) const {
  for (const auto& [name, ad] : adapters_)
    if (name == id) return &ad;
  return nullptr;
}

int64_t Linear::nbytes() const {
  int64_t n = bias_ ? bias_->nbytes() : 0;
  if (qweight_) return n + qweight_->wq.nbytes() + qweight_->scales.nbytes() + qweight_->biases.nbytes();
  return n + weight_.nbytes();
}

}  // namespace hearth::nn
