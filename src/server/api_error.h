// An HTTP-level error for the OpenAI-compatible routes: status + OpenAI error fields, and the JSON
// body `{"error": {"message", "type", "param", "code"}}`. Not for internal failures (those are 500s
// built from whatever exception escaped).
#pragma once
#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>

namespace hearth::server {

/// Thrown by request parsing and routes; the server turns it into a response with `status`.
class ApiError : public std::runtime_error {
 public:
  /// A NUL in `message` (an echoed request value) is written as \x00: what() would end there.
  ApiError(int status, const std::string& message, std::string param = {}, std::string code = {})
      : std::runtime_error(without_nul(message)), status_(status), param_(std::move(param)), code_(std::move(code)) {}
  int status() const { return status_; }
  const std::string& param() const { return param_; }  ///< offending field ("" = none)
  const std::string& code() const { return code_; }    ///< OpenAI code ("" = null)

 private:
  static std::string without_nul(const std::string& m) {
    std::string out;
    for (char c : m) out += c == '\0' ? std::string("\\x00") : std::string(1, c);
    return out;
  }
  int status_;
  std::string param_;
  std::string code_;
};

/// OpenAI's `type` for a status: invalid_request_error (4xx), rate_limit_error (429),
/// server_error (5xx).
inline std::string error_type_for(int status) {
  if (status == 429) return "rate_limit_error";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

/// The error body in OpenAI's shape; empty param/code become null.
inline nlohmann::ordered_json error_json(int status, const std::string& message, const std::string& param = {},
                                 const std::string& code = {}) {
  using J = nlohmann::ordered_json;
  J e = {{"message", message},
         {"type", error_type_for(status)},
         {"param", param.empty() ? J() : J(param)},
         {"code", code.empty() ? J() : J(code)}};
  return J{{"error", e}};
}

}  // namespace hearth::server
