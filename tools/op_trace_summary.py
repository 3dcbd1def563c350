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


class TraceError(Exception):
    """A trace file that cannot be read or is not a Chrome trace (a one-line reason)."""


def load_events(path):
    """[(tid, start_us, end_us, name)] of a Chrome trace's complete (X) and begin/end (B/E) events."""
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        raise TraceError(f"cannot read ({e.strerror})")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceError(f"not JSON ({e})")
    raw = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(raw, list):
        raise TraceError("not a Chrome trace: expected a list of events or an object with a traceEvents list")
    events, open_ = [], {}
    for i, e in enumerate(raw):
        if not isinstance(e, dict):
            raise TraceError(f"event {i} is not an object")
        try:
            ph = e.get("ph")
            key = (e.get("tid"), e.get("name"))
            if ph == "X":
                t0 = float(e["ts"])
                events.append((e.get("tid"), t0, t0 + float(e.get("dur", 0)), str(e["name"])))
            elif ph == "B":
                open_.setdefault(key, []).append(float(e["ts"]))
            elif ph == "E" and open_.get(key):
                events.append((e.get("tid"), open_[key].pop(), float(e["ts"]), str(e["name"])))
        except KeyError as k:
            raise TraceError(f"event {i} has no {k.args[0]!r}")
        except (TypeError, ValueError):
            raise TraceError(f"event {i}: ts/dur are not numbers")
    return events


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    try:
        events = load_events(args.trace)
    except TraceError as e:
        raise SystemExit(f"{args.trace}: {e}")
    events.sort(key=lambda e: (str(e[0]), e[1], -e[2]))
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
