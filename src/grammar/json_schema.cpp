// JSON Schema → Grammar: shared rules for whitespace, strings (well-formed UTF-8, JSON escapes),
// numbers and free JSON values, and per-schema nodes for objects (properties in order, optional
// keys, extra keys that differ from the declared ones), arrays (min/max items), enums, formats
// and $ref rules. Not the automaton (grammar.cpp) and not request parsing (server/).
#include "grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "core/error.h"

namespace hearth::grammar {
namespace {

using json = nlohmann::ordered_json;
constexpr int64_t kMaxUnroll = 4096;  // minItems/maxItems/minLength/maxLength limit
// Grammar nodes one schema may compile to (~150 bytes each): bounds the memory a request can make
// the server spend (many properties with large maxLength unroll to millions of nodes otherwise).
constexpr size_t kMaxGrammarNodes = 500000;

const std::set<std::string> kAnnotations = {"title",    "description", "default",  "examples", "$schema",
                                            "$id",      "$comment",    "deprecated", "readOnly", "writeOnly"};
const std::set<std::string> kKnown = {"type",     "enum",      "const",     "properties", "required",
                                      "additionalProperties", "items", "minItems", "maxItems", "minLength",
                                      "maxLength", "format",   "anyOf",     "oneOf",      "allOf",
                                      "$ref",      "$defs",    "definitions"};

ByteSet set_of(std::string_view chars) {
  ByteSet s;
  for (char c : chars) s.set(static_cast<uint8_t>(c));
  return s;
}
ByteSet range_set(int lo, int hi) {
  ByteSet s;
  for (int b = lo; b <= hi; ++b) s.set(static_cast<size_t>(b));
  return s;
}

[[noreturn]] void unsupported(const std::string& what, const std::string& path) {
  throw InvalidArgument(cat("unsupported JSON Schema ", what, " at ", path));
}
[[noreturn]] void invalid(const std::string& what, const std::string& path) {
  throw InvalidArgument(cat("invalid JSON Schema: ", what, " at ", path));
}

std::string escape_pointer(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

int64_t count_of(const json& s, const char* key, const std::string& path) {
  const json& v = s[key];
  if (!v.is_number_integer() || v.get<int64_t>() < 0) invalid(cat("'", key, "' must be a non-negative integer"), path);
  if (v.get<int64_t>() > kMaxUnroll) unsupported(cat("'", key, "' above ", kMaxUnroll), path);
  return v.get<int64_t>();
}

class Compiler {
 public:
  Compiler(const JsonGrammarOptions& o) : o_(o), g_(std::make_shared<Grammar>()) {}
  std::shared_ptr<Grammar> grammar() { return g_; }
  Grammar& g() { return *g_; }

  void set_root(const json* root, std::string prefix) {
    root_ = root;
    prefix_ = std::move(prefix);
  }
  std::string path(const std::string& pointer) const { return prefix_ + "#" + pointer; }

  // Whitespace between JSON tokens: "" | " " | "\n"{1,2} [ \t]{0,max_indent} (llama.cpp's space rule).
  int32_t ws(int32_t next) {
    if (ws_rule_ < 0) {
      ws_rule_ = g().new_rule();
      const int32_t r = g().ret();
      int32_t indent = r;
      for (int i = 0; i < o_.max_indent; ++i) indent = g().split({g().bytes(set_of(" \t"), indent), r});
      const int32_t newline = g().literal("\n", g().split({g().literal("\n", indent), indent}));
      g().set_rule_start(ws_rule_, g().split({r, g().literal(" ", r), newline}));
    }
    return g().call(ws_rule_, next);
  }

  // Any of `texts` (exact bytes), then `next`, as a byte trie: values sharing a prefix share its
  // nodes, so an automaton state inside the enum holds one thread per distinct next byte instead of
  // one per value (a 20,000-value enum made every state 20,000 threads wide: seconds of engine
  // thread per mask). Built with an explicit stack (a chain like "a", "aa", "aaa"... nests deeply).
  int32_t texts_trie(std::vector<std::string> v, int32_t next) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    struct Task {
      size_t lo, hi, d;                // v[lo, hi) share their first d bytes
      size_t prefix_end = 0;           // ... and the first prefix_end once expanded
      bool expanded = false, terminal = false;
      std::vector<uint8_t> bytes;      // the byte of each child group
    };
    std::vector<Task> todo{Task{0, v.size(), 0, 0, false, false, {}}};
    std::vector<int32_t> done;  // the first node of each finished group, in order
    while (!todo.empty()) {
      if (!todo.back().expanded) {
        Task t = todo.back();
        if (t.hi - t.lo == 1) {
          done.push_back(g().literal(std::string_view(v[t.lo]).substr(t.d), next));
          todo.pop_back();
          continue;
        }
        const std::string& a = v[t.lo];
        const std::string& b = v[t.hi - 1];  // sorted: the range's common prefix is theirs
        size_t e = t.d;
        while (e < a.size() && e < b.size() && a[e] == b[e]) ++e;
        t.expanded = true;
        t.prefix_end = e;
        t.terminal = a.size() == e;  // unique and sorted: only the first can end here
        std::vector<Task> kids;
        for (size_t i = t.terminal ? t.lo + 1 : t.lo; i < t.hi;) {
          const auto c = static_cast<uint8_t>(v[i][e]);
          size_t j = i;
          while (j < t.hi && static_cast<uint8_t>(v[j][e]) == c) ++j;
          kids.push_back(Task{i, j, e + 1, 0, false, false, {}});
          t.bytes.push_back(c);
          i = j;
        }
        todo.back() = std::move(t);
        for (auto it = kids.rbegin(); it != kids.rend(); ++it) todo.push_back(std::move(*it));
        continue;
      }
      const Task& t = todo.back();
      const size_t k = t.bytes.size();
      std::vector<int32_t> alts;
      for (size_t i = 0; i < k; ++i) {
        ByteSet one;
        one.set(t.bytes[i]);
        alts.push_back(g().bytes(one, done[done.size() - k + i]));
      }
      done.resize(done.size() - k);
      if (t.terminal) alts.push_back(next);
      const int32_t branch = alts.size() == 1 ? alts[0] : g().split(std::move(alts));
      done.push_back(g().literal(std::string_view(v[t.lo]).substr(t.d, t.prefix_end - t.d), branch));
      todo.pop_back();
    }
    return done.back();
  }

  // The JSON pointer path of the schema a rule was built for (a $ref target, array items).
  void name_rule(int32_t rule, std::string where) { rule_paths_[rule] = std::move(where); }
  // Grammar::prune_unproductive, then a 400 naming the schema when the whole language is empty.
  void check_productive(int32_t root) {
    const std::vector<int32_t> bad = g().prune_unproductive();
    if (std::find(bad.begin(), bad.end(), root) == bad.end()) return;
    std::string where = prefix_ + "#";
    for (int32_t r : bad)
      if (auto it = rule_paths_.find(r); it != rule_paths_.end()) {
        where = it->second;
        break;
      }
    throw InvalidArgument(cat("invalid JSON Schema: no finite JSON value satisfies the schema at ", where,
                              " (it requires itself with no way to end; make the recursive property optional or "
                              "add a non-recursive anyOf branch)"));
  }

  // UTF-8 sequences of two or more bytes (well-formed, no surrogates), lead bytes outside `skip`.
  int32_t utf8(int32_t next, const ByteSet& skip = {}) {
    const int32_t c1 = g().range(0x80, 0xBF, next);
    const int32_t c2 = g().range(0x80, 0xBF, c1);
    const int32_t c3 = g().range(0x80, 0xBF, c2);
    auto lead = [&](ByteSet s, int32_t to) { s &= ~skip; return s.none() ? -1 : g().bytes(s, to); };
    ByteSet e_mid = range_set(0xE1, 0xEC) | range_set(0xEE, 0xEF);
    std::vector<int32_t> alts{lead(range_set(0xC2, 0xDF), c1), lead(set_of("\xE0"), g().range(0xA0, 0xBF, c1)),
                              lead(e_mid, c2),                 lead(set_of("\xED"), g().range(0x80, 0x9F, c1)),
                              lead(set_of("\xF0"), g().range(0x90, 0xBF, c2)), lead(range_set(0xF1, 0xF3), c3),
                              lead(set_of("\xF4"), g().range(0x80, 0x8F, c2))};
    std::erase(alts, -1);
    return g().split(std::move(alts));
  }
  static ByteSet plain_chars() {
    ByteSet s = range_set(0x20, 0x7F);
    s.reset('"');
    s.reset('\\');
    return s;
  }
  int32_t hex(int32_t next) { return g().bytes(set_of("0123456789abcdefABCDEF"), next); }
  // One JSON string character (plain, escape or multi-byte UTF-8), then `next`.
  int32_t str_char(int32_t next) {
    const int32_t esc = g().split({g().bytes(set_of("\"\\/bfnrt"), next), g().literal("u", hex(hex(hex(hex(next)))))});
    return g().split({g().bytes(plain_chars(), next), g().literal("\\", esc), utf8(next)});
  }
  // Characters then the closing quote (a rule: the body of every free string).
  int32_t string_tail_rule() {
    if (tail_rule_ < 0) {
      tail_rule_ = g().new_rule();
      const int32_t loop = g().split({});
      g().node(loop).alts = {str_char(loop), g().literal("\"", g().ret())};
      g().set_rule_start(tail_rule_, loop);
    }
    return tail_rule_;
  }
  int32_t string(int32_t next) { return g().literal("\"", g().call(string_tail_rule(), next)); }
  int32_t char_call(int32_t next) {
    if (char_rule_ < 0) {
      char_rule_ = g().new_rule();
      g().set_rule_start(char_rule_, str_char(g().ret()));
    }
    return g().call(char_rule_, next);
  }

  // [0-9]{lo,hi} then next.
  int32_t digits(int lo, int hi, int32_t next) {
    const ByteSet d = range_set('0', '9');
    int32_t c = next;
    for (int i = lo; i < hi; ++i) c = g().split({g().bytes(d, c), next});
    for (int i = 0; i < lo; ++i) c = g().bytes(d, c);
    return c;
  }
  int32_t int_part(int32_t next) {
    return g().split({g().literal("0", next), g().range('1', '9', digits(0, o_.max_int_digits - 1, next))});
  }
  int32_t number(int32_t next) {
    if (number_rule_ < 0) {
      number_rule_ = g().new_rule();
      const int32_t r = g().ret();
      const int32_t exp_digits = digits(1, 3, r);
      const int32_t exp = g().split({g().bytes(set_of("eE"), g().split({g().bytes(set_of("+-"), exp_digits), exp_digits})), r});
      const int32_t frac = g().split({g().literal(".", digits(1, o_.max_int_digits, exp)), exp});
      const int32_t ip = int_part(frac);
      g().set_rule_start(number_rule_, g().split({g().literal("-", ip), ip}));
    }
    return g().call(number_rule_, next);
  }
  int32_t integer(int32_t next) {
    if (integer_rule_ < 0) {
      integer_rule_ = g().new_rule();
      const int32_t ip = int_part(g().ret());
      g().set_rule_start(integer_rule_, g().split({g().literal("-", ip), ip}));
    }
    return g().call(integer_rule_, next);
  }

  // Any JSON value / object / array (free JSON).
  int32_t value(int32_t next) {
    if (value_rule_ < 0) {
      value_rule_ = g().new_rule();
      object_rule_ = g().new_rule();
      array_rule_ = g().new_rule();
      const int32_t r = g().ret();
      g().set_rule_start(value_rule_, g().split({g().call(object_rule_, r), g().call(array_rule_, r), string(r), number(r),
                                                 g().literal("true", r), g().literal("false", r), g().literal("null", r)}));
      {
        const int32_t close = ws(g().literal("}", r));
        const int32_t loop = g().split({});
        const int32_t member = string(ws(g().literal(":", ws(g().call(value_rule_, loop)))));
        g().node(loop).alts = {ws(g().literal(",", ws(member))), close};
        g().set_rule_start(object_rule_, g().literal("{", ws(g().split({member, close}))));
      }
      {
        const int32_t close = ws(g().literal("]", r));
        const int32_t loop = g().split({});
        const int32_t item = g().call(value_rule_, loop);
        g().node(loop).alts = {ws(g().literal(",", ws(item))), close};
        g().set_rule_start(array_rule_, g().literal("[", ws(g().split({item, close}))));
      }
    }
    return g().call(value_rule_, next);
  }
  int32_t any_object(int32_t next) {
    value(next);  // builds the rules
    return g().call(object_rule_, next);
  }

  // A key string (with its quotes) that is none of `keys` (JSON-escaped, without quotes).
  int32_t key_not_in(const std::vector<std::string>& keys, int32_t next) {
    const int32_t rest = g().call(string_tail_rule(), next);
    std::vector<const std::string*> all;
    for (const auto& k : keys) all.push_back(&k);
    return g().literal("\"", key_node(all, 0, rest, next));
  }
  int32_t key_node(const std::vector<const std::string*>& group, size_t d, int32_t rest, int32_t next) {
    bool terminal = false, boundary = true;
    std::map<uint8_t, std::vector<const std::string*>> children;
    for (const std::string* k : group) {
      if (k->size() == d) terminal = true;
      else {
        const auto b = static_cast<uint8_t>((*k)[d]);
        children[b].push_back(k);
        if ((b & 0xC0) == 0x80) boundary = false;  // inside a multi-byte character
      }
    }
    std::vector<int32_t> alts;
    ByteSet taken;
    for (const auto& [b, sub] : children) {
      taken.set(b);
      ByteSet one;
      one.set(b);
      alts.push_back(g().bytes(one, key_node(sub, d + 1, rest, next)));
    }
    if (boundary || terminal) {
      const ByteSet dev = plain_chars() & ~taken;
      if (dev.any()) alts.push_back(g().bytes(dev, rest));
      alts.push_back(utf8(rest, taken));
      if (!terminal) alts.push_back(g().literal("\"", next));
    }
    return g().split(std::move(alts));
  }

  int32_t format(const std::string& f, const std::string& p, int32_t next) {
    const int32_t q = g().literal("\"", next);
    auto d = [&](int n, int32_t c) { return digits(n, n, c); };
    auto date = [&](int32_t c) {
      const int32_t day = g().split({g().literal("0", g().range('1', '9', c)), g().range('1', '2', d(1, c)),
                                     g().literal("3", g().range('0', '1', c))});
      const int32_t month = g().split({g().literal("0", g().range('1', '9', g().literal("-", day))),
                                       g().literal("1", g().range('0', '2', g().literal("-", day)))});
      return d(4, g().literal("-", month));
    };
    auto two = [&](char hi_max, char lo_max_at_hi, int32_t c) {  // 00..(hi_max)(lo_max_at_hi)
      std::vector<int32_t> alts{g().range('0', static_cast<uint8_t>(hi_max - 1), d(1, c)),
                                g().literal(std::string(1, hi_max), g().range('0', static_cast<uint8_t>(lo_max_at_hi), c))};
      return g().split(std::move(alts));
    };
    auto time = [&](int32_t c) {
      const int32_t hm = two('2', '3', g().literal(":", two('5', '9', c)));
      const int32_t offset = g().split({g().literal("Z", c), g().bytes(set_of("+-"), hm)});
      const int32_t frac = g().split({g().literal(".", digits(1, 9, offset)), offset});
      return two('2', '3', g().literal(":", two('5', '9', g().literal(":", two('5', '9', frac)))));
    };
    auto hexes = [&](int n, int32_t c) {
      for (int i = 0; i < n; ++i) c = hex(c);
      return c;
    };
    int32_t body;
    if (f == "date") body = date(q);
    else if (f == "time") body = time(q);
    else if (f == "date-time") body = date(g().literal("T", time(q)));
    else if (f == "uuid")
      body = hexes(8, g().literal("-", hexes(4, g().literal("-", hexes(4, g().literal("-", hexes(4, g().literal("-", hexes(12, q)))))))));
    else if (f == "ipv4") {
      auto octet = [&](int32_t c) {
        return g().split({g().literal("25", g().range('0', '5', c)), g().literal("2", g().range('0', '4', d(1, c))),
                          g().literal("1", d(2, c)), g().range('1', '9', d(1, c)), d(1, c)});
      };
      body = octet(g().literal(".", octet(g().literal(".", octet(g().literal(".", octet(q)))))));
    } else if (f == "email") {
      const ByteSet label = range_set('a', 'z') | range_set('A', 'Z') | range_set('0', '9') | set_of("-");
      // local '@' label ('.' label)+ then the quote; labels are one or more of [A-Za-z0-9-].
      const int32_t after_dot = g().split({});  // inside a label after the first dot
      g().node(after_dot).alts = {g().bytes(label, after_dot), g().literal(".", g().bytes(label, after_dot)), q};
      const int32_t tail = g().split({});  // inside the first label
      g().node(tail).alts = {g().bytes(label, tail), g().literal(".", g().bytes(label, after_dot))};
      const ByteSet local = label | set_of("._%+");
      const int32_t local_loop = g().split({});
      g().node(local_loop).alts = {g().bytes(local, local_loop), g().literal("@", g().bytes(label, tail))};
      body = g().bytes(local, local_loop);
    } else {
      unsupported(cat("format '", f, "' (supported: date, time, date-time, uuid, email, ipv4)"), p);
    }
    return g().literal("\"", body);
  }

  int32_t ref(const std::string& r, const std::string& p, int32_t next) {
    const auto key = std::make_pair(root_, r);
    auto it = refs_.find(key);
    if (it == refs_.end()) {
      if (r.empty() || r[0] != '#') unsupported(cat("$ref '", r, "' (only local references like #/$defs/name)"), p);
      const json* target = nullptr;
      try {
        target = &root_->at(json::json_pointer(r.substr(1)));
      } catch (const std::exception&) {
        invalid(cat("$ref '", r, "' points nowhere"), p);
      }
      const int32_t rule = g().new_rule();
      it = refs_.emplace(key, rule).first;
      name_rule(rule, path(r.substr(1)));
      g().set_rule_start(rule, build(*target, r.substr(1), g().ret()));
    }
    return g().call(it->second, next);
  }

  int32_t object(const json& s, const std::string& p, int32_t next) {
    std::vector<std::pair<std::string, const json*>> props;
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) invalid("'properties' must be an object", path(p));
      for (const auto& [k, v] : s["properties"].items()) props.emplace_back(k, &v);
    }
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) invalid("'required' must be an array of strings", path(p));
      for (const auto& r : s["required"]) {
        if (!r.is_string()) invalid("'required' must be an array of strings", path(p));
        const std::string k = r.get<std::string>();
        bool found = false;
        for (const auto& pr : props) found |= pr.first == k;
        if (!found) unsupported(cat("'required' key '", k, "' that is not in 'properties'"), path(p));
        required.insert(k);
      }
    }
    const json* extra = nullptr;  // null: no extra keys
    json any = true;
    if (!s.contains("additionalProperties")) extra = &any;
    else if (s["additionalProperties"].is_boolean()) extra = s["additionalProperties"].get<bool>() ? &any : nullptr;
    else if (s["additionalProperties"].is_object()) extra = &s["additionalProperties"];
    else invalid("'additionalProperties' must be a boolean or a schema", path(p));

    const int32_t close = ws(g().literal("}", next));
    auto sep = [&](bool emitted, int32_t c) { return emitted ? ws(g().literal(",", ws(c))) : c; };
    int32_t tail_true = close, tail_false = close;
    if (extra) {
      std::vector<std::string> declared;
      for (const auto& pr : props) declared.push_back(json(pr.first).dump().substr(1, json(pr.first).dump().size() - 2));
      const int32_t loop = g().split({});
      const int32_t value_node = build(*extra, p + "/additionalProperties", loop);
      const int32_t kv = key_not_in(declared, ws(g().literal(":", ws(value_node))));
      g().node(loop).alts = {sep(true, kv), close};
      tail_true = loop;
      tail_false = g().split({kv, close});
    }
    for (size_t i = props.size(); i-- > 0;) {
      const auto& [key, sub] = props[i];
      const int32_t kv = g().literal(json(key).dump(), ws(g().literal(":", ws(build(*sub, p + "/properties/" + escape_pointer(key), tail_true)))));
      const bool req = required.count(key) > 0;
      const int32_t t_true = req ? sep(true, kv) : g().split({sep(true, kv), tail_true});
      const int32_t t_false = req ? sep(false, kv) : g().split({sep(false, kv), tail_false});
      tail_true = t_true;
      tail_false = t_false;
    }
    return g().literal("{", ws(tail_false));
  }

  int32_t array(const json& s, const std::string& p, int32_t next) {
    if (s.contains("prefixItems")) unsupported("keyword 'prefixItems'", path(p));
    const int64_t lo = s.contains("minItems") ? count_of(s, "minItems", path(p)) : 0;
    const int64_t hi = s.contains("maxItems") ? count_of(s, "maxItems", path(p)) : -1;
    if (hi >= 0 && hi < lo) invalid("'maxItems' is below 'minItems'", path(p));
    int32_t item_rule = g().new_rule();
    name_rule(item_rule, path(p + "/items"));
    if (s.contains("items")) {
      const json& it = s["items"];
      if (it.is_boolean() && !it.get<bool>()) unsupported("'items': false", path(p));
      if (!it.is_object() && !it.is_boolean()) unsupported("'items' that is not a schema (tuple form)", path(p));
      g().set_rule_start(item_rule, build(it, p + "/items", g().ret()));
    } else {
      g().set_rule_start(item_rule, value(g().ret()));
    }
    auto item = [&](int32_t c) { return g().call(item_rule, c); };
    auto sep = [&](int32_t c) { return ws(g().literal(",", ws(c))); };
    const int32_t close = ws(g().literal("]", next));
    if (hi == 0) return g().literal("[", ws(close));
    int32_t after;  // the state after the first item
    if (hi < 0) {
      const int64_t m = std::max<int64_t>(lo, 1);
      const int32_t loop = g().split({});
      g().node(loop).alts = {sep(item(loop)), close};
      after = loop;
      for (int64_t k = m - 1; k >= 1; --k) after = sep(item(after));
    } else {
      after = close;
      for (int64_t k = hi - 1; k >= 1; --k) after = k >= lo ? g().split({sep(item(after)), close}) : sep(item(after));
    }
    const int32_t body = lo == 0 ? g().split({item(after), close}) : item(after);
    return g().literal("[", ws(body));
  }

  int32_t string_schema(const json& s, const std::string& p, int32_t next) {
    const bool lengths = s.contains("minLength") || s.contains("maxLength");
    if (s.contains("format")) {
      if (!s["format"].is_string()) invalid("'format' must be a string", path(p));
      if (lengths) unsupported("'format' together with 'minLength'/'maxLength'", path(p));
      return format(s["format"].get<std::string>(), path(p), next);
    }
    if (!lengths) return string(next);
    const int64_t lo = s.contains("minLength") ? count_of(s, "minLength", path(p)) : 0;
    const int64_t hi = s.contains("maxLength") ? count_of(s, "maxLength", path(p)) : -1;
    if (hi >= 0 && hi < lo) invalid("'maxLength' is below 'minLength'", path(p));
    const int32_t q = g().literal("\"", next);
    int32_t c = q;
    if (hi < 0) {
      const int32_t loop = g().split({});
      g().node(loop).alts = {char_call(loop), q};
      c = loop;
    } else {
      for (int64_t i = lo; i < hi; ++i) c = g().split({char_call(c), q});
    }
    for (int64_t i = 0; i < lo; ++i) c = char_call(c);
    return g().literal("\"", c);
  }

  int32_t typed(const std::string& t, const json& s, const std::string& p, int32_t next) {
    if (t == "string") return string_schema(s, p, next);
    if (t == "number") return number(next);
    if (t == "integer") return integer(next);
    if (t == "boolean") return g().split({g().literal("true", next), g().literal("false", next)});
    if (t == "null") return g().literal("null", next);
    if (t == "object") return object(s, p, next);
    if (t == "array") return array(s, p, next);
    invalid(cat("unknown type '", t, "'"), path(p));
  }

  // The values of `const`/`enum` (both: the enum's values equal to const) that the keywords beside
  // them allow (`type`, and min/max Length and Items, which bind strings and arrays only); none
  // left is a 400, and another keyword beside them is unsupported (it was dropped silently).
  std::vector<json> listed_values(const json& s, const std::vector<std::string>& keys, const std::string& p) {
    std::vector<json> values;
    if (s.contains("enum")) {
      const json& e = s["enum"];
      if (!e.is_array() || e.empty()) invalid("'enum' must be a non-empty array", path(p));
      for (const json& v : e)
        if (!s.contains("const") || v == s["const"]) values.push_back(v);
    } else {
      values.push_back(s["const"]);
    }
    const char* listed = s.contains("enum") ? "enum" : "const";
    for (const std::string& k : keys) {
      if (k == "enum" || k == "const") continue;
      const bool on_strings = k == "minLength" || k == "maxLength", on_arrays = k == "minItems" || k == "maxItems";
      if (k != "type" && !on_strings && !on_arrays) unsupported(cat("keyword '", k, "' beside '", listed, "'"), path(p));
      const int64_t bound = k == "type" ? 0 : count_of(s, k.c_str(), path(p));
      const bool at_least = k == "minLength" || k == "minItems";
      std::erase_if(values, [&](const json& v) {
        if (k == "type") return !has_type(v, s["type"], p);
        int64_t n = -1;
        if (on_strings && v.is_string())  // code points, as JSON Schema counts them
          n = std::count_if(v.get_ref<const std::string&>().begin(), v.get_ref<const std::string&>().end(),
                            [](char c) { return (static_cast<uint8_t>(c) & 0xC0) != 0x80; });
        if (on_arrays && v.is_array()) n = static_cast<int64_t>(v.size());
        return n >= 0 && (at_least ? n < bound : n > bound);
      });
    }
    if (values.empty()) invalid(cat("no value of '", listed, "' satisfies the keywords beside it"), path(p));
    return values;
  }

  // Whether JSON value `v` is of schema type `t` (a name or a list of names); 1.0 is an integer.
  bool has_type(const json& v, const json& t, const std::string& p) const {
    if (t.is_array() && !t.empty()) {
      for (const json& x : t)
        if (has_type(v, x, p)) return true;
      return false;
    }
    if (!t.is_string()) invalid("'type' must be a string or a non-empty array of strings", path(p));
    const std::string& n = t.get_ref<const std::string&>();
    if (n == "string") return v.is_string();
    if (n == "number") return v.is_number();
    if (n == "integer")
      return v.is_number_integer() || (v.is_number_float() && std::trunc(v.get<double>()) == v.get<double>());
    if (n == "boolean") return v.is_boolean();
    if (n == "null") return v.is_null();
    if (n == "object") return v.is_object();
    if (n == "array") return v.is_array();
    invalid(cat("unknown type '", n, "'"), path(p));
  }

  // The nodes of `s` (at JSON pointer `p` from the current root), then `next`.
  int32_t build(const json& s, const std::string& p, int32_t next) {
    if (++depth_ > 200) unsupported("nesting deeper than 200 schemas", path(p));
    if (g_->size() > kMaxGrammarNodes)
      throw InvalidArgument(cat("the schema is too large to enforce (over ", kMaxGrammarNodes,
                                " grammar states at ", path(p), "; fewer properties or smaller maxLength/maxItems)"));
    struct Leave { int& d; ~Leave() { --d; } } leave{depth_};
    if (s.is_boolean()) {
      if (!s.get<bool>()) unsupported("schema 'false'", path(p));
      return value(next);
    }
    if (!s.is_object()) invalid("a schema must be an object or a boolean", path(p));
    std::vector<std::string> keys;
    for (const auto& [k, _] : s.items()) {
      if (kAnnotations.count(k)) continue;
      if (!kKnown.count(k)) unsupported(cat("keyword '", k, "'"), path(p));
      if (k != "$defs" && k != "definitions") keys.push_back(k);
    }
    auto alone = [&](const char* kw) {
      for (const auto& k : keys)
        if (k != kw) unsupported(cat("keyword '", k, "' beside '", kw, "'"), path(p));
    };
    if (s.contains("$ref")) {
      alone("$ref");
      if (!s["$ref"].is_string()) invalid("'$ref' must be a string", path(p));
      return ref(s["$ref"].get<std::string>(), path(p), next);
    }
    for (const char* kw : {"anyOf", "oneOf", "allOf"}) {
      if (!s.contains(kw)) continue;
      alone(kw);
      const json& list = s[kw];
      if (!list.is_array() || list.empty()) invalid(cat("'", kw, "' must be a non-empty array"), path(p));
      if (std::string(kw) == "allOf") {
        if (list.size() != 1) unsupported("'allOf' with more than one schema", path(p));
        return build(list[0], p + "/allOf/0", next);
      }
      std::vector<int32_t> alts;
      for (size_t i = 0; i < list.size(); ++i) alts.push_back(build(list[i], p + "/" + kw + "/" + std::to_string(i), next));
      return g().split(std::move(alts));
    }
    if (s.contains("const") || s.contains("enum")) {
      std::vector<std::string> texts;
      for (const json& v : listed_values(s, keys, p)) texts.push_back(v.dump());
      const int32_t start = texts_trie(std::move(texts), next);
      if (g_->size() > kMaxGrammarNodes)
        throw InvalidArgument(cat("the schema is too large to enforce (over ", kMaxGrammarNodes, " grammar states at ",
                                  path(p), "; fewer or shorter enum values)"));
      return start;
    }
    if (!s.contains("type")) {
      for (const char* k : {"properties", "required", "additionalProperties"})
        if (s.contains(k)) return object(s, p, next);
      for (const char* k : {"items", "minItems", "maxItems"})
        if (s.contains(k)) return array(s, p, next);
      for (const char* k : {"minLength", "maxLength", "format"})
        if (s.contains(k)) return string_schema(s, p, next);
      return value(next);
    }
    const json& t = s["type"];
    if (t.is_string()) return typed(t.get<std::string>(), s, p, next);
    if (!t.is_array() || t.empty()) invalid("'type' must be a string or a non-empty array of strings", path(p));
    std::vector<int32_t> alts;
    for (const auto& x : t) {
      if (!x.is_string()) invalid("'type' must be a string or a non-empty array of strings", path(p));
      alts.push_back(typed(x.get<std::string>(), s, p, next));
    }
    return g().split(std::move(alts));
  }

 private:
  JsonGrammarOptions o_;
  std::shared_ptr<Grammar> g_;
  const json* root_ = nullptr;
  std::string prefix_;
  int depth_ = 0;
  int32_t ws_rule_ = -1, tail_rule_ = -1, char_rule_ = -1, number_rule_ = -1, integer_rule_ = -1;
  int32_t value_rule_ = -1, object_rule_ = -1, array_rule_ = -1;
  std::map<std::pair<const json*, std::string>, int32_t> refs_;
  std::map<int32_t, std::string> rule_paths_;
};

}  // namespace

std::shared_ptr<Grammar> compile_json_schema(const nlohmann::ordered_json& schema, const JsonGrammarOptions& opts) {
  Compiler c(opts);
  c.set_root(&schema, "");
  const int32_t root = c.g().new_rule();
  c.g().set_rule_start(root, c.build(schema, "", c.g().ret()));
  c.g().set_root(root);
  c.check_productive(root);
  c.g().key = "schema:" + schema.dump();
  return c.grammar();
}

std::shared_ptr<Grammar> json_object_grammar(const JsonGrammarOptions& opts) {
  Compiler c(opts);
  const int32_t root = c.g().new_rule();
  c.g().set_rule_start(root, c.any_object(c.g().ret()));
  c.g().set_root(root);
  c.g().key = "json_object";
  return c.grammar();
}

std::shared_ptr<Grammar> tool_call_grammar(const std::vector<ToolSchema>& tools, const std::string& prefix,
                                           const std::string& suffix, const std::string& args_key,
                                           const JsonGrammarOptions& opts) {
  HEARTH_CHECK_T(InvalidArgument, !tools.empty(), "tool_call_grammar: no tools");
  Compiler c(opts);
  Grammar& g = c.g();
  const int32_t root = g.new_rule();
  const int32_t end = c.ws(g.literal(suffix, g.ret()));
  std::vector<int32_t> alts;
  std::string key = "tools:" + prefix + "|" + suffix + "|" + args_key;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ToolSchema& t = tools[i];
    c.set_root(&t.parameters, cat("tools[", i, "].function.parameters"));
    const int32_t close = c.ws(g.literal("}", end));
    const int32_t args = t.parameters.is_null() ? c.any_object(close) : c.build(t.parameters, "", close);
    auto field = [&](const std::string& name, int32_t value) {
      return g.literal(nlohmann::ordered_json(name).dump(), c.ws(g.literal(":", c.ws(value))));
    };
    const int32_t args_field = field(args_key, args);
    alts.push_back(g.literal("{", c.ws(field("name", g.literal(nlohmann::ordered_json(t.name).dump(), c.ws(g.literal(",", c.ws(args_field))))))));
    key += "|" + t.name + "=" + t.parameters.dump();
  }
  g.set_rule_start(root, g.literal(prefix, c.ws(g.split(std::move(alts)))));
  g.set_root(root);
  c.set_root(nullptr, "tools");
  c.check_productive(root);
  g.key = std::move(key);
  return c.grammar();
}

}  // namespace hearth::grammar
