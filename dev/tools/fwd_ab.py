#!/usr/bin/env python3
"""fwd_ab.py: A/B of forward harness builds, interleaved point by point (on the GPU machine, after
dev/device.sh ab built them with MODES ""): every (head dim, seqlen) of `bench` runs once per variant per
round, the variants' order rotated each round; then `variants D` whole, the same way. Prints the median
TFLOP/s of each point per variant and each variant's ratio to the first.
    python3 dev/tools/fwd_ab.py [--rounds R] [--dims 64,128,256] [--seqs 512,...] [--variants-dim D] NAME [NAME ...]
NAME: a variant of `dev/device.sh ab` (its binary $TMPDIR/fwd_variants/h_NAME)."""
import argparse
import os
import statistics
import subprocess
from collections import defaultdict

BIN = os.path.join(os.environ.get("TMPDIR", "/tmp"), "fwd_variants")


def run(name, args, env_extra):
    env = dict(os.environ, **env_extra)
    out = subprocess.run([os.path.join(BIN, "h_" + name)] + args, env=env, capture_output=True, text=True,
                         timeout=300).stdout
    rows = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 5 and f[0].isdigit() and f[1].isdigit():
            try:
                rows[(f[0], f[1], " ".join(f[2:-2]))] = float(f[-1])
            except ValueError:
                pass
    return rows


def rotated(names, r):
    """The variants' order in round r: rotated by r, so that none always runs first."""
    k = r % len(names)
    return names[k:] + names[:k]


def table(title, names, data):
    print(f"== {title}: median TFLOP/s of the rounds; ratio to {names[0]}")
    print("d     seq    case                     " + "".join(f"{n:>10}" for n in names) +
          "".join(f"{n + '/' + names[0]:>16}" for n in names[1:]))
    for key in sorted(data[names[0]], key=lambda k: (int(k[0]), k[2], int(k[1]))):
        med = [statistics.median(data[n][key]) if data[n].get(key) else float("nan") for n in names]
        print(f"{key[0]:<5} {key[1]:<6} {key[2]:<24} " + "".join(f"{m:>10.1f}" for m in med) +
              "".join(f"{m / med[0]:>16.3f}" for m in med[1:]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="+")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dims", default="64,128,256", help="'': no bench")
    ap.add_argument("--seqs", default="512,1024,2048,4096,8192")
    ap.add_argument("--variants-dim", type=int, default=0, help="also run `variants D` (0: not)")
    a = ap.parse_args()
    names = a.names
    bench = {n: defaultdict(list) for n in names}
    for d in filter(None, a.dims.split(",")):
        for s in a.seqs.split(","):
            for r in range(a.rounds):
                for n in rotated(names, r):
                    for k, v in run(n, ["bench", d], {"HARNESS_SEQ": s}).items():
                        bench[n][k].append(v)
    if a.dims:
        table("bench", names, bench)
    if a.variants_dim:
        var = {n: defaultdict(list) for n in names}
        for r in range(a.rounds):
            for n in rotated(names, r):
                for k, v in run(n, ["variants", str(a.variants_dim)], {}).items():
                    var[n][k].append(v)
        table(f"variants {a.variants_dim}", names, var)


if __name__ == "__main__":
    main()
