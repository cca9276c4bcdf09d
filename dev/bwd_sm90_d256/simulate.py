"""simulate.py: float64 simulation of bwd_main_sm90_d256_kernel's data flow (dev/bwd_sm90_d256/bwd_sm90.patch),
to check its indexing before it first runs on a GPU.

Shared memory is modelled byte for byte: tiles are written at sw128_offset() as the kernel's loads and
fragment stores do, and every wgmma operand is read back through its descriptor (start address, LBO,
SBO, K- or MN-major, 128-byte swizzle) with the model that the committed kernel (csrc/cuda/bwd_sm90.cu)
and dev/wgmma_check.cu confirmed on the H200. Accumulators use the wgmma D layout (warp w of the
warpgroup: rows 16w + lane/4 (+8), n8 block i: columns 8i + 2*(lane%4) (+1)). The result (dq, dk, dv
for one head) is compared with a direct float64 backward.

Run: python3 dev/bwd_sm90_d256/simulate.py   (numpy; a few seconds)
"""
import numpy as np

ROW_BYTES, ATOM = 128, 1024
BN, BM, D, QW, COLS, CHUNK, K16 = 64, 64, 256, 32, 128, 64, 16


def sw128_offset(rows, r, c):
    return (c // 64) * rows * ROW_BYTES + r * ROW_BYTES + (((c % 64) // 8) ^ (r % 8)) * 16 + (c % 8) * 2


def swizzle(addr):
    return addr ^ (((addr >> 7) & 7) << 4)


class Smem:
    """Byte-addressed shared memory holding one float64 per 16-bit element slot."""

    def __init__(self, nbytes):
        self.v = np.full(nbytes // 2, np.nan)

    def store(self, addr, value):
        self.v[addr // 2] = value

    def tile(self, base, rows, mat):
        for r in range(mat.shape[0]):
            for c in range(mat.shape[1]):
                self.store(base + sw128_offset(rows, r, c), mat[r, c])

    def k_major(self, start, extent, sbo):
        """Operand of `extent` rows (M or N) x 16 (K), K-major."""
        out = np.empty((extent, K16))
        for x in range(extent):
            for k in range(K16):
                out[x, k] = self.v[swizzle(start + (x // 8) * sbo + (x % 8) * ROW_BYTES + k * 2) // 2]
        return out

    def mn_major(self, start, extent, lbo, sbo):
        """Operand of `extent` (M or N) x 16 (K), MN-major; returned as [extent][16]."""
        out = np.empty((extent, K16))
        for x in range(extent):
            for k in range(K16):
                out[x, k] = self.v[swizzle(start + (x // 64) * lbo + (k // 8) * sbo + (k % 8) * ROW_BYTES + (x % 64) * 2) // 2]
        return out


# descriptors exactly as csrc/cuda/wgmma.cuh builds them: (start, lbo, sbo)
def desc_k_major(base, rows, row0, col0):
    return (base + (col0 // 64) * rows * ROW_BYTES + row0 * ROW_BYTES + (col0 % 64) * 2, 16, ATOM)


def desc_mn_major(base, rows, row0, col0):
    return (base + (col0 // 64) * rows * ROW_BYTES + row0 * ROW_BYTES, rows * ROW_BYTES, ATOM)


def wgmma_ss(smem, dacc, desc_a, a_mn, desc_b, b_mn, n, accumulate):
    """dacc (64 x n) (+)= A (64 x 16) B (16 x n)."""
    a = smem.mn_major(desc_a[0], 64, desc_a[1], desc_a[2]) if a_mn else smem.k_major(desc_a[0], 64, desc_a[2])
    bt = smem.mn_major(desc_b[0], n, desc_b[1], desc_b[2]) if b_mn else smem.k_major(desc_b[0], n, desc_b[2])
    prod = a @ bt.T
    return dacc + prod if accumulate else prod


def frag(acc, w, lane, e_block):
    """The 4 values of accumulator n8 block e_block held by (warp w, lane): rows r, r, r+8, r+8."""
    r, c = 16 * w + lane // 4, 8 * e_block + 2 * (lane % 4)
    return [acc[r, c], acc[r, c + 1], acc[r + 8, c], acc[r + 8, c + 1]]


def store_a_frag_sw128(smem, base, rows, row0, col0, a, lane):
    """a: 4 pairs (the acc_to_a registers) at (r, c), (r + 8, c), (r, c + 8), (r + 8, c + 8)."""
    r, c = row0 + lane // 4, col0 + 2 * (lane % 4)
    for (dr, dc), pair in zip(((0, 0), (8, 0), (0, 8), (8, 8)), a):
        smem.store(base + sw128_offset(rows, r + dr, c + dc), pair[0])
        smem.store(base + sw128_offset(rows, r + dr, c + dc + 1), pair[1])


def acc_to_a(acc, w, lane, kq):
    c0, c1 = frag(acc, w, lane, 2 * kq), frag(acc, w, lane, 2 * kq + 1)
    return [(c0[0], c0[1]), (c0[2], c0[3]), (c1[0], c1[1]), (c1[2], c1[3])]


def reference(q, k, v, do, scale, causal_offset):
    sq, sk = q.shape[0], k.shape[0]
    s = q @ k.T * scale
    if causal_offset is not None:
        s = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None] + causal_offset, s, -np.inf)
    mx = np.max(s, axis=1, keepdims=True)
    mx = np.where(np.isfinite(mx), mx, 0)
    e = np.exp(s - mx)
    l = e.sum(axis=1, keepdims=True)
    p = np.where(l > 0, e / np.where(l > 0, l, 1), 0)
    lse = np.where(l[:, 0] > 0, np.log(np.where(l[:, 0] > 0, l[:, 0], 1)) + mx[:, 0], -np.inf)
    o = p @ v
    dp = do @ v.T
    delta = (do * o).sum(axis=1)
    ds = p * (dp - delta[:, None])
    return ds @ k * scale, ds.T @ q * scale, p.T @ do, lse, delta


def simulate_cta(n0, q, k, v, do, lse, delta, scale, causal_offset, dq_accum, dk, dv):
    sq, sk, d = q.shape[0], k.shape[0], q.shape[1]
    K_BYTES, Q_BYTES, PT_BYTES = BN * D * 2, BM * D * 2, BN * BM * 2
    Ks, Vs, Qs, dOs = 0, K_BYTES, 2 * K_BYTES, 2 * K_BYTES + 2 * Q_BYTES
    Ps = dOs + 2 * Q_BYTES
    dSs = Ps + PT_BYTES
    smem = Smem(dSs + PT_BYTES)

    def load_tile(base, rows, g, row0, rows_valid):
        tile = np.zeros((rows, D))
        nv = max(0, min(rows, rows_valid))
        tile[:nv, :d] = g[row0:row0 + nv, :d]
        smem.tile(base, rows, tile)

    kvalid = sk - n0
    load_tile(Ks, BN, k, n0, kvalid)
    load_tile(Vs, BN, v, n0, kvalid)
    num_m = (sq + BM - 1) // BM
    m_first = 0
    if causal_offset is not None:
        first_row = n0 - causal_offset
        m_first = 0 if first_row <= 0 else (num_m if first_row >= sq else first_row // BM)
    acc_dv = [np.zeros((64, COLS)) for _ in range(2)]
    acc_dk = [np.zeros((64, COLS)) for _ in range(2)]
    lse_pad = np.concatenate([lse, np.zeros(BM)])  # zero-filled past sq, as load_vec_async
    delta_pad = np.concatenate([delta, np.zeros(BM)])
    for m in range(m_first, num_m):
        st, m0 = (m - m_first) & 1, m * BM
        load_tile(Qs + st * Q_BYTES, BM, q, m0, sq - m0)
        load_tile(dOs + st * Q_BYTES, BM, do, m0, sq - m0)
        Qt, dOt = Qs + st * Q_BYTES, dOs + st * Q_BYTES
        lse_t, delta_t = lse_pad[m0:m0 + BM], delta_pad[m0:m0 + BM]
        diag = m0 + (causal_offset or 0) - n0
        need_mask = (causal_offset is not None and BN - 1 > diag) or kvalid < BN
        for wg in range(2):
            q0 = wg * QW
            s = np.zeros((64, QW))
            dp = np.zeros((64, QW))
            for kk in range(D // K16):
                s = wgmma_ss(smem, s, desc_k_major(Ks, BN, 0, kk * K16), False,
                             desc_k_major(Qt, BM, q0, kk * K16), False, QW, kk)
                dp = wgmma_ss(smem, dp, desc_k_major(Vs, BN, 0, kk * K16), False,
                              desc_k_major(dOt, BM, q0, kk * K16), False, QW, kk)
            # softmax on the accumulators, element by element as the kernel indexes them
            for w in range(4):
                for lane in range(32):
                    lc = lane % 4
                    for i in range(QW // 8):
                        il = q0 + i * 8 + 2 * lc
                        for e in range(4):
                            r, c = 16 * w + lane // 4 + 8 * (e >> 1), 8 * i + 2 * lc + (e & 1)
                            l2 = lse_t[il + (e & 1)]
                            pv = 0.0 if l2 == -np.inf else np.exp(s[r, c] * scale - l2)
                            if need_mask:
                                jl, ie = r, il + (e & 1)
                                if jl >= kvalid or (causal_offset is not None and jl - ie > diag):
                                    pv = 0.0
                            s[r, c] = pv
                            dp[r, c] = pv * (dp[r, c] - delta_t[il + (e & 1)])
                    for kq in range(QW // K16):
                        store_a_frag_sw128(smem, Ps, BN, w * 16, q0 + kq * K16, acc_to_a(s, w, lane, kq), lane)
                        store_a_frag_sw128(smem, dSs, BN, w * 16, q0 + kq * K16, acc_to_a(dp, w, lane, kq), lane)
        for wg in range(2):  # after __syncthreads: both halves of P^T, dS^T in smem
            c0 = wg * COLS
            for kq in range(BM // K16):
                acc_dv[wg] = wgmma_ss(smem, acc_dv[wg], desc_k_major(Ps, BN, 0, kq * K16), False,
                                      desc_mn_major(dOt, BM, kq * K16, c0), True, COLS, 1)
                acc_dk[wg] = wgmma_ss(smem, acc_dk[wg], desc_k_major(dSs, BN, 0, kq * K16), False,
                                      desc_mn_major(Qt, BM, kq * K16, c0), True, COLS, 1)
            for ch in range(COLS // CHUNK):
                cc = c0 + ch * CHUNK
                acc_dq = np.zeros((64, CHUNK))
                for kk in range(BN // K16):
                    acc_dq = wgmma_ss(smem, acc_dq, desc_mn_major(dSs, BN, kk * K16, 0), True,
                                      desc_mn_major(Ks, BN, kk * K16, cc), True, CHUNK, kk)
                for r in range(64):
                    for c in range(CHUNK):
                        if m0 + r < sq and cc + c < d:
                            dq_accum[m0 + r, cc + c] += acc_dq[r, c]
    for wg in range(2):
        c0 = wg * COLS
        for r in range(64):
            for c in range(COLS):
                if n0 + r < sk and c0 + c < d:
                    dv[n0 + r, c0 + c] = acc_dv[wg][r, c]
                    dk[n0 + r, c0 + c] = acc_dk[wg][r, c] * scale


def run(sq, sk, d, causal, seed):
    rng = np.random.default_rng(seed)
    q, k, v, do = (rng.standard_normal((n, d)) for n in (sq, sk, sk, sq))
    scale = 1 / np.sqrt(d)
    offset = (sk - sq) if causal == "bottom-right" else (0 if causal == "top-left" else None)
    dq_ref, dk_ref, dv_ref, lse, delta = reference(q, k, v, do, scale, offset)
    dq_accum, dk, dv = np.zeros((sq, d)), np.full((sk, d), np.nan), np.full((sk, d), np.nan)
    for n0 in range(0, sk, BN):
        simulate_cta(n0, q, k, v, do, lse, delta, scale, offset, dq_accum, dk, dv)
    dq = dq_accum * scale
    errs = [np.max(np.abs(a - b)) / max(1e-30, np.max(np.abs(b))) for a, b in ((dq, dq_ref), (dk, dk_ref), (dv, dv_ref))]
    ok = all(e < 1e-10 for e in errs)
    print(f"sq={sq:4d} sk={sk:4d} d={d} causal={causal or 'none':12s} rel err dq {errs[0]:.1e} dk {errs[1]:.1e} "
          f"dv {errs[2]:.1e}  {'PASS' if ok else 'FAIL'}")
    return ok


if __name__ == "__main__":
    cases = [(64, 64, 256, None), (70, 130, 200, "bottom-right"), (130, 70, 256, "top-left"),
             (129, 129, 256, "bottom-right"), (1, 65, 136, None), (100, 17, 256, "bottom-right")]
    results = [run(sq, sk, d, c, i) for i, (sq, sk, d, c) in enumerate(cases)]
    print("ALL PASS" if all(results) else "SOME FAILED")
