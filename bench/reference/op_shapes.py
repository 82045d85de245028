#!/usr/bin/env python3
"""Per-op time by op and shapes from an ingot profile trace (profile.enabled: the Chrome-trace JSON, one event per op
with its shapes): which products of a step (matmul by its output shape, say) take the time. Standard library only.

  python3 bench/reference/op_shapes.py RUN_DIR/profile/trace.json [--top 40] [--op matmul]
"""
import argparse
import collections
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", help="a Chrome-trace JSON written by ingot's profiler")
    ap.add_argument("--top", type=int, default=40, help="rows printed (default 40)")
    ap.add_argument("--op", default=None, help="only ops whose name contains this")
    a = ap.parse_args()
    with open(a.trace) as f:
        events = json.load(f)["traceEvents"]
    agg = collections.defaultdict(lambda: [0, 0.0])
    by_name = collections.defaultdict(lambda: [0, 0.0])
    steps = set()
    for e in events:
        if e.get("cat") != "op":
            continue
        if a.op and a.op not in e["name"]:
            continue
        args = e.get("args", {})
        steps.add(args.get("step"))
        k = (e["name"], args.get("shapes", ""))
        agg[k][0] += 1
        agg[k][1] += e["dur"] / 1000.0
        by_name[e["name"]][0] += 1
        by_name[e["name"]][1] += e["dur"] / 1000.0
    n = max(1, len(steps))
    total = sum(v[1] for v in agg.values())
    print(f"{len(steps)} step(s), {total / n:.2f} ms of op time per step")
    print(f"{'ms/step':>9} {'calls':>6} {'us each':>9}  op  shapes")
    for (name, shapes), (calls, ms) in sorted(agg.items(), key=lambda kv: -kv[1][1])[: a.top]:
        print(f"{ms / n:9.2f} {calls // n:6d} {1000 * ms / calls:9.1f}  {name}  {shapes}")
    print("by op:")
    for name, (calls, ms) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:20]:
        print(f"{ms / n:9.2f} {calls // n:6d}  {name}")


if __name__ == "__main__":
    sys.exit(main())
