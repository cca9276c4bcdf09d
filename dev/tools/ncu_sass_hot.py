"""Hot SASS lines of an ncu source page (ncu -i REP --page source --csv --print-source sass > F.csv):
the N instructions with the most warp-stall samples, their top stall reasons, and totals per reason.
Usage: python3 dev/tools/ncu_sass_hot.py F.csv [N]"""
import sys
from ncu_sass_mix import source_page
data, ix, num = source_page(sys.argv[1])
hdr = [h for h, _ in sorted(ix.items(), key=lambda kv: kv[1])]
stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
tot = sum(num(r, "Warp Stall Sampling (All Samples)") for r in data)
print("total samples", int(tot), "instructions", len(data))
ex = sum(num(r, "L1 Wavefronts Shared Excessive") for r in data); wf = sum(num(r, "L1 Wavefronts Shared") for r in data)
print("smem wavefronts", wf, "excessive", ex)
top = sorted(range(len(data)), key=lambda i: -num(data[i], "Warp Stall Sampling (All Samples)"))
N = int(sys.argv[2]) if len(sys.argv) > 2 else 50
for i in top[:N]:
    r = data[i]; s = num(r, "Warp Stall Sampling (All Samples)")
    st = sorted(((num(r, k), k[6:]) for k in stalls), reverse=True)[:3]
    print(f"{i:5d} {s/tot*100:5.2f}% ex={int(num(r,'Instructions Executed')):>9} {r[ix['Source']].strip()[:60]:60s} " + " ".join(f"{k}:{v/tot*100:.1f}" for v, k in st if v))
# per stall type totals
print({k[6:]: round(sum(num(r, k) for r in data) / tot * 100, 1) for k in stalls})
