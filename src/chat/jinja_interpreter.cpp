// Evaluator of parsed chat templates: statements (if/for/set/macro/filter/with/generation),
// expressions with Python operator semantics, jinja2 scoping. Filters, tests and methods live in
// jinja_builtins.cpp.
#include "chat/jinja_interpreter.h"

#include <algorithm>
#include <cmath>

namespace hearth::chat {

void fail_undefined(const Value& v, int line) {
  template_fail(line, v.str_ref().empty() ? "value is undefined" : v.str_ref());
}

namespace {
int64_t py_floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
int64_t py_mod(int64_t a, int64_t b) {
  int64_t m = a % b;
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}
std::string op_types(const char* op, const Value& a, const Value& b) {
  return std::string("unsupported operand type(s) for ") + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'";
}
}  // namespace

std::string Interpreter::render(const Body& body, const Value& globals) {
  Scope root;
  root_ = &root;
  if (globals.is_dict())
    for (const auto& kv : globals.dict_ref().items) root.vars[kv.first.str()] = kv.second;
  std::string out;
  root_out_ = &out;
  generation_spans_.clear();
  exec_body(body, root, out);
  root_ = nullptr;
  root_out_ = nullptr;
  return out;
}

Interpreter::Flow Interpreter::exec_body(const Body& body, Scope& scope, std::string& out) {
  for (const auto& s : body) {
    Flow f = exec(*s, scope, out);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Interpreter::Flow Interpreter::exec(const Stmt& s, Scope& scope, std::string& out) {
  tick(s.line);
  switch (s.kind) {
    case Stmt::Kind::Text: append(out, s.text, s.line); break;
    case Stmt::Kind::Output: append(out, eval(*s.exprs[0], scope).str(), s.line); break;
    case Stmt::Kind::If:
      for (size_t i = 0; i < s.bodies.size(); ++i) {
        if (i >= s.exprs.size() || eval(*s.exprs[i], scope).truthy()) return exec_body(s.bodies[i], scope, out);
      }
      break;
    case Stmt::Kind::For: exec_for(s, scope, out); break;
    case Stmt::Kind::Set: {
      Value v = eval(*s.exprs[0], scope);
      if (!s.attr.empty()) {
        Value* target = scope.lookup(s.targets[0]);
        if (!target || !target->is_dict() || !target->dict_ref().ns)
          template_fail(s.line, "cannot assign attribute on non-namespace object");
        target->dict_ref().set(Value::string(s.attr), v);
      } else if (s.targets.size() == 1) {
        scope.vars[s.targets[0]] = v;
      } else {
        if (!v.is_list()) template_fail(s.line, "cannot unpack non-sequence " + v.type_name());
        const auto& items = v.list_ref().items;
        if (items.size() != s.targets.size())
          template_fail(s.line, "expected " + std::to_string(s.targets.size()) + " values to unpack, got " +
                                    std::to_string(items.size()));
        for (size_t i = 0; i < items.size(); ++i) scope.vars[s.targets[i]] = items[i];
      }
      break;
    }
    case Stmt::Kind::SetBlock: {
      std::string text;
      Scope inner{&scope, {}};
      exec_body(s.bodies[0], inner, text);
      Value v = Value::string(std::move(text));
      if (s.exprs[0]) v = apply_filter_chain(*s.exprs[0], v, scope);
      scope.vars[s.targets[0]] = v;
      break;
    }
    case Stmt::Kind::Macro: scope.vars[s.text] = make_macro(s, scope); break;
    case Stmt::Kind::FilterBlock: {
      std::string text;
      Scope inner{&scope, {}};
      exec_body(s.bodies[0], inner, text);
      append(out, apply_filter_chain(*s.exprs[0], Value::string(std::move(text)), scope).str(), s.line);
      break;
    }
    case Stmt::Kind::With: {
      Scope inner{&scope, {}};
      for (size_t i = 0; i < s.targets.size(); ++i) inner.vars[s.targets[i]] = eval(*s.exprs[i], scope);
      return exec_body(s.bodies[0], inner, out);
    }
    case Stmt::Kind::Scope: {  // {% generation %}: rendered in place, its span recorded
      Scope inner{&scope, {}};
      std::string text;
      exec_body(s.bodies[0], inner, text);
      const size_t begin = root_out_ ? root_out_->size() : out.size();
      generation_spans_.emplace_back(begin, begin + text.size());
      append(out, text, s.line);
      break;
    }
    case Stmt::Kind::Break: return Flow::Break;
    case Stmt::Kind::Continue: return Flow::Continue;
  }
  return Flow::Normal;
}

void Interpreter::exec_for(const Stmt& s, Scope& scope, std::string& out) {
  Value seq = eval(*s.exprs[0], scope);
  std::vector<Value> items;
  switch (seq.kind()) {
    case Value::Kind::Undefined: break;  // iterating undefined yields nothing
    case Value::Kind::List: items = seq.list_ref().items; break;
    case Value::Kind::Dict:
      if (seq.dict_ref().ns) template_fail(s.line, "'Namespace' object is not iterable");
      for (const auto& kv : seq.dict_ref().items) items.push_back(kv.first);
      break;
    case Value::Kind::String:
      for (char32_t c : utf8_decode(seq.str_ref())) items.push_back(Value::string(utf8_encode(std::u32string(1, c))));
      break;
    default: template_fail(s.line, "'" + seq.type_name() + "' object is not iterable");
  }
  auto bind = [&](Scope& sc, const Value& item) {
    if (s.targets.size() == 1) {
      sc.vars[s.targets[0]] = item;
      return;
    }
    std::vector<Value> parts;
    if (item.is_list()) parts = item.list_ref().items;
    else if (item.is_string())
      for (char32_t c : utf8_decode(item.str_ref())) parts.push_back(Value::string(utf8_encode(std::u32string(1, c))));
    else template_fail(s.line, "cannot unpack non-iterable " + item.type_name() + " object");
    if (parts.size() != s.targets.size())
      template_fail(s.line, (parts.size() > s.targets.size() ? "too many values to unpack (expected "
                                                              : "not enough values to unpack (expected ") +
                                std::to_string(s.targets.size()) + ", got " + std::to_string(parts.size()) + ")");
    for (size_t i = 0; i < parts.size(); ++i) sc.vars[s.targets[i]] = parts[i];
  };
  if (s.exprs[1]) {  // `for x in xs if cond`: filter before loop.length is known
    std::vector<Value> kept;
    for (const auto& item : items) {
      Scope probe{&scope, {}};
      bind(probe, item);
      if (eval(*s.exprs[1], probe).truthy()) kept.push_back(item);
    }
    items.swap(kept);
  }
  if (items.empty()) {
    Scope inner{&scope, {}};
    exec_body(s.bodies[1], inner, out);
    return;
  }
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    tick(s.line, kLoopIterationSteps);
    Scope inner{&scope, {}};
    bind(inner, items[i]);
    Value loop = Value::dict();
    auto& d = loop.dict_ref();
    d.set(Value::string("index"), Value::integer(i + 1));
    d.set(Value::string("index0"), Value::integer(i));
    d.set(Value::string("revindex"), Value::integer(n - i));
    d.set(Value::string("revindex0"), Value::integer(n - i - 1));
    d.set(Value::string("first"), Value::boolean(i == 0));
    d.set(Value::string("last"), Value::boolean(i == n - 1));
    d.set(Value::string("length"), Value::integer(n));
    d.set(Value::string("depth"), Value::integer(1));
    d.set(Value::string("depth0"), Value::integer(0));
    d.set(Value::string("previtem"), i > 0 ? items[i - 1] : Value::undefined("'loop.previtem' is undefined"));
    d.set(Value::string("nextitem"), i + 1 < n ? items[i + 1] : Value::undefined("'loop.nextitem' is undefined"));
    d.set(Value::string("cycle"), Value::func("cycle", [i](Interpreter&, CallArgs& a) -> Value {
            if (a.pos.empty()) template_fail(a.line, "no items for cycling given");
            return a.pos[static_cast<size_t>(i) % a.pos.size()];
          }));
    inner.vars["loop"] = loop;
    if (exec_body(s.bodies[0], inner, out) == Flow::Break) break;
  }
}

Value Interpreter::make_macro(const Stmt& s, Scope& scope) {
  const Stmt* def = &s;
  return Value::func(s.text, [this, def](Interpreter&, CallArgs& args) -> Value {
    if (args.pos.size() > def->targets.size())
      template_fail(args.line, "macro '" + def->text + "' takes not more than " + std::to_string(def->targets.size()) +
                                   " argument(s)");
    if (call_depth_ >= limits_.max_call_depth) template_fail(args.line, "macro recursion too deep");
    ++call_depth_;
    Scope inner{root_, {}};
    for (const auto& kv : args.kw) {
      bool known = false;
      for (const auto& p : def->targets) known = known || p == kv.first;
      if (!known) template_fail(args.line, "macro '" + def->text + "' takes no keyword argument '" + kv.first + "'");
    }
    for (size_t i = 0; i < def->targets.size(); ++i) {
      if (args.has(i, def->targets[i])) inner.vars[def->targets[i]] = args.get(i, def->targets[i]);
      else if (def->exprs[i]) inner.vars[def->targets[i]] = eval(*def->exprs[i], inner);
      else inner.vars[def->targets[i]] = Value::undefined("parameter '" + def->targets[i] + "' was not provided");
    }
    std::string text;
    exec_body(def->bodies[0], inner, text);
    --call_depth_;
    return Value::string(std::move(text));
  });
}

CallArgs Interpreter::eval_args(const Expr& e, size_t first, Scope& scope) {
  CallArgs args;
  args.line = e.line;
  for (size_t i = first; i < e.kids.size(); ++i) {
    const std::string& kw = e.kwnames[i - 1];
    Value v = eval(*e.kids[i], scope);
    if (kw.empty()) args.pos.push_back(std::move(v));
    else args.kw.emplace_back(kw, std::move(v));
  }
  return args;
}

Value Interpreter::apply_filter_chain(const Expr& chain, Value operand, Scope& scope) {
  Value inner = chain.kids[0] ? apply_filter_chain(*chain.kids[0], operand, scope) : operand;
  CallArgs args = eval_args(chain, 1, scope);
  return filter(chain.name, inner, args, chain.line);
}

Value Interpreter::eval(const Expr& e, Scope& scope) {
  tick(e.line);
  switch (e.kind) {
    case Expr::Kind::Literal: return e.value;
    case Expr::Kind::Name: {
      if (Value* v = scope.lookup(e.name)) return charge(*v, e.line);
      return Value::undefined("'" + e.name + "' is undefined");
    }
    case Expr::Kind::List:
    case Expr::Kind::Tuple: {
      std::vector<Value> items;
      for (const auto& k : e.kids) items.push_back(eval(*k, scope));
      return Value::list(std::move(items), e.kind == Expr::Kind::Tuple);
    }
    case Expr::Kind::Dict: {
      Value d = Value::dict();
      for (size_t i = 0; i + 1 < e.kids.size(); i += 2) {
        Value k = eval(*e.kids[i], scope);
        if (k.is_list() || k.is_dict() || k.is_undefined()) template_fail(e.line, "unhashable dict key type '" + k.type_name() + "'");
        d.dict_ref().set(k, eval(*e.kids[i + 1], scope));
      }
      return d;
    }
    case Expr::Kind::Attr: {
      Value v = get_attr(eval(*e.kids[0], scope), e.name, e.line);
      charge(v, e.line);
      return v;
    }
    case Expr::Kind::Item: {
      Value v = get_item(eval(*e.kids[0], scope), eval(*e.kids[1], scope), e.line);
      charge(v, e.line);
      return v;
    }
    case Expr::Kind::Slice: {
      Value obj = eval(*e.kids[0], scope);
      Value parts[3];
      for (int i = 0; i < 3; ++i) parts[i] = e.kids[i + 1] ? eval(*e.kids[i + 1], scope) : Value::none();
      return eval_slice(obj, parts[0], parts[1], parts[2], e.line);
    }
    case Expr::Kind::Unary: {
      Value v = eval(*e.kids[0], scope);
      if (v.is_undefined()) fail_undefined(v, e.line);
      if (!v.is_number()) template_fail(e.line, "bad operand type for unary " + e.name + ": '" + v.type_name() + "'");
      if (e.name == "+") return v.is_bool() ? Value::integer(v.as_int()) : v;
      if (v.is_float()) return Value::number(-v.as_double());
      if (v.as_int() == INT64_MIN) return Value::number(-v.as_double());
      return Value::integer(-v.as_int());
    }
    case Expr::Kind::Not: return Value::boolean(!eval(*e.kids[0], scope).truthy());
    case Expr::Kind::Binary: return eval_binary(e.name, eval(*e.kids[0], scope), eval(*e.kids[1], scope), e.line);
    case Expr::Kind::Compare: {
      Value left = eval(*e.kids[0], scope);
      for (size_t i = 0; i < e.ops.size(); ++i) {
        Value right = eval(*e.kids[i + 1], scope);
        if (!compare(e.ops[i], left, right, e.line)) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case Expr::Kind::And: {
      Value a = eval(*e.kids[0], scope);
      return a.truthy() ? eval(*e.kids[1], scope) : a;
    }
    case Expr::Kind::Or: {
      Value a = eval(*e.kids[0], scope);
      return a.truthy() ? a : eval(*e.kids[1], scope);
    }
    case Expr::Kind::Cond: {
      if (eval(*e.kids[1], scope).truthy()) return eval(*e.kids[0], scope);
      if (e.kids[2]) return eval(*e.kids[2], scope);
      return Value::undefined("the inline if-expression evaluated to false and no else section was defined");
    }
    case Expr::Kind::Call: {
      Value fn = eval(*e.kids[0], scope);
      CallArgs args = eval_args(e, 1, scope);
      return call(fn, args, e.line);
    }
    case Expr::Kind::Filter: {
      Value v = e.kids[0] ? eval(*e.kids[0], scope) : Value();
      CallArgs args = eval_args(e, 1, scope);
      return filter(e.name, v, args, e.line);
    }
    case Expr::Kind::Test: {
      Value v = eval(*e.kids[0], scope);
      CallArgs args = eval_args(e, 1, scope);
      bool r = test(e.name, v, args, e.line);
      return Value::boolean(e.negated ? !r : r);
    }
  }
  return Value();
}

Value Interpreter::call(const Value& fn, CallArgs& args, int line) {
  if (fn.is_undefined()) fail_undefined(fn, line);
  if (!fn.is_func()) template_fail(line, "'" + fn.type_name() + "' object is not callable");
  args.line = line;
  return fn.func_ref().fn(*this, args);
}

Value Interpreter::eval_binary(const std::string& op, const Value& a, const Value& b, int line) {
  if (op == "~") {
    std::string s = a.str();
    std::string t = b.str();
    check_size(s.size() + t.size(), line);
    return Value::string(s + t);
  }
  if (a.is_undefined()) fail_undefined(a, line);
  if (b.is_undefined()) fail_undefined(b, line);
  const char* o = op.c_str();
  bool ints = (a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool());
  bool nums = a.is_number() && b.is_number();
  if (op == "+") {
    if (ints) {
      int64_t r;
      if (!__builtin_add_overflow(a.as_int(), b.as_int(), &r)) return Value::integer(r);
      return Value::number(a.as_double() + b.as_double());
    }
    if (nums) return Value::number(a.as_double() + b.as_double());
    if (a.is_string() && b.is_string()) {
      check_size(a.str_ref().size() + b.str_ref().size(), line);
      return Value::string(a.str_ref() + b.str_ref());
    }
    if (a.is_list() && b.is_list() && a.list_ref().tuple == b.list_ref().tuple) {
      check_items(a.list_ref().items.size() + b.list_ref().items.size(),
                  item_bytes(a.list_ref().items) + item_bytes(b.list_ref().items), line);  // before building it
      std::vector<Value> items = a.list_ref().items;
      items.insert(items.end(), b.list_ref().items.begin(), b.list_ref().items.end());
      return Value::list(std::move(items), a.list_ref().tuple);
    }
    if (a.is_string() || b.is_string())
      template_fail(line, a.is_string() ? "can only concatenate str (not \"" + b.type_name() + "\") to str"
                                        : op_types(o, a, b));
    template_fail(line, op_types(o, a, b));
  }
  if (op == "-") {
    if (ints) {
      int64_t r;
      if (!__builtin_sub_overflow(a.as_int(), b.as_int(), &r)) return Value::integer(r);
    }
    if (nums) return Value::number(a.as_double() - b.as_double());
    template_fail(line, op_types(o, a, b));
  }
  if (op == "*") {
    if (ints) {
      int64_t r;
      if (!__builtin_mul_overflow(a.as_int(), b.as_int(), &r)) return Value::integer(r);
    }
    if (nums) return Value::number(a.as_double() * b.as_double());
    const Value* seq = (a.is_string() || a.is_list()) ? &a : (b.is_string() || b.is_list()) ? &b : nullptr;
    const Value* cnt = seq == &a ? &b : &a;
    if (seq && (cnt->is_int() || cnt->is_bool())) {
      int64_t n = std::max<int64_t>(0, cnt->as_int());
      size_t unit = seq->is_string() ? seq->str_ref().size() : seq->list_ref().items.size();
      if (unit && static_cast<uint64_t>(n) > limits_.max_output_bytes / unit) check_size(limits_.max_output_bytes + 1, line);
      // The result counts against the total too.
      if (seq->is_string()) {
        check_size(unit * static_cast<size_t>(n), line);
      } else {
        const size_t unit_bytes = item_bytes(seq->list_ref().items);
        if (unit_bytes && static_cast<uint64_t>(n) > limits_.max_output_bytes / unit_bytes)  // before unit_bytes * n overflows
          template_fail(line, "list result exceeds the size limit");
        check_items(unit * static_cast<size_t>(n), unit_bytes * static_cast<size_t>(n), line);
      }
      if (seq->is_string()) {
        std::string r;
        for (int64_t i = 0; i < n; ++i) r += seq->str_ref();
        return Value::string(std::move(r));
      }
      std::vector<Value> items;
      for (int64_t i = 0; i < n; ++i) items.insert(items.end(), seq->list_ref().items.begin(), seq->list_ref().items.end());
      return Value::list(std::move(items), seq->list_ref().tuple);
    }
    template_fail(line, op_types(o, a, b));
  }
  if (!nums) template_fail(line, op_types(o, a, b));
  if (op == "/") {
    if (b.as_double() == 0) template_fail(line, "division by zero");
    return Value::number(a.as_double() / b.as_double());
  }
  if (op == "//") {
    if (b.as_double() == 0) template_fail(line, "integer division or modulo by zero");
    if (ints) {
      if (a.as_int() == INT64_MIN && b.as_int() == -1) return Value::number(-a.as_double());
      return Value::integer(py_floordiv(a.as_int(), b.as_int()));
    }
    return Value::number(std::floor(a.as_double() / b.as_double()));
  }
  if (op == "%") {
    if (b.as_double() == 0) template_fail(line, "integer division or modulo by zero");
    if (ints) {
      if (b.as_int() == -1) return Value::integer(0);
      return Value::integer(py_mod(a.as_int(), b.as_int()));
    }
    double m = std::fmod(a.as_double(), b.as_double());
    if (m != 0 && ((m < 0) != (b.as_double() < 0))) m += b.as_double();
    return Value::number(m);
  }
  if (op == "**") {
    if (ints && b.as_int() >= 0) {
      int64_t r = 1, base = a.as_int();
      bool overflow = false;
      for (int64_t i = 0; i < b.as_int() && !overflow; ++i) {
        overflow = __builtin_mul_overflow(r, base, &r);
        if (r == 0 || r == 1) break;
        tick(line);
      }
      if (!overflow) {
        if (r == 1 && base == -1 && b.as_int() % 2 == 1) return Value::integer(-1);
        return Value::integer(r);
      }
      return Value::number(std::pow(a.as_double(), b.as_double()));
    }
    if (a.as_double() == 0 && b.as_double() < 0) template_fail(line, "0.0 cannot be raised to a negative power");
    return Value::number(std::pow(a.as_double(), b.as_double()));
  }
  template_fail(line, "unknown operator " + op);
}

bool Interpreter::compare(const std::string& op, const Value& a, const Value& b, int line) {
  if (op == "==") return a.equals(b);
  if (op == "!=") return !a.equals(b);
  if (op == "in" || op == "not in") {
    bool found = false;
    if (b.is_string()) {
      if (!a.is_string()) template_fail(line, "'in <string>' requires string as left operand, not " + a.type_name());
      found = b.str_ref().find(a.str_ref()) != std::string::npos;
    } else if (b.is_list()) {
      for (const auto& x : b.list_ref().items) found = found || x.equals(a);
    } else if (b.is_dict()) {
      found = b.dict_ref().find(a) != nullptr;
    } else if (!b.is_undefined()) {
      template_fail(line, "argument of type '" + b.type_name() + "' is not iterable");
    }
    return op == "in" ? found : !found;
  }
  if (a.is_undefined()) fail_undefined(a, line);
  if (b.is_undefined()) fail_undefined(b, line);
  int c;
  if (a.is_number() && b.is_number()) {
    double x = a.as_double(), y = b.as_double();
    if ((a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool())) c = a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int();
    else if (std::isnan(x) || std::isnan(y)) return false;
    else c = x < y ? -1 : x > y;
  } else if (a.is_string() && b.is_string()) {
    int r = a.str_ref().compare(b.str_ref());
    c = r < 0 ? -1 : r > 0;
  } else if (a.is_list() && b.is_list() && a.list_ref().tuple == b.list_ref().tuple) {
    WalkLevel level("comparison");
    const auto& x = a.list_ref().items;
    const auto& y = b.list_ref().items;
    size_t i = 0;
    while (i < x.size() && i < y.size() && x[i].equals(y[i])) ++i;
    if (i < x.size() && i < y.size()) return compare(op, x[i], y[i], line);
    c = x.size() < y.size() ? -1 : x.size() > y.size();
  } else {
    template_fail(line, "'" + op + "' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() + "'");
  }
  if (op == "<") return c < 0;
  if (op == ">") return c > 0;
  if (op == "<=") return c <= 0;
  return c >= 0;
}

Value Interpreter::eval_slice(const Value& obj, const Value& start, const Value& stop, const Value& step, int line) {
  if (obj.is_undefined()) fail_undefined(obj, line);
  for (const Value* v : {&start, &stop, &step})
    if (!v->is_none() && !v->is_int() && !v->is_bool())
      template_fail(line, "slice indices must be integers or None");
  int64_t st = step.is_none() ? 1 : step.as_int();
  if (st == 0) template_fail(line, "slice step cannot be zero");
  std::u32string chars;
  int64_t n;
  if (obj.is_string()) {
    chars = utf8_decode(obj.str_ref());
    n = static_cast<int64_t>(chars.size());
  } else if (obj.is_list()) {
    n = static_cast<int64_t>(obj.list_ref().items.size());
  } else {
    return Value::undefined("'" + obj.type_name() + "' object is not subscriptable");
  }
  auto clamp = [&](const Value& v, int64_t def) {
    if (v.is_none()) return def;
    int64_t i = v.as_int();
    if (i < 0) i += n;
    if (st > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  int64_t b = clamp(start, st > 0 ? 0 : n - 1), e = clamp(stop, st > 0 ? n : -1);
  std::vector<int64_t> idx;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) idx.push_back(i);
  if (obj.is_string()) {
    std::u32string r;
    for (int64_t i : idx) r += chars[i];
    return Value::string(utf8_encode(r));
  }
  std::vector<Value> items;
  for (int64_t i : idx) items.push_back(obj.list_ref().items[i]);
  return Value::list(std::move(items), obj.list_ref().tuple);
}

}  // namespace hearth::chat
