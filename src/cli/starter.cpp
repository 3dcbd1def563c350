// `hearth` with no verb (cli/starter.h): find models/starter, mount its adapters, serve it with a
// curl line for the chunking adapter. Not the serve verb's flags (cli/serve.cpp).
#include "cli/starter.h"

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "cli/serve.h"
#include "core/error.h"
#include "core/source_dir.h"

namespace hearth::cli {
namespace fs = std::filesystem;

namespace {

// The running executable's folder (/proc/self/exe; "" when unreadable).
fs::path exe_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : exe.parent_path();
}

int port_from_env() {
  const char* v = std::getenv("HEARTH_PORT");
  if (!v || !*v) return kStarterPort;
  const std::string s(v);
  HEARTH_CHECK_T(InvalidArgument, s.size() <= 5 && s.find_first_not_of("0123456789") == std::string::npos &&
                                      std::stoi(s) <= 65535,
                 "HEARTH_PORT='", s, "': expected a port number 0..65535 (0 = any free port)");
  return std::stoi(s);
}

// The curl body: the chunking task's prompt (the format the adapter was trained on, see
// docs/starter.md) on a held-out Brown paragraph (the first row of tests/data/chunk_test_small.jsonl).
std::string example_body(const std::string& model_id, const std::string& adapter) {
  nlohmann::ordered_json body;
  body["model"] = model_id;
  if (!adapter.empty()) body["adapter"] = adapter;
  nlohmann::ordered_json message;
  message["role"] = "user";
  message["content"] =
      "Split the following paragraph into sentences. Answer with a JSON array of strings, one string per "
      "sentence, each copied exactly from the paragraph.\n\nThe secretary based his assessment on the upturn in "
      "retail sales. February's volume was 1 per cent above January's for the first pickup since last October, "
      "although it's still 1.5 per cent off from February 1960.";
  body["messages"] = nlohmann::ordered_json::array();
  body["messages"].push_back(message);
  body["max_tokens"] = 200;
  body["temperature"] = 0;  // greedy, as the adapter was evaluated
  return body.dump();
}

}  // namespace

fs::path find_starter(std::vector<fs::path>* tried) {
  if (const char* env = std::getenv("HEARTH_STARTER"); env && *env) {
    if (tried) tried->push_back(env);
    return fs::exists(fs::path(env) / "config.json") ? fs::path(env) : fs::path();
  }
  std::vector<fs::path> candidates;
  if (fs::path d = exe_dir(); !d.empty()) candidates.push_back(d.parent_path() / "models" / "starter");
#ifdef HEARTH_SOURCE_DIR
  candidates.push_back(fs::path(HEARTH_SOURCE_DIR) / "models" / "starter");
#endif
  std::vector<fs::path> seen;
  for (const auto& c : candidates) {
    const fs::path p = c.lexically_normal();
    if (std::find(seen.begin(), seen.end(), p) != seen.end()) continue;
    seen.push_back(p);
    if (tried) tried->push_back(p);
    if (fs::exists(p / "config.json")) return p;
  }
  return {};
}

int run_starter() {
  std::vector<fs::path> tried;
  const fs::path dir = find_starter(&tried);
  if (dir.empty()) {
    std::string list;
    for (const auto& t : tried) list += (list.empty() ? "" : " nor ") + t.string();
    throw Error(cat("no starter model at ", list, " (no config.json): point HEARTH_STARTER=DIR at one, ",
                    "or serve another model with `hearth serve --model DIR`"));
  }
  ServeArgs a;
  a.model = dir.string();
  a.server.host = "127.0.0.1";
  a.server.port = port_from_env();
  std::vector<std::string> names;
  if (fs::is_directory(dir / "adapters"))
    for (const auto& e : fs::directory_iterator(dir / "adapters"))
      // Hidden folders (an editor's or a tool's: .cache, .ipynb_checkpoints) are not adapters.
      if (e.is_directory() && e.path().filename().string().rfind('.', 0) != 0)
        names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  for (const auto& n : names) a.adapters.push_back(n + "=" + (dir / "adapters" / n).string());
  const std::string adapter = std::find(names.begin(), names.end(), "chunk") != names.end() ? "chunk"
                              : names.empty()                                              ? ""
                                                                                           : names.front();
  a.example_body = example_body(fs::weakly_canonical(dir).filename().string(), adapter);
  return run_serve(a);
}

}  // namespace hearth::cli
