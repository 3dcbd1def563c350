// tokenizer_config.json's tokenizer_class as transformers 5 applies it (tokenizer_class.h).
// Not the loading of the pipeline (tokenizer.cpp).
#include "tokenizer/tokenizer_class.h"

namespace hearth::tokenizer {

using nlohmann::json;

void apply_tokenizer_class(json& tok, json& cfg, const jf::At& at) {
  if (!cfg.is_object() || !tok.is_object()) return;
  const std::string cls = jf::opt_str(cfg, "tokenizer_class", "", at);
  if (cls != "LlamaTokenizer" && cls != "LlamaTokenizerFast") return;
  const bool prefix = jf::opt_bool(cfg, "add_prefix_space", true, at);
  const bool legacy = jf::opt_bool(cfg, "legacy", false, at);
  const char* scheme = !prefix ? "never" : legacy ? "always" : "first";  // transformers' _get_prepend_scheme
  tok["normalizer"] = nullptr;
  tok["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", scheme}, {"split", false}};
  json decoders = json::array({{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                               {{"type", "ByteFallback"}},
                               {{"type", "Fuse"}}});
  if (prefix) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  tok["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};
  if (tok.contains("model") && tok["model"].is_object()) {
    tok["model"]["byte_fallback"] = true;
    tok["model"]["fuse_unk"] = true;
    tok["model"]["dropout"] = nullptr;
  }
  // The post-processor comes from the config (update_post_processor): BOS/EOS per add_*_token.
  tok["post_processor"] = nullptr;
  if (!cfg.contains("add_bos_token") || cfg["add_bos_token"].is_null()) cfg["add_bos_token"] = true;
  if (!cfg.contains("bos_token")) cfg["bos_token"] = "<s>";
  if (!cfg.contains("eos_token")) cfg["eos_token"] = "</s>";
}

}  // namespace hearth::tokenizer
