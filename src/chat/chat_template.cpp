// transformers' chat-template context (messages, tools, documents, add_generation_prompt, special
// tokens, extra kwargs, raise_exception, strftime_now) over the Jinja interpreter. Not the
// interpreter itself.
#include "chat/chat_template.h"

#include "chat/jinja_builtins.h"
#include "chat/jinja_interpreter.h"

namespace hearth::chat {

namespace {
// Whether a parsed body holds a generation block (Stmt::Kind::Scope) at any depth; iterative.
bool contains_generation(const Body& body) {
  std::vector<const Body*> todo{&body};
  while (!todo.empty()) {
    const Body* b = todo.back();
    todo.pop_back();
    for (const auto& s : *b) {
      if (s->kind == Stmt::Kind::Scope) return true;
      for (const auto& inner : s->bodies) todo.push_back(&inner);
    }
  }
  return false;
}

// Value::from_json with the field named in the error.
Value field_value(const char* field, const nlohmann::ordered_json& j) {
  try {
    return Value::from_json(j);
  } catch (const TemplateError& e) {
    std::string msg = e.what();
    const std::string prefix = "chat template: ";
    if (msg.rfind(prefix, 0) == 0) msg = msg.substr(prefix.size());
    throw TemplateError(prefix + field + ": " + msg);
  }
}

// Sets content "" on messages whose content is null or missing (ChatInputs::null_content_as_empty).
void empty_null_content(Value& messages) {
  if (!messages.is_list()) return;
  const Value key = Value::string("content");
  for (auto& m : messages.list_ref().items) {
    if (!m.is_dict()) continue;
    const Value* c = m.dict_ref().find(key);
    if (!c || c->is_none()) m.dict_ref().set(key, Value::string(""));
  }
}
}  // namespace

ChatTemplate::ChatTemplate(const std::string& source)
    : source_(source), body_(std::make_shared<const Body>(parse_template(source))) {
  has_generation_ = contains_generation(*body_);
}

std::string ChatTemplate::render(const ChatInputs& in) const { return render_with_spans(in).text; }

RenderedChat ChatTemplate::render_with_spans(const ChatInputs& in) const {
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
  Value messages = field_value("messages", in.messages);
  if (in.null_content_as_empty) empty_null_content(messages);
  g.set(Value::string("messages"), messages);
  g.set(Value::string("tools"), in.tools.is_null() ? Value::none() : field_value("tools", in.tools));
  g.set(Value::string("documents"), Value::none());
  g.set(Value::string("add_generation_prompt"), Value::boolean(in.add_generation_prompt));
  if (in.extra_kwargs.is_object())
    for (auto it = in.extra_kwargs.begin(); it != in.extra_kwargs.end(); ++it)
      g.set(Value::string(it.key()), field_value(it.key().c_str(), it.value()));
  Interpreter interp;
  RenderedChat r;
  r.text = interp.render(*body_, globals);
  r.generation_spans = interp.generation_spans();
  return r;
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
