// StepTrace: per-phase sums of generate::step's wall time, printed every 200 decoding steps.
#include "generate/step_trace.h"

#include <algorithm>
#include <array>
#include <cstdio>

#include "core/env.h"

namespace hearth::generate {

namespace {
struct Sums {
  std::array<double, StepTrace::kPhases> seconds{};
  int64_t steps = 0, rows = 0, prefill_forwards = 0, prefill_rows = 0, logprob_reads = 0;
  double prefill_launch = 0, prefill_wait = 0, prefill_emit = 0, prefill_longest = 0;
};
Sums& sums() {
  static Sums s;
  return s;
}
int64_t total_logprob_reads = 0;
}  // namespace

bool StepTrace::on() {
  static const bool enabled = env_equals("HEARTH_STEP_TRACE", "1");
  return enabled;
}

StepTrace::Scope::Scope(Phase p) : phase_(p) {
  if (on()) t0_ = std::chrono::steady_clock::now();
}

StepTrace::Scope::~Scope() {
  if (on()) sums().seconds[phase_] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

void StepTrace::prefill_forward(int64_t rows, double launch, double wait, double emit) {
  if (!on()) return;
  Sums& s = sums();
  ++s.prefill_forwards;
  s.prefill_rows += rows;
  s.prefill_launch += launch;
  s.prefill_wait += wait;
  s.prefill_emit += emit;
  s.prefill_longest = std::max(s.prefill_longest, launch + wait + emit);
}

void StepTrace::logprob_read() {
  ++total_logprob_reads;
  if (on()) ++sums().logprob_reads;
}

int64_t StepTrace::logprob_reads() { return total_logprob_reads; }

void StepTrace::end_step(int64_t rows) {
  if (!on() || rows == 0) return;
  Sums& s = sums();
  ++s.steps;
  s.rows += rows;
  if (s.steps < 200) return;
  const double n = static_cast<double>(s.steps);
  const double f = static_cast<double>(std::max<int64_t>(s.prefill_forwards, 1));
  std::fprintf(stderr,
               "hearth: step trace: %lld steps, %.1f rows/step, %.2f prefill forwards/step of %.1f rows; ms/step: "
               "prefill %.3f, admit %.3f, slot_step %.3f, slot_emit %.3f, ragged %.3f; %.2f logprob reads/step; "
               "ms/prefill forward: launch %.3f, wait %.3f, emit %.3f, longest %.3f\n",
               static_cast<long long>(s.steps), static_cast<double>(s.rows) / n,
               static_cast<double>(s.prefill_forwards) / n,
               s.prefill_forwards ? static_cast<double>(s.prefill_rows) / static_cast<double>(s.prefill_forwards) : 0.0,
               1e3 * s.seconds[kPrefill] / n, 1e3 * s.seconds[kAdmit] / n, 1e3 * s.seconds[kSlotStep] / n,
               1e3 * s.seconds[kSlotEmit] / n, 1e3 * s.seconds[kRagged] / n, static_cast<double>(s.logprob_reads) / n,
               1e3 * s.prefill_launch / f, 1e3 * s.prefill_wait / f, 1e3 * s.prefill_emit / f, 1e3 * s.prefill_longest);
  s = Sums{};
}

}  // namespace hearth::generate
