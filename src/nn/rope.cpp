// RoPE parameter parsing, inv_freq per scaling type and cos/sin tables; a port of transformers'
// modeling_rope_utils.py (op for op, in float32, so tables match bit for bit where torch does).
#include "nn/rope.h"

#include <cmath>

#include "core/error.h"
#include "nn/fused_ops.h"
#include "nn/lean_grad.h"

namespace hearth::nn {

namespace {

using nlohmann::json;

// An optional number at `where`.`key`: absent or null -> nullopt; another JSON type, NaN or
// infinity -> hearth::Error naming the field (never nlohmann's type_error text).
std::optional<double> opt_num(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  HEARTH_CHECK(it->is_number() && std::isfinite(it->get<double>()), where, ": '", key, "' must be a number, got ",
               it->dump());
  return it->get<double>();
}

// As opt_num, and the value must be > 0.
std::optional<double> opt_pos(const json& j, const char* key, const std::string& where) {
  auto v = opt_num(j, key, where);
  HEARTH_CHECK(!v || *v > 0, where, ": '", key, "' must be > 0, got ", j.at(key).dump());
  return v;
}

double req_num(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  HEARTH_CHECK(it != j.end() && !it->is_null(), where, ": missing required number '", key, "'");
  return *opt_num(j, key, where);
}

// 1.0 / x, as torch evaluates `scalar / tensor` (reciprocal, then multiply).
at::Tensor rdiv(double num, const at::Tensor& x) { return at::reciprocal(x) * num; }

// arange(0, dim, 2) as float32 / dim: the exponent of every RoPE base.
at::Tensor exponents(int64_t dim) {
  return at::arange(0, dim, 2, at::TensorOptions().dtype(at::kLong)).to(at::kFloat) / dim;
}

at::Tensor default_inv_freq(double base, int64_t dim) { return rdiv(1.0, at::pow(base, exponents(dim))); }

double yarn_get_mscale(double scale, double mscale) {
  if (scale <= 1) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace

RopeParams RopeParams::from_json(const json& config, const std::string& origin) {
  RopeParams p;
  json scaling;  // the per-type parameter object, whichever convention
  const std::string params_where = cat(origin, ": rope_parameters");
  if (auto it = config.find("rope_parameters"); it != config.end() && !it->is_null()) {
    HEARTH_CHECK(it->is_object(), params_where, " must be an object (or null), got ", it->type_name());
    scaling = *it;
    if (auto t = opt_pos(scaling, "rope_theta", params_where)) p.theta = *t;
    else if (auto t2 = opt_pos(config, "rope_theta", origin)) p.theta = *t2;
  } else {
    if (auto t = opt_pos(config, "rope_theta", origin)) p.theta = *t;
    if (auto it2 = config.find("rope_scaling"); it2 != config.end() && !it2->is_null()) {
      HEARTH_CHECK(it2->is_object(), origin, ": rope_scaling must be an object or null");
      scaling = *it2;
    }
  }
  if (auto f = opt_pos(config, "partial_rotary_factor", origin)) p.partial_rotary_factor = *f;
  HEARTH_CHECK(p.partial_rotary_factor <= 1, origin, ": 'partial_rotary_factor' must be in (0, 1], got ",
               p.partial_rotary_factor);
  if (scaling.is_null()) return p;

  const std::string where = cat(origin, ": ", config.contains("rope_parameters") ? "rope_parameters" : "rope_scaling");
  std::string type = "default";
  if (auto it = scaling.find("rope_type"); it != scaling.end() && it->is_string()) type = *it;
  else if (auto it2 = scaling.find("type"); it2 != scaling.end() && it2->is_string()) type = *it2;
  if (auto f = opt_pos(scaling, "partial_rotary_factor", where)) p.partial_rotary_factor = *f;
  HEARTH_CHECK(p.partial_rotary_factor <= 1, where, ": 'partial_rotary_factor' must be in (0, 1], got ",
               p.partial_rotary_factor);
  p.type = type;
  if (type == "default") return p;
  auto positions = [&](double v, const char* key) {
    HEARTH_CHECK(v >= 1 && v <= double(int64_t{1} << 40), where, ": '", key, "' must be a positive integer, got ", v);
    return static_cast<int64_t>(v);
  };
  if (type == "linear" || type == "dynamic") {
    p.factor = req_num(scaling, "factor", where);
  } else if (type == "llama3") {
    p.factor = req_num(scaling, "factor", where);
    p.low_freq_factor = req_num(scaling, "low_freq_factor", where);
    p.high_freq_factor = req_num(scaling, "high_freq_factor", where);
    HEARTH_CHECK(p.low_freq_factor > 0 && p.high_freq_factor > p.low_freq_factor, where,
                 ": needs 0 < low_freq_factor < high_freq_factor, got ", p.low_freq_factor, " and ", p.high_freq_factor);
    p.original_max_position_embeddings =
        positions(req_num(scaling, "original_max_position_embeddings", where), "original_max_position_embeddings");
  } else if (type == "yarn") {
    p.factor = req_num(scaling, "factor", where);
    if (auto v = opt_num(scaling, "original_max_position_embeddings", where))
      p.original_max_position_embeddings = positions(*v, "original_max_position_embeddings");
    p.attention_factor = opt_pos(scaling, "attention_factor", where);
    p.beta_fast = opt_num(scaling, "beta_fast", where);
    p.beta_slow = opt_num(scaling, "beta_slow", where);
    p.mscale = opt_num(scaling, "mscale", where);
    p.mscale_all_dim = opt_num(scaling, "mscale_all_dim", where);
    if (auto it = scaling.find("truncate"); it != scaling.end() && it->is_boolean()) p.truncate = *it;
  } else {
    throw Error(cat(where, ": unsupported rope type '", type,
                    "' (supported: default, linear, dynamic, llama3, yarn)"));
  }
  // transformers' _validate_*_rope_parameters warn when factor < 1 (a factor < 1 shrinks, not
  // extends, the context; near 0 it turns inv_freq into inf and the logits into NaN): refuse it.
  HEARTH_CHECK(p.factor >= 1, where, ": factor must be >= 1 (", type, " scaling extends the context), got ",
               scaling.at("factor").dump());
  return p;
}

RopeInit compute_rope_init(const RopeParams& p, int64_t dim, int64_t max_pos, std::optional<int64_t> seq_len) {
  HEARTH_CHECK(dim > 0 && dim % 2 == 0, "rope: rotary dim must be positive and even, got ", dim);
  if (p.type == "default") return {default_inv_freq(p.theta, dim), 1.0};
  if (p.type == "linear") {
    // transformers: inv_freq /= factor
    return {default_inv_freq(p.theta, dim) / p.factor, 1.0};
  }
  if (p.type == "dynamic") {
    if (!seq_len || *seq_len <= max_pos) {
      // Init time (seq_len = max_position_embeddings): the scaled base equals the base.
      double base = p.theta * std::pow((p.factor * max_pos / max_pos) - (p.factor - 1), double(dim) / (dim - 2));
      return {default_inv_freq(base, dim), 1.0};
    }
    // At run time transformers passes seq_len as an int64 tensor: the base math is float32.
    at::Tensor s = at::scalar_tensor(*seq_len, at::TensorOptions().dtype(at::kLong));
    at::Tensor base = at::pow((s * p.factor) / max_pos - (p.factor - 1), double(dim) / (dim - 2)) * p.theta;
    return {rdiv(1.0, at::pow(base, exponents(dim))), 1.0};
  }
  if (p.type == "llama3") {
    at::Tensor inv_freq = default_inv_freq(p.theta, dim);
    const double old_len = double(*p.original_max_position_embeddings);
    const double low_wavelen = old_len / p.low_freq_factor;
    const double high_wavelen = old_len / p.high_freq_factor;
    at::Tensor wavelen = rdiv(2 * M_PI, inv_freq);
    at::Tensor llama = at::where(wavelen > low_wavelen, inv_freq / p.factor, inv_freq);
    at::Tensor smooth = (rdiv(old_len, wavelen) - p.low_freq_factor) / (p.high_freq_factor - p.low_freq_factor);
    at::Tensor smoothed = (1 - smooth) * llama / p.factor + smooth * llama;
    at::Tensor medium = at::logical_not(wavelen < high_wavelen).logical_and(at::logical_not(wavelen > low_wavelen));
    return {at::where(medium, smoothed, llama), 1.0};
  }
  if (p.type == "yarn") {
    const double base = p.theta;
    const double factor = p.factor;
    const double orig = double(p.original_max_position_embeddings.value_or(max_pos));
    double attention = 0;
    if (p.attention_factor) attention = *p.attention_factor;
    else if (p.mscale && *p.mscale != 0 && p.mscale_all_dim && *p.mscale_all_dim != 0)
      attention = yarn_get_mscale(factor, *p.mscale) / yarn_get_mscale(factor, *p.mscale_all_dim);
    else attention = yarn_get_mscale(factor, 1.0);
    const double beta_fast = (p.beta_fast && *p.beta_fast != 0) ? *p.beta_fast : 32.0;
    const double beta_slow = (p.beta_slow && *p.beta_slow != 0) ? *p.beta_slow : 1.0;
    auto correction_dim = [&](double rotations) {
      return (dim * std::log(orig / (rotations * 2 * M_PI))) / (2 * std::log(base));
    };
    double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
    if (p.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, double(dim - 1));
    if (low == high) high += 0.001;  // transformers: prevent singularity
    at::Tensor pos_freqs = at::pow(base, exponents(dim));
    at::Tensor extrapolation = rdiv(1.0, pos_freqs);
    at::Tensor interpolation = rdiv(1.0, pos_freqs * factor);
    at::Tensor ramp = at::clamp((at::arange(dim / 2, at::TensorOptions().dtype(at::kFloat)) - low) / (high - low), 0, 1);
    at::Tensor extrapolation_factor = 1 - ramp;
    at::Tensor inv_freq = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor;
    return {inv_freq, attention};
  }
  throw Error(cat("rope: unsupported rope type '", p.type, "'"));
}

RotaryEmbedding::RotaryEmbedding(RopeParams params, int64_t head_dim, int64_t max_pos, at::Device device)
    : params_(std::move(params)), max_pos_(max_pos), device_(device) {
  dim_ = static_cast<int64_t>(head_dim * params_.partial_rotary_factor);
  RopeInit init = compute_rope_init(params_, dim_, max_pos_);
  // Whatever the parameters, a table that is not finite would make every logit NaN.
  HEARTH_CHECK(std::isfinite(init.attention_scaling) && at::isfinite(init.inv_freq).all().item<bool>(),
               "rope: the ", params_.type, " parameters (theta ", params_.theta, ", factor ", params_.factor,
               ") give non-finite frequencies; check rope_parameters / rope_scaling in config.json");
  inv_freq_ = init.inv_freq.to(device_);
  original_inv_freq_ = inv_freq_;
  attention_scaling_ = init.attention_scaling;
  max_seq_len_cached_ = max_pos_;
}

std::pair<at::Tensor, at::Tensor> RotaryEmbedding::cos_sin(int64_t offset, int64_t T, at::ScalarType dtype) {
  if (params_.type == "dynamic") {
    // transformers' dynamic_frequency_update, with seq_len = max(position_ids) + 1.
    const int64_t seq_len = offset + T;
    if (seq_len > max_seq_len_cached_) {
      RopeInit init = compute_rope_init(params_, dim_, max_pos_, seq_len);
      inv_freq_ = init.inv_freq.to(device_);
      attention_scaling_ = init.attention_scaling;
      max_seq_len_cached_ = seq_len;
    }
    if (seq_len < max_pos_ && max_seq_len_cached_ > max_pos_) {
      inv_freq_ = original_inv_freq_;
      max_seq_len_cached_ = max_pos_;
    }
  }
  auto f32 = at::TensorOptions().dtype(at::kFloat).device(device_);
  at::Tensor pos = at::arange(offset, offset + T, f32);
  // freqs[t, i] = pos[t] * inv_freq[i]: one product, identical to transformers' K=1 matmul.
  at::Tensor freqs = pos.unsqueeze(1) * inv_freq_.unsqueeze(0);
  at::Tensor emb = at::cat({freqs, freqs}, -1);
  at::Tensor cos = emb.cos() * attention_scaling_;
  at::Tensor sin = emb.sin() * attention_scaling_;
  return {cos.to(dtype), sin.to(dtype)};
}

at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  at::Tensor x1 = x.narrow(-1, 0, half);
  at::Tensor x2 = x.narrow(-1, half, x.size(-1) - half);
  return at::cat({-x2, x1}, -1);
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  // CUDA inference: one kernel with the same roundings (nn/fused_ops.h), not seven launches.
  if (at::Tensor y = fused_rotary(x, cos, sin); y.defined()) return y;
  // While autograd records, the lean Function (nn/lean_grad.h): the same values, fewer temporaries.
  auto rotate = [&](const at::Tensor& xr) {
    return rotary_lean_applies(xr, cos, sin) ? rotary_lean(xr, cos, sin) : (xr * cos) + (rotate_half(xr) * sin);
  };
  const int64_t rot = cos.size(-1);
  if (rot == x.size(-1)) return rotate(x);
  at::Tensor x_rot = x.narrow(-1, 0, rot);
  at::Tensor x_pass = x.narrow(-1, rot, x.size(-1) - rot);
  return at::cat({rotate(x_rot), x_pass}, -1);
}

}  // namespace hearth::nn
