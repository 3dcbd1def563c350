// Engine's default hooks: Hermes tool calls (through src/chat/'s parsers), no reasoning split, no adapters.
// Not an engine: ModelEngine and FakeEngine implement the rest.
#include "server/engine.h"

#include "chat/reasoning.h"
#include "chat/tool_calls.h"
#include "core/error.h"
#include "server/api_error.h"

namespace hearth::server {

size_t Engine::tool_call_holdback_start(const std::string& text) const {
  return chat::tool_call_holdback_start(text, chat::ToolCallFormat::Hermes);
}

ParsedToolCalls Engine::parse_tool_calls(const std::string& text, const nlohmann::ordered_json& tools) const {
  return to_server(chat::parse_tool_calls(text, chat::ToolCallFormat::Hermes, tools));
}

std::unique_ptr<chat::ReasoningSplitter> Engine::reasoning_splitter(const CompletionRequest&, const Prompt&) const {
  return nullptr;
}

AdapterInfo Engine::mount_adapter(const std::string&, const std::string&) {
  throw ApiError(501, "This engine does not support LoRA adapters.");
}

std::unique_ptr<ActiveSequence> Engine::start_sequence(const Prompt&, const CompletionRequest&, TokenCallback) {
  throw Error("this engine does not batch requests (supports_batching() is false)");
}
void Engine::step(const std::vector<ActiveSequence*>&) {
  throw Error("this engine does not batch requests (supports_batching() is false)");
}
Finish Engine::finish_sequence(ActiveSequence&) {
  throw Error("this engine does not batch requests (supports_batching() is false)");
}

ParsedToolCalls to_server(chat::ParsedToolCalls parsed) {
  ParsedToolCalls out;
  out.content = std::move(parsed.content);
  for (auto& c : parsed.calls) out.calls.push_back(ToolCall{std::move(c.id), std::move(c.name), std::move(c.arguments_json)});
  return out;
}

}  // namespace hearth::server
