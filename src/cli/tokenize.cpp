// `hearth tokenize`: encodes text to ids (one-line JSON array) or decodes ids to text with the
// tokenizer files of a model directory. Not a chat-template renderer.
#include <nlohmann/json.hpp>

#include <iostream>
#include <sstream>

#include "cli/verb.h"
#include "core/error.h"
#include "core/json_nesting.h"
#include "tokenizer/tokenizer.h"

namespace {

struct TokenizeArgs {
  std::string model;
  std::string input;
  bool special = false;
  bool decode = false;
};

// Ids from "[1, 2, 3]" (JSON) or "1 2 3" / "1,2,3".
std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  size_t first = s.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && s[first] == '[') {
    nlohmann::json j;
    hearth::check_json_nesting(s, "--decode");
    try {
      j = nlohmann::json::parse(s);
    } catch (const nlohmann::json::parse_error&) {
      throw hearth::InvalidArgument("--decode: expected a JSON array of ids, got '" + s + "'");
    }
    for (const auto& v : j) {
      HEARTH_CHECK_T(hearth::InvalidArgument, v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT32_MAX,
                     "--decode: not a token id: ", v.dump());
      ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    }
    return ids;
  }
  std::string norm = s;
  for (char& c : norm)
    if (c == ',') c = ' ';
  std::istringstream in(norm);
  std::string tok;
  while (in >> tok) {
    size_t pos = 0;
    long long v = -1;
    try {
      v = std::stoll(tok, &pos);
    } catch (const std::exception&) {
      pos = 0;
    }
    HEARTH_CHECK_T(hearth::InvalidArgument, pos == tok.size() && v >= 0 && v <= INT32_MAX,
                   "--decode: not a token id: '", tok, "'");
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

std::function<int()> setup_tokenize(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  app.add_option("--model", args->model, "Model directory holding tokenizer.json (and tokenizer_config.json)")->required();
  app.add_flag("--special", args->special,
               "Encode: add the post-processor's special tokens (e.g. BOS), like add_special_tokens=True. "
               "Decode: keep special tokens in the text (skip_special_tokens=False); without it they are dropped");
  app.add_flag("--decode", args->decode, "Decode: TEXT is a JSON array of ids (or ids separated by spaces)");
  app.add_option("text", args->input, "Text to encode, or ids to decode (after `--` when it starts with '-')")->required();
  return [args] {
    auto tok = hearth::tokenizer::Tokenizer::from_dir(args->model);
    if (args->decode) {
      const std::vector<int32_t> ids = parse_ids(args->input);
      for (int32_t id : ids)  // HF's decode skips unknown ids silently; the CLI says so instead
        HEARTH_CHECK_T(hearth::InvalidArgument, !tok.id_to_token(id).empty(), "--decode: id ", id,
                       " is not in the vocabulary of ", args->model, " (size ", tok.vocab_size(), ")");
      std::cout << tok.decode(ids, !args->special) << "\n";
    } else {
      std::cout << nlohmann::json(tok.encode(args->input, args->special)).dump() << "\n";
    }
    return 0;
  };
}

}  // namespace
HEARTH_REGISTER_VERB(tokenize, "tokenize", "Encode text to token ids, or decode ids to text (--decode)", setup_tokenize);
