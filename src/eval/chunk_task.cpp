// Chunking-task scoring and data reading (chunk_task.h).
#include "eval/chunk_task.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <map>

#include "core/error.h"
#include "core/json_nesting.h"

namespace hearth::eval {
namespace {

std::string trim(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

}  // namespace

std::optional<std::vector<std::string>> parse_sentence_array(std::string_view text) {
  if (json_nesting_violation(text)) return std::nullopt;
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_array()) return std::nullopt;
  std::vector<std::string> out;
  out.reserve(j.size());
  for (const auto& e : j) {
    if (!e.is_string()) return std::nullopt;
    out.push_back(e.get<std::string>());
  }
  return out;
}

double sentence_f1(const std::vector<std::string>& predicted, const std::vector<std::string>& reference) {
  if (predicted.empty() && reference.empty()) return 1.0;
  if (predicted.empty() || reference.empty()) return 0.0;
  std::map<std::string, int64_t> ref;
  for (const auto& s : reference) ++ref[trim(s)];
  int64_t matches = 0;
  for (const auto& s : predicted) {
    auto it = ref.find(trim(s));
    if (it != ref.end() && it->second > 0) --it->second, ++matches;
  }
  return 2.0 * static_cast<double>(matches) / static_cast<double>(predicted.size() + reference.size());
}

ChunkScore score_chunk_output(std::string_view output, const std::vector<std::string>& reference) {
  auto parsed = parse_sentence_array(output);
  if (!parsed) return {};
  return {true, sentence_f1(*parsed, reference)};
}

std::vector<ChunkExample> load_chunk_examples(const std::filesystem::path& path, int64_t max_examples) {
  std::error_code ec;
  HEARTH_CHECK_T(InvalidArgument, !std::filesystem::is_directory(path, ec), path.string(),
                 ": is a folder; --data names a .jsonl file");
  std::ifstream in(path);
  HEARTH_CHECK_T(NotFound, in, path.string(), ": cannot open");
  const std::string name = path.filename().string();
  std::vector<ChunkExample> out;
  std::string line;
  for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (max_examples > 0 && static_cast<int64_t>(out.size()) >= max_examples) break;
    auto fail = [&](const std::string& what) { return InvalidArgument(cat(name, ":", lineno, ": ", what)); };
    if (auto path = json_nesting_violation(line)) throw fail(json_nesting_message("row", *path));
    nlohmann::json row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (row.is_discarded() || !row.is_object()) throw fail("not a JSON object");
    ChunkExample ex;
    std::string completion;
    if (row.contains("prompt") || row.contains("completion")) {
      if (!row.value("prompt", nlohmann::json()).is_string()) throw fail("\"prompt\" must be a string");
      if (!row.value("completion", nlohmann::json()).is_string()) throw fail("\"completion\" must be a string");
      ex.prompt = row["prompt"].get<std::string>();
      completion = row["completion"].get<std::string>();
    } else if (row.contains("messages") && row["messages"].is_array()) {
      const auto& msgs = row["messages"];
      // A message's string field, or "" when the message is not an object or the field not a string.
      auto field = [](const nlohmann::json& m, const char* key) {
        if (!m.is_object() || !m.contains(key) || !m[key].is_string()) return std::string();
        return m[key].get<std::string>();
      };
      int64_t last = -1;
      for (size_t i = 0; i < msgs.size(); ++i)
        if (field(msgs[i], "role") == "assistant") last = static_cast<int64_t>(i);
      if (last < 1) throw fail("\"messages\" needs a user message followed by an assistant message");
      const auto& user = msgs[last - 1];
      const auto& asst = msgs[last];
      if (field(user, "role") != "user" || !user.is_object() || !user.value("content", nlohmann::json()).is_string() ||
          !asst.value("content", nlohmann::json()).is_string())
        throw fail("the last assistant message must follow a user message, both with string \"content\"");
      ex.prompt = user["content"].get<std::string>();
      completion = asst["content"].get<std::string>();
    } else {
      throw fail("no \"prompt\"+\"completion\" or \"messages\" key");
    }
    auto ref = parse_sentence_array(completion);
    if (!ref) throw fail("the completion is not a JSON array of strings");
    ex.reference = std::move(*ref);
    out.push_back(std::move(ex));
  }
  HEARTH_CHECK_T(InvalidArgument, !out.empty(), path.string(), ": no rows");
  return out;
}

}  // namespace hearth::eval
