/* bwd_sm90.cu: the main backward kernels on Hopper tensor cores (wgmma, sm_90a), fp16/bf16, head dims
 * up to 256. Preprocess (delta, zeroed dq_accum) and postprocess (dq cast, GQA reduction) are the
 * kernels of bwd_sm80.cu, which calls flash_bwd_main_sm90 in place of its own main kernel when
 * flash_bwd_sm90_supported says so.
 *
 * bwd_main_sm90_kernel, head dims up to 128. Per CTA = (key tile of BN = 128 keys, query head, batch);
 * nothing of size sq x sk stored:
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
 *     red.add while the MMA warpgroups go on with the next query tile. Handshake per buffer b through
 *     mbarriers: FULL[b] (every MMA thread arrives after its stores, release; the reducer waits,
 *     acquire) and EMPTY[b] (every reducer thread arrives after its loads; the MMA warpgroups wait
 *     before rewriting b, from the third tile on). The MMA warpgroups meet each other on named
 *     barrier 1, never on __syncthreads.
 *   dK (times scale) and dV stay in registers until the end: dtype when h == h_kv, else fp32 per query
 *   head into dk_accum / dv_accum for the GQA postprocess. Deterministic mode skips dQ here (the
 *   separate dQ kernel of bwd_sm80.cu computes it) and the reducer idles.
 * Tiles: BN 128 x BM 64, 3 warpgroups (384 threads). D = 128: 216 KB smem; D = 64: 156 KB.
 *   Shared-memory tiles use the 128-byte swizzled layout of wgmma.cuh; head dims below D are zero-
 *   padded in smem and computed like the others, only global writes are guarded.
 * bwd_main_sm90_d256_kernel, head dims 129..256: 64 keys per CTA, the warpgroups split the columns of
 *   dK, dV and dQ; see its own comment.
 * Requirements: as bwd_sm80.cu (d % 8 == 0, 16-byte aligned pointers and strides), plus an sm_90
 *   device with an sm_90a build (FLASHATTN_EXT_SM90A).
 *
 * Measured on the H200 (dev/bwd_harness.cu time; bf16, 16k tokens, nheads = 2048/d, whole backward
 * incl. pre/postprocess; bwd FLOPs = 2.5 * 4*B*H*Sq*Sk*D, halved for causal), TFLOP/s:
 *                     s512  s2048  s8192 | causal: s512  s2048  s8192
 *   d64                210   307    348  |         132    254    331
 *   d128               285   428    488  |         178    339    448
 *   d256               200   261    286  |         146    229    283
 *   deterministic mode (dQ by bwd_sm80.cu's dQ kernel), d128 s8192: 239 (causal 223).
 * torch's flash backend (FA2) and cuDNN: benchmarks/results/h200 (backward, ours 1.16-1.55x FA2 at
 * d128, 1.06-1.28x at d64 from s1k, 1.03-1.14x at d256; 0.69-0.87x cuDNN).
 * History (s8192 non-causal, d64/d128): 1. S^T/dP^T then all of P^T, dS^T, then dV, dK: 253/312.
 * 2. dV/dK wgmma issued per 16-query block as soon as its P^T/dS^T is ready: 268/324. Tried: dQ
 * through smem and per-row bulk reduce-adds (cp.reduce.async.bulk) instead of red.add: 263/316.
 * Where the time went in version 2 (one part removed): without the dQ adds 304/406, without the
 * exponentials 278/327, without the whole dQ step (barrier, wgmma, adds) 472/598. 3. the dQ reducer
 * warpgroup: d128 324 -> 368; d64 (now BM 64, two partials) unchanged, 269 -> 271. 4. instruction
 * count (ncu: issue slots 50-56% busy, ALU the busiest pipe, 1 eligible warp per scheduler; the main
 * loop was ~1000 SASS instructions per tile, ~480 of them integer): unsigned index math 281/381, then
 * lse in log2 form once per tile, ld/st.shared by 32-bit address, descriptors advanced by one add,
 * one compare per masked value and an unmasked copy of the P loop at d64: 344/440 (~830 instructions).
 * Tried: dQ(m-1) issued under the exponentials of tile m with three Q/dO stages (software pipelined,
 * one MMA barrier per tile): d64 +1%, and at d128 the extra accumulators serialize the wgmma's (-8%).
 * d256: the mma.sync kernel of bwd_sm80.cu ran at 178; the first version of this one 238.
 * 5. (d64/d128/d256, s8192; each step alone against step 4) whole tiles loaded without per-chunk
 * bounds: 348/484/271; warp-uniform descriptor bases (no R2UR per wgmma): 355/465/262; one stmatrix
 * per 16 x 16 block of dS^T / P^T: 350/475/264; the unmasked P path chosen per 16-query block (d128
 * too): 348/473/261; d256 dQ chunk 0 before dV/dK: 276 at d256. The dQ handshake moved from bar.sync
 * to mbarriers: compute-sanitizer racecheck reported the bar.sync version (15 hazards, though PTX
 * orders it) and reports none with mbarriers; it costs 1-3% (all of step 5 with bar.sync: 347/494/287).
 * All of step 5 together: 342/487/286; then at D = 64 the two copies of the P loop again instead of
 * the per-block branch: 348/488/286 (the table above).
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

#include "bwd_common.cuh"
#include "launch.h"
#include "ptx.cuh"
#include "wgmma.cuh"

#define SM90_WARPGROUPS 2
#define WARPGROUP_THREADS 128
#define SM90_THREADS (SM90_WARPGROUPS * WARPGROUP_THREADS)     /* the two MMA warpgroups */
#define SM90_THREADS_ALL (SM90_THREADS + WARPGROUP_THREADS)     /* + the dQ reducer warpgroup */
#define MMA_REGS 240     /* registers per thread of the MMA warpgroups (setmaxnreg) ... */
#define REDUCER_REGS 24  /* ... and of the reducer: what the reducer frees, (168 - 24) * 128, is what the
                          * MMA warpgroups take, (240 - 168) * 256; 168 = the launch cap for 384 threads */
#define DQ_PAD 8         /* fp32 padding per row of the dQ buffers: conflict-free float2 stores */
/* named barrier of the MMA warpgroups (0 is __syncthreads, used once before the roles split) */
#define BAR_MMA 1
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
 * `stride` elements) into the sw128 smem tile `s`; everything outside is zero-filled (tiles that are
 * whole, the common case, skip the bounds). Each thread
 * copies one 16-byte column chunk c of rows r0 + RSTEP * it: RSTEP is a multiple of 8, so those rows
 * share the swizzle phase and the smem offsets differ by constants. */
template <typename T, int ROWS, int D>
__device__ __forceinline__ void load_tile_sw128(uint8_t *s, const T *g, int64_t stride, int rows_valid, int d, int tid)
{
    constexpr int CPR = D / CHUNK, RSTEP = SM90_THREADS / CPR; /* 16-byte chunks per row; rows per pass */
    static_assert(SM90_THREADS % CPR == 0 && ROWS % RSTEP == 0 && RSTEP % 8 == 0, "tile copy layout");
    const int r0 = tid / CPR, c = tid % CPR * CHUNK;
    const uint32_t s0 = smem_u32(s) + sw128_offset(ROWS, r0, c);
    const T *g0 = g + r0 * stride + c;
    if (rows_valid >= ROWS && d == D) { /* whole tile (uniform branch): no per-chunk bounds or selects */
#pragma unroll
        for (int it = 0; it < ROWS / RSTEP; ++it, g0 += RSTEP * stride)
            cp_async_16(s0 + it * RSTEP * SW128_ROW_BYTES, g0, true);
        return;
    }
    const bool col_ok = c < d;
#pragma unroll
    for (int it = 0; it < ROWS / RSTEP; ++it) {
        const bool valid = col_ok && r0 + it * RSTEP < rows_valid;
        cp_async_16(s0 + it * RSTEP * SW128_ROW_BYTES, valid ? g0 + it * RSTEP * stride : g, valid);
    }
}

/* Store a 16 x 16 A fragment (acc_to_a layout; rows row0 + [0, 16), columns col0 + [0, 16)) into the
 * sw128 tile of ROWS rows at shared address s, with one stmatrix: a[i] is the 8 x 8 matrix i (rows
 * + 8 (i % 2), columns + 8 (i / 2)), whose row lane % 8 lane l addresses for matrix l / 8 (each row of
 * 8 elements is one 16-byte chunk of the swizzled layout). */
template <int ROWS>
__device__ __forceinline__ void store_a_frag_sw128(uint32_t s, int row0, int col0, const uint32_t a[4], int lane)
{
    const int r = row0 + lane % 8 + 8 * (lane / 8 % 2), c = col0 + 8 * (lane / 16);
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                     s + sw128_offset(ROWS, r, c)),
                 "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3])
                 : "memory");
}

/* P^T of one 16-query block (8 accumulator values s8: rows jb, jb + 8 of the thread, queries il, il + 1
 * and il + 8, il + 9 with il = 16 kq + 2 lc) from S^T: exp2(S^T scale*log2e - lse*log2e), lse2 read at
 * lse_addr (the stage's log2-scaled lse of query il). MASK: 0 where the key is past sk (row0_out,
 * row8_out: jb, jb + 8 >= kvalid) or, causal, jl - il > diag, written as t > 8 i + (e & 1) - 8 (e >> 1)
 * with t = jb - 2 lc - diag per thread (INT_MIN without causal), one compare per value. */
template <bool MASK>
__device__ __forceinline__ void p_block(float s8[8], uint32_t lse_addr, float sl2, int kq, int t, bool row0_out,
                                        bool row8_out)
{
#pragma unroll
    for (int h = 0; h < 2; ++h) { /* i = 2 kq + h: queries il + 8 h */
        const float2 l2 = ld_shared_v2_f32(lse_addr + h * 8 * sizeof(float));
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float pv = exp2_approx(fmaf(s8[4 * h + e], sl2, -((e & 1) ? l2.y : l2.x)));
            if (MASK && ((e >> 1 ? row8_out : row0_out) || t > 8 * (2 * kq + h) + (e & 1) - 8 * (e >> 1)))
                pv = 0.f;
            s8[4 * h + e] = pv;
        }
    }
}

/* v, which is the same in all lanes of the warp, as the compiler's warp-uniform value (broadcast from
 * lane 0): descriptor math derived from it runs on the uniform datapath, with no R2UR per wgmma. */
__device__ __forceinline__ uint32_t warp_uniform(uint32_t v)
{
    return __shfl_sync(FULL_MASK, v, 0);
}

/* This thread's index, re-read at every call (volatile) for the same reason: the addresses derived from
 * it are recomputed in each step of the main loop rather than held in registers across it. */
__device__ __forceinline__ int tid_now(void)
{
    int r;
    asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(r));
    __builtin_assume(r >= 0 && r < SM90_THREADS_ALL); /* lets tid / 128, tid % 32 compile to shifts, masks */
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

/* Named barrier `id` over `count` threads. */
__device__ __forceinline__ void named_sync(int id, int count)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

/* mbarrier (shared address) expecting `count` arrivals per phase. */
__device__ __forceinline__ void mbar_init(uint32_t bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

/* Arrive (release: this thread's earlier memory accesses are ordered before the phase completes). */
__device__ __forceinline__ void mbar_arrive(uint32_t bar)
{
    asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.release.cta.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar)
                 : "memory");
}

/* Wait (acquire) until the phase of parity `parity` has completed: phase k of a barrier is its k-th use. */
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity)
{
    asm volatile("{\n.reg .pred done;\nwait_%=:\n"
                 "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra wait_%=;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}

/* The dQ reducer warpgroup: for each query tile i the MMA warpgroups walk, wait on FULL[i % 2] until
 * they have written its dQ_partial (BM x D fp32) into buffer i % 2, add it into dq_accum with vector
 * red.add, and hand the buffer back on EMPTY[i % 2]. The MMA warpgroups never stall on these L2
 * reductions (they were 20-25% of the time when the MMA warps issued them). */
template <int BM, int D>
__device__ __forceinline__ void dq_reducer(const float *dQb, float *dqa, uint32_t full, uint32_t empty, int m_first,
                                           int num_m, int sq, int d, int rtid)
{
    constexpr int DQ_LD = D + DQ_PAD, V4_PER_ROW = D / 4, NPART = dq_parts(D);
    const int n = num_m - m_first;
    for (int i = 0; i < n; ++i) {
        const int buf = i & 1, m0 = (m_first + i) * BM;
        mbar_wait(full + buf * sizeof(uint64_t), (i / 2) & 1);
        const uint32_t src = smem_u32(dQb + buf * NPART * BM * DQ_LD); /* [NPART][BM][DQ_LD] */
#pragma unroll 4
        for (int idx = rtid; idx < BM * V4_PER_ROW; idx += WARPGROUP_THREADS) {
            const int r = idx / V4_PER_ROW, c = (idx % V4_PER_ROW) * 4;
            if (c < d && m0 + r < sq) {
                float4 v = ld_shared_v4_f32(src + (r * DQ_LD + c) * sizeof(float));
                if (NPART == 2) {
                    const float4 u = ld_shared_v4_f32(src + ((BM + r) * DQ_LD + c) * sizeof(float));
                    v = make_float4(v.x + u.x, v.y + u.y, v.z + u.z, v.w + u.w);
                }
                atomicAdd((float4 *)(dqa + (int64_t)(m0 + r) * d + c), v);
            }
        }
        mbar_arrive(empty + buf * sizeof(uint64_t));
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
    uint64_t *mbar = (uint64_t *)(dQb + 2 * NPART * BM * DQ_LD); /* [2] FULL, [2] EMPTY of the dQ buffers */

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
    const int m_first = first_query_tile<BM>(causal, p.causal_offset, n0, sq, num_m);
    const int kvalid = sk - n0; /* keys of the tile that exist */

    const uint32_t full = smem_u32(mbar), empty = full + 2 * sizeof(uint64_t);
    if (tid < 2) {
        mbar_init(full + tid * sizeof(uint64_t), SM90_THREADS);
        mbar_init(empty + tid * sizeof(uint64_t), WARPGROUP_THREADS);
    }
    __syncthreads(); /* the mbarriers initialized */
    if (tid >= SM90_THREADS) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REDUCER_REGS));
        if (do_dq)
            dq_reducer<BM, D>(dQb, dqa, full, empty, m_first, num_m, sq, d, tid - SM90_THREADS);
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
        fence_proxy_async(); /* the landed tiles are read by wgmma */
        if (tid < BM)        /* lse -> its log2-domain form, by the thread that loaded it */
            lse_s[st * BM + tid] = lse_to_log2(lse_s[st * BM + tid]);
        named_sync(BAR_MMA, SM90_THREADS); /* stage st landed; stage st^1 and dS^T no longer read by step m-1 */
        const int tid = tid_now(), lane = tid % WARP_SIZE, lc = lane % 4;
        const int wg = warp_uniform(tid / WARPGROUP_THREADS), w = (tid % WARPGROUP_THREADS) / WARP_SIZE;
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
        const uint32_t Qt = warp_uniform(smem_addr_now(Qs + st * Q_BYTES)), dOt = warp_uniform(smem_addr_now(dOs + st * Q_BYTES)); /* [BM][D] */
        const uint32_t Ka = warp_uniform(smem_addr_now(Ks)), Va = warp_uniform(smem_addr_now(Vs)), dSa = warp_uniform(smem_addr_now(dSs));
        const uint32_t lse_t = smem_addr_now(lse_s + st * BM), delta_t = smem_addr_now(delta_s + st * BM); /* [BM] */

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
        const int jb = key0 + w * 16 + lane / 4; /* the thread's first key row in the tile */
        const int t = causal ? jb - 2 * lc - diag : INT_MIN;
        const bool row0_out = jb >= kvalid, row8_out = jb + 8 >= kvalid;
        wgmma_wait<1>(); /* S^T */
        /* masking only in tiles where some key is masked. D = 64: two copies of the whole loop; D = 128:
         * one loop branching per 16-query block, so that the wgmma issue exists once (two copies of the
         * loop made ptxas serialize the wgmma's there, too few registers; at D = 64 the per-block
         * branch was 1-2% slower than the copies) */
        if (need_mask || D == 128) {
#pragma unroll
            for (int kq = 0; kq < BM / WGMMA_K; ++kq) {
                if (D == 64 || need_mask)
                    p_block<true>(s + 8 * kq, lse_t + (kq * WGMMA_K + 2 * lc) * sizeof(float), sl2, kq, t, row0_out, row8_out);
                else
                    p_block<false>(s + 8 * kq, lse_t + (kq * WGMMA_K + 2 * lc) * sizeof(float), sl2, kq, t, row0_out, row8_out);
                acc_to_a<T>(pa[kq], s + 8 * kq, s + 8 * kq + 4);
                wgmma_fence();
                wgmma_op<T, D>::template rs<1>(acc_dv, pa[kq], desc_mn_major<BM>(dOt, kq * WGMMA_K, 0), 1);
            }
        } else {
#pragma unroll
            for (int kq = 0; kq < BM / WGMMA_K; ++kq) {
                p_block<false>(s + 8 * kq, lse_t + (kq * WGMMA_K + 2 * lc) * sizeof(float), sl2, kq, t, row0_out, row8_out);
                acc_to_a<T>(pa[kq], s + 8 * kq, s + 8 * kq + 4);
                wgmma_fence();
                wgmma_op<T, D>::template rs<1>(acc_dv, pa[kq], desc_mn_major<BM>(dOt, kq * WGMMA_K, 0), 1);
            }
        }
        wgmma_commit();
        wgmma_wait<1>(); /* dP^T (dV may still run) */
#pragma unroll
        for (int kq = 0; kq < BM / WGMMA_K; ++kq) {
#pragma unroll
            for (int i = 2 * kq; i < 2 * kq + 2; ++i) {
                const float2 dl = ld_shared_v2_f32(delta_t + (i * 8 + 2 * lc) * sizeof(float));
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    dp[4 * i + e] = s[4 * i + e] * (dp[4 * i + e] - ((e & 1) ? dl.y : dl.x));
            }
            acc_to_a<T>(dsa[kq], dp + 8 * kq, dp + 8 * kq + 4);
            if (do_dq)
                store_a_frag_sw128<BN>(dSa, key0 + w * 16, kq * WGMMA_K, dsa[kq], lane);
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
                mbar_wait(smem_addr_now(mbar) + (2 + buf) * sizeof(uint64_t), (step / 2 - 1) & 1);
            const uint32_t dst = smem_addr_now(dQb) + (uint32_t)((((buf * NPART + dq_part) * BM + w * 16 + lane / 4) * DQ_LD +
                                                                  dq_col0 + 2 * lc) * sizeof(float)); /* (DQ_N) */
#pragma unroll
            for (int i = 0; i < DQ_N / 8; ++i) {
                st_shared_v2_f32(dst + i * 8 * sizeof(float), acc_dq[4 * i], acc_dq[4 * i + 1]);
                st_shared_v2_f32(dst + (8 * DQ_LD + i * 8) * sizeof(float), acc_dq[4 * i + 2], acc_dq[4 * i + 3]);
            }
            mbar_arrive(smem_addr_now(mbar) + buf * sizeof(uint64_t));
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

/* ------------------------------------------------------------------------------------------------ */
/* D = 256 (head dims 129..256)                                                                     */

#define D256_BN 64        /* keys per CTA: the M of every key-side wgmma, shared by both warpgroups */
#define D256_BM 64        /* queries per step */
#define D256_QW 32        /* S^T / dP^T queries per warpgroup */
#define D256_COLS 128     /* dK, dV and dQ columns per warpgroup */
#define D256_DQ_CHUNK 64  /* dQ columns per wgmma pass (keeps its accumulators at 32 registers) */


#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* dQ[:, cc .. cc + 64) = dS K[:, cc .. cc + 64) of the d256 kernel: K = its 64 keys, dS^T (dSa) and K
 * (Ka) read MN-major. No commit. */
template <typename T>
__device__ __forceinline__ void issue_dq_chunk_d256(float (&acc)[D256_DQ_CHUNK / 2], uint32_t dSa, uint32_t Ka, int cc)
{
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D256_BN / WGMMA_K; ++kk)
        wgmma_op<T, D256_DQ_CHUNK>::template ss<1, 1>(acc, desc_mn_major<D256_BN>(dSa, kk * WGMMA_K, 0),
                                                      desc_mn_major<D256_BN>(Ka, kk * WGMMA_K, cc), kk);
}

/* Add that chunk (this thread's rows row, row + 8) into dq_accum (sq, d) with vector red.add. */
__device__ __forceinline__ void add_dq_chunk_d256(float *dqa, int d, int sq, int row, int cc,
                                                  const float (&acc)[D256_DQ_CHUNK / 2], int lc, int lane)
{
#pragma unroll
    for (int i = 0; i < D256_DQ_CHUNK / 8; ++i) {
        if (cc + i * 8 < d) /* warp-uniform: the shuffles inside need all lanes */
            red_add_tile(dqa, d, row, row < sq, row + 8 < sq, cc + i * 8 + 2 * lc, acc + 4 * i, lane);
    }
}
#endif

/* One CTA per (64 keys, query head, batch). The dK/dV accumulators of 64 keys x 256 columns do not fit
 * one warpgroup, so the warpgroups split the columns: warpgroup wg owns columns [128 wg, +128) of dK,
 * dV and dQ, and computes S^T, dP^T for all 64 keys x queries [32 wg, +32) of the step. P^T and dS^T
 * go through smem (both warpgroups need all 64 queries as the K of dV, dK), so dV and dK are SS:
 *   S^T, dP^T  m64 n32, K = 256   (A: K or V, K-major; B: Q or dO rows [32 wg, +32), K-major)
 *   dV += P^T dO[:, cols], dK += dS^T Q[:, cols]   m64 n128, K = 64 queries (A: P^T/dS^T K-major;
 *              B: dO/Q MN-major)
 *   dQ[:, cols] = dS K[:, cols]   two passes of m64 n64, K = 64 keys (A: dS^T MN-major; B: K MN-major),
 *              added into dq_accum with red.add.
 * smem: K, V 32 KB each, Q/dO 2 stages x 2 x 32 KB, P^T and dS^T 8 KB each: 210 KB. 224 registers.
 * Measured (H200, bf16, 16k tokens, harness): 261 TFLOP/s at s2048, 286 at s8192 (mma.sync kernel: 170, 178). */
template <typename T, bool DO_DQ>
__global__ void __launch_bounds__(SM90_THREADS, 1) bwd_main_sm90_d256_kernel(const flash_params p)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int D = 256, BN = D256_BN, BM = D256_BM;
    constexpr int K_BYTES = BN * D * 2, Q_BYTES = BM * D * 2, PT_BYTES = BN * BM * 2;
    constexpr int NS = D256_QW / 2, NDKV = D256_COLS / 2, NDQ = D256_DQ_CHUNK / 2; /* accumulator regs */

    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = (uint8_t *)(((uintptr_t)smem_raw + SW128_ATOM_BYTES - 1) & ~(uintptr_t)(SW128_ATOM_BYTES - 1));
    uint8_t *Ks = smem;                       /* [BN][D] sw128 */
    uint8_t *Vs = Ks + K_BYTES;               /* [BN][D] sw128 */
    uint8_t *Qs = Vs + K_BYTES;               /* [2][BM][D] sw128 */
    uint8_t *dOs = Qs + 2 * Q_BYTES;          /* [2][BM][D] sw128 */
    uint8_t *Ps = dOs + 2 * Q_BYTES;          /* [BN][BM] sw128: P^T of the current step */
    uint8_t *dSs = Ps + PT_BYTES;             /* [BN][BM] sw128: dS^T of the current step */
    float *lse_s = (float *)(dSs + PT_BYTES); /* [2][BM] */
    float *delta_s = lse_s + 2 * BM;          /* [2][BM] */

    const int tid = threadIdx.x;
    const int n0 = blockIdx.x * BN, hq = blockIdx.y, b = blockIdx.z;
    const int64_t hk = hq / p.h_per_kv;
    const int sq = (int)p.sq, sk = (int)p.sk, d = (int)p.d;
    const float sl2 = p.scale_log2;
    const bool causal = p.causal != 0;
    constexpr bool do_dq = DO_DQ; /* a template parameter: ptxas keeps the wgmma pipeline only when
                                   * the dQ chunk 0 issue is unconditional */

    const T *kg = (const T *)p.k + b * p.k_s.batch + hk * p.k_s.head + n0 * p.k_s.row; /* (sk - n0, d) */
    const T *vg = (const T *)p.v + b * p.v_s.batch + hk * p.v_s.head + n0 * p.v_s.row; /* (sk - n0, d) */
    const T *qg = (const T *)p.q + b * p.q_s.batch + hq * p.q_s.head;                   /* (sq, d) */
    const T *dog = (const T *)p.dout + b * p.do_s.batch + hq * p.do_s.head;             /* (sq, d) */
    const int64_t bh = (int64_t)b * p.h + hq;
    const float *lseg = (const float *)p.lse + bh * sq;     /* (sq) */
    const float *deltag = (const float *)p.delta + bh * sq; /* (sq) */
    float *dqa = p.dq_accum + bh * sq * d;                  /* (sq, d) */

    const int num_m = (sq + BM - 1) / BM;
    const int m_first = first_query_tile<BM>(causal, p.causal_offset, n0, sq, num_m);
    const int kvalid = sk - n0; /* keys of the tile that exist */

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
        fence_proxy_async(); /* the landed tiles are read by wgmma */
        if (tid < BM)        /* lse -> its log2-domain form, by the thread that loaded it */
            lse_s[st * BM + tid] = lse_to_log2(lse_s[st * BM + tid]);
        __syncthreads();     /* stage st landed; stage st^1, P^T and dS^T no longer read by step m-1 */
        const int tid = tid_now(), lane = tid % WARP_SIZE, lc = lane % 4;
        const int wg = warp_uniform(tid / WARPGROUP_THREADS), w = (tid % WARPGROUP_THREADS) / WARP_SIZE;
        const int q0 = wg * D256_QW, c0 = wg * D256_COLS; /* the warpgroup's S^T queries, dK/dV/dQ columns */
        if (m + 1 < num_m) {
            const int m1 = m0 + BM, so = st ^ 1;
            load_tile_sw128<T, BM, D>(Qs + so * Q_BYTES, qg + m1 * p.q_s.row, p.q_s.row, sq - m1, d, tid);
            load_tile_sw128<T, BM, D>(dOs + so * Q_BYTES, dog + m1 * p.do_s.row, p.do_s.row, sq - m1, d, tid);
            load_vec_async<BM, SM90_THREADS>(lse_s + so * BM, lseg + m1, sq - m1, tid);
            load_vec_async<BM, SM90_THREADS>(delta_s + so * BM, deltag + m1, sq - m1, tid);
            cp_async_commit();
        }
        const uint32_t Qt = warp_uniform(smem_addr_now(Qs + st * Q_BYTES)), dOt = warp_uniform(smem_addr_now(dOs + st * Q_BYTES)); /* [BM][D] */
        const uint32_t Ka = warp_uniform(smem_addr_now(Ks)), Va = warp_uniform(smem_addr_now(Vs));
        const uint32_t Pa = warp_uniform(smem_addr_now(Ps)), dSa = warp_uniform(smem_addr_now(dSs));
        const uint32_t lse_t = smem_addr_now(lse_s + st * BM), delta_t = smem_addr_now(delta_s + st * BM); /* [BM] */

        /* S^T = K Q_wg^T, dP^T = V dO_wg^T: all 64 keys x the warpgroup's 32 queries */
        float s[NS], dp[NS]; /* overwritten by the first step (accumulate = 0) */
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / WGMMA_K; ++kk)
            wgmma_op<T, D256_QW>::template ss<0, 0>(s, desc_k_major<BN>(Ka, 0, kk * WGMMA_K), desc_k_major<BM>(Qt, q0, kk * WGMMA_K), kk);
        wgmma_commit();
#pragma unroll
        for (int kk = 0; kk < D / WGMMA_K; ++kk)
            wgmma_op<T, D256_QW>::template ss<0, 0>(dp, desc_k_major<BN>(Va, 0, kk * WGMMA_K), desc_k_major<BM>(dOt, q0, kk * WGMMA_K), kk);
        wgmma_commit();

        /* P^T, dS^T (masking as in bwd_main_sm90_kernel), to smem for both warpgroups */
        const int diag = clamp_diag((int64_t)m0 + p.causal_offset - n0);
        const bool need_mask = (causal && BN - 1 > diag) || kvalid < BN;
        const int jb = w * 16 + lane / 4; /* the thread's first key row */
        const int t = causal ? jb - 2 * lc - diag - q0 : INT_MIN;
        const bool row0_out = jb >= kvalid, row8_out = jb + 8 >= kvalid;
        wgmma_wait<1>(); /* S^T */
        if (need_mask) {
#pragma unroll
            for (int kq = 0; kq < D256_QW / WGMMA_K; ++kq)
                p_block<true>(s + 8 * kq, lse_t + (q0 + kq * WGMMA_K + 2 * lc) * sizeof(float), sl2, kq, t, row0_out,
                              row8_out);
        } else {
#pragma unroll
            for (int kq = 0; kq < D256_QW / WGMMA_K; ++kq)
                p_block<false>(s + 8 * kq, lse_t + (q0 + kq * WGMMA_K + 2 * lc) * sizeof(float), sl2, kq, t, row0_out,
                               row8_out);
        }
        wgmma_wait<0>(); /* dP^T */
#pragma unroll
        for (int i = 0; i < D256_QW / 8; ++i) {
            const float2 dl = ld_shared_v2_f32(delta_t + (q0 + i * 8 + 2 * lc) * sizeof(float));
#pragma unroll
            for (int e = 0; e < 4; ++e)
                dp[4 * i + e] = s[4 * i + e] * (dp[4 * i + e] - ((e & 1) ? dl.y : dl.x));
        }
#pragma unroll
        for (int kq = 0; kq < D256_QW / WGMMA_K; ++kq) {
            uint32_t a[4];
            acc_to_a<T>(a, s + 8 * kq, s + 8 * kq + 4);
            store_a_frag_sw128<BN>(Pa, w * 16, q0 + kq * WGMMA_K, a, lane);
            acc_to_a<T>(a, dp + 8 * kq, dp + 8 * kq + 4);
            store_a_frag_sw128<BN>(dSa, w * 16, q0 + kq * WGMMA_K, a, lane);
        }
        fence_proxy_async();
        __syncthreads(); /* P^T, dS^T of all 64 queries in smem */

        /* dQ[:, cols] = dS K[:, cols] in two chunks of 64 columns (K = the 64 keys), around dV += P^T
         * dO[:, cols] and dK += dS^T Q[:, cols] (K = the 64 queries): the tensor cores run chunk 0, dV,
         * dK, chunk 1 back to back, and the red.adds of chunk 0 overlap dV and dK. */
        static_assert(D256_COLS == 2 * D256_DQ_CHUNK, "two dQ chunks");
        const int row = m0 + w * 16 + lane / 4;
        float acc_dq[NDQ]; /* overwritten by the first step of each chunk (accumulate = 0) */
        if (do_dq) {
            issue_dq_chunk_d256<T>(acc_dq, dSa, Ka, c0);
            wgmma_commit();
        }
        wgmma_fence();
#pragma unroll
        for (int kq = 0; kq < BM / WGMMA_K; ++kq)
            wgmma_op<T, D256_COLS>::template ss<0, 1>(acc_dv, desc_k_major<BN>(Pa, 0, kq * WGMMA_K),
                                                      desc_mn_major<BM>(dOt, kq * WGMMA_K, c0), 1);
#pragma unroll
        for (int kq = 0; kq < BM / WGMMA_K; ++kq)
            wgmma_op<T, D256_COLS>::template ss<0, 1>(acc_dk, desc_k_major<BN>(dSa, 0, kq * WGMMA_K),
                                                      desc_mn_major<BM>(Qt, kq * WGMMA_K, c0), 1);
        wgmma_commit();
        if (do_dq) {
            wgmma_wait<1>(); /* chunk 0 (dV, dK may still run) */
            add_dq_chunk_d256(dqa, d, sq, row, c0, acc_dq, lc, lane);
            issue_dq_chunk_d256<T>(acc_dq, dSa, Ka, c0 + D256_DQ_CHUNK);
            wgmma_commit();
            wgmma_wait<0>();
            add_dq_chunk_d256(dqa, d, sq, row, c0 + D256_DQ_CHUNK, acc_dq, lc, lane);
        } else {
            wgmma_wait<0>();
        }
    }
    cp_async_wait<0>(); /* K/V still in flight when no query tile sees the key tile */

    const int j0 = n0 + (tid % WARPGROUP_THREADS) / WARP_SIZE * 16, c0 = tid / WARPGROUP_THREADS * D256_COLS;
    store_kv_grad<T, 1, D256_COLS>(p, (const float(*)[D256_COLS / 8][4])acc_dv, 1.f, p.dv, p.dv_s, p.dv_accum, b, hq,
                                   j0, c0);
    store_kv_grad<T, 1, D256_COLS>(p, (const float(*)[D256_COLS / 8][4])acc_dk, (float)p.scale, p.dk, p.dk_s,
                                   p.dk_accum, b, hq, j0, c0);
#endif
}

template <typename T>
static cudaError_t launch_main_sm90_d256(const flash_params *p, cudaStream_t stream)
{
    const size_t smem = SW128_ATOM_BYTES /* alignment slack */ +
                        (size_t)(2 * D256_BN * 256 + 4 * D256_BM * 256 + 2 * D256_BN * D256_BM) * 2 +
                        4 * D256_BM * sizeof(float);
    auto kernel = p->deterministic ? bwd_main_sm90_d256_kernel<T, false> : bwd_main_sm90_d256_kernel<T, true>;
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess)
        return err;
    const dim3 grid((unsigned int)((p->sk + D256_BN - 1) / D256_BN), (unsigned int)p->h, (unsigned int)p->b);
    kernel<<<grid, SM90_THREADS, smem, stream>>>(*p);
    return cudaGetLastError();
}

template <typename T, int D, int BM>
static cudaError_t launch_main_sm90(const flash_params *p, cudaStream_t stream)
{
    const size_t smem = SW128_ATOM_BYTES /* alignment slack */ + (size_t)(2 * SM90_BN * D + 4 * BM * D + SM90_BN * BM) * 2 +
                        (size_t)(4 * BM + 2 * dq_parts(D) * BM * (D + DQ_PAD)) * sizeof(float) + 4 * sizeof(uint64_t);
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
    if (disabled || p->d > 256 || (p->dtype != FLASH_BF16 && p->dtype != FLASH_FP16))
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
    if (p->d > 128)
        return p->dtype == FLASH_BF16 ? launch_main_sm90_d256<__nv_bfloat16>(p, stream)
                                      : launch_main_sm90_d256<__half>(p, stream);
    if (p->dtype == FLASH_BF16)
        return p->d <= 64 ? launch_main_sm90<__nv_bfloat16, 64, 64>(p, stream)
                          : launch_main_sm90<__nv_bfloat16, 128, 64>(p, stream);
    if (p->dtype == FLASH_FP16)
        return p->d <= 64 ? launch_main_sm90<__half, 64, 64>(p, stream) : launch_main_sm90<__half, 128, 64>(p, stream);
    return cudaErrorInvalidValue;
}
