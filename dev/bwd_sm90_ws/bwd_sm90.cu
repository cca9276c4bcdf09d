/* bwd_sm90.cu: the main backward kernel on Hopper tensor cores (wgmma, sm_90a), fp16/bf16, head dims
 * up to 128. Preprocess (delta, zeroed dq_accum) and postprocess (dq cast, GQA reduction) are the
 * kernels of bwd_sm80.cu, which calls flash_bwd_main_sm90 in place of its own main kernel when
 * flash_bwd_sm90_supported says so.
 *
 * Algorithm, per CTA = (key tile of BN = 128 keys, query head, batch); nothing of size sq x sk stored:
 *   K, V of the tile are loaded once (cp.async); the CTA walks the query tiles of BM rows that can see
 *   the tile (causal: from the first one that does), Q, dO, lse, delta double-buffered through cp.async.
 *   Warpgroup wg (threads 128 wg .. +127) owns keys [64 wg, +64) of the tile, the M of its wgmma's:
 *     S^T  = K_wg Q^T      wgmma SS, m64 n=BM, K = d       P^T  = exp2(S^T scale log2e - lse log2e)
 *     dP^T = V_wg dO^T     wgmma SS                         dS^T = P^T o (dP^T - delta)
 *     dV_wg += P^T dO      wgmma RS (P^T from registers, repacked from the S^T accumulators), n = D
 *     dK_wg += dS^T Q      wgmma RS
 *     dS^T -> shared memory (both warpgroups), then dQ_partial = dS K, wgmma SS with both operands
 *     MN-major: at D = 128 the warpgroups split its columns (K = all 128 keys); at D = 64 each
 *     computes all 64 columns from its own 64 keys (two partials). The partials go to one of two
 *     smem buffers [NPART][BM][D + 8] fp32 and a third warpgroup, the dQ reducer (setmaxnreg 24;
 *     the MMA warpgroups take 240), sums them and adds them into the fp32 dq_accum with vector
 *     red.add while the MMA warpgroups go on with the next query tile. Handshake per buffer: named
 *     barriers FULL (MMA arrive, reducer sync) and EMPTY (reducer arrive, MMA sync from the third
 *     tile on); the MMA warpgroups meet on named barrier 1, never on __syncthreads.
 *   dK (times scale) and dV stay in registers until the end: dtype when h == h_kv, else fp32 per query
 *   head into dk_accum / dv_accum for the GQA postprocess. Deterministic mode skips dQ here (the
 *   separate dQ kernel of bwd_sm80.cu computes it) and the reducer idles.
 * Tiles: BN 128 x BM 64, 3 warpgroups (384 threads). D = 128: 216 KB smem; D = 64: 156 KB.
 *   Shared-memory tiles use the 128-byte swizzled layout of wgmma.cuh; head dims below D are zero-
 *   padded in smem and computed like the others, only global writes are guarded.
 * Requirements: as bwd_sm80.cu (d % 8 == 0, 16-byte aligned pointers and strides), plus d <= 128 and
 *   an sm_90 device with an sm_90a build (FLASHATTN_EXT_SM90A).
 *
 * CANDIDATE, NOT YET CORRECT ON HARDWARE (2026-11-29): its first device run hung in every config.
 * Cause found afterwards: the reducer gave back setmaxnreg 32, which frees (168 - 32) * 128 registers
 * while the MMA warpgroups ask for (240 - 168) * 256, so setmaxnreg.inc waited forever; now 24
 * (balanced, as FA3 does). Compiles for sm_90a without spills in the MMA branch. Run
 * dev/bwd_sm90_ws/run.sh; if it passes and is faster than csrc/cuda/bwd_sm90.cu (d64 s8k 268, d128
 * s8k 324 TFLOP/s in the harness), copy it over, fix the include paths, and measure. Expected: the dQ
 * adds (20-25% of the time now) off the MMA warps' path: up to ~304 / ~406 TFLOP/s if L2 keeps up.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

#include "../../csrc/cuda/bwd_common.cuh"
#include "../../csrc/cuda/launch.h"
#include "../../csrc/cuda/ptx.cuh"
#include "../../csrc/cuda/wgmma.cuh"

#define SM90_WARPGROUPS 2
#define WARPGROUP_THREADS 128
#define SM90_THREADS (SM90_WARPGROUPS * WARPGROUP_THREADS)     /* the two MMA warpgroups */
#define SM90_THREADS_ALL (SM90_THREADS + WARPGROUP_THREADS)     /* + the dQ reducer warpgroup */
#define MMA_REGS 240     /* registers per thread of the MMA warpgroups (setmaxnreg) ... */
#define REDUCER_REGS 24  /* ... and of the reducer: what the reducer frees, (168 - 24) * 128, is what the
                          * MMA warpgroups take, (240 - 168) * 256; 168 = the launch cap for 384 threads */
#define DQ_PAD 8         /* fp32 padding per row of the dQ buffers: conflict-free float2 stores */
/* named barriers: 0 is __syncthreads (unused); MMA warpgroups only; dQ buffer b full / empty */
#define BAR_MMA 1
#define BAR_DQ_FULL 2    /* + buffer index */
#define BAR_DQ_EMPTY 4   /* + buffer index */
#define SM90_BN 128   /* keys per CTA */
#define WG_KEYS 64    /* keys per warpgroup: the M of one wgmma */
#define DQ_N 64       /* dQ columns per warpgroup (D = 128) or all of them (D = 64) */
#define WGMMA_K 16    /* K of one wgmma step */

/* dQ_partial = dS K per tile: at D = 128 the warpgroups split its columns (one partial, 64 columns
 * each, K = all BN keys); at D = 64 each computes all 64 columns from its own 64 keys (two partials,
 * summed by the reducer), which keeps every wgmma operand on whole 64-column panels. */
__host__ __device__ constexpr int dq_parts(int D)
{
    return D == 64 ? 2 : 1;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* Async copy of a ROWS x D tile (rows [0, rows_valid), columns [0, d) of global memory, row stride
 * `stride` elements) into the sw128 smem tile `s`; everything outside is zero-filled. */
template <typename T, int ROWS, int D>
__device__ __forceinline__ void load_tile_sw128(uint8_t *s, const T *g, int64_t stride, int rows_valid, int d, int tid)
{
    constexpr int CPR = D / CHUNK; /* 16-byte chunks per row */
    static_assert(ROWS * CPR % SM90_THREADS == 0, "tile copy layout");
#pragma unroll
    for (int it = 0; it < ROWS * CPR / SM90_THREADS; ++it) {
        const int idx = it * SM90_THREADS + tid;
        const int r = idx / CPR, c = (idx % CPR) * CHUNK;
        const bool valid = r < rows_valid && c < d;
        cp_async_16(smem_u32(s + sw128_offset(ROWS, r, c)), valid ? g + r * stride + c : g, valid);
    }
}

/* Store a 16 x 16 A fragment (acc_to_a layout; rows row0 + [0, 16), columns col0 + [0, 16)) into an
 * sw128 tile of ROWS rows. */
template <int ROWS>
__device__ __forceinline__ void store_a_frag_sw128(uint8_t *s, int row0, int col0, const uint32_t a[4], int lane)
{
    const int r = row0 + lane / 4, c = col0 + 2 * (lane % 4);
    *(uint32_t *)(s + sw128_offset(ROWS, r, c)) = a[0];
    *(uint32_t *)(s + sw128_offset(ROWS, r + 8, c)) = a[1];
    *(uint32_t *)(s + sw128_offset(ROWS, r, c + 8)) = a[2];
    *(uint32_t *)(s + sw128_offset(ROWS, r + 8, c + 8)) = a[3];
}

/* This thread's index, re-read at every call (volatile) for the same reason: the addresses derived from
 * it are recomputed in each step of the main loop rather than held in registers across it. */
__device__ __forceinline__ int tid_now(void)
{
    int r;
    asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(r));
    return r;
}

/* The shared-memory address of s, re-read at every call (volatile: never hoisted or merged), so that
 * the descriptors derived from it are rebuilt in each step of the main loop instead of staying pinned
 * in registers across it. */
__device__ __forceinline__ uint32_t smem_addr_now(const void *s)
{
    uint32_t r;
    asm volatile("mov.u32 %0, %1;\n" : "=r"(r) : "r"(smem_u32(s)));
    return r;
}

/* Named barrier `id` over `count` threads: wait for all of them (sync), or only signal (arrive). */
__device__ __forceinline__ void named_sync(int id, int count)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

__device__ __forceinline__ void named_arrive(int id, int count)
{
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

/* The dQ reducer warpgroup: for each query tile the MMA warpgroups walk, wait until they have written
 * its dQ_partial (BM x D fp32) into buffer (i % 2), add it into dq_accum with vector red.add, and
 * hand the buffer back. The MMA warpgroups never stall on these L2 reductions (they were 20-25% of
 * the time when the MMA warps issued them). */
template <int BM, int D>
__device__ __forceinline__ void dq_reducer(const float *dQb, float *dqa, int m_first, int num_m, int sq, int d,
                                           int rtid)
{
    constexpr int DQ_LD = D + DQ_PAD, V4_PER_ROW = D / 4, NPART = dq_parts(D);
    const int n = num_m - m_first;
    for (int i = 0; i < n; ++i) {
        const int buf = i & 1, m0 = (m_first + i) * BM;
        named_sync(BAR_DQ_FULL + buf, SM90_THREADS_ALL);
        const float *src = dQb + buf * NPART * BM * DQ_LD; /* [NPART][BM][DQ_LD] */
#pragma unroll 4
        for (int idx = rtid; idx < BM * V4_PER_ROW; idx += WARPGROUP_THREADS) {
            const int r = idx / V4_PER_ROW, c = (idx % V4_PER_ROW) * 4;
            if (c < d && m0 + r < sq) {
                float4 v = *(const float4 *)(src + r * DQ_LD + c);
                if (NPART == 2) {
                    const float4 u = *(const float4 *)(src + (BM + r) * DQ_LD + c);
                    v = make_float4(v.x + u.x, v.y + u.y, v.z + u.z, v.w + u.w);
                }
                atomicAdd((float4 *)(dqa + (int64_t)(m0 + r) * d + c), v);
            }
        }
        if (i + 2 < n) /* the MMA warpgroups refill this buffer at tile i + 2 */
            named_arrive(BAR_DQ_EMPTY + buf, SM90_THREADS_ALL);
    }
}

#endif

template <typename T, int D, int BM>
__global__ void __launch_bounds__(SM90_THREADS_ALL, 1) bwd_main_sm90_kernel(const flash_params p)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BN = SM90_BN;
    constexpr int K_BYTES = BN * D * 2, Q_BYTES = BM * D * 2, DS_BYTES = BN * BM * 2;
    constexpr int NQ = BM / 2, NDKV = D / 2, NDQ = DQ_N / 2; /* accumulator registers per thread */
    constexpr int DQ_LD = D + DQ_PAD;
    constexpr int NPART = dq_parts(D), DQ_K = NPART == 2 ? WG_KEYS : BN; /* dQ partials, their K */
    static_assert(BM == 64 && (D == 64 || D == 128), "tile configuration");

    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = (uint8_t *)(((uintptr_t)smem_raw + SW128_ATOM_BYTES - 1) & ~(uintptr_t)(SW128_ATOM_BYTES - 1));
    uint8_t *Ks = smem;                       /* [BN][D] sw128 */
    uint8_t *Vs = Ks + K_BYTES;               /* [BN][D] sw128 */
    uint8_t *Qs = Vs + K_BYTES;               /* [2][BM][D] sw128 */
    uint8_t *dOs = Qs + 2 * Q_BYTES;          /* [2][BM][D] sw128 */
    uint8_t *dSs = dOs + 2 * Q_BYTES;         /* [BN][BM] sw128: dS^T of the current query tile */
    float *lse_s = (float *)(dSs + DS_BYTES); /* [2][BM] */
    float *delta_s = lse_s + 2 * BM;          /* [2][BM] */
    float *dQb = delta_s + 2 * BM;            /* [2][NPART][BM][D + DQ_PAD] fp32: dQ_partial, MMA -> reducer */

    const int tid = threadIdx.x;
    const int n0 = blockIdx.x * BN, hq = blockIdx.y, b = blockIdx.z;
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

    const int num_m = (sq + BM - 1) / BM;
    int m_first = 0;
    if (causal) {
        const int64_t first_row = n0 - p.causal_offset; /* first query row that sees key n0 */
        m_first = first_row <= 0 ? 0 : (first_row >= sq ? num_m : (int)(first_row / BM));
    }
    const int kvalid = sk - n0; /* keys of the tile that exist */

    if (tid >= SM90_THREADS) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REDUCER_REGS));
        if (do_dq)
            dq_reducer<BM, D>(dQb, dqa, m_first, num_m, sq, d, tid - SM90_THREADS);
    } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(MMA_REGS));
    load_tile_sw128<T, BN, D>(Ks, kg, p.k_s.row, kvalid, d, tid);
    load_tile_sw128<T, BN, D>(Vs, vg, p.v_s.row, kvalid, d, tid);
    if (m_first < num_m) {
        const int m0 = m_first * BM;
        load_tile_sw128<T, BM, D>(Qs, qg + m0 * p.q_s.row, p.q_s.row, sq - m0, d, tid);
        load_tile_sw128<T, BM, D>(dOs, dog + m0 * p.do_s.row, p.do_s.row, sq - m0, d, tid);
        load_vec_async<BM, SM90_THREADS>(lse_s, lseg + m0, sq - m0, tid);
        load_vec_async<BM, SM90_THREADS>(delta_s, deltag + m0, sq - m0, tid);
    }
    cp_async_commit();

    float acc_dv[NDKV], acc_dk[NDKV];
#pragma unroll
    for (int i = 0; i < NDKV; ++i) {
        acc_dv[i] = 0.f;
        acc_dk[i] = 0.f;
    }

    for (int m = m_first; m < num_m; ++m) {
        const int st = (m - m_first) & 1, m0 = m * BM;
        cp_async_wait<0>();
        fence_proxy_async();                /* the landed tiles are read by wgmma */
        named_sync(BAR_MMA, SM90_THREADS); /* stage st landed; stage st^1 and dS^T no longer read by step m-1 */
        const int tid = tid_now(), lane = tid % WARP_SIZE, lc = lane % 4;
        const int wg = tid / WARPGROUP_THREADS, w = (tid % WARPGROUP_THREADS) / WARP_SIZE;
        const int key0 = wg * WG_KEYS;                    /* the warpgroup's first key in the tile */
        const int dq_col0 = NPART == 2 ? 0 : wg * DQ_N;   /* the warpgroup's dQ block: columns, */
        const int dq_key0 = NPART == 2 ? key0 : 0;        /* first key (K), */
        const int dq_part = NPART == 2 ? wg : 0;          /* partial */
        if (m + 1 < num_m) {
            const int m1 = m0 + BM, so = st ^ 1;
            load_tile_sw128<T, BM, D>(Qs + so * Q_BYTES, qg + m1 * p.q_s.row, p.q_s.row, sq - m1, d, tid);
            load_tile_sw128<T, BM, D>(dOs + so * Q_BYTES, dog + m1 * p.do_s.row, p.do_s.row, sq - m1, d, tid);
            load_vec_async<BM, SM90_THREADS>(lse_s + so * BM, lseg + m1, sq - m1, tid);
            load_vec_async<BM, SM90_THREADS>(delta_s + so * BM, deltag + m1, sq - m1, tid);
            cp_async_commit();
        }
        const uint32_t Qt = smem_addr_now(Qs + st * Q_BYTES), dOt = smem_addr_now(dOs + st * Q_BYTES); /* [BM][D] */
        const uint32_t Ka = smem_addr_now(Ks), Va = smem_addr_now(Vs), dSa = smem_addr_now(dSs);
        const float *lse_t = lse_s + st * BM, *delta_t = delta_s + st * BM;

        /* S^T = K_wg Q^T, then dP^T = V_wg dO^T: 64 keys x BM queries each */
        float s[NQ], dp[NQ]; /* overwritten by the first step (accumulate = 0) */
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / WGMMA_K; ++kk)
            wgmma_op<T, BM>::template ss<0, 0>(s, desc_k_major<BN>(Ka, key0, kk * WGMMA_K),
                                               desc_k_major<BM>(Qt, 0, kk * WGMMA_K), kk);
        wgmma_commit();
#pragma unroll
        for (int kk = 0; kk < D / WGMMA_K; ++kk)
            wgmma_op<T, BM>::template ss<0, 0>(dp, desc_k_major<BN>(Va, key0, kk * WGMMA_K),
                                               desc_k_major<BM>(dOt, 0, kk * WGMMA_K), kk);
        wgmma_commit();

        /* P^T = exp2(S^T * scale*log2e - lse*log2e), 0 where masked (key jl, query il of the tile:
         * visible iff jl - il <= diag; keys past sk too, their zero-filled K would give s = 0), then
         * dS^T = P^T o (dP^T - delta). Each 16-query block kq goes to the tensor cores as soon as it is
         * ready (dV += P^T dO, dK += dS^T Q; K = the queries; dO and Q read MN-major), so the
         * exponentials of block kq+1 overlap the wgmma's of block kq and of dP^T. */
        const int diag = clamp_diag((int64_t)m0 + p.causal_offset - n0);
        const bool need_mask = (causal && BN - 1 > diag) || kvalid < BN;
        uint32_t pa[BM / WGMMA_K][4], dsa[BM / WGMMA_K][4];
        wgmma_wait<1>(); /* S^T */
#pragma unroll
        for (int kq = 0; kq < BM / WGMMA_K; ++kq) {
#pragma unroll
            for (int i = 2 * kq; i < 2 * kq + 2; ++i) {
                const int il = i * 8 + 2 * lc;
                const float2 lse2 = *(const float2 *)(lse_t + il);
                const float l2[2] = {lse_to_log2(lse2.x), lse_to_log2(lse2.y)};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    float pv = exp2_approx(fmaf(s[4 * i + e], sl2, -l2[e & 1]));
                    if (need_mask) {
                        const int jl = key0 + w * 16 + lane / 4 + 8 * (e >> 1), ie = il + (e & 1);
                        if (jl >= kvalid || (causal && jl - ie > diag))
                            pv = 0.f;
                    }
                    s[4 * i + e] = pv;
                }
            }
            acc_to_a<T>(pa[kq], s + 8 * kq, s + 8 * kq + 4);
            wgmma_fence();
            wgmma_op<T, D>::template rs<1>(acc_dv, pa[kq], desc_mn_major<BM>(dOt, kq * WGMMA_K, 0), 1);
        }
        wgmma_commit();
        wgmma_wait<1>(); /* dP^T (dV may still run) */
#pragma unroll
        for (int kq = 0; kq < BM / WGMMA_K; ++kq) {
#pragma unroll
            for (int i = 2 * kq; i < 2 * kq + 2; ++i) {
                const float2 dl = *(const float2 *)(delta_t + i * 8 + 2 * lc);
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    dp[4 * i + e] = s[4 * i + e] * (dp[4 * i + e] - ((e & 1) ? dl.y : dl.x));
            }
            acc_to_a<T>(dsa[kq], dp + 8 * kq, dp + 8 * kq + 4);
            if (do_dq)
                store_a_frag_sw128<BN>(dSs, key0 + w * 16, kq * WGMMA_K, dsa[kq], lane);
            wgmma_fence();
            wgmma_op<T, D>::template rs<1>(acc_dk, dsa[kq], desc_mn_major<BM>(Qt, kq * WGMMA_K, 0), 1);
        }
        wgmma_commit();

        if (do_dq) {
            /* dQ_partial = dS K: this warpgroup's 64 x DQ_N block, K = the BN keys; dS^T and K read
             * MN-major; handed to the reducer warpgroup through dQ buffer (step % 2) */
            fence_proxy_async();
            named_sync(BAR_MMA, SM90_THREADS); /* dS^T of both warpgroups in smem */
            float acc_dq[NDQ]; /* overwritten by the first step (accumulate = 0) */
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < DQ_K / WGMMA_K; ++kk)
                wgmma_op<T, DQ_N>::template ss<1, 1>(acc_dq, desc_mn_major<BN>(dSa, dq_key0 + kk * WGMMA_K, 0),
                                                     desc_mn_major<BN>(Ka, dq_key0 + kk * WGMMA_K, dq_col0), kk);
            wgmma_commit();
            wgmma_wait<0>();
            const int step = m - m_first, buf = step & 1;
            if (step >= 2) /* the reducer has added tile step - 2 from this buffer */
                named_sync(BAR_DQ_EMPTY + buf, SM90_THREADS_ALL);
            float *dst = dQb + ((buf * NPART + dq_part) * BM + w * 16 + lane / 4) * DQ_LD + dq_col0 + 2 * lc; /* (DQ_N) */
#pragma unroll
            for (int i = 0; i < DQ_N / 8; ++i) {
                *(float2 *)(dst + i * 8) = make_float2(acc_dq[4 * i], acc_dq[4 * i + 1]);
                *(float2 *)(dst + 8 * DQ_LD + i * 8) = make_float2(acc_dq[4 * i + 2], acc_dq[4 * i + 3]);
            }
            named_arrive(BAR_DQ_FULL + buf, SM90_THREADS_ALL);
        } else {
            wgmma_wait<0>();
        }
    }
    cp_async_wait<0>(); /* K/V still in flight when no query tile sees the key tile */

    const int j0 = n0 + (tid / WARPGROUP_THREADS) * WG_KEYS + (tid % WARPGROUP_THREADS) / WARP_SIZE * 16;
    store_kv_grad<T, 1, D>(p, (const float(*)[D / 8][4])acc_dv, 1.f, p.dv, p.dv_s, p.dv_accum, b, hq, j0, 0);
    store_kv_grad<T, 1, D>(p, (const float(*)[D / 8][4])acc_dk, (float)p.scale, p.dk, p.dk_s, p.dk_accum, b, hq, j0, 0);
    }
#endif
}

template <typename T, int D, int BM>
static cudaError_t launch_main_sm90(const flash_params *p, cudaStream_t stream)
{
    const size_t smem = SW128_ATOM_BYTES /* alignment slack */ + (size_t)(2 * SM90_BN * D + 4 * BM * D + SM90_BN * BM) * 2 +
                        (size_t)(4 * BM + 2 * dq_parts(D) * BM * (D + DQ_PAD)) * sizeof(float);
    auto kernel = bwd_main_sm90_kernel<T, D, BM>;
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess)
        return err;
    const dim3 grid((unsigned int)((p->sk + SM90_BN - 1) / SM90_BN), (unsigned int)p->h, (unsigned int)p->b);
    kernel<<<grid, SM90_THREADS_ALL, smem, stream>>>(*p);
    return cudaGetLastError();
}

extern "C" int flash_bwd_sm90_supported(const flash_params *p)
{
#ifdef FLASHATTN_EXT_SM90A
    static int disabled = -1; /* FLASHATTN_EXT_DISABLE_SM90=1 forces the sm80 kernels (for comparisons) */
    if (disabled < 0) {
        const char *env = getenv("FLASHATTN_EXT_DISABLE_SM90");
        disabled = env != NULL && env[0] != '\0' && env[0] != '0';
    }
    int dev = 0, major = 0;
    if (disabled || p->d > 128 || (p->dtype != FLASH_BF16 && p->dtype != FLASH_FP16))
        return 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
        return 0;
    return major == 9;
#else
    (void)p;
    return 0;
#endif
}

extern "C" cudaError_t flash_bwd_main_sm90(const flash_params *p, cudaStream_t stream)
{
    if (p->dtype == FLASH_BF16)
        return p->d <= 64 ? launch_main_sm90<__nv_bfloat16, 64, 64>(p, stream)
                          : launch_main_sm90<__nv_bfloat16, 128, 64>(p, stream);
    if (p->dtype == FLASH_FP16)
        return p->d <= 64 ? launch_main_sm90<__half, 64, 64>(p, stream) : launch_main_sm90<__half, 128, 64>(p, stream);
    return cudaErrorInvalidValue;
}
