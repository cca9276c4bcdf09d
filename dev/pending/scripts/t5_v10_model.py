"""T5 v10 (dev/pending/i34_t5_v10.patch) on the CPU: a model of one warp of t5_band_add (block_c layout, the two
shuffles, the 14 owners) and t5_dh_flush (segmented scan per bucket run) against direct per-element sums.
    python3 dev/pending/scripts/t5_v10_model.py"""
import random
def block_c(kq, v): return 8*(2*kq + v//4) + (v & 1) - 8*((v & 3) >> 1)
QN = 64; W = QN + 15
VS = [2, 3, 0, 1, 4, 5]
def band(ds, exists):
    # ds[lane][kq][v]; returns DH of W floats from v10's algorithm and from the direct per-element sums
    ref = [0.0]*W; dh = [0.0]*W
    for kq in range(QN//16):
        xs = []
        for lane in range(32):
            r, lc = lane >> 2, lane & 3
            idx0 = r - 2*lc + QN - 1
            e = [ds[lane][kq][v] if exists[lane][kq][v] else 0.0 for v in range(8)]
            for v in range(8):
                if exists[lane][kq][v]:
                    ref[idx0 - block_c(kq, v)] += ds[lane][kq][v]
            xs.append([e[2], e[3], e[0]+e[6], e[1]+e[7], e[4], e[5]])
        # shuffle rounds (shfl_down: lane reads lane+d, or its own value past 31)
        for d, cond in ((9, lambda r, lc: r <= 5 and lc <= 2), (18, lambda r, lc: r <= 3 and lc <= 1)):
            new = []
            for lane in range(32):
                r, lc = lane >> 2, lane & 3
                src = lane + d if lane + d < 32 else lane
                new.append([xs[lane][k] + (xs[src][k] if cond(r, lc) else 0.0) for k in range(6)])
            xs = new
        for k in range(6):
            addrs = {}
            for lane in range(32):
                r, lc = lane >> 2, lane & 3
                if r < 2 or lc == 0:
                    a = r - 2*lc + QN - 1 - block_c(kq, VS[k])
                    assert 0 <= a < W
                    assert a not in addrs, "two owners at one address"
                    addrs[a] = lane
                    dh[a] += xs[lane][k]
    return ref, dh
def flush(dh, buckets):
    ref = {}; out = {}
    for i in range(W):
        if dh[i] != 0: ref[buckets[i]] = ref.get(buckets[i], 0) + dh[i]
    for i0 in range(0, W, 32):
        v = [dh[i0+l] if i0+l < W else 0.0 for l in range(32)]
        b = [buckets[i0+l] if i0+l < W else -1 for l in range(32)]
        heads = [l == 0 or b[l-1] != b[l] for l in range(32)]
        run = [sum(heads[:l+1]) for l in range(32)]
        o = 1
        while o < 32:
            v = [v[l] + (v[l-o] if l >= o and run[l-o] == run[l] else 0.0) for l in range(32)]
            o <<= 1
        for l in range(32):
            last = l == 31 or heads[l+1]
            if last and i0 + l < W and v[l] != 0:
                out[b[l]] = out.get(b[l], 0) + v[l]
    return ref, out
random.seed(1)
for t in range(300):
    ds = [[[random.choice([0.0, random.uniform(-1, 1)]) for v in range(8)] for kq in range(4)] for l in range(32)]
    ex = [[[random.random() > 0.2 for v in range(8)] for kq in range(4)] for l in range(32)]
    ref, dh = band(ds, ex)
    assert all(abs(a-b) < 1e-9 for a, b in zip(ref, dh)), t
    # buckets: monotone runs, and sometimes a repeated bucket in a separate run
    bk = sorted(random.randint(0, 20) for _ in range(W))
    if t % 3 == 0: bk = [x if random.random() > 0.1 else 5 for x in bk]
    r2, o2 = flush(dh, bk)
    assert set(r2) == set(o2) and all(abs(r2[k]-o2[k]) < 1e-9 for k in r2), t
print("v10 model: band and flush sums match in 300 random warps")
