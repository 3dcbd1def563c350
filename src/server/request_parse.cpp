// Validation and conversion of OpenAI chat/completions request bodies into native structs.
// Not responsible for defaults or context limits (engine_loop.cpp) or for the response shape.
#include "server/request_parse.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/json_nesting.h"
#include "server/api_error.h"
#include "server/json_fields.h"
#include "server/structured_output.h"

namespace hearth::server {
namespace {

using json = nlohmann::ordered_json;

constexpr int64_t kMaxTokensLimit = std::numeric_limits<int32_t>::max();

std::string type_name(const json& v) { return json_type_name(v); }

[[noreturn]] void bad(const std::string& param, const std::string& msg) { bad_value(param, msg); }

const json* field(const json& obj, const std::string& key) { return json_field(obj, key); }

std::optional<bool> boolean(const json& body, const std::string& key) { return boolean_field(body, key); }

// Content: a string, or an array of {"type": "text", "text": ...} parts (concatenated).
std::optional<std::string> parse_content(const json& msg, const std::string& p) {
  const json* c = field(msg, "content");
  if (!c) return std::nullopt;
  if (c->is_string()) return c->get<std::string>();
  if (!c->is_array()) bad_type(p + ".content", *c, "a string or an array of content parts");
  std::string text;
  for (size_t j = 0; j < c->size(); ++j) {
    const json& part = (*c)[j];
    std::string pp = p + ".content[" + std::to_string(j) + "]";
    if (!part.is_object()) bad_type(pp, part, "an object");
    auto type = string_field(part, "type", pp + ".type");
    if (!type) bad(pp + ".type", "Missing required parameter: '" + pp + ".type'.");
    if (*type != "text")
      bad(pp + ".type", "Unsupported content part type '" + *type + "' in '" + pp +
                            "': this server accepts text parts only.");
    auto t = string_field(part, "text", pp + ".text");
    if (!t) bad(pp + ".text", "Missing required parameter: '" + pp + ".text'.");
    text += *t;
  }
  return text;
}

ToolCall parse_tool_call(const json& tc, const std::string& p) {
  if (!tc.is_object()) bad_type(p, tc, "an object");
  ToolCall call;
  call.id = string_field(tc, "id", p + ".id").value_or("");
  auto type = string_field(tc, "type", p + ".type").value_or("function");
  if (type != "function") bad(p + ".type", "Invalid '" + p + ".type': only 'function' is supported.");
  const json* fn = field(tc, "function");
  if (!fn) bad(p + ".function", "Missing required parameter: '" + p + ".function'.");
  if (!fn->is_object()) bad_type(p + ".function", *fn, "an object");
  auto name = string_field(*fn, "name", p + ".function.name");
  if (!name) bad(p + ".function.name", "Missing required parameter: '" + p + ".function.name'.");
  call.name = *name;
  const json* args = field(*fn, "arguments");
  if (!args) call.arguments_json = "{}";
  else if (args->is_string()) {
    // The string is parsed later for the template: refuse what would nest too deep there.
    call.arguments_json = args->get<std::string>();
    if (auto path = json_nesting_violation(call.arguments_json)) {
      const std::string param = p + ".function.arguments";
      throw ApiError(400, json_nesting_message("Invalid '" + param + "'", *path), param, "invalid_value");
    }
  }
  else if (args->is_object()) call.arguments_json = args->dump();
  else bad_type(p + ".function.arguments", *args, "a string");
  return call;
}

std::vector<ChatMessage> parse_messages(const json& body) {
  const json* ms = field(body, "messages");
  if (!ms) throw ApiError(400, "Missing required parameter: 'messages'.", "messages", "missing_required_parameter");
  if (!ms->is_array()) bad_type("messages", *ms, "an array");
  if (ms->empty()) bad("messages", "Invalid 'messages': empty array. Expected an array with minimum length 1.");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < ms->size(); ++i) {
    const json& m = (*ms)[i];
    std::string p = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) bad_type(p, m, "an object");
    ChatMessage msg;
    auto role = string_field(m, "role", p + ".role");
    if (!role) bad(p + ".role", "Missing required parameter: '" + p + ".role'.");
    msg.role = *role == "developer" ? "system" : *role;
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" && msg.role != "tool")
      bad(p + ".role", "Invalid value for '" + p + ".role': '" + *role +
                           "'. Supported values are: 'system', 'developer', 'user', 'assistant', and 'tool'.");
    msg.content = parse_content(m, p);
    msg.name = string_field(m, "name", p + ".name").value_or("");
    msg.tool_call_id = string_field(m, "tool_call_id", p + ".tool_call_id").value_or("");
    msg.reasoning_content = string_field(m, "reasoning_content", p + ".reasoning_content");
    if (!msg.reasoning_content) msg.reasoning_content = string_field(m, "reasoning", p + ".reasoning");
    if (const json* tcs = field(m, "tool_calls")) {
      if (!tcs->is_array()) bad_type(p + ".tool_calls", *tcs, "an array");
      for (size_t k = 0; k < tcs->size(); ++k)
        msg.tool_calls.push_back(parse_tool_call((*tcs)[k], p + ".tool_calls[" + std::to_string(k) + "]"));
    }
    if (!msg.content && msg.role != "assistant")
      bad(p + ".content", "Missing required parameter: '" + p + ".content'.");
    out.push_back(std::move(msg));
  }
  return out;
}

void parse_tools(const json& body, CompletionRequest& req) {
  if (const json* tools = field(body, "tools")) {
    if (!tools->is_array()) bad_type("tools", *tools, "an array");
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& t = (*tools)[i];
      std::string p = "tools[" + std::to_string(i) + "]";
      if (!t.is_object()) bad_type(p, t, "an object");
      auto type = string_field(t, "type", p + ".type").value_or("function");
      if (type != "function") bad(p + ".type", "Invalid '" + p + ".type': only 'function' is supported.");
      const json* fn = field(t, "function");
      if (!fn || !fn->is_object()) bad(p + ".function", "Missing required parameter: '" + p + ".function'.");
      if (!string_field(*fn, "name", p + ".function.name"))
        bad(p + ".function.name", "Missing required parameter: '" + p + ".function.name'.");
      // A JSON Schema object, as OpenAI requires (a string was accepted and then ignored).
      if (const json* params = field(*fn, "parameters"); params && !params->is_object())
        bad_type(p + ".function.parameters", *params, "an object");
    }
    req.tools = *tools;
  }
  if (const json* tc = field(body, "tool_choice")) {
    if (tc->is_string()) {
      std::string s = tc->get<std::string>();
      if (s != "none" && s != "auto" && s != "required")
        bad("tool_choice", "Invalid value for 'tool_choice': '" + s + "'. Supported values are: 'none', 'auto', and 'required'.");
      req.tool_choice = s;
    } else if (tc->is_object()) {
      const json* fn = field(*tc, "function");
      auto name = fn && fn->is_object() ? string_field(*fn, "name", "tool_choice.function.name") : std::nullopt;
      if (!name) bad("tool_choice.function.name", "Missing required parameter: 'tool_choice.function.name'.");
      req.tool_choice = "function";
      req.tool_choice_name = *name;
    } else {
      bad_type("tool_choice", *tc, "a string or an object");
    }
  }
  // A forced call is compiled now so a bad parameters schema is a 400 before queueing (the
  // engine checks its own tool-call format in prepare()).
  (void)tool_call_grammar(req, chat::ToolCallFormat::Hermes);
}

// Fields shared by both endpoints.
void parse_common(const json& body, CompletionRequest& req) {
  req.model = string_field(body, "model", "model").value_or("");
  auto max_tokens = integer_in(body, "max_tokens", 1, kMaxTokensLimit);
  auto max_completion = integer_in(body, "max_completion_tokens", 1, kMaxTokensLimit);
  req.max_tokens = max_completion ? max_completion : max_tokens;
  req.max_tokens_param = max_completion ? "max_completion_tokens" : "max_tokens";
  auto& s = req.sampling;
  s.temperature = number_in(body, "temperature", 0, 2);
  s.top_p = number_in(body, "top_p", 0, 1);
  s.top_k = integer_in(body, "top_k", 0, kMaxTokensLimit);
  s.min_p = number_in(body, "min_p", 0, 1);
  s.seed = integer_in(body, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
  s.repetition_penalty = number_in(body, "repetition_penalty", 0, 100, /*lo_open=*/true);
  s.presence_penalty = number_in(body, "presence_penalty", -2, 2);
  s.frequency_penalty = number_in(body, "frequency_penalty", -2, 2);
  if (const json* lb = field(body, "logit_bias")) {
    // OpenAI: an object from token ids (as strings) to a bias in [-100, 100].
    if (!lb->is_object()) bad_type("logit_bias", *lb, "an object mapping token ids to numbers");
    if (lb->size() > 1024) bad("logit_bias", "Invalid 'logit_bias': at most 1024 entries are supported.");
    for (const auto& [key, value] : lb->items()) {
      const bool digits = !key.empty() && key.size() <= 12 &&
                          std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (!digits) bad("logit_bias", "Invalid 'logit_bias': key '" + key + "' is not a token id.");
      if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < -100 ||
          value.get<double>() > 100)
        bad("logit_bias", "Invalid 'logit_bias': the bias of token " + key + " must be a number in [-100, 100].");
      s.logit_bias.emplace_back(std::stoll(key), value.get<double>());
    }
  }
  // n choices (OpenAI, vLLM): at most --max-num-seqs, which EngineLoop checks.
  if (auto n = integer_in(body, "n", 1, 1 << 20)) req.n = static_cast<int>(*n);
  if (const json* stop = field(body, "stop")) {
    if (stop->is_string()) {
      req.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      if (stop->size() > 16) bad("stop", "Invalid 'stop': at most 16 stop strings are supported.");
      for (size_t i = 0; i < stop->size(); ++i) {
        if (!(*stop)[i].is_string()) bad_type("stop[" + std::to_string(i) + "]", (*stop)[i], "a string");
        req.stop.push_back((*stop)[i].get<std::string>());
      }
    } else {
      bad_type("stop", *stop, "a string or an array of strings");
    }
    std::erase_if(req.stop, [](const std::string& x) { return x.empty(); });
  }
  req.stream = boolean(body, "stream").value_or(false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) bad_type("stream_options", *so, "an object");
    if (const json* iu = field(*so, "include_usage")) {
      if (!iu->is_boolean()) bad_type("stream_options.include_usage", *iu, "a boolean");
      req.include_usage = iu->get<bool>();
    }
  }
  req.adapter = string_field(body, "adapter", "adapter");
  req.ignore_eos = boolean(body, "ignore_eos").value_or(false);
  parse_response_format(body, req);
  if (req.ignore_eos && req.response_format != "text")
    bad("ignore_eos", "Invalid 'ignore_eos': it cannot be combined with a response_format (its grammar ends at EOS).");
}

}  // namespace

nlohmann::ordered_json parse_body(std::string_view body) {
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos)
    throw ApiError(400, "The request body is empty: send a JSON object (Content-Type: application/json).", "",
                   "invalid_json");
  // nlohmann's parser is iterative, but copying, dumping and converting a parsed value recurse:
  // nothing deeper than kMaxNesting gets past this point.
  if (auto path = json_nesting_violation(body))
    throw ApiError(400, json_nesting_message("Invalid JSON body", *path), *path, "invalid_value");
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {  // syntax (parse_error) and numbers past a double (out_of_range 406)
    std::string what = e.what();
    auto colon = what.find("] ");  // drop nlohmann's "[json.exception.parse_error.101]" prefix
    if (colon != std::string::npos) what = what.substr(colon + 2);
    constexpr size_t kMaxEcho = 200;  // the message may quote a literal of the body (a 5,000-digit number)
    if (what.size() > kMaxEcho) what = what.substr(0, kMaxEcho) + "...";
    throw ApiError(400, "Invalid JSON body: " + what, "", "invalid_json");
  }
  if (!j.is_object()) throw ApiError(400, "Invalid JSON body: expected an object, but got " + type_name(j) + ".", "", "invalid_json");
  return j;
}

CompletionRequest parse_chat_request(const nlohmann::ordered_json& body) {
  CompletionRequest req;
  req.chat = true;
  req.messages = parse_messages(body);
  parse_common(body, req);
  parse_tools(body, req);
  if (req.ignore_eos && req.forces_tool_call())
    bad("ignore_eos", "Invalid 'ignore_eos': it cannot be combined with a forced tool call (tool_choice '" +
                          (req.tool_choice == "function" ? req.tool_choice_name : req.tool_choice) + "').");
  req.logprobs = boolean(body, "logprobs").value_or(false);
  if (auto k = integer_in(body, "top_logprobs", 0, 20)) {
    if (!req.logprobs && *k > 0) bad("top_logprobs", "Invalid 'top_logprobs': requires 'logprobs' to be true.");
    req.top_logprobs = static_cast<int>(*k);
  }
  if (const json* kw = field(body, "chat_template_kwargs")) {
    if (!kw->is_object()) bad_type("chat_template_kwargs", *kw, "an object");
    // Names the prompt builder sets itself may not be overridden through the kwargs.
    for (const char* reserved : {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})
      if (kw->contains(reserved))
        throw ApiError(400, hearth::cat("chat_template_kwargs.", reserved, " is set by the server and cannot be given"),
                       hearth::cat("chat_template_kwargs.", reserved), "invalid_value");
    req.chat_template_kwargs = *kw;
  }
  return req;
}

CompletionRequest parse_completion_request(const nlohmann::ordered_json& body) {
  CompletionRequest req;
  req.chat = false;
  const json* p = field(body, "prompt");
  if (!p) throw ApiError(400, "Missing required parameter: 'prompt'.", "prompt", "missing_required_parameter");
  if (p->is_array() && p->empty()) bad("prompt", "Invalid 'prompt': empty array.");
  // One prompt in a list (as LangChain and the legacy SDK send it) is that prompt; several are a
  // batch, which stays unsupported.
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) {
    p = &(*p)[0];
    if (p->is_array() && p->empty()) bad("prompt", "Invalid 'prompt[0]': empty array.");
  }
  if (p->is_array() && !(*p)[0].is_string() && !(*p)[0].is_array()) {
    // One prompt as token ids (OpenAI's "array of tokens"); a batch of prompts stays unsupported.
    for (size_t i = 0; i < p->size(); ++i) {
      const json& v = (*p)[i];
      if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        bad(hearth::cat("prompt[", i, "]"),
            hearth::cat("Invalid 'prompt[", i, "]': token id ", v.dump(), " is outside the vocabulary."));
      if (!v.is_number_integer() || v.get<int64_t>() < 0)
        bad(hearth::cat("prompt[", i, "]"),
            hearth::cat("Invalid 'prompt[", i, "]': expected a non-negative integer token id, got ", v.dump(), "."));
      req.prompt_ids.push_back(v.get<int64_t>());
    }
  } else {
    if (!p->is_string())
      bad_type("prompt", *p, "a string or an array of token ids (arrays of several prompts are not supported: send one "
                             "request per prompt)");
    req.prompt = p->get<std::string>();
    if (req.prompt.empty()) bad("prompt", "Invalid 'prompt': empty string.");
  }
  parse_common(body, req);
  if (auto k = integer_in(body, "logprobs", 0, 5)) {
    req.logprobs = true;
    req.top_logprobs = static_cast<int>(*k);
  }
  // Chat's field on the legacy route: refused rather than silently ignored (the alternatives'
  // count is `logprobs` here). null counts as absent.
  if (field(body, "top_logprobs"))
    bad("top_logprobs", "Invalid 'top_logprobs': /v1/completions takes the number of alternatives as 'logprobs' (0-5); "
                        "top_logprobs belongs to /v1/chat/completions.");
  if (boolean(body, "echo").value_or(false)) bad("echo", "Invalid 'echo': echo is not supported by this server.");
  // Insertion (text after the completion) needs a fill-in-the-middle prompt format: refused as vLLM
  // does ("suffix is not currently supported"), never silently ignored. null counts as absent.
  if (field(body, "suffix"))
    bad("suffix", "Invalid 'suffix': suffix is not currently supported by this server (send null or leave it out).");
  if (auto b = integer_in(body, "best_of", 1, kMaxTokensLimit); b && *b != 1)
    bad("best_of", "Invalid 'best_of': only best_of = 1 is supported by this server.");
  return req;
}

}  // namespace hearth::server
