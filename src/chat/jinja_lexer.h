// Jinja lexer for chat templates: splits source into text and tag tokens, applying whitespace
// control, trim_blocks and lstrip_blocks exactly as jinja2's lexer does. Not the parser.
#pragma once
#include <string>
#include <vector>

namespace hearth::chat {

/// Token kinds: template text, tag delimiters, and expression tokens inside tags.
enum class Tok { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End };

/// One token; `text` is the data (text, name, decoded string literal, number or operator).
struct Token {
  Tok type;
  std::string text;
  int line;
};

/// Lexes template source (newlines normalised to "\n", one trailing newline dropped, as jinja2
/// does). Throws TemplateError "chat template: line N: ..." on unterminated tags or strings, and
/// for sources over 4 MiB.
std::vector<Token> lex_template(const std::string& source);

}  // namespace hearth::chat
