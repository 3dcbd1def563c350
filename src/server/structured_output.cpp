// response_format / forced tool-call parsing into grammars, and the constraint factory with its
// caches (one vocabulary trie per tokenizer, an LRU of automata keyed by grammar text). Not the
// grammar code (src/grammar/) and not the sampler that applies the constraint.
#include "server/structured_output.h"

#include <list>
#include <mutex>

#include "core/error.h"
#include "grammar/json_schema.h"
#include "grammar/token_constraint.h"
#include "server/api_error.h"
#include "tokenizer/tokenizer.h"

namespace hearth::server {
namespace {

using json = nlohmann::ordered_json;

[[noreturn]] void bad_format(const std::string& msg) { throw ApiError(400, msg, "response_format", "invalid_value"); }

// The vocabulary of a tokenizer, built once. Keyed by the tokenizer's address and checked against
// a fingerprint (size, EOS ids, a sample of token strings), so a tokenizer destroyed and another
// built at the same address is not mistaken for it.
struct VocabEntry {
  const tokenizer::Tokenizer* tok;
  std::string fingerprint;
  std::shared_ptr<const grammar::Vocabulary> vocab;
};

std::string fingerprint(const tokenizer::Tokenizer& tok, const std::vector<int64_t>& eos) {
  std::string f = std::to_string(tok.vocab_size()) + "|";
  for (int64_t e : eos) f += std::to_string(e) + ",";
  const int32_t n = tok.vocab_size();
  for (int32_t k = 0; k < 64 && n > 0; ++k) f += "|" + tok.id_to_token(static_cast<int32_t>((int64_t{n} * k) / 64));
  return f;
}

std::shared_ptr<const grammar::Vocabulary> vocabulary_for(const tokenizer::Tokenizer& tok, const std::vector<int64_t>& eos) {
  static std::mutex mu;
  static std::list<VocabEntry> entries;  // most recent first, at most 4
  const std::string fp = fingerprint(tok, eos);
  std::lock_guard<std::mutex> lock(mu);
  for (auto it = entries.begin(); it != entries.end(); ++it)
    if (it->tok == &tok && it->fingerprint == fp) {
      entries.splice(entries.begin(), entries, it);
      return entries.front().vocab;
    }
  entries.push_front(VocabEntry{&tok, fp, grammar::Vocabulary::from_tokenizer(tok, eos)});
  if (entries.size() > 4) entries.pop_back();
  return entries.front().vocab;
}

// Automata shared by requests with the same grammar text over the same vocabulary; an automaton
// that grew large is not kept (its memory goes with its last request).
std::shared_ptr<grammar::TokenAutomaton> automaton_for(const std::shared_ptr<const grammar::Grammar>& g,
                                                       const std::shared_ptr<const grammar::Vocabulary>& vocab) {
  constexpr size_t kEntries = 16;
  constexpr size_t kMaxSharedStates = 100000;
  static std::mutex mu;
  static std::list<std::pair<std::pair<const grammar::Vocabulary*, std::string>, std::shared_ptr<grammar::TokenAutomaton>>> lru;
  if (g->key.empty()) return std::make_shared<grammar::TokenAutomaton>(g, vocab);
  const auto key = std::make_pair(vocab.get(), g->key);
  std::lock_guard<std::mutex> lock(mu);
  for (auto it = lru.begin(); it != lru.end(); ++it)
    if (it->first == key) {
      if (it->second->num_states() > kMaxSharedStates) {
        lru.erase(it);
        break;
      }
      lru.splice(lru.begin(), lru, it);
      return lru.front().second;
    }
  lru.emplace_front(key, std::make_shared<grammar::TokenAutomaton>(g, vocab));
  if (lru.size() > kEntries) lru.pop_back();
  return lru.front().second;
}

}  // namespace

void parse_response_format(const nlohmann::ordered_json& body, CompletionRequest& req) {
  auto it = body.find("response_format");
  if (it == body.end() || it->is_null()) return;
  const json& rf = *it;
  if (!rf.is_object()) bad_format("Invalid type for 'response_format': expected an object.");
  auto t = rf.find("type");
  if (t == rf.end() || !t->is_string())
    bad_format("Invalid 'response_format': 'type' must be one of 'text', 'json_object', 'json_schema'.");
  const std::string type = t->get<std::string>();
  if (type == "text") return;
  try {
    if (type == "json_object") {
      req.response_grammar = grammar::json_object_grammar();
    } else if (type == "json_schema") {
      auto js = rf.find("json_schema");
      if (js == rf.end() || !js->is_object())
        bad_format("Missing required parameter: 'response_format.json_schema' (an object with 'name' and 'schema').");
      auto name = js->find("name");
      if (name != js->end() && !name->is_string()) bad_format("Invalid 'response_format.json_schema.name': expected a string.");
      auto strict = js->find("strict");
      if (strict != js->end() && !strict->is_null() && !strict->is_boolean())
        bad_format("Invalid 'response_format.json_schema.strict': expected a boolean.");
      auto schema = js->find("schema");
      // OpenAI: the schema is optional; without one any JSON value is accepted.
      const json s = schema == js->end() || schema->is_null() ? json::object() : *schema;
      req.response_grammar = grammar::compile_json_schema(s);
    } else {
      bad_format("Invalid 'response_format.type': '" + type +
                 "'. Supported values are: 'text', 'json_object', and 'json_schema'.");
    }
  } catch (const InvalidArgument& e) {
    bad_format(std::string("Invalid 'response_format.json_schema.schema': ") + e.what() + ".");
  }
  req.response_format = type;
}

std::shared_ptr<const grammar::Grammar> tool_call_grammar(const CompletionRequest& req, chat::ToolCallFormat format) {
  if (req.tools.empty() && (req.tool_choice == "required" || req.tool_choice == "function"))
    throw ApiError(400, "Invalid 'tool_choice': it forces a tool call, but the request gives no 'tools'.", "tool_choice",
                   "invalid_value");
  if (!req.forces_tool_call()) return nullptr;
  std::string prefix, suffix, args_key;
  switch (format) {
    case chat::ToolCallFormat::Hermes:
    case chat::ToolCallFormat::None:
      prefix = "<tool_call>", suffix = "</tool_call>", args_key = "arguments";
      break;
    case chat::ToolCallFormat::Llama3Json: args_key = "parameters"; break;
    default:
      throw ApiError(400,
                     "Invalid 'tool_choice': forcing a tool call ('required' or a named function) is supported for the "
                     "Hermes/Qwen JSON and Llama-3 JSON tool-call formats only; this model writes another format "
                     "(use tool_choice 'auto').",
                     "tool_choice", "invalid_value");
  }
  std::vector<grammar::ToolSchema> tools;
  for (const auto& t : req.tools) {
    const json& fn = t.at("function");
    const std::string name = fn.at("name").get<std::string>();
    if (req.tool_choice == "function" && name != req.tool_choice_name) continue;
    auto params = fn.find("parameters");
    tools.push_back(grammar::ToolSchema{name, params == fn.end() ? json() : *params});
  }
  if (tools.empty())
    throw ApiError(400, "Invalid 'tool_choice': function '" + req.tool_choice_name + "' is not in 'tools'.", "tool_choice",
                   "invalid_value");
  try {
    return grammar::tool_call_grammar(tools, prefix, suffix, args_key);
  } catch (const InvalidArgument& e) {
    throw ApiError(400, std::string("Invalid 'tools' for a forced tool call: ") + e.what() + ".", "tools", "invalid_value");
  }
}

void check_structured_output(const CompletionRequest& req, chat::ToolCallFormat format) {
  (void)tool_call_grammar(req, format);
}

std::shared_ptr<generate::TokenConstraint> make_constraint(const CompletionRequest& req, const tokenizer::Tokenizer& tok,
                                                           const std::vector<int64_t>& eos_ids,
                                                           chat::ToolCallFormat format) {
  std::shared_ptr<const grammar::Grammar> g = tool_call_grammar(req, format);
  if (!g) g = req.response_grammar;
  if (!g) return nullptr;
  auto vocab = vocabulary_for(tok, eos_ids);
  return std::make_shared<grammar::GrammarConstraint>(automaton_for(g, vocab));
}

}  // namespace hearth::server
