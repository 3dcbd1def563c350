// Hearth's environment switches (HEARTH_FUSED_DECODE, HEARTH_LEAN_GRAD, HEARTH_CUDA_GRAPHS, ...) read
// one way. Not their meaning (each reader documents its own) and not configuration files.
#pragma once

namespace hearth {

/// True when the environment variable `name` is set to exactly `value` (e.g. HEARTH_CUDA_GRAPHS=0).
bool env_equals(const char* name, const char* value);

/// A switch that is on by default: false only when `name` is set to exactly "0" (unset, empty or any
/// other value keeps it on). Read at each call: callers that must not change mid-run cache it.
bool env_switch_on(const char* name);

}  // namespace hearth
