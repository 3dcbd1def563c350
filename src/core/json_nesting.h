// The one nesting limit for JSON text and chat-template values, and a cheap pre-scan of JSON text
// that finds where it is exceeded (before any recursive parse, copy, dump or walk can overflow
// the stack). Not a JSON parser or validator: malformed text is the parser's business.
#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace hearth {

/// Deepest nesting accepted anywhere JSON or chat-template values are converted or walked: a
/// value with kMaxNesting levels of arrays/objects (lists/dicts) is fine, one more is refused.
/// Real tool schemas and conversations use fewer than 20.
inline constexpr int kMaxNesting = 128;

/// Scans JSON text (one pass, no recursion, strings and escapes skipped) and, when some array or
/// object opens deeper than `max_depth` levels, returns the path of the value that does, written
/// as `a.b[2].c` and cut after 8 parts ("…" marks the cut); std::nullopt when the text is within
/// the limit. Works on any text: on malformed JSON the path is a best guess.
std::optional<std::string> json_nesting_violation(std::string_view text, int max_depth = kMaxNesting);

/// The message for a violation at `path` in `what` (a file, field or flag name):
/// "<what>: <path>: JSON nested deeper than 128 levels" (path omitted when empty).
std::string json_nesting_message(const std::string& what, const std::string& path);

/// Throws hearth::InvalidArgument(json_nesting_message(what, path)) when `text` nests deeper
/// than kMaxNesting.
void check_json_nesting(std::string_view text, const std::string& what);

}  // namespace hearth
