// OpenAI response shapes (chat and legacy completions), built from native StreamEvents.
// Follows platform.openai.com's API reference for field names and order.
#include "server/openai_format.h"

#include <algorithm>
#include <mutex>

#include "server/api_error.h"
#include <random>

namespace hearth::server {
namespace {

// OpenAI `bytes`: the raw bytes (`bytes`, or the token text's own when none were given).
ojson bytes_of(const std::string& token, const std::string& bytes) {
  ojson b = ojson::array();
  for (unsigned char c : bytes.empty() ? token : bytes) b.push_back(static_cast<int>(c));
  return b;
}

// A logprob as the wire carries it: -inf (a token a grammar or logit_bias rules out) would dump as
// JSON null where OpenAI's schema has a number, so it is clamped to -9999 (vLLM's floor).
double wire_logprob(float v) { return std::max(static_cast<double>(v), -9999.0); }

// Chat logprobs entries: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}].
ojson chat_logprobs(const std::vector<TokenEvent>& toks) {
  ojson content = ojson::array();
  for (const auto& t : toks) {
    ojson top = ojson::array();
    for (const auto& a : t.top_logprobs)
      top.push_back(ojson{{"token", a.token}, {"logprob", wire_logprob(a.logprob)}, {"bytes", bytes_of(a.token, a.bytes)}});
    content.push_back(ojson{{"token", t.token}, {"logprob", wire_logprob(t.logprob)}, {"bytes", bytes_of(t.token, t.bytes)},
                            {"top_logprobs", top}});
  }
  return ojson{{"content", content}};
}

// Characters (code points) a token adds to the text: the UTF-8 lead bytes of its raw bytes, so a
// character split over two tokens counts once, at the token where it begins.
int64_t chars_added(const TokenEvent& t) {
  int64_t n = 0;
  for (unsigned char c : t.bytes.empty() ? t.token : t.bytes) n += (c & 0xC0) != 0x80;
  return n;
}

// Legacy completions logprobs: {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}.
// text_offset: each token's character offset in the choice's text (OpenAI, vLLM), counted from
// `*offset` (the characters of the tokens before these), which is advanced past them.
ojson legacy_logprobs(const std::vector<TokenEvent>& toks, int64_t* offset) {
  ojson tokens = ojson::array(), lps = ojson::array(), tops = ojson::array(), offs = ojson::array();
  for (const auto& t : toks) {
    tokens.push_back(t.token);
    lps.push_back(wire_logprob(t.logprob));
    // A map by text: of two tokens that print alike (e.g. "u" and a byte-level "u") the more likely
    // one, listed first, keeps its value (so the map can hold fewer entries than were asked).
    ojson top = ojson::object();
    for (const auto& a : t.top_logprobs)
      if (!top.contains(a.token)) top[a.token] = wire_logprob(a.logprob);
    tops.push_back(top);
    offs.push_back(*offset);
    *offset += chars_added(t);
  }
  return ojson{{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

ojson tool_calls_json(const std::vector<ToolCall>& calls, bool with_index) {
  ojson arr = ojson::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    ojson c = ojson::object();
    if (with_index) c["index"] = i;
    c["id"] = calls[i].id;
    c["type"] = "function";
    c["function"] = ojson{{"name", calls[i].name}, {"arguments", calls[i].arguments_json}};
    arr.push_back(c);
  }
  return arr;
}

ojson chunk(const ResponseMeta& m, ojson choice) {
  ojson j{{"id", m.id},
          {"object", m.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", m.created},
          {"model", m.model},
          {"choices", ojson::array({std::move(choice)})}};
  if (m.include_usage) j["usage"] = nullptr;
  return j;
}

ojson chat_choice(int index, ojson delta, const ojson& logprobs, const ojson& finish) {
  return ojson{{"index", index}, {"delta", std::move(delta)}, {"logprobs", logprobs}, {"finish_reason", finish}};
}

ojson text_choice(int index, const std::string& text, const ojson& logprobs, const ojson& finish) {
  return ojson{{"index", index}, {"text", text}, {"logprobs", logprobs}, {"finish_reason", finish}};
}

}  // namespace

std::string new_response_id(bool chat) {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mu);
  static const char* hex = "0123456789abcdef";
  std::string id = chat ? "chatcmpl-" : "cmpl-";
  for (int i = 0; i < 24; ++i) id.push_back(hex[rng() & 15]);
  return id;
}

std::string dump_json(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

std::string sse(const ojson& j) { return "data: " + dump_json(j) + "\n\n"; }

ojson usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens) {
  return ojson{{"prompt_tokens", prompt_tokens},
               {"completion_tokens", completion_tokens},
               {"total_tokens", prompt_tokens + completion_tokens},
               {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

ojson first_chunk(const ResponseMeta& m, int choice) {
  if (!m.chat) return nullptr;
  return chunk(m, chat_choice(choice, ojson{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr));
}

ojson delta_chunk(const ResponseMeta& m, const StreamEvent& d, int64_t* text_offset) {
  if (m.chat) {
    ojson lp = m.logprobs && !d.logprobs.empty() ? chat_logprobs(d.logprobs) : ojson();
    ojson delta = d.reasoning.empty() ? ojson{{"content", d.text}} : ojson{{"reasoning_content", d.reasoning}};
    if (!d.reasoning.empty() && !d.text.empty()) delta["content"] = d.text;
    return chunk(m, chat_choice(d.choice, std::move(delta), lp, nullptr));
  }
  int64_t from_zero = 0;
  ojson lp = m.logprobs && !d.logprobs.empty() ? legacy_logprobs(d.logprobs, text_offset ? text_offset : &from_zero) : ojson();
  return chunk(m, text_choice(d.choice, d.text, lp, nullptr));
}

std::vector<ojson> final_chunks(const ResponseMeta& m, const StreamEvent& done) {
  std::vector<ojson> out;
  if (m.chat) {
    if (!done.tool_calls.empty())
      out.push_back(
          chunk(m, chat_choice(done.choice, ojson{{"tool_calls", tool_calls_json(done.tool_calls, true)}}, nullptr, nullptr)));
    out.push_back(chunk(m, chat_choice(done.choice, ojson::object(), nullptr, done.finish_reason)));
  } else {
    out.push_back(chunk(m, text_choice(done.choice, "", nullptr, done.finish_reason)));
  }
  return out;
}

ojson usage_chunk(const ResponseMeta& m, int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens) {
  ojson u = chunk(m, nullptr);
  u["choices"] = ojson::array();
  u["usage"] = usage_json(prompt_tokens, completion_tokens, cached_tokens);
  return u;
}

ojson full_response(const ResponseMeta& m, const std::vector<StreamEvent>& deltas, const std::vector<StreamEvent>& dones) {
  ojson choices = ojson::array();
  int64_t completion = 0, prompt = 0, cached = 0;
  std::vector<const StreamEvent*> order;
  for (const auto& d : dones) order.push_back(&d);
  std::stable_sort(order.begin(), order.end(), [](const StreamEvent* a, const StreamEvent* b) { return a->choice < b->choice; });
  for (const StreamEvent* done : order) {
    std::string text, reasoning;
    std::vector<TokenEvent> toks;
    for (const auto& d : deltas) {
      if (d.choice != done->choice) continue;
      text += d.text;
      reasoning += d.reasoning;
      toks.insert(toks.end(), d.logprobs.begin(), d.logprobs.end());
    }
    if (m.chat) {
      ojson msg{{"role", "assistant"}, {"content", text}};
      if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
      if (!done->tool_calls.empty()) {
        if (text.empty()) msg["content"] = nullptr;
        msg["tool_calls"] = tool_calls_json(done->tool_calls, false);
      }
      choices.push_back(ojson{{"index", done->choice}, {"message", msg}, {"logprobs", m.logprobs ? chat_logprobs(toks) : ojson()},
                              {"finish_reason", done->finish_reason}});
    } else {
      int64_t offset = 0;
      choices.push_back(text_choice(done->choice, text, m.logprobs ? legacy_logprobs(toks, &offset) : ojson(), done->finish_reason));
    }
    // The prompt is counted once (the choices share it), the completions summed (OpenAI, vLLM).
    completion += done->completion_tokens;
    prompt = done->prompt_tokens;
    cached = std::max(cached, done->cached_tokens);
  }
  return ojson{{"id", m.id},
               {"object", m.chat ? "chat.completion" : "text_completion"},
               {"created", m.created},
               {"model", m.model},
               {"choices", std::move(choices)},
               {"usage", usage_json(prompt, completion, cached)}};
}

std::string OpenAiWriter::full(const std::vector<StreamEvent>& deltas, const StreamEvent& done) {
  return dump_json(full_response(m_, deltas, {done}));
}

std::string OpenAiWriter::full_choices(const std::vector<StreamEvent>& deltas, const std::vector<StreamEvent>& dones) {
  return dump_json(full_response(m_, deltas, dones));
}

std::string OpenAiWriter::begin(const StreamEvent&) {
  std::string out;
  for (int i = 0; i < std::max(1, m_.n); ++i) {
    ojson f = first_chunk(m_, i);
    if (!f.is_null()) out += sse(f);
  }
  return out;
}

std::string OpenAiWriter::delta(const StreamEvent& d) {
  if (text_offsets_.size() <= static_cast<size_t>(d.choice)) text_offsets_.resize(static_cast<size_t>(d.choice) + 1, 0);
  return sse(delta_chunk(m_, d, &text_offsets_[static_cast<size_t>(d.choice)]));
}

std::string OpenAiWriter::end(const StreamEvent& done) {
  std::string out;
  for (const auto& c : final_chunks(m_, done)) out += sse(c);
  ++ended_;
  completion_tokens_ += done.completion_tokens;
  cached_tokens_ = std::max(cached_tokens_, done.cached_tokens);
  if (ended_ < std::max(1, m_.n)) return out;  // more choices to come
  if (m_.include_usage) out += sse(usage_chunk(m_, done.prompt_tokens, completion_tokens_, cached_tokens_));
  return out + "data: [DONE]\n\n";
}

std::string OpenAiWriter::error(const StreamEvent& e) { return sse(error_json(e.status, e.message, e.param, e.code)); }

}  // namespace hearth::server
