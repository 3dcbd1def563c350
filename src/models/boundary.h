// Boundary: what one range of decoder layers hands the next — the hidden stream plus the named
// streams a family carries across layers. The currency of Model::forward_layers and of the
// segmented backward (train/segmented.h). Not a cache: nothing here outlives one forward.
#pragma once
#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

namespace hearth::models {

/// What passes between layer ranges [begin, end): the hidden stream and the named streams a
/// family carries across layers (Gemma 4: the per-layer inputs and the KV-sharing donors' K/V).
/// forward_layers returns every stream it was given (the same tensor when it did not change it)
/// plus those its layers created, so a segmented backward can treat all of them alike: keep each
/// at segment edges, take a cotangent for every floating one (train/segmented.h).
struct Boundary {
  at::Tensor hidden;  // [B, T, C]
  std::vector<std::pair<std::string, at::Tensor>> streams;

  Boundary() = default;
  explicit Boundary(at::Tensor h) : hidden(std::move(h)) {}
  /// The stream called `name`, or nullptr.
  const at::Tensor* find(const std::string& name) const {
    for (const auto& [n, t] : streams)
      if (n == name) return &t;
    return nullptr;
  }
  /// Sets (adds or replaces) the stream called `name`.
  void set(const std::string& name, at::Tensor t) {
    for (auto& [n, old] : streams)
      if (n == name) {
        old = std::move(t);
        return;
      }
    streams.emplace_back(name, std::move(t));
  }
};

}  // namespace hearth::models
