// Attribute/item access, the Python methods of str/dict/list that templates call, and the globals
// of transformers' environment (range, namespace, raise_exception, strftime_now). Filters and
// tests are in jinja_filters.cpp.
#include "chat/jinja_builtins.h"

#include <ctime>

#include "chat/jinja_interpreter.h"

namespace hearth::chat {
namespace {

bool py_isspace(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

char32_t to_upper_cp(char32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if (c < 0x80) return c;
  if ((c >= 0xe0 && c <= 0xfe && c != 0xf7)) return c - 32;
  if (c == 0xff) return 0x178;
  if (c == 0xb5) return 0x39c;
  if ((c >= 0x100 && c <= 0x137) || (c >= 0x14a && c <= 0x177)) return (c & 1) ? c - 1 : c;
  if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e)) return (c & 1) ? c : c - 1;
  if (c >= 0x3b1 && c <= 0x3c9) return c == 0x3c2 ? 0x3a3 : c - 32;
  if (c == 0x3ac) return 0x386;
  if (c >= 0x3ad && c <= 0x3af) return c - 37;
  if (c == 0x3cc) return 0x38c;
  if (c == 0x3cd || c == 0x3ce) return c - 63;
  if (c >= 0x430 && c <= 0x44f) return c - 32;
  if (c >= 0x450 && c <= 0x45f) return c - 80;
  if (c >= 0xff41 && c <= 0xff5a) return c - 32;
  return c;
}

char32_t to_lower_cp(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c < 0x80) return c;
  if ((c >= 0xc0 && c <= 0xde && c != 0xd7)) return c + 32;
  if (c == 0x178) return 0xff;
  if ((c >= 0x100 && c <= 0x137) || (c >= 0x14a && c <= 0x177)) return (c & 1) ? c : c + 1;
  if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e)) return (c & 1) ? c + 1 : c;
  if (c >= 0x391 && c <= 0x3a9 && c != 0x3a2) return c + 32;
  if (c == 0x386) return 0x3ac;
  if (c >= 0x388 && c <= 0x38a) return c + 37;
  if (c == 0x38c) return 0x3cc;
  if (c == 0x38e || c == 0x38f) return c + 63;
  if (c >= 0x410 && c <= 0x42f) return c + 32;
  if (c >= 0x400 && c <= 0x40f) return c + 80;
  if (c >= 0xff21 && c <= 0xff3a) return c + 32;
  return c;
}

bool is_cased(char32_t c) { return to_upper_cp(c) != c || to_lower_cp(c) != c || c == 0xdf; }

void push_upper(std::u32string& out, char32_t c) {
  if (c == 0xdf) out += U"SS";
  else out += to_upper_cp(c);
}

std::string one_char(char32_t c) { return utf8_encode(std::u32string(1, c)); }

}  // namespace

std::string py_upper(const std::string& s) {
  std::u32string out;
  for (char32_t c : utf8_decode(s)) push_upper(out, c);
  return utf8_encode(out);
}

std::string py_lower(const std::string& s) {
  std::u32string out;
  for (char32_t c : utf8_decode(s)) out += to_lower_cp(c);
  return utf8_encode(out);
}

std::string py_title(const std::string& s) {
  std::u32string out;
  bool prev_cased = false;
  for (char32_t c : utf8_decode(s)) {
    if (prev_cased) out += to_lower_cp(c);
    else if (c == 0xdf) out += U"Ss";
    else out += to_upper_cp(c);
    prev_cased = is_cased(c);
  }
  return utf8_encode(out);
}

std::string py_capitalize(const std::string& s) {
  std::u32string in = utf8_decode(s), out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (i == 0) {
      if (in[0] == 0xdf) out += U"Ss";
      else out += to_upper_cp(in[0]);
    } else {
      out += to_lower_cp(in[i]);
    }
  }
  return utf8_encode(out);
}

std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right) {
  std::u32string in = utf8_decode(s);
  std::u32string set = chars ? utf8_decode(*chars) : std::u32string();
  auto strip_it = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : py_isspace(c); };
  size_t b = 0, e = in.size();
  if (left)
    while (b < e && strip_it(in[b])) ++b;
  if (right)
    while (e > b && strip_it(in[e - 1])) --e;
  return utf8_encode(in.substr(b, e - b));
}

std::vector<std::string> py_split(const std::string& s, const std::string* sep, int64_t maxsplit, bool from_right,
                                  int line) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) template_fail(line, "empty separator");
    if (!from_right) {
      size_t pos = 0;
      while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
        size_t f = s.find(*sep, pos);
        if (f == std::string::npos) break;
        out.push_back(s.substr(pos, f - pos));
        pos = f + sep->size();
      }
      out.push_back(s.substr(pos));
    } else {
      size_t end = s.size();
      int64_t n = 0;
      while (maxsplit < 0 || n < maxsplit) {
        if (end < sep->size()) break;
        size_t f = s.rfind(*sep, end - sep->size());
        if (f == std::string::npos) break;
        out.insert(out.begin(), s.substr(f + sep->size(), end - f - sep->size()));
        end = f;
        ++n;
      }
      out.insert(out.begin(), s.substr(0, end));
    }
    return out;
  }
  std::u32string in = utf8_decode(s);
  if (!from_right) {
    size_t i = 0, n = in.size();
    while (true) {
      while (i < n && py_isspace(in[i])) ++i;
      if (i >= n) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
        size_t e = n;
        while (e > i && py_isspace(in[e - 1])) --e;
        out.push_back(utf8_encode(in.substr(i, e - i)));
        break;
      }
      size_t b = i;
      while (i < n && !py_isspace(in[i])) ++i;
      out.push_back(utf8_encode(in.substr(b, i - b)));
    }
  } else {
    int64_t e = static_cast<int64_t>(in.size());
    while (true) {
      while (e > 0 && py_isspace(in[e - 1])) --e;
      if (e <= 0) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
        int64_t b = 0;
        while (b < e && py_isspace(in[b])) ++b;
        out.insert(out.begin(), utf8_encode(in.substr(b, e - b)));
        break;
      }
      int64_t b = e;
      while (b > 0 && !py_isspace(in[b - 1])) --b;
      out.insert(out.begin(), utf8_encode(in.substr(b, e - b)));
      e = b;
    }
  }
  return out;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count) {
  std::string out;
  if (old.empty()) {  // Python inserts `repl` before every character and at the end
    std::u32string in = utf8_decode(s);
    int64_t n = 0;
    for (char32_t c : in) {
      if (count < 0 || n < count) { out += repl; ++n; }
      out += one_char(c);
    }
    if (count < 0 || n < count) out += repl;
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    size_t f = s.find(old, pos);
    if (f == std::string::npos) break;
    out.append(s, pos, f - pos);
    out += repl;
    pos = f + old.size();
    ++n;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

std::vector<std::string> py_splitlines(const std::string& s) {
  std::vector<std::string> out;
  std::u32string in = utf8_decode(s), cur;
  for (size_t i = 0; i < in.size(); ++i) {
    char32_t c = in[i];
    if (c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e || c == 0x85 ||
        c == 0x2028 || c == 0x2029) {
      if (c == '\r' && i + 1 < in.size() && in[i + 1] == '\n') ++i;
      out.push_back(utf8_encode(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(utf8_encode(cur));
  return out;
}

int64_t py_len(const Value& v, int line) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return 0;
    case Value::Kind::String: return static_cast<int64_t>(utf8_decode(v.str_ref()).size());
    case Value::Kind::List: return static_cast<int64_t>(v.list_ref().items.size());
    case Value::Kind::Dict:
      if (!v.dict_ref().ns) return static_cast<int64_t>(v.dict_ref().items.size());
      [[fallthrough]];
    default: template_fail(line, "object of type '" + v.type_name() + "' has no len()");
  }
}

std::vector<Value> py_iter(const Value& v, int line) {
  std::vector<Value> out;
  switch (v.kind()) {
    case Value::Kind::Undefined: break;
    case Value::Kind::List: out = v.list_ref().items; break;
    case Value::Kind::Dict:
      if (v.dict_ref().ns) template_fail(line, "'Namespace' object is not iterable");
      for (const auto& kv : v.dict_ref().items) out.push_back(kv.first);
      break;
    case Value::Kind::String:
      for (char32_t c : utf8_decode(v.str_ref())) out.push_back(Value::string(one_char(c)));
      break;
    default: template_fail(line, "'" + v.type_name() + "' object is not iterable");
  }
  return out;
}

namespace {

std::string need_str(const Value& v, const char* what, int line) {
  if (!v.is_string()) template_fail(line, std::string(what) + " arg must be str, not " + v.type_name());
  return v.str_ref();
}

int64_t code_point_index(const std::string& s, size_t byte_pos) {
  return static_cast<int64_t>(utf8_decode(s.substr(0, byte_pos)).size());
}

// str.format with positional/keyword fields and !r/!s conversions (no format specs).
std::string py_format(const std::string& fmt, const CallArgs& a) {
  std::string out;
  size_t auto_idx = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') { out += '}'; ++i; continue; }
      template_fail(a.line, "Single '}' encountered in format string");
    }
    if (c != '{') { out += c; continue; }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') { out += '{'; ++i; continue; }
    size_t e = fmt.find('}', i);
    if (e == std::string::npos) template_fail(a.line, "Single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, e - i - 1);
    i = e;
    char conv = 0;
    size_t bang = field.find('!');
    if (bang != std::string::npos) {
      conv = bang + 1 < field.size() ? field[bang + 1] : 0;
      field = field.substr(0, bang);
    }
    if (field.find(':') != std::string::npos) template_fail(a.line, "str.format: format specs are not supported");
    Value v;
    if (field.empty()) {
      if (auto_idx >= a.pos.size()) template_fail(a.line, "Replacement index " + std::to_string(auto_idx) + " out of range");
      v = a.pos[auto_idx++];
    } else if (std::isdigit(static_cast<unsigned char>(field[0]))) {
      size_t k = std::stoul(field);
      if (k >= a.pos.size()) template_fail(a.line, "Replacement index " + field + " out of range");
      v = a.pos[k];
    } else {
      bool found = false;
      for (const auto& kv : a.kw)
        if (kv.first == field) { v = kv.second; found = true; }
      if (!found) template_fail(a.line, "str.format: missing argument '" + field + "'");
    }
    out += conv == 'r' ? v.repr() : v.str();
  }
  return out;
}

Value str_method(const Value& obj, const std::string& name) {
  const std::string s = obj.str_ref();
  auto m = [&](std::function<Value(Interpreter&, CallArgs&)> fn) { return Value::func(name, std::move(fn)); };
  if (name == "startswith" || name == "endswith") {
    bool starts = name == "startswith";
    return m([s, starts](Interpreter&, CallArgs& a) {
      Value p = a.get(0, "prefix");
      std::vector<Value> opts = p.is_list() ? p.list_ref().items : std::vector<Value>{p};
      for (const auto& o : opts) {
        const std::string& t = need_str(o, starts ? "startswith" : "endswith", a.line);
        if (t.size() <= s.size() && (starts ? s.compare(0, t.size(), t) == 0 : s.compare(s.size() - t.size(), t.size(), t) == 0))
          return Value::boolean(true);
      }
      return Value::boolean(false);
    });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    bool l = name != "rstrip", r = name != "lstrip";
    return m([s, l, r](Interpreter&, CallArgs& a) {
      Value c = a.get(0, "chars", Value::none());
      if (c.is_none()) return Value::string(py_strip(s, nullptr, l, r));
      std::string chars = need_str(c, "strip", a.line);
      return Value::string(py_strip(s, &chars, l, r));
    });
  }
  if (name == "split" || name == "rsplit") {
    bool right = name == "rsplit";
    return m([s, right](Interpreter&, CallArgs& a) {
      Value sep = a.get(0, "sep", Value::none());
      Value ms = a.get(1, "maxsplit", Value::integer(-1));
      int64_t maxsplit = ms.is_int() ? ms.as_int() : -1;
      std::vector<std::string> parts;
      if (sep.is_none()) parts = py_split(s, nullptr, maxsplit, right, a.line);
      else {
        std::string sp = need_str(sep, "split", a.line);
        parts = py_split(s, &sp, maxsplit, right, a.line);
      }
      std::vector<Value> out;
      for (auto& p : parts) out.push_back(Value::string(std::move(p)));
      return Value::list(std::move(out));
    });
  }
  if (name == "splitlines")
    return m([s](Interpreter&, CallArgs&) {
      std::vector<Value> out;
      for (auto& p : py_splitlines(s)) out.push_back(Value::string(std::move(p)));
      return Value::list(std::move(out));
    });
  if (name == "replace")
    return m([s](Interpreter& in, CallArgs& a) {
      std::string o = need_str(a.get(0, "old"), "replace", a.line), n = need_str(a.get(1, "new"), "replace", a.line);
      Value cnt = a.get(2, "count", Value::integer(-1));
      std::string r = py_replace(s, o, n, cnt.is_int() ? cnt.as_int() : -1);
      in.check_size(r.size(), a.line);
      return Value::string(std::move(r));
    });
  if (name == "upper") return m([s](Interpreter&, CallArgs&) { return Value::string(py_upper(s)); });
  if (name == "lower") return m([s](Interpreter&, CallArgs&) { return Value::string(py_lower(s)); });
  if (name == "title") return m([s](Interpreter&, CallArgs&) { return Value::string(py_title(s)); });
  if (name == "capitalize") return m([s](Interpreter&, CallArgs&) { return Value::string(py_capitalize(s)); });
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    return m([s, name](Interpreter&, CallArgs& a) {
      std::string t = need_str(a.get(0, "sub"), name.c_str(), a.line);
      if (name == "count") {
        if (t.empty()) return Value::integer(static_cast<int64_t>(utf8_decode(s).size()) + 1);
        int64_t n = 0;
        for (size_t p = s.find(t); p != std::string::npos; p = s.find(t, p + t.size())) ++n;
        return Value::integer(n);
      }
      size_t p = (name == "find" || name == "index") ? s.find(t) : s.rfind(t);
      if (p == std::string::npos) {
        if (name == "index" || name == "rindex") template_fail(a.line, "substring not found");
        return Value::integer(-1);
      }
      return Value::integer(code_point_index(s, p));
    });
  }
  if (name == "join")
    return m([s](Interpreter& in, CallArgs& a) {
      std::string out;
      bool first = true;
      for (const auto& v : py_iter(a.get(0, "iterable"), a.line)) {
        if (!v.is_string()) template_fail(a.line, "sequence item: expected str instance, " + v.type_name() + " found");
        if (!first) out += s;
        out += v.str_ref();
        first = false;
        in.check_size(out.size(), a.line);
      }
      return Value::string(std::move(out));
    });
  if (name == "format") return m([s](Interpreter&, CallArgs& a) { return Value::string(py_format(s, a)); });
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "isupper" ||
      name == "islower") {
    return m([s, name](Interpreter&, CallArgs&) {
      std::u32string in = utf8_decode(s);
      if (in.empty()) return Value::boolean(false);
      bool any_cased = false;
      for (char32_t c : in) {
        bool digit = c >= '0' && c <= '9', alpha = is_cased(c) || (c > 0x7f && !py_isspace(c) && c >= 0xaa);
        if (name == "isdigit" && !digit) return Value::boolean(false);
        if (name == "isalpha" && !alpha) return Value::boolean(false);
        if (name == "isalnum" && !alpha && !digit) return Value::boolean(false);
        if (name == "isspace" && !py_isspace(c)) return Value::boolean(false);
        if (name == "isupper" && to_lower_cp(c) != c) any_cased = true;
        if (name == "isupper" && to_upper_cp(c) != c) return Value::boolean(false);
        if (name == "islower" && to_upper_cp(c) != c) any_cased = true;
        if (name == "islower" && to_lower_cp(c) != c) return Value::boolean(false);
      }
      return Value::boolean((name == "isupper" || name == "islower") ? any_cased : true);
    });
  }
  return Value::undefined("'str object' has no attribute '" + name + "'");
}

Value dict_method(const Value& obj, const std::string& name) {
  auto m = [&](std::function<Value(Interpreter&, CallArgs&)> fn) { return Value::func(name, std::move(fn)); };
  if (name == "items")
    return m([obj](Interpreter&, CallArgs&) {
      std::vector<Value> out;
      for (const auto& kv : obj.dict_ref().items) out.push_back(Value::list({kv.first, kv.second}, true));
      return Value::list(std::move(out));
    });
  if (name == "keys" || name == "values") {
    bool keys = name == "keys";
    return m([obj, keys](Interpreter&, CallArgs&) {
      std::vector<Value> out;
      for (const auto& kv : obj.dict_ref().items) out.push_back(keys ? kv.first : kv.second);
      return Value::list(std::move(out));
    });
  }
  if (name == "get")
    return m([obj](Interpreter&, CallArgs& a) {
      const Value* v = obj.dict_ref().find(a.get(0, "key"));
      return v ? *v : a.get(1, "default", Value::none());
    });
  return Value::undefined("'dict object' has no attribute '" + name + "'");
}

Value list_method(const Value& obj, const std::string& name) {
  auto m = [&](std::function<Value(Interpreter&, CallArgs&)> fn) { return Value::func(name, std::move(fn)); };
  bool tuple = obj.list_ref().tuple;
  if (!tuple && (name == "append" || name == "extend"))  // mutating: jinja's immutable sandbox forbids these
    return m([obj, name](Interpreter& in, CallArgs& a) {
      auto& items = obj.list_ref().items;
      if (name == "append") {
        const Value& v = a.get(0, "object");
        in.check_items(items.size() + 1, Interpreter::item_bytes(v), a.line);
        items.push_back(v);
      } else {
        const std::vector<Value> more = py_iter(a.get(0, "iterable"), a.line);
        in.check_items(items.size() + more.size(), Interpreter::item_bytes(more), a.line);  // before adding them
        items.insert(items.end(), more.begin(), more.end());
      }
      return Value::none();
    });
  if (name == "index" || name == "count")
    return m([obj, name](Interpreter&, CallArgs& a) {
      Value x = a.get(0, "value");
      const auto& items = obj.list_ref().items;
      int64_t n = 0;
      for (size_t i = 0; i < items.size(); ++i) {
        if (!items[i].equals(x)) continue;
        if (name == "index") return Value::integer(static_cast<int64_t>(i));
        ++n;
      }
      if (name == "index") template_fail(a.line, x.repr() + " is not in list");
      return Value::integer(n);
    });
  return Value::undefined("'" + obj.type_name() + " object' has no attribute '" + name + "'");
}

}  // namespace

Value bound_method(const Value& obj, const std::string& name) {
  if (obj.is_string()) return str_method(obj, name);
  if (obj.is_dict() && !obj.dict_ref().ns) return dict_method(obj, name);
  if (obj.is_list()) return list_method(obj, name);
  return Value::undefined("'" + obj.type_name() + " object' has no attribute '" + name + "'");
}

Value Interpreter::get_attr(const Value& obj, const std::string& name, int line) {
  if (obj.is_undefined()) fail_undefined(obj, line);
  if (obj.is_dict()) {
    if (!obj.dict_ref().ns) {
      Value m = dict_method(obj, name);
      if (!m.is_undefined()) return m;
    }
    if (const Value* v = obj.dict_ref().find(Value::string(name))) return *v;
    return Value::undefined("'" + std::string(obj.dict_ref().ns ? "Namespace" : "dict") + " object' has no attribute '" +
                            name + "'");
  }
  return bound_method(obj, name);
}

Value Interpreter::get_item(const Value& obj, const Value& key, int line) {
  if (obj.is_undefined()) fail_undefined(obj, line);
  if (obj.is_dict()) {
    if (const Value* v = obj.dict_ref().find(key)) return *v;
    if (key.is_string()) return get_attr(obj, key.str_ref(), line);
    return Value::undefined("'dict object' has no attribute " + key.repr());
  }
  if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      int64_t n = static_cast<int64_t>(obj.list_ref().items.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined(obj.type_name() + " object has no element " + key.str());
      return obj.list_ref().items[i];
    }
    std::u32string cps = utf8_decode(obj.str_ref());
    int64_t n = static_cast<int64_t>(cps.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined("str object has no element " + key.str());
    return Value::string(one_char(cps[i]));
  }
  if (key.is_string()) return bound_method(obj, key.str_ref());
  return Value::undefined("'" + obj.type_name() + " object' has no attribute " + key.repr());
}

void add_builtin_globals(Value& globals) {
  auto& g = globals.dict_ref();
  g.set(Value::string("raise_exception"), Value::func("raise_exception", [](Interpreter&, CallArgs& a) -> Value {
          throw TemplateError("chat template: raise_exception: " + a.get(0, "message").str());
        }));
  g.set(Value::string("strftime_now"), Value::func("strftime_now", [](Interpreter&, CallArgs& a) -> Value {
          std::string fmt = a.get(0, "format").str();
          if (fmt.size() > 256) template_fail(a.line, "strftime_now: format too long");
          std::time_t t = std::time(nullptr);
          std::tm tm{};
          localtime_r(&t, &tm);
          char buf[1024];
          size_t n = fmt.empty() ? 0 : std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
          return Value::string(std::string(buf, n));
        }));
  g.set(Value::string("range"), Value::func("range", [](Interpreter& in, CallArgs& a) -> Value {
          for (const auto& v : a.pos)
            if (!v.is_int() && !v.is_bool()) template_fail(a.line, "'" + v.type_name() + "' object cannot be interpreted as an integer");
          int64_t start = 0, stop = 0, step = 1;
          if (a.pos.size() == 1) stop = a.pos[0].as_int();
          else if (a.pos.size() == 2 || a.pos.size() == 3) {
            start = a.pos[0].as_int();
            stop = a.pos[1].as_int();
            if (a.pos.size() == 3) step = a.pos[2].as_int();
          } else template_fail(a.line, "range expected 1 to 3 arguments");
          if (step == 0) template_fail(a.line, "range() arg 3 must not be zero");
          std::vector<Value> out;
          for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            if (out.size() >= 100000)
              template_fail(a.line, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
            out.push_back(Value::integer(i));
          }
          in.tick(a.line, static_cast<int64_t>(out.size()) / kRangeItemsPerStep);  // the step budget pays for its size
          return Value::list(std::move(out));
        }));
  auto make_dict = [](bool ns) {
    return [ns](Interpreter&, CallArgs& a) -> Value {
      Value d = Value::dict(ns);
      if (!a.pos.empty()) {
        if (!a.pos[0].is_dict()) template_fail(a.line, "namespace()/dict() positional argument must be a dict");
        for (const auto& kv : a.pos[0].dict_ref().items) d.dict_ref().set(kv.first, kv.second);
      }
      for (const auto& kv : a.kw) d.dict_ref().set(Value::string(kv.first), kv.second);
      return d;
    };
  };
  g.set(Value::string("namespace"), Value::func("namespace", make_dict(true)));
  g.set(Value::string("dict"), Value::func("dict", make_dict(false)));
  g.set(Value::string("joiner"), Value::func("joiner", [](Interpreter&, CallArgs& a) -> Value {
          std::string sep = a.get(0, "sep", Value::string(", ")).str();
          auto used = std::make_shared<bool>(false);
          return Value::func("joiner", [sep, used](Interpreter&, CallArgs&) {
            if (!*used) {
              *used = true;
              return Value::string("");
            }
            return Value::string(sep);
          });
        }));
}

}  // namespace hearth::chat
