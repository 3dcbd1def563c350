// Jinja lexer: text/tag segmentation with jinja2's whitespace rules (`-` control, trim_blocks,
// lstrip_blocks, raw blocks) and expression tokens. Not the parser (jinja_parser.cpp).
#include "chat/jinja_lexer.h"

#include <cctype>
#include <cstring>

#include "chat/template_error.h"
#include "chat/value.h"

namespace hearth::chat {
namespace {

constexpr size_t kMaxTemplateBytes = 4u << 20;  // 4 MiB: far above any real chat template

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

class Lexer {
 public:
  explicit Lexer(std::string src) : s_(std::move(src)) {}

  std::vector<Token> run() {
    bool line_starting = true, lstrip_next = false;
    while (pos_ < s_.size()) {
      size_t start = next_tag(pos_);
      std::string text = s_.substr(pos_, start - pos_);
      int text_line = line_;
      count_lines(pos_, start);
      if (lstrip_next) {
        size_t k = 0;
        while (k < text.size() && is_space(text[k])) ++k;
        text.erase(0, k);
      }
      lstrip_next = false;
      if (start >= s_.size()) {
        push_text(text, text_line);
        break;
      }
      char kind = s_[start + 1];  // '{', '%' or '#'
      char ctl = start + 2 < s_.size() ? s_[start + 2] : 0;
      if (ctl == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (ctl != '+' && kind != '{') {  // lstrip_blocks
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if (l_pos > 0 || line_starting) {
          bool ws = l_pos < text.size();
          for (size_t k = l_pos; k < text.size(); ++k)
            if (!is_space(text[k])) ws = false;
          if (ws) text.erase(l_pos);
        }
      }
      push_text(text, text_line);
      pos_ = start + 2 + ((ctl == '-' || ctl == '+') ? 1 : 0);
      bool trim_after = true, strip_after = false;
      if (kind == '#') {
        size_t e = s_.find("#}", pos_);
        if (e == std::string::npos) fail("missing end of comment tag");
        strip_after = e > pos_ && s_[e - 1] == '-';
        trim_after = !(e > pos_ && s_[e - 1] == '+');
        count_lines(pos_, e + 2);
        pos_ = e + 2;
      } else if (kind == '%' && try_raw(ctl)) {
        line_starting = false;
        continue;
      } else {
        out_.push_back({kind == '{' ? Tok::VarBegin : Tok::BlockBegin, "", line_});
        lex_tag(kind == '{' ? '}' : '%', strip_after, trim_after);
        if (kind == '{') trim_after = false;
      }
      if (strip_after) {
        while (pos_ < s_.size() && is_space(s_[pos_])) {
          if (s_[pos_] == '\n') ++line_;
          ++pos_;
        }
        lstrip_next = false;
        line_starting = pos_ > 0 && s_[pos_ - 1] == '\n';
      } else if (trim_after && pos_ < s_.size() && s_[pos_] == '\n') {
        ++pos_;
        ++line_;
        line_starting = true;
      } else {
        line_starting = false;
      }
    }
    out_.push_back({Tok::End, "", line_});
    return std::move(out_);
  }

 private:
  [[noreturn]] void fail(const std::string& msg) { template_fail(line_, msg); }

  size_t next_tag(size_t from) const {
    for (size_t i = from; i + 1 < s_.size(); ++i)
      if (s_[i] == '{' && (s_[i + 1] == '{' || s_[i + 1] == '%' || s_[i + 1] == '#')) return i;
    return s_.size();
  }
  void count_lines(size_t a, size_t b) {
    for (size_t i = a; i < b && i < s_.size(); ++i)
      if (s_[i] == '\n') ++line_;
  }
  void push_text(const std::string& t, int line) {
    if (!t.empty()) out_.push_back({Tok::Text, t, line});
  }

  // `{% raw %}...{% endraw %}`: the body is text, verbatim.
  bool try_raw(char ctl) {
    size_t p = pos_;
    while (p < s_.size() && is_space(s_[p])) ++p;
    if (s_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < s_.size() && is_space(s_[p])) ++p;
    bool strip = false;
    if (p < s_.size() && s_[p] == '-') { strip = true; ++p; }
    if (s_.compare(p, 2, "%}") != 0) return false;
    p += 2;
    if (strip) while (p < s_.size() && is_space(s_[p])) ++p;
    size_t search = p;
    while (true) {
      size_t e = s_.find("{%", search);
      if (e == std::string::npos) fail("missing endraw");
      size_t q = e + 2;
      bool lead_strip = q < s_.size() && s_[q] == '-';
      if (q < s_.size() && (s_[q] == '-' || s_[q] == '+')) ++q;
      while (q < s_.size() && is_space(s_[q])) ++q;
      if (s_.compare(q, 6, "endraw") != 0) { search = e + 2; continue; }
      q += 6;
      while (q < s_.size() && is_space(s_[q])) ++q;
      bool tail_strip = false, tail_plus = false;
      if (q < s_.size() && s_[q] == '-') { tail_strip = true; ++q; }
      else if (q < s_.size() && s_[q] == '+') { tail_plus = true; ++q; }
      if (s_.compare(q, 2, "%}") != 0) fail("malformed endraw tag");
      q += 2;
      std::string body = s_.substr(p, e - p);
      if (lead_strip) while (!body.empty() && is_space(body.back())) body.pop_back();
      push_text(body, line_);
      count_lines(pos_, q);
      if (tail_strip) while (q < s_.size() && is_space(s_[q])) { if (s_[q] == '\n') ++line_; ++q; }
      else if (!tail_plus && q < s_.size() && s_[q] == '\n') { ++q; ++line_; }
      pos_ = q;
      return true;
    }
  }

  // Lexes expression tokens up to the tag end ("}}" or "%}" with optional -/+ control).
  void lex_tag(char closer, bool& strip_after, bool& trim_after) {
    int depth = 0;
    while (true) {
      while (pos_ < s_.size() && is_space(s_[pos_])) {
        if (s_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= s_.size()) fail(closer == '}' ? "unexpected end of template, expected '}}'" : "unexpected end of template, expected '%}'");
      if (depth == 0) {
        char c0 = s_[pos_];
        size_t p = pos_;
        bool minus = false, plus = false;
        if (c0 == '-' || c0 == '+') { minus = c0 == '-'; plus = c0 == '+'; ++p; }
        if (p + 1 < s_.size() && s_[p] == closer && s_[p + 1] == '}' && (!plus || closer == '%')) {
          out_.push_back({closer == '}' ? Tok::VarEnd : Tok::BlockEnd, "", line_});
          pos_ = p + 2;
          strip_after = minus;
          trim_after = !plus;
          return;
        }
      }
      char c = s_[pos_];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t b = pos_;
        while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_')) ++pos_;
        out_.push_back({Tok::Name, s_.substr(b, pos_ - b), line_});
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        lex_number();
      } else if (c == '\'' || c == '"') {
        lex_string(c);
      } else {
        static const char* kOps[] = {"**", "//", "==", "!=", ">=", "<=", "+", "-", "*", "/", "%", "~", "<",
                                     ">",  "=",  ".",  ":",  "|",  ",",  "(", ")", "[", "]", "{", "}"};
        bool found = false;
        for (const char* op : kOps) {
          size_t n = std::strlen(op);
          if (s_.compare(pos_, n, op) == 0) {
            out_.push_back({Tok::Op, op, line_});
            pos_ += n;
            if (n == 1 && (*op == '(' || *op == '[' || *op == '{')) ++depth;
            if (n == 1 && (*op == ')' || *op == ']' || *op == '}')) depth = depth > 0 ? depth - 1 : 0;
            found = true;
            break;
          }
        }
        if (!found) fail(std::string("unexpected character '") + c + "'");
      }
    }
  }

  void lex_number() {
    size_t b = pos_;
    auto digits = [&] {
      while (pos_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_')) ++pos_;
    };
    digits();
    bool is_float = false;
    if (pos_ + 1 < s_.size() && s_[pos_] == '.' && std::isdigit(static_cast<unsigned char>(s_[pos_ + 1]))) {
      is_float = true;
      ++pos_;
      digits();
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      size_t q = pos_ + 1;
      if (q < s_.size() && (s_[q] == '+' || s_[q] == '-')) ++q;
      if (q < s_.size() && std::isdigit(static_cast<unsigned char>(s_[q]))) {
        is_float = true;
        pos_ = q;
        digits();
      }
    }
    std::string t;
    for (size_t i = b; i < pos_; ++i)
      if (s_[i] != '_') t += s_[i];
    out_.push_back({is_float ? Tok::Float : Tok::Int, t, line_});
  }

  void lex_string(char q) {
    int start_line = line_;
    ++pos_;
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) template_fail(start_line, "unterminated string literal");
      char c = s_[pos_++];
      if (c == q) break;
      if (c == '\n') ++line_;
      if (c != '\\') { out += c; continue; }
      if (pos_ >= s_.size()) template_fail(start_line, "unterminated string literal");
      char e = s_[pos_++];
      auto hex = [&](int n) -> char32_t {
        if (pos_ + n > s_.size()) fail("truncated \\x/\\u escape in string");
        char32_t v = 0;
        for (int k = 0; k < n; ++k) {
          char h = s_[pos_++];
          if (!std::isxdigit(static_cast<unsigned char>(h))) fail("bad hex digit in string escape");
          v = v * 16 + (std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
        }
        return v;
      };
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '\n': ++line_; break;  // line continuation
        case 'x': out += utf8_encode(std::u32string(1, hex(2))); break;
        case 'u': out += utf8_encode(std::u32string(1, hex(4))); break;
        case 'U': {
          char32_t v = hex(8);
          if (v > 0x10FFFF) fail("\\U escape out of range");
          out += utf8_encode(std::u32string(1, v));
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            char32_t v = e - '0';
            for (int k = 0; k < 2 && pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '7'; ++k) v = v * 8 + (s_[pos_++] - '0');
            out += utf8_encode(std::u32string(1, v));
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    out_.push_back({Tok::String, out, start_line});
  }

  std::string s_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> out_;
};

// jinja2 normalises newlines to "\n" and drops one trailing newline (keep_trailing_newline=False).
std::string normalize_source(const std::string& src) {
  std::string s;
  s.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      s += '\n';
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      s += src[i];
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

}  // namespace

std::vector<Token> lex_template(const std::string& source) {
  if (source.size() > kMaxTemplateBytes) template_fail(0, "template larger than 4 MiB");
  Lexer lexer(normalize_source(source));
  return lexer.run();
}

}  // namespace hearth::chat
