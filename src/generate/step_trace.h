// HEARTH_STEP_TRACE=1: where the scheduler's steps (generate::step, batch.h) spend their time, for
// finding what a batched step pays per row. Not a profiler and not the server's /metrics.
#pragma once
#include <chrono>
#include <cstdint>

namespace hearth::generate {

/// Wall time per phase of generate::step, summed over steps and printed to stderr every 200 steps
/// that decoded rows, as milliseconds per step: prefill (prompt chunks, their first tokens),
/// admit (prefilled rows copied into decode slots), slot_step (the decode slots' step until its
/// argmax reaches the host: on CUDA the graph replay and the wait for it), slot_emit (the slots'
/// rows handed their tokens on the host: sampling, logprobs, the callbacks into the server, rows
/// that ended read back), ragged (rows decoding outside the slots), with the mean rows per step and
/// the prefill forwards and their rows per step (and per forward: its launch, wait and emit times,
/// the longest forward), and the logprob reads per step. Off unless HEARTH_STEP_TRACE=1 (read once); then
/// each phase costs two clock reads. Single-threaded use (the generating thread).
class StepTrace {
 public:
  enum Phase { kPrefill, kAdmit, kSlotStep, kSlotEmit, kRagged, kPhases };
  static bool on();
  /// Times one phase from construction to destruction (nothing when off).
  class Scope {
   public:
    explicit Scope(Phase p);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Phase phase_;
    std::chrono::steady_clock::time_point t0_;
  };
  /// One prefill forward of `rows` rows ran. With the trace on, the three parts of its wall time
  /// (seconds) are summed for the report: `launch` until the forward's last op was queued (host
  /// work; on the CPU, the forward itself), `wait` until its first tokens reached the host (the
  /// head and argmax of the rows that complete, and the device finishing), `emit` handing
  /// them to their sequences (sampling, callbacks; for a prompt prefilled alone `emit` includes the
  /// wait, as its sampling is what waits); the longest whole forward is reported too.
  static void prefill_forward(int64_t rows, double launch, double wait, double emit);
  /// One step ended with `rows` decoding rows (0: a prefill-only step, not counted).
  static void end_step(int64_t rows);
  /// One device-to-host read of tokens' logprobs (read_logprobs, batch.h). Counted whether the
  /// trace is on or not (one add): logprob_reads() is the total since the process started, which
  /// tests read to see that a batched step reads once, however many rows it has.
  static void logprob_read();
  static int64_t logprob_reads();
};

}  // namespace hearth::generate
