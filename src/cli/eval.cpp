// `hearth eval chunk`: scores a model (optionally with a LoRA adapter) on the chunking task —
// greedy generation per test row through the same engine and prompt path as `hearth serve`, the
// output parsed as a JSON array of sentences, score = 100 × mean sentence F1 (eval/chunk_task.h).
// Not a trainer's validation loss (`hearth train` reports that) nor a general benchmark harness.
#include <c10/core/GradMode.h>

#include <chrono>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "cli/threads_option.h"
#include "cli/verb.h"
#include "core/error.h"
#include "eval/chunk_task.h"
#include "io/atomic_file.h"
#include "server/model_engine.h"

namespace {
using namespace hearth;

struct EvalChunkArgs {
  std::string model, adapter_path, data, out, device, dtype;
  int64_t max_examples = 0;
  int64_t max_tokens = 1024;
  bool quiet = false;
};

/// Builds the request exactly as training formats a {"prompt", "completion"} row: a user turn
/// through the chat template when the model has one, else the raw prompt (train/dataset.h).
server::CompletionRequest make_request(const server::ModelEngine& engine, const std::string& prompt, int64_t max_tokens) {
  server::CompletionRequest req;
  req.chat = engine.has_chat_template();
  if (req.chat)
    req.messages.push_back(server::ChatMessage{"user", prompt, "", "", {}});
  else
    req.prompt = prompt;
  // Plain greedy decoding: no repetition penalty or truncation from generation_config.json.
  req.sampling.temperature = 0.0;
  req.sampling.top_p = 0.0;
  req.sampling.top_k = 0;
  req.sampling.min_p = 0.0;
  req.sampling.repetition_penalty = 1.0;  // 1 = off
  req.sampling.seed = 0;
  req.max_tokens = max_tokens;
  return req;
}

int run_eval_chunk(const EvalChunkArgs& a) {
  c10::NoGradGuard no_grad;
  HEARTH_CHECK_T(InvalidArgument, a.max_tokens > 0, "--max-tokens: must be positive, got ", a.max_tokens);
  HEARTH_CHECK_T(InvalidArgument, a.max_examples >= 0, "--max-examples: must be >= 0, got ", a.max_examples);
  const std::vector<eval::ChunkExample> examples = eval::load_chunk_examples(a.data, a.max_examples);

  server::ModelEngineOptions eo;
  eo.model_dir = a.model;
  eo.device = a.device;
  eo.dtype = a.dtype;
  if (!a.adapter_path.empty()) server::use_adapter_path(eo, a.adapter_path, "eval");
  server::ModelEngine engine(std::move(eo));

  // Per-example rows are collected and written atomically at the end (an interrupted run leaves
  // any earlier --out file as it was); --out may not be the data file itself.
  std::error_code ec;
  HEARTH_CHECK(a.out.empty() || !std::filesystem::equivalent(a.out, a.data, ec), "--out ", a.out,
               " is the --data file: it would be overwritten; pick another path");
  // Checked before the evaluation, not when its file is written at the end.
  if (!a.out.empty()) {
    const std::filesystem::path o(a.out);
    HEARTH_CHECK(!std::filesystem::is_directory(o, ec), "--out ", a.out, " is a folder; give the path of a file to write");
    const std::filesystem::path parent = o.parent_path();
    HEARTH_CHECK(parent.empty() || std::filesystem::is_directory(parent, ec), "--out ", a.out, ": its folder ",
                 parent.string(), " does not exist");
  }
  std::ostringstream out;
  const auto t0 = std::chrono::steady_clock::now();
  double f1_sum = 0;
  int64_t valid = 0, generated = 0, too_long = 0;
  for (size_t i = 0; i < examples.size(); ++i) {
    const auto& ex = examples[i];
    server::CompletionRequest req = make_request(engine, ex.prompt, a.max_tokens);
    server::Prompt prompt = engine.prepare(req);
    std::string text;
    const bool fits = static_cast<int64_t>(prompt.ids.size()) < engine.context_length();
    too_long += fits ? 0 : 1;  // no room to answer: scored 0, and counted in the summary
    if (fits) {
      engine.generate(prompt, req, [&](const server::TokenEvent& ev) {
        text += ev.text;
        return true;
      });
      generated += engine.last_stats().generation_tokens;
    }
    const eval::ChunkScore s = eval::score_chunk_output(text, ex.reference);
    f1_sum += s.f1;
    valid += s.valid_json ? 1 : 0;
    if (!a.out.empty()) {
      nlohmann::json row = {{"index", i},          {"f1", s.f1},     {"valid_json", s.valid_json},
                            {"prompt_tokens", prompt.ids.size()},   {"output", text},
                            {"reference", ex.reference}};
      out << row.dump() << "\n";
    }
    if (!a.quiet)
      std::cerr << "[" << i + 1 << "/" << examples.size() << "] f1 " << std::fixed << std::setprecision(3) << s.f1
                << (s.valid_json ? "" : fits ? " (invalid JSON)" : " (prompt fills the context: not answered)") << "\n";
  }
  if (!a.out.empty()) io::write_file_atomic(a.out, out.str());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double n = static_cast<double>(examples.size());
  std::cout << std::fixed << std::setprecision(2) << "chunk score: " << 100.0 * f1_sum / n << "/100 over "
            << examples.size() << " examples; valid JSON: " << 100.0 * valid / n << "% (" << valid << "/"
            << examples.size() << "); " << generated << " tokens generated in " << secs << " s";
  if (too_long > 0)
    std::cout << "; " << too_long << " prompt(s) filled the " << engine.context_length()
              << "-token context and scored 0 unanswered";
  std::cout << "\n";
  return 0;
}

std::function<int()> setup_eval(CLI::App& app) {
  auto a = std::make_shared<EvalChunkArgs>();
  app.require_subcommand(1);
  CLI::App* chunk = app.add_subcommand("chunk", "Score sentence chunking: JSON arrays of sentences, F1 per example");
  chunk->add_option("--model", a->model, "Model folder")->required();
  chunk->add_option("--adapter-path,--adapter", a->adapter_path, "LoRA adapter (mlx-lm or PEFT layout) or full fine-tune folder to apply");
  chunk->add_option("--data", a->data, "Test jsonl ({\"prompt\",\"completion\"} or {\"messages\"} rows)")->required();
  chunk->add_option("--max-examples", a->max_examples, "Score only the first N rows (default 0: all of them)");
  chunk->add_option("--max-tokens", a->max_tokens, "Generation limit per example (default 1024)");
  chunk->add_option("--out", a->out, "Write per-example results (jsonl)");
  chunk->add_option("--device", a->device, "cpu | cuda (default: cuda when available)");
  hearth::cli::add_threads_option(*chunk);
  chunk->add_option("--dtype", a->dtype, "float32 | bfloat16 | float16 (default: the checkpoint's torch_dtype on cuda, float32 on cpu)");
  chunk->add_flag("--quiet", a->quiet, "No per-example progress on stderr");
  return [a] { return run_eval_chunk(*a); };
}

}  // namespace
HEARTH_REGISTER_VERB(eval, "eval", "Evaluate a model on a task (chunk: sentence splitting as JSON)", setup_eval);
