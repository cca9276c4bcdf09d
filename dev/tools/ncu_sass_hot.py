"""Hot SASS lines of an ncu source page (ncu -i REP --page source --csv --print-source sass > F.csv):
the N instructions with the most warp-stall samples, their top stall reasons, and totals per reason.
Usage: python3 dev/tools/ncu_sass_hot.py F.csv [N]"""
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
hdr = rows[1]; data = rows[2:]
ix = {h: i for i, h in enumerate(hdr)}
stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
tot = sum(int(r[ix["Warp Stall Sampling (All Samples)"]] or 0) for r in data)
print("total samples", tot, "instructions", len(data))
def num(r, k):
    v = r[ix[k]].replace(",", "")
    try: return float(v)
    except: return 0.0
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
