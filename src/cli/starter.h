// The main job: `hearth` with no verb serves the bundled starter model (models/starter) with every
// adapter folder under its adapters/ mounted by folder name. Not `hearth serve` (any model, every
// flag: cli/serve.h).
#pragma once
#include <filesystem>
#include <string>
#include <vector>
#include "core/source_dir.h"

namespace hearth::cli {

/// Default port of the main job (HEARTH_PORT overrides it).
inline constexpr int kStarterPort = 8080;

/// The starter model folder: $HEARTH_STARTER when set (used as given, even if missing), else the
/// first of <executable's folder>/../models/starter and <HEARTH_SOURCE_DIR>/models/starter that
/// holds a config.json. Returns "" when none does; `tried` (if given) receives the candidates.
std::filesystem::path find_starter(std::vector<std::filesystem::path>* tried = nullptr);

/// Serves the starter on 127.0.0.1:$HEARTH_PORT (default 8080; 0 = any free port, printed),
/// mounting <starter>/adapters/<name>/ as adapter <name>, and prints the URL, the web chat address
/// and a curl line that asks the "chunk" adapter (else the first adapter, else the base model) to
/// split a paragraph. Returns 0 after SIGINT/SIGTERM. Throws hearth::Error (one line) when no
/// starter is found ("... or serve another model with `hearth serve --model DIR`"), HEARTH_PORT is
/// not a port, or the model or an adapter does not load (a full fine-tune among the adapters
/// included: it must be fused first).
int run_starter();

}  // namespace hearth::cli
