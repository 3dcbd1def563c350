// Jinja lexer and parser for chat templates: whitespace control, trim_blocks/lstrip_blocks as
// jinja2's lexer applies them, expression grammar with jinja2's precedence. Not evaluation.
#include <algorithm>

#include "chat/jinja_ast.h"
#include "chat/jinja_lexer.h"

namespace hearth::chat {
namespace {

constexpr int kMaxNesting = 200;

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  Body parse_all() {
    Body body = parse_body({});
    if (cur().type != Tok::End) fail("unexpected '" + cur().text + "'");
    return body;
  }

 private:
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  void advance() {
    if (i_ + 1 < t_.size()) ++i_;
  }
  [[noreturn]] void fail(const std::string& msg) const { template_fail(cur().line, msg); }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().text == n; }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(std::string("expected '") + op + "', got " + describe());
    advance();
  }
  std::string describe() const {
    switch (cur().type) {
      case Tok::End: return "end of template";
      case Tok::BlockEnd: return "end of statement block";
      case Tok::VarEnd: return "end of print statement";
      case Tok::String: return "string";
      default: return "'" + cur().text + "'";
    }
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) fail("expected a name, got " + describe());
    std::string n = cur().text;
    advance();
    return n;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd) fail("expected end of statement block, got " + describe());
    advance();
  }
  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& pp) : p(pp) {
      if (++p.depth_ > kMaxNesting) p.fail("template nested too deeply");
    }
    ~DepthGuard() { --p.depth_; }
  };

  // Parses statements until a block tag whose name is in `ends` (left unconsumed, after its '{%').
  Body parse_body(const std::vector<std::string>& ends) {
    DepthGuard g(*this);
    Body body;
    while (true) {
      const Token& tk = cur();
      if (tk.type == Tok::End) {
        if (!ends.empty()) {
          std::string want;
          for (const auto& e : ends) want += (want.empty() ? "'" : ", '") + e + "'";
          fail("unexpected end of template, expected " + want);
        }
        return body;
      }
      if (tk.type == Tok::Text) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::Text;
        s->line = tk.line;
        s->text = tk.text;
        body.push_back(std::move(s));
        advance();
      } else if (tk.type == Tok::VarBegin) {
        advance();
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::Output;
        s->line = tk.line;
        s->exprs.push_back(parse_tuple(true));
        if (cur().type != Tok::VarEnd) fail("expected end of print statement, got " + describe());
        advance();
        body.push_back(std::move(s));
      } else if (tk.type == Tok::BlockBegin) {
        const Token& nm = peek();
        if (nm.type == Tok::Name)
          for (const auto& e : ends)
            if (nm.text == e) {
              advance();
              return body;
            }
        advance();
        body.push_back(parse_statement());
      } else {
        fail("unexpected token " + describe());
      }
    }
  }

  // Consumes `{% name %}` having seen '{%': the name then the block end.
  void end_tag(const char* name) {
    if (!is_name(name)) fail(std::string("expected '") + name + "'");
    advance();
    expect_block_end();
  }

  StmtPtr parse_statement() {
    if (cur().type != Tok::Name) fail("expected a statement name, got " + describe());
    std::string kw = cur().text;
    int line = cur().line;
    auto s = std::make_unique<Stmt>();
    s->line = line;
    advance();
    if (kw == "if") {
      s->kind = Stmt::Kind::If;
      s->exprs.push_back(parse_tuple(true));
      expect_block_end();
      while (true) {
        s->bodies.push_back(parse_body({"elif", "else", "endif"}));
        std::string which = cur().text;
        advance();
        if (which == "elif") {
          s->exprs.push_back(parse_tuple(true));
          expect_block_end();
        } else if (which == "else") {
          expect_block_end();
          s->bodies.push_back(parse_body({"endif"}));
          end_tag("endif");
          break;
        } else {
          expect_block_end();
          break;
        }
      }
    } else if (kw == "for") {
      s->kind = Stmt::Kind::For;
      s->targets.push_back(expect_name());
      while (is_op(",")) {
        advance();
        if (is_name("in")) break;
        s->targets.push_back(expect_name());
      }
      if (!is_name("in")) fail("expected 'in' in for loop, got " + describe());
      advance();
      s->exprs.push_back(parse_tuple(false));
      if (is_name("if")) {
        advance();
        s->exprs.push_back(parse_expression(true));
      } else {
        s->exprs.push_back(nullptr);
      }
      if (is_name("recursive")) fail("recursive for loops are not supported");
      expect_block_end();
      ++loop_depth_;
      s->bodies.push_back(parse_body({"endfor", "else"}));
      --loop_depth_;
      if (is_name("else")) {
        advance();
        expect_block_end();
        s->bodies.push_back(parse_body({"endfor"}));
      } else {
        s->bodies.emplace_back();
      }
      end_tag("endfor");
    } else if (kw == "set") {
      std::string first = expect_name();
      s->targets.push_back(first);
      if (is_op(".")) {
        advance();
        s->attr = expect_name();
      } else {
        while (is_op(",")) {
          advance();
          s->targets.push_back(expect_name());
        }
      }
      if (is_op("=")) {
        advance();
        s->kind = Stmt::Kind::Set;
        s->exprs.push_back(parse_tuple(true));
        expect_block_end();
      } else {
        if (!s->attr.empty() || s->targets.size() != 1) fail("expected '=' in set");
        s->kind = Stmt::Kind::SetBlock;
        s->exprs.push_back(is_op("|") ? parse_filter_chain() : nullptr);
        expect_block_end();
        s->bodies.push_back(parse_body({"endset"}));
        end_tag("endset");
      }
    } else if (kw == "macro") {
      s->kind = Stmt::Kind::Macro;
      s->text = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        s->targets.push_back(expect_name());
        if (is_op("=")) {
          advance();
          s->exprs.push_back(parse_expression(true));
        } else {
          s->exprs.push_back(nullptr);
        }
        if (!is_op(")")) expect_op(",");
      }
      advance();
      expect_block_end();
      int saved = loop_depth_;
      loop_depth_ = 0;
      s->bodies.push_back(parse_body({"endmacro"}));
      loop_depth_ = saved;
      end_tag("endmacro");
    } else if (kw == "filter") {
      s->kind = Stmt::Kind::FilterBlock;
      s->exprs.push_back(parse_filter_chain(true));
      expect_block_end();
      s->bodies.push_back(parse_body({"endfilter"}));
      end_tag("endfilter");
    } else if (kw == "with") {
      s->kind = Stmt::Kind::With;
      while (cur().type != Tok::BlockEnd) {
        s->targets.push_back(expect_name());
        expect_op("=");
        s->exprs.push_back(parse_expression(true));
        if (cur().type != Tok::BlockEnd) expect_op(",");
      }
      expect_block_end();
      s->bodies.push_back(parse_body({"endwith"}));
      end_tag("endwith");
    } else if (kw == "generation") {
      s->kind = Stmt::Kind::Scope;
      expect_block_end();
      s->bodies.push_back(parse_body({"endgeneration"}));
      end_tag("endgeneration");
    } else if (kw == "break" || kw == "continue") {
      if (loop_depth_ == 0) fail("'" + kw + "' outside a loop");
      s->kind = kw == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue;
      expect_block_end();
    } else {
      fail("unknown tag '" + kw + "'");
    }
    return s;
  }

  // `| f(args) | g` after a set target, or `f | g` in a filter block (at_name): a Filter chain
  // whose innermost operand is null (the block body is substituted at render time).
  ExprPtr parse_filter_chain(bool at_name = false) {
    ExprPtr node;
    if (at_name) node = bounded(parse_filter(nullptr));
    while (is_op("|")) {
      advance();
      node = bounded(parse_filter(std::move(node)));
    }
    return node;
  }

  // ---- expressions ----
  ExprPtr make(Expr::Kind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  // A comma-separated tuple or a single expression (`{{ a, b }}`, `for x in a, b`).
  ExprPtr parse_tuple(bool with_condexpr) {
    int line = cur().line;
    ExprPtr first = parse_expression(with_condexpr);
    if (!is_op(",")) return first;
    auto t = make(Expr::Kind::Tuple, line);
    t->kids.push_back(std::move(first));
    while (is_op(",")) {
      advance();
      if (cur().type == Tok::BlockEnd || cur().type == Tok::VarEnd || is_name("if")) break;
      t->kids.push_back(parse_expression(with_condexpr));
    }
    return bounded(std::move(t));
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard g(*this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    ExprPtr e = parse_or();
    while (is_name("if")) {
      int line = cur().line;
      advance();
      auto c = make(Expr::Kind::Cond, line);
      ExprPtr cond = parse_or();
      ExprPtr other;
      if (is_name("else")) {
        advance();
        other = parse_condexpr();
      }
      c->kids.push_back(std::move(e));
      c->kids.push_back(std::move(cond));
      c->kids.push_back(std::move(other));
      e = bounded(std::move(c));
    }
    return e;
  }

  ExprPtr binary(Expr::Kind k, const std::string& op, ExprPtr a, ExprPtr b, int line) {
    auto e = make(k, line);
    e->name = op;
    e->kids.push_back(std::move(a));
    e->kids.push_back(std::move(b));
    return bounded(std::move(e));
  }

  // Records the subtree height; long operator/attribute chains would otherwise make evaluation
  // (and destruction) recurse without bound.
  ExprPtr bounded(ExprPtr e) {
    int d = 0;
    for (const auto& k : e->kids)
      if (k) d = std::max(d, k->depth);
    e->depth = d + 1;
    if (e->depth > 256) template_fail(e->line, "expression nested too deeply");
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      int line = cur().line;
      advance();
      e = binary(Expr::Kind::Or, "or", std::move(e), parse_and(), line);
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      int line = cur().line;
      advance();
      e = binary(Expr::Kind::And, "and", std::move(e), parse_not(), line);
    }
    return e;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard g(*this);
      auto e = make(Expr::Kind::Not, cur().line);
      advance();
      e->kids.push_back(parse_not());
      return bounded(std::move(e));
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    int line = cur().line;
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == Tok::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                    cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
        op = cur().text;
        advance();
      } else if (is_name("in")) {
        op = "in";
        advance();
      } else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
        op = "not in";
        advance();
        advance();
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(Expr::Kind::Compare, line);
        cmp->kids.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->kids.push_back(parse_math1());
    }
    return cmp ? bounded(std::move(cmp)) : std::move(first);
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = cur().text;
      int line = cur().line;
      advance();
      e = binary(Expr::Kind::Binary, op, std::move(e), parse_concat(), line);
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      int line = cur().line;
      advance();
      e = binary(Expr::Kind::Binary, "~", std::move(e), parse_math2(), line);
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = cur().text;
      int line = cur().line;
      advance();
      e = binary(Expr::Kind::Binary, op, std::move(e), parse_pow(), line);
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      int line = cur().line;
      advance();
      e = binary(Expr::Kind::Binary, "**", std::move(e), parse_unary(true), line);
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    DepthGuard g(*this);
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      node = make(Expr::Kind::Unary, cur().line);
      node->name = cur().text;
      advance();
      node->kids.push_back(parse_unary(false));
      node = bounded(std::move(node));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& tk = cur();
    int line = tk.line;
    if (tk.type == Tok::Name) {
      std::string n = tk.text;
      advance();
      auto e = make(Expr::Kind::Literal, line);
      if (n == "true" || n == "True") e->value = Value::boolean(true);
      else if (n == "false" || n == "False") e->value = Value::boolean(false);
      else if (n == "none" || n == "None") e->value = Value::none();
      else {
        e->kind = Expr::Kind::Name;
        e->name = n;
      }
      return e;
    }
    if (tk.type == Tok::String) {
      std::string s;
      while (cur().type == Tok::String) {  // adjacent literals concatenate
        s += cur().text;
        advance();
      }
      auto e = make(Expr::Kind::Literal, line);
      e->value = Value::string(std::move(s));
      return e;
    }
    if (tk.type == Tok::Int || tk.type == Tok::Float) {
      auto e = make(Expr::Kind::Literal, line);
      if (tk.type == Tok::Int) {
        try {
          e->value = Value::integer(std::stoll(tk.text));
        } catch (const std::exception&) {
          e->value = Value::number(std::stod(tk.text));
        }
      } else {
        e->value = Value::number(std::strtod(tk.text.c_str(), nullptr));
      }
      advance();
      return e;
    }
    if (is_op("(")) {
      advance();
      if (is_op(")")) {
        advance();
        return make(Expr::Kind::Tuple, line);
      }
      ExprPtr first = parse_expression(true);
      if (is_op(")")) {
        advance();
        return first;
      }
      auto t = make(Expr::Kind::Tuple, line);
      t->kids.push_back(std::move(first));
      while (is_op(",")) {
        advance();
        if (is_op(")")) break;
        t->kids.push_back(parse_expression(true));
      }
      expect_op(")");
      return bounded(std::move(t));
    }
    if (is_op("[")) {
      advance();
      auto l = make(Expr::Kind::List, line);
      while (!is_op("]")) {
        l->kids.push_back(parse_expression(true));
        if (!is_op("]")) expect_op(",");
      }
      advance();
      return bounded(std::move(l));
    }
    if (is_op("{")) {
      advance();
      auto d = make(Expr::Kind::Dict, line);
      while (!is_op("}")) {
        d->kids.push_back(parse_expression(true));
        expect_op(":");
        d->kids.push_back(parse_expression(true));
        if (!is_op("}")) expect_op(",");
      }
      advance();
      return bounded(std::move(d));
    }
    fail("unexpected " + describe());
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      int line = cur().line;
      if (is_op(".")) {
        advance();
        auto e = make(Expr::Kind::Attr, line);
        if (cur().type == Tok::Int) {  // foo.0 is foo[0]
          e->kind = Expr::Kind::Item;
          e->kids.push_back(std::move(node));
          auto idx = make(Expr::Kind::Literal, line);
          idx->value = Value::integer(std::stoll(cur().text));
          advance();
          e->kids.push_back(std::move(idx));
        } else {
          e->name = expect_name();
          e->kids.push_back(std::move(node));
        }
        node = bounded(std::move(e));
      } else if (is_op("[")) {
        advance();
        node = bounded(parse_subscript(std::move(node), line));
      } else if (is_op("(")) {
        node = bounded(parse_call(std::move(node)));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj, int line) {
    ExprPtr parts[3];
    int n = 0;
    bool slice = false;
    while (true) {
      if (is_op(":")) {
        slice = true;
        if (n >= 2) fail("too many ':' in slice");
        ++n;
        advance();
        continue;
      }
      if (is_op("]")) break;
      if (parts[n]) fail("expected ']' or ':'");
      parts[n] = parse_expression(true);
    }
    advance();
    if (!slice) {
      if (!parts[0]) fail("empty subscript");
      auto e = make(Expr::Kind::Item, line);
      e->kids.push_back(std::move(obj));
      e->kids.push_back(std::move(parts[0]));
      return e;
    }
    auto e = make(Expr::Kind::Slice, line);
    e->kids.push_back(std::move(obj));
    for (auto& p : parts) e->kids.push_back(std::move(p));
    return e;
  }

  // Arguments "(a, b, k=v)" into e->kids (after kids[0]) and e->kwnames.
  void parse_args(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (is_op("*") || is_op("**")) fail("*args and **kwargs in calls are not supported");
      if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
        e.kwnames.push_back(cur().text);
        advance();
        advance();
      } else {
        e.kwnames.push_back("");
      }
      e.kids.push_back(parse_expression(true));
      if (!is_op(")")) expect_op(",");
    }
    advance();
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = make(Expr::Kind::Call, cur().line);
    e->kids.push_back(std::move(callee));
    parse_args(*e);
    return e;
  }

  ExprPtr parse_filter(ExprPtr operand) {
    auto e = make(Expr::Kind::Filter, cur().line);
    e->name = expect_name();
    while (is_op(".")) {  // dotted filter names
      advance();
      e->name += "." + expect_name();
    }
    e->kids.push_back(std::move(operand));
    if (is_op("(")) parse_args(*e);
    return e;
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        advance();
        node = bounded(parse_filter(std::move(node)));
      } else if (is_name("is")) {
        auto e = make(Expr::Kind::Test, cur().line);
        advance();
        if (is_name("not")) {
          e->negated = true;
          advance();
        }
        e->name = expect_name();
        e->kids.push_back(std::move(node));
        if (is_op("(")) {
          parse_args(*e);
        } else if (cur().type == Tok::Int || cur().type == Tok::Float || cur().type == Tok::String ||
                   (cur().type == Tok::Name && cur().text != "else" && cur().text != "or" && cur().text != "and" &&
                    cur().text != "if" && cur().text != "is" && cur().text != "in" && cur().text != "not") ||
                   is_op("[") || is_op("{")) {
          e->kwnames.push_back("");
          ExprPtr arg = parse_primary();
          e->kids.push_back(parse_postfix(std::move(arg)));
        }
        node = bounded(std::move(e));
      } else if (is_op("(")) {
        node = bounded(parse_call(std::move(node)));
      } else {
        return node;
      }
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;  // enclosing for-loop bodies (break/continue are legal only inside one)
};

}  // namespace

Body parse_template(const std::string& source) {
  Parser parser(lex_template(source));
  return parser.parse_all();
}

}  // namespace hearth::chat
