// `hearth chat`: an interactive terminal chat over one model (mlx_lm.chat): multi-turn history
// through the chat template, streamed replies, /reset and /exit, EOF exits.
// Not the web chat (that is `hearth serve`'s page) and not a tool-calling agent.
#include <c10/core/GradMode.h>
#include <unistd.h>

#include <iostream>
#include <limits>

#include "cli/number_option.h"
#include "cli/threads_option.h"
#include "cli/verb.h"
#include "core/error.h"
#include "server/api_error.h"
#include "server/model_engine.h"

namespace {

// A request error in the terminal's words: the engine's messages speak of the HTTP request's
// fields ("Invalid 'messages': ..."), which a chat session has none of.
std::string terminal_words(const hearth::server::ApiError& e) {
  std::string m = e.what();
  const std::string field = "Invalid 'messages': ", them = "could not render them: ";
  if (m.rfind(field, 0) == 0) m = m.substr(field.size());
  if (const size_t at = m.find(them); at != std::string::npos) m.replace(at, them.size(), "could not render the conversation: ");
  return m;
}

struct ChatArgs {
  std::string model, adapter_path, system, device, dtype;
  int64_t max_tokens = 256;
  double temp = 0.0;
  double top_p = 0.0;
  int64_t seed = 0;
};

int run_chat(const ChatArgs& a) {
  using namespace hearth;
  c10::NoGradGuard no_grad;
  server::ModelEngineOptions eo;
  eo.model_dir = a.model;
  eo.device = a.device;
  eo.dtype = a.dtype;
  if (!a.adapter_path.empty()) server::use_adapter_path(eo, a.adapter_path, "cli");
  server::ModelEngine engine(std::move(eo));
  HEARTH_CHECK_T(InvalidArgument, engine.has_chat_template(), "chat: model '", engine.model_id(),
                 "' has no chat template (add chat_template.jinja, or use `hearth generate --ignore-chat-template`)");
  const bool tty = isatty(STDIN_FILENO);
  std::vector<server::ChatMessage> history;
  auto reset = [&] {
    history.clear();
    if (!a.system.empty()) history.push_back(server::ChatMessage{"system", a.system, "", "", {}});
  };
  reset();
  if (!a.system.empty()) {  // a template that refuses a system turn (Gemma 2's) would fail every turn
    server::CompletionRequest probe;
    probe.messages = history;
    probe.messages.push_back(server::ChatMessage{"user", "hi", "", "", {}});
    try {
      engine.prepare(probe);
    } catch (const server::ApiError& e) {
      throw InvalidArgument(cat("--system: ", terminal_words(e)));
    }
  }
  if (tty) std::cout << "[hearth chat: " << engine.model_id() << "; /reset clears the history, /exit or Ctrl-D quits]\n";
  std::string line;
  for (;;) {
    if (tty) std::cout << ">> " << std::flush;
    if (!std::getline(std::cin, line)) break;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      reset();
      if (tty) std::cout << "[history cleared]\n";
      continue;
    }
    if (line.empty()) continue;
    history.push_back(server::ChatMessage{"user", line, "", "", {}});
    server::CompletionRequest req;
    req.messages = history;
    req.max_tokens = a.max_tokens;
    req.sampling.temperature = a.temp;
    req.sampling.top_p = a.top_p;
    req.sampling.seed = static_cast<uint64_t>(a.seed) + history.size();  // wraps, never overflows
    std::string reply;
    try {
      server::Prompt prompt = engine.prepare(req);
      HEARTH_CHECK_T(InvalidArgument, static_cast<int64_t>(prompt.ids.size()) < engine.context_length(),
                     "the conversation (", prompt.ids.size(), " tokens) no longer fits the context length ",
                     engine.context_length(),
                     history.size() > 1u + !a.system.empty() ? "; /reset to start over" : "; write a shorter message");
      engine.generate(prompt, req, [&](const server::TokenEvent& ev) {
        reply += ev.text;
        std::cout << ev.text << std::flush;
        return true;
      });
      std::cout << std::endl;
      history.push_back(server::ChatMessage{"assistant", reply, "", "", {}});
    } catch (const Error& e) {
      history.pop_back();
      std::cerr << "hearth chat: " << e.what() << std::endl;
    } catch (const server::ApiError& e) {  // the template refused this turn: the session goes on
      history.pop_back();
      std::cerr << "hearth chat: " << terminal_words(e) << std::endl;
    }
  }
  return 0;
}

std::function<int()> setup_chat(CLI::App& app) {
  auto a = std::make_shared<ChatArgs>();
  app.add_option("--model", a->model, "Model folder (with a chat template)")->required();
  app.add_option("--adapter-path,--adapter", a->adapter_path, "LoRA adapter (mlx-lm or PEFT layout) or full fine-tune folder to apply");
  app.add_option("--system", a->system, "System message at the start of every conversation");
  app.add_option("--max-tokens", a->max_tokens, "Maximum tokens per reply (default 256)")
      ->check(hearth::cli::number_in<int64_t>(1, std::numeric_limits<int32_t>::max()));
  app.add_option("--temp", a->temp, "Sampling temperature (default 0 = greedy)");
  app.add_option("--top-p", a->top_p, "Nucleus sampling threshold (0 = off)");
  app.add_option("--seed", a->seed, "Sampling seed (default 0)")->check(hearth::cli::seed_number());
  app.add_option("--device", a->device, "cpu | cuda (default: cuda when available)");
  hearth::cli::add_threads_option(app);
  app.add_option("--dtype", a->dtype, "float32 | bfloat16 | float16 (default: the checkpoint's torch_dtype on cuda, float32 on cpu)");
  return [a] { return run_chat(*a); };
}

}  // namespace
HEARTH_REGISTER_VERB(chat, "chat", "Chat with a model in the terminal", setup_chat);
