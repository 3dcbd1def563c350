// Value: Python semantics for truthiness, str/repr, equality and json.dumps (the exact bytes
// transformers' templates print). Not the interpreter (jinja_interpreter.cpp) nor filters.
#include "chat/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <optional>

#include "core/json_nesting.h"

namespace hearth::chat {

namespace {
// Depth of the recursive walk in progress on this thread (repr, ==, <, json, conversions).
thread_local int g_walk_depth = 0;
thread_local int64_t g_walk_containers = 0;  // containers entered by the current outermost walk

// Containers whose repr() is in progress on this thread (Python's Py_ReprEnter list).
thread_local std::vector<const void*> g_repr_active;

class ReprEnter {
 public:
  explicit ReprEnter(const void* p) {
    recursive_ = std::find(g_repr_active.begin(), g_repr_active.end(), p) != g_repr_active.end();
    if (!recursive_) g_repr_active.push_back(p);
  }
  ~ReprEnter() {
    if (!recursive_) g_repr_active.pop_back();
  }
  bool recursive() const { return recursive_; }
  ReprEnter(const ReprEnter&) = delete;
  ReprEnter& operator=(const ReprEnter&) = delete;

 private:
  bool recursive_ = false;
};

// Releasing nested containers without recursion: while one release is running on this thread,
// containers freed inside it hand their children to its worklist instead of destroying them.
thread_local std::vector<Value>* g_release_list = nullptr;

bool is_nested(const Value& v) { return v.is_list() || v.is_dict() || v.is_func(); }

// Called by a container's destructor with a visitor over its children: hands the nested ones to
// the running release's worklist, or (outside one) runs a release that drains them iteratively.
template <typename ForEachChild>
void release_children(ForEachChild for_each_child) {
  if (g_release_list) {
    for_each_child([](Value& v) {
      if (is_nested(v)) g_release_list->push_back(std::move(v));
    });
    return;
  }
  std::vector<Value> pending;
  for_each_child([&pending](Value& v) {
    if (is_nested(v)) pending.push_back(std::move(v));
  });
  if (pending.empty()) return;
  g_release_list = &pending;
  while (!pending.empty()) {
    Value last = std::move(pending.back());
    pending.pop_back();
    // `last` dies here; if it held the final reference, its container adds children to `pending`.
  }
  g_release_list = nullptr;
}
}  // namespace

WalkLevel::WalkLevel(const char* what) {
  if (g_walk_depth == 0) g_walk_containers = 0;
  if (++g_walk_containers > kMaxWalkContainers)
    template_fail(0, std::string(what) + ": value too large to walk (more than " + std::to_string(kMaxWalkContainers) +
                         " lists and dicts, a shared one counted each time it appears)");
  if (++g_walk_depth > kMaxNesting) {
    --g_walk_depth;
    template_fail(0, std::string(what) + ": value nested deeper than " + std::to_string(kMaxNesting) +
                         " levels (or containing itself)");
  }
}
WalkLevel::~WalkLevel() { --g_walk_depth; }

void check_serialized_size(size_t bytes, const char* what) {
  if (bytes > kMaxSerializedBytes)
    template_fail(0, std::string(what) + ": text of the value exceeds the size limit (" +
                         std::to_string(kMaxSerializedBytes >> 20) + " MiB)");
}

ListData::~ListData() {
  release_children([this](auto&& visit) {
    for (auto& v : items) visit(v);
  });
}

DictData::~DictData() {
  release_children([this](auto&& visit) {
    for (auto& kv : items) {
      visit(kv.first);
      visit(kv.second);
    }
  });
}

Value Value::list(std::vector<Value> items, bool tuple) {
  Value v = make(Kind::List);
  v.list_ = std::make_shared<ListData>();
  v.list_->items = std::move(items);
  v.list_->tuple = tuple;
  return v;
}

Value Value::dict(bool ns) {
  Value v = make(Kind::Dict);
  v.dict_ = std::make_shared<DictData>();
  v.dict_->ns = ns;
  return v;
}

Value Value::func(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn) {
  Value v = make(Kind::Func);
  v.func_ = std::make_shared<FuncData>(FuncData{std::move(name), std::move(fn)});
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  std::optional<WalkLevel> level;
  if (j.is_structured()) level.emplace("JSON value");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return number(static_cast<double>(u));
      return integer(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return number(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Value v = list();
      for (const auto& e : j) v.list_->items.push_back(from_json(e));
      return v;
    }
    case nlohmann::ordered_json::value_t::object: {
      Value v = dict();
      for (auto it = j.begin(); it != j.end(); ++it) v.dict_->items.emplace_back(string(it.key()), from_json(it.value()));
      return v;
    }
    default: return none();  // binary / discarded: not produced by JSON text
  }
}

const Value* DictData::find(const Value& key) const {
  for (const auto& kv : items)
    if (kv.first.equals(key)) return &kv.second;
  return nullptr;
}
Value* DictData::find(const Value& key) {
  for (auto& kv : items)
    if (kv.first.equals(key)) return &kv.second;
  return nullptr;
}
void DictData::set(const Value& key, Value v) {
  if (Value* slot = find(key)) {
    *slot = std::move(v);
    return;
  }
  items.emplace_back(key, std::move(v));
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool:
    case Kind::Int: return i_ != 0;
    case Kind::Float: return f_ != 0.0;
    case Kind::String: return !s_.empty();
    case Kind::List: return !list_->items.empty();
    case Kind::Dict: return dict_->ns || !dict_->items.empty();
    case Kind::Func: return true;
  }
  return false;
}

std::string py_float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f < 0 ? "-inf" : "inf";
  if (f == 0) return std::signbit(f) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, f, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // "-d.ddde+XX": shortest round-trip digits
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t epos = sci.find('e');
  int exp = std::stoi(sci.substr(epos + 1));
  std::string digits;
  for (size_t i = 0; i < epos; ++i)
    if (sci[i] != '.') digits += sci[i];
  std::string out;
  if (exp < -4 || exp >= 16) {  // Python's repr switches to exponent form outside [1e-4, 1e16)
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += eb;
  } else if (exp < 0) {
    out = "0." + std::string(-exp - 1, '0') + digits;
  } else {
    if (digits.size() <= static_cast<size_t>(exp) + 1) {
      out = digits + std::string(exp + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    }
  }
  return neg ? "-" + out : out;
}

std::u32string utf8_decode(const std::string& s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0, n = s.size();
  while (i < n) {
    unsigned char c = s[i];
    char32_t cp;
    int len;
    if (c < 0x80) { cp = c; len = 1; }
    else if ((c >> 5) == 6) { cp = c & 0x1f; len = 2; }
    else if ((c >> 4) == 14) { cp = c & 0x0f; len = 3; }
    else if ((c >> 3) == 30) { cp = c & 0x07; len = 4; }
    else { out.push_back(0xFFFD); ++i; continue; }
    if (i + len > n) { out.push_back(0xFFFD); ++i; continue; }
    bool ok = true;
    for (int k = 1; k < len; ++k) {
      unsigned char cc = s[i + k];
      if ((cc >> 6) != 2) { ok = false; break; }
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (!ok) { out.push_back(0xFFFD); ++i; continue; }
    out.push_back(cp);
    i += len;
  }
  return out;
}

std::string utf8_encode(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t cp : s) {
    if (cp < 0x80) out += static_cast<char>(cp);
    else if (cp < 0x800) { out += static_cast<char>(0xC0 | (cp >> 6)); out += static_cast<char>(0x80 | (cp & 0x3f)); }
    else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }
  return out;
}

namespace {
// Python's str.isprintable() approximated for the characters repr() escapes in practice:
// controls, C1 controls, non-space separators and common format characters.
bool py_printable(char32_t c) {
  if (c < 0x20 || (c >= 0x7f && c <= 0xa0) || c == 0xad) return false;
  if ((c >= 0x2000 && c <= 0x200f) || (c >= 0x2028 && c <= 0x202f) || (c >= 0x205f && c <= 0x2064)) return false;
  if (c == 0x3000 || c == 0xfeff || c == 0x1680 || (c >= 0xd800 && c <= 0xdfff)) return false;
  return true;
}
}  // namespace

std::string py_str_repr(const std::string& s) {
  bool has_sq = s.find('\'') != std::string::npos, has_dq = s.find('"') != std::string::npos;
  char q = (has_sq && !has_dq) ? '"' : '\'';
  std::string out(1, q);
  for (char32_t c : utf8_decode(s)) {
    char buf[16];
    if (c == static_cast<char32_t>(q) || c == '\\') { out += '\\'; out += static_cast<char>(c); }
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (!py_printable(c)) {
      if (c < 0x100) std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      else std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else out += utf8_encode(std::u32string(1, c));
  }
  out += q;
  return out;
}

std::string Value::str() const {
  switch (kind_) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return i_ ? "True" : "False";
    case Kind::Int: return std::to_string(i_);
    case Kind::Float: return py_float_repr(f_);
    case Kind::String: return s_;
    default: return repr();
  }
}

std::string Value::repr() const {
  switch (kind_) {
    case Kind::Undefined: return "Undefined";
    case Kind::String: return py_str_repr(s_);
    case Kind::List: {
      ReprEnter enter(list_.get());
      if (enter.recursive()) return list_->tuple ? "(...)" : "[...]";
      WalkLevel level("repr");
      std::string out = list_->tuple ? "(" : "[";
      for (size_t i = 0; i < list_->items.size(); ++i) {
        if (i) out += ", ";
        out += list_->items[i].repr();
        check_serialized_size(out.size(), "repr");
      }
      if (list_->tuple && list_->items.size() == 1) out += ",";
      return out + (list_->tuple ? ")" : "]");
    }
    case Kind::Dict: {
      ReprEnter enter(dict_.get());
      if (enter.recursive()) return dict_->ns ? "<Namespace {...}>" : "{...}";
      WalkLevel level("repr");
      std::string out = dict_->ns ? "<Namespace {" : "{";
      for (size_t i = 0; i < dict_->items.size(); ++i) {
        if (i) out += ", ";
        out += dict_->items[i].first.repr() + ": " + dict_->items[i].second.repr();
        check_serialized_size(out.size(), "repr");
      }
      return out + (dict_->ns ? "}>" : "}");
    }
    case Kind::Func: return "<function " + func_->name + ">";
    default: return str();
  }
}

bool Value::equals(const Value& o) const {
  if (is_number() && o.is_number()) {
    if (kind_ == Kind::Float || o.kind_ == Kind::Float) return as_double() == o.as_double();
    return i_ == o.i_;
  }
  if (kind_ != o.kind_) return false;
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None: return true;
    case Kind::String: return s_ == o.s_;
    case Kind::List: {
      if (list_ == o.list_) return true;
      if (list_->tuple != o.list_->tuple || list_->items.size() != o.list_->items.size()) return false;
      WalkLevel level("comparison");
      for (size_t i = 0; i < list_->items.size(); ++i)
        if (!list_->items[i].equals(o.list_->items[i])) return false;
      return true;
    }
    case Kind::Dict: {
      if (dict_ == o.dict_) return true;
      if (dict_->ns || o.dict_->ns || dict_->items.size() != o.dict_->items.size()) return false;
      WalkLevel level("comparison");
      for (const auto& kv : dict_->items) {
        const Value* other = o.dict_->find(kv.first);
        if (!other || !other->equals(kv.second)) return false;
      }
      return true;
    }
    case Kind::Func: return func_ == o.func_;
    default: return false;
  }
}

namespace {
void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  char buf[16];
  for (char32_t c : utf8_decode(s)) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else if (ensure_ascii && c >= 0x80) {
          if (c >= 0x10000) {
            char32_t v = c - 0x10000;
            std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (v >> 10)),
                          static_cast<unsigned>(0xDC00 + (v & 0x3ff)));
          } else {
            std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          }
          out += buf;
        } else {
          out += utf8_encode(std::u32string(1, c));
        }
    }
  }
  out += '"';
}

// Python's sorted() order of two dict keys (json.dumps(sort_keys=True) sorts the items).
bool key_less(const Value& a, const Value& b) {
  if (a.is_string() && b.is_string()) return a.str_ref() < b.str_ref();  // UTF-8 bytes order = code points
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  template_fail(0, "tojson: '<' not supported between instances of '" + b.type_name() + "' and '" + a.type_name() +
                       "' (sort_keys=True)");
}

struct JsonWriter {
  bool ensure_ascii;
  const std::string* indent;  // null: compact (Python indent=None)
  std::string item_sep, key_sep;
  bool sort_keys = false;
  std::string out;
  std::vector<const void*> open;  // containers being written (circular reference check)

  void newline(int level) {
    out += '\n';
    for (int i = 0; i < level; ++i) out += *indent;
  }
  void enter(const void* p) {
    if (std::find(open.begin(), open.end(), p) != open.end()) template_fail(0, "tojson: Circular reference detected");
    open.push_back(p);
  }
  void write(const Value& v, int level) {
    std::optional<WalkLevel> guard;
    if (v.is_list() || v.is_dict()) guard.emplace("tojson");
    switch (v.kind()) {
      case Value::Kind::None: out += "null"; break;
      case Value::Kind::Bool: out += v.as_bool() ? "true" : "false"; break;
      case Value::Kind::Int: out += std::to_string(v.as_int()); break;
      case Value::Kind::Float: {
        double f = v.as_double();
        if (std::isnan(f)) out += "NaN";
        else if (std::isinf(f)) out += f < 0 ? "-Infinity" : "Infinity";
        else out += py_float_repr(f);
        break;
      }
      case Value::Kind::String: json_string(out, v.str_ref(), ensure_ascii); break;
      case Value::Kind::List: {
        const auto& items = v.list_ref().items;
        if (items.empty()) { out += "[]"; break; }
        enter(&v.list_ref());
        out += '[';
        for (size_t i = 0; i < items.size(); ++i) {
          if (i) out += item_sep;
          if (indent) newline(level + 1);
          write(items[i], level + 1);
          check_serialized_size(out.size(), "tojson");
        }
        if (indent) newline(level);
        out += ']';
        open.pop_back();
        break;
      }
      case Value::Kind::Dict: {
        if (v.dict_ref().ns) template_fail(0, "tojson: Object of type Namespace is not JSON serializable");
        const auto& all = v.dict_ref().items;
        if (all.empty()) { out += "{}"; break; }
        enter(&v.dict_ref());
        std::vector<const std::pair<Value, Value>*> items;
        for (const auto& kv : all) items.push_back(&kv);
        if (sort_keys)
          std::stable_sort(items.begin(), items.end(), [](auto* x, auto* y) { return key_less(x->first, y->first); });
        out += '{';
        for (size_t i = 0; i < items.size(); ++i) {
          if (i) out += item_sep;
          if (indent) newline(level + 1);
          const Value& k = items[i]->first;
          if (k.is_string()) json_string(out, k.str_ref(), ensure_ascii);
          else if (k.is_bool()) out += k.as_bool() ? "\"true\"" : "\"false\"";
          else if (k.is_none()) out += "\"null\"";
          else if (k.is_int() || k.is_float()) out += "\"" + k.str() + "\"";
          else template_fail(0, "tojson: keys must be str, int, float, bool or None, not " + k.type_name());
          out += key_sep;
          write(items[i]->second, level + 1);
          check_serialized_size(out.size(), "tojson");
        }
        if (indent) newline(level);
        out += '}';
        open.pop_back();
        break;
      }
      default: template_fail(0, "tojson: Object of type " + v.type_name() + " is not JSON serializable");
    }
  }
};
}  // namespace

std::string Value::to_json(bool ensure_ascii, int indent, const std::string& indent_str, const std::string& item_sep,
                           const std::string& key_sep, bool sort_keys) const {
  std::string ind = indent_str.empty() ? std::string(indent > 0 ? indent : 0, ' ') : indent_str;
  JsonWriter w{ensure_ascii, indent >= 0 || !indent_str.empty() ? &ind : nullptr, item_sep, key_sep, sort_keys, {}, {}};
  w.write(*this, 0);
  return std::move(w.out);
}

nlohmann::ordered_json Value::to_nlohmann() const {
  switch (kind_) {
    case Kind::Bool: return as_bool();
    case Kind::Int: return i_;
    case Kind::Float: return f_;
    case Kind::String: return s_;
    case Kind::List: {
      WalkLevel level("JSON conversion");
      nlohmann::ordered_json j = nlohmann::ordered_json::array();
      for (const auto& e : list_->items) j.push_back(e.to_nlohmann());
      return j;
    }
    case Kind::Dict: {
      WalkLevel level("JSON conversion");
      nlohmann::ordered_json j = nlohmann::ordered_json::object();
      for (const auto& kv : dict_->items) j[kv.first.str()] = kv.second.to_nlohmann();
      return j;
    }
    default: return nullptr;
  }
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return list_->tuple ? "tuple" : "list";
    case Kind::Dict: return dict_->ns ? "Namespace" : "dict";
    case Kind::Func: return "function";
  }
  return "object";
}

Value CallArgs::get(size_t i, const std::string& name, Value def) const {
  if (i < pos.size()) return pos[i];
  for (const auto& kv : kw)
    if (kv.first == name) return kv.second;
  return def;
}

bool CallArgs::has(size_t i, const std::string& name) const {
  if (i < pos.size()) return true;
  for (const auto& kv : kw)
    if (kv.first == name) return true;
  return false;
}

}  // namespace hearth::chat
