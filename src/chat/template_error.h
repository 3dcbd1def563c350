// The one error type of chat-template parsing and rendering. Not used for tool-call parsing, which
// never throws (malformed calls come back as plain content).
#pragma once
#include <string>

#include "core/error.h"

namespace hearth::chat {

/// A chat-template failure; what() is one line: "chat template: line N: <problem>" for syntax and
/// runtime errors, "chat template: raise_exception: <msg>" when the template raised.
class TemplateError : public hearth::InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

/// Throws TemplateError("chat template: line <line>: <msg>") (line 0 omits the line part).
[[noreturn]] inline void template_fail(int line, const std::string& msg) {
  if (line > 0) throw TemplateError("chat template: line " + std::to_string(line) + ": " + msg);
  throw TemplateError("chat template: " + msg);
}

}  // namespace hearth::chat
