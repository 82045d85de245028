#!/usr/bin/env python3
"""Sums an ncu CSV (ncu --csv --metrics gpu__time_duration.sum ...) by kernel name: the kernel time of one
profiled step, without the per-op synchronization of bench_gpt2_step --profile.

usage: ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv \\
           bench_gpt2_step ... --profiler-range > ncu.csv
       python3 bench/reference/ncu_summary.py ncu.csv [K]
"""
import csv, sys


def main():
    path, k = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30
    with open(path) as f:
        lines = [l for l in f if l.startswith('"')]  # ncu's own log lines are not CSV
    tot, cnt = {}, {}
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "nsecond")
        ns = v * {"nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9}.get(unit, 1)
        n = row["Kernel Name"]
        tot[n] = tot.get(n, 0.0) + ns
        cnt[n] = cnt.get(n, 0) + 1
    total = sum(tot.values())
    print(f"## ncu: {sum(cnt.values())} kernels, {total / 1e6:.2f} ms GPU time")
    for n, t in sorted(tot.items(), key=lambda x: -x[1])[:k]:
        print(f"{t / 1e6:9.3f} ms {cnt[n]:5d}x  {n[:110]}")


if __name__ == "__main__":
    main()
