"""Medians of `name ms` lines over rounds, two trees: python3 ab_cmp.py DIR TREE BASE reads DIR/TREE_*.txt and
DIR/BASE_*.txt (one file per round) and prints, per name, both medians and the speed TREE / BASE (above 1: TREE faster).
Lines with ` err ` (a call the tree refuses) are listed, not timed."""
import glob
import statistics
import sys

d, tree, base = sys.argv[1:4]


def load(prefix):
    rows, errs = {}, {}
    for path in sorted(glob.glob(f"{d}/{prefix}_*.txt")):
        for line in open(path):
            if " err " in line:
                errs[line.split(" err ")[0]] = line.split(" err ", 1)[1].strip()
                continue
            *name, ms = line.split()
            try:
                rows.setdefault(" ".join(name), []).append(float(ms))
            except ValueError:
                pass
    return {k: (statistics.median(v), len(v)) for k, v in rows.items()}, errs


a, ea = load(tree)
b, eb = load(base)
print(f"| call | {tree} ms | {base} ms | {tree} / {base} speed | rounds |\n|---|---|---|---|---|")
for k in a:
    if k in b:
        print(f"| {k} | {a[k][0]:.4f} | {b[k][0]:.4f} | {b[k][0] / a[k][0]:.3f} | {a[k][1]}/{b[k][1]} |")
    else:
        refused = next((e for name, e in eb.items() if k.startswith(name + " ")), "-")  # the base's error, if any
        print(f"| {k} | {a[k][0]:.4f} | {refused} | - | {a[k][1]} |")
for k, e in ea.items():
    print(f"| {k} | refused: {e} | | | |")
