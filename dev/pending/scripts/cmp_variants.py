"""Ratios of two bench_variants.py runs (ours' TFLOP/s, tree / base, per row and pass):
python3 cmp_variants.py TREE_DIR BASE_DIR (each with variants.json)."""
import json
import sys

tree, base = (json.load(open(f"{d}/variants.json"))["configs"] for d in sys.argv[1:3])
key = lambda c: (c["name"], c["headdim"], c["seqlen"], c["dtype"])
by_key = {key(c): c for c in base}
print("| variant | d | S | dtype | fwd tree / base | bwd tree / base |\n|---|---|---|---|---|---|")
for c in tree:
    b = by_key.get(key(c))
    ta = c["impls"]["ours"].get("tflops") or {}
    tb = (b["impls"]["ours"].get("tflops") or {}) if b else {}
    r = lambda k: f"{ta[k] / tb[k]:.3f}" if ta.get(k) and tb.get(k) else "-"
    print(f"| {c['name']} | {c['headdim']} | {c['seqlen']} | {c['dtype']} | {r('fwd')} | {r('bwd')} |")
