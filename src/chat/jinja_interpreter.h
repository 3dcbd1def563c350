// Tree-walking evaluator of a parsed chat template with jinja2's runtime semantics (scoping of set
// inside loops, default Undefined, Python operators). Not the parser, nor the filter/test/method
// library (jinja_builtins.cpp), nor the transformers-specific context (chat_template.cpp).
#pragma once
#include <map>
#include <utility>
#include <vector>
#include <string>

#include "chat/jinja_ast.h"
#include "chat/value.h"

namespace hearth::chat {

/// Steps a for-loop iteration counts (RenderLimits::max_steps), and range() items per step.
constexpr int64_t kLoopIterationSteps = 8;
constexpr int64_t kRangeItemsPerStep = 8;

/// Limits that keep hostile templates from hanging or exhausting memory.
struct RenderLimits {
  /// Expression evaluations + statements executed; a loop iteration counts kLoopIterationSteps
  /// (it builds the `loop` object) and range(n) counts n / kRangeItemsPerStep. About 3 s of the
  /// slowest steps on one core.
  int64_t max_steps = 1'000'000;
  size_t max_output_bytes = kMaxSerializedBytes;  // rendered text and any single string or list built
  /// Bytes of all strings built (operators, filters) or copied out of variables, attributes and
  /// items in one render, and of all list items built by operators (sizeof(Value) each), summed:
  /// bounds the memory a template can hold (a list it appends a string to) and the time it spends
  /// copying.
  size_t max_total_string_bytes = 512u << 20;
  int max_call_depth = 64;                // nested macro calls
};

/// One render of one template. Holds the variable scopes and the step budget.
class Interpreter {
 public:
  explicit Interpreter(RenderLimits limits = {}) : limits_(limits) {}

  /// Renders `body` with `globals` (a dict Value: name -> value) visible as top-level variables.
  /// Throws TemplateError on any runtime error ("chat template: line N: ...").
  std::string render(const Body& body, const Value& globals);
  /// Byte spans [begin, end) of the last render's output written by `{% generation %}` blocks, in
  /// execution order, as transformers' AssistantTracker records them: begin = length of the
  /// top-level output when the block finished, end = begin + the block's text length (so a block
  /// rendered inside a macro or set-block is placed where that call happened).
  const std::vector<std::pair<size_t, size_t>>& generation_spans() const { return generation_spans_; }

  /// Python-like attribute access `obj.name` as jinja2's sandbox does it (methods of str/dict/list,
  /// then dict keys). Missing -> undefined; attribute of undefined -> TemplateError.
  Value get_attr(const Value& obj, const std::string& name, int line);
  /// Subscript `obj[key]` (dict key, list/str index incl. negative); missing -> undefined.
  Value get_item(const Value& obj, const Value& key, int line);
  /// Calls a callable Value; TemplateError when it is not callable.
  Value call(const Value& fn, CallArgs& args, int line);
  /// Applies the named filter / test (jinja_builtins.cpp).
  Value filter(const std::string& name, const Value& v, CallArgs& args, int line);
  bool test(const std::string& name, const Value& v, CallArgs& args, int line);
  /// Python binary operator (+ - * / // % ** ~) and comparison (== != < > <= >= in, not in).
  Value binary_op(const std::string& op, const Value& a, const Value& b, int line) { return eval_binary(op, a, b, line); }
  bool compare_op(const std::string& op, const Value& a, const Value& b, int line) { return compare(op, a, b, line); }
  /// Python a < b (TemplateError when the types do not order).
  bool compare_values(const Value& a, const Value& b, int line) { return compare("<", a, b, line); }
  /// Counts `n` steps against the budget; TemplateError when exceeded.
  void tick(int line, int64_t n = 1) {
    steps_ += n;
    if (steps_ > limits_.max_steps) template_fail(line, "template exceeded the step limit of " + std::to_string(limits_.max_steps) +
                                                            " steps (an endless loop, or more input than it can render)");
  }
  /// Throws when a string about to be built would exceed the output limit, or the strings built
  /// so far the total limit.
  void check_size(size_t bytes, int line) const {
    if (bytes > limits_.max_output_bytes) template_fail(line, "string result exceeds the output size limit");
    charge_bytes(bytes, line);
  }
  /// Bytes a list item costs when a list is copied: the Value and, for a string, its characters
  /// (a Value holds its string by value; lists and dicts inside are shared, not copied).
  static size_t item_bytes(const Value& v) { return sizeof(Value) + (v.is_string() ? v.str_ref().size() : 0); }
  static size_t item_bytes(const std::vector<Value>& items) {
    size_t n = 0;
    for (const Value& v : items) n += item_bytes(v);
    return n;
  }
  /// The same for a list about to hold `items` items whose copying costs `built_bytes` (item_bytes
  /// summed over the new items): the list's item count, and the new items' bytes, within the
  /// output limit, and those bytes within the total (a list doubled by `x + x` or `x * 2` in a
  /// loop, or `[s] * n` of a long string s, would otherwise take gigabytes in few steps).
  void check_items(size_t items, size_t built_bytes, int line) const {
    if (items > limits_.max_output_bytes / sizeof(Value) || built_bytes > limits_.max_output_bytes)
      template_fail(line, "list result exceeds the size limit");
    charge_bytes(built_bytes, line);
  }
  /// Counts a string copied out of a variable, attribute or item against the total string limit.
  const Value& charge(const Value& v, int line) const {
    if (v.is_string()) charge_bytes(v.str_ref().size(), line);
    return v;
  }

 private:
  struct Scope {
    Scope* parent = nullptr;
    std::map<std::string, Value> vars;
    Value* lookup(const std::string& name) {
      for (Scope* s = this; s; s = s->parent) {
        auto it = s->vars.find(name);
        if (it != s->vars.end()) return &it->second;
      }
      return nullptr;
    }
  };
  enum class Flow { Normal, Break, Continue };

  Flow exec_body(const Body& body, Scope& scope, std::string& out);
  Flow exec(const Stmt& s, Scope& scope, std::string& out);
  void exec_for(const Stmt& s, Scope& scope, std::string& out);
  Value eval(const Expr& e, Scope& scope);
  Value eval_binary(const std::string& op, const Value& a, const Value& b, int line);
  bool compare(const std::string& op, const Value& a, const Value& b, int line);
  Value eval_slice(const Value& obj, const Value& start, const Value& stop, const Value& step, int line);
  CallArgs eval_args(const Expr& e, size_t first, Scope& scope);
  Value apply_filter_chain(const Expr& chain, Value operand, Scope& scope);
  Value make_macro(const Stmt& s, Scope& scope);
  void append(std::string& out, const std::string& s, int line) {
    if (out.size() + s.size() > limits_.max_output_bytes) template_fail(line, "rendered output exceeds the size limit");
    out += s;
  }

  void charge_bytes(size_t bytes, int line) const {
    string_bytes_ += bytes;
    if (string_bytes_ > limits_.max_total_string_bytes)
      template_fail(line, "strings and lists built by the template exceed the total size limit");
  }

  RenderLimits limits_;
  int64_t steps_ = 0;
  mutable size_t string_bytes_ = 0;
  int call_depth_ = 0;
  Scope* root_ = nullptr;
  const std::string* root_out_ = nullptr;  // the top-level output during render()
  std::vector<std::pair<size_t, size_t>> generation_spans_;
};

/// Raises the "'name' is undefined" error jinja2 gives when an undefined value is used.
[[noreturn]] void fail_undefined(const Value& v, int line);

}  // namespace hearth::chat
