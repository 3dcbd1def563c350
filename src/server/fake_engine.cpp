// FakeEngine: scripted, deterministic token streams for exercising the server.
// Not a model: ignores sampling options (it records them for tests instead).
#include "server/fake_engine.h"

#include <sstream>
#include <thread>

#include "core/error.h"

namespace hearth::server {
namespace {

std::vector<std::string> words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// Splits UTF-8 text into pieces of `n` characters.
std::vector<std::string> utf8_chunks(const std::string& s, size_t n) {
  std::vector<std::string> out;
  std::string cur;
  size_t chars = 0;
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    cur.append(s, i, len);
    i += len;
    if (++chars == n) {
      out.push_back(std::move(cur));
      cur.clear();
      chars = 0;
    }
  }
  if (!cur.empty()) out.push_back(std::move(cur));
  return out;
}

}  // namespace

FakeEngine::FakeEngine(FakeEngineOptions opts) : opts_(std::move(opts)), delay_ms_(opts_.token_delay_ms) {}

Prompt FakeEngine::prepare(const CompletionRequest& req) {
  ++prepares_;
  if (req.adapter && *req.adapter != "none")
    throw InvalidArgument("adapter: unknown adapter \"" + *req.adapter + "\" (none are mounted)");
  Prompt p;
  if (req.chat) {
    for (const auto& m : req.messages) {
      p.text += m.role + ": " + m.content.value_or("");
      for (const auto& tc : m.tool_calls) p.text += " call " + tc.name + " " + tc.arguments_json;
      p.text += "\n";
    }
    if (req.tools_active()) p.text += "tools: " + std::to_string(req.tools.size()) + "\n";
    p.text += "assistant:";
  } else if (!req.prompt_ids.empty()) {
    p.ids = req.prompt_ids;  // the fake engine's "text" of ids: their decimal forms
    for (int64_t id : req.prompt_ids) p.text += (p.text.empty() ? "" : " ") + std::to_string(id);
    return p;
  } else {
    p.text = req.prompt;
  }
  if (p.text.find("__slow_prepare__") != std::string::npos) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  if (p.text.find("__bad_prompt__") != std::string::npos)
    throw InvalidArgument("prompt: contains __bad_prompt__ (the fake engine refuses it)");
  if (req.chat && opts_.reasoning != chat::ReasoningFormat::None) {
    auto t = req.chat_template_kwargs.find("enable_thinking");
    p.reasoning_open = t != req.chat_template_kwargs.end() && t->is_boolean() && t->get<bool>();
  }
  auto ws = words(p.text);
  for (size_t i = 0; i < ws.size(); ++i) p.ids.push_back(static_cast<int64_t>(std::hash<std::string>{}(ws[i]) % 32000));
  return p;
}

std::vector<std::string> FakeEngine::script(const CompletionRequest& req) {
  std::string src;
  if (req.chat) {
    const ChatMessage& last = req.messages.back();
    if (last.role == "tool") return utf8_chunks("Tool result: " + last.content.value_or(""), 3);
    src = last.content.value_or("");
  } else {
    src = req.prompt;
  }
  if (src.rfind("emit:", 0) == 0) return utf8_chunks(src.substr(5), 3);
  std::vector<std::string> out;
  for (const auto& w : words(src)) out.push_back(out.empty() ? w : " " + w);
  return out;
}

Finish FakeEngine::generate(const Prompt& prompt, const CompletionRequest& req, const TokenCallback& on_token) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_ = req;
  }
  busy_ = true;
  ++generations_;
  const auto pieces = script(req);
  const int64_t limit = req.max_tokens.value_or(opts_.context_length);
  Finish f;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (static_cast<int64_t>(i) >= limit) {
      f.reason = Finish::Reason::kLength;
      busy_ = false;
      return f;
    }
    if (int d = delay_ms_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(d));
    TokenEvent ev;
    ev.id = static_cast<int64_t>(1000 + i);
    ev.text = pieces[i];
    ev.token = pieces[i];
    if (req.logprobs) {
      ev.logprob = -0.5f * static_cast<float>(i % 4 + 1);
      for (int k = 0; k < req.top_logprobs; ++k) {
        if (k == 0) ev.top_logprobs.push_back({ev.id, ev.token, ev.logprob, {}});
        else ev.top_logprobs.push_back({k, "alt" + std::to_string(k), ev.logprob - static_cast<float>(k), {}});
      }
    }
    ++f.completion_tokens;
    ++tokens_;
    if (i == 1 && prompt.text.find("__fail_generate__") != std::string::npos) {
      busy_ = false;
      throw std::runtime_error("fake engine: generation failed on purpose");
    }
    if (!on_token(ev)) {
      ++stopped_early_;
      f.reason = Finish::Reason::kStopped;
      busy_ = false;
      return f;
    }
  }
  if (static_cast<int64_t>(pieces.size()) >= limit && limit == static_cast<int64_t>(pieces.size())) {
    // Exactly at the limit: a real model would have hit the limit before sampling EOS.
    f.reason = Finish::Reason::kLength;
  } else {
    ++f.completion_tokens;  // EOS
    f.reason = Finish::Reason::kEos;
  }
  busy_ = false;
  return f;
}

std::unique_ptr<chat::ReasoningSplitter> FakeEngine::reasoning_splitter(const CompletionRequest& req,
                                                                        const Prompt& prompt) const {
  if (!req.chat || req.output_constrained() || opts_.reasoning == chat::ReasoningFormat::None) return nullptr;
  std::vector<std::string> ends;
  if (req.tools_active()) ends.emplace_back("<tool_call>");
  return std::make_unique<chat::ReasoningSplitter>(opts_.reasoning, output_starts_in_reasoning(req, prompt),
                                                      std::move(ends));
}

CompletionRequest FakeEngine::last_request() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_;
}

}  // namespace hearth::server
