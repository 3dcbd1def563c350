// Pre-scan of JSON text for nesting depth (json_nesting.h): a bracket counter that skips strings
// and remembers the key or index of each open container, so the error can name the field.
#include "core/json_nesting.h"

#include <vector>

#include "core/error.h"

namespace hearth {

namespace {
struct Frame {
  bool object = false;
  bool expect_key = true;  // object: the next string is a key
  std::string key;         // object: the last key read
  size_t index = 0;        // array: items seen so far (the current one)
};

constexpr size_t kPathParts = 8;

std::string path_of(const std::vector<Frame>& frames) {
  std::string out;
  size_t parts = 0;
  for (const Frame& f : frames) {
    if (parts == kPathParts) return out + "…";
    if (f.object) out += (out.empty() ? "" : ".") + f.key;
    else out += "[" + std::to_string(f.index) + "]";
    ++parts;
  }
  return out;
}
}  // namespace

std::optional<std::string> json_nesting_violation(std::string_view text, int max_depth) {
  std::vector<Frame> frames;
  const size_t n = text.size();
  for (size_t i = 0; i < n; ++i) {
    const char c = text[i];
    if (c == '"') {
      size_t j = i + 1;
      std::string s;
      while (j < n && text[j] != '"') {
        if (text[j] == '\\') ++j;
        else if (!frames.empty() && frames.back().object && frames.back().expect_key && s.size() < 64) s += text[j];
        ++j;
      }
      if (!frames.empty() && frames.back().object && frames.back().expect_key) {
        frames.back().key = s;
        frames.back().expect_key = false;
      }
      i = j;  // at the closing quote (or the end)
    } else if (c == '{' || c == '[') {
      if (static_cast<int>(frames.size()) >= max_depth) return path_of(frames);
      frames.push_back(Frame{c == '{', true, {}, 0});
    } else if (c == '}' || c == ']') {
      if (!frames.empty()) frames.pop_back();
    } else if (c == ',') {
      if (!frames.empty()) {
        if (frames.back().object) frames.back().expect_key = true;
        else ++frames.back().index;
      }
    }
  }
  return std::nullopt;
}

std::string json_nesting_message(const std::string& what, const std::string& path) {
  return cat(what, ": ", path.empty() ? "" : path + ": ", "JSON nested deeper than ", kMaxNesting, " levels");
}

void check_json_nesting(std::string_view text, const std::string& what) {
  if (auto path = json_nesting_violation(text)) throw InvalidArgument(json_nesting_message(what, *path));
}

}  // namespace hearth
