"""Medians per config and variant of dev/ab_sed.sh output (bwd_harness lines, and fwd_harness bench rows "d seq causal
ms TFLOP/s"), with each variant over the reference (\"main\" or \"base\")."""
import re, sys, statistics, collections
d = collections.defaultdict(lambda: collections.defaultdict(list))
name = None
for line in open(sys.argv[1]):
    m = re.match(r"== round (\d+) (\S+): (.*)", line)
    if m:
        name = m.group(2); continue
    m = re.match(r"bf16 (d=\s*\d+ seqlen=\s*\d+ .*?)\s*:\s*([\d.]+) ms\s+([\d.]+) TFLOP/s", line)
    if m and name:
        d[m.group(1).strip()][name].append(float(m.group(3)))
        continue
    m = re.match(r"(\d+)\s+(\d+)\s+(yes|no)\s+[\d.]+\s+([\d.]+)\s*$", line)  # fwd_harness bench
    if m and name:
        d["fwd d=%s seqlen=%s causal %s" % m.group(1, 2, 3)][name].append(float(m.group(4)))
names = sorted({n for c in d.values() for n in c}, key=lambda n: (n not in ("main", "base"), n))
ref = names[0]
print("config".ljust(52), *[n.rjust(9) for n in names], *[("%s/%s" % (n, ref)).rjust(11) for n in names[1:]])
for c, v in d.items():
    med = {n: statistics.median(v[n]) if v[n] else float("nan") for n in names}
    print(re.sub(r"\s+", " ", c).ljust(52), *["%9.1f" % med[n] for n in names],
          *["%11.3f" % (med[n] / med[ref]) for n in names[1:]])
