// OpenAI Responses (POST /v1/responses) in process against the FakeEngine: input items into
// CompletionRequest, Response objects, the streaming event order with sequence numbers,
// reasoning and function_call items both ways, refused fields, errors.
#include "server/api_error.h"
#include "server/request_parse.h"
#include "server/responses_api.h"
#include "server_test_util.h"

namespace hearth::server {
namespace {

using namespace hearth::server::testing;

ResponsesRequest parse_responses(const std::string& body) { return parse_responses_request(parse_body(body)); }

std::string refused_responses(const std::string& body) {
  try {
    parse_responses(body);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400) << body;
    return e.param();
  }
  return "<accepted>";
}

TEST(ResponsesParse, MapsInputItems) {
  const ResponsesRequest p = parse_responses(R"({
    "model": "fake-model", "instructions": "Be brief.", "max_output_tokens": 50, "temperature": 0.2, "top_p": 0.8,
    "input": [
      {"role": "user", "content": [{"type": "input_text", "text": "weather "}, {"type": "input_text", "text": "twice"}]},
      {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "two calls"}]},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
      {"type": "function_call", "call_id": "call_a", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
      {"type": "function_call", "call_id": "call_b", "name": "get_time", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "call_a", "output": "sunny"},
      {"type": "function_call_output", "call_id": "call_b", "output": [{"type": "input_text", "text": "noon"}]},
      {"role": "developer", "content": "answer in French"}],
    "tools": [{"type": "function", "name": "get_weather", "description": "d", "parameters": {"type": "object"}, "strict": true},
              {"type": "function", "name": "get_time"}],
    "tool_choice": {"type": "function", "name": "get_time"}, "reasoning": {"effort": "none"}, "store": false,
    "text": {"format": {"type": "text"}}, "stream": true})");
  const CompletionRequest& r = p.req;
  ASSERT_EQ(r.messages.size(), 6u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[0].content.value(), "Be brief.");
  EXPECT_EQ(r.messages[1].content.value(), "weather twice");
  const ChatMessage& a = r.messages[2];
  EXPECT_EQ(a.role, "assistant");
  EXPECT_EQ(a.content.value(), "Checking.");
  EXPECT_EQ(a.reasoning_content.value(), "two calls");
  ASSERT_EQ(a.tool_calls.size(), 2u);
  EXPECT_EQ(a.tool_calls[0].id, "call_a");
  EXPECT_EQ(a.tool_calls[0].arguments_json, R"({"city": "Paris"})");
  EXPECT_EQ(a.tool_calls[1].name, "get_time");
  EXPECT_EQ(r.messages[3].role, "tool");
  EXPECT_EQ(r.messages[3].tool_call_id, "call_a");
  EXPECT_EQ(r.messages[3].name, "get_weather");
  EXPECT_EQ(r.messages[3].content.value(), "sunny");
  EXPECT_EQ(r.messages[4].content.value(), "noon");
  EXPECT_EQ(r.messages[4].name, "get_time");
  EXPECT_EQ(r.messages[5].role, "system");
  EXPECT_EQ(r.max_tokens.value(), 50);
  EXPECT_DOUBLE_EQ(r.sampling.temperature.value(), 0.2);
  EXPECT_DOUBLE_EQ(r.sampling.top_p.value(), 0.8);
  ASSERT_EQ(r.tools.size(), 2u);
  EXPECT_EQ(J::parse(r.tools[0].dump()), J::parse(R"({"type": "function", "function": {"name": "get_weather", "description": "d",
                                     "parameters": {"type": "object"}}})"));
  EXPECT_EQ(r.tool_choice, "function");
  EXPECT_EQ(r.tool_choice_name, "get_time");
  EXPECT_EQ(r.chat_template_kwargs["enable_thinking"], false);
  EXPECT_TRUE(r.stream);
  EXPECT_EQ(p.echo["instructions"], "Be brief.");
  EXPECT_EQ(p.echo["max_output_tokens"], 50);
  EXPECT_EQ(J::parse(p.echo["tool_choice"].dump()), J::parse(R"({"type": "function", "name": "get_time"})"));

  // A string input is one user message; a call with no assistant text opens its own turn.
  const ResponsesRequest s = parse_responses(R"({"input": "hi", "tool_choice": "required"})");
  ASSERT_EQ(s.req.messages.size(), 1u);
  EXPECT_EQ(s.req.messages[0].role, "user");
  EXPECT_EQ(s.req.tool_choice, "required");
  const ResponsesRequest c = parse_responses(R"({"input": [{"role": "user", "content": "x"},
      {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "c", "output": "ok"}]})");
  ASSERT_EQ(c.req.messages.size(), 3u);
  EXPECT_FALSE(c.req.messages[1].content.has_value());
  EXPECT_EQ(c.req.messages[1].tool_calls.size(), 1u);
}

TEST(ResponsesParse, TextFormatJsonSchemaIsAStructuredOutput) {
  auto r = parse_responses(
      R"({"input": "x", "text": {"format": {"type": "json_schema", "name": "p", "strict": true,
          "schema": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": false}}}})");
  EXPECT_EQ(r.req.response_format, "json_schema");
  EXPECT_TRUE(r.req.response_grammar != nullptr);
  auto o = parse_responses(R"({"input": "x", "text": {"format": {"type": "json_object"}}})");
  EXPECT_EQ(o.req.response_format, "json_object");
}

TEST(ResponsesParse, RefusesWhatItCannotServe) {
  EXPECT_EQ(refused_responses(R"({"model": "m"})"), "input");
  EXPECT_EQ(refused_responses(R"({"input": "x", "previous_response_id": "resp_1"})"), "previous_response_id");
  EXPECT_EQ(refused_responses(R"({"input": "x", "store": true})"), "store");
  EXPECT_EQ(refused_responses(R"({"input": "x", "background": true})"), "background");
  EXPECT_EQ(refused_responses(R"({"input": "x", "conversation": "conv_1"})"), "conversation");
  EXPECT_EQ(refused_responses(R"({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]})"),
            "input[0].content[0].type");
  EXPECT_EQ(refused_responses(R"({"input": [{"type": "item_reference", "id": "msg_1"}]})"), "input[0].type");
  EXPECT_EQ(refused_responses(R"({"input": [{"role": "tool", "content": "x"}]})"), "input[0].role");
  EXPECT_EQ(refused_responses(R"({"input": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]})"), "input");
  EXPECT_EQ(refused_responses(R"({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]})"), "input[0].call_id");
  EXPECT_EQ(refused_responses(R"({"input": "x", "tools": [{"type": "web_search"}]})"), "tools[0].type");
  EXPECT_EQ(refused_responses(R"({"input": "x", "tools": [{"type": "function"}]})"), "tools[0].name");
  EXPECT_EQ(refused_responses(R"({"input": "x", "tool_choice": "sometimes"})"), "tool_choice");
  EXPECT_EQ(refused_responses(R"({"input": "x", "text": {"format": {"type": "yaml"}}})"), "text.format.type");
  EXPECT_EQ(refused_responses(R"({"input": "x", "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "string", "pattern": "a+"}}}})"),
            "text.format");
  EXPECT_EQ(refused_responses(R"({"input": "x", "max_output_tokens": 0})"), "max_output_tokens");
  EXPECT_EQ(refused_responses(R"({"input": "x", "temperature": 3})"), "temperature");
  EXPECT_EQ(refused_responses(R"({"input": []})"), "input");
  EXPECT_EQ(refused_responses(R"({"input": "x", "top_logprobs": 3})"), "top_logprobs");
  EXPECT_EQ(refused_responses(R"({"input": "x", "top_logprobs": 21})"), "top_logprobs");
  EXPECT_EQ(refused_responses(R"({"input": "x", "include": ["message.output_text.logprobs"]})"), "include[0]");
  EXPECT_EQ(parse_responses(R"({"input": "x", "top_logprobs": 0})").req.messages.size(), 1u);
}

// A reasoning item belongs to the assistant message or function_call after it: alone (no message
// at all: once a crash), before a user turn or a function_call_output, or last, it is refused.
TEST(ResponsesParse, ReasoningItemWithoutItsAssistantTurnIsRefused) {
  const std::string rs = R"({"type": "reasoning", "summary": [{"type": "summary_text", "text": "t"}]})";
  EXPECT_EQ(refused_responses(R"({"input": [{"type": "reasoning"}]})"), "input[0]");
  EXPECT_EQ(refused_responses(R"({"instructions": "be brief", "input": [)" + rs + "]}"), "input[0]");
  EXPECT_EQ(refused_responses(R"({"input": [{"role": "user", "content": "x"}, )" + rs + "]}"), "input[1]");
  EXPECT_EQ(refused_responses(R"({"input": [)" + rs + R"(, {"role": "user", "content": "x"}]})"), "input[0]");
  EXPECT_EQ(refused_responses(R"({"input": [{"role": "user", "content": "x"}, )" + rs + ", " + rs +
                              R"(, {"type": "function_call_output", "call_id": "c", "output": "o"}]})"),
            "input[1]");
  try {
    parse_responses(R"({"input": [{"type": "reasoning"}]})");
  } catch (const ApiError& e) {
    EXPECT_NE(std::string(e.what()).find("must be followed by the assistant message or function_call"), std::string::npos)
        << e.what();
  }
  // Followed by its assistant turn it is that turn's reasoning (MapsInputItems covers function_call).
  auto ok = parse_responses(R"({"input": [{"role": "user", "content": "x"}, )" + rs +
                            R"(, {"role": "assistant", "content": "y"}, {"role": "user", "content": "z"}]})");
  ASSERT_EQ(ok.req.messages.size(), 3u);
  EXPECT_EQ(ok.req.messages[1].reasoning_content.value_or(""), "t");
}

// A bad text.format schema names the field the client sent, not chat's response_format.
TEST(ResponsesParse, TextFormatErrorsNameTextFormat) {
  try {
    parse_responses(R"({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "banana"}}}})");
    FAIL() << "accepted";
  } catch (const ApiError& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.param(), "text.format");
    EXPECT_EQ(m.find("response_format"), std::string::npos) << m;
    EXPECT_NE(m.find("'text.format.schema'"), std::string::npos) << m;
  }
}

class ResponsesServerTest : public ServerTest {
 protected:
  httplib::Result responses(const std::string& body) { return post("/v1/responses", body); }
  static std::string body(const std::string& input, const std::string& extra = "") {
    return R"({"model": "fake-model", "input": )" + J(input).dump() + extra + "}";
  }
  std::vector<std::pair<std::string, J>> stream(const std::string& b) {
    auto r = responses(b);
    EXPECT_TRUE(r);
    if (!r) return {};
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
    auto evs = named_sse_events(r->body);
    for (size_t i = 0; i < evs.size(); ++i) EXPECT_EQ(evs[i].second["sequence_number"], i) << evs[i].first;
    return evs;
  }
};

TEST_F(ResponsesServerTest, NonStreamingResponse) {
  start();
  auto r = responses(body("hello there", R"(, "instructions": "sys", "temperature": 0.5)"));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  J j = J::parse(r->body);
  EXPECT_EQ(j["id"].get<std::string>().rfind("resp_", 0), 0u);
  EXPECT_EQ(j["object"], "response");
  EXPECT_TRUE(j["created_at"].is_number_integer());
  EXPECT_EQ(j["status"], "completed");
  EXPECT_TRUE(j["incomplete_details"].is_null());
  EXPECT_TRUE(j["error"].is_null());
  EXPECT_EQ(j["model"], "fake-model");
  EXPECT_EQ(j["instructions"], "sys");
  EXPECT_EQ(j["temperature"], 0.5);
  ASSERT_EQ(j["output"].size(), 1u);
  const J& msg = j["output"][0];
  EXPECT_EQ(msg["type"], "message");
  EXPECT_EQ(msg["id"].get<std::string>().rfind("msg_", 0), 0u);
  EXPECT_EQ(msg["role"], "assistant");
  EXPECT_EQ(msg["status"], "completed");
  EXPECT_EQ(msg["content"], J::parse(R"([{"type": "output_text", "text": "hello there", "annotations": [], "logprobs": []}])"));
  // "system: sys\nuser: hello there\nassistant:" = 6 fake tokens; 2 words + EOS.
  EXPECT_EQ(j["usage"], J::parse(R"({"input_tokens": 6, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 3,
                                     "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 9})"));
}

TEST_F(ResponsesServerTest, LengthLimitIsIncomplete) {
  start();
  J j = J::parse(responses(body("a b c d", R"(, "max_output_tokens": 2)"))->body);
  EXPECT_EQ(j["status"], "incomplete");
  EXPECT_EQ(j["incomplete_details"], J({{"reason", "max_output_tokens"}}));
  EXPECT_EQ(j["output"][0]["content"][0]["text"], "a b");
  EXPECT_EQ(j["output"][0]["status"], "incomplete");
  auto evs = stream(body("a b c d", R"(, "max_output_tokens": 2, "stream": true)"));
  ASSERT_FALSE(evs.empty());
  EXPECT_EQ(evs.back().first, "response.incomplete");
  EXPECT_EQ(evs.back().second["response"]["incomplete_details"]["reason"], "max_output_tokens");
}

TEST_F(ResponsesServerTest, StreamingEventOrder) {
  start();
  auto evs = stream(body("one two three", R"(, "stream": true)"));
  std::vector<std::string> names;
  std::string text;
  for (const auto& [name, data] : evs) {
    names.push_back(name);
    if (name == "response.output_text.delta") text += data["delta"].get<std::string>();
  }
  const std::vector<std::string> want = {
      "response.created",           "response.in_progress",       "response.output_item.added",
      "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
      "response.output_text.delta", "response.output_text.done",  "response.content_part.done",
      "response.output_item.done",  "response.completed"};
  EXPECT_EQ(names, want);
  EXPECT_EQ(text, "one two three");
  EXPECT_EQ(evs[0].second["response"]["status"], "in_progress");
  EXPECT_EQ(evs[0].second["response"]["output"], J::array());
  const std::string item_id = evs[2].second["item"]["id"];
  EXPECT_EQ(evs[2].second["item"]["type"], "message");
  EXPECT_EQ(evs[2].second["output_index"], 0);
  EXPECT_EQ(evs[4].second["item_id"], item_id);
  EXPECT_EQ(evs[4].second["content_index"], 0);
  EXPECT_EQ(evs[7].second["text"], "one two three");
  EXPECT_EQ(evs[9].second["item"]["content"][0]["text"], "one two three");
  const J& done = evs.back().second["response"];
  EXPECT_EQ(done["id"], evs[0].second["response"]["id"]);
  EXPECT_EQ(done["status"], "completed");
  EXPECT_EQ(done["output"][0]["id"], item_id);
  EXPECT_EQ(done["output"][0]["content"][0]["text"], "one two three");
  EXPECT_EQ(done["usage"]["output_tokens"], 4);
}

// An output that is all reasoning has one reasoning item and no empty message item either way;
// an empty output alone is still one empty message.
TEST_F(ResponsesServerTest, ReasoningOnlyOutputHasNoEmptyMessage) {
  FakeEngineOptions fo;
  fo.reasoning = chat::ReasoningFormat::ThinkTags;
  start({}, fo);
  const std::string effort = R"(, "reasoning": {"effort": "high"})";
  J j = J::parse(responses(body("emit:still thinking", effort))->body);
  ASSERT_EQ(j["output"].size(), 1u) << j.dump();
  EXPECT_EQ(j["output"][0]["type"], "reasoning");
  std::vector<std::string> items;
  for (const auto& [name, data] : stream(body("emit:still thinking", effort + R"(, "stream": true)")))
    if (name == "response.output_item.added") items.push_back(data["item"]["type"].get<std::string>());
  EXPECT_EQ(items, std::vector<std::string>{"reasoning"});
  J empty = J::parse(responses(body("emit:"))->body);
  ASSERT_EQ(empty["output"].size(), 1u) << empty.dump();
  EXPECT_EQ(empty["output"][0]["type"], "message");
}

TEST_F(ResponsesServerTest, ReasoningAndFunctionCallsBothWays) {
  FakeEngineOptions fo;
  fo.reasoning = chat::ReasoningFormat::ThinkTags;
  start({}, fo);
  const std::string extra =
      R"(, "reasoning": {"effort": "high"}, "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}])";
  const std::string user = R"(emit:plan</think><tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>)";
  J j = J::parse(responses(body(user, extra))->body);
  ASSERT_EQ(j["output"].size(), 2u) << j.dump();
  EXPECT_EQ(j["output"][0]["type"], "reasoning");
  EXPECT_EQ(j["output"][0]["content"][0]["text"], "plan");
  const J& fc = j["output"][1];
  EXPECT_EQ(fc["type"], "function_call");
  EXPECT_EQ(fc["name"], "get_weather");
  EXPECT_EQ(fc["call_id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(fc["id"].get<std::string>().rfind("fc_", 0), 0u);
  EXPECT_EQ(J::parse(fc["arguments"].get<std::string>()), J({{"city", "Paris"}}));
  EXPECT_EQ(fc["status"], "completed");
  EXPECT_EQ(j["status"], "completed");
  // The thought's tokens ("pla", "n</", "thi", "nk>": three characters per fake token), the
  // closing marker's included (it was always 0).
  EXPECT_EQ(j["usage"]["output_tokens_details"]["reasoning_tokens"], 4) << j["usage"].dump();

  auto evs = stream(body(user, extra + R"(, "stream": true)"));
  // Event names with runs of the same delta collapsed (the thought arrives in several pieces).
  std::vector<std::string> names;
  std::string reasoning;
  size_t call_added = 0, call_args_done = 0;
  for (size_t i = 0; i < evs.size(); ++i) {
    const auto& [name, data] = evs[i];
    if (name == "response.reasoning_text.delta") reasoning += data["delta"].get<std::string>();
    if (name == "response.output_item.added" && data["item"]["type"] == "function_call") call_added = i;
    if (name == "response.function_call_arguments.done") call_args_done = i;
    if (names.empty() || names.back() != name || name.find(".delta") == std::string::npos) names.push_back(name);
  }
  const std::vector<std::string> want = {
      "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
      "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
      "response.output_item.done", "response.output_item.added", "response.function_call_arguments.delta",
      "response.function_call_arguments.done", "response.output_item.done", "response.completed"};
  EXPECT_EQ(names, want);
  EXPECT_EQ(reasoning, "plan");
  ASSERT_GT(call_added, 0u);
  EXPECT_EQ(evs[call_added].second["output_index"], 1);
  EXPECT_EQ(evs[call_added].second["item"]["arguments"], "");
  EXPECT_EQ(J::parse(evs[call_args_done].second["arguments"].get<std::string>()), J({{"city", "Paris"}}));
  const J& done = evs.back().second["response"];
  ASSERT_EQ(done["output"].size(), 2u);
  EXPECT_EQ(done["output"][0]["content"][0]["text"], "plan");
  EXPECT_EQ(done["output"][1]["call_id"], evs[call_added].second["item"]["call_id"]);
  EXPECT_EQ(done["usage"]["output_tokens_details"]["reasoning_tokens"], 4);

  // The round trip: the call and its output go back as items; the model sees a tool message.
  J next = J::parse(body("x", R"(, "tools": [{"type": "function", "name": "get_weather"}])"));
  next["input"] = J::array({J{{"role", "user"}, {"content", "weather?"}}, fc,
                            J{{"type", "function_call_output"}, {"call_id", fc["call_id"]}, {"output", "sunny"}}});
  J answer = J::parse(responses(next.dump())->body);
  EXPECT_EQ(answer["output"].back()["content"][0]["text"], "Tool result: sunny") << answer.dump();
}

TEST_F(ResponsesServerTest, Errors) {
  start();
  expect_error(responses(body("x", R"(, "previous_response_id": "resp_1")")), 400, "previous_response_id");
  expect_error(responses(R"({"model": "gpt-5", "input": "x"})"), 404, "model", "model_not_found");
  expect_error(responses(body("__bad_prompt__")), 400);
  auto evs = stream(body("__fail_generate__ a b", R"(, "stream": true)"));
  ASSERT_FALSE(evs.empty());
  EXPECT_EQ(evs.back().first, "error");
  EXPECT_EQ(evs.back().second["code"], "server_error");
  EXPECT_EQ(engine_->generations(), 1);
}

}  // namespace
}  // namespace hearth::server
