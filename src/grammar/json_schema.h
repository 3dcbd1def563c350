// JSON Schema (the subset structured outputs use: OpenAI response_format json_schema and tool
// parameters) compiled into a byte Grammar whose sentences are the compact-or-spaced JSON texts
// valid under the schema, properties in schema order. Not a validator and not the token mask.
#pragma once
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "grammar/grammar.h"

namespace hearth::grammar {

/// Limits of the generated JSON (bounds keep a model from looping inside one token class).
struct JsonGrammarOptions {
  /// Whitespace between two JSON tokens, as llama.cpp's json-schema-to-grammar (`space ::= | " " |
  /// "\n"{1,2} [ \t]{0,20}`): nothing, one space, or one or two newlines then at most max_indent
  /// spaces/tabs of indentation. Compact, spaced and pretty-printed JSON all fit; runs of blanks (a
  /// small model looping on spaces) do not.
  int max_indent = 20;
  int max_int_digits = 16;   ///< digits of an integer part (and of a fraction)
};

/// Compiles `schema` (draft 2020-12 / OpenAI subset): type (string, number, integer, boolean,
/// null, object, array, or a list of them), enum, const, properties (emitted in order), required,
/// additionalProperties (false; true or absent = extra keys with any value; a schema), items,
/// minItems/maxItems, minLength/maxLength, format (date, time, date-time, uuid, email, ipv4),
/// anyOf/oneOf (oneOf as anyOf), allOf of one schema, $ref to "#", "#/$defs/..",
/// "#/definitions/.." (recursion allowed), and the annotations title, description, default,
/// examples, $schema, $id, $comment, deprecated, readOnly, writeOnly (ignored). Any other keyword
/// or value throws hearth::InvalidArgument naming the keyword and its JSON pointer path (e.g.
/// "unsupported JSON Schema keyword 'pattern' at #/properties/zip"). A schema with no finite
/// valid value throws InvalidArgument naming its path: maxItems below minItems, maxLength below
/// minLength, an empty enum/anyOf/type list, schema false, and (Grammar::prune_unproductive) a
/// subschema that requires itself with no way to end ({"$ref": "#"} as a required property); such a
/// subschema on an optional branch only removes that branch.
std::shared_ptr<Grammar> compile_json_schema(const nlohmann::ordered_json& schema, const JsonGrammarOptions& opts = {});

/// Any JSON object (response_format json_object).
std::shared_ptr<Grammar> json_object_grammar(const JsonGrammarOptions& opts = {});

/// One callable tool for a tool-call grammar: its name and its parameters schema (null = any object).
struct ToolSchema {
  std::string name;
  nlohmann::ordered_json parameters;
};

/// A tool call: `prefix` {"name": "<one of tools>", "<args_key>": <object valid under its
/// parameters>} `suffix`, with bounded whitespace after the prefix and before the suffix (Hermes:
/// prefix "<tool_call>", suffix "</tool_call>", args_key "arguments"). Throws like
/// compile_json_schema, naming "tools[i].function.parameters" in the path.
std::shared_ptr<Grammar> tool_call_grammar(const std::vector<ToolSchema>& tools, const std::string& prefix,
                                           const std::string& suffix, const std::string& args_key,
                                           const JsonGrammarOptions& opts = {});

}  // namespace hearth::grammar
