// libFuzzer target: any bytes as a chat template (and as tool-call output) must either render or
// throw TemplateError: no crash, hang or unbounded memory. Not a correctness test.
#include <cstddef>
#include <cstdint>
#include <string>

#include "chat/chat_template.h"
#include "chat/tool_calls.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string src(reinterpret_cast<const char*>(data), size);
  static const nlohmann::ordered_json msgs = nlohmann::ordered_json::parse(
      R"([{"role": "system", "content": "s"}, {"role": "user", "content": "hi"},
          {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]}])");
  try {
    hearth::chat::ChatInputs in;
    in.messages = msgs;
    in.add_generation_prompt = true;
    in.bos_token = "<s>";
    hearth::chat::ChatTemplate(src).render(in);
  } catch (const hearth::chat::TemplateError&) {
  }
  for (auto f : {hearth::chat::ToolCallFormat::Hermes, hearth::chat::ToolCallFormat::Xml,
                 hearth::chat::ToolCallFormat::Llama3Json}) {
    hearth::chat::parse_tool_calls(src, f);
    hearth::chat::tool_call_holdback_start(src, f);
  }
  return 0;
}
