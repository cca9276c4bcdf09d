/* bwd_sm80.cu: FlashAttention-2 backward for fp16/bf16 on mma.sync m16n8k16 (fp32 accumulators),
 * sm80 and later (also the Hopper path for now).
 *
 * Algorithm (nothing of size sq x sk is ever stored):
 *   1. bwd_preprocess_kernel: delta_i = rowsum(dO_i * O_i) in fp32; zeroes the dq_accum row.
 *   2. bwd_main_kernel, grid (key tiles, h, b): a CTA owns BC keys of one query head. K and V of the
 *      tile are loaded once (cp.async); the CTA walks the query tiles that can see the tile (causal:
 *      from the first visible one), Q/dO/lse/delta double-buffered through cp.async:
 *        S^T  = K Q^T                      P^T = exp2(S^T * scale*log2e - lse*log2e), 0 where masked
 *        dP^T = V dO^T                     dS^T = P^T o (dP^T - delta)
 *        dV  += P^T dO    dK += dS^T Q     (P^T and dS^T repacked from the accumulators, no smem)
 *        dQ_partial = dS K                 (dS^T through smem, read back with ldmatrix.trans),
 *                                          added to the fp32 dq_accum with vector red.add (sm90) or
 *                                          scalar red.add (sm80).
 *      dK is scaled by `scale` at the end and written in the dtype (h == h_kv) or, for GQA, as fp32
 *      per query head into dk_accum/dv_accum.
 *   3. bwd_dq_post_kernel: dq = dq_accum * scale in the dtype; bwd_dkv_post_kernel (GQA only):
 *      dk/dv = sum over the h/h_kv query heads of dk_accum/dv_accum, in a fixed order.
 *   Deterministic mode (p->deterministic): the main kernel skips dQ; bwd_dq_kernel, grid (query
 *   tiles, h, b), walks the key tiles in order recomputing S, P, dP, dS, keeps dQ in registers and
 *   writes dq directly. Bitwise reproducible; costs S and dP twice.
 *
 * Warps' roles (main kernel, BC = KM * warps): warp w owns keys [KM*w, KM*w + KM) of the tile for
 * S^T, dP^T, dV, dK; the warp keeps its KM x D slices of dK and dV in registers (fp32 accumulator
 * fragments), and S^T/dP^T of one sub-tile of BRS queries at a time. K/V fragments (A) come from smem once per k16 step and serve KM/16 mma
 * rows, the Q/dO fragments (B) serve all of them: KM = 32 halves the B traffic, but needs 2x the
 * accumulators, so only D=64 affords it. For dQ the warps split the BR x D output into BR/DQM row
 * groups of DQM rows x column groups. dQ kernel: warp w owns query rows [16w, 16w+16) of the tile and
 * all BCQ keys of each key tile.
 *
 * Tiles (D = head dim rounded up to 64/128/256, columns past d are zero-filled and their k16 steps
 * and n16 column pairs skipped; smem rows padded by 16 bytes so that ldmatrix and the fragment stores
 * are bank-conflict free):
 *   D=64 : main BC=256 keys (KM=32) x BR=128 queries (BRS=32), DQM=32, 8 warps, 214 KB smem;
 *   D=128: main BC=128 keys (KM=16) x BR=64 queries (BRS=32), DQM=32, 8 warps, 155 KB smem;
 *   D=256: main BC=128 keys (KM=16) x BR=32 queries (BRS=32), DQM=32, 8 warps, 209 KB smem, two
 *          passes over the query tiles (dV first, then dK and dQ: the fp32 accumulators of both
 *          would not fit in registers; costs S^T once more).
 *   dQ kernel (deterministic mode): D=64/128 BRQ=128 x BCQ=64, 8 warps; D=256 BRQ=64 x BCQ=32, 4 warps.
 * All kernels: no register spills for sm_80 and sm_90a (ptxas -v); one CTA of 8 warps per SM.
 * Requirements (checked, cudaErrorInvalidValue otherwise): d % 8 == 0, d <= 256, 16-byte aligned
 * base pointers, batch/row/head strides multiples of 8 elements.
 *
 * Measured on the H200 (dev/bwd_harness.cu time; bf16, 16k tokens, nheads = 2048/d, CUDA events,
 * median of 10, whole backward incl. pre/postprocess; bwd FLOPs = 2.5 * 4*B*H*Sq*Sk*D, halved for
 * causal), TFLOP/s:
 *                     s512  s2048  s8192 | causal: s512  s2048  s8192
 *   d64               172.7  238.4  263.3 |         101.9  187.2  238.7
 *   d128              163.7  205.4  219.7 |         110.7  173.6  206.3
 *   d256              113.0  154.3  169.6 |          89.0  131.1  154.1
 *   deterministic d128 s8192: 165.2 (causal 154.9), i.e. 1.33x the time of the atomic dQ path.
 * torch's flash backend (FA2) on this H200: 276 (d64 s8k), 251 (d128 s2k), 296 (d128 s8k).
 * ncu (d128 s2048): L1/smem pipe 71% busy, tensor pipe 31%, 2 warps per scheduler: the kernel is
 * bound by ldmatrix traffic (about 0.6 ldmatrix.x4 per mma at D=128, 0.4 at D=64).
 * History (s8192, d64/d128/d256): 1. KM=16, DQM=16 everywhere: 200/208/163. 2. DQM=32: 205/218/171.
 * 3. D=64 with KM=32, BC=256, BR=128: 263 at d64. Tried and dropped: BC=64 (two CTAs per SM, twice
 * the dQ atomics) -30%; D=128 BRS=64 +2% but spills; full unrolling of the S^T loop spills.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "launch.h"
#include "ptx.cuh"

#define WARP_SIZE 32
#define FULL_MASK 0xffffffffu

/* 16 bytes of padding per shared-memory row: 8 consecutive rows then start in 8 distinct 16-byte
 * bank groups, so ldmatrix (plain and .trans) and 4-byte fragment stores have no conflicts. */
#define SMEM_PAD 8
/* elements of a 16-bit type per 16-byte cp.async */
#define CHUNK 8
#define LOG2E_F 1.4426950408889634f
/* |diag| clamp for the causal test; any value beyond the largest tile edge behaves the same */
#define DIAG_CLAMP (1 << 20)

#define PRE_WARPS 8        /* rows per block of the preprocess kernel */
#define POST_THREADS 256   /* threads per block of the postprocess kernels */

enum { PASS_BOTH = 0, PASS_DV = 1, PASS_DK = 2 };

/* ------------------------------------------------------------------------------------------------ */
/* small helpers                                                                                    */

template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t v);

template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t v)
{
    return __bfloat1622float2(*(__nv_bfloat162 *)&v);
}

template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t v)
{
    return __half22float2(*(__half2 *)&v);
}

/* lse (natural log) -> the log2-domain subtrahend of the exponent; -inf (row sees no key) maps to
 * +inf so that exp2(s - inf) = 0 without ever forming inf - inf. */
__device__ __forceinline__ float lse_to_log2(float lse)
{
    return lse == -INFINITY ? INFINITY : lse * LOG2E_F;
}

__device__ __forceinline__ int clamp_diag(int64_t v)
{
    return (int)(v < -DIAG_CLAMP ? -DIAG_CLAMP : (v > DIAG_CLAMP ? DIAG_CLAMP : v));
}

/* ldmatrix address patterns. For a 16x16 block at (row0, col0) of a row-major smem tile with row
 * stride `ld` elements: pattern A gives lane l the row (l%8) + 8*((l/8)%2), column 8*(l/16);
 * pattern B gives row (l%8) + 8*(l/16), column 8*((l/8)%2).
 *   x4 plain, pattern A  : A fragment of a [m][k] tile.
 *   x4 .trans, pattern A : B fragments of two n8 tiles from a [k][n] tile.
 *   x4 plain, pattern B  : B fragments of two n8 tiles from a [n][k] tile.
 *   x4 .trans, pattern B : A fragment from a [k][m] tile (the transpose of what is stored). */
template <typename T>
__device__ __forceinline__ uint32_t addr_pat_a(const T *s, int ld, int row0, int col0, int lane)
{
    return smem_u32(s + (row0 + (lane % 8) + 8 * ((lane / 8) % 2)) * ld + col0 + 8 * (lane / 16));
}

template <typename T>
__device__ __forceinline__ uint32_t addr_pat_b(const T *s, int ld, int row0, int col0, int lane)
{
    return smem_u32(s + (row0 + (lane % 8) + 8 * (lane / 16)) * ld + col0 + 8 * ((lane / 8) % 2));
}

/* Async copy of a ROWS x D tile (rows [0, rows_valid), columns [0, d) of global memory, row stride
 * `stride` elements) into smem [ROWS][D + SMEM_PAD]; everything outside is zero-filled. TPR threads
 * share a row, each taking every TPR-th 16-byte chunk, so a thread needs one base address per row
 * (the chunks are immediate offsets from it) and few registers stay live across the main loops. */
template <typename T, int ROWS, int D, int NT>
__device__ __forceinline__ void load_tile_async(T *s, const T *g, int64_t stride, int rows_valid, int d, int tid)
{
    constexpr int CPR = D / CHUNK;                   /* chunks per row */
    constexpr int TPR = NT >= ROWS ? NT / ROWS : 1;  /* threads per row */
    constexpr int RPP = NT / TPR;                    /* rows per pass */
    static_assert((NT % ROWS == 0 || ROWS % NT == 0) && CPR % TPR == 0, "tile copy layout");
    const int r0 = tid / TPR, c0 = (tid % TPR) * CHUNK;
#pragma unroll
    for (int rp = 0; rp < ROWS / RPP; ++rp) {
        const int r = r0 + rp * RPP;
        const bool row_ok = r < rows_valid;
        const T *src = g + (row_ok ? r * stride : 0);
        T *dst = s + r * (D + SMEM_PAD);
#pragma unroll
        for (int ci = 0; ci < CPR / TPR; ++ci) {
            const int c = c0 + ci * TPR * CHUNK;
            const bool valid = row_ok && c < d;
            cp_async_16(smem_u32(dst + c), valid ? src + c : g, valid);
        }
    }
}

/* Async copy of n fp32 values g[0, n_valid) into s[0, n), zero beyond. */
template <int N, int NT>
__device__ __forceinline__ void load_vec_async(float *s, const float *g, int n_valid, int tid)
{
#pragma unroll
    for (int it = 0; it < (N + NT - 1) / NT; ++it) {
        const int idx = it * NT + tid;
        if (N % NT == 0 || idx < N) {
            const bool valid = idx < n_valid;
            cp_async_4(smem_u32(s + idx), valid ? g + idx : g, valid);
        }
    }
}

/* Repack two adjacent n8 accumulator tiles (16 x 16, fp32) into one A fragment of the dtype. */
template <typename T>
__device__ __forceinline__ void acc_to_a(uint32_t a[4], const float c0[4], const float c1[4])
{
    a[0] = pack2<T>(c0[0], c0[1]);
    a[1] = pack2<T>(c0[2], c0[3]);
    a[2] = pack2<T>(c1[0], c1[1]);
    a[3] = pack2<T>(c1[2], c1[3]);
}

/* Add one n8 accumulator tile (rows r, r+8 of a (rows, ld) fp32 matrix at `base`, columns col0..+8)
 * into global memory. sm90: lanes pair up (xor 1) so each lane adds 4 consecutive floats of one row
 * with one vector red; sm80: 4 scalar reds. */
__device__ __forceinline__ void red_add_tile(float *base, int64_t ld, int row, bool row_ok, bool row8_ok, int col,
                                             const float c[4], int lane)
{
#if __CUDA_ARCH__ >= 900
    const bool odd = lane & 1;
    const float s0 = odd ? c[0] : c[2];
    const float s1 = odd ? c[1] : c[3];
    const float r0 = __shfl_xor_sync(FULL_MASK, s0, 1);
    const float r1 = __shfl_xor_sync(FULL_MASK, s1, 1);
    if (odd) {
        if (row8_ok)
            atomicAdd((float4 *)(base + (row + 8) * ld + col - 2), make_float4(r0, r1, c[2], c[3]));
    } else {
        if (row_ok)
            atomicAdd((float4 *)(base + row * ld + col), make_float4(c[0], c[1], r0, r1));
    }
#else
    if (row_ok) {
        atomicAdd(base + row * ld + col, c[0]);
        atomicAdd(base + row * ld + col + 1, c[1]);
    }
    if (row8_ok) {
        atomicAdd(base + (row + 8) * ld + col, c[2]);
        atomicAdd(base + (row + 8) * ld + col + 1, c[3]);
    }
#endif
}

/* ------------------------------------------------------------------------------------------------ */
/* preprocess: delta = rowsum(dO * O), zero dq_accum                                                */

/* One warp per (b, h, query row); lane l reads 8 consecutive elements at column 8l (+256). */
template <typename T>
__global__ void __launch_bounds__(PRE_WARPS *WARP_SIZE) bwd_preprocess_kernel(const flash_params p)
{
    const int lane = threadIdx.x % WARP_SIZE;
    const int64_t row = (int64_t)blockIdx.x * PRE_WARPS + threadIdx.x / WARP_SIZE; /* (b*h + hq)*sq + i */
    if (row >= p.b * p.h * p.sq)
        return;
    const int64_t i = row % p.sq, bh = row / p.sq, hq = bh % p.h, b = bh / p.h;
    const int d = (int)p.d;
    const T *o = (const T *)p.o + b * p.o_s.batch + i * p.o_s.row + hq * p.o_s.head;      /* (d) */
    const T *dout = (const T *)p.dout + b * p.do_s.batch + i * p.do_s.row + hq * p.do_s.head; /* (d) */
    float sum = 0.f;
    for (int c = lane * CHUNK; c < d; c += WARP_SIZE * CHUNK) {
        const uint4 ov = *(const uint4 *)(o + c), dv = *(const uint4 *)(dout + c);
        const uint32_t ow[4] = {ov.x, ov.y, ov.z, ov.w}, dw[4] = {dv.x, dv.y, dv.z, dv.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const float2 of = unpack2<T>(ow[k]), df = unpack2<T>(dw[k]);
            sum += of.x * df.x + of.y * df.y;
        }
    }
#pragma unroll
    for (int off = WARP_SIZE / 2; off > 0; off /= 2)
        sum += __shfl_xor_sync(FULL_MASK, sum, off);
    if (lane == 0)
        ((float *)p.delta)[row] = sum;
    if (!p.deterministic) {
        float4 *acc = (float4 *)(p.dq_accum + row * d); /* (d / 4) */
        for (int c = lane; c < d / 4; c += WARP_SIZE)
            acc[c] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* main kernel: dK, dV (and dQ partials) for one key tile                                           */

/* Write 16 x D gradient rows j0 + [0, 16) held as accumulator fragments, times `mul`: in the dtype
 * into out (b, sk, h_kv, d) when h == h_kv, else in fp32 into accum (b, sk, h, d) for this query
 * head. */
template <typename T, int D>
__device__ __forceinline__ void store_kv_grad(const flash_params &p, const float acc[D / 8][4], float mul, void *out,
                                              const flash_strides &os, float *accum, int b, int hq, int j0)
{
    const int lane = threadIdx.x % WARP_SIZE;
    const int lr = lane / 4, lc = lane % 4;
    const int sk = (int)p.sk, d = (int)p.d;
    const int64_t hk = hq / p.h_per_kv;
    const bool gqa = p.h != p.h_kv;
#pragma unroll
    for (int t = 0; t < D / 8; ++t) {
        const int col = t * 8 + 2 * lc;
#pragma unroll
        for (int h8 = 0; h8 < 2; ++h8) {
            const int j = j0 + lr + 8 * h8;
            if (t * 8 >= d || j >= sk)
                continue;
            const float v0 = acc[t][2 * h8] * mul, v1 = acc[t][2 * h8 + 1] * mul;
            if (gqa)
                *(float2 *)(accum + (((int64_t)b * sk + j) * p.h + hq) * d + col) = make_float2(v0, v1);
            else
                *(uint32_t *)((T *)out + b * os.batch + j * os.row + hk * os.head + col) = pack2<T>(v0, v1);
        }
    }
}

/* One walk over the query tiles that see keys [n0, n0 + BC) of query head hq; warp w owns keys
 * [KM*w, KM*w + KM) of the tile for S^T, dP^T, dV, dK. PASS_BOTH computes
 * dV, dK and dQ; PASS_DV only dV; PASS_DK dK and dQ. K and V are already in flight (cp.async,
 * uncommitted) or resident in smem. Writes the dK and/or dV of the tile at the end. */
template <typename T, int D, int BC, int KM, int BR, int BRS, int DQM, int PASS>
__device__ __forceinline__ void bwd_kv_pass(const flash_params &p,
                                            const T *Ks,    /* [BC][D + SMEM_PAD]    */
                                            const T *Vs,    /* [BC][D + SMEM_PAD]    */
                                            T *Qs,          /* [2][BR][D + SMEM_PAD] */
                                            T *dOs,         /* [2][BR][D + SMEM_PAD] */
                                            T *dSs,         /* [BC][BR + SMEM_PAD]   */
                                            float *lse_s,   /* [2][BR]               */
                                            float *delta_s, /* [2][BR]               */
                                            int b, int hq, int n0)
{
    constexpr int NW = BC / KM, NT = NW * WARP_SIZE, SD = D + SMEM_PAD, SS = BR + SMEM_PAD, MT = KM / 16;
    constexpr bool DO_DV = PASS != PASS_DK, DO_DK = PASS != PASS_DV;
    /* dQ step: warps split the BR x D output into WQ_M row groups of DQM and WQ_N column groups */
    constexpr int WQ_M = BR / DQM, WQ_N = NW / WQ_M, DQN = D / WQ_N, DQC = DQN < 32 ? DQN : 32;
    static_assert(NW % WQ_M == 0 && DQN % DQC == 0 && DQC % 16 == 0 && BR % BRS == 0, "tile layout");

    const int tid = threadIdx.x, warp = tid / WARP_SIZE, lane = tid % WARP_SIZE;
    const int lr = lane / 4, lc = lane % 4; /* accumulator fragment: row lr (+8), columns 2*lc, +1 */
    const int sq = (int)p.sq, sk = (int)p.sk, d = (int)p.d;
    const float sl2 = p.scale_log2;
    const bool causal = p.causal != 0;
    const bool do_dq = DO_DK && !p.deterministic;

    const T *qg = (const T *)p.q + b * p.q_s.batch + hq * p.q_s.head;         /* (sq, d), row stride q_s.row  */
    const T *dog = (const T *)p.dout + b * p.do_s.batch + hq * p.do_s.head;   /* (sq, d), row stride do_s.row */
    const int64_t bh = (int64_t)b * p.h + hq;
    const float *lseg = (const float *)p.lse + bh * sq;                       /* (sq) */
    const float *deltag = (const float *)p.delta + bh * sq;                   /* (sq) */
    float *dqa = p.dq_accum + bh * sq * d;                                    /* (sq, d) */

    const int num_m = (sq + BR - 1) / BR;
    int m_first = 0;
    if (causal) {
        const int64_t first_row = n0 - p.causal_offset; /* first query row that sees key n0 */
        m_first = first_row <= 0 ? 0 : (first_row >= sq ? num_m : (int)(first_row / BR));
    }
    const int kvalid = sk - n0; /* keys of the tile that exist */

    float acc_dv[MT][D / 8][4], acc_dk[MT][D / 8][4]; /* the one a pass does not use is optimized away */
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int t = 0; t < D / 8; ++t)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                if (DO_DV)
                    acc_dv[mt][t][e] = 0.f;
                if (DO_DK)
                    acc_dk[mt][t][e] = 0.f;
            }

    if (m_first < num_m) {
        const int m0 = m_first * BR;
        load_tile_async<T, BR, D, NT>(Qs, qg + m0 * p.q_s.row, p.q_s.row, sq - m0, d, tid);
        load_tile_async<T, BR, D, NT>(dOs, dog + m0 * p.do_s.row, p.do_s.row, sq - m0, d, tid);
        load_vec_async<BR, NT>(lse_s, lseg + m0, sq - m0, tid);
        if (DO_DK)
            load_vec_async<BR, NT>(delta_s, deltag + m0, sq - m0, tid);
    }
    cp_async_commit();

    for (int m = m_first; m < num_m; ++m) {
        const int st = (m - m_first) & 1;
        if (m + 1 < num_m) {
            const int m1 = (m + 1) * BR, so = st ^ 1;
            load_tile_async<T, BR, D, NT>(Qs + so * BR * SD, qg + m1 * p.q_s.row, p.q_s.row, sq - m1, d, tid);
            load_tile_async<T, BR, D, NT>(dOs + so * BR * SD, dog + m1 * p.do_s.row, p.do_s.row, sq - m1, d, tid);
            load_vec_async<BR, NT>(lse_s + so * BR, lseg + m1, sq - m1, tid);
            if (DO_DK)
                load_vec_async<BR, NT>(delta_s + so * BR, deltag + m1, sq - m1, tid);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();

        const T *Qt = Qs + st * BR * SD, *dOt = dOs + st * BR * SD; /* [BR][SD] */
        const float *lse_t = lse_s + st * BR, *delta_t = delta_s + st * BR;
        const int m0 = m * BR;

        /* Sub-tiles of BRS queries: S^T = K_w Q^T and dP^T = V_w dO^T (KM keys x BRS queries per
         * warp), P^T and dS^T in place, dV += P^T dO, dK += dS^T Q, dS^T -> smem for the dQ step. */
        const int diag = clamp_diag((int64_t)m0 + p.causal_offset - n0);
        const bool need_mask = (causal && BC - 1 > diag) || kvalid < BC;
#pragma unroll 1
        for (int sub = 0; sub < BR / BRS; ++sub) {
            const int i0 = sub * BRS; /* first query (local) of the sub-tile */
            float s[MT][BRS / 8][4], dp[MT][BRS / 8][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int t = 0; t < BRS / 8; ++t)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        s[mt][t][e] = 0.f;
                        dp[mt][t][e] = 0.f;
                    }
#pragma unroll 2 /* full unrolling lets ptxas hoist loads until it spills */
            for (int kk = 0; kk < D / 16; ++kk) {
                if (kk * 16 < d) {
                    uint32_t a[MT][4];
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt)
                        ldmatrix_x4(a[mt], addr_pat_a(Ks, SD, warp * KM + mt * 16, kk * 16, lane));
#pragma unroll
                    for (int np = 0; np < BRS / 16; ++np) {
                        uint32_t bq[4];
                        ldmatrix_x4(bq, addr_pat_b(Qt, SD, i0 + np * 16, kk * 16, lane));
#pragma unroll
                        for (int mt = 0; mt < MT; ++mt) {
                            mma_m16n8k16<T>(s[mt][2 * np], a[mt], bq);
                            mma_m16n8k16<T>(s[mt][2 * np + 1], a[mt], bq + 2);
                        }
                    }
                    if (DO_DK) {
#pragma unroll
                        for (int mt = 0; mt < MT; ++mt)
                            ldmatrix_x4(a[mt], addr_pat_a(Vs, SD, warp * KM + mt * 16, kk * 16, lane));
#pragma unroll
                        for (int np = 0; np < BRS / 16; ++np) {
                            uint32_t bo[4];
                            ldmatrix_x4(bo, addr_pat_b(dOt, SD, i0 + np * 16, kk * 16, lane));
#pragma unroll
                            for (int mt = 0; mt < MT; ++mt) {
                                mma_m16n8k16<T>(dp[mt][2 * np], a[mt], bo);
                                mma_m16n8k16<T>(dp[mt][2 * np + 1], a[mt], bo + 2);
                            }
                        }
                    }
                }
            }

            /* key jl (local) is visible to query il (local) iff jl - il <= diag; keys past sk are
             * masked too (their zero-filled K would give s = 0) */
#pragma unroll
            for (int t = 0; t < BRS / 8; ++t) {
                const int il = i0 + t * 8 + 2 * lc;
                const float2 lse2 = *(const float2 *)(lse_t + il);
                const float l2[2] = {lse_to_log2(lse2.x), lse_to_log2(lse2.y)};
                float dl[2] = {0.f, 0.f};
                if (DO_DK) {
                    const float2 dd = *(const float2 *)(delta_t + il);
                    dl[0] = dd.x;
                    dl[1] = dd.y;
                }
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        float pv = exp2_approx(fmaf(s[mt][t][e], sl2, -l2[e & 1]));
                        if (need_mask) {
                            const int jl = warp * KM + mt * 16 + lr + 8 * (e >> 1), ie = il + (e & 1);
                            if (jl >= kvalid || (causal && jl - ie > diag))
                                pv = 0.f;
                        }
                        s[mt][t][e] = pv;
                        if (DO_DK)
                            dp[mt][t][e] = pv * (dp[mt][t][e] - dl[e & 1]);
                    }
            }

#pragma unroll
            for (int kk = 0; kk < BRS / 16; ++kk) {
                const int k0 = i0 + kk * 16;
                if (DO_DV) {
                    uint32_t a[MT][4];
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt)
                        acc_to_a<T>(a[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
#pragma unroll
                    for (int np = 0; np < D / 16; ++np) {
                        if (np * 16 < d) {
                            uint32_t bo[4];
                            ldmatrix_x4_trans(bo, addr_pat_a(dOt, SD, k0, np * 16, lane));
#pragma unroll
                            for (int mt = 0; mt < MT; ++mt) {
                                mma_m16n8k16<T>(acc_dv[mt][2 * np], a[mt], bo);
                                mma_m16n8k16<T>(acc_dv[mt][2 * np + 1], a[mt], bo + 2);
                            }
                        }
                    }
                }
                if (DO_DK) {
                    uint32_t a[MT][4];
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt)
                        acc_to_a<T>(a[mt], dp[mt][2 * kk], dp[mt][2 * kk + 1]);
#pragma unroll
                    for (int np = 0; np < D / 16; ++np) {
                        if (np * 16 < d) {
                            uint32_t bq[4];
                            ldmatrix_x4_trans(bq, addr_pat_a(Qt, SD, k0, np * 16, lane));
#pragma unroll
                            for (int mt = 0; mt < MT; ++mt) {
                                mma_m16n8k16<T>(acc_dk[mt][2 * np], a[mt], bq);
                                mma_m16n8k16<T>(acc_dk[mt][2 * np + 1], a[mt], bq + 2);
                            }
                        }
                    }
                    if (do_dq) {
#pragma unroll
                        for (int mt = 0; mt < MT; ++mt) {
                            const int r = warp * KM + mt * 16 + lr;
                            uint32_t *row0 = (uint32_t *)(dSs + r * SS + k0 + 2 * lc);
                            uint32_t *row8 = (uint32_t *)(dSs + (r + 8) * SS + k0 + 2 * lc);
                            row0[0] = a[mt][0];
                            row8[0] = a[mt][1];
                            row0[4] = a[mt][2];
                            row8[4] = a[mt][3];
                        }
                    }
                }
            }
        }
        __syncthreads(); /* dS^T visible; this stage of Q/dO free for the prefetch after next */

        if (do_dq) {
            /* dQ_partial (BR x D) = dS K: warp (wm, wn) owns rows [DQM*wm, +DQM) and columns
             * [DQN*wn, +DQN), done in chunks of DQC columns */
            const int wm = warp % WQ_M, wn = warp / WQ_M;
#pragma unroll
            for (int ch = 0; ch < DQN / DQC; ++ch) {
                const int cb = wn * DQN + ch * DQC; /* first column of the chunk */
                if (cb >= d)
                    break;
                float acc[DQM / 16][DQC / 8][4];
#pragma unroll
                for (int mt = 0; mt < DQM / 16; ++mt)
#pragma unroll
                    for (int t = 0; t < DQC / 8; ++t)
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            acc[mt][t][e] = 0.f;
#pragma unroll
                for (int kk = 0; kk < BC / 16; ++kk) {
                    uint32_t a[DQM / 16][4];
#pragma unroll
                    for (int mt = 0; mt < DQM / 16; ++mt)
                        ldmatrix_x4_trans(a[mt], addr_pat_b(dSs, SS, kk * 16, wm * DQM + mt * 16, lane));
#pragma unroll
                    for (int np = 0; np < DQC / 16; ++np) {
                        if (cb + np * 16 < d) {
                            uint32_t bk[4];
                            ldmatrix_x4_trans(bk, addr_pat_a(Ks, SD, kk * 16, cb + np * 16, lane));
#pragma unroll
                            for (int mt = 0; mt < DQM / 16; ++mt) {
                                mma_m16n8k16<T>(acc[mt][2 * np], a[mt], bk);
                                mma_m16n8k16<T>(acc[mt][2 * np + 1], a[mt], bk + 2);
                            }
                        }
                    }
                }
#pragma unroll
                for (int mt = 0; mt < DQM / 16; ++mt) {
                    const int row = m0 + wm * DQM + mt * 16 + lr;
#pragma unroll
                    for (int t = 0; t < DQC / 8; ++t) {
                        if (cb + t * 8 < d) /* warp-uniform: the shuffles inside need all lanes */
                            red_add_tile(dqa, d, row, row < sq, row + 8 < sq, cb + t * 8 + 2 * lc, acc[mt][t], lane);
                    }
                }
            }
        }
    }

    /* write dV and/or dK (dK scaled) */
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        const int j0 = n0 + warp * KM + mt * 16;
        if (DO_DV)
            store_kv_grad<T, D>(p, acc_dv[mt], 1.f, p.dv, p.dv_s, p.dv_accum, b, hq, j0);
        if (DO_DK)
            store_kv_grad<T, D>(p, acc_dk[mt], (float)p.scale, p.dk, p.dk_s, p.dk_accum, b, hq, j0);
    }
}

template <typename T, int D, int BC, int KM, int BR, int BRS, int DQM, bool TWO_PASS>
__global__ void __launch_bounds__(BC / KM * WARP_SIZE, 1) bwd_main_kernel(const flash_params p)
{
    constexpr int NT = BC / KM * WARP_SIZE, SD = D + SMEM_PAD, SS = BR + SMEM_PAD;
    extern __shared__ __align__(16) uint8_t smem[];
    T *Ks = (T *)smem;                       /* [BC][SD]     */
    T *Vs = Ks + BC * SD;                    /* [BC][SD]     */
    T *Qs = Vs + BC * SD;                    /* [2][BR][SD]  */
    T *dOs = Qs + 2 * BR * SD;               /* [2][BR][SD]  */
    T *dSs = dOs + 2 * BR * SD;              /* [BC][SS]     */
    float *lse_s = (float *)(dSs + BC * SS); /* [2][BR]      */
    float *delta_s = lse_s + 2 * BR;         /* [2][BR]      */

    const int n0 = blockIdx.x * BC, hq = blockIdx.y, b = blockIdx.z;
    const int64_t hk = hq / p.h_per_kv;
    const int sk = (int)p.sk, d = (int)p.d;
    const T *kg = (const T *)p.k + b * p.k_s.batch + hk * p.k_s.head + n0 * p.k_s.row; /* (sk - n0, d) */
    const T *vg = (const T *)p.v + b * p.v_s.batch + hk * p.v_s.head + n0 * p.v_s.row; /* (sk - n0, d) */
    load_tile_async<T, BC, D, NT>(Ks, kg, p.k_s.row, sk - n0, d, threadIdx.x);
    load_tile_async<T, BC, D, NT>(Vs, vg, p.v_s.row, sk - n0, d, threadIdx.x);

    if (TWO_PASS) {
        bwd_kv_pass<T, D, BC, KM, BR, BRS, DQM, PASS_DV>(p, Ks, Vs, Qs, dOs, dSs, lse_s, delta_s, b, hq, n0);
        bwd_kv_pass<T, D, BC, KM, BR, BRS, DQM, PASS_DK>(p, Ks, Vs, Qs, dOs, dSs, lse_s, delta_s, b, hq, n0);
    } else {
        bwd_kv_pass<T, D, BC, KM, BR, BRS, DQM, PASS_BOTH>(p, Ks, Vs, Qs, dOs, dSs, lse_s, delta_s, b, hq, n0);
    }
    cp_async_wait<0>();
}

/* ------------------------------------------------------------------------------------------------ */
/* deterministic dQ kernel                                                                          */

template <typename T, int D, int BRQ, int BCQ>
__global__ void __launch_bounds__(BRQ / 16 * WARP_SIZE, 1) bwd_dq_kernel(const flash_params p)
{
    constexpr int NW = BRQ / 16, NT = NW * WARP_SIZE, SD = D + SMEM_PAD;
    extern __shared__ __align__(16) uint8_t smem[];
    T *Qs = (T *)smem;              /* [BRQ][SD]     */
    T *dOs = Qs + BRQ * SD;         /* [BRQ][SD]     */
    T *Ks = dOs + BRQ * SD;         /* [2][BCQ][SD]  */
    T *Vs = Ks + 2 * BCQ * SD;      /* [2][BCQ][SD]  */

    const int tid = threadIdx.x, warp = tid / WARP_SIZE, lane = tid % WARP_SIZE;
    const int lr = lane / 4, lc = lane % 4;
    const int m0 = blockIdx.x * BRQ, hq = blockIdx.y, b = blockIdx.z;
    const int64_t hk = hq / p.h_per_kv;
    const int sq = (int)p.sq, sk = (int)p.sk, d = (int)p.d;
    const float sl2 = p.scale_log2;
    const bool causal = p.causal != 0;

    const T *qg = (const T *)p.q + b * p.q_s.batch + hq * p.q_s.head + m0 * p.q_s.row;       /* (sq - m0, d) */
    const T *dog = (const T *)p.dout + b * p.do_s.batch + hq * p.do_s.head + m0 * p.do_s.row; /* (sq - m0, d) */
    const T *kg = (const T *)p.k + b * p.k_s.batch + hk * p.k_s.head;                         /* (sk, d) */
    const T *vg = (const T *)p.v + b * p.v_s.batch + hk * p.v_s.head;                         /* (sk, d) */
    const int64_t bh = (int64_t)b * p.h + hq;

    /* this lane's two query rows: lr and lr + 8 of the warp's 16 */
    float l2[2], dl[2];
#pragma unroll
    for (int h8 = 0; h8 < 2; ++h8) {
        const int i = m0 + warp * 16 + lr + 8 * h8;
        l2[h8] = i < sq ? lse_to_log2(((const float *)p.lse)[bh * sq + i]) : INFINITY;
        dl[h8] = i < sq ? ((const float *)p.delta)[bh * sq + i] : 0.f;
    }

    int n_tiles = (sk + BCQ - 1) / BCQ;
    if (causal) {
        const int64_t last = (int64_t)m0 + BRQ - 1 + p.causal_offset; /* last key any row of the tile sees */
        n_tiles = last < 0 ? 0 : (int)((last < sk - 1 ? last : sk - 1) / BCQ + 1);
    }

    load_tile_async<T, BRQ, D, NT>(Qs, qg, p.q_s.row, sq - m0, d, tid);
    load_tile_async<T, BRQ, D, NT>(dOs, dog, p.do_s.row, sq - m0, d, tid);
    if (n_tiles > 0) {
        load_tile_async<T, BCQ, D, NT>(Ks, kg, p.k_s.row, sk, d, tid);
        load_tile_async<T, BCQ, D, NT>(Vs, vg, p.v_s.row, sk, d, tid);
    }
    cp_async_commit();

    float acc[D / 8][4];
#pragma unroll
    for (int t = 0; t < D / 8; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            acc[t][e] = 0.f;

    for (int n = 0; n < n_tiles; ++n) {
        const int st = n & 1, n0 = n * BCQ;
        if (n + 1 < n_tiles) {
            const int n1 = n0 + BCQ, so = st ^ 1;
            load_tile_async<T, BCQ, D, NT>(Ks + so * BCQ * SD, kg + n1 * p.k_s.row, p.k_s.row, sk - n1, d, tid);
            load_tile_async<T, BCQ, D, NT>(Vs + so * BCQ * SD, vg + n1 * p.v_s.row, p.v_s.row, sk - n1, d, tid);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const T *Kt = Ks + st * BCQ * SD, *Vt = Vs + st * BCQ * SD; /* [BCQ][SD] */

        /* S = Q_w K^T, dP = dO_w V^T: 16 queries x BCQ keys per warp */
        float s[BCQ / 8][4], dp[BCQ / 8][4];
#pragma unroll
        for (int t = 0; t < BCQ / 8; ++t)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s[t][e] = 0.f;
                dp[t][e] = 0.f;
            }
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            if (kk * 16 < d) {
                uint32_t a[4];
                ldmatrix_x4(a, addr_pat_a(Qs, SD, warp * 16, kk * 16, lane));
#pragma unroll
                for (int np = 0; np < BCQ / 16; ++np) {
                    uint32_t bk[4];
                    ldmatrix_x4(bk, addr_pat_b(Kt, SD, np * 16, kk * 16, lane));
                    mma_m16n8k16<T>(s[2 * np], a, bk);
                    mma_m16n8k16<T>(s[2 * np + 1], a, bk + 2);
                }
                ldmatrix_x4(a, addr_pat_a(dOs, SD, warp * 16, kk * 16, lane));
#pragma unroll
                for (int np = 0; np < BCQ / 16; ++np) {
                    uint32_t bv[4];
                    ldmatrix_x4(bv, addr_pat_b(Vt, SD, np * 16, kk * 16, lane));
                    mma_m16n8k16<T>(dp[2 * np], a, bv);
                    mma_m16n8k16<T>(dp[2 * np + 1], a, bv + 2);
                }
            }
        }

        /* dS = P o (dP - delta); query il (local) sees key jl (local) iff jl - il <= diag */
        const int diag = clamp_diag((int64_t)m0 + p.causal_offset - n0);
        const int kvalid = sk - n0;
        const bool need_mask = (causal && BCQ - 1 > diag) || kvalid < BCQ;
#pragma unroll
        for (int t = 0; t < BCQ / 8; ++t)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float pv = exp2_approx(fmaf(s[t][e], sl2, -l2[e >> 1]));
                if (need_mask) {
                    const int jl = t * 8 + 2 * lc + (e & 1), il = warp * 16 + lr + 8 * (e >> 1);
                    if (jl >= kvalid || (causal && jl - il > diag))
                        pv = 0.f;
                }
                dp[t][e] = pv * (dp[t][e] - dl[e >> 1]);
            }

        /* dQ += dS K */
#pragma unroll
        for (int kk = 0; kk < BCQ / 16; ++kk) {
            uint32_t a[4];
            acc_to_a<T>(a, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
            for (int np = 0; np < D / 16; ++np) {
                if (np * 16 < d) {
                    uint32_t bk[4];
                    ldmatrix_x4_trans(bk, addr_pat_a(Kt, SD, kk * 16, np * 16, lane));
                    mma_m16n8k16<T>(acc[2 * np], a, bk);
                    mma_m16n8k16<T>(acc[2 * np + 1], a, bk + 2);
                }
            }
        }
        __syncthreads(); /* this K/V stage is free for the prefetch after next */
    }
    cp_async_wait<0>();

    const float scale = (float)p.scale;
#pragma unroll
    for (int t = 0; t < D / 8; ++t) {
        const int col = t * 8 + 2 * lc;
        if (t * 8 >= d)
            continue;
#pragma unroll
        for (int h8 = 0; h8 < 2; ++h8) {
            const int i = m0 + warp * 16 + lr + 8 * h8;
            if (i < sq) {
                T *out = (T *)p.dq + b * p.dq_s.batch + (int64_t)i * p.dq_s.row + hq * p.dq_s.head + col;
                *(uint32_t *)out = pack2<T>(acc[t][2 * h8] * scale, acc[t][2 * h8 + 1] * scale);
            }
        }
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* postprocess                                                                                      */

/* One thread per 8 consecutive elements of dq: dq = dq_accum * scale. */
template <typename T>
__global__ void __launch_bounds__(POST_THREADS) bwd_dq_post_kernel(const flash_params p)
{
    const int64_t idx = (int64_t)blockIdx.x * POST_THREADS + threadIdx.x;
    const int d = (int)p.d, cpr = d / CHUNK;
    if (idx >= p.b * p.h * p.sq * cpr)
        return;
    const int c = (int)(idx % cpr) * CHUNK;
    const int64_t row = idx / cpr, i = row % p.sq, bh = row / p.sq, hq = bh % p.h, b = bh / p.h;
    const float scale = (float)p.scale;
    const float4 *src = (const float4 *)(p.dq_accum + row * d + c); /* (8) of (b, h, sq, d) */
    const float4 x = src[0], y = src[1];
    uint4 out;
    out.x = pack2<T>(x.x * scale, x.y * scale);
    out.y = pack2<T>(x.z * scale, x.w * scale);
    out.z = pack2<T>(y.x * scale, y.y * scale);
    out.w = pack2<T>(y.z * scale, y.w * scale);
    *(uint4 *)((T *)p.dq + b * p.dq_s.batch + i * p.dq_s.row + hq * p.dq_s.head + c) = out;
}

/* GQA: one thread per 8 consecutive elements of dk and dv: the sum over the group's query heads,
 * in head order. */
template <typename T>
__global__ void __launch_bounds__(POST_THREADS) bwd_dkv_post_kernel(const flash_params p)
{
    const int64_t idx = (int64_t)blockIdx.x * POST_THREADS + threadIdx.x;
    const int d = (int)p.d, cpr = d / CHUNK;
    if (idx >= p.b * p.sk * p.h_kv * cpr)
        return;
    const int c = (int)(idx % cpr) * CHUNK;
    const int64_t row = idx / cpr, hk = row % p.h_kv, bj = row / p.h_kv, j = bj % p.sk, b = bj / p.sk;
#pragma unroll
    for (int which = 0; which < 2; ++which) {
        const float *acc = which == 0 ? p.dk_accum : p.dv_accum; /* (b, sk, h, d) */
        const float *src = acc + (bj * p.h + hk * p.h_per_kv) * d + c;
        float v[CHUNK] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int64_t g = 0; g < p.h_per_kv; ++g) {
            const float4 x = ((const float4 *)(src + g * d))[0], y = ((const float4 *)(src + g * d))[1];
            v[0] += x.x; v[1] += x.y; v[2] += x.z; v[3] += x.w;
            v[4] += y.x; v[5] += y.y; v[6] += y.z; v[7] += y.w;
        }
        uint4 out;
        out.x = pack2<T>(v[0], v[1]);
        out.y = pack2<T>(v[2], v[3]);
        out.z = pack2<T>(v[4], v[5]);
        out.w = pack2<T>(v[6], v[7]);
        const flash_strides &os = which == 0 ? p.dk_s : p.dv_s;
        *(uint4 *)((T *)(which == 0 ? p.dk : p.dv) + b * os.batch + j * os.row + hk * os.head + c) = out;
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* launch                                                                                           */

static unsigned int blocks_for(int64_t items, int per_block)
{
    return (unsigned int)((items + per_block - 1) / per_block);
}

/* Tile parameters: D head dim (padded), BC keys per CTA, KM keys per warp, BR queries per pipeline
 * stage, BRS queries per register sub-tile, DQM query rows per warp in the dQ step, TWO_PASS (dV in
 * one walk, dK and dQ in a second), BRQ x BCQ the tile of the deterministic dQ kernel. */
template <typename T, int D, int BC, int KM, int BR, int BRS, int DQM, bool TWO_PASS, int BRQ, int BCQ>
static cudaError_t run_bwd(const flash_params *p, cudaStream_t stream)
{
    cudaError_t err;
    const flash_params pv = *p;

    bwd_preprocess_kernel<T><<<blocks_for(p->b * p->h * p->sq, PRE_WARPS), PRE_WARPS * WARP_SIZE, 0, stream>>>(pv);
    if ((err = cudaGetLastError()) != cudaSuccess)
        return err;

    {
        constexpr int SD = D + SMEM_PAD, SS = BR + SMEM_PAD;
        const size_t smem = (size_t)(2 * BC * SD + 4 * BR * SD + BC * SS) * sizeof(T) + 4 * BR * sizeof(float);
        auto kernel = bwd_main_kernel<T, D, BC, KM, BR, BRS, DQM, TWO_PASS>;
        if ((err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)) != cudaSuccess)
            return err;
        const dim3 grid(blocks_for(p->sk, BC), (unsigned int)p->h, (unsigned int)p->b);
        kernel<<<grid, BC / KM * WARP_SIZE, smem, stream>>>(pv);
        if ((err = cudaGetLastError()) != cudaSuccess)
            return err;
    }

    if (p->deterministic) {
        constexpr int SD = D + SMEM_PAD;
        const size_t smem = (size_t)(2 * BRQ * SD + 4 * BCQ * SD) * sizeof(T);
        auto kernel = bwd_dq_kernel<T, D, BRQ, BCQ>;
        if ((err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)) != cudaSuccess)
            return err;
        const dim3 grid(blocks_for(p->sq, BRQ), (unsigned int)p->h, (unsigned int)p->b);
        kernel<<<grid, BRQ / 16 * WARP_SIZE, smem, stream>>>(pv);
    } else {
        bwd_dq_post_kernel<T><<<blocks_for(p->b * p->h * p->sq * (p->d / CHUNK), POST_THREADS), POST_THREADS, 0, stream>>>(pv);
    }
    if ((err = cudaGetLastError()) != cudaSuccess)
        return err;

    if (p->h != p->h_kv) {
        bwd_dkv_post_kernel<T><<<blocks_for(p->b * p->sk * p->h_kv * (p->d / CHUNK), POST_THREADS), POST_THREADS, 0, stream>>>(pv);
        if ((err = cudaGetLastError()) != cudaSuccess)
            return err;
    }
    return cudaSuccess;
}

template <typename T>
static cudaError_t run_bwd_dtype(const flash_params *p, cudaStream_t stream)
{
    if (p->d <= 64)
        return run_bwd<T, 64, 256, 32, 128, 32, 32, false, 128, 64>(p, stream);
    if (p->d <= 128)
        return run_bwd<T, 128, 128, 16, 64, 32, 32, false, 128, 64>(p, stream);
    return run_bwd<T, 256, 128, 16, 32, 32, 32, true, 64, 32>(p, stream);
}

static int aligned16(const void *ptr)
{
    return ((uintptr_t)ptr % 16) == 0;
}

static int strides_ok(const flash_strides *s)
{
    return s->batch % CHUNK == 0 && s->row % CHUNK == 0 && s->head % CHUNK == 0;
}

extern "C" cudaError_t flash_bwd_sm80(const flash_params *p, cudaStream_t stream)
{
    if (p->d % CHUNK != 0 || p->d > 256 || p->h_kv < 1 || p->h % p->h_kv != 0)
        return cudaErrorInvalidValue;
    const void *ptrs[] = {p->q, p->k, p->v, p->o, p->dout, p->dq, p->dk, p->dv, p->dq_accum};
    for (unsigned int i = 0; i < sizeof(ptrs) / sizeof(ptrs[0]); ++i)
        if (!aligned16(ptrs[i]))
            return cudaErrorInvalidValue;
    const flash_strides *ss[] = {&p->q_s, &p->k_s, &p->v_s, &p->o_s, &p->do_s, &p->dq_s, &p->dk_s, &p->dv_s};
    for (unsigned int i = 0; i < sizeof(ss) / sizeof(ss[0]); ++i)
        if (!strides_ok(ss[i]))
            return cudaErrorInvalidValue;
    if (p->b == 0 || p->h == 0 || p->sq == 0 || p->sk == 0 || p->d == 0)
        return cudaSuccess;
    if (p->dtype == FLASH_BF16)
        return run_bwd_dtype<__nv_bfloat16>(p, stream);
    if (p->dtype == FLASH_FP16)
        return run_bwd_dtype<__half>(p, stream);
    return cudaErrorInvalidValue;
}
