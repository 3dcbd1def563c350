// `hearth generate`: load a model folder, build the prompt (the chat template by default when the
// tokenizer has one, as mlx_lm.generate does), stream the continuation to stdout and print
// mlx_lm-style stats to stderr. Not a server (see `serve`) nor an interactive chat (`chat`).
#include <c10/core/GradMode.h>

#include <fcntl.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <limits>
#include <iterator>

#include "cli/number_option.h"
#include "cli/threads_option.h"
#include "cli/verb.h"
#include "core/error.h"
#include "server/model_engine.h"

namespace {

struct GenerateArgs {
  std::string model, prompt, system, device, dtype, adapter_path;
  bool ignore_chat_template = false;
  int64_t max_tokens = 256;
  hearth::generate::SamplingParams sampling;
};

std::function<int()> setup_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  app.add_option("--model", a->model, "Model folder (config.json, *.safetensors, tokenizer.json)")->required();
  app.add_option("--prompt", a->prompt, "Prompt text ('-' reads stdin)")->required();
  app.add_option("--system", a->system, "System message (needs the chat template; an error without one)");
  app.add_flag("--ignore-chat-template", a->ignore_chat_template, "Send the prompt as raw text, without the chat template");
  app.add_option("--max-tokens", a->max_tokens, "Maximum tokens to generate (default 256)")
      ->check(hearth::cli::number_in<int64_t>(1, std::numeric_limits<int32_t>::max()));
  app.add_option("--temp", a->sampling.temperature, "Sampling temperature (default 0 = greedy)");
  app.add_option("--top-p", a->sampling.top_p, "Nucleus sampling threshold (0 = off)");
  app.add_option("--top-k", a->sampling.top_k, "Keep the k most likely tokens (0 = off)");
  app.add_option("--min-p", a->sampling.min_p, "Keep tokens with p >= min_p * p_max (0 = off)");
  app.add_option("--repetition-penalty", a->sampling.repetition_penalty, "Penalty for the last 20 tokens (off)");
  app.add_option("--presence-penalty", a->sampling.presence_penalty, "Subtract from tokens seen in the last 20 (off)");
  app.add_option("--frequency-penalty", a->sampling.frequency_penalty, "Subtract per occurrence in the last 20 (off)");
  app.add_option("--seed", a->sampling.seed, "Sampling seed (default 0)")->check(hearth::cli::seed_number());
  app.add_option("--device", a->device, "cpu | cuda (default: cuda when available)");
  hearth::cli::add_threads_option(app);
  app.add_option("--dtype", a->dtype, "float32 | bfloat16 | float16 (default: the checkpoint's torch_dtype on cuda, float32 on cpu)");
  app.add_option("--adapter-path,--adapter", a->adapter_path, "LoRA adapter (mlx-lm or PEFT layout) or full fine-tune folder to apply");
  return [a] {
    using namespace hearth;
    c10::NoGradGuard no_grad;
    if (a->prompt == "-") {  // the prompt from stdin: a closed or unreadable stdin is an error, not an empty prompt
      HEARTH_CHECK(::fcntl(0, F_GETFD) != -1, "--prompt -: cannot read the prompt from stdin (", std::strerror(errno), ")");
      a->prompt.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
      HEARTH_CHECK(!std::cin.bad(), "--prompt -: reading the prompt from stdin failed");
      HEARTH_CHECK(!a->prompt.empty(), "--prompt -: stdin held no text (pipe the prompt in, or pass it as --prompt TEXT)");
    }
    server::ModelEngineOptions eo;
    eo.model_dir = a->model;
    eo.device = a->device;
    eo.dtype = a->dtype;
    if (!a->adapter_path.empty()) server::use_adapter_path(eo, a->adapter_path, "cli");
    server::ModelEngine engine(std::move(eo));

    server::CompletionRequest req;
    req.chat = engine.has_chat_template() && !a->ignore_chat_template;
    // A system message only exists inside a chat template: refuse rather than drop it silently.
    HEARTH_CHECK_T(InvalidArgument, a->system.empty() || req.chat, "--system: ",
                   a->ignore_chat_template ? "--ignore-chat-template sends the raw prompt, which has no system message"
                                           : "model '" + engine.model_id() +
                                                 "' has no chat template (tokenizer_config.json chat_template or "
                                                 "chat_template.jinja), so there is no system message",
                   "; put the text in --prompt instead");
    if (req.chat) {
      if (!a->system.empty()) req.messages.push_back(server::ChatMessage{"system", a->system, "", "", {}});
      req.messages.push_back(server::ChatMessage{"user", a->prompt, "", "", {}});
    } else {
      req.prompt = a->prompt;
    }
    const auto& s = a->sampling;
    req.sampling.temperature = s.temperature;
    req.sampling.top_p = s.top_p;
    req.sampling.top_k = s.top_k;
    req.sampling.min_p = s.min_p;
    req.sampling.repetition_penalty = s.repetition_penalty;
    req.sampling.presence_penalty = s.presence_penalty;
    req.sampling.frequency_penalty = s.frequency_penalty;
    req.sampling.seed = static_cast<int64_t>(s.seed);
    req.max_tokens = a->max_tokens;
    server::Prompt prompt = engine.prepare(req);
    HEARTH_CHECK_T(InvalidArgument, static_cast<int64_t>(prompt.ids.size()) < engine.context_length(), "--prompt: ",
                   prompt.ids.size(), " tokens do not fit the context length ", engine.context_length());
    // A stdout that fails (a full disk, a closed pipe with SIGPIPE ignored) stops the generation:
    // the rest would be lost, and the run is an error, not a success with nothing written.
    int write_errno = 0;
    const auto wrote = [&] {
      if (std::cout) return true;
      write_errno = errno != 0 ? errno : EIO;
      return false;
    };
    errno = 0;
    const server::Finish finish = engine.generate(prompt, req, [&](const server::TokenEvent& ev) {
      std::cout << ev.text << std::flush;
      return wrote();
    });
    if (write_errno == 0) {
      std::cout << std::endl;
      wrote();
    }
    HEARTH_CHECK(write_errno == 0, "stdout: writing the generated text failed (", std::strerror(write_errno),
                 "); generation stopped");
    const auto& st = engine.last_stats();
    std::cerr << "==========\n"
              << "Prompt: " << st.prompt_tokens << " tokens, " << st.prompt_tps << " tokens-per-sec\n"
              << "Generation: " << st.generation_tokens << " tokens, " << st.generation_tps << " tokens-per-sec\n"
              << "Time to first token: " << st.ttft_s * 1e3 << " ms\n"
              << "Peak memory: " << st.peak_memory_bytes / 1e9 << " GB\n";
    if (finish.reason == server::Finish::Reason::kLength && finish.completion_tokens < a->max_tokens)
      std::cerr << "Stopped at the model's context length (" << engine.context_length() << " tokens): "
                << prompt.ids.size() << " prompt tokens + " << finish.completion_tokens
                << " generated, before --max-tokens " << a->max_tokens << ".\n";
    return 0;
  };
}

}  // namespace
HEARTH_REGISTER_VERB(generate, "generate", "Generate text from a prompt", setup_generate);
