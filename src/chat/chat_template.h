// Chat-template rendering as transformers' apply_chat_template(tokenize=False) does it: the
// template is parsed once, then rendered with messages/tools/add_generation_prompt/special tokens
// and the globals raise_exception and strftime_now. Not tokenization, nor tool-call parsing.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "chat/jinja_ast.h"
#include "chat/template_error.h"

namespace hearth::chat {

/// What a render needs besides the template. `tools` null = no tools (the template then sees
/// tools=None, as transformers passes it); empty bos/eos = that token is not defined.
struct ChatInputs {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // [{"role", "content", ...}]
  nlohmann::ordered_json tools;                                        // null or [tool schema...]
  bool add_generation_prompt = false;
  nlohmann::ordered_json extra_kwargs = nlohmann::ordered_json::object();  // e.g. {"enable_thinking": false}
  std::string bos_token;
  std::string eos_token;
  /// vLLM's message conversion: a message whose "content" is null or missing (an assistant turn
  /// that only calls tools) reaches the template with content "" instead of None, so templates
  /// that iterate over or concatenate content work. Off = transformers' behaviour (None/absent).
  bool null_content_as_empty = false;
};

/// A rendered prompt and the byte spans [begin, end) of `text` that `{% generation %}` blocks
/// wrote (transformers' return_assistant_tokens_mask bookkeeping), in template order.
struct RenderedChat {
  std::string text;
  std::vector<std::pair<size_t, size_t>> generation_spans;
};

/// A parsed chat template (Jinja source from tokenizer_config.json or chat_template.jinja).
class ChatTemplate {
 public:
  /// Parses `source`; throws TemplateError "chat template: line N: ..." on a syntax error.
  explicit ChatTemplate(const std::string& source);
  /// Renders the prompt text, byte-identical to transformers' apply_chat_template(tokenize=False).
  /// Throws TemplateError for an empty conversation, raise_exception() in the template
  /// ("chat template: raise_exception: <msg>") or a runtime error ("chat template: line N: ...").
  /// Values nested deeper than kMaxNesting in messages/tools/kwargs throw TemplateError naming
  /// the field ("chat template: tools: JSON value: value nested deeper than 128 levels ...").
  std::string render(const ChatInputs& in) const;
  /// render() plus the spans of the {% generation %} blocks' output (empty when there are none).
  RenderedChat render_with_spans(const ChatInputs& in) const;
  /// True when the template contains a {% generation %} block.
  bool has_generation_blocks() const { return has_generation_; }
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::shared_ptr<const Body> body_;
  bool has_generation_ = false;
};

/// One-shot parse + render (see ChatTemplate::render).
std::string render_chat_template(const std::string& tmpl, const nlohmann::ordered_json& messages,
                                 const nlohmann::ordered_json& tools, bool add_generation_prompt,
                                 const nlohmann::ordered_json& extra_kwargs, const std::string& bos_token,
                                 const std::string& eos_token);

}  // namespace hearth::chat
