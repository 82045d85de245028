"""Compares two top-ops tables of ingot's op profiler (recipes/profile.h; bench_gpt2_step --profile K
[--profile-events] prints one after its row): per op name, the calls and total ms of each run and how much more
time the second run spent, largest first. With --profile-events both tables time ops on the device without
synchronizing, so a data-parallel run (the second) against one GPU (the first) shows which ops slow down beside
the communication (scripts/device_dist.sh kernels).
   python3 bench/reference/op_table_diff.py ONE_GPU.log DDP.log [--top 25]
"""
import argparse
import re

ROW = re.compile(r"^(?P<name>\S.*?)\s+(?P<calls>\d+)\s+(?P<total>[\d.]+)\s+(?P<mean>[\d.]+)\s+(?P<share>[\d.]+)%$")


def read_table(path):
    """{op name: (calls, total ms)} from the first top-ops table in `path` (header line starting with 'op ')."""
    rows, inside = {}, False
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not inside:
                inside = line.startswith("op ") and "calls" in line and "total ms" in line
                continue
            if line.startswith("("):
                break
            m = ROW.match(line)
            if m:
                rows[m["name"]] = (int(m["calls"]), float(m["total"]))
    if not rows:
        raise SystemExit(f"op_table_diff: no top-ops table in {path}")
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("first")
    p.add_argument("second")
    p.add_argument("--top", type=int, default=25, help="rows to print (largest differences first)")
    a = p.parse_args()
    one, two = read_table(a.first), read_table(a.second)
    names = sorted(set(one) | set(two), key=lambda n: -(two.get(n, (0, 0.0))[1] - one.get(n, (0, 0.0))[1]))
    print("| op | calls (first / second) | first ms | second ms | second - first ms | ratio |")
    print("|---|---|---|---|---|---|")
    for n in names[: a.top]:
        c1, t1 = one.get(n, (0, 0.0))
        c2, t2 = two.get(n, (0, 0.0))
        ratio = f"{t2 / t1:.2f}" if t1 > 0 else "-"
        print(f"| {n} | {c1} / {c2} | {t1:.3f} | {t2:.3f} | {t2 - t1:+.3f} | {ratio} |")
    s1, s2 = sum(t for _, t in one.values()), sum(t for _, t in two.values())
    print(f"listed ops: first {s1:.3f} ms, second {s2:.3f} ms, difference {s2 - s1:+.3f} ms "
          "(each table lists its top K ops only)")


if __name__ == "__main__":
    main()
