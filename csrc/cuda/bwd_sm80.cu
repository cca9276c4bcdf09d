/* bwd_sm80.cu: FlashAttention-2 backward for fp16/bf16 on mma.sync m16n8k16 (fp32 accumulators),
 * sm80 and later. On Hopper (sm_90a builds) its main kernel is replaced by bwd_sm90.cu's (all head dims);
 * preprocess, postprocess and the deterministic dQ kernel are this file's on every GPU.
 *
 * Algorithm (nothing of size sq x sk is ever stored):
 *   1. bwd_preprocess_kernel: delta_i = rowsum(dO_i * O_i) in fp32; zeroes the dq_accum row.
 *   2. bwd_main_kernel, grid (key tiles, h, b): a CTA owns BC keys of one query head. K and V of the
 *      tile are loaded once (cp.async); the CTA walks the query tiles of BR rows that can see the tile
 *      (causal: from the first visible one), Q/dO/lse/delta double-buffered through cp.async:
 *        S^T  = K Q^T                      P^T = exp2(S^T * scale*log2e - lse*log2e), 0 where masked
 *        dP^T - delta = V dO^T - delta     dS^T = P^T o (dP^T - delta)  (accumulated onto -delta)
 *        P^T, dS^T -> smem once            (and kept in registers by the warp that computed them)
 *        dV += P^T dO    dK += dS^T Q
 *        dQ_partial = dS K                 (dS^T read back with ldmatrix.trans), added to the fp32
 *                                          dq_accum with vector red.add (sm90) or scalar red.add (sm80).
 *      dK is scaled by `scale` at the end and written in the dtype (h == h_kv) or, for GQA, as fp32
 *      per query head into dk_accum/dv_accum.
 *   3. bwd_dq_post_kernel: dq = dq_accum * scale in the dtype; bwd_dkv_post_kernel (GQA only):
 *      dk/dv = sum over the h/h_kv query heads of dk_accum/dv_accum, in a fixed order.
 *   Deterministic mode (p->deterministic): the main kernel skips dQ; bwd_dq_kernel, grid (query
 *   tiles, h, b), walks the key tiles in order recomputing S, P, dP, dS, keeps dQ in registers and
 *   writes dq directly. Bitwise reproducible; costs S and dP twice.
 *
 * Warps' roles (main kernel, 8 warps in a WK x WQ grid, WQ = 8 / WK): warp (wk, wq) computes S^T and
 * dP^T for keys [KW*wk, +KW) x queries [QW*wq, +QW) of the tile (KW = BC/WK, QW = BR/WQ), and owns
 * dK and dV of the same keys x columns [DW*wq, +DW) (DW = D/WQ) as fp32 accumulator fragments in
 * registers. dV and dK need P^T and dS^T of those keys for all BR queries: the warp's own QW queries
 * come from its registers, the other WQ-1 groups from smem, where each warp stores its tile once.
 * dQ: the warps split the BR x D output into DQ_WM row groups x 8/DQ_WM column groups, in chunks
 * of DQC columns. Operand traffic (ldmatrix.x4 per mma) at D=128: S^T and dP^T 0.5, dV and dK 0.31,
 * dQ 0.5 -- 0.43 overall, against 0.6 for the previous layout (warp w owning 16 keys for all
 * queries), whose ncu profile was bound by shared memory. dQ kernel: warp w owns query rows
 * [16w, 16w+16) of the tile and all BCQ keys of each key tile.
 * Between the smem loads and the mma's of the main kernel there are no branches (ptxas then keeps
 * several ldmatrix in flight ahead of the mma's that use them): columns past d are zero in smem and
 * are computed like the others, only the global writes are guarded; head dims other than 64/128/256
 * pay for this with the work of the padding (e.g. 25% of it at d=96).
 *
 * Tiles (D = head dim rounded up to 64/128/256; smem rows padded by 16 bytes so that ldmatrix and
 * the fragment stores are bank-conflict free; warp tiles keys x queries for S^T, keys x columns
 * for dK/dV, rows x columns for dQ):
 *   D=64 : BC=128 x BR=128, WK=4: S^T 32x64, dK/dV 32x32, dQ 32x32; 178 KB smem.
 *   D=128: BC=128 x BR=64,  WK=4: S^T 32x32, dK/dV 32x64, dQ 32x32; 173 KB smem.
 *   D=256: BC=64  x BR=64,  WK=2: S^T 32x16, dK/dV 32x64, dQ 32x64 in two chunks of 32; 217 KB smem
 *          (the dK/dV accumulators of 128 keys would not fit in registers).
 *   dQ kernel (deterministic mode): D=64/128 BRQ=128 x BCQ=64, 8 warps; D=256 BRQ=64 x BCQ=32, 4 warps.
 *   These need sm90's 227 KB. With less (run_bwd_dtype asks the device): D=64 BC=64 x BR=64, WK=2
 *   (75 KB); D=128 BC=64 x BR=32, WK=4, dQ kernel 64 x 32 (80 KB); D=256 BC=64 x BR=32, WK=4 (142 KB):
 *   A100 (163 KB) runs all three, sm86/sm89 (99 KB) d <= 128 only.
 * All kernels: no register spills for sm_80 and sm_90a (ptxas -v; the main kernel needs the lane and
 * warp index re-read in each step, see lane_now); one CTA of 8 warps per SM. The smem sizes exceed
 * the 163 KB of sm_80 (A100) at D=128 and beyond; they fit sm_90 (227 KB).
 * Requirements (checked, cudaErrorInvalidValue otherwise): d % 8 == 0, d <= 256, 16-byte aligned
 * base pointers, batch/row/head strides multiples of 8 elements.
 *
 * Measured on the H200 (dev/bwd_harness.cu time; bf16, 16k tokens, nheads = 2048/d, CUDA events,
 * median of 10, whole backward incl. pre/postprocess; bwd FLOPs = 2.5 * 4*B*H*Sq*Sk*D, halved for
 * causal), TFLOP/s:
 *                     s512  s2048  s8192 | causal: s512  s2048  s8192
 *   d64                151   197    213  |         102    170    206
 *   d128               182   238    258  |         122    199    242
 *   d256               141   168    177  |         105    149    177
 *   deterministic mode, d128 s8192: 182 (causal 171).
 * torch's flash backend (FA2) on this H200: 276 (d64 s8k), 251 (d128 s2k), 296 (d128 s8k), 257 (d256).
 * History (whole backward, s8192 d64/d128/d256, non-causal): 1. warp owns 16 keys (all queries),
 * DQM=16: 200/208/163. 2. DQM=32: 205/218/171. 3. D=64 with 32 keys per warp, BC=256: 263 at d64
 * (ncu d128 s2048: smem pipe 71% busy, tensor 31%). 4. 2D warp grid, P^T/dS^T through smem, no
 * branches in the mma loops: 213/258/177
 * (d64 loses to version 3's 256-key tile, 261, but that one needs 214 KB of smem at d64).
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "launch.h"
#include "bwd_common.cuh"
#include "ptx.cuh"


/* 16 bytes of padding per shared-memory row: 8 consecutive rows then start in 8 distinct 16-byte
 * bank groups, so ldmatrix (plain and .trans) and 4-byte fragment stores have no conflicts. */
#define SMEM_PAD 8

#define PRE_WARPS 8        /* rows per block of the preprocess kernel */
#define POST_THREADS 256   /* threads per block of the postprocess kernels */
#define MAIN_WARPS 8       /* warps per CTA of the main kernel */


/* ------------------------------------------------------------------------------------------------ */
/* small helpers                                                                                    */

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

/* This thread's lane and warp, read from the special registers at every call (volatile: never merged
 * or hoisted), so that the lane- and warp-derived smem addresses are recomputed in each step of the
 * main loop instead of staying pinned in registers across it (that is what keeps the main kernel
 * free of spills at 255 registers). */
__device__ __forceinline__ int lane_now(void)
{
    int r;
    asm volatile("mov.u32 %0, %%laneid;\n" : "=r"(r));
    return r;
}

__device__ __forceinline__ int warp_now(void)
{
    int r;
    asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(r));
    return r / WARP_SIZE;
}

/* Store a 16 x 16 A fragment (layout of acc_to_a) at rows row0 + [0, 16), columns col0 + [0, 16) of a
 * row-major smem tile with row stride `ld` elements. */
template <typename T>
__device__ __forceinline__ void store_a_frag(T *s, int ld, int row0, int col0, const uint32_t a[4], int lane)
{
    uint32_t *row_lo = (uint32_t *)(s + (row0 + lane / 4) * ld + col0 + 2 * (lane % 4));
    uint32_t *row_hi = (uint32_t *)(s + (row0 + lane / 4 + 8) * ld + col0 + 2 * (lane % 4));
    row_lo[0] = a[0];
    row_hi[0] = a[1];
    row_lo[4] = a[2];
    row_hi[4] = a[3];
}

/* One k16 step of dV or dK: acc (keys [key0, +16 MT) x columns [col0, +DW)) += A B over the 16
 * queries from q0. A (keys x queries, P^T or dS^T) goes into a: this warp's own fragments own[.][kq]
 * when the queries are its own group, else read from the smem tile As [keys][SS]; B (queries x
 * columns, dO or Q) is read from the smem tile Bs [queries][SD], transposed by ldmatrix. The dV and
 * dK steps share the caller's a (with a fresh array per call ptxas schedules the d64 kernels
 * differently). */
template <typename T, int MT, int QK, int DW, int SS, int SD>
__device__ __forceinline__ void mma_kv_step(float acc[MT][DW / 8][4], uint32_t a[MT][4], const uint32_t own[MT][QK][4],
                                            bool use_own, const T *As, const T *Bs, int kq, int key0, int q0, int col0,
                                            int lane)
{
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        if (use_own) {
#pragma unroll
            for (int r = 0; r < 4; ++r)
                a[mt][r] = own[mt][kq][r];
        } else {
            ldmatrix_x4(a[mt], addr_pat_a(As, SS, key0 + mt * 16, q0, lane));
        }
    }
#pragma unroll
    for (int np = 0; np < DW / 16; ++np) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, addr_pat_a(Bs, SD, q0, col0 + np * 16, lane));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            mma_m16n8k16<T>(acc[mt][2 * np], a[mt], b);
            mma_m16n8k16<T>(acc[mt][2 * np + 1], a[mt], b + 2);
        }
    }
}

/* One CTA per (key tile of BC keys, query head, batch); walks the query tiles of BR rows that can see
 * the key tile. Warp (wk, wq) = (warp % WK, warp / WK) owns keys [KW*wk, +KW) x queries [QW*wq, +QW)
 * of S^T and dP^T, and keys [KW*wk, +KW) x columns [DW*wq, +DW) of dV and dK: the P^T and dS^T
 * operands of its own queries come from its registers, those of the other WQ-1 query groups from
 * shared memory. dQ: warp (warp % DQ_WM, warp / DQ_WM) owns rows [DQM*., +DQM) x columns [DQN*., +DQN)
 * of the tile, in chunks of DQC columns. Columns past d are zero in smem and computed like the others
 * (no branches between the loads and the mma's); only the global writes are guarded. */
template <typename T, int D, int BC, int BR, int WK, int DQ_WM, int DQC>
__global__ void __launch_bounds__(MAIN_WARPS *WARP_SIZE, 1) bwd_main_kernel(const flash_params p)
{
    constexpr int NT = MAIN_WARPS * WARP_SIZE, SD = D + SMEM_PAD, SS = BR + SMEM_PAD;
    constexpr int WQ = MAIN_WARPS / WK;                    /* warps along the queries of S^T */
    constexpr int KW = BC / WK, QW = BR / WQ, DW = D / WQ; /* warp tile edges */
    constexpr int MT = KW / 16, QK = QW / 16;              /* m16 key tiles, k16 query steps */
    constexpr int DQ_WN = MAIN_WARPS / DQ_WM, DQM = BR / DQ_WM, DQN = D / DQ_WN;
    static_assert(MAIN_WARPS % WK == 0 && KW % 16 == 0 && QW % 16 == 0 && DW % 16 == 0, "S^T / dK, dV warp tiles");
    static_assert(MAIN_WARPS % DQ_WM == 0 && DQM % 16 == 0 && DQN % DQC == 0 && DQC % 16 == 0, "dQ warp tiles");

    extern __shared__ __align__(16) uint8_t smem[];
    T *Ks = (T *)smem;                       /* [BC][SD]     */
    T *Vs = Ks + BC * SD;                    /* [BC][SD]     */
    T *Qs = Vs + BC * SD;                    /* [2][BR][SD]  */
    T *dOs = Qs + 2 * BR * SD;               /* [2][BR][SD]  */
    T *Ps = dOs + 2 * BR * SD;               /* [BC][SS]     P^T of the current query tile  */
    T *dSs = Ps + BC * SS;                   /* [BC][SS]     dS^T of the current query tile */
    float *lse_s = (float *)(dSs + BC * SS); /* [2][BR]      */
    float *delta_s = lse_s + 2 * BR;         /* [2][BR]      */

    const int tid = threadIdx.x;
    const int n0 = blockIdx.x * BC, hq = blockIdx.y, b = blockIdx.z;
    const int64_t hk = hq / p.h_per_kv;
    const int sq = (int)p.sq, sk = (int)p.sk, d = (int)p.d;
    const float sl2 = p.scale_log2;
    const bool causal = p.causal != 0;
    const bool do_dq = !p.deterministic;

    const T *kg = (const T *)p.k + b * p.k_s.batch + hk * p.k_s.head + n0 * p.k_s.row; /* (sk - n0, d) */
    const T *vg = (const T *)p.v + b * p.v_s.batch + hk * p.v_s.head + n0 * p.v_s.row; /* (sk - n0, d) */
    const T *qg = (const T *)p.q + b * p.q_s.batch + hq * p.q_s.head;                   /* (sq, d) */
    const T *dog = (const T *)p.dout + b * p.do_s.batch + hq * p.do_s.head;             /* (sq, d) */
    const int64_t bh = (int64_t)b * p.h + hq;
    const float *lseg = (const float *)p.lse + bh * sq;     /* (sq) */
    const float *deltag = (const float *)p.delta + bh * sq; /* (sq) */
    float *dqa = p.dq_accum + bh * sq * d;                  /* (sq, d) */

    const int num_m = (sq + BR - 1) / BR;
    const int m_first = first_query_tile<BR>(causal, p.causal_offset, n0, sq, num_m);
    const int kvalid = sk - n0; /* keys of the tile that exist */

    load_tile_async<T, BC, D, NT>(Ks, kg, p.k_s.row, kvalid, d, tid);
    load_tile_async<T, BC, D, NT>(Vs, vg, p.v_s.row, kvalid, d, tid);
    if (m_first < num_m) {
        const int m0 = m_first * BR;
        load_tile_async<T, BR, D, NT>(Qs, qg + m0 * p.q_s.row, p.q_s.row, sq - m0, d, tid);
        load_tile_async<T, BR, D, NT>(dOs, dog + m0 * p.do_s.row, p.do_s.row, sq - m0, d, tid);
        load_vec_async<BR, NT>(lse_s, lseg + m0, sq - m0, tid);
        load_vec_async<BR, NT>(delta_s, deltag + m0, sq - m0, tid);
    }
    cp_async_commit();

    float acc_dv[MT][DW / 8][4], acc_dk[MT][DW / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int t = 0; t < DW / 8; ++t)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                acc_dv[mt][t][e] = 0.f;
                acc_dk[mt][t][e] = 0.f;
            }

    for (int m = m_first; m < num_m; ++m) {
        const int st = (m - m_first) & 1, m0 = m * BR;
        const int lane = lane_now(), warp = warp_now();
        const int lr = lane / 4, lc = lane % 4; /* accumulator fragment: row lr (+8), columns 2*lc, +1 */
        const int wk = warp % WK, wq = warp / WK;
        const int key0 = wk * KW, qry0 = wq * QW, col0 = wq * DW; /* the warp's first key, query, dK/dV column */

        cp_async_wait<0>();
        __syncthreads(); /* stage st landed; stage st^1, P^T and dS^T no longer read by step m-1 */
        if (m + 1 < num_m) {
            const int m1 = m0 + BR, so = st ^ 1;
            load_tile_async<T, BR, D, NT>(Qs + so * BR * SD, qg + m1 * p.q_s.row, p.q_s.row, sq - m1, d, tid);
            load_tile_async<T, BR, D, NT>(dOs + so * BR * SD, dog + m1 * p.do_s.row, p.do_s.row, sq - m1, d, tid);
            load_vec_async<BR, NT>(lse_s + so * BR, lseg + m1, sq - m1, tid);
            load_vec_async<BR, NT>(delta_s + so * BR, deltag + m1, sq - m1, tid);
            cp_async_commit();
        }
        const T *Qt = Qs + st * BR * SD, *dOt = dOs + st * BR * SD; /* [BR][SD] */
        const float *lse_t = lse_s + st * BR, *delta_t = delta_s + st * BR;

        /* S^T = K Q^T and dP^T - delta = V dO^T - delta (accumulated onto -delta) on the warp's KW keys
         * x QW queries */
        float s[MT][QW / 8][4], dp[MT][QW / 8][4];
#pragma unroll
        for (int t = 0; t < QW / 8; ++t) {
            const float2 dl = *(const float2 *)(delta_t + qry0 + t * 8 + 2 * lc);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    s[mt][t][e] = 0.f;
                    dp[mt][t][e] = (e & 1) ? -dl.y : -dl.x;
                }
        }
#pragma unroll 2 /* more unrolling runs out of registers at D=64 */
        for (int kk = 0; kk < D / 16; ++kk) {
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
                ldmatrix_x4(a[mt], addr_pat_a(Ks, SD, key0 + mt * 16, kk * 16, lane));
#pragma unroll
            for (int np = 0; np < QW / 16; ++np) {
                uint32_t bq[4];
                ldmatrix_x4(bq, addr_pat_b(Qt, SD, qry0 + np * 16, kk * 16, lane));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma_m16n8k16<T>(s[mt][2 * np], a[mt], bq);
                    mma_m16n8k16<T>(s[mt][2 * np + 1], a[mt], bq + 2);
                }
            }
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
                ldmatrix_x4(a[mt], addr_pat_a(Vs, SD, key0 + mt * 16, kk * 16, lane));
#pragma unroll
            for (int np = 0; np < QW / 16; ++np) {
                uint32_t bo[4];
                ldmatrix_x4(bo, addr_pat_b(dOt, SD, qry0 + np * 16, kk * 16, lane));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma_m16n8k16<T>(dp[mt][2 * np], a[mt], bo);
                    mma_m16n8k16<T>(dp[mt][2 * np + 1], a[mt], bo + 2);
                }
            }
        }

        /* P^T = exp2(S^T * scale*log2e - lse*log2e), dS^T = P^T o (dP^T - delta). Key jl (local) is
         * visible to query il (local) iff jl - il <= diag; keys past sk are masked too (their
         * zero-filled K would give s = 0). Both go to smem for the other warps of the key group (and
         * dS^T for dQ), and stay in registers as A fragments (k = queries) for this warp. */
        const int diag = clamp_diag((int64_t)m0 + p.causal_offset - n0);
        const bool need_mask = (causal && BC - 1 > diag) || kvalid < BC;
#pragma unroll
        for (int t = 0; t < QW / 8; ++t) {
            const int il = qry0 + t * 8 + 2 * lc;
            const float2 lse2 = *(const float2 *)(lse_t + il);
            const float l2[2] = {lse_to_log2(lse2.x), lse_to_log2(lse2.y)};
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    float pv = exp2_approx(fmaf(s[mt][t][e], sl2, -l2[e & 1]));
                    if (need_mask) {
                        const int jl = key0 + mt * 16 + lr + 8 * (e >> 1), ie = il + (e & 1);
                        if (jl >= kvalid || (causal && jl - ie > diag))
                            pv = 0.f;
                    }
                    s[mt][t][e] = pv;
                    dp[mt][t][e] *= pv;
                }
        }
        uint32_t pa[MT][QK][4], dsa[MT][QK][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int kq = 0; kq < QK; ++kq) {
                acc_to_a<T>(pa[mt][kq], s[mt][2 * kq], s[mt][2 * kq + 1]);
                acc_to_a<T>(dsa[mt][kq], dp[mt][2 * kq], dp[mt][2 * kq + 1]);
                store_a_frag(Ps, SS, key0 + mt * 16, qry0 + kq * 16, pa[mt][kq], lane);
                store_a_frag(dSs, SS, key0 + mt * 16, qry0 + kq * 16, dsa[mt][kq], lane);
            }
        __syncthreads(); /* P^T, dS^T of the whole tile visible */

        /* dV += P^T dO, dK += dS^T Q over the BR queries, query groups in the order wq, wq+1, ... */
#pragma unroll
        for (int j = 0; j < WQ; ++j) {
            const int g0 = ((wq + j) % WQ) * QW;
#pragma unroll
            for (int kq = 0; kq < QK; ++kq) {
                const int q0 = g0 + kq * 16;
                uint32_t a[MT][4];
                mma_kv_step<T, MT, QK, DW, SS, SD>(acc_dv, a, pa, j == 0, Ps, dOt, kq, key0, q0, col0, lane);
                mma_kv_step<T, MT, QK, DW, SS, SD>(acc_dk, a, dsa, j == 0, dSs, Qt, kq, key0, q0, col0, lane);
            }
        }

        if (do_dq) {
            /* dQ_partial (BR x D) = dS K, added to dq_accum */
            const int wm = warp % DQ_WM, wn = warp / DQ_WM;
#pragma unroll
            for (int ch = 0; ch < DQN / DQC; ++ch) {
                const int cb = wn * DQN + ch * DQC; /* first column of the chunk */
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
                        uint32_t bk[4];
                        ldmatrix_x4_trans(bk, addr_pat_a(Ks, SD, kk * 16, cb + np * 16, lane));
#pragma unroll
                        for (int mt = 0; mt < DQM / 16; ++mt) {
                            mma_m16n8k16<T>(acc[mt][2 * np], a[mt], bk);
                            mma_m16n8k16<T>(acc[mt][2 * np + 1], a[mt], bk + 2);
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
    cp_async_wait<0>(); /* K/V still in flight when no query tile sees the key tile */

    const int warp = warp_now();
    const int key0 = (warp % WK) * KW, col0 = (warp / WK) * DW;
    store_kv_grad<T, MT, DW>(p, acc_dv, 1.f, p.dv, p.dv_s, p.dv_accum, b, hq, n0 + key0, col0);
    store_kv_grad<T, MT, DW>(p, acc_dk, (float)p.scale, p.dk, p.dk_s, p.dk_accum, b, hq, n0 + key0, col0);
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

/* Dynamic shared memory (bytes, 16-bit elements) of the main kernel (K, V, two Q and dO stages, P^T,
 * dS^T, two lse and delta stages) and of the deterministic dQ kernel (Q, dO, two K and V stages). */
static constexpr size_t main_smem_bytes(int D, int BC, int BR)
{
    return (size_t)(2 * BC * (D + SMEM_PAD) + 4 * BR * (D + SMEM_PAD) + 2 * BC * (BR + SMEM_PAD)) * 2 +
           4 * BR * sizeof(float);
}

static constexpr size_t dq_smem_bytes(int D, int BRQ, int BCQ)
{
    return (size_t)(2 * BRQ * (D + SMEM_PAD) + 4 * BCQ * (D + SMEM_PAD)) * 2;
}

/* Tile parameters: D head dim (padded); main kernel: BC keys per CTA, BR queries per pipeline stage,
 * WK warps along the keys of S^T (MAIN_WARPS / WK along its queries), DQ_WM warps along the rows of
 * dQ, DQC dQ columns per chunk; BRQ x BCQ the tile of the deterministic dQ kernel. */
template <typename T, int D, int BC, int BR, int WK, int DQ_WM, int DQC, int BRQ, int BCQ>
static cudaError_t run_bwd(const flash_params *p, cudaStream_t stream)
{
    cudaError_t err;
    const flash_params pv = *p;

    bwd_preprocess_kernel<T><<<blocks_for(p->b * p->h * p->sq, PRE_WARPS), PRE_WARPS * WARP_SIZE, 0, stream>>>(pv);
    if ((err = cudaGetLastError()) != cudaSuccess)
        return err;

    if (flash_bwd_sm90_supported(p)) {
        if ((err = flash_bwd_main_sm90(p, stream)) != cudaSuccess)
            return err;
    } else {
        const size_t smem = main_smem_bytes(D, BC, BR);
        auto kernel = bwd_main_kernel<T, D, BC, BR, WK, DQ_WM, DQC>;
        if ((err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)) != cudaSuccess)
            return err;
        const dim3 grid(blocks_for(p->sk, BC), (unsigned int)p->h, (unsigned int)p->b);
        kernel<<<grid, MAIN_WARPS * WARP_SIZE, smem, stream>>>(pv);
        if ((err = cudaGetLastError()) != cudaSuccess)
            return err;
    }
    if (p->deterministic) {
        const size_t smem = dq_smem_bytes(D, BRQ, BCQ);
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


/* Tile configurations per head dim: the large ones measured above (they need the 227 KB per CTA of
 * sm90) when the device allows them, else smaller ones that fit the A100's 163 KB and, up to d = 128,
 * the 99 KB of sm86/sm89 (not measured: no such GPU here). */
#define BWD_D64_LARGE 64, 128, 128, 4, 4, 32, 128, 64
#define BWD_D64_SMALL 64, 64, 64, 2, 2, 16, 128, 64
#define BWD_D128_LARGE 128, 128, 64, 4, 2, 32, 128, 64
#define BWD_D128_SMALL 128, 64, 32, 4, 2, 32, 64, 32
#define BWD_D256_LARGE 256, 64, 64, 2, 2, 32, 64, 32
#define BWD_D256_SMALL 256, 64, 32, 4, 2, 32, 64, 32

template <int D, int BC, int BR, int WK, int DQ_WM, int DQC, int BRQ, int BCQ>
static constexpr size_t config_smem_bytes(void)
{
    return main_smem_bytes(D, BC, BR) > dq_smem_bytes(D, BRQ, BCQ) ? main_smem_bytes(D, BC, BR)
                                                                   : dq_smem_bytes(D, BRQ, BCQ);
}

/* The current device's opt-in shared memory per CTA, capped by FLASHATTN_EXT_SMEM_LIMIT (bytes; read
 * once) so that the small configurations can be tested on a large GPU. 0 if the query fails. Also
 * what the binding checks the forward's needs against. */
extern "C" size_t flash_smem_available(void)
{
    static long long cap = -1;
    if (cap < 0) {
        const char *env = getenv("FLASHATTN_EXT_SMEM_LIMIT");
        cap = env != NULL && atoll(env) > 0 ? atoll(env) : 0;
    }
    int dev = 0, bytes = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
        return 0;
    return cap > 0 && (size_t)cap < (size_t)bytes ? (size_t)cap : (size_t)bytes;
}

extern "C" size_t flash_bwd_smem_needed(const flash_params *p)
{
    if (p->d <= 64)
        return config_smem_bytes<BWD_D64_SMALL>();
    if (p->d <= 128)
        return config_smem_bytes<BWD_D128_SMALL>();
    return config_smem_bytes<BWD_D256_SMALL>();
}


template <typename T>
static cudaError_t run_bwd_dtype(const flash_params *p, cudaStream_t stream)
{
    const size_t limit = flash_smem_available();
    if (p->d <= 64)
        return limit >= config_smem_bytes<BWD_D64_LARGE>() ? run_bwd<T, BWD_D64_LARGE>(p, stream)
                                                           : run_bwd<T, BWD_D64_SMALL>(p, stream);
    if (p->d <= 128)
        return limit >= config_smem_bytes<BWD_D128_LARGE>() ? run_bwd<T, BWD_D128_LARGE>(p, stream)
                                                            : run_bwd<T, BWD_D128_SMALL>(p, stream);
    if (limit >= config_smem_bytes<BWD_D256_LARGE>())
        return run_bwd<T, BWD_D256_LARGE>(p, stream);
    if (limit >= config_smem_bytes<BWD_D256_SMALL>())
        return run_bwd<T, BWD_D256_SMALL>(p, stream);
    return cudaErrorInvalidConfiguration;
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
