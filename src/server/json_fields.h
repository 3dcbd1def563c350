// Typed, validated reads of request JSON fields, shared by the request parsers of every API
// (OpenAI chat/completions, Anthropic Messages, OpenAI Responses). Not a parser of any one API:
// each bad value is an ApiError(400) naming the field, in OpenAI's wording.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace hearth::server {

/// "a boolean" | "a number" | "a string" | "an array" | "an object" | "null".
std::string json_type_name(const nlohmann::ordered_json& v);
/// A number without a trailing ".0" (for messages).
std::string json_num(double v);

/// Throws ApiError(400, msg, param, "invalid_value").
[[noreturn]] void bad_value(const std::string& param, const std::string& msg);
/// Throws ApiError(400, "Invalid type for 'param': expected ..., but got ...", param, "invalid_type").
[[noreturn]] void bad_type(const std::string& param, const nlohmann::ordered_json& v, const char* expected);
/// Throws ApiError(400, "Missing required parameter: 'param'.", param, "missing_required_parameter").
[[noreturn]] void missing(const std::string& param);

/// The field's value, or nullptr when absent or null (explicit nulls count as absent).
const nlohmann::ordered_json* json_field(const nlohmann::ordered_json& obj, const std::string& key);

/// A number in [lo, hi] (or (lo, hi] with lo_open); absent/null -> nullopt. `param` names the
/// field in errors ("" = key).
std::optional<double> number_in(const nlohmann::ordered_json& obj, const std::string& key, double lo, double hi,
                                bool lo_open = false, const std::string& param = "");
/// An integer in [lo, hi] (a float with no fraction counts); absent/null -> nullopt.
std::optional<int64_t> integer_in(const nlohmann::ordered_json& obj, const std::string& key, int64_t lo, int64_t hi,
                                  const std::string& param = "");
/// A boolean; absent/null -> nullopt.
std::optional<bool> boolean_field(const nlohmann::ordered_json& obj, const std::string& key, const std::string& param = "");
/// A string; absent/null -> nullopt; another type -> ApiError naming `param`.
std::optional<std::string> string_field(const nlohmann::ordered_json& obj, const std::string& key,
                                        const std::string& param);

}  // namespace hearth::server
