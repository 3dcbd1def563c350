// Loading a model folder whose safetensors dtypes lie about float data: integer dtypes are read only
// as MLX packed weights; anywhere else a one-line error names the file and tensor (before: a norm or
// embedding stored as I32 was converted numerically into garbage with exit 0, and a linear weight
// failed inside torch naming no file).
#include <gtest/gtest.h>

#include "../io/io_test_util.h"
#include "../test_util.h"
#include "io/safetensors.h"
#include "models/registry.h"
#include "random_llama.h"

namespace {
namespace fs = std::filesystem;
using hearth::testing::error_of;
using hearth::testing::tiny_llama_config;

// A tiny llama folder whose tensor `name` is replaced by `t`, stored as `stored` (e.g. U32 for kInt).
fs::path write_model(const hearth::testing::TempDir& d, const std::string& name, const at::Tensor& t,
                     std::optional<hearth::io::DType> stored = std::nullopt) {
  const nlohmann::json config = tiny_llama_config();
  auto cfg = hearth::models::llama::LlamaConfig::from_json(config, "config.json");
  auto w = hearth::testing::random_llama_weights(cfg);
  if (!name.empty()) w[name] = t;
  std::map<std::string, hearth::io::DType> dtypes;
  if (stored) dtypes[name] = *stored;
  hearth::io::save_safetensors(d / "model.safetensors", w, {{"format", "pt"}}, dtypes);
  hearth::io::write_file_atomic(d / "config.json", config.dump());
  return d.path();
}

}  // namespace

TEST(ModelLoad, IntegerDtypesOutsidePackedWeightsAreRefused) {
  auto cfg = hearth::models::llama::LlamaConfig::from_json(tiny_llama_config(), "c");
  const int64_t C = cfg.hidden_size;
  struct Case {
    std::string name;
    at::Tensor t;
    std::optional<hearth::io::DType> stored;
    std::string dtype;
  };
  const Case cases[] = {
      {"model.norm.weight", at::ones({C}, at::kInt), std::nullopt, "I32"},
      {"model.embed_tokens.weight", at::ones({cfg.vocab_size, C}, at::kInt), hearth::io::DType::U32, "U32"},
      {"model.layers.0.self_attn.q_proj.weight", at::ones({cfg.num_attention_heads * cfg.head_dim, C}, at::kInt),
       std::nullopt, "I32"},
      {"model.layers.1.input_layernorm.weight", at::ones({C}, at::kBool), std::nullopt, "BOOL"},
  };
  for (const auto& c : cases) {
    hearth::testing::TempDir d;
    const fs::path dir = write_model(d, c.name, c.t, c.stored);
    const std::string msg = error_of([&] { hearth::models::load_model(dir, {}); });
    EXPECT_EQ(msg, (dir / "model.safetensors").string() + ": tensor " + c.name + " is stored as " + c.dtype +
                       ", not a floating-point type; integer dtypes are only read as MLX packed weights (a .weight "
                       "beside .scales)")
        << c.name;
  }
  // The same folder with float weights loads.
  hearth::testing::TempDir d;
  EXPECT_NO_THROW(hearth::models::load_model(write_model(d, "", {}), {}));
}

TEST(ModelLoad, InMemorySourcesCheckDtypesToo) {
  auto cfg = hearth::models::llama::LlamaConfig::from_json(tiny_llama_config(), "c");
  auto w = hearth::testing::random_llama_weights(cfg);
  w["model.norm.weight"] = at::ones({cfg.hidden_size}, at::kLong);
  hearth::nn::TensorMapSource src(w, "mem");
  EXPECT_EQ(error_of([&] { hearth::models::llama::LlamaModel(cfg, src, std::nullopt, {}); }),
            "mem: tensor model.norm.weight is stored as Long, not a floating-point type; integer dtypes are only read "
            "as MLX packed weights (a .weight beside .scales)");
}
