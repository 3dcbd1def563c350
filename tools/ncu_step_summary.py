#!/usr/bin/env python3
"""Summarises one decode step of an Nsight Compute report (issue 11's profile: kernels per token
and where the time goes). Reads the CSV of `ncu --import REPORT --csv --page raw` made from
`ncu --graph-profiling node --metrics gpu__time_duration.sum hearth bench ...` (tools/gpu_check.sh
--profile), takes the kernels between the last two argmax kernels (one greedy step: the step ends
with its argmax), and prints the step's kernel count, its summed kernel time and a table per
kernel name and launch shape (total µs, count, µs each), largest first.

  python3 tools/ncu_step_summary.py prof.csv [--top 30]
"""
import argparse
import collections
import csv
import re
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    with open(a.csv, newline="") as f:
        rows = list(csv.reader(f))
    if len(rows) < 3 or "gpu__time_duration.sum" not in rows[0]:
        sys.exit(f"ncu_step_summary: {a.csv}: no gpu__time_duration.sum column (profile with --metrics gpu__time_duration.sum)")
    head, units, data = rows[0], rows[1], rows[2:]
    ti, ki = head.index("gpu__time_duration.sum"), head.index("Kernel Name")
    gi, bi = head.index("Grid Size"), head.index("Block Size")
    scale = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "msecond": 1e3, "ms": 1e3}.get(units[ti], 1.0)
    seq = [(re.sub(r"\(.*", "", r[ki]).replace("void ", "")[:80], float(r[ti].replace(",", "")) * scale, r[gi], r[bi])
           for r in data]
    ends = [i for i, s in enumerate(seq) if "ArgMax" in s[0]]
    if len(ends) < 2:
        sys.exit(f"ncu_step_summary: {a.csv}: fewer than two argmax kernels, so no whole step to summarise")
    step = seq[ends[-2] + 1:ends[-1] + 1]
    print(f"kernels per step: {len(step)}; kernel time per step: {sum(s[1] for s in step):.1f} us")
    agg = collections.defaultdict(lambda: [0, 0.0])
    for name, us, grid, block in step:
        agg[(name, grid, block)][0] += 1
        agg[(name, grid, block)][1] += us
    print(f"{'total us':>10} {'count':>5} {'us each':>8}  kernel grid block")
    for (name, grid, block), (n, us) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:a.top]:
        print(f"{us:10.1f} {n:5d} {us / n:8.2f}  {name} {grid} {block}")


if __name__ == "__main__":
    main()
