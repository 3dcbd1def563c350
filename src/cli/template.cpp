// `hearth template`: renders a model's chat template for a messages file exactly as transformers'
// apply_chat_template(tokenize=False) would, and prints it with no trailing newline. Reads only
// tokenizer_config.json / chat_template.jinja / chat_template.json; not a tokenizer.
#include <filesystem>
#include <iostream>

#include "chat/chat_template.h"
#include "cli/verb.h"
#include "core/error.h"
#include "core/json_nesting.h"
#include "io/atomic_file.h"

namespace {
namespace fs = std::filesystem;
using nlohmann::ordered_json;

ordered_json read_json(const fs::path& p) {
  std::string text = hearth::io::read_file(p);  // a regular file, size-capped ("is a folder" named as such)
  hearth::check_json_nesting(text, p.string());
  ordered_json j = ordered_json::parse(text, nullptr, false);
  HEARTH_CHECK_T(hearth::InvalidArgument, !j.is_discarded(), p.string(), ": not valid JSON");
  return j;
}

// A special token given as "text" or as an AddedToken object {"content": "text", ...}.
std::string token_text(const ordered_json& cfg, const char* key, const fs::path& where) {
  if (!cfg.contains(key) || cfg[key].is_null()) return "";
  const auto& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  throw hearth::InvalidArgument(hearth::cat(where.string(), ": field ", key, " must be a string or {\"content\": ...}"));
}

// The template source: chat_template.jinja, else chat_template.json, else tokenizer_config.json's
// chat_template (a string, or a list of {name, template} from which "default" is taken).
std::string find_template(const fs::path& dir, const ordered_json& cfg, const fs::path& cfg_path) {
  if (fs::exists(dir / "chat_template.jinja")) return hearth::io::read_file(dir / "chat_template.jinja");
  ordered_json tmpl;
  fs::path from = cfg_path;
  if (fs::exists(dir / "chat_template.json")) {
    from = dir / "chat_template.json";
    ordered_json j = read_json(from);
    if (j.is_object() && j.contains("chat_template")) tmpl = j["chat_template"];
  }
  if (tmpl.is_null() && cfg.is_object() && cfg.contains("chat_template")) {
    tmpl = cfg["chat_template"];
    from = cfg_path;
  }
  HEARTH_CHECK_T(hearth::InvalidArgument, !tmpl.is_null(), cfg_path.string(), ": no chat_template (and no chat_template.jinja)");
  if (tmpl.is_string()) return tmpl.get<std::string>();
  HEARTH_CHECK_T(hearth::InvalidArgument, tmpl.is_array(), from.string(), ": chat_template must be a string or a list");
  for (const auto& t : tmpl)
    if (t.is_object() && t.value("name", "") == "default" && t.contains("template") && t["template"].is_string())
      return t["template"].get<std::string>();
  throw hearth::InvalidArgument(from.string() + ": chat_template list has no entry named \"default\"");
}

std::function<int()> setup_template(CLI::App& app) {
  struct Opts {
    std::string model, messages, tools, kwargs;
    bool add_generation_prompt = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--model", o->model, "Model directory (tokenizer_config.json / chat_template.jinja)")->required();
  app.add_option("--messages", o->messages, "JSON file: [{\"role\", \"content\"}, ...] or {\"messages\": [...]}")->required();
  app.add_option("--tools", o->tools, "JSON file: OpenAI tools array");
  app.add_flag("--add-generation-prompt", o->add_generation_prompt, "End with the assistant turn header");
  app.add_option("--kwargs", o->kwargs, "Extra template variables as a JSON object, e.g. '{\"enable_thinking\": false}'");
  return [o] {
    fs::path dir = o->model;
    HEARTH_CHECK_T(hearth::NotFound, fs::is_directory(dir), o->model, ": not a directory");
    fs::path cfg_path = dir / "tokenizer_config.json";
    ordered_json cfg = fs::exists(cfg_path) ? read_json(cfg_path) : ordered_json::object();
    HEARTH_CHECK_T(hearth::InvalidArgument, cfg.is_object(), cfg_path.string(), ": must be a JSON object");
    hearth::chat::ChatInputs in;
    in.bos_token = token_text(cfg, "bos_token", cfg_path);
    in.eos_token = token_text(cfg, "eos_token", cfg_path);
    std::string source = find_template(dir, cfg, cfg_path);
    ordered_json msgs = read_json(o->messages);
    if (msgs.is_object() && msgs.contains("messages")) msgs = msgs["messages"];
    HEARTH_CHECK_T(hearth::InvalidArgument, msgs.is_array(), o->messages, ": messages must be a JSON array");
    in.messages = msgs;
    if (!o->tools.empty()) {
      in.tools = read_json(o->tools);
      HEARTH_CHECK_T(hearth::InvalidArgument, in.tools.is_array(), o->tools, ": tools must be a JSON array");
    }
    if (!o->kwargs.empty()) {
      hearth::check_json_nesting(o->kwargs, "--kwargs");
      in.extra_kwargs = ordered_json::parse(o->kwargs, nullptr, false);
      HEARTH_CHECK_T(hearth::InvalidArgument, !in.extra_kwargs.is_discarded() && in.extra_kwargs.is_object(),
                     "--kwargs: must be a JSON object, got ", o->kwargs);
      // What the other options give (transformers' apply_chat_template raises on these too);
      // bos_token / eos_token may be overridden, as there.
      for (const char* given : {"messages", "tools", "documents", "add_generation_prompt"})
        HEARTH_CHECK_T(hearth::InvalidArgument, !in.extra_kwargs.contains(given), "--kwargs: '", given,
                       "' is given by --messages, --tools or --add-generation-prompt, not by --kwargs");
    }
    in.add_generation_prompt = o->add_generation_prompt;
    std::string out = hearth::chat::ChatTemplate(source).render(in);
    std::cout << out << std::flush;
    return 0;
  };
}
}  // namespace
HEARTH_REGISTER_VERB(template, "template", "Render a model's chat template for a messages file", setup_template);
