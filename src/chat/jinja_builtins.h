// Shared helpers of the chat-template builtins: Python str semantics (case mapping, strip, split on
// code points), iteration and len(). Used by jinja_builtins.cpp (attributes, methods, globals)
// and jinja_filters.cpp (filters, tests). Not a general Unicode library: case mapping covers ASCII,
// Latin-1, Greek and Cyrillic.
#pragma once
#include <string>
#include <vector>

#include "chat/value.h"

namespace hearth::chat {

/// Python str.upper()/lower()/title()/capitalize() (case tables: ASCII, Latin-1, Greek, Cyrillic).
std::string py_upper(const std::string& s);
std::string py_lower(const std::string& s);
std::string py_title(const std::string& s);
std::string py_capitalize(const std::string& s);
/// Python str.strip/lstrip/rstrip; `chars` null = Unicode whitespace.
std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right);
/// Python str.split(sep, maxsplit) (sep null = runs of whitespace); `from_right` = rsplit.
std::vector<std::string> py_split(const std::string& s, const std::string* sep, int64_t maxsplit, bool from_right,
                                  int line);
/// Python str.replace(old, new, count) (count < 0 = all).
std::string py_replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count);
/// Python len(): code points of a str, items of a list/dict; undefined = 0. TemplateError otherwise.
int64_t py_len(const Value& v, int line);
/// Python iteration as a list: list items, dict keys, str characters, undefined = empty.
std::vector<Value> py_iter(const Value& v, int line);
/// Python str.splitlines() (no keepends).
std::vector<std::string> py_splitlines(const std::string& s);
/// The method `name` of a str/dict/list bound to `obj`, or undefined when it has none.
Value bound_method(const Value& obj, const std::string& name);
/// Globals of transformers' environment: range, namespace, dict, raise_exception, strftime_now,
/// cycler-free joiner. Added as a dict of callables.
void add_builtin_globals(Value& globals);

}  // namespace hearth::chat
