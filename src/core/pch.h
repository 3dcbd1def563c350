// Precompiled header for hearth_core and its users: heavy, stable third-party includes only.
// Not a place for Hearth's own headers (they change often and would invalidate the PCH).
#pragma once
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>
