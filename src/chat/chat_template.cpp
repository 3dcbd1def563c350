// transformers' chat-template context (messages, tools, documents, add_generation_prompt, special
// tokens, extra kwargs, raise_exception, strftime_now) over the Jinja interpreter. Not the
// interpreter itself.
#include "chat/chat_template.h"

#include "chat/jinja_builtins.h"
#include "chat/jinja_interpreter.h"

namespace hearth::chat {

ChatTemplate::ChatTemplate(const std::string& source)
    : source_(source), body_(std::make_shared<const Body>(parse_template(source))) {}

std::string ChatTemplate::render(const ChatInputs& in) const {
  if (!in.messages.is_array()) throw TemplateError("chat template: messages must be a JSON array");
  if (in.messages.empty())
    throw TemplateError("chat template: Cannot apply chat template to an empty conversation. Provide at least one message.");
  if (!in.extra_kwargs.is_null() && !in.extra_kwargs.is_object())
    throw TemplateError("chat template: extra kwargs must be a JSON object");
  Value globals = Value::dict();
  add_builtin_globals(globals);
  auto& g = globals.dict_ref();
  if (!in.bos_token.empty()) g.set(Value::string("bos_token"), Value::string(in.bos_token));
  if (!in.eos_token.empty()) g.set(Value::string("eos_token"), Value::string(in.eos_token));
  g.set(Value::string("messages"), Value::from_json(in.messages));
  g.set(Value::string("tools"), in.tools.is_null() ? Value::none() : Value::from_json(in.tools));
  g.set(Value::string("documents"), Value::none());
  g.set(Value::string("add_generation_prompt"), Value::boolean(in.add_generation_prompt));
  if (in.extra_kwargs.is_object())
    for (auto it = in.extra_kwargs.begin(); it != in.extra_kwargs.end(); ++it)
      g.set(Value::string(it.key()), Value::from_json(it.value()));
  Interpreter interp;
  return interp.render(*body_, globals);
}

std::string render_chat_template(const std::string& tmpl, const nlohmann::ordered_json& messages,
                                 const nlohmann::ordered_json& tools, bool add_generation_prompt,
                                 const nlohmann::ordered_json& extra_kwargs, const std::string& bos_token,
                                 const std::string& eos_token) {
  ChatInputs in;
  in.messages = messages;
  in.tools = tools;
  in.add_generation_prompt = add_generation_prompt;
  in.extra_kwargs = extra_kwargs;
  in.bos_token = bos_token;
  in.eos_token = eos_token;
  return ChatTemplate(tmpl).render(in);
}

}  // namespace hearth::chat
