// The web chat UI's static files (web/*), embedded at build time by web/embed.cmake.
// Not a file server: the list is fixed when the binary is built.
#pragma once
#include <string_view>
#include <vector>

namespace hearth::server {

/// One embedded file, served at `path` ("/index.html", "/app.js", ...).
struct WebAsset {
  std::string_view path;
  std::string_view content_type;
  std::string_view body;
};

/// All embedded web UI files (defined in the generated build/generated/web_assets.cpp).
const std::vector<WebAsset>& web_assets();

}  // namespace hearth::server
