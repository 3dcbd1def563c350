// The dynamic value type of the chat-template interpreter: Python-like undefined/None/bool/int/
// float/str/list/tuple/dict/callable with Python's truthiness, repr/str, equality and json.dumps.
// Not a general Python object model: only what Jinja chat templates observe.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/template_error.h"

namespace hearth::chat {

class Value;
struct CallArgs;
class Interpreter;

/// A list or tuple; shared by reference like a Python list. Destroying the last reference to a
/// deeply nested chain of lists/dicts does not recurse (nested containers are released one by one).
struct ListData {
  std::vector<Value> items;
  bool tuple = false;
  ~ListData();
};

/// An insertion-ordered dict (keys are Values: str, int, bool or None); shared by reference.
/// `ns` marks a Jinja namespace() object (attribute assignment allowed, repr differs).
struct DictData {
  std::vector<std::pair<Value, Value>> items;
  bool ns = false;
  const Value* find(const Value& key) const;
  Value* find(const Value& key);
  void set(const Value& key, Value v);
  ~DictData();
};

/// A callable: builtin function, bound method, or macro.
struct FuncData {
  std::string name;
  std::function<Value(Interpreter&, CallArgs&)> fn;
};

class Value {
 public:
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Func };

  Value() = default;  // undefined
  static Value undefined(std::string hint = "") {
    Value v;
    v.s_ = std::move(hint);
    return v;
  }
  static Value none() { return make(Kind::None); }
  static Value boolean(bool b) {
    Value v = make(Kind::Bool);
    v.i_ = b;
    return v;
  }
  static Value integer(int64_t i) {
    Value v = make(Kind::Int);
    v.i_ = i;
    return v;
  }
  static Value number(double f) {
    Value v = make(Kind::Float);
    v.f_ = f;
    return v;
  }
  static Value string(std::string s) {
    Value v = make(Kind::String);
    v.s_ = std::move(s);
    return v;
  }
  static Value list(std::vector<Value> items = {}, bool tuple = false);
  static Value dict(bool ns = false);
  static Value func(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn);
  /// Converts JSON (ordered: key order kept) into a Value tree. Throws TemplateError when `j`
  /// nests deeper than kMaxNesting (core/json_nesting.h).
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }
  bool is_float() const { return kind_ == Kind::Float; }
  /// int, float or bool (Python's numbers.Number).
  bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Bool; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_list() const { return kind_ == Kind::List; }
  bool is_dict() const { return kind_ == Kind::Dict; }
  bool is_func() const { return kind_ == Kind::Func; }

  bool as_bool() const { return i_ != 0; }
  /// Integer value of an int or bool.
  int64_t as_int() const { return i_; }
  /// Numeric value of an int, bool or float as double.
  double as_double() const { return kind_ == Kind::Float ? f_ : static_cast<double>(i_); }
  const std::string& str_ref() const { return s_; }  // string contents, or undefined's name hint
  ListData& list_ref() const { return *list_; }
  DictData& dict_ref() const { return *dict_; }
  FuncData& func_ref() const { return *func_; }

  /// Python truthiness (undefined is false).
  bool truthy() const;
  /// Python str(): what `{{ x }}` prints (undefined prints as "").
  std::string str() const;
  /// Python repr(): strings quoted, used inside list/dict printing. A list/dict that contains
  /// itself prints the inner occurrence as [...] / {...} / (...) (Python's reprlib guard), so
  /// `a.append(a)` prints [[...]]. Throws TemplateError past kMaxNesting levels.
  std::string repr() const;
  /// Python ==. Throws TemplateError past kMaxNesting levels (Python: RecursionError).
  bool equals(const Value& o) const;
  /// Python json.dumps(x, ensure_ascii, indent, separators, sort_keys); indent < 0 means None.
  /// `indent_str` overrides the indent text when non-empty (json.dumps accepts a string indent).
  /// sort_keys orders dict keys as Python's sorted() does (str by code point, numbers by value;
  /// mixed kinds raise). Throws TemplateError for undefined/callables ("not JSON serializable"),
  /// a circular reference, unorderable keys, or more than kMaxNesting levels.
  std::string to_json(bool ensure_ascii, int indent, const std::string& indent_str, const std::string& item_sep,
                      const std::string& key_sep, bool sort_keys = false) const;
  /// Converts back to JSON (for callers outside the interpreter); undefined/callables become null.
  /// Throws TemplateError past kMaxNesting levels (which also covers values containing themselves).
  nlohmann::ordered_json to_nlohmann() const;
  /// Python type name, for error messages ("str", "int", "dict", ...).
  std::string type_name() const;

 private:
  static Value make(Kind k) {
    Value v;
    v.kind_ = k;
    return v;
  }
  Kind kind_ = Kind::Undefined;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;
  std::shared_ptr<ListData> list_;
  std::shared_ptr<DictData> dict_;
  std::shared_ptr<FuncData> func_;
};

/// Text repr()/str()/to_json() may build for one container: past it they throw TemplateError (a
/// list holding the same list twice, nested 40 deep, would print 2^40 items). The interpreter's
/// default output limit (RenderLimits::max_output_bytes) is the same.
constexpr size_t kMaxSerializedBytes = 64u << 20;
/// Lists and dicts one walk (repr, ==, <, json conversions) may enter, a shared one each time it
/// appears: past it the walk throws TemplateError (comparing two such nested lists would otherwise
/// take 2^40 steps, none of them counted by the interpreter).
constexpr int64_t kMaxWalkContainers = 16'000'000;

/// Throws TemplateError("chat template: <what>: text of the value exceeds the size limit") when
/// `bytes` > kMaxSerializedBytes.
void check_serialized_size(size_t bytes, const char* what);

/// One level of a recursive walk over Values (repr, ==, <, json conversions) on this thread: hold
/// one per container level entered. Throws TemplateError("chat template: <what>: value nested
/// deeper than 128 levels (or containing itself)") past kMaxNesting (core/json_nesting.h) levels,
/// so no walk can overflow the stack (Python raises RecursionError in the same places), and past
/// kMaxWalkContainers containers entered since the outermost level.
class WalkLevel {
 public:
  explicit WalkLevel(const char* what);
  ~WalkLevel();
  WalkLevel(const WalkLevel&) = delete;
  WalkLevel& operator=(const WalkLevel&) = delete;
};

/// Arguments of a call: positional then keyword.
struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  int line = 0;
  /// The i-th positional argument, else the keyword `name`, else `def`.
  Value get(size_t i, const std::string& name, Value def = Value()) const;
  bool has(size_t i, const std::string& name) const;
};

/// Python repr() of a float ("1.0", "0.1", "1e-05", "inf", "nan").
std::string py_float_repr(double f);
/// Python repr() of a str (single quotes unless the text has ' and no ").
std::string py_str_repr(const std::string& s);

/// UTF-8 helpers: decode to code points (invalid bytes map to U+FFFD) and encode back.
std::u32string utf8_decode(const std::string& s);
std::string utf8_encode(const std::u32string& s);

}  // namespace hearth::chat
