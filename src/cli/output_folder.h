// The output folder of a verb that writes a new model folder (convert, fuse): the checks before
// any work, the cleanup of temp folders a killed run left, and SIGINT/SIGTERM turned into a clean
// stop that removes the partial OUT.tmp.PID. The folder itself is written by io::write_dir_atomic.
// Not for training output (train writes into an adapter folder it may continue).
#pragma once
#include <filesystem>
#include <functional>
#include <string>

namespace hearth::cli {

/// `p` without trailing slashes ("out/" names the folder "out", whose parent is "."; "/" stays).
std::filesystem::path without_trailing_slash(std::string p);

/// Whether `inner` is `outer` or lies under it, both resolved (symlinks, "..", trailing slashes)
/// as far as they exist. False when either cannot be resolved.
bool same_or_inside(const std::filesystem::path& inner, const std::filesystem::path& outer);

/// Checks, before any work, that `out` (without trailing slashes) can become a new folder: not a
/// symlink whose target is missing (the final rename would fail on it after the work), nothing
/// there already (no verb that uses this overwrites), and its parent folder exists. Throws
/// hearth::Error naming `out` ("VERB writes a new folder"), hearth::NotFound for the parent.
void check_new_output_folder(const std::string& verb, const std::filesystem::path& out);

/// Thrown by check_output_signal() once SIGINT or SIGTERM arrived inside an OutputSignalScope.
struct OutputInterrupted {
  int sig;
};

/// Throws OutputInterrupted when SIGINT or SIGTERM arrived since the innermost OutputSignalScope
/// began (call it between tensors and before renaming the output into place).
void check_output_signal();

/// Writes the new folder `out` with `write` (which calls io::write_dir_atomic on `out`, and
/// check_output_signal() between steps) while SIGINT/SIGTERM only set a flag (one-shot: a second
/// signal gets the default action). First removes "<out>.tmp.<pid>" folders beside `out` left by
/// runs of any verb that were killed outright (only that name, only holding io::kPartialMarker,
/// only for processes that no longer run; each named on stdout). Returns 0, or 128 + the signal when interrupted, after removing
/// the temp folder and saying so on stderr ("hearth: VERB interrupted (SIGINT): removed the
/// partial TMP; nothing was written to OUT"). Other exceptions propagate (write_dir_atomic has
/// removed the temp folder).
int write_new_folder(const std::string& verb, const std::filesystem::path& out, const std::function<void()>& write);

}  // namespace hearth::cli
