#!/usr/bin/env python3
"""Where the GPU waited, from a Kineto Chrome trace (`hearth bench --op-trace FILE` on CUDA with
PyTorch 2.x, or torch.profiler's export_chrome_trace): the span from the first GPU activity (kernel,
copy, memset) to the last, the time the GPU was busy and idle, and the longest idle gaps, each with
the kernels around it and what the host did: when it launched the kernel after the gap (a launch at
the end of the gap means the GPU waited for the host) and the host op that launched it.

Usage: tools/trace_gaps.py TRACE.json [--top N]
"""
import argparse
import json
import sys

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args()
    try:
        with open(a.trace) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        sys.exit(f"trace_gaps: {a.trace}: cannot read a JSON trace ({e})")
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    gpu = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATS), key=lambda e: e["ts"])
    if not gpu:
        sys.exit(f"trace_gaps: {a.trace}: no GPU kernels in the trace (a host-only trace?)")
    launches = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {}):
            launches[e["args"]["correlation"]] = e
    ops = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"), key=lambda e: e["ts"])

    def host_op(t):  # the innermost host op running at time t
        best = None
        for o in ops:
            if o["ts"] > t:
                break
            if o["ts"] + o["dur"] >= t and (best is None or o["dur"] <= best["dur"]):
                best = o
        return best["name"] if best else "-"

    start, end = gpu[0]["ts"], max(e["ts"] + e["dur"] for e in gpu)
    busy, reach, gaps = 0.0, start, []
    for i, e in enumerate(gpu):
        if e["ts"] > reach:
            gaps.append((e["ts"] - reach, i))
        busy += max(0.0, e["ts"] + e["dur"] - max(e["ts"], reach))
        reach = max(reach, e["ts"] + e["dur"])
    span = end - start
    print(f"GPU activities: {len(gpu)}; span {span / 1e3:.2f} ms, busy {busy / 1e3:.2f} ms, idle {(span - busy) / 1e3:.2f} ms "
          f"in {len(gaps)} gaps ({sum(g for g, _ in gaps if g >= 20) / 1e3:.2f} ms in gaps of 20 us or more)")
    print(f"{'gap us':>9} {'launch-to-start us':>18}  before -> after  [host op that launched it]")
    for g, i in sorted(gaps, reverse=True)[:a.top]:
        nxt, prev = gpu[i], gpu[i - 1]
        l = launches.get(nxt.get("args", {}).get("correlation"))
        lag = f"{nxt['ts'] - l['ts']:.1f}" if l else "?"
        who = host_op(l["ts"]) if l else "-"
        print(f"{g:9.1f} {lag:>18}  {prev['name'][:40]} -> {nxt['name'][:40]}  [{who}]")


if __name__ == "__main__":
    main()
