// Structured outputs in the server: response_format and forced tool-call parsing (400s naming
// the parameter and the unsupported feature, "yaml" refused), and end to end over HTTP on the
// bundled starter model at temperature 1 with several seeds: the content parses and validates
// against the schema (required keys, enum, no extra keys), finish_reason "stop"; a forced tool
// call comes back as tool_calls with arguments matching the tool's parameters.
#include <gtest/gtest.h>
#include <httplib.h>

#include <thread>

#include "server/api_error.h"
#include "server/model_engine.h"
#include "server/request_parse.h"
#include "server/server.h"
#include "server/structured_output.h"
#include "test_paths.h"

namespace hearth::server {
namespace {

namespace fs = std::filesystem;
using OJ = nlohmann::ordered_json;

const fs::path kStarter = fs::path(HEARTH_SOURCE_DIR) / "models/starter";

OJ chat_body(const OJ& response_format) {
  return OJ{{"model", "m"}, {"messages", OJ::array({OJ{{"role", "user"}, {"content", "hi"}}})}, {"response_format", response_format}};
}

ApiError parse_error(const OJ& body) {
  try {
    parse_chat_request(body);
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(0, "no error");
}

TEST(StructuredOutputParse, TypesAndErrors) {
  EXPECT_EQ(parse_chat_request(chat_body(OJ{{"type", "text"}})).response_grammar, nullptr);
  CompletionRequest obj = parse_chat_request(chat_body(OJ{{"type", "json_object"}}));
  EXPECT_EQ(obj.response_format, "json_object");
  EXPECT_NE(obj.response_grammar, nullptr);
  CompletionRequest sch = parse_chat_request(
      chat_body(OJ{{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"strict", true}, {"schema", {{"type", "integer"}}}}}}));
  EXPECT_EQ(sch.response_format, "json_schema");
  ASSERT_NE(sch.response_grammar, nullptr);

  ApiError yaml = parse_error(chat_body(OJ{{"type", "yaml"}}));
  EXPECT_EQ(yaml.status(), 400);
  EXPECT_EQ(yaml.param(), "response_format");
  EXPECT_EQ(std::string(yaml.what()),
            "Invalid 'response_format.type': 'yaml'. Supported values are: 'text', 'json_object', and 'json_schema'.");
  ApiError pattern = parse_error(chat_body(
      OJ{{"type", "json_schema"},
        {"json_schema", {{"name", "x"}, {"schema", {{"type", "object"}, {"properties", {{"zip", {{"type", "string"}, {"pattern", "^[0-9]+$"}}}}}}}}}}));
  EXPECT_EQ(pattern.status(), 400);
  EXPECT_EQ(pattern.param(), "response_format");
  EXPECT_EQ(std::string(pattern.what()),
            "Invalid 'response_format.json_schema.schema': unsupported JSON Schema keyword 'pattern' at #/properties/zip.");
  EXPECT_EQ(parse_error(chat_body(OJ{{"type", "json_schema"}})).param(), "response_format");
  EXPECT_EQ(parse_error(chat_body("json")).param(), "response_format");
  // The completions route parses it too.
  ApiError comp(0, "");
  try {
    parse_completion_request(OJ{{"prompt", "x"}, {"response_format", {{"type", "yaml"}}}});
  } catch (const ApiError& e) {
    comp = e;
  }
  EXPECT_EQ(comp.status(), 400);
  EXPECT_EQ(comp.param(), "response_format");
}

OJ weather_tools() {
  return OJ::parse(R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
      "required": ["city", "unit"], "additionalProperties": false}}},
      {"type": "function", "function": {"name": "get_time"}}])");
}

TEST(StructuredOutputParse, ForcedToolCalls) {
  OJ body = chat_body(nullptr);
  body["tools"] = weather_tools();
  body["tool_choice"] = OJ{{"type", "function"}, {"function", {{"name", "nope"}}}};
  ApiError missing = parse_error(body);
  EXPECT_EQ(missing.status(), 400);
  EXPECT_EQ(missing.param(), "tool_choice");
  EXPECT_EQ(std::string(missing.what()), "Invalid 'tool_choice': function 'nope' is not in 'tools'.");
  body["tool_choice"] = "required";
  body["tools"][0]["function"]["parameters"]["properties"]["city"]["minimum"] = 1;
  ApiError schema = parse_error(body);
  EXPECT_EQ(schema.param(), "tools");
  EXPECT_NE(std::string(schema.what()).find("'minimum' at tools[0].function.parameters#/properties/city"), std::string::npos)
      << schema.what();
  body["tools"] = weather_tools();
  CompletionRequest req = parse_chat_request(body);
  EXPECT_TRUE(req.forces_tool_call());
  EXPECT_NE(tool_call_grammar(req, chat::ToolCallFormat::Hermes), nullptr);
  EXPECT_NE(tool_call_grammar(req, chat::ToolCallFormat::Llama3Json), nullptr);
  try {
    check_structured_output(req, chat::ToolCallFormat::Gemma4);
    ADD_FAILURE() << "no error for Gemma4";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "tool_choice");
  }
  req.tool_choice = "auto";
  EXPECT_EQ(tool_call_grammar(req, chat::ToolCallFormat::Gemma4), nullptr);
  // A function may be named like a tool_choice mode ("auto", "none", "required"): forcing it by
  // name forces that function (the name was once stored in the mode's field and read as the mode).
  for (const char* name : {"auto", "none", "required"}) {
    OJ named = chat_body(nullptr);
    named["tools"] = weather_tools();
    named["tools"][1]["function"]["name"] = name;
    named["tool_choice"] = OJ{{"type", "function"}, {"function", {{"name", name}}}};
    const CompletionRequest r = parse_chat_request(named);
    EXPECT_EQ(r.tool_choice, "function");
    EXPECT_EQ(r.tool_choice_name, name);
    EXPECT_TRUE(r.forces_tool_call()) << name;
    EXPECT_NE(tool_call_grammar(r, chat::ToolCallFormat::Hermes), nullptr) << name;
    named["ignore_eos"] = true;  // a forced call: refused with ignore_eos
    EXPECT_EQ(parse_error(named).param(), "ignore_eos") << name;
  }
  // A forced choice ("required" or a named function) with no tools is a 400 (OpenAI's answer):
  // at parsing for chat, at the engine's check for the routes that parse it elsewhere (Anthropic,
  // Responses).
  OJ no_tools = chat_body(nullptr);
  for (const OJ& choice : {OJ("required"), OJ{{"type", "function"}, {"function", {{"name", "f"}}}}}) {
    no_tools["tool_choice"] = choice;
    const ApiError e = parse_error(no_tools);
    EXPECT_EQ(e.param(), "tool_choice");
    EXPECT_EQ(std::string(e.what()), "Invalid 'tool_choice': it forces a tool call, but the request gives no 'tools'.");
  }
  CompletionRequest forced;
  forced.chat = true;
  forced.tool_choice = "required";
  EXPECT_THROW(check_structured_output(forced, chat::ToolCallFormat::Hermes), ApiError);
  forced.tool_choice = "function", forced.tool_choice_name = "f";
  EXPECT_THROW(check_structured_output(forced, chat::ToolCallFormat::Hermes), ApiError);
  no_tools["tool_choice"] = "auto";
  EXPECT_NO_THROW(check_structured_output(parse_chat_request(no_tools), chat::ToolCallFormat::Hermes));
}

class StarterStructuredTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ModelEngineOptions o;
    o.model_dir = kStarter;
    o.device = "cpu";
    o.dtype = "float32";
    engine_ = std::make_unique<ModelEngine>(std::move(o));
    ServerOptions so;
    so.port = 0;
    server_ = std::make_unique<Server>(*engine_, so);
    port_ = server_->bind();
    thread_ = std::thread([this] { server_->serve(); });
  }
  void TearDown() override {
    if (server_) server_->stop();
    if (thread_.joinable()) thread_.join();
  }
  httplib::Result post(const OJ& body) {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120, 0);
    return c.Post("/v1/chat/completions", body.dump(), "application/json");
  }
  std::unique_ptr<ModelEngine> engine_;
  std::unique_ptr<Server> server_;
  std::thread thread_;
  int port_ = 0;
};

TEST_F(StarterStructuredTest, JsonSchemaAtTemperatureOneIsValidForEverySeed) {
  const OJ schema = OJ::parse(R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 16},
      "color": {"enum": ["red", "green", "blue"]},
      "count": {"type": "integer"},
      "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
      "ok": {"type": "boolean"}},
      "required": ["name", "color", "count", "ok"], "additionalProperties": false})");
  for (int seed : {1, 2, 3, 4}) {
    OJ body = {{"messages", OJ::array({OJ{{"role", "user"}, {"content", "Describe a fruit as JSON."}}})},
              {"temperature", 1.0},
              {"seed", seed},
              {"max_tokens", 400},
              {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "fruit"}, {"schema", schema}}}}}};
    auto r = post(body);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    OJ resp = OJ::parse(r->body);
    EXPECT_EQ(resp["choices"][0]["finish_reason"], "stop") << r->body;
    const std::string content = resp["choices"][0]["message"]["content"];
    OJ v = OJ::parse(content, nullptr, false);
    ASSERT_FALSE(v.is_discarded()) << "seed " << seed << ": not JSON: " << content;
    ASSERT_TRUE(v.is_object()) << content;
    for (const char* k : {"name", "color", "count", "ok"}) EXPECT_TRUE(v.contains(k)) << k << " missing: " << content;
    for (const auto& [k, _] : v.items())
      EXPECT_TRUE(k == "name" || k == "color" || k == "count" || k == "tags" || k == "ok") << "extra key " << k;
    EXPECT_TRUE(v["name"].is_string());
    EXPECT_TRUE(v["color"] == "red" || v["color"] == "green" || v["color"] == "blue") << content;
    EXPECT_TRUE(v["count"].is_number_integer()) << content;
    EXPECT_TRUE(v["ok"].is_boolean()) << content;
    if (v.contains("tags")) {
      ASSERT_TRUE(v["tags"].is_array());
      EXPECT_LE(v["tags"].size(), 3u);
    }
  }
}

TEST_F(StarterStructuredTest, JsonObjectAndForcedToolCall) {
  OJ body = {{"messages", OJ::array({OJ{{"role", "user"}, {"content", "Weather in Paris?"}}})},
            {"temperature", 1.0},
            {"seed", 5},
            {"max_tokens", 300},
            {"response_format", {{"type", "json_object"}}}};
  auto r = post(body);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  OJ resp = OJ::parse(r->body);
  if (resp["choices"][0]["finish_reason"] == "stop") {
    OJ v = OJ::parse(std::string(resp["choices"][0]["message"]["content"]), nullptr, false);
    EXPECT_TRUE(v.is_object()) << r->body;
  } else {
    EXPECT_EQ(resp["choices"][0]["finish_reason"], "length") << r->body;  // free JSON may run long
  }

  body.erase("response_format");
  body["tools"] = weather_tools();
  body["tool_choice"] = OJ{{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  for (int seed : {6, 7}) {
    body["seed"] = seed;
    r = post(body);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    resp = OJ::parse(r->body);
    const OJ& choice = resp["choices"][0];
    EXPECT_EQ(choice["finish_reason"], "tool_calls") << r->body;
    ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u) << r->body;
    const OJ& fn = choice["message"]["tool_calls"][0]["function"];
    EXPECT_EQ(fn["name"], "get_weather");
    OJ args = OJ::parse(std::string(fn["arguments"]));
    EXPECT_EQ(args.size(), 2u) << args;
    EXPECT_TRUE(args["city"].is_string());
    EXPECT_TRUE(args["unit"] == "c" || args["unit"] == "f") << args;
  }
  // An unsupported feature and an unknown type are 400s before generation.
  body.erase("tools");
  body.erase("tool_choice");
  body["response_format"] = {{"type", "yaml"}};
  r = post(body);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(OJ::parse(r->body)["error"]["type"], "invalid_request_error");
  EXPECT_EQ(OJ::parse(r->body)["error"]["param"], "response_format");
  body["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", {{"type", "string"}, {"format", "ipv6"}}}}}};
  r = post(body);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("format 'ipv6'"), std::string::npos) << r->body;
}

}  // namespace
}  // namespace hearth::server
