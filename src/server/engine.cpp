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
std::vector<std::unique_ptr<ActiveSequence>> Engine::start_sequences(const Prompt& prompt, const CompletionRequest& req,
                                                                     std::vector<TokenCallback> on_tokens) {
  std::vector<std::unique_ptr<ActiveSequence>> out;
  for (size_t i = 0; i < on_tokens.size(); ++i) {
    if (i == 0) {
      out.push_back(start_sequence(prompt, req, std::move(on_tokens[i])));
      continue;
    }
    CompletionRequest ri = req;
    ri.sampling.seed = choice_seed(req.sampling.seed, static_cast<int>(i));
    out.push_back(start_sequence(prompt, ri, std::move(on_tokens[i])));
  }
  return out;
}

std::optional<int64_t> choice_seed(std::optional<int64_t> seed, int choice) {
  if (!seed || choice == 0) return seed;
  // splitmix64 (Steele et al. 2014) of seed + choice: neighbouring choices get unrelated streams.
  uint64_t z = static_cast<uint64_t>(*seed) + static_cast<uint64_t>(choice) * 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return static_cast<int64_t>(z ^ (z >> 31));
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
