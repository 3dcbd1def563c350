// Tokenizer loading (tokenizer.json + tokenizer_config.json) and the encode/decode pipeline of
// HF tokenizers' TokenizerImpl: added tokens -> normalizer -> pre-tokenizer -> BPE -> post-processor.
// Not the components themselves (one file each) and not the streaming decoder (stream_decoder.cpp).
#include "tokenizer/tokenizer.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_nesting.h"
#include "core/printable.h"
#include "io/hf_config.h"
#include "io/read_file.h"
#include "tokenizer/added_vocab.h"
#include "tokenizer/decoders.h"
#include "tokenizer/model_bpe.h"
#include "tokenizer/normalizers.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizers.h"
#include "tokenizer/tokenizer_class.h"
#include "tokenizer/unicode.h"

namespace hearth::tokenizer {

using nlohmann::json;

struct Tokenizer::Impl {
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<Decoder> decoder;
  AddedVocab added;
  std::string bos_token, eos_token, chat_template;
  std::optional<int64_t> model_max_length;
};

namespace {

json parse_json(std::string_view text, const std::string& origin) {
  check_json_nesting(text, origin);
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {  // parse_error, and out_of_range for number overflow
    throw Error(cat(origin, ": invalid JSON: ", io::json_error_text(e)));
  }
}

// A config token field: "text", {"content": "text", ...}, or null/absent.
std::string config_token(const json& cfg, const char* key, const jf::At& at) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) return jf::str(jf::need(*it, "content", at / key), at / key / "content");
  (at / key).fail("expected a string or {\"content\": ...}");
}

void apply_config(Tokenizer::Impl& impl, const json& cfg, const jf::At& at, const std::string& jinja) {
  if (!cfg.is_null()) {
    if (!cfg.is_object()) at.fail("expected an object");
    impl.bos_token = config_token(cfg, "bos_token", at);
    impl.eos_token = config_token(cfg, "eos_token", at);
    // An EOS the vocabulary lacks can never be generated, so generation would never stop on it
    // (transformers would append it as a new id past the model's embedding): refuse the file.
    if (!impl.eos_token.empty() && !impl.added.token_to_id(impl.eos_token) && !impl.model->token_to_id(impl.eos_token))
      (at / "eos_token")
          .fail(cat("token '", printable(impl.eos_token, 100),
                    "' is not in the vocabulary (tokenizer.json), so generation could never stop on it"));
    if (auto it = cfg.find("chat_template"); it != cfg.end() && !it->is_null()) {
      jf::At ca = at / "chat_template";
      if (it->is_string()) {
        impl.chat_template = it->get<std::string>();
      } else if (it->is_array()) {
        for (size_t i = 0; i < it->size(); ++i) {
          const auto& e = (*it)[i];
          if (jf::str(jf::need(e, "name", ca[i]), ca[i] / "name") == "default")
            impl.chat_template = jf::str(jf::need(e, "template", ca[i]), ca[i] / "template");
        }
      } else {
        ca.fail("expected a string or a list of {name, template}");
      }
    }
    if (auto it = cfg.find("model_max_length"); it != cfg.end() && it->is_number_integer())
      impl.model_max_length = it->get<int64_t>();
    // Llama-2 style configs: BOS/EOS come from the config when tokenizer.json has no post-processor.
    if (!impl.post_processor) {
      std::vector<int32_t> prefix, suffix;
      auto id_of = [&](const std::string& tok, const char* field) {
        auto id = impl.added.token_to_id(tok);
        if (!id) id = impl.model->token_to_id(tok);
        if (!id) (at / field).fail(cat("token '", tok, "' is not in the vocabulary"));
        return *id;
      };
      if (jf::opt_bool(cfg, "add_bos_token", false, at) && !impl.bos_token.empty())
        prefix.push_back(id_of(impl.bos_token, "bos_token"));
      if (jf::opt_bool(cfg, "add_eos_token", false, at) && !impl.eos_token.empty())
        suffix.push_back(id_of(impl.eos_token, "eos_token"));
      if (!prefix.empty() || !suffix.empty()) impl.post_processor = make_affix_processor(prefix, suffix);
    }
  }
  if (!jinja.empty()) impl.chat_template = jinja;
}

std::shared_ptr<Tokenizer::Impl> load_unguarded(const json& j, const std::string& origin) {
  jf::At at{origin, ""};
  if (!j.is_object()) at.fail("expected a JSON object");
  auto impl = std::make_shared<Tokenizer::Impl>();

  const json& model = jf::need(j, "model", at);
  jf::At ma = at / "model";
  if (!model.is_object()) ma.fail("expected an object");
  std::string type = model.contains("type") ? jf::str(model["type"], ma / "type") : "BPE";
  if (type != "BPE") (ma / "type").fail(cat("unsupported model type '", type, "' (only BPE is implemented)"));
  impl->model = BpeModel::from_json(model, ma);

  auto present = [&](const char* key) { return j.contains(key) && !j[key].is_null(); };
  if (present("normalizer")) impl->normalizer = make_normalizer(j["normalizer"], at / "normalizer");
  if (present("pre_tokenizer")) impl->pre_tokenizer = make_pre_tokenizer(j["pre_tokenizer"], at / "pre_tokenizer");
  if (present("post_processor")) impl->post_processor = make_post_processor(j["post_processor"], at / "post_processor");
  if (present("decoder")) impl->decoder = make_decoder(j["decoder"], at / "decoder");

  if (present("added_tokens")) {
    const json& arr = j["added_tokens"];
    jf::At aa = at / "added_tokens";
    if (!arr.is_array()) aa.fail("expected an array");
    std::vector<AddedToken> tokens;
    for (size_t i = 0; i < arr.size(); ++i) {
      const json& e = arr[i];
      jf::At ea = aa[i];
      AddedToken t;
      t.content = jf::str(jf::need(e, "content", ea), ea / "content");
      if (!unicode::is_valid_utf8(t.content)) (ea / "content").fail("invalid UTF-8");
      t.special = jf::opt_bool(e, "special", false, ea);
      t.single_word = jf::opt_bool(e, "single_word", false, ea);
      t.lstrip = jf::opt_bool(e, "lstrip", false, ea);
      t.rstrip = jf::opt_bool(e, "rstrip", false, ea);
      t.normalized = jf::opt_bool(e, "normalized", !t.special, ea);
      if (e.contains("id")) jf::token_id(e["id"], ea / "id");
      tokens.push_back(std::move(t));
    }
    impl->added.add(tokens, *impl->model, impl->normalizer.get());
  }
  return impl;
}

// Any JSON access error that slipped past the field checks still becomes a one-line hearth::Error.
// tokenizer.json text + parsed config (null when none) → the pipeline, with the config's
// tokenizer_class applied first as transformers 5 applies it (tokenizer_class.h).
std::shared_ptr<Tokenizer::Impl> load(std::string_view text, const std::string& origin, json cfg,
                                      const std::string& config_origin, const std::string& jinja) {
  try {
    json j = parse_json(text, origin);
    const jf::At cat_at{config_origin, ""};
    apply_tokenizer_class(j, cfg, cat_at);
    auto impl = load_unguarded(j, origin);
    apply_config(*impl, cfg, cat_at, jinja);
    return impl;
  } catch (const json::exception& e) {
    throw Error(cat(origin, ": ", io::json_error_text(e)));
  }
}

}  // namespace

Tokenizer Tokenizer::from_json_text(std::string_view tokenizer_json_text, const std::string& origin,
                                    std::string_view config_text, const std::string& config_origin) {
  const std::string co = config_origin.empty() ? "tokenizer_config.json" : config_origin;
  json cfg = config_text.empty() ? json() : parse_json(config_text, co);
  Tokenizer t;
  t.impl_ = load(tokenizer_json_text, origin, std::move(cfg), co, "");
  return t;
}

Tokenizer Tokenizer::from_files(const std::filesystem::path& tokenizer_json,
                                const std::filesystem::path& tokenizer_config_json) {
  const std::string text = io::read_file(tokenizer_json, io::FileKind::kTokenizer);
  std::string jinja;
  std::filesystem::path jinja_path =
      (tokenizer_config_json.empty() ? tokenizer_json : tokenizer_config_json).parent_path() / "chat_template.jinja";
  if (io::entry_exists(jinja_path)) jinja = io::read_file(jinja_path, io::FileKind::kText);
  json cfg;
  if (!tokenizer_config_json.empty())
    cfg = parse_json(io::read_file(tokenizer_config_json, io::FileKind::kConfig), tokenizer_config_json.string());
  Tokenizer t;
  t.impl_ = load(text, tokenizer_json.string(), std::move(cfg), tokenizer_config_json.string(), jinja);
  return t;
}

Tokenizer Tokenizer::from_dir(const std::filesystem::path& dir) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(dir, ec);
  HEARTH_CHECK_T(NotFound, std::filesystem::exists(st), dir.string(), ": model folder not found");
  HEARTH_CHECK_T(InvalidArgument, std::filesystem::is_directory(st), dir.string(),
                 ": is a file, not a model folder (give the folder that holds tokenizer.json)");
  std::filesystem::path cfg = dir / "tokenizer_config.json";
  return from_files(dir / "tokenizer.json", io::entry_exists(cfg) ? cfg : std::filesystem::path{});
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& m = *impl_;
  std::string valid = unicode::to_valid_utf8(text);
  std::vector<Piece> pieces = m.added.extract_and_normalize(valid, m.normalizer.get());
  if (m.pre_tokenizer) m.pre_tokenizer->pre_tokenize(pieces);
  std::vector<int32_t> ids;
  ids.reserve(valid.size() / 3 + 4);
  for (const auto& p : pieces) {
    if (p.added_id >= 0) ids.push_back(p.added_id);
    else m.model->tokenize(p.text, ids);
  }
  if (m.post_processor) return m.post_processor->process(std::move(ids), add_special_tokens);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  return unicode::to_valid_utf8(decode_impl(ids, skip_special_tokens, /*raw=*/false));
}

std::string Tokenizer::decode_bytes(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  return decode_impl(ids, skip_special_tokens, /*raw=*/true);
}

std::string Tokenizer::continuation_bytes(const std::vector<int32_t>& context, int32_t id) const {
  if (!context.empty()) {
    std::vector<int32_t> ids = context;
    ids.push_back(id);
    const std::string before = decode_bytes(context, false), after = decode_bytes(ids, false);
    if (after.compare(0, before.size(), before) == 0) return after.substr(before.size());
  }
  return decode_bytes({id}, false);
}

std::string Tokenizer::decode_impl(const std::vector<int32_t>& ids, bool skip_special_tokens, bool raw) const {
  const Impl& m = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    const std::string* t = m.added.id_to_token(id);
    if (!t) t = m.model->id_to_token(id);
    if (!t) continue;
    if (skip_special_tokens && m.added.is_special_token(*t)) continue;
    tokens.push_back(*t);
  }
  if (m.decoder) return m.decoder->decode(std::move(tokens), raw);
  std::string out;
  for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
  return out;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto id = impl_->added.token_to_id(token)) return id;
  return impl_->model->token_to_id(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  const std::string* t = impl_->added.id_to_token(id);
  if (!t) t = impl_->model->id_to_token(id);
  return t ? *t : std::string();
}

int32_t Tokenizer::vocab_size() const { return std::max(impl_->model->max_id(), impl_->added.max_id()) + 1; }

std::optional<int32_t> Tokenizer::bos_id() const {
  return impl_->bos_token.empty() ? std::nullopt : token_to_id(impl_->bos_token);
}
std::optional<int32_t> Tokenizer::eos_id() const {
  return impl_->eos_token.empty() ? std::nullopt : token_to_id(impl_->eos_token);
}

bool Tokenizer::is_special(int32_t id) const {
  auto it = impl_->added.tokens().find(id);
  return it != impl_->added.tokens().end() && it->second.special;
}

const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }
std::string Tokenizer::bos_token() const { return impl_->bos_token; }
std::string Tokenizer::eos_token() const { return impl_->eos_token; }
std::optional<int64_t> Tokenizer::model_max_length() const { return impl_->model_max_length; }

}  // namespace hearth::tokenizer
