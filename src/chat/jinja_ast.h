// Syntax tree of a parsed Jinja chat template (expressions and statements) and the parser entry
// point. Not the lexer's token list (private to jinja_parser.cpp) nor evaluation (jinja_interpreter).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "chat/value.h"

namespace hearth::chat {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

/// One expression node. Child layout by kind:
///  Literal: value. Name: name. List/Tuple: kids = items. Dict: kids = key, value, key, value...
///  Attr: kids[0].name. Item: kids[0][kids[1]]. Slice: kids[0][kids[1]:kids[2]:kids[3]] (null = absent).
///  Unary: name in {"-", "+"}, kids[0]. Not: kids[0]. Binary: name in {+ - * / // % ** ~}, kids[0..1].
///  Compare: kids[0] ops[0] kids[1] ops[1] kids[2]... And/Or: kids[0..1].
///  Cond: kids[1] ? kids[0] : kids[2] (kids[2] null = undefined).
///  Call: kids[0](kids[1..]); Filter/Test: name(kids[0], kids[1..]) with kids[0] null in a filter block.
///  For Call/Filter/Test, kwnames[i] names argument kids[i + 1] ("" when positional).
struct Expr {
  enum class Kind { Literal, Name, List, Tuple, Dict, Attr, Item, Slice, Unary, Not, Binary, Compare, And, Or, Cond,
                    Call, Filter, Test };
  Kind kind;
  int line = 0;
  std::string name;
  Value value;
  std::vector<ExprPtr> kids;
  std::vector<std::string> kwnames;
  std::vector<std::string> ops;
  bool negated = false;  // Test: "is not"
  int depth = 1;         // height of this subtree (bounded by the parser)
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

/// One statement node. Fields by kind:
///  Text: text. Output: exprs[0]. If: exprs = conditions, bodies = one per condition (+1 for else).
///  For: targets (loop variables), exprs[0] iterable, exprs[1] filter (may be null), bodies[0] body,
///       bodies[1] else. Set: targets (names) or targets[0] + attr (ns.attr), exprs[0] value.
///  SetBlock: targets[0], bodies[0], exprs[0] optional filter chain (may be null).
///  Macro: text = name, targets = params, exprs = defaults (null = none), bodies[0].
///  FilterBlock: exprs[0] filter chain (innermost operand null), bodies[0].
///  With: targets/exprs assignments, bodies[0]. Scope: bodies[0] rendered in place (generation).
///  Break/Continue: nothing.
struct Stmt {
  enum class Kind { Text, Output, If, For, Set, SetBlock, Macro, FilterBlock, With, Scope, Break, Continue };
  Kind kind;
  int line = 0;
  std::string text;
  std::string attr;
  std::vector<std::string> targets;
  std::vector<ExprPtr> exprs;
  std::vector<Body> bodies;
};

/// Parses template source with transformers' settings (trim_blocks, lstrip_blocks, loopcontrols,
/// the `generation` tag). Throws TemplateError "chat template: line N: ..." on a syntax error.
Body parse_template(const std::string& source);

}  // namespace hearth::chat
