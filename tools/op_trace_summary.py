#!/usr/bin/env python3
"""Sum a Chrome trace written by `hearth bench --op-trace FILE` (PyTorch's legacy profiler) by op.

Prints the traced span, the number of top-level ATen calls (ops not inside another op of the same
thread: what the model code dispatched) and, per op name, top-level calls and their host time. The
host time of an eager forward is what its GPU waits for when the kernels are short.

Usage: tools/op_trace_summary.py TRACE.json [--top N]
"""
import argparse
import collections
import json


def load_events(path):
    with open(path) as f:
        data = json.load(f)
    raw = data["traceEvents"] if isinstance(data, dict) else data
    events, open_ = [], {}
    for e in raw:
        ph = e.get("ph")
        key = (e.get("tid"), e.get("name"))
        if ph == "X":
            events.append((e.get("tid"), float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), e["name"]))
        elif ph == "B":
            open_.setdefault(key, []).append(float(e["ts"]))
        elif ph == "E" and open_.get(key):
            events.append((e.get("tid"), open_[key].pop(), float(e["ts"]), e["name"]))
    return events


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    events = sorted(load_events(args.trace), key=lambda e: (e[0], e[1], -e[2]))
    if not events:
        raise SystemExit(f"{args.trace}: no events")
    top = []
    end_by_tid = {}
    for tid, t0, t1, name in events:
        if t0 >= end_by_tid.get(tid, float("-inf")):
            top.append((tid, t0, t1, name))
            end_by_tid[tid] = t1
    span = max(e[2] for e in events) - min(e[1] for e in events)
    busy = sum(t1 - t0 for _, t0, t1, _ in top)
    by = collections.defaultdict(lambda: [0, 0.0])
    for _, t0, t1, name in top:
        by[name][0] += 1
        by[name][1] += t1 - t0
    print(f"span {span / 1e3:.2f} ms, {len(top)} top-level ops, {busy / 1e3:.2f} ms inside them "
          f"({busy / max(len(top), 1):.1f} us each), {len(events)} events in all")
    print(f"{'calls':>7} {'ms':>8} {'us/call':>8}  op")
    for name, (n, us) in sorted(by.items(), key=lambda kv: -kv[1][1])[: args.top]:
        print(f"{n:7d} {us / 1e3:8.2f} {us / n:8.1f}  {name}")


if __name__ == "__main__":
    main()
