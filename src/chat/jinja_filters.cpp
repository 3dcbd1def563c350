// Jinja's builtin filters and tests as chat templates use them, with transformers' tojson
// (json.dumps, ensure_ascii=False, insertion key order unless sort_keys). Not attribute/method access
// (jinja_builtins.cpp).
#include <algorithm>
#include <cmath>

#include "chat/jinja_builtins.h"
#include "chat/jinja_interpreter.h"

namespace hearth::chat {
namespace {

// Jinja's soft_str: undefined prints as "", everything else as Python str().
std::string soft_str(const Value& v) { return v.str(); }

int64_t arg_int(const Value& v, const char* what, int line) {
  if (!v.is_int() && !v.is_bool()) template_fail(line, std::string(what) + ": expected an integer, got " + v.type_name());
  return v.as_int();
}

// Resolves a dotted attribute path ("a.b", "items.0") like jinja's make_attrgetter.
Value attr_path(Interpreter& in, const Value& obj, const std::string& path, int line) {
  Value cur = obj;
  size_t pos = 0;
  while (true) {
    size_t dot = path.find('.', pos);
    std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    cur = digits ? in.get_item(cur, Value::integer(std::stoll(part.substr(0, 18))), line)
                 : in.get_item(cur, Value::string(part), line);
    if (dot == std::string::npos) return cur;
    pos = dot + 1;
  }
}

// Sort key comparison for sort/unique/min/max (case-insensitive strings unless case_sensitive).
Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::string(py_lower(v.str_ref()));
  return v;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// printf-style `value % args` for the format filter: %s %r %d %i %f %%.
std::string percent_format(const std::string& fmt, const std::vector<Value>& args, int line) {
  std::string out;
  size_t k = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') { out += fmt[i]; continue; }
    if (++i >= fmt.size()) template_fail(line, "format: incomplete format");
    char c = fmt[i];
    if (c == '%') { out += '%'; continue; }
    if (k >= args.size()) template_fail(line, "format: not enough arguments for format string");
    const Value& v = args[k++];
    if (c == 's') out += v.str();
    else if (c == 'r') out += v.repr();
    else if (c == 'd' || c == 'i') {
      if (!v.is_number()) template_fail(line, "format: %d format: a real number is required, not " + v.type_name());
      out += std::to_string(v.is_float() ? static_cast<int64_t>(v.as_double()) : v.as_int());
    } else if (c == 'f') {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%f", v.as_double());
      out += buf;
    } else template_fail(line, std::string("format: unsupported format character '") + c + "'");
  }
  if (k < args.size()) template_fail(line, "format: not all arguments converted during string formatting");
  return out;
}

// Python round(x, ndigits) on a double: round-half-even on the decimal value, as CPython does
// for ndigits via correctly rounded string conversion.
double py_round(double x, int64_t nd) {
  if (!std::isfinite(x)) return x;
  if (nd > 300) return x;
  if (nd < -308) return 0.0 * x;
  char buf[512];
  std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(std::max<int64_t>(nd, 0)), x);  // glibc: exact, half-even
  if (nd >= 0) return std::strtod(buf, nullptr);
  double p = std::pow(10.0, static_cast<double>(-nd));
  double y = x / p, r = std::nearbyint(y);
  return r * p;
}

}  // namespace

Value Interpreter::filter(const std::string& name, const Value& v, CallArgs& a, int line) {
  a.line = line;
  tick(line);
  if (name == "default" || name == "d") {
    bool boolean = a.get(1, "boolean", Value::boolean(false)).truthy();
    if (v.is_undefined() || (boolean && !v.truthy())) return a.get(0, "default_value", Value::string(""));
    return v;
  }
  if (name == "tojson") {
    Value ea = a.get(0, "ensure_ascii", Value::boolean(false)), ind = a.get(1, "indent", Value::none());
    Value seps = a.get(2, "separators", Value::none());
    const bool sort_keys = a.get(3, "sort_keys", Value::boolean(false)).truthy();
    int indent = -1;
    std::string indent_str;
    if (ind.is_int()) indent = static_cast<int>(std::clamp<int64_t>(ind.as_int(), 0, 64));
    else if (ind.is_string()) { indent = 0; indent_str = ind.str_ref(); }
    else if (!ind.is_none()) template_fail(line, "tojson: indent must be an int, str or None");
    bool pretty = indent >= 0 || !indent_str.empty();
    std::string item_sep = pretty ? "," : ", ", key_sep = ": ";
    if (!seps.is_none()) {
      if (!seps.is_list() || seps.list_ref().items.size() != 2) template_fail(line, "tojson: separators must be a pair");
      item_sep = seps.list_ref().items[0].str();
      key_sep = seps.list_ref().items[1].str();
    }
    try {
      return Value::string(v.to_json(ea.truthy(), indent, indent_str, item_sep, key_sep, sort_keys));
    } catch (const TemplateError& e) {
      std::string msg = e.what();
      template_fail(line, msg.substr(msg.find(": ") + 2));
    }
  }
  if (name == "safe" || name == "string") return name == "safe" ? v : Value::string(soft_str(v));
  if (name == "e" || name == "escape" || name == "forceescape") return Value::string(html_escape(soft_str(v)));
  if (name == "trim") {
    Value chars = a.get(0, "chars", Value::none());
    std::string c = chars.is_none() ? "" : chars.str();
    return Value::string(py_strip(soft_str(v), chars.is_none() ? nullptr : &c, true, true));
  }
  if (name == "upper") return Value::string(py_upper(soft_str(v)));
  if (name == "lower") return Value::string(py_lower(soft_str(v)));
  if (name == "capitalize") return Value::string(py_capitalize(soft_str(v)));
  if (name == "title") {  // jinja: capitalise after runs of [-\s({[<]
    std::string s = soft_str(v), out, piece;
    std::u32string cps = utf8_decode(s);
    auto is_sep = [](char32_t c) {
      return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || c == ' ' || (c >= 9 && c <= 13);
    };
    size_t i = 0;
    while (i < cps.size()) {
      size_t j = i;
      bool sep = is_sep(cps[i]);
      while (j < cps.size() && is_sep(cps[j]) == sep) ++j;
      std::string part = utf8_encode(cps.substr(i, j - i));
      std::u32string pc = utf8_decode(part);
      out += py_upper(utf8_encode(pc.substr(0, 1))) + py_lower(utf8_encode(pc.substr(1)));
      i = j;
    }
    return Value::string(out);
  }
  if (name == "replace") {
    Value cnt = a.get(2, "count", Value::none());
    std::string r = py_replace(soft_str(v), a.get(0, "old").str(), a.get(1, "new").str(), cnt.is_int() ? cnt.as_int() : -1);
    check_size(r.size(), line);
    return Value::string(std::move(r));
  }
  if (name == "length" || name == "count") return Value::integer(py_len(v, line));
  if (name == "wordcount") return Value::integer(static_cast<int64_t>(py_split(soft_str(v), nullptr, -1, false, line).size()));
  if (name == "first" || name == "last") {
    std::vector<Value> items = py_iter(v, line);
    if (items.empty()) return Value::undefined("No " + name + " item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value::list(py_iter(v, line));
  if (name == "reverse") {
    if (v.is_string()) {
      std::u32string c = utf8_decode(v.str_ref());
      std::reverse(c.begin(), c.end());
      return Value::string(utf8_encode(c));
    }
    std::vector<Value> items = py_iter(v, line);
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items));
  }
  if (name == "items") {
    if (v.is_undefined()) return Value::list();
    if (!v.is_dict()) template_fail(line, "items: can only get item pairs from a mapping");
    std::vector<Value> out;
    for (const auto& kv : v.dict_ref().items) out.push_back(Value::list({kv.first, kv.second}, true));
    return Value::list(std::move(out));
  }
  if (name == "dictsort") {
    if (!v.is_dict()) template_fail(line, "dictsort: value is not a mapping");
    bool cs = a.get(0, "case_sensitive", Value::boolean(false)).truthy();
    bool by_value = a.get(1, "by", Value::string("key")).str() == "value";
    bool rev = a.get(2, "reverse", Value::boolean(false)).truthy();
    std::vector<Value> out;
    for (const auto& kv : v.dict_ref().items) out.push_back(Value::list({kv.first, kv.second}, true));
    std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
      int k = by_value ? 1 : 0;
      Value kx = sort_key(x.list_ref().items[k], cs), ky = sort_key(y.list_ref().items[k], cs);
      return rev ? compare_values(ky, kx, line) : compare_values(kx, ky, line);
    });
    return Value::list(std::move(out));
  }
  if (name == "join") {
    std::string sep = a.get(0, "d", Value::string("")).str();
    Value attr = a.get(1, "attribute", Value::none());
    std::string out;
    bool first = true;
    for (const auto& item : py_iter(v, line)) {
      if (!first) out += sep;
      out += attr.is_none() ? soft_str(item) : soft_str(attr_path(*this, item, attr.str(), line));
      first = false;
      check_size(out.size(), line);
    }
    return Value::string(std::move(out));
  }
  if (name == "int") {
    Value def = a.get(0, "default", Value::integer(0));
    int64_t base = a.get(1, "base", Value::integer(10)).as_int();
    if (v.is_int()) return v;
    if (v.is_bool()) return Value::integer(v.as_int());
    if (v.is_float()) return std::isfinite(v.as_double()) ? Value::integer(static_cast<int64_t>(v.as_double())) : def;
    if (v.is_string()) {
      std::string s = py_strip(v.str_ref(), nullptr, true, true);
      try {
        size_t used = 0;
        long long r = std::stoll(s, &used, static_cast<int>(base));
        if (used == s.size() && !s.empty()) return Value::integer(r);
      } catch (const std::exception&) {
      }
      try {
        size_t used = 0;
        double d = std::stod(s, &used);
        if (used == s.size() && std::isfinite(d)) return Value::integer(static_cast<int64_t>(d));
      } catch (const std::exception&) {
      }
    }
    return def;
  }
  if (name == "float") {
    Value def = a.get(0, "default", Value::number(0.0));
    if (v.is_number()) return Value::number(v.as_double());
    if (v.is_string()) {
      std::string s = py_strip(v.str_ref(), nullptr, true, true);
      try {
        size_t used = 0;
        double d = std::stod(s, &used);
        if (used == s.size()) return Value::number(d);
      } catch (const std::exception&) {
      }
    }
    return def;
  }
  if (name == "abs") {
    if (v.is_float()) return Value::number(std::fabs(v.as_double()));
    if (v.is_int() || v.is_bool()) return v.as_int() == INT64_MIN ? Value::number(-v.as_double()) : Value::integer(std::llabs(v.as_int()));
    template_fail(line, "bad operand type for abs(): '" + v.type_name() + "'");
  }
  if (name == "round") {
    int64_t prec = arg_int(a.get(0, "precision", Value::integer(0)), "round", line);
    std::string method = a.get(1, "method", Value::string("common")).str();
    if (!v.is_number()) template_fail(line, "round: value must be a number");
    double x = v.as_double();
    if (method == "common") return Value::number(py_round(x, prec));
    double p = std::pow(10.0, static_cast<double>(prec));
    if (method == "floor") return Value::number(std::floor(x * p) / p);
    if (method == "ceil") return Value::number(std::ceil(x * p) / p);
    template_fail(line, "round: method must be 'common', 'ceil' or 'floor'");
  }
  if (name == "indent") {
    Value w = a.get(0, "width", Value::integer(4));
    bool first = a.get(1, "first", Value::boolean(false)).truthy(), blank = a.get(2, "blank", Value::boolean(false)).truthy();
    std::string ind = w.is_string() ? w.str_ref() : std::string(std::clamp<int64_t>(arg_int(w, "indent", line), 0, 256), ' ');
    std::string s = soft_str(v) + "\n";
    std::vector<std::string> lines = py_splitlines(s);
    std::string rv;
    if (blank) {
      for (size_t i = 0; i < lines.size(); ++i) rv += (i ? "\n" + ind : "") + lines[i];
    } else {
      rv = lines.empty() ? "" : lines[0];
      for (size_t i = 1; i < lines.size(); ++i) rv += "\n" + (lines[i].empty() ? "" : ind) + lines[i];
    }
    if (first) rv = ind + rv;
    check_size(rv.size(), line);
    return Value::string(std::move(rv));
  }
  if (name == "center") {
    int64_t width = std::min<int64_t>(arg_int(a.get(0, "width", Value::integer(80)), "center", line), 1 << 20);
    std::string s = soft_str(v);
    int64_t n = static_cast<int64_t>(utf8_decode(s).size());
    if (width <= n) return Value::string(s);
    int64_t pad = width - n, left = pad / 2 + (pad & width & 1);
    return Value::string(std::string(left, ' ') + s + std::string(pad - left, ' '));
  }
  if (name == "format") return Value::string(percent_format(soft_str(v), a.pos, line));
  if (name == "attr") return get_attr(v, a.get(0, "name").str(), line);
  if (name == "map") {
    std::vector<Value> out;
    Value attr = a.get(99, "attribute", Value::none());
    if (!attr.is_none()) {
      Value def = a.get(99, "default");
      for (const auto& item : py_iter(v, line)) {
        Value r = attr_path(*this, item, attr.str(), line);
        out.push_back(r.is_undefined() && a.has(99, "default") ? def : r);
      }
      return Value::list(std::move(out));
    }
    if (a.pos.empty()) template_fail(line, "map: requires a filter name or attribute=");
    std::string fname = a.pos[0].str();
    CallArgs rest;
    rest.line = line;
    rest.pos.assign(a.pos.begin() + 1, a.pos.end());
    rest.kw = a.kw;
    for (const auto& item : py_iter(v, line)) {
      CallArgs copy = rest;
      out.push_back(filter(fname, item, copy, line));
    }
    return Value::list(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    bool attr_mode = name == "selectattr" || name == "rejectattr", want = name == "select" || name == "selectattr";
    size_t off = attr_mode ? 1 : 0;
    std::string attr = attr_mode ? a.get(0, "attribute").str() : "";
    std::string tname = a.pos.size() > off ? a.pos[off].str() : "";
    CallArgs targs;
    targs.line = line;
    if (a.pos.size() > off + 1) targs.pos.assign(a.pos.begin() + off + 1, a.pos.end());
    std::vector<Value> out;
    for (const auto& item : py_iter(v, line)) {
      Value probe = attr_mode ? attr_path(*this, item, attr, line) : item;
      CallArgs copy = targs;
      bool ok = tname.empty() ? probe.truthy() : test(tname, probe, copy, line);
      if (ok == want) out.push_back(item);
    }
    return Value::list(std::move(out));
  }
  if (name == "unique") {
    bool cs = a.get(0, "case_sensitive", Value::boolean(false)).truthy();
    Value attr = a.get(1, "attribute", Value::none());
    std::vector<Value> out, seen;
    for (const auto& item : py_iter(v, line)) {
      Value key = sort_key(attr.is_none() ? item : attr_path(*this, item, attr.str(), line), cs);
      bool dup = false;
      for (const auto& s : seen) dup = dup || s.equals(key);
      if (!dup) {
        seen.push_back(key);
        out.push_back(item);
      }
      tick(line);
    }
    return Value::list(std::move(out));
  }
  if (name == "sort" || name == "min" || name == "max") {
    bool is_sort = name == "sort";
    bool rev = is_sort && a.get(0, "reverse", Value::boolean(false)).truthy();
    bool cs = a.get(is_sort ? 1 : 0, "case_sensitive", Value::boolean(false)).truthy();
    Value attr = a.get(is_sort ? 2 : 1, "attribute", Value::none());
    std::vector<Value> items = py_iter(v, line);
    auto key = [&](const Value& x) { return sort_key(attr.is_none() ? x : attr_path(*this, x, attr.str(), line), cs); };
    if (!is_sort) {
      if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
      Value best = items[0];
      for (size_t i = 1; i < items.size(); ++i) {
        bool less = compare_values(key(items[i]), key(best), line);
        bool greater = compare_values(key(best), key(items[i]), line);
        if (name == "min" ? less : greater) best = items[i];
      }
      return best;
    }
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      return rev ? compare_values(key(y), key(x), line) : compare_values(key(x), key(y), line);
    });
    return Value::list(std::move(items));
  }
  if (name == "sum") {
    Value attr = a.get(0, "attribute", Value::none());
    Value total = a.get(1, "start", Value::integer(0));
    for (const auto& item : py_iter(v, line)) {
      Value x = attr.is_none() ? item : attr_path(*this, item, attr.str(), line);
      total = binary_op("+", total, x, line);
    }
    return total;
  }
  if (name == "batch") {
    int64_t n = arg_int(a.get(0, "linecount"), "batch", line);
    if (n <= 0) template_fail(line, "batch: linecount must be positive");
    Value fill = a.get(1, "fill_with", Value::none());
    std::vector<Value> out, cur;
    for (const auto& item : py_iter(v, line)) {
      cur.push_back(item);
      if (static_cast<int64_t>(cur.size()) == n) {
        out.push_back(Value::list(std::move(cur)));
        cur.clear();
      }
    }
    if (!cur.empty()) {
      if (!fill.is_none())
        while (static_cast<int64_t>(cur.size()) < n) cur.push_back(fill);
      out.push_back(Value::list(std::move(cur)));
    }
    return Value::list(std::move(out));
  }
  template_fail(line, "no filter named '" + name + "'");
}

bool Interpreter::test(const std::string& name, const Value& v, CallArgs& a, int line) {
  a.line = line;
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict() && !v.dict_ref().ns;
  if (name == "iterable") return v.is_list() || v.is_string() || v.is_undefined() || (v.is_dict() && !v.dict_ref().ns);
  if (name == "sequence") return v.is_list() || v.is_string() || (v.is_dict() && !v.dict_ref().ns);
  if (name == "callable") return v.is_func();
  if (name == "escaped") return false;
  if (name == "odd" || name == "even") {
    if (!v.is_int() && !v.is_bool()) template_fail(line, name + " test needs an integer, got " + v.type_name());
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    int64_t d = arg_int(a.get(0, "num"), "divisibleby", line);
    if (d == 0) template_fail(line, "integer division or modulo by zero");
    if (!v.is_int() && !v.is_bool()) template_fail(line, "divisibleby needs an integer, got " + v.type_name());
    return d == -1 || v.as_int() % d == 0;
  }
  if (name == "lower") return v.is_string() && py_lower(v.str_ref()) == v.str_ref();
  if (name == "upper") return v.is_string() && py_upper(v.str_ref()) == v.str_ref();
  if (name == "sameas") {
    Value o = a.get(0, "other");
    if (v.kind() != o.kind()) return false;
    if (v.is_none() || v.is_bool()) return v.equals(o);
    if (v.is_list()) return &v.list_ref() == &o.list_ref();
    if (v.is_dict()) return &v.dict_ref() == &o.dict_ref();
    return v.equals(o) && (v.is_int() ? (v.as_int() >= -5 && v.as_int() <= 256) : false);
  }
  static const std::pair<const char*, const char*> kCmp[] = {
      {"eq", "=="}, {"equalto", "=="}, {"==", "=="}, {"ne", "!="}, {"!=", "!="}, {"lt", "<"}, {"lessthan", "<"},
      {"<", "<"}, {"le", "<="}, {"<=", "<="}, {"gt", ">"}, {"greaterthan", ">"}, {">", ">"}, {"ge", ">="},
      {">=", ">="}, {"in", "in"}};
  for (const auto& [tn, op] : kCmp)
    if (name == tn) return compare_op(op, v, a.get(0, "other"), line);
  template_fail(line, "no test named '" + name + "'");
}

}  // namespace hearth::chat
