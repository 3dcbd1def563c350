// The model's longest context from config.json (vLLM's derivation: plain, text_config, RoPE
// scaling types, per-layer-type rope_parameters, Gemma) and ModelEngine's start-up refusal of a
// --context-length above it unless allowed. Not the request-level context checks (server_test).
#include <gtest/gtest.h>

#include <cstdlib>

#include "../adapters/lora_test_util.h"
#include "core/error.h"
#include "server/context_limit.h"
#include "server/model_engine.h"

namespace hearth::server {
namespace {

using CJ = nlohmann::json;

TEST(ContextLimit, PlainMaxPositionEmbeddingsAndTextConfig) {
  EXPECT_EQ(derive_context_limit(CJ{{"max_position_embeddings", 2048}}).tokens, 2048);
  EXPECT_EQ(derive_context_limit(CJ{{"max_position_embeddings", 2048}}).explanation, "max_position_embeddings 2048");
  EXPECT_EQ(derive_context_limit(CJ{{"text_config", {{"max_position_embeddings", 8192}}}, {"max_position_embeddings", 99}})
                .tokens,
            8192);
  // The smallest of the keys vLLM reads.
  EXPECT_EQ(derive_context_limit(CJ{{"max_position_embeddings", 4096}, {"seq_length", 2048}}).tokens, 2048);
  EXPECT_EQ(derive_context_limit(CJ{{"hidden_size", 64}}).tokens, 0);  // unknown: no check
  EXPECT_EQ(derive_context_limit(CJ{{"max_position_embeddings", "lots"}}).tokens, 0);
}

TEST(ContextLimit, RopeScalingTypesFollowVllm) {
  auto with = [](CJ rope, const char* key = "rope_scaling") {
    return derive_context_limit(CJ{{"max_position_embeddings", 4096}, {key, std::move(rope)}});
  };
  EXPECT_EQ(with({{"rope_type", "linear"}, {"factor", 2.0}}).tokens, 8192);
  EXPECT_EQ(with({{"type", "dynamic"}, {"factor", 4.0}}).tokens, 16384);
  const ContextLimit yarn = with({{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}});
  EXPECT_EQ(yarn.tokens, 131072);
  EXPECT_NE(yarn.explanation.find("original_max_position_embeddings 32768 x factor 4"), std::string::npos) << yarn.explanation;
  // llama3 / longrope: max_position_embeddings is already the scaled length.
  EXPECT_EQ(with({{"rope_type", "llama3"}, {"factor", 8.0}, {"original_max_position_embeddings", 8192}}).tokens, 4096);
  EXPECT_EQ(with({{"rope_type", "longrope"}, {"factor", 32.0}}).tokens, 4096);
  EXPECT_EQ(with({{"rope_type", "default"}, {"rope_theta", 1e6}}, "rope_parameters").tokens, 4096);
  // Transformers 5.x: one object per layer type.
  EXPECT_EQ(with({{"full_attention", {{"rope_type", "linear"}, {"factor", 2.0}}},
                  {"sliding_attention", {{"rope_type", "default"}}}},
                 "rope_parameters")
                .tokens,
            8192);
  // Gemma: already scaled.
  EXPECT_EQ(derive_context_limit(CJ{{"model_type", "gemma3_text"},
                                    {"max_position_embeddings", 131072},
                                    {"rope_scaling", {{"rope_type", "linear"}, {"factor", 8.0}}}})
                .tokens,
            131072);
}

TEST(ContextLimit, ErrorNamesBothNumbersTheFlagAndTheOptIn) {
  const ContextLimit lim{2048, "max_position_embeddings 2048"};
  const std::string e = context_length_error(4096, lim, false);
  EXPECT_NE(e.find("4096"), std::string::npos) << e;
  EXPECT_NE(e.find("2048"), std::string::npos) << e;
  EXPECT_NE(e.find("--context-length"), std::string::npos) << e;
  EXPECT_NE(e.find("--allow-long-context"), std::string::npos) << e;
  EXPECT_NE(e.find("HEARTH_ALLOW_LONG_CONTEXT=1"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos);
  EXPECT_EQ(context_length_error(4096, lim, true), "");
  EXPECT_EQ(context_length_error(2048, lim, false), "");
  EXPECT_EQ(context_length_error(0, lim, false), "");
  EXPECT_EQ(context_length_error(4096, ContextLimit{}, false), "");
}

ModelEngineOptions context_options(int64_t context) {
  ModelEngineOptions o;
  o.model_dir = hearth::testing::golden_model("llama_mha");  // max_position_embeddings 256
  o.device = "cpu";
  o.dtype = "float32";
  o.context_length = context;
  return o;
}

TEST(ContextLimit, ModelEngineRefusesALongerContextUnlessAllowed) {
  ::unsetenv("HEARTH_ALLOW_LONG_CONTEXT");
  try {
    ModelEngine e(context_options(4096));
    ADD_FAILURE() << "a context of 4096 on a 256-position model was accepted";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("4096"), std::string::npos) << m;
    EXPECT_NE(m.find("max_position_embeddings 256"), std::string::npos) << m;
    EXPECT_NE(m.find("--context-length"), std::string::npos) << m;
  }
  EXPECT_EQ(ModelEngine(context_options(256)).context_length(), 256);
  EXPECT_EQ(ModelEngine(context_options(0)).context_length(), 256);
  ModelEngineOptions allowed = context_options(4096);
  allowed.allow_long_context = true;
  EXPECT_EQ(ModelEngine(allowed).context_length(), 4096);
  ::setenv("HEARTH_ALLOW_LONG_CONTEXT", "1", 1);
  EXPECT_EQ(ModelEngine(context_options(1024)).context_length(), 1024);
  ::unsetenv("HEARTH_ALLOW_LONG_CONTEXT");
}

}  // namespace
}  // namespace hearth::server
