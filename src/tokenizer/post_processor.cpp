// Post-processors ported from HF tokenizers (processors/template.rs, bert.rs, roberta.rs,
// sequence.rs), single-sequence only. Not the decoders.
#include "tokenizer/post_processor.h"

#include <map>
#include <string>

namespace hearth::tokenizer {
namespace {

// One item of a template: special-token ids (placed with add_special_tokens) or the sequence.
struct Item {
  bool is_sequence;
  std::vector<int32_t> ids;
};

class ItemsProcessor : public PostProcessor {
 public:
  explicit ItemsProcessor(std::vector<Item> items) : items_(std::move(items)) {}
  std::vector<int32_t> process(std::vector<int32_t> ids, bool add_special_tokens) const override {
    std::vector<int32_t> out;
    out.reserve(ids.size() + 4);
    for (const auto& it : items_) {
      if (it.is_sequence) out.insert(out.end(), ids.begin(), ids.end());
      else if (add_special_tokens) out.insert(out.end(), it.ids.begin(), it.ids.end());
    }
    return out;
  }

 private:
  std::vector<Item> items_;
};

class Identity : public PostProcessor {
 public:
  std::vector<int32_t> process(std::vector<int32_t> ids, bool) const override { return ids; }
};

class SequencePP : public PostProcessor {
 public:
  explicit SequencePP(std::vector<std::unique_ptr<PostProcessor>> parts) : parts_(std::move(parts)) {}
  std::vector<int32_t> process(std::vector<int32_t> ids, bool add) const override {
    for (const auto& p : parts_) ids = p->process(std::move(ids), add);
    return ids;
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> parts_;
};

// Template piece parsing: {"SpecialToken": {"id": "<s>"}} / {"Sequence": {"id": "A"}}, or the
// string shorthand "<s>" / "$A" / "$0" / "$B" / "<s>:1" / "$A:1".
std::unique_ptr<PostProcessor> make_template(const nlohmann::json& j, const jf::At& at) {
  std::map<std::string, std::vector<int32_t>> specials;
  if (auto it = j.find("special_tokens"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) (at / "special_tokens").fail("expected an object");
    for (auto s = it->begin(); s != it->end(); ++s) {
      jf::At sa = at / "special_tokens" / s.key();
      const auto& ids = jf::need(s.value(), "ids", sa);
      if (!ids.is_array()) (sa / "ids").fail("expected an array of ids");
      std::vector<int32_t> v;
      for (size_t i = 0; i < ids.size(); ++i) v.push_back(jf::token_id(ids[i], (sa / "ids")[i]));
      std::string key = s.value().contains("id") ? jf::str(s.value()["id"], sa / "id") : s.key();
      specials[key] = v;
    }
  }
  const auto& single = jf::need(j, "single", at);
  jf::At sa = at / "single";
  if (!single.is_array()) sa.fail("expected an array");
  std::vector<Item> items;
  for (size_t i = 0; i < single.size(); ++i) {
    const auto& p = single[i];
    jf::At pa = sa[i];
    std::string special;
    bool is_seq = false;
    if (p.is_string()) {
      std::string s = p.get<std::string>();
      if (auto colon = s.rfind(':'); colon != std::string::npos && colon > 0) s = s.substr(0, colon);
      if (!s.empty() && s[0] == '$') is_seq = true;
      else special = s;
    } else if (p.is_object() && p.contains("Sequence")) {
      is_seq = true;
    } else if (p.is_object() && p.contains("SpecialToken")) {
      special = jf::str(jf::need(p["SpecialToken"], "id", pa / "SpecialToken"), pa / "SpecialToken" / "id");
    } else {
      pa.fail("expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
    }
    if (is_seq) {
      items.push_back({true, {}});
    } else {
      auto it = specials.find(special);
      if (it == specials.end()) pa.fail(cat("special token '", special, "' is not in special_tokens"));
      items.push_back({false, it->second});
    }
  }
  return std::make_unique<ItemsProcessor>(std::move(items));
}

// Bert/Roberta: "sep"/"cls" are [token, id] pairs; single = cls A sep.
std::unique_ptr<PostProcessor> make_cls_sep(const nlohmann::json& j, const jf::At& at) {
  auto pair_id = [&](const char* key) {
    const auto& v = jf::need(j, key, at);
    if (!v.is_array() || v.size() != 2) (at / key).fail("expected [token, id]");
    return jf::token_id(v[1], (at / key)[1]);
  };
  int32_t cls = pair_id("cls"), sep = pair_id("sep");
  return std::make_unique<ItemsProcessor>(std::vector<Item>{{false, {cls}}, {true, {}}, {false, {sep}}});
}

}  // namespace

std::unique_ptr<PostProcessor> make_affix_processor(std::vector<int32_t> prefix, std::vector<int32_t> suffix) {
  return std::make_unique<ItemsProcessor>(std::vector<Item>{{false, std::move(prefix)}, {true, {}}, {false, std::move(suffix)}});
}

std::unique_ptr<PostProcessor> make_post_processor(const nlohmann::json& j, const jf::At& at) {
  std::string type = jf::str(jf::need(j, "type", at), at / "type");
  if (type == "TemplateProcessing") return make_template(j, at);
  if (type == "BertProcessing" || type == "RobertaProcessing") return make_cls_sep(j, at);
  if (type == "ByteLevel") return std::make_unique<Identity>();
  if (type == "Sequence") {
    const auto& arr = jf::need(j, "processors", at);
    if (!arr.is_array()) (at / "processors").fail("expected an array");
    std::vector<std::unique_ptr<PostProcessor>> parts;
    for (size_t i = 0; i < arr.size(); ++i) parts.push_back(make_post_processor(arr[i], (at / "processors")[i]));
    return std::make_unique<SequencePP>(std::move(parts));
  }
  (at / "type").fail(cat("unsupported post_processor type '", type, "'"));
}

}  // namespace hearth::tokenizer
