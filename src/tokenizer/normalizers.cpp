// Normalizers ported from HF tokenizers (normalizers/*.rs), text-only (no alignment tracking).
// Not a place for pre-tokenization or added-token handling.
#include "tokenizer/normalizers.h"

#include <unicode/uchar.h>

#include <vector>

#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace hearth::tokenizer {
namespace {

class UnicodeNorm : public Normalizer {
 public:
  explicit UnicodeNorm(unicode::NormalForm f) : form_(f) {}
  void normalize(std::string& s) const override { s = unicode::normalize(s, form_); }

 private:
  unicode::NormalForm form_;
};

class Lowercase : public Normalizer {
 public:
  void normalize(std::string& s) const override { s = unicode::lowercase(s); }
};

// HF Strip: removes leading/trailing characters with Rust's char::is_whitespace.
class Strip : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& s) const override {
    size_t b = 0, e = s.size();
    if (left_) {
      while (b < e) {
        auto p = unicode::decode_at(s, b);
        if (!unicode::is_whitespace(p.cp)) break;
        b += p.len;
      }
    }
    if (right_) {
      while (e > b) {
        size_t k = e - 1;
        while (k > b && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
        if (!unicode::is_whitespace(unicode::decode_at(s, k).cp)) break;
        e = k;
      }
    }
    s = s.substr(b, e - b);
  }

 private:
  bool left_, right_;
};

// HF StripAccents: drops combining marks (general category Mn).
class StripAccents : public Normalizer {
 public:
  void normalize(std::string& s) const override;
};

class Replace : public Normalizer {
 public:
  Replace(Regex re, std::string content) : re_(std::move(re)), content_(std::move(content)) {}
  void normalize(std::string& s) const override {
    auto matches = re_.find_all(s);
    if (matches.empty()) return;
    std::string out;
    out.reserve(s.size());
    size_t prev = 0;
    for (auto [a, b] : matches) {
      out.append(s, prev, a - prev);
      out += content_;
      prev = b;
    }
    out.append(s, prev, std::string::npos);
    s = std::move(out);
  }

 private:
  Regex re_;
  std::string content_;
};

class Prepend : public Normalizer {
 public:
  explicit Prepend(std::string p) : prefix_(std::move(p)) {}
  void normalize(std::string& s) const override {
    if (!s.empty()) s = prefix_ + s;
  }

 private:
  std::string prefix_;
};

// HF normalizers::ByteLevel: every byte becomes its GPT-2 alphabet character.
class ByteLevelNorm : public Normalizer {
 public:
  void normalize(std::string& s) const override {
    const auto& map = unicode::byte_to_unicode();
    std::string out;
    out.reserve(s.size() * 2);
    for (unsigned char b : s) out += map[b];
    s = std::move(out);
  }
};

class Sequence : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  void normalize(std::string& s) const override {
    for (const auto& p : parts_) p->normalize(s);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

void StripAccents::normalize(std::string& s) const {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    auto p = unicode::decode_at(s, i);
    if (u_charType(static_cast<UChar32>(p.cp)) != U_NON_SPACING_MARK) out.append(s, i, p.len);
    i += p.len;
  }
  s = std::move(out);
}
}  // namespace

// A Replace/Split "pattern": {"String": s} (literal) or {"Regex": r}.
Regex make_pattern(const nlohmann::json& p, const jf::At& at) {
  if (!p.is_object()) at.fail("expected {\"String\": ...} or {\"Regex\": ...}");
  auto where = [&](const char* k) { return (at / k).origin + ": " + (at / k).field; };
  if (auto it = p.find("String"); it != p.end()) return Regex::literal(jf::str(*it, at / "String"), where("String"));
  if (auto it = p.find("Regex"); it != p.end()) return Regex::compile(jf::str(*it, at / "Regex"), where("Regex"));
  at.fail("expected {\"String\": ...} or {\"Regex\": ...}");
}

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const jf::At& at) {
  std::string type = jf::str(jf::need(j, "type", at), at / "type");
  if (type == "NFC") return std::make_unique<UnicodeNorm>(unicode::NormalForm::kNFC);
  if (type == "NFD") return std::make_unique<UnicodeNorm>(unicode::NormalForm::kNFD);
  if (type == "NFKC") return std::make_unique<UnicodeNorm>(unicode::NormalForm::kNFKC);
  if (type == "NFKD") return std::make_unique<UnicodeNorm>(unicode::NormalForm::kNFKD);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "StripAccents") return std::make_unique<StripAccents>();
  if (type == "Strip")
    return std::make_unique<Strip>(jf::opt_bool(j, "strip_left", true, at), jf::opt_bool(j, "strip_right", true, at));
  if (type == "Replace")
    return std::make_unique<Replace>(make_pattern(jf::need(j, "pattern", at), at / "pattern"),
                                     jf::str(jf::need(j, "content", at), at / "content"));
  if (type == "Prepend") return std::make_unique<Prepend>(jf::str(jf::need(j, "prepend", at), at / "prepend"));
  if (type == "ByteLevel") return std::make_unique<ByteLevelNorm>();
  if (type == "Sequence") {
    const auto& arr = jf::need(j, "normalizers", at);
    if (!arr.is_array()) (at / "normalizers").fail("expected an array");
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (size_t i = 0; i < arr.size(); ++i) parts.push_back(make_normalizer(arr[i], (at / "normalizers")[i]));
    return std::make_unique<Sequence>(std::move(parts));
  }
  (at / "type").fail(cat("unsupported normalizer type '", type, "'"));
}

}  // namespace hearth::tokenizer
