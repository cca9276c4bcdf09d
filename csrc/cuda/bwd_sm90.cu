/* bwd_sm90.cu: the main backward kernels on Hopper tensor cores (wgmma, sm_90a), fp16/bf16, head dims up to 256
 * (flash_bwd_main_sm90, called by launch.cu between rows.cu's preprocess and postprocess). Each kernel has a dense
 * variant (HOOK = false: mask.h's band only) and a general one (HOOK = p->has_hook: softcap, ALiBi, attn_mask,
 * dropout, dbias as runtime branches). Every kernel here is a programmatic dependent launch (launch.h), started
 * while the preprocess drains: a CTA lets the dQ postprocess start first thing, sets up and issues its K, V loads,
 * then waits (grid_dependency_wait, every thread of both roles) before any access to dO, lse, delta, dq_accum or
 * dq_semaphore.
 *
 * bwd_main_sm90_kernel (d <= 128), CTA = (key tile of BN = 128 keys, query head, batch); nothing of size sq x sk
 * stored. K, V of the tile are loaded once (cp.async); the CTA walks the query tiles of BM rows that the band lets
 * see the tile (flash_query_tiles; HOOK: attn_mask-empty tiles skipped), Q, dO, lse, delta double-buffered.
 * MMA warpgroup wg owns keys [64 wg, +64), the M of its wgmma's:
 *   S^T = K_wg Q^T, dP^T = V_wg dO^T (SS); P^T = exp2(S^T scale log2e - lse log2e), dS^T = P^T o (dP^T - delta);
 *   dV_wg += P^T dO (RS from the repacked S^T accumulators; dense D = 64, BM = 128 in FlashAttention-3's order,
 *   d64_rs: all of P^T and dS^T first, then dV per block, lse / delta shuffled);
 *   dK_wg += dS^T Q (RS); dS^T to smem, then dQ_partial = dS K (SS, both MN-major: at D = 128 the warpgroups
 *   split its columns, at D = 64 / BM = 128 its rows, at D = 64 / BM = 64 (HOOK) each makes a partial); the
 *   dense kernels (D = 128, and D = 64 by d64_rs) issue dQ before dK.
 * The partials go to one of two fp32 smem buffers; a third warpgroup, the dQ reducer (setmaxnreg 24, MMA 240),
 * sums them into dq_accum with vector red.add while the MMA warpgroups go on (FULL / EMPTY mbarriers per buffer;
 * the MMA warpgroups meet on named barrier 1, never __syncthreads). In the dense non-ORDERED D = 64 kernel, where
 * the tensor maps can be built, warp 0 of that warpgroup loads Q, dO, lse and delta by TMA instead (bwd90_producer;
 * FULL / EMPTY mbarriers per stage) and its other 3 warps reduce. dK (times scale) and dV stay in registers to
 * the end: dtype when h == h_kv, else fp32 per query head for the GQA postprocess.
 * Deterministic mode (p->dq_semaphore): ORDERED instantiations walk key tiles in descending order and each
 * reducer adds a query tile's dQ after the next higher key tile's (dq_order: acquire spin, release store); at
 * D = 128 (dense) one warpgroup per step makes the whole dQ_partial, alternating (dq_alt), lse / delta are loaded a
 * block ahead and whole dQ tiles take the reducer's fast path (stat_ahead).
 * Masking: full tiles take an unmasked P step; the others one compare per value against the upper bound and the
 * key tail, and the lower bound only in tiles it cuts. HOOK, per element of S^T in the P step: softcap (tanh.approx),
 * ALiBi, the attn_mask (partial tiles only); dropout keep bits (Philox per 4 keys, made into smem under the S^T
 * wgmma's); in the dS step dP^T times keep * dropout_scale; dbias before the softcap factor.
 * Work order: with an upper band bound the dense kernels run the heaviest key tiles first within groups of heads
 * (sched.cuh bwd90_cta_of). Varlen: flash_seq_uniform keeps the sequence's values warp-uniform.
 * bwd_main_sm90_d256_kernel (d 129..256): 64 keys per CTA, the warpgroups split dK, dV and dQ's columns (its own
 * comment).
 *
 * Tiles (tiles.h bwd90_tiles): BN 128 x BM 64, 3 warpgroups (384 threads); dense D = 64: BM 128. Smem D = 128:
 * 214 KB; D = 64: 203 KB, HOOK 154 KB + 1 KB of keep bits; 128-byte swizzled (wgmma.cuh); head dims below D are
 * zero-padded and computed, only global writes guarded. Requirements: as bwd_sm80.cu, plus an sm_90a build.
 *
 * Speed (H200, bwd_harness time, bf16 16k tokens, whole backward): d128 s8192 464 TFLOP/s (causal 460); behind
 * cuDNN (bench_gpu.py 2026-12-03: 0.86-0.95x at d64 / d128, 0.75-0.80x at d256). Every shape and the history:
 * benchmarks/results/h200/history_bwd_sm90.md.
 */
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../constants.h"
#include "../mask.h"
#include "../score.h"
#include "bwd_common.cuh"
#include "common.cuh"
#include "launch.h"
#include "sched.cuh"
#include "tiles.h"
#include "wgmma.cuh"

#define SM90_WARPGROUPS 2
#define SM90_THREADS (SM90_WARPGROUPS * WARPGROUP_THREADS)     /* the two MMA warpgroups */
#define SM90_THREADS_ALL (SM90_THREADS + WARPGROUP_THREADS)     /* + the dQ reducer warpgroup */
#define SM90_MMA_WARPS (SM90_THREADS / FLASH_WARP_SIZE)
#define MMA_REGS 240     /* registers per thread of the MMA warpgroups (setmaxnreg) ... */
#define REDUCER_REGS 24  /* ... and of the reducer: what the reducer frees, (168 - 24) * 128, is what the
                          * MMA warpgroups take, (240 - 168) * 256; 168 = the launch cap for 384 threads */
/* named barrier of the MMA warpgroups (0 is __syncthreads, used once before the roles split) */
#define BAR_MMA 1
#define DQ_PAD 8         /* fp32 padding per row of the dQ buffers: conflict-free float2 stores */
#define BAR_REDUCER 4 /* the dQ reducer warpgroup's own (ORDERED: the semaphore waited for / its adds done);
                       * + 1: its second half's (dq_split) */
#define DQ_HALF_THREADS (WARPGROUP_THREADS / 2) /* ORDERED, two dQ buffers: the reducer's halves (dq_split) */
#define SM90_BN (bwd90_tiles<128>::BN) /* keys per CTA (tiles.h) */
static_assert(bwd90_tiles<64>::BN == SM90_BN, "one key tile for the kernel of head dims up to 128");
#define WG_KEYS 64    /* keys per warpgroup: the M of one wgmma */
#define DQ_N 64       /* dQ columns per warpgroup (D = 128) or all of them (D = 64) */
#define WGMMA_K 16    /* K of one wgmma step */
#define WARP_KEYS 16  /* keys (rows of S^T) per warp */
#define KEEP_KEYS 8   /* keys of one dropout keep byte: two Philox calls (mask.h, 4 keys per call) */

/* Dropout keep bits of one warp (HOOK): its WARP_KEYS keys (two groups of KEEP_KEYS) x NQW queries, one byte
 * per (group, query), bit b = key 8 g + b. */
__host__ __device__ constexpr int keep_warp_bytes(int nqw)
{
    return WARP_KEYS / KEEP_KEYS * nqw;
}

/* dQ_partial = dS K per tile: at D = 128 the warpgroups split its columns (one partial, 64 columns
 * each, K = all BN keys); at D = 64 with BM = 64 each computes all 64 columns from its own 64 keys (two
 * partials, summed by the reducer); at D = 64 with BM = 128 they split its rows (one partial, 64 queries
 * each, K = all BN keys). Every wgmma operand stays on whole 64-column panels. */
__host__ __device__ constexpr int dq_parts(int D, int BM)
{
    return D == 64 && BM == 64 ? 2 : 1;
}

/* The dense D = 64 kernel (BM = 128) in FlashAttention-3's order: all of P^T and dS^T first, then dV += P^T dO
 * with P^T from registers (RS), dQ, dK; lse and delta shuffled (stat_pair). */
__host__ __device__ constexpr bool d64_rs(int D, int BM)
{
    return D == 64 && BM == 128;
}

#define DQ_BUFS 2 /* dQ buffers between the MMA warpgroups and the reducer */

/* Deterministic mode's dQ by one warpgroup per step, alternating (issue 35; cuDNN's order, read from its executed
 * counts, benchmarks/results/h100/session_2026-12-07e): in the dense ORDERED D = 128 kernel the warpgroup of parity
 * step % 2 computes the whole 64 x 128 dQ_partial (8 wgmma's of N = 128, K = the BN keys) and hands it to the
 * reducer (each buffer one warpgroup's, as the reducer's halves take them); the other issues its dK alone. H100
 * (h100/session_2026-12-07g): deterministic d128 s8k causal 1.016x; the same order in the default kernel 0.977-0.986x
 * from s2k (it stays on both warpgroups' 64-column halves there). */
__host__ __device__ constexpr bool dq_alt(int D, bool hook, bool ordered, bool tma)
{
    return D == 128 && ordered && !hook && !tma;
}

/* Deterministic mode's dense D = 128 kernel (ORDERED): lse / delta pairs loaded one 16-query block ahead of their
 * use (p_block_at; block 0's before the S^T / dP^T waits, which an asm wgmma wait would otherwise keep them behind)
 * and whole dQ tiles by the reducer's fast path (dq_add_tile WHOLE). H100 (h100/session_2026-12-07j): det d128 s8k
 * causal 1.092x; the same in the default kernels 0.985-0.993x from s2k (the reducer's path alone 0.974-0.985x, the
 * stat loads alone 0.989-0.998x), so there they stay off. */
__host__ __device__ constexpr bool stat_ahead(int D, bool hook, bool ordered)
{
    return D == 128 && ordered && !hook;
}

/* TMA loads (issue 35, rank 2): the dense (HOOK = false) non-ORDERED D = 64 kernel, where the tensor maps can be
 * built (alignment; else the cp.async kernel), takes Q, dO, lse and delta from warp 0 of the third warpgroup (the
 * producer: TMA boxes of Q and dO, lse in its log2 form and delta by plain loads, FULL / EMPTY mbarriers per
 * stage); the other 3 warps reduce dQ (H100, 5 rounds: d64 0.99-1.04x the cp.async kernel, s2k-s8k 1.01-1.04x;
 * at D = 128 the same loads lost 3-13%: benchmarks/results/h100/tma_d64_2026-12-06). */
#define PRODUCER_THREADS FLASH_WARP_SIZE                               /* TMA: warp 0 of the third warpgroup */
#define RED_THREADS_TMA (WARPGROUP_THREADS - PRODUCER_THREADS)          /* TMA: the dQ reducer's threads */

/* The TMA tensor maps of q and dout, 4-D (d, rows, heads, batches) as fwd_sm90.cu's (varlen: rows = total_q, one
 * batch), boxes of 64 columns x BM rows, 128-byte swizzle; built per call by the launcher, passed beside the
 * params as a __grid_constant__ parameter (zeros for the cp.async kernels). */
typedef struct bwd90_maps {
    CUtensorMap q, dout;
} bwd90_maps;

/* ORDERED, dense (D = 128; D = 64, not measured on its own): the reducer's halves take the tiles of one buffer
 * each, so that one half's wait, additions and release overlap the other's (det / default time d128 s2k / s8k
 * 1.13 / 1.12 -> 1.04 / 1.06, causal 1.12 / 1.21 -> 1.05 / 1.12: benchmarks/results/h200/det_ab_2026-12-02).
 * The EMPTY barriers then count one half's arrivals. */
__host__ __device__ constexpr bool dq_split(int D, int BM, bool hook, bool ordered)
{
    return ordered && !hook;
}

/* Arrivals on a dQ buffer's EMPTY barrier: the reducer warpgroup, or one half of it (dq_split). */
__host__ __device__ constexpr int dq_empty_arrivals(int D, int BM, bool hook, bool ordered)
{
    return dq_split(D, BM, hook, ordered) ? DQ_HALF_THREADS : WARPGROUP_THREADS;
}

/* Layout of the 8 accumulator values s8 of one 16-query block kq of a thread (wgmma D fragment of S^T,
 * n8 blocks 2 kq and 2 kq + 1): value v = 4 h + e is key jb + 8 (e >> 1) (jb = the thread's first key
 * row) and query 16 kq + 8 h + 2 lc + (e & 1) (lc = lane % 4). jl - il for value v is therefore
 * (jb - 2 lc) - block_c(kq, v), and the band tests become one compare per value against a per-thread
 * constant. */
__host__ __device__ constexpr int block_c(int kq, int v)
{
    return 8 * (2 * kq + v / 4) + (v & 1) - 8 * ((v & 3) >> 1);
}
/* query of value v relative to the thread's first query (2 lc) of the block's tile */
__host__ __device__ constexpr int block_qi(int kq, int v)
{
    return 16 * kq + 8 * (v / 4) + (v & 1);
}
/* key of value v relative to jb */
__host__ __device__ constexpr int block_kj(int v)
{
    return 8 * ((v & 3) >> 1);
}

/* Byte (g, q) of a warp's dropout keep bits (dropout_keep_bytes: key group g, query q of NQW), and the
 * word of 16-query block kq for the threads with lane % 4 = lc: its byte 2 h + (e & 1) is query
 * 16 kq + 8 h + 2 lc + (e & 1). */
template <int NQW>
__host__ __device__ constexpr int keep_byte_index(int g, int q)
{
    return g * NQW + (q / 2 % 4) * (NQW / 4) + (q / 8) * 2 + q % 2;
}

template <int NQW>
__host__ __device__ constexpr int keep_word_index(int g, int kq, int lc)
{
    return g * NQW + lc * (NQW / 4) + 4 * kq;
}

/* Key group of value v (block_c layout) and its bit in that group's word, shifted right by the
 * thread's key in the group (lane / 4 % 8). */
__host__ __device__ constexpr int keep_group(int v)
{
    return (v & 3) >> 1;
}

__host__ __device__ constexpr int keep_shift(int v)
{
    return 8 * (2 * (v / 4) + (v & 1));
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

/* Q, dO (BM x D) and lse, delta (BM) of query tile m0 into one stage (cp.async, no commit). */
template <typename T, int BM, int D>
__device__ __forceinline__ void load_query_tile(uint8_t *qs, uint8_t *dos, float *lse_s, float *delta_s,
                                                const flash_params &p, const T *qg, const T *dog, const float *lseg,
                                                const float *deltag, int sq, int d, int m0, int tid)
{
    load_tile_sw128<T, BM, D>(qs, qg + m0 * p.q_s.row, p.q_s.row, sq - m0, d, tid);
    load_tile_sw128<T, BM, D>(dos, dog + m0 * p.do_s.row, p.do_s.row, sq - m0, d, tid);
    load_vec_async<BM, SM90_THREADS>(lse_s, lseg + m0, sq - m0, tid);
    load_vec_async<BM, SM90_THREADS>(delta_s, deltag + m0, sq - m0, tid);
}

/* A 16 x 16 A fragment (acc_to_a layout; rows row0 + [0, 16), columns col0 + [0, 16)) of the sw128 tile
 * of ROWS rows at shared address s moves with one stmatrix / ldmatrix: a[i] is the 8 x 8 matrix i
 * (rows + 8 (i % 2), columns + 8 (i / 2)), whose row lane % 8 lane l addresses for matrix l / 8 (each
 * row of 8 elements is one 16-byte chunk of the swizzled layout). This is lane's address. */
template <int ROWS>
__device__ __forceinline__ uint32_t a_frag_addr_sw128(uint32_t s, int row0, int col0, int lane)
{
    const int r = row0 + lane % 8 + 8 * (lane / 8 % 2), c = col0 + 8 * (lane / 16);
    return s + sw128_offset(ROWS, r, c);
}

/* Store the fragment there. */
template <int ROWS>
__device__ __forceinline__ void store_a_frag_sw128(uint32_t s, int row0, int col0, const uint32_t a[4], int lane)
{
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                     a_frag_addr_sw128<ROWS>(s, row0, col0, lane)),
                 "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3])
                 : "memory");
}

/* a_frag_addr_sw128 of columns 16 kq from addr0, that of column 0 (same rows, lane): the panel kq / 4 is a
 * constant, and the 16-byte chunk index 2 (kq % 4) + lane / 16, whose low bit is the lane's, XORs into the
 * swizzle as 2 (kq % 4) (the tile base is 1024-byte aligned): one LOP3 per block instead of the whole offset. */
template <int ROWS>
__device__ __forceinline__ uint32_t a_frag_addr_sw128_kq(uint32_t addr0, int kq)
{
    return (addr0 ^ (uint32_t)(kq % 4 * 32)) + (uint32_t)(kq / 4 * ROWS * SW128_ROW_BYTES);
}

/* store_a_frag_sw128 at the lane's address. */
__device__ __forceinline__ void store_a_frag_at(uint32_t addr, const uint32_t a[4])
{
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a[0]),
                 "r"(a[1]), "r"(a[2]), "r"(a[3])
                 : "memory");
}

/* The inverse: the fragment that store_a_frag_sw128 wrote there (ldmatrix with the same addresses). */
template <int ROWS>
__device__ __forceinline__ void load_a_frag_sw128(uint32_t s, int row0, int col0, uint32_t a[4], int lane)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                 : "r"(a_frag_addr_sw128<ROWS>(s, row0, col0, lane))
                 : "memory");
}

__device__ __forceinline__ void st_shared_u8(uint32_t addr, uint32_t v)
{
    asm volatile("st.shared.u8 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

/* What a thread needs to turn one tile's S^T values into P^T. t = jb - 2 lc - hi, u = jb - 2 lc - lo
 * with the tile-local band [lo, hi] of flash_tile_diag (and the warpgroup's first query q0 folded in);
 * row0_out / row8_out: the keys jb, jb + 8 are past sk. */
struct p_tile {
    uint32_t lse;   /* shared address of the stage's log2 lse at the thread's first query */
    float mul;      /* the factor of S^T in the exponent: scale log2e; HOOK: hook_tile.mul */
    int t, u;
    bool row0_out, row8_out;
};

/* A per-query statistic's pairs for one 16-query block kq (its n8 blocks 2 kq, 2 kq + 1) from a thread's shared
 * address of it (its first query's: + 2 lc). The main loop loads them one block ahead: an asm wgmma wait or issue
 * keeps the shared loads after it, which left each block's LDS latency exposed before its first FFMA / FADD (ncu
 * stall sampling, d128 s8k: the S^T block 0 FFMA alone 4.4% of the kernel's samples, short scoreboard). */
__device__ __forceinline__ void stat_block_load(float2 v[2], uint32_t s, int kq)
{
    v[0] = ld_shared_v2_f32(s + 16 * kq * sizeof(float));
    v[1] = ld_shared_v2_f32(s + (16 * kq + 8) * sizeof(float));
}

/* P^T of one 16-query block (8 values s8, layout of block_c) from S^T: exp2(S^T mul - lse2). MASK: 0
 * where the key is past sk or jl - il > hi (t > block_c: one compare per value). */
template <bool MASK>
__device__ __forceinline__ void p_block(float s8[8], int kq, const p_tile &pt)
{
#pragma unroll
    for (int h = 0; h < 2; ++h) { /* n8 block 2 kq + h: queries + 8 h */
        const float2 l2 = ld_shared_v2_f32(pt.lse + (16 * kq + 8 * h) * sizeof(float));
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int v = 4 * h + e;
            float pv = exp2_approx(fmaf(s8[v], pt.mul, -((e & 1) ? l2.y : l2.x)));
            if (MASK && ((e >> 1 ? pt.row8_out : pt.row0_out) || pt.t > block_c(kq, v)))
                pv = 0.f;
            s8[v] = pv;
        }
    }
}

/* The band's lower bound on the same block: 0 where jl - il < lo (u < block_c). Only in tiles that
 * the lower bound cuts, so that elsewhere (the causal diagonal) the test stays one compare. */
__device__ __forceinline__ void p_block_lo(float s8[8], int kq, int u)
{
#pragma unroll
    for (int v = 0; v < 8; ++v)
        if (u < block_c(kq, v))
            s8[v] = 0.f;
}

/* A per-query statistic of a stage (lse in its log2 form, or delta) as d64_rs reads it: a thread's values are
 * the pairs of queries 8 i + 2 lc + {0, 1} of the BM / 8 n8 blocks i (the block_c layout), the same for the 8
 * lanes of equal lc. Each thread loads only those of blocks lane / 4 + 8 k (BM / 64 conflict-free 8-byte loads
 * per step) and takes block i's pair from lane 4 (i % 8) + lc with shuffles (FlashAttention-3's ShuffleLSE). */
template <int BM>
struct stat_pair {
    float2 v[BM / 64];
};

template <int BM>
__device__ __forceinline__ stat_pair<BM> stat_pair_load(uint32_t s, int lane)
{
    stat_pair<BM> x;
#pragma unroll
    for (int k = 0; k < BM / 64; ++k)
        x.v[k] = ld_shared_v2_f32(s + (64 * k + 8 * (lane / 4) + 2 * (lane % 4)) * sizeof(float));
    return x;
}

/* v of lane 4 r + lane % 4: shfl.sync.idx with segment mask 3 (c = 0x31f) keeps the two low bits of the lane,
 * so that the source lane is the same in all lanes (r a constant once unrolled: an immediate). */
__device__ __forceinline__ float shfl_quad_row(float v, int r)
{
    float y;
    asm("shfl.sync.idx.b32 %0, %1, %2, 0x31f, 0xffffffff;\n" : "=f"(y) : "f"(v), "r"(4 * r));
    return y;
}

/* The pair of n8 block i. */
template <int BM>
__device__ __forceinline__ float2 stat_pair_of(const stat_pair<BM> &x, int i)
{
    return make_float2(shfl_quad_row(x.v[i / 8].x, i % 8), shfl_quad_row(x.v[i / 8].y, i % 8));
}

/* p_block with lse from a stat_pair (lse2: this block's pairs, n8 blocks 2 kq and 2 kq + 1). */
template <bool MASK>
__device__ __forceinline__ void p_block_pair(float s8[8], int kq, const p_tile &pt, const float2 lse2[2])
{
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int v = 4 * h + e;
            float pv = exp2_approx(fmaf(s8[v], pt.mul, -((e & 1) ? lse2[h].y : lse2[h].x)));
            if (MASK && ((e >> 1 ? pt.row8_out : pt.row0_out) || pt.t > block_c(kq, v)))
                pv = 0.f;
            s8[v] = pv;
        }
    }
}

/* The main loop's P^T of block kq: from the lse pairs loaded a block ahead (lse2) where AHEAD (stat_ahead), else
 * by p_block's own loads. */
template <bool AHEAD, bool MASK>
__device__ __forceinline__ void p_block_at(float s8[8], int kq, const p_tile &pt, const float2 lse2[2])
{
    if (AHEAD)
        p_block_pair<MASK>(s8, kq, pt, lse2);
    else
        p_block<MASK>(s8, kq, pt);
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

/* x, computed here once (volatile: never rematerialized later from its inputs, which ptxas otherwise
 * does for the band constants in every masked block of the P loop). */
__device__ __forceinline__ int computed_here(int x)
{
    int r;
    asm volatile("mov.b32 %0, %1;\n" : "=r"(r) : "r"(x));
    return r;
}

/* ------------------------------------------------------------------------------------------------ */
/* The HOOK variant's pieces                                                                        */

/* The first query tile >= m (and < m_end) whose attn_mask blocks see something, and its flags
 * (FLASH_MASK_ANY_VISIBLE alone without a mask): flash_mask_tile_flags of query tile m x this CTA's key
 * tile (blockIdx.x, BN keys), one mask block per lane (lane (r, c): block row m BM / 16 + r, column
 * n0 / 16 + c), ORed over the warp. Every lane of the warp must call it. Everything is derived from p
 * and the block index at each call, so that no state is held across the main loop (the dQ reducer has
 * 24 registers). */
#define NEXT_TILE_AHEAD 4 /* flag loads in flight while next_visible_tile skips hidden tiles */
template <int BM, int BN, bool REVERSED>
__device__ __forceinline__ int next_visible_tile(const flash_params &p, int m, int m_end, unsigned &flags)
{
    constexpr int RB = BM / FLASH_MASK_BLOCK, CB = BN / FLASH_MASK_BLOCK;
    static_assert(RB * CB <= FLASH_WARP_SIZE && BM % FLASH_MASK_BLOCK == 0 && BN % FLASH_MASK_BLOCK == 0,
                  "one mask block per lane");
    flags = FLASH_MASK_ANY_VISIBLE;
    if (p.mask_blocks == 0)
        return m;
    /* a mask exists for dense batches only: p.sq, p.sk are the sequence's and the flags' extent */
    const int lane = threadIdx.x % FLASH_WARP_SIZE, r = lane / CB, c = lane % CB;
    const int64_t n0 = (int64_t)(REVERSED ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * BN; /* bwd90_cta_descending */
    const bool lane_ok = r < RB && n0 + c * FLASH_MASK_BLOCK < p.sk;
    const flash_strides4 &fs = p.mask_blocks_s;
    const uint8_t *f = p.mask_blocks + blockIdx.z * fs.batch + blockIdx.y * fs.head + r * fs.row +
                       (n0 / FLASH_MASK_BLOCK + c) * fs.col; /* the lane's block of query tile 0 */
    if (m >= m_end)
        return m;
    /* tile m alone first (the next tile is visible in most calls) */
    flags = __reduce_or_sync(FULL_MASK, lane_ok && (int64_t)m * BM + r * FLASH_MASK_BLOCK < p.sq
                                            ? (unsigned)f[(int64_t)m * RB * fs.row] : 0u);
    if (flags & FLASH_MASK_ANY_VISIBLE)
        return m;
    /* a run of hidden tiles: NEXT_TILE_AHEAD tiles' loads in flight at once, one latency per that many */
    for (++m; m < m_end; m += NEXT_TILE_AHEAD) {
        unsigned fl[NEXT_TILE_AHEAD];
#pragma unroll
        for (int a = 0; a < NEXT_TILE_AHEAD; a++)
            fl[a] = lane_ok && m + a < m_end && (int64_t)(m + a) * BM + r * FLASH_MASK_BLOCK < p.sq
                        ? f[(int64_t)(m + a) * RB * fs.row]
                        : 0u;
#pragma unroll
        for (int a = 0; a < NEXT_TILE_AHEAD; a++) {
            flags = __reduce_or_sync(FULL_MASK, fl[a]);
            if (flags & FLASH_MASK_ANY_VISIBLE)
                return m + a;
        }
    }
    return m_end;
}

/* The query tile from m on that the CTA walks (dense: m itself). REVERSED: the grid's key tiles run
 * backwards (ORDERED, bwd90_cta_descending). */
template <bool HOOK, int BM, int BN, bool REVERSED = false>
__device__ __forceinline__ int next_query_tile(const flash_params &p, int m, int m_end, unsigned &flags)
{
    flags = FLASH_MASK_ANY_VISIBLE;
    if constexpr (HOOK) /* BM = 64 (one mask block per lane); the dense BM = 128 kernel walks every tile */
        return next_visible_tile<BM, BN, REVERSED>(p, m, m_end, flags);
    else
        return m;
}

/* Writes the dropout keep bits of one warp and query tile: keys kw + [0, WARP_KEYS) (kw a multiple of 8)
 * x queries i0 + [0, NQW). Lane l makes the Philox calls of queries l + 32 k for both key groups g
 * and stores byte (g, q) at g NQW + ((q / 2) % 4) (NQW / 4) + (q / 8) 2 + q % 2: then the 4 bytes of
 * the 16-query block kq of the thread with lc = q / 2 % 4 are one word (keep_word). */
template <int NQW>
__device__ __forceinline__ void dropout_keep_bytes(const flash_params &p, int64_t bh, int64_t i0, int64_t kw,
                                                   uint32_t region, int lane)
{
    constexpr int GROUPS = WARP_KEYS / KEEP_KEYS;
    constexpr int CALLS = KEEP_KEYS / FLASH_DROPOUT_KEYS_PER_CALL;
    static_assert(NQW % FLASH_WARP_SIZE == 0 && GROUPS == 2 && CALLS == 2, "keep-bit layout");
    const uint32_t cut = flash_dropout_cut(&p); /* kept iff draw > cut */
    __syncwarp(); /* the previous tile's words have been read */
#pragma unroll 1 /* a loop: unrolled, the d128 HOOK kernels spilled 100 bytes instead of 32 (ptxas -v) */
    for (int c = 0; c < GROUPS * NQW / FLASH_WARP_SIZE; ++c) {
        const int g = c % GROUPS, q = lane + FLASH_WARP_SIZE * (c / GROUPS);
        uint32_t byte = 0;
#pragma unroll
        for (int half = 0; half < CALLS; ++half) {
            uint32_t bits[FLASH_DROPOUT_KEYS_PER_CALL];
            flash_dropout_bits(&p, bh, i0 + q, (kw / KEEP_KEYS + g) * CALLS + half, bits);
#pragma unroll
            for (int k = 0; k < FLASH_DROPOUT_KEYS_PER_CALL; ++k)
                byte |= (uint32_t)(bits[k] > cut) << (FLASH_DROPOUT_KEYS_PER_CALL * half + k);
        }
        st_shared_u8(region + keep_byte_index<NQW>(g, q), byte);
    }
    __syncwarp(); /* the bytes are visible to the warp */
}

/* The keep word of 16-query block kq, key group g for the thread (lane): byte 2 h + (e & 1) holds
 * queries 16 kq + 8 h + 2 lc + (e & 1), shifted so that bit 8 (2 h + (e & 1)) is the thread's key. */
template <int NQW>
__device__ __forceinline__ uint32_t keep_word(uint32_t region, int g, int kq, int lane)
{
    const int lc = lane % 4;
    return ld_shared_u32(region + keep_word_index<NQW>(g, kq, lc)) >> (lane / 4 % 8);
}

/* The keep bit of value v (block_c layout) in the block's two words. */
__device__ __forceinline__ bool keep_bit(const uint32_t w[2], int v)
{
    return (w[keep_group(v)] >> keep_shift(v)) & 1u;
}

/* The HOOK variant's per-thread state (values in the block_c layout of the thread's first key jb and
 * first query qf of the tile). The hooked S^T values s8 stay in units of `mul`: the exponent is
 * s8 mul - lse2, as in the dense P step, so that the plain score needs no extra multiply. */
struct hook_tile {
    /* per CTA (hook_cta_init) */
    flash_score_f sc;    /* score.h's constants in units of mul (to_units = log2e / mul), those the steps
                          * below take from it: softcap on, s8 = th = tanh(flash_score_cap_in(q.k)) with
                          * inv_cap = scale / softcap, mul = softcap log2e; off (inv_cap 0), s8 = q.k, mul =
                          * scale log2e, or (scale <= 0, where the bool mask's -inf would flip sign) s8 =
                          * scale log2e q.k, mul = 1; the additive mask (flash_score_mask_add); the ALiBi
                          * slope (flash_score_at) */
    bool prescale;
    float mul;
    float alibi;         /* - sc.slope: s8 += alibi |dist0 - block_c| */
    bool stash_g;        /* softcap: the derivative g waits in shared memory for dS^T (always where
                          * holding it across the P step costs spills, and with dbias, which needs dS^T
                          * without it); else P^T is multiplied by it at once (dS^T = P^T g (dP^T - delta)) */
    bool dropout;
    int alibi_offset;    /* the sequence's (flash_seq) */
    /* per query tile (hook_tile_set); the pointers into the attn_mask and dbias are formed where they
     * are used (fewer registers held across the P step) */
    int m0, n0, jb, qf;  /* the tile's first query and key, the thread's first key and query in it */
    float dist0;         /* ALiBi: j - i - alibi_offset of the thread's first element */
    bool read_mask;      /* the tile's attn_mask blocks are partial: read it */
    bool row0_out, row8_out;
    uint32_t keep;       /* dropout: shared address of this warp's keep bytes */
    uint32_t gstash;     /* stash_g: shared address of the tile holding the derivative (dS^T's) */
    int g_row0, g_col0;  /* this warp's rows in it and the warpgroup's first query */
};

__device__ __forceinline__ void hook_cta_init(hook_tile &hk, const flash_params &p, const flash_seq &s, int b, int hq,
                                              bool stash)
{
    const bool cap = flash_score_capped(&p);
    hk.prescale = !cap && !(p.scale_log2 > 0.f);
    hk.sc.inv_cap = cap ? (float)p.scale / p.softcap : 0.f;
    hk.mul = cap ? p.softcap * FLASH_LOG2E_F : (hk.prescale ? 1.f : p.scale_log2);
    hk.sc.to_units = FLASH_LOG2E_F / hk.mul;
    flash_score_at(&hk.sc, &p, s.alibi_offset, b, hq);
    hk.alibi = -hk.sc.slope;
    hk.stash_g = cap && (stash || flash_score_has_grad(&p));
    hk.dropout = p.dropout_threshold != 0;
    hk.alibi_offset = (int)s.alibi_offset;
}

/* The per-tile part (fields as in the struct; flags: the tile's attn_mask flags). */
__device__ __forceinline__ void hook_tile_set(hook_tile &hk, const flash_params &p, int m0, int n0, int jb, int qf,
                                              unsigned flags, int kvalid, uint32_t keep, uint32_t gstash, int g_row0,
                                              int g_col0)
{
    hk.dist0 = (float)((int64_t)n0 + jb - m0 - qf - hk.alibi_offset);
    hk.m0 = m0;
    hk.n0 = n0;
    hk.jb = jb;
    hk.qf = qf;
    hk.read_mask = (flags & FLASH_MASK_ANY_MASKED) != 0;
    hk.row0_out = jb >= kvalid;
    hk.row8_out = jb + 8 >= kvalid;
    hk.keep = keep;
    hk.gstash = gstash;
    hk.g_row0 = g_row0;
    hk.g_col0 = g_col0;
}

/* Value v of block kq exists: its query is below sq and its key below sk (for the attn_mask and dbias,
 * which exist for dense batches only: p.sq is the sequence's). */
__device__ __forceinline__ bool elem_exists(const hook_tile &hk, const flash_params &p, int kq, int v)
{
    return hk.m0 + hk.qf + block_qi(kq, v) < p.sq && !((v & 3) >> 1 ? hk.row8_out : hk.row0_out);
}

/* The score hook on one block (score.h's order: softcap, ALiBi, attn_mask through flash_score_mask_*):
 * S^T values q.k -> s8 in units of mul; the softcap derivative 1 - th^2 (as flash_score_cap_grad) goes to
 * the stash or to g8. */
template <typename T, int ROWS>
__device__ __forceinline__ void hook_scores(float s8[8], float g8[8], int kq, const hook_tile &hk,
                                            const flash_params &p, int lane)
{
    if (hk.sc.inv_cap != 0.f) {
#pragma unroll
        for (int v = 0; v < 8; ++v) {
            const float th = tanh_approx(flash_score_cap_in(&hk.sc, s8[v]));
            g8[v] = fmaf(-th, th, 1.f);
            s8[v] = th;
        }
        if (hk.stash_g) {
            uint32_t ga[4];
            acc_to_a<__half>(ga, g8, g8 + 4);
            store_a_frag_sw128<ROWS>(hk.gstash, hk.g_row0, hk.g_col0 + kq * WGMMA_K, ga, lane);
        }
    } else if (hk.prescale) {
#pragma unroll
        for (int v = 0; v < 8; ++v)
            s8[v] *= p.scale_log2;
    }
    const int64_t i = (int64_t)hk.m0 + hk.qf, j = (int64_t)hk.n0 + hk.jb; /* the thread's first element */
    if (hk.alibi != 0.f) {
#pragma unroll
        for (int v = 0; v < 8; ++v)
            s8[v] = fmaf(hk.alibi, fabsf(hk.dist0 - (float)block_c(kq, v)), s8[v]);
    }
    if (hk.read_mask) {
        const int64_t off = flash_mask_offset(&p, blockIdx.z, blockIdx.y, i, j);
        if (p.mask_kind == FLASH_MASK_BOOL) {
            const uint8_t *mk = (const uint8_t *)p.mask + off;
#pragma unroll
            for (int v = 0; v < 8; ++v)
                if (elem_exists(hk, p, kq, v))
                    s8[v] = flash_score_mask_bool(
                        s8[v], __ldg(mk + block_qi(kq, v) * p.mask_s.row + block_kj(v) * p.mask_s.col));
        } else {
            const T *mk = (const T *)p.mask + off;
#pragma unroll
            for (int v = 0; v < 8; ++v)
                if (elem_exists(hk, p, kq, v))
                    s8[v] = flash_score_mask_add(
                        &hk.sc, s8[v], half_to_float(__ldg(mk + block_qi(kq, v) * p.mask_s.row + block_kj(v) * p.mask_s.col)));
        }
    }
}

/* After p_block: the A fragment of dV's wgmma (keep * P^T with dropout, whose scale is applied to dV
 * at the end; else P^T), then P^T times the softcap derivative g8 unless it waits in the stash (always
 * with STASH, the kernels' hook_cta_init(stash = true)). */
template <typename T, int NQW, bool STASH>
__device__ __forceinline__ void hook_p(uint32_t a[4], float s8[8], const float g8[8], int kq, const hook_tile &hk,
                                       int lane)
{
    if (hk.dropout) {
        const uint32_t w[2] = {keep_word<NQW>(hk.keep, 0, kq, lane), keep_word<NQW>(hk.keep, 1, kq, lane)};
        float pk[8];
#pragma unroll
        for (int v = 0; v < 8; ++v)
            pk[v] = keep_bit(w, v) ? s8[v] : 0.f;
        acc_to_a<T>(a, pk, pk + 4);
    } else {
        acc_to_a<T>(a, s8, s8 + 4);
    }
    if (!STASH && hk.sc.inv_cap != 0.f && !hk.stash_g) {
#pragma unroll
        for (int v = 0; v < 8; ++v)
            s8[v] *= g8[v];
    }
}

/* dP^T (8 values of block kq) times keep * dropout_scale, before dS^T = P^T (dP^T - delta). */
template <int NQW>
__device__ __forceinline__ void hook_dp(float dp8[8], int kq, const hook_tile &hk, const flash_params &p, int lane)
{
    if (hk.dropout) {
        const uint32_t w[2] = {keep_word<NQW>(hk.keep, 0, kq, lane), keep_word<NQW>(hk.keep, 1, kq, lane)};
#pragma unroll
        for (int v = 0; v < 8; ++v)
            dp8[v] = keep_bit(w, v) ? dp8[v] * (float)p.dropout_scale : 0.f;
    }
}

/* dS^T (8 values of block kq): written to dbias, then times the stashed softcap derivative. */
template <int ROWS>
__device__ __forceinline__ void hook_ds(float ds8[8], int kq, const hook_tile &hk, const flash_params &p, int lane)
{
    if (p.dbias != 0) { /* dense batches only: (b, h, sq, sk) */
        float *db = (float *)p.dbias + ((((int64_t)blockIdx.z * p.h + blockIdx.y) * p.sq + hk.m0 + hk.qf) * p.sk +
                                        hk.n0 + hk.jb); /* the thread's first element */
#pragma unroll
        for (int v = 0; v < 8; ++v)
            if (elem_exists(hk, p, kq, v))
                db[block_qi(kq, v) * p.sk + block_kj(v)] = ds8[v];
    }
    if (hk.stash_g) {
        uint32_t ga[4];
        __syncwarp(); /* the other lanes' stash stores (hook_scores) are visible */
        load_a_frag_sw128<ROWS>(hk.gstash, hk.g_row0, hk.g_col0 + kq * WGMMA_K, ga, lane);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 g = unpack2<__half>(ga[i]);
            ds8[2 * i] *= g.x;
            ds8[2 * i + 1] *= g.y;
        }
    }
}

/* ------------------------------------------------------------------------------------------------ */

/* Ordered dQ additions (deterministic mode, ORDERED): the CTAs whose key tiles see query tile m add their
 * partials of it in descending key-tile order. sem[m BM / FLASH_DQ_SEM_ROWS] (zeroed by the preprocess)
 * holds t + 1 once key tile t has added; key tile t waits for t + 2 (the next higher tile, its predecessor)
 * exactly where that tile sees m: the tiles that see a query tile are contiguous, so the first in the order
 * waits for nothing. Values only grow along one tile's chain, so a stale value never matches. */
struct dq_order {
    int32_t *sem;          /* (cdiv(sq, FLASH_DQ_SEM_ROWS)) of this (batch, query head) */
    int tile;              /* this CTA's key tile */
    int pred_first, pred_end; /* query tiles [pred_first, pred_end) that key tile tile + 1 sees */
};

template <int BM, int BN>
__device__ __forceinline__ dq_order dq_order_of(const flash_params &p, const flash_seq &seq, int b, int hq, int tile)
{
    static_assert(BM % FLASH_DQ_SEM_ROWS == 0, "a query tile is whole semaphore entries");
    dq_order o;
    const int64_t sem_tiles = flash_dq_sem_tiles(&p);
    o.sem = p.dq_semaphore + ((int64_t)b * p.h + hq) * sem_tiles;
    o.tile = tile;
    const int64_t n1 = (int64_t)(tile + 1) * BN; /* the predecessor's first key */
    const flash_tile_range r = n1 < seq.sk ? flash_query_tiles(&seq, n1, flash_min64(BN, seq.sk - n1), BM)
                                           : flash_tile_range{0, 0, 0, 0};
    o.pred_first = (int)r.first;
    o.pred_end = (int)r.end;
    return o;
}

/* dq_order, one thread: whether query tile mt has a predecessor's additions to wait for; the wait for them
 * (query tile first row m0); the hand-on of query tile m0. */
__device__ __forceinline__ bool dq_order_has_pred(const dq_order &ord, int mt)
{
    return mt >= ord.pred_first && mt < ord.pred_end;
}

__device__ __forceinline__ void dq_order_wait(const dq_order &ord, int m0)
{
    spin_until_equal_gpu(ord.sem + m0 / FLASH_DQ_SEM_ROWS, ord.tile + 2);
}

__device__ __forceinline__ void dq_order_release(const dq_order &ord, int m0)
{
    st_release_gpu(ord.sem + m0 / FLASH_DQ_SEM_ROWS, ord.tile + 1);
}

/* The reducer's part of one walked tile (walk index i, its buffer buf = i % NBUF, first row m0): wait on
 * FULL[buf], add the rows below sq into dq_accum (sq, d), hand the buffer back on EMPTY[buf]. */
template <int BM, int D, int THREADS = WARPGROUP_THREADS, bool WHOLE = false>
__device__ __forceinline__ void dq_add_tile(const float *dQb, float *dqa, uint32_t full, uint32_t empty, int i,
                                            int buf, int m0, int sq, int d, int rtid)
{
    constexpr int DQ_LD = D + DQ_PAD, V4_PER_ROW = D / 4, NPART = dq_parts(D, BM), NBUF = DQ_BUFS;
    mbar_wait(full + buf * sizeof(uint64_t), (i / NBUF) & 1);
    const uint32_t src = smem_u32(dQb + buf * NPART * BM * DQ_LD); /* [NPART][BM][DQ_LD] */
    constexpr int UNROLL = THREADS == WARPGROUP_THREADS ? 4 : THREADS > DQ_HALF_THREADS ? 2 : 1; /* a half: 2 or 4
                                                                      * spilled (24 registers); 96 (TMA): 4 did */
    /* a thread count that does not divide the tile (96, TMA): the same trip count in every thread, the last pass
     * bounded (no per-thread remainder count held in the 24 registers) */
    constexpr int TOTAL = BM * V4_PER_ROW, ITERS = (TOTAL + THREADS - 1) / THREADS;
    constexpr bool EVEN = TOTAL % THREADS == 0;
    /* WHOLE (stat_ahead's kernel): a whole tile (rows below sq, d == D: a uniform branch) by one column block per
     * thread, rows RSTEP apart, every address an immediate offset from two bases (no per-element index math or
     * bounds) */
    constexpr int RSTEP = THREADS / V4_PER_ROW;
    constexpr bool FAST = WHOLE && THREADS % V4_PER_ROW == 0 && BM % RSTEP == 0;
    if constexpr (FAST) {
        if (m0 + BM <= sq && d == D) {
            const int r0 = rtid / V4_PER_ROW, c = rtid % V4_PER_ROW * 4;
            uint32_t sa = src + (r0 * DQ_LD + c) * sizeof(float);
            float4 *g = (float4 *)(dqa + (int64_t)(m0 + r0) * D + c);
#pragma unroll UNROLL
            for (int r = 0; r < BM; r += RSTEP, sa += RSTEP * DQ_LD * sizeof(float), g += RSTEP * V4_PER_ROW) {
                float4 v = ld_shared_v4_f32(sa);
                if (NPART == 2) {
                    const float4 u = ld_shared_v4_f32(sa + BM * DQ_LD * sizeof(float));
                    v = make_float4(v.x + u.x, v.y + u.y, v.z + u.z, v.w + u.w);
                }
                atomicAdd(g, v);
            }
            mbar_arrive(empty + buf * sizeof(uint64_t));
            return;
        }
    }
    /* the last tile of a sequence, or d < D: not unrolled where the whole tiles have their own path (the 24
     * registers) */
    constexpr int GUNROLL = FAST ? 1 : UNROLL;
#pragma unroll GUNROLL
    for (int it = 0, idx = rtid; EVEN ? idx < TOTAL : it < ITERS; ++it, idx += THREADS) {
        const int r = idx / V4_PER_ROW, c = (idx % V4_PER_ROW) * 4;
        if ((EVEN || idx < TOTAL) && c < d && m0 + r < sq) {
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

/* ORDERED: thread 0 of the THREADS that add query tile mt (first row m0) waits for its predecessor where it
 * has one; they meet on named barrier bar. */
template <int THREADS = WARPGROUP_THREADS>
__device__ __forceinline__ void dq_chain_wait(const dq_order &ord, int mt, int m0, int rtid, int bar = BAR_REDUCER)
{
    if (rtid == 0 && dq_order_has_pred(ord, mt))
        dq_order_wait(ord, m0);
    named_sync(bar, THREADS);
}

/* ORDERED: the THREADS that added query tile m0 meet, then thread 0 hands it on. Its st.release is cumulative
 * over the barrier: every thread's red.adds before it are performed before the next tile's acquire sees the
 * value (PTX memory model; a __threadfence per thread before the barrier cost 10-15% of the deterministic
 * time, benchmarks/results/h200/det_ab_2026-12-02). */
template <int THREADS = WARPGROUP_THREADS>
__device__ __forceinline__ void dq_chain_release(const dq_order &ord, int m0, int rtid, int bar = BAR_REDUCER)
{
    named_sync(bar, THREADS);
    if (rtid == 0)
        dq_order_release(ord, m0);
}

/* The dQ reducer warpgroup: for each query tile the MMA warpgroups walk (the same sequence, step i),
 * wait on FULL[i % 2] until they have written its dQ_partial (BM x D fp32) into buffer i % 2, add its
 * rows below sq (the sequence's) into dq_accum with vector red.add, and hand the buffer back on
 * EMPTY[i % 2]. The MMA warpgroups never stall on these L2 reductions (they were 20-25% of the time
 * when the MMA warps issued them). ORDERED: the additions of each tile wait for the CTA before this one
 * in dq_order (thread 0 spins, the warpgroup meets on BAR_REDUCER), and once every thread's reductions
 * are performed (fence) thread 0 releases the next; HOOK and ORDERED: every tile of the band takes its
 * turn in that chain, the walked ones also add. */
template <bool HOOK, int BM, int D, bool ORDERED, int RTHREADS = WARPGROUP_THREADS>
__device__ __forceinline__ void dq_reducer(const flash_params &p, const float *dQb, float *dqa, uint32_t full,
                                           uint32_t empty, int m_first, int m_end, int sq, int rtid,
                                           const dq_order &ord)
{
    constexpr int NBUF = DQ_BUFS;
    const int d = (int)p.d;
    unsigned flags;
    int m = next_query_tile<HOOK, BM, SM90_BN, ORDERED>(p, m_first, m_end, flags); /* HOOK: the walked tiles */
    if constexpr (HOOK && ORDERED) {
        /* every tile of the band takes its turn in the chain (the other CTAs cannot know which ones this
         * CTA's attn_mask hides); the walked ones also add */
        for (int mt = m_first, i = 0; mt < m_end; ++mt) {
            dq_chain_wait(ord, mt, mt * BM, rtid);
            if (mt == m) {
                dq_add_tile<BM, D>(dQb, dqa, full, empty, i, i & 1, mt * BM, sq, d, rtid);
                ++i;
                m = next_query_tile<HOOK, BM, SM90_BN, ORDERED>(p, mt + 1, m_end, flags);
            }
            dq_chain_release(ord, mt * BM, rtid);
        }
    } else if constexpr (dq_split(D, BM, HOOK, ORDERED) && RTHREADS == WARPGROUP_THREADS) {
        /* half h takes the tiles of buffer h (walk steps i = h, h + 2, ...), a chain link of its own each */
        const int half = rtid / DQ_HALF_THREADS, hr = rtid % DQ_HALF_THREADS;
        for (int i = half; i < m_end - m_first; i += NBUF) {
            const int m0 = (m_first + i) * BM;
            dq_chain_wait<DQ_HALF_THREADS>(ord, m_first + i, m0, hr, BAR_REDUCER + half);
            dq_add_tile<BM, D, DQ_HALF_THREADS, stat_ahead(D, HOOK, ORDERED)>(dQb, dqa, full, empty, i, half, m0, sq,
                                                                            d, hr);
            dq_chain_release<DQ_HALF_THREADS>(ord, m0, hr, BAR_REDUCER + half);
        }
    } else {
        for (int i = 0; HOOK ? m < m_end : i < m_end - m_first; ++i) {
            const int buf = i & 1, mt = HOOK ? m : m_first + i, m0 = mt * BM;
            if (ORDERED)
                dq_chain_wait<RTHREADS>(ord, mt, m0, rtid);
            dq_add_tile<BM, D, RTHREADS>(dQb, dqa, full, empty, i, buf, m0, sq, d, rtid);
            if (ORDERED)
                dq_chain_release<RTHREADS>(ord, m0, rtid);
            if (HOOK)
                m = next_query_tile<HOOK, BM, SM90_BN>(p, m + 1, m_end, flags);
        }
    }
}

/* The producer warp (the TMA kernel, which walk every query tile m_first .. m_end - 1):
 * walk step t into stage t % 2 once the MMA warpgroups have released it (EMPTY, 256 arrivals): lane 0 issues
 * the TMA boxes of Q and dO (columns past d and, in dense batches, rows past sq are the tensor's end: zeros).
 * In varlen batches the rows after a sequence are the next one's or of none (the harness fills those with NaN):
 * its last tile, if it runs past the sequence, lands on the producer's own TAIL barrier instead, and the warp
 * zeroes the rows past sq (whole 128-byte rows of each panel: the swizzle permutes chunks within a row) before
 * FULL's first arrival, so that the MMA warps see the cp.async kernel's zero rows. Then the warp stores lse
 * (in its log2 form, lse_to_log2) and delta of the tile's rows, 0 past sq (the cp.async kernel's zero fill,
 * converted), and lane 0 makes FULL's second arrival (release, after the warp's stores). */
template <typename T, int BM, int D, int LSE_OFF, int QFULL_OFF>
__device__ __forceinline__ void bwd90_producer(const flash_params &p, const bwd90_maps &maps, uint32_t Qs, int m_first,
                                               int m_end, int hq, int b)
{
    constexpr int Q_BYTES = BM * D * 2, PANEL = SW128_ROW_BYTES / 2;
    const int lane = threadIdx.x % FLASH_WARP_SIZE;
    if (lane == 0) {
        tma_prefetch_map(&maps.q);
        tma_prefetch_map(&maps.dout);
    }
    const bool varlen = p.cu_seqlens_q != NULL;
    for (int t = 0; t < m_end - m_first; ++t) {
        /* the sequence again in each step (computed_here: nothing derived from it hoisted and held across the
         * loop in the 24 registers; varlen: two cu_seqlens loads per step) */
        const int bc = computed_here(b);
        const flash_seq seq = flash_seq_of(&p, bc);
        const int64_t lse0 = flash_lse_offset(&p, &seq, bc, hq);
        const int sq = (int)seq.sq, rowb = varlen ? (int)seq.q_row0 : bc; /* the boxes' first row (varlen) or batch */
        const int s = t & 1, m0 = (m_first + t) * BM;
        /* the stage's Q, dO and FULL, EMPTY barriers; lse_s, delta_s: LSE_OFF, QFULL_OFF from Qs */
        const uint32_t f = Qs + QFULL_OFF + s * sizeof(uint64_t), qd = Qs + s * Q_BYTES, dd = qd + 2 * Q_BYTES;
        const uint32_t qempty = Qs + QFULL_OFF + 2 * sizeof(uint64_t), lse_s = Qs + LSE_OFF;
        mbar_wait(qempty + s * sizeof(uint64_t), ((t >> 1) & 1) ^ 1);
        const bool tail = varlen && m0 + BM > sq; /* at most once: the CTA's last tile */
        const uint32_t land = tail ? Qs + QFULL_OFF + 4 * sizeof(uint64_t) : f; /* TAIL or FULL */
        if (lane == 0) {
            const int row = varlen ? rowb + m0 : m0, qb = varlen ? 0 : rowb;
            mbar_arrive_expect_tx(land, 2 * Q_BYTES);
#pragma unroll
            for (int pn = 0; pn < D / PANEL; pn++) {
                tma_load_4d(qd + pn * BM * SW128_ROW_BYTES, &maps.q, land, pn * PANEL, row, hq, qb);
                tma_load_4d(dd + pn * BM * SW128_ROW_BYTES, &maps.dout, land, pn * PANEL, row, hq, qb);
            }
        }
        const float *lseg = (const float *)p.lse + lse0 + m0, *deltag = (const float *)p.delta + lse0 + m0;
#pragma unroll
        for (int r = lane; r < BM; r += FLASH_WARP_SIZE) {
            const bool ok = m0 + r < sq;
            const uint32_t a = lse_s + (s * BM + r) * sizeof(float);
            st_shared_u32(a, __float_as_uint(lse_to_log2(ok ? lseg[r] : 0.f)));
            st_shared_u32(a + 2 * BM * sizeof(float), __float_as_uint(ok ? deltag[r] : 0.f)); /* delta_s */
        }
        if (tail) {
            mbar_wait(land, 0); /* the boxes landed (TAIL's only phase) */
            /* rows [sq - m0, BM) of the 2 D / PANEL panels (Q's, then dO's 2 Q_BYTES on), 16 bytes per store */
            constexpr int ROW_V4 = SW128_ROW_BYTES / 16, PANEL_BYTES = BM * SW128_ROW_BYTES;
            const int z0 = (sq - m0) * ROW_V4, zn = BM * ROW_V4; /* the panel's 16-byte words from z0 */
#pragma unroll 1
            for (int pn = 0; pn < 2 * D / PANEL; pn++) {
                const uint32_t pb = qd + (pn < D / PANEL ? pn * PANEL_BYTES : 2 * Q_BYTES + (pn - D / PANEL) * PANEL_BYTES);
#pragma unroll 1
                for (int z = z0 + lane; z < zn; z += FLASH_WARP_SIZE)
                    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(pb + z * 16), "r"(0) : "memory");
            }
            fence_proxy_async(); /* the zeros are read by wgmma */
        }
        __syncwarp(); /* the warp's stores before lane 0's release */
        if (lane == 0) {
            if (tail)
                mbar_arrive(f); /* in place of the boxes' arrival */
            mbar_arrive(f);
        }
    }
}

#endif

/* TMA: Q, dO, lse, delta from the producer warp (bwd90_producer), else by cp.async from the MMA warps. */
template <typename T, int D, int BM, bool HOOK, bool ORDERED, bool TMA>
__global__ void __launch_bounds__(SM90_THREADS_ALL, 1)
    bwd_main_sm90_kernel(const flash_params p, const __grid_constant__ bwd90_maps maps)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BN = SM90_BN;
    constexpr int K_BYTES = BN * D * 2, Q_BYTES = BM * D * 2, DS_BYTES = BN * BM * 2;
    constexpr int NQ = BM / 2, NDKV = D / 2; /* accumulator registers per thread (dQ: NDQW below) */
    constexpr int NPART = dq_parts(D, BM), DQ_K = NPART == 2 ? WG_KEYS : BN; /* dQ partials, their K */
    constexpr bool DQ_ROWS = BM == 2 * DQ_N;  /* the warpgroups split dQ's rows (D = 64, BM = 128) */
    constexpr int NBUF = DQ_BUFS;
    constexpr bool RS = d64_rs(D, BM);
    /* dQ_partial issued before dK += dS^T Q (its store to the reducer's buffer runs under dK): the dense
     * D = 128 kernel, where it won 1-3% on the H200 (HOOK not measured), and d64_rs (FlashAttention-3's order) */
    constexpr bool DQ_FIRST = (D == 128 && !HOOK) || RS;
    constexpr bool DQ_ALT = dq_alt(D, HOOK, ORDERED, TMA);
    constexpr bool AHEAD = stat_ahead(D, HOOK, ORDERED);
    constexpr int DQ_NW = DQ_ALT ? D : DQ_N, NDQW = DQ_NW / 2; /* dQ columns of the warpgroup that makes it, regs */
    static_assert((BM == 64 && (D == 64 || D == 128)) || (BM == 128 && D == 64 && !HOOK), "tile configuration");
    static_assert(!TMA || (!HOOK && DQ_FIRST), "TMA loads: the dense kernels (every query tile walked)");
    constexpr int RED_THREADS = TMA ? RED_THREADS_TMA : WARPGROUP_THREADS; /* the dQ reducer's */

    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = (uint8_t *)(((uintptr_t)smem_raw + SW128_ATOM_BYTES - 1) & ~(uintptr_t)(SW128_ATOM_BYTES - 1));
    uint8_t *Ks = smem;                       /* [BN][D] sw128 */
    uint8_t *Vs = Ks + K_BYTES;               /* [BN][D] sw128 */
    uint8_t *Qs = Vs + K_BYTES;               /* [2][BM][D] sw128 */
    uint8_t *dOs = Qs + 2 * Q_BYTES;          /* [2][BM][D] sw128 */
    uint8_t *dSs = dOs + 2 * Q_BYTES;         /* [BN][BM] sw128: dS^T of the current query tile */
    constexpr int DQ_LD = D + DQ_PAD;
    float *lse_s = (float *)(dSs + DS_BYTES); /* [2][BM] */
    float *delta_s = lse_s + 2 * BM;          /* [2][BM] */
    float *dQb = delta_s + 2 * BM;            /* [NBUF][NPART][BM][DQ_LD] fp32: dQ_partial, MMA -> reducer */
    uint64_t *mbar = (uint64_t *)(dQb + NBUF * NPART * BM * DQ_LD); /* [2] FULL, [2] EMPTY of the dQ buffers;
                                                                     * TMA: + [2] FULL, [2] EMPTY of the stages,
                                                                     * TAIL (bwd90_producer) */
    uint8_t *keep_s = (uint8_t *)(mbar + (TMA ? 9 : 4)); /* HOOK: [SM90_MMA_WARPS][keep_warp_bytes(BM)] keep bits */
    /* TMA: lse_s and the stages' FULL barriers (mbar + 4; EMPTY, TAIL after them) from Qs, by the layout above
     * (bwd90_producer) */
    constexpr int LSE_OFF = 4 * Q_BYTES + DS_BYTES;
    constexpr int QFULL_OFF = LSE_OFF + 4 * BM * (int)sizeof(float) + NBUF * NPART * BM * DQ_LD * (int)sizeof(float) +
                              4 * (int)sizeof(uint64_t);

    const int tid = threadIdx.x;
    grid_dependency_trigger(); /* the dQ postprocess may start (it waits for this grid's end) */
    const bwd90_cta cta = ORDERED ? bwd90_cta_descending<!HOOK>(p, 2 * D * (int)sizeof(T))
                                  : bwd90_cta_of<!HOOK>(p, 2 * D * (int)sizeof(T));
    const int n0 = cta.tile * BN, hq = cta.hq, b = cta.b;
    const flash_seq seq = flash_seq_uniform(p, b); /* the CTA's sequence: every row and key below is its own */
    if (n0 >= seq.sk) { /* varlen: the grid spans the longest sequence */
        grid_dependency_wait(); /* every thread waits, so that this grid's end implies the preprocess's */
        return;
    }
    const int64_t hk = hq / p.h_per_kv;
    const int sq = (int)seq.sq, d = (int)p.d;
    const bool do_dq = ORDERED || !p.deterministic;

    const bwd_cta_slices<T> sl = bwd_cta_slices_of<T, BN, BM>(p, seq, b, hq, hk, n0);
    const T *kg = sl.kg, *vg = sl.vg, *qg = sl.qg, *dog = sl.dog;
    const float *lseg = sl.lseg, *deltag = sl.deltag;
    const int kvalid = sl.kvalid, kn = sl.kn; /* kn: keys of the tile that exist */
    const flash_tile_range qt = sl.qt;
    const int64_t bh = (int64_t)b * p.h + hq;
    const int m_first = (int)qt.first, m_end = (int)qt.end;
    const int full_first = (int)qt.full_first, full_end = (int)qt.full_end;
    const int hb = band_cta_hi(seq, n0), lb = band_cta_lo(seq, n0);

    const uint32_t full = smem_u32(mbar), empty = full + 2 * sizeof(uint64_t);
    const uint32_t qfull = full + 4 * sizeof(uint64_t), qempty = full + 6 * sizeof(uint64_t); /* TMA */
    if (tid < 2) {
        mbar_init(full + tid * sizeof(uint64_t), DQ_ALT ? WARPGROUP_THREADS : SM90_THREADS);
        mbar_init(empty + tid * sizeof(uint64_t), TMA ? RED_THREADS : dq_empty_arrivals(D, BM, HOOK, ORDERED));
        if (TMA) {
            mbar_init(qfull + tid * sizeof(uint64_t), 2); /* the producer's two arrivals (bwd90_producer) */
            mbar_init(qempty + tid * sizeof(uint64_t), SM90_THREADS);
            if (tid == 0)
                mbar_init(qempty + 2 * sizeof(uint64_t), 1); /* TAIL (bwd90_producer) */
            mbar_fence_init();
        }
    }
    __syncthreads(); /* the mbarriers initialized */
    if (tid >= SM90_THREADS) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REDUCER_REGS));
        grid_dependency_wait(); /* the preprocess's writes: dq_accum and the dQ semaphores zeroed, delta (TMA) */
        if (TMA && tid < SM90_THREADS + PRODUCER_THREADS) {
            if constexpr (TMA)
                bwd90_producer<T, BM, D, LSE_OFF, QFULL_OFF>(p, maps, smem_u32(Qs), m_first, m_end, hq, b);
        } else if (do_dq) {
            dq_order ord = {};
            if (ORDERED)
                ord = dq_order_of<BM, BN>(p, seq, b, hq, cta.tile);
            dq_reducer<HOOK, BM, D, ORDERED, RED_THREADS>(
                p, dQb, sl.dqa, full, empty, m_first, m_end, sq, tid - (SM90_THREADS_ALL - RED_THREADS), ord);
        }
    } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(MMA_REGS));
    load_tile_sw128<T, BN, D>(Ks, kg, p.k_s.row, kvalid, d, tid);
    load_tile_sw128<T, BN, D>(Vs, vg, p.v_s.row, kvalid, d, tid);
    unsigned flags; /* attn_mask flags of the current tile (HOOK) */
    int m = next_query_tile<HOOK, BM, BN, ORDERED>(p, m_first, m_end, flags);
    grid_dependency_wait(); /* the preprocess's delta (and its other writes) before the first query tile's loads */
    if (!TMA && m < m_end)
        load_query_tile<T, BM, D>(Qs, dOs, lse_s, delta_s, p, qg, dog, lseg, deltag, sq, d, m * BM, tid);
    cp_async_commit();
    if (TMA) { /* K, V landed and seen by both warpgroups (the loop has no barrier ahead of the first S^T) */
        cp_async_wait<0>();
        fence_proxy_async();
        named_sync(BAR_MMA, SM90_THREADS);
    }

    float acc_dv[NDKV], acc_dk[NDKV];
#pragma unroll
    for (int i = 0; i < NDKV; ++i) {
        acc_dv[i] = 0.f;
        acc_dk[i] = 0.f;
    }
    hook_tile hkt;
    if (HOOK)
        hook_cta_init(hkt, p, seq, b, hq, D == 128);

    for (int walked = 0; m < m_end; ++walked) {
        const int step = HOOK ? walked : m - m_first; /* tiles walked before this one */
        const int st = step & 1, m0 = m * BM;
        if (DQ_FIRST)
            wgmma_wait<0>(); /* step-1's dK, which reads stage st^1's Q */
        if constexpr (TMA) {
            if (step > 0) /* stage st^1 no longer read by this thread (step-1's wgmma's done, lse / delta read) */
                mbar_arrive(smem_addr_now(mbar) + (6 + (st ^ 1)) * sizeof(uint64_t));
            mbar_wait(smem_addr_now(mbar) + (4 + st) * sizeof(uint64_t), (step >> 1) & 1); /* stage st landed */
            named_sync(BAR_MMA, SM90_THREADS); /* dS^T no longer read by step-1's dQ of the other warpgroup */
        } else {
        cp_async_wait<0>();
        fence_proxy_async(); /* the landed tiles are read by wgmma */
        if (tid < BM)        /* lse -> its log2-domain form, by the thread that loaded it */
            lse_s[st * BM + tid] = HOOK ? lse_to_log2_hook(lse_s[st * BM + tid], hkt.mul) : lse_to_log2(lse_s[st * BM + tid]);
        named_sync(BAR_MMA, SM90_THREADS); /* stage st landed; stage st^1 and dS^T no longer read by step-1 */
        }
        const int tid = tid_now(), lane = tid % FLASH_WARP_SIZE, lc = lane % 4;
        const int wg = warp_uniform(tid / WARPGROUP_THREADS), w = (tid % WARPGROUP_THREADS) / FLASH_WARP_SIZE;
        const int key0 = wg * WG_KEYS;                    /* the warpgroup's first key in the tile */
        const int dq_col0 = NPART == 2 || DQ_ROWS || DQ_ALT ? 0 : wg * DQ_N; /* the warpgroup's dQ block: columns, */
        const int dq_row0 = DQ_ROWS ? wg * DQ_N : 0;               /* rows (queries), */
        const int dq_key0 = NPART == 2 ? key0 : 0;                 /* first key (K) */
        int m_next = m + 1; /* the next tile the CTA walks, its flags; HOOK: found under the wgmma's below */
        unsigned flags_next = FLASH_MASK_ANY_VISIBLE;
        if (!HOOK && !TMA && m_next < m_end) {
            load_query_tile<T, BM, D>(Qs + (st ^ 1) * Q_BYTES, dOs + (st ^ 1) * Q_BYTES, lse_s + (st ^ 1) * BM,
                                      delta_s + (st ^ 1) * BM, p, qg, dog, lseg, deltag, sq, d, m_next * BM, tid);
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

        const int jb = key0 + w * WARP_KEYS + lane / 4; /* the thread's first key row in the tile */
        if (HOOK) {
            /* under the S^T, dP^T wgmma's: the next tile's loads (after its search through the mask
             * flags), this tile's dropout keep bits and hook state */
            m_next = next_query_tile<HOOK, BM, BN, ORDERED>(p, m + 1, m_end, flags_next);
            if (m_next < m_end) {
                load_query_tile<T, BM, D>(Qs + (st ^ 1) * Q_BYTES, dOs + (st ^ 1) * Q_BYTES, lse_s + (st ^ 1) * BM,
                                          delta_s + (st ^ 1) * BM, p, qg, dog, lseg, deltag, sq, d, m_next * BM, tid);
                cp_async_commit();
            }
            const uint32_t keep = smem_addr_now(keep_s) + tid / FLASH_WARP_SIZE * keep_warp_bytes(BM);
            if (hkt.dropout)
                dropout_keep_bytes<BM>(p, bh, m0, n0 + key0 + w * WARP_KEYS, keep, lane);
            hook_tile_set(hkt, p, m0, n0, jb, 2 * lc, flags, kvalid, keep, dSa, key0 + w * WARP_KEYS, 0);
        }

        /* P^T = exp2(S^T * scale*log2e - lse*log2e) (HOOK: of the hooked score), 0 outside the band and
         * for keys past sk (their zero-filled K would give s = 0), then dS^T = P^T o (dP^T - delta).
         * Each 16-query block kq goes to the tensor cores as soon as it is ready (dV += P^T dO,
         * dK += dS^T Q; K = the queries; dO and Q read MN-major), so the exponentials of block kq+1
         * overlap the wgmma's of block kq and of dP^T. */
        const bool need_mask = m < full_first || m >= full_end || kvalid < BN;
        const int hi = band_tile_hi(hb, m0), lo = band_tile_lo(lb, m0);
        const int last_q = min(BM, sq - m0) - 1;   /* the tile's last query that exists */
        const bool need_lo = key0 - last_q < lo;   /* the lower bound cuts the warpgroup's part */
        p_tile pt;
        pt.lse = lse_t + 2 * lc * sizeof(float);
        pt.mul = HOOK ? hkt.mul : p.scale_log2;
        pt.t = computed_here(jb - 2 * lc - hi);
        pt.u = computed_here(jb - 2 * lc - lo);
        pt.row0_out = jb >= kvalid;
        pt.row8_out = jb + 8 >= kvalid;
        uint32_t pa[BM / WGMMA_K][4], dsa[BM / WGMMA_K][4];
        if constexpr (RS) {
            /* d64_rs: all of P^T (S^T's fp32 values, which dS^T needs), then per 16-query block dS^T, its store,
             * and dV += P^T dO issued at once from the P^T fragment that the block's S^T values die into (RS) */
            const stat_pair<BM> lse2 = stat_pair_load<BM>(lse_t, lane);
            wgmma_wait<1>(); /* S^T */
            if (need_mask) {
#pragma unroll
                for (int kq = 0; kq < BM / WGMMA_K; ++kq) {
                    const float2 l2[2] = {stat_pair_of(lse2, 2 * kq), stat_pair_of(lse2, 2 * kq + 1)};
                    p_block_pair<true>(s + 8 * kq, kq, pt, l2);
                    if (need_lo)
                        p_block_lo(s + 8 * kq, kq, pt.u);
                }
            } else {
#pragma unroll
                for (int kq = 0; kq < BM / WGMMA_K; ++kq) {
                    const float2 l2[2] = {stat_pair_of(lse2, 2 * kq), stat_pair_of(lse2, 2 * kq + 1)};
                    p_block_pair<false>(s + 8 * kq, kq, pt, l2);
                }
            }
            const stat_pair<BM> delta2 = stat_pair_load<BM>(delta_t, lane);
            const uint32_t ds_addr = a_frag_addr_sw128<BN>(dSa, key0 + w * WARP_KEYS, 0, lane); /* block 0's */
            wgmma_wait<0>(); /* dP^T */
#pragma unroll
            for (int kq = 0; kq < BM / WGMMA_K; ++kq) {
#pragma unroll
                for (int i = 2 * kq; i < 2 * kq + 2; ++i) {
                    const float2 dl = stat_pair_of(delta2, i);
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        dp[4 * i + e] = s[4 * i + e] * (dp[4 * i + e] - ((e & 1) ? dl.y : dl.x));
                }
                acc_to_a<T>(pa[kq], s + 8 * kq, s + 8 * kq + 4);
                acc_to_a<T>(dsa[kq], dp + 8 * kq, dp + 8 * kq + 4);
                if (do_dq)
                    store_a_frag_at(a_frag_addr_sw128_kq<BN>(ds_addr, kq), dsa[kq]);
                wgmma_fence();
                wgmma_op<T, D>::template rs<1>(acc_dv, pa[kq], desc_mn_major<BM>(dOt, kq * WGMMA_K, 0), 1);
            }
            wgmma_commit();
        } else {
            constexpr int NKQ = BM / WGMMA_K;
            float2 lse_n[2] = {}; /* AHEAD: the next block's lse pairs (stat_block_load, p_block_at) */
            if (AHEAD)
                stat_block_load(lse_n, pt.lse, 0);
            wgmma_wait<1>(); /* S^T */
            /* masking only in tiles where some key is masked. D = 64: two copies of the whole loop; D = 128:
             * one loop branching per 16-query block, so that the wgmma issue exists once (two copies of the
             * loop made ptxas serialize the wgmma's there, too few registers; at D = 64 the per-block
             * branch was 1-2% slower than the copies) */
            if (need_mask || D == 128) {
#pragma unroll
                for (int kq = 0; kq < NKQ; ++kq) {
                    const float2 lse2[2] = {lse_n[0], lse_n[1]};
                    if (AHEAD && kq + 1 < NKQ)
                        stat_block_load(lse_n, pt.lse, kq + 1);
                    float g8[8]; /* HOOK: the softcap derivative */
                    if (HOOK)
                        hook_scores<T, BN>(s + 8 * kq, g8, kq, hkt, p, lane);
                    if (D == 64 || need_mask) {
                        p_block_at<AHEAD, true>(s + 8 * kq, kq, pt, lse2);
                        if (need_lo)
                            p_block_lo(s + 8 * kq, kq, pt.u);
                    } else {
                        p_block_at<AHEAD, false>(s + 8 * kq, kq, pt, lse2);
                    }
                    if (HOOK)
                        hook_p<T, BM, D == 128>(pa[kq], s + 8 * kq, g8, kq, hkt, lane);
                    else
                        acc_to_a<T>(pa[kq], s + 8 * kq, s + 8 * kq + 4);
                    wgmma_fence();
                    wgmma_op<T, D>::template rs<1>(acc_dv, pa[kq], desc_mn_major<BM>(dOt, kq * WGMMA_K, 0), 1);
                }
            } else {
#pragma unroll
                for (int kq = 0; kq < NKQ; ++kq) {
                    const float2 lse2[2] = {lse_n[0], lse_n[1]};
                    if (AHEAD && kq + 1 < NKQ)
                        stat_block_load(lse_n, pt.lse, kq + 1);
                    float g8[8]; /* HOOK: the softcap derivative */
                    if (HOOK)
                        hook_scores<T, BN>(s + 8 * kq, g8, kq, hkt, p, lane);
                    p_block_at<AHEAD, false>(s + 8 * kq, kq, pt, lse2);
                    if (HOOK)
                        hook_p<T, BM, D == 128>(pa[kq], s + 8 * kq, g8, kq, hkt, lane);
                    else
                        acc_to_a<T>(pa[kq], s + 8 * kq, s + 8 * kq + 4);
                    wgmma_fence();
                    wgmma_op<T, D>::template rs<1>(acc_dv, pa[kq], desc_mn_major<BM>(dOt, kq * WGMMA_K, 0), 1);
                }
            }
            wgmma_commit();
            const uint32_t delta_l = delta_t + 2 * lc * sizeof(float);
            float2 dl_n[2] = {}; /* AHEAD: the next block's delta pairs, as lse_n */
            if (AHEAD)
                stat_block_load(dl_n, delta_l, 0);
            wgmma_wait<1>(); /* dP^T (dV may still run) */
#pragma unroll
            for (int kq = 0; kq < NKQ; ++kq) {
                const float2 dl2[2] = {dl_n[0], dl_n[1]};
                if (AHEAD && kq + 1 < NKQ)
                    stat_block_load(dl_n, delta_l, kq + 1);
                if (HOOK)
                    hook_dp<BM>(dp + 8 * kq, kq, hkt, p, lane);
#pragma unroll
                for (int i = 2 * kq; i < 2 * kq + 2; ++i) {
                    const float2 dl = AHEAD ? dl2[i - 2 * kq]
                                            : ld_shared_v2_f32(delta_t + (i * 8 + 2 * lc) * sizeof(float));
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        dp[4 * i + e] = s[4 * i + e] * (dp[4 * i + e] - ((e & 1) ? dl.y : dl.x));
                }
                if (HOOK)
                    hook_ds<BN>(dp + 8 * kq, kq, hkt, p, lane);
                acc_to_a<T>(dsa[kq], dp + 8 * kq, dp + 8 * kq + 4);
                if (do_dq)
                    store_a_frag_sw128<BN>(dSa, key0 + w * WARP_KEYS, kq * WGMMA_K, dsa[kq], lane);
                if (!DQ_FIRST) {
                    wgmma_fence();
                    wgmma_op<T, D>::template rs<1>(acc_dk, dsa[kq], desc_mn_major<BM>(Qt, kq * WGMMA_K, 0), 1);
                }
            }
            if (!DQ_FIRST)
                wgmma_commit();
        }

        if (do_dq) {
            /* dQ_partial = dS K: this warpgroup's 64 x DQ_N block (DQ_ALT: all of it, by one warpgroup), K = the BN
             * keys; dS^T and K read MN-major; handed to the reducer warpgroup through dQ buffer (step % 2);
             * DQ_FIRST: issued before dK's wgmma's, which run under the store */
            fence_proxy_async();
            named_sync(BAR_MMA, SM90_THREADS); /* dS^T of both warpgroups in smem */
            if (!DQ_ALT || wg == (step & 1)) {
                float acc_dq[NDQW]; /* overwritten by the first step (accumulate = 0) */
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < DQ_K / WGMMA_K; ++kk)
                    wgmma_op<T, DQ_NW>::template ss<1, 1>(acc_dq, desc_mn_major<BN>(dSa, dq_key0 + kk * WGMMA_K, dq_row0),
                                                          desc_mn_major<BN>(Ka, dq_key0 + kk * WGMMA_K, dq_col0), kk);
                wgmma_commit();
                if (DQ_FIRST) {
#pragma unroll
                    for (int kq = 0; kq < BM / WGMMA_K; ++kq)
                        wgmma_op<T, D>::template rs<1>(acc_dk, dsa[kq], desc_mn_major<BM>(Qt, kq * WGMMA_K, 0), 1);
                    wgmma_commit();
                    wgmma_wait<1>(); /* dQ (dK may still run) */
                } else {
                    wgmma_wait<0>();
                }
                const int buf = step & 1;
                if (step >= NBUF) /* the reducer has added tile step - NBUF from this buffer */
                    mbar_wait(smem_addr_now(mbar) + (2 + buf) * sizeof(uint64_t), (step / NBUF - 1) & 1);
                const int dq_part = NPART == 2 ? wg : 0; /* partial */
                const uint32_t dst = smem_addr_now(dQb) + (uint32_t)((((buf * NPART + dq_part) * BM + dq_row0 + w * 16 + lane / 4) * DQ_LD +
                                                                      dq_col0 + 2 * lc) * sizeof(float)); /* (DQ_NW) */
#pragma unroll
                for (int i = 0; i < DQ_NW / 8; ++i) {
                    st_shared_v2_f32(dst + i * 8 * sizeof(float), acc_dq[4 * i], acc_dq[4 * i + 1]);
                    st_shared_v2_f32(dst + (8 * DQ_LD + i * 8) * sizeof(float), acc_dq[4 * i + 2], acc_dq[4 * i + 3]);
                }
                mbar_arrive(smem_addr_now(mbar) + buf * sizeof(uint64_t));
            } else { /* DQ_ALT, the other warpgroup's turn: dK alone */
                wgmma_fence();
#pragma unroll
                for (int kq = 0; kq < BM / WGMMA_K; ++kq)
                    wgmma_op<T, D>::template rs<1>(acc_dk, dsa[kq], desc_mn_major<BM>(Qt, kq * WGMMA_K, 0), 1);
                wgmma_commit();
            }
        } else if (DQ_FIRST) {
            wgmma_fence();
#pragma unroll
            for (int kq = 0; kq < BM / WGMMA_K; ++kq)
                wgmma_op<T, D>::template rs<1>(acc_dk, dsa[kq], desc_mn_major<BM>(Qt, kq * WGMMA_K, 0), 1);
            wgmma_commit();
        } else {
            wgmma_wait<0>();
        }
        m = m_next;
        flags = flags_next;
    }
    if (DQ_FIRST)
        wgmma_wait<0>(); /* the last dK */
    cp_async_wait<0>(); /* K/V still in flight when no query tile sees the key tile */

    const int j0 = n0 + (tid / WARPGROUP_THREADS) * WG_KEYS + (tid % WARPGROUP_THREADS) / FLASH_WARP_SIZE * WARP_KEYS;
    const float dv_mul = HOOK && p.dropout_threshold != 0 ? (float)p.dropout_scale : 1.f;
    const flash_seq se = flash_seq_of(&p, b); /* seq again (loaded after the loop's barriers): none held across it */
    store_kv_grad<T, 1, D>(p, se, (const float(*)[D / 8][4])acc_dv, dv_mul, p.dv, p.dv_s, p.dv_accum, b, hq, j0, 0);
    store_kv_grad<T, 1, D>(p, se, (const float(*)[D / 8][4])acc_dk, (float)p.scale, p.dk, p.dk_s, p.dk_accum, b, hq, j0,
                           0);
    }
#endif
}

/* ------------------------------------------------------------------------------------------------ */
/* D = 256 (head dims 129..256)                                                                     */

#define D256_D FLASH_CUDA_MAX_HEAD_DIM /* the head dim computed (head dims 129..256, zero-padded) */
#define D256_BN (bwd90_tiles<256>::BN) /* tiles.h */
#define D256_BM (bwd90_tiles<256>::BM)
#define D256_QW (bwd90_tiles<256>::QW)
#define D256_COLS (bwd90_tiles<256>::COLS)
#define D256_DQ_CHUNK (bwd90_tiles<256>::DQ_CHUNK)


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

#endif

#define DQ_GROUP_FLOATS (FLASH_DQ_TILE_ROWS * 8) /* floats of one 8-column group of a tiled dq_accum tile */
static_assert(D256_BM == FLASH_DQ_TILE_ROWS && D256_D == FLASH_CUDA_MAX_HEAD_DIM, "dq_accum's tiles are the kernel's");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* Add a chunk into the tiled dq_accum (mask.h flash_dq_tiled_row0) from dst, the thread's float4 of the chunk's
 * first 8-column group: value quad i (rows row, row + 8 x columns 8 i + 2 lc, + 1) is the thread's float4 of
 * group i, one red.add each, no shuffles and no bounds (rows past sq and columns past d fall in the padding). */
__device__ __forceinline__ void add_dq_chunk_tiled(float *dst, const float (&acc)[D256_DQ_CHUNK / 2])
{
#pragma unroll
    for (int i = 0; i < D256_DQ_CHUNK / 8; ++i)
        atomicAdd((float4 *)(dst + i * DQ_GROUP_FLOATS),
                  make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]));
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
 * The query tiles, masks and hooks are those of bwd_main_sm90_kernel (the warpgroup's 32 queries take
 * the place of its 64 keys). The dQ wgmma's are always issued (ptxas keeps the wgmma pipeline only when the
 * dQ chunk 0 issue is unconditional); the HOOK kernel in deterministic mode skips their red.adds, and the dQ
 * kernel computes dQ. ORDERED (deterministic mode with p->dq_semaphore, dense): key tiles descending in head
 * groups, and a tile's dQ added after the next higher key tile's (dq_order). Thread 0 does the chain's part
 * under the S^T, dP^T wgmma's of each step: it releases the previous tile (whose additions every thread
 * finished before the step's first barrier) and waits for this tile's predecessor (before the barrier ahead
 * of the additions). det / default time 1.12 / 1.18 at s2048 / s8192 (causal 1.16 / 1.21), against the dQ
 * kernel's 1.53 / 1.61 (1.58 / 1.66): benchmarks/results/h200/det_ab_2026-12-02.
 * smem: K, V 32 KB each, Q/dO 2 stages x 2 x 32 KB, P^T and dS^T 8 KB each: 210 KB (HOOK: + 512 bytes
 * of dropout keep bits). 198 registers (ORDERED 212, HOOK 241).
 * Measured (H200, bf16, 16k tokens, harness): 261 TFLOP/s at s2048, 286 at s8192 (mma.sync kernel: 170, 178). */
template <typename T, bool HOOK, bool ORDERED>
__global__ void __launch_bounds__(SM90_THREADS, 1) bwd_main_sm90_d256_kernel(const flash_params p)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int D = D256_D, BN = D256_BN, BM = D256_BM;
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
    uint8_t *keep_s = (uint8_t *)(delta_s + 2 * BM); /* HOOK: [SM90_MMA_WARPS][keep_warp_bytes(D256_QW)] */

    const int tid = threadIdx.x;
    grid_dependency_trigger(); /* as bwd_main_sm90_kernel */
    const bwd90_cta cta = ORDERED ? bwd90_cta_descending<true>(p, 2 * D256_D * (int)sizeof(T))
                                  : bwd90_cta_of<!HOOK>(p, 2 * D256_D * (int)sizeof(T));
    const int n0 = cta.tile * BN, hq = cta.hq, b = cta.b;
    const flash_seq seq = flash_seq_uniform(p, b); /* the CTA's sequence: every row and key below is its own */
    if (n0 >= seq.sk) { /* varlen: the grid spans the longest sequence */
        grid_dependency_wait();
        return;
    }
    const int64_t hk = hq / p.h_per_kv;
    const int sq = (int)seq.sq, d = (int)p.d;
    static_assert(!ORDERED || !HOOK, "ordered dQ additions: the dense kernel");
    /* HOOK: one kernel for both modes, so the dQ wgmma's are always issued and deterministic mode only
     * skips their red.adds (a runtime condition around the issue would serialize the wgmma's) */
    const bool do_dq = !HOOK || !p.deterministic;

    const bwd_cta_slices<T> sl = bwd_cta_slices_of<T, BN, BM>(p, seq, b, hq, hk, n0);
    const T *kg = sl.kg, *vg = sl.vg, *qg = sl.qg, *dog = sl.dog;
    const float *lseg = sl.lseg, *deltag = sl.deltag;
    const int kvalid = sl.kvalid, kn = sl.kn; /* kn: keys of the tile that exist */
    const flash_tile_range qt = sl.qt;
    const int64_t bh = (int64_t)b * p.h + hq;
    const int m_first = (int)qt.first, m_end = (int)qt.end;
    const int full_first = (int)qt.full_first, full_end = (int)qt.full_end;
    const int hb = band_cta_hi(seq, n0), lb = band_cta_lo(seq, n0);
    dq_order ord = {};
    if constexpr (ORDERED)
        ord = dq_order_of<BM, BN>(p, seq, b, hq, cta.tile);
    float *dqt = p.dq_accum + flash_dq_tiled_row0(&p, &seq, b, hq) * D; /* the tiles of (b, hq) in dq_accum */

    load_tile_sw128<T, BN, D>(Ks, kg, p.k_s.row, kvalid, d, tid);
    load_tile_sw128<T, BN, D>(Vs, vg, p.v_s.row, kvalid, d, tid);
    unsigned flags; /* attn_mask flags of the current tile (HOOK) */
    int m = next_query_tile<HOOK, BM, BN>(p, m_first, m_end, flags);
    grid_dependency_wait(); /* delta, the tiled dq_accum, the dQ semaphores: the preprocess's */
    if (m < m_end)
        load_query_tile<T, BM, D>(Qs, dOs, lse_s, delta_s, p, qg, dog, lseg, deltag, sq, d, m * BM, tid);
    cp_async_commit();

    float acc_dv[NDKV], acc_dk[NDKV];
#pragma unroll
    for (int i = 0; i < NDKV; ++i) {
        acc_dv[i] = 0.f;
        acc_dk[i] = 0.f;
    }
    hook_tile hkt;
    if (HOOK)
        hook_cta_init(hkt, p, seq, b, hq, false);

    for (int walked = 0; m < m_end; ++walked) {
        const int step = HOOK ? walked : m - m_first; /* tiles walked before this one */
        const int st = step & 1, m0 = m * BM;
        cp_async_wait<0>();
        fence_proxy_async(); /* the landed tiles are read by wgmma */
        if (tid < BM)        /* lse -> its log2-domain form, by the thread that loaded it */
            lse_s[st * BM + tid] = HOOK ? lse_to_log2_hook(lse_s[st * BM + tid], hkt.mul) : lse_to_log2(lse_s[st * BM + tid]);
        __syncthreads();     /* stage st landed; stage st^1, P^T and dS^T no longer read by step-1 */
        const int tid = tid_now(), lane = tid % FLASH_WARP_SIZE, lc = lane % 4;
        const int wg = warp_uniform(tid / WARPGROUP_THREADS), w = (tid % WARPGROUP_THREADS) / FLASH_WARP_SIZE;
        const int q0 = wg * D256_QW, c0 = wg * D256_COLS; /* the warpgroup's S^T queries, dK/dV/dQ columns */
        int m_next = m + 1; /* the next tile the CTA walks, its flags; HOOK: found under the wgmma's below */
        unsigned flags_next = FLASH_MASK_ANY_VISIBLE;
        if (!HOOK && m_next < m_end) {
            const int so = st ^ 1;
            load_query_tile<T, BM, D>(Qs + so * Q_BYTES, dOs + so * Q_BYTES, lse_s + so * BM, delta_s + so * BM, p, qg,
                                      dog, lseg, deltag, sq, d, m_next * BM, tid);
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
        if constexpr (ORDERED) { /* thread 0, under the wgmma's: the chain's part (dq_order) */
            if (tid == 0) {
                if (m > m_first) /* every thread's additions of tile m - 1 came before this step's first barrier */
                    dq_order_release(ord, m0 - BM);
                if (dq_order_has_pred(ord, m)) /* before the barrier ahead of the additions */
                    dq_order_wait(ord, m0);
            }
        }

        const int jb = w * WARP_KEYS + lane / 4; /* the thread's first key row */
        if (HOOK) {
            m_next = next_query_tile<HOOK, BM, BN>(p, m + 1, m_end, flags_next);
            if (m_next < m_end) {
                const int so = st ^ 1;
                load_query_tile<T, BM, D>(Qs + so * Q_BYTES, dOs + so * Q_BYTES, lse_s + so * BM, delta_s + so * BM, p,
                                          qg, dog, lseg, deltag, sq, d, m_next * BM, tid);
                cp_async_commit();
            }
            const uint32_t keep = smem_addr_now(keep_s) + tid / FLASH_WARP_SIZE * keep_warp_bytes(D256_QW);
            if (hkt.dropout)
                dropout_keep_bytes<D256_QW>(p, bh, m0 + q0, n0 + w * WARP_KEYS, keep, lane);
            hook_tile_set(hkt, p, m0, n0, jb, q0 + 2 * lc, flags, kvalid, keep, dSa, w * WARP_KEYS, q0);
        }

        /* P^T, dS^T (masking as in bwd_main_sm90_kernel), to smem for both warpgroups */
        const bool need_mask = m < full_first || m >= full_end || kvalid < BN;
        const int hi = band_tile_hi(hb, m0), lo = band_tile_lo(lb, m0);
        const int last_q = min(q0 + D256_QW, sq - m0) - 1; /* the warpgroup's last query that exists */
        const bool need_lo = -last_q < lo;                 /* the lower bound cuts the warpgroup's part */
        p_tile pt;
        pt.lse = lse_t + (q0 + 2 * lc) * sizeof(float);
        pt.mul = HOOK ? hkt.mul : p.scale_log2;
        pt.t = computed_here(jb - 2 * lc - hi - q0);
        pt.u = computed_here(jb - 2 * lc - lo - q0);
        pt.row0_out = jb >= kvalid;
        pt.row8_out = jb + 8 >= kvalid;
        wgmma_wait<1>(); /* S^T */
        float g8[D256_QW / WGMMA_K][8]; /* HOOK: the softcap derivative */
        if (HOOK) {
#pragma unroll
            for (int kq = 0; kq < D256_QW / WGMMA_K; ++kq)
                hook_scores<T, BN>(s + 8 * kq, g8[kq], kq, hkt, p, lane);
        }
        if (need_mask) {
#pragma unroll
            for (int kq = 0; kq < D256_QW / WGMMA_K; ++kq) {
                p_block<true>(s + 8 * kq, kq, pt);
                if (need_lo)
                    p_block_lo(s + 8 * kq, kq, pt.u);
            }
        } else {
#pragma unroll
            for (int kq = 0; kq < D256_QW / WGMMA_K; ++kq)
                p_block<false>(s + 8 * kq, kq, pt);
        }
        if (HOOK) { /* P^T to smem now: hook_p folds the softcap derivative into s */
#pragma unroll
            for (int kq = 0; kq < D256_QW / WGMMA_K; ++kq) {
                uint32_t a[4];
                hook_p<T, D256_QW, false>(a, s + 8 * kq, g8[kq], kq, hkt, lane);
                store_a_frag_sw128<BN>(Pa, w * WARP_KEYS, q0 + kq * WGMMA_K, a, lane);
            }
        }
        wgmma_wait<0>(); /* dP^T */
#pragma unroll
        for (int kq = 0; kq < D256_QW / WGMMA_K; ++kq) {
            if (HOOK)
                hook_dp<D256_QW>(dp + 8 * kq, kq, hkt, p, lane);
#pragma unroll
            for (int i = 2 * kq; i < 2 * kq + 2; ++i) {
                const float2 dl = ld_shared_v2_f32(delta_t + (q0 + i * 8 + 2 * lc) * sizeof(float));
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    dp[4 * i + e] = s[4 * i + e] * (dp[4 * i + e] - ((e & 1) ? dl.y : dl.x));
            }
            if (HOOK)
                hook_ds<BN>(dp + 8 * kq, kq, hkt, p, lane);
        }
#pragma unroll
        for (int kq = 0; kq < D256_QW / WGMMA_K; ++kq) {
            uint32_t a[4];
            if (!HOOK) {
                acc_to_a<T>(a, s + 8 * kq, s + 8 * kq + 4);
                store_a_frag_sw128<BN>(Pa, w * WARP_KEYS, q0 + kq * WGMMA_K, a, lane);
            }
            acc_to_a<T>(a, dp + 8 * kq, dp + 8 * kq + 4);
            store_a_frag_sw128<BN>(dSa, w * WARP_KEYS, q0 + kq * WGMMA_K, a, lane);
        }
        fence_proxy_async();
        __syncthreads(); /* P^T, dS^T of all 64 queries in smem */

        /* dQ[:, cols] = dS K[:, cols] in two chunks of 64 columns (K = the 64 keys), around dV += P^T
         * dO[:, cols] and dK += dS^T Q[:, cols] (K = the 64 queries): the tensor cores run chunk 0, dV,
         * dK, chunk 1 back to back, and the red.adds of chunk 0 overlap dV and dK. */
        static_assert(D256_COLS == 2 * D256_DQ_CHUNK, "two dQ chunks");
        /* the thread's float4 of the warpgroup's first 8-column group in tile m */
        float *dq_dst =
            dqt + (int64_t)m * BM * D + (wg * D256_COLS / 8 * DQ_GROUP_FLOATS + (tid % WARPGROUP_THREADS) * 4);
        float acc_dq[NDQ]; /* overwritten by the first step of each chunk (accumulate = 0) */
        issue_dq_chunk_d256<T>(acc_dq, dSa, Ka, c0);
        wgmma_commit();
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
        wgmma_wait<1>(); /* chunk 0 (dV, dK may still run) */
        if (do_dq) /* none for HOOK in deterministic mode */
            add_dq_chunk_tiled(dq_dst, acc_dq);
        issue_dq_chunk_d256<T>(acc_dq, dSa, Ka, c0 + D256_DQ_CHUNK);
        wgmma_commit();
        wgmma_wait<0>();
        if (do_dq)
            add_dq_chunk_tiled(dq_dst + D256_DQ_CHUNK / 8 * DQ_GROUP_FLOATS, acc_dq);
        m = m_next;
        flags = flags_next;
    }
    cp_async_wait<0>(); /* K/V still in flight when no query tile sees the key tile */
    if constexpr (ORDERED) { /* the last tile's additions done by every thread: hand it on */
        __syncthreads();
        if (tid == 0 && m_end > m_first)
            dq_order_release(ord, (m_end - 1) * BM);
    }

    const int j0 = n0 + (tid % WARPGROUP_THREADS) / FLASH_WARP_SIZE * WARP_KEYS, c0 = tid / WARPGROUP_THREADS * D256_COLS;
    const float dv_mul = HOOK && p.dropout_threshold != 0 ? (float)p.dropout_scale : 1.f;
    const flash_seq se = flash_seq_of(&p, b); /* seq again (loaded after the loop's barriers): none held across it */
    store_kv_grad<T, 1, D256_COLS>(p, se, (const float(*)[D256_COLS / 8][4])acc_dv, dv_mul, p.dv, p.dv_s, p.dv_accum,
                                   b, hq, j0, c0);
    store_kv_grad<T, 1, D256_COLS>(p, se, (const float(*)[D256_COLS / 8][4])acc_dk, (float)p.scale, p.dk, p.dk_s,
                                   p.dk_accum, b, hq, j0, c0);
#endif
}

/* Dynamic shared memory of the kernels (their layouts above, plus the 1024-byte alignment slack). */
static size_t smem_main_sm90(int D, int BM, bool hook, bool tma = false)
{
    return SW128_ATOM_BYTES + (size_t)(2 * SM90_BN * D + 4 * BM * D + SM90_BN * BM) * 2 +
           (size_t)(4 * BM + DQ_BUFS * dq_parts(D, BM) * BM * (D + DQ_PAD)) * sizeof(float) +
           (tma ? 9 : 4) * sizeof(uint64_t) + (hook ? (size_t)SM90_MMA_WARPS * keep_warp_bytes(BM) : 0);
}

static size_t smem_main_sm90_d256(bool hook)
{
    return SW128_ATOM_BYTES + (size_t)(2 * D256_BN * D256_D + 4 * D256_BM * D256_D + 2 * D256_BN * D256_BM) * 2 +
           4 * D256_BM * sizeof(float) + (hook ? (size_t)SM90_MMA_WARPS * keep_warp_bytes(D256_QW) : 0);
}

/* A main kernel's launch: grid (key tiles of bn keys, h, b), a programmatic dependent launch (launch.h) after
 * the preprocess. */
template <typename... Extra>
static cudaError_t launch_main(const flash_params *p, void (*kernel)(const flash_params, Extra...), int bn,
                               int threads, size_t smem, cudaStream_t stream, Extra... extra)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned int)((p->sk + bn - 1) / bn), (unsigned int)p->h, (unsigned int)p->b);
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr;
    flash_launch_pdl(&cfg, &attr, 1);
    return cudaLaunchKernelEx(&cfg, kernel, *p, extra...);
}

template <typename T, bool HOOK, bool ORDERED = false>
static cudaError_t launch_main_sm90_d256(const flash_params *p, cudaStream_t stream)
{
    const size_t smem = smem_main_sm90_d256(HOOK);
    auto kernel = bwd_main_sm90_d256_kernel<T, HOOK, ORDERED>;
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess)
        return err;
    return launch_main(p, kernel, D256_BN, SM90_THREADS, smem, stream);
}

/* The map of q or dout (wgmma.cuh tma_map_4d: (d, rows, heads, batches), varlen: rows = total_q, one batch),
 * boxes of 64 x box_rows; 0 where TMA cannot read the tensor (alignment) or no encoder. */
static int bwd90_make_map(CUtensorMap *map, const flash_params *p, const void *ptr, const flash_strides *s, int box_rows)
{
    const int varlen = p->cu_seqlens_q != NULL;
    const int64_t rows = varlen ? p->total_q : p->sq, batches = varlen ? 1 : p->b;
    if ((uintptr_t)ptr % 16 != 0 || s->row % CHUNK != 0 || s->head % CHUNK != 0 || s->batch % CHUNK != 0 || rows < 1 ||
        rows >= INT_MAX || p->d % CHUNK != 0)
        return 0;
    return tma_map_4d(map, p->dtype == FLASH_BF16, ptr, p->d, rows, p->h, batches, s->row, s->head, s->batch, box_rows);
}

template <typename T, int D, int BM, bool HOOK, bool ORDERED, bool TMA>
static cudaError_t launch_main_sm90_kernel(const flash_params *p, const bwd90_maps &maps, cudaStream_t stream)
{
    const size_t smem = smem_main_sm90(D, BM, HOOK, TMA);
    auto kernel = bwd_main_sm90_kernel<T, D, BM, HOOK, ORDERED, TMA>;
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess)
        return err;
    return launch_main(p, kernel, SM90_BN, SM90_THREADS_ALL, smem, stream, maps);
}

/* The TMA kernel (dense, non-ORDERED, D = 64) where the maps can be built, else the cp.async one. */
template <typename T, int D, int BM, bool HOOK, bool ORDERED = false>
static cudaError_t launch_main_sm90(const flash_params *p, cudaStream_t stream)
{
    bwd90_maps maps;
    memset(&maps, 0, sizeof(maps));
    if constexpr (!HOOK && !ORDERED && D == 64) {
        if (bwd90_make_map(&maps.q, p, p->q, &p->q_s, BM) && bwd90_make_map(&maps.dout, p, p->dout, &p->do_s, BM))
            return launch_main_sm90_kernel<T, D, BM, HOOK, ORDERED, true>(p, maps, stream);
    }
    return launch_main_sm90_kernel<T, D, BM, HOOK, ORDERED, false>(p, maps, stream);
}

/* The kernel of head dim D (64 or 128) with its tiles.h query tile: HOOK from p->has_hook, ORDERED from ordered. */
template <typename T, int D>
static cudaError_t launch_main_sm90_d(const flash_params *p, bool ordered, cudaStream_t stream)
{
    constexpr int BM = bwd90_tiles<D>::BM, BM_HOOK = bwd90_tiles<D>::BM_HOOK;
    if (p->has_hook)
        return ordered ? launch_main_sm90<T, D, BM_HOOK, true, true>(p, stream)
                       : launch_main_sm90<T, D, BM_HOOK, true>(p, stream);
    return ordered ? launch_main_sm90<T, D, BM, false, true>(p, stream) : launch_main_sm90<T, D, BM, false>(p, stream);
}

extern "C" int flash_bwd_sm90_orders_dq(const flash_params *p)
{
    return (p->dtype == FLASH_BF16 || p->dtype == FLASH_FP16) && (p->d <= 128 || !p->has_hook);
}

/* Head dim -> kernel, p->has_hook -> variant; deterministic with p->dq_semaphore -> ORDERED (every head dim; at
 * d > 128 the dense kernel only: the HOOK kernel then skips dQ's red.adds and the dQ kernel computes dQ). */
template <typename T>
static cudaError_t launch_main_sm90_dtype(const flash_params *p, cudaStream_t stream)
{
    if (p->d > 128) {
        if (p->has_hook || (p->deterministic && p->dq_semaphore == NULL)) /* the latter: the dQ kernel's dQ */
            return launch_main_sm90_d256<T, true>(p, stream);
        return p->deterministic ? launch_main_sm90_d256<T, false, true>(p, stream) : launch_main_sm90_d256<T, false>(p, stream);
    }
    const bool ordered = p->deterministic && p->dq_semaphore != NULL;
    if (p->d > 64)
        return launch_main_sm90_d<T, 128>(p, ordered, stream);
    return launch_main_sm90_d<T, 64>(p, ordered, stream);
}

extern "C" cudaError_t flash_bwd_main_sm90(const flash_params *p, cudaStream_t stream)
{
    if (p->dtype == FLASH_BF16)
        return launch_main_sm90_dtype<__nv_bfloat16>(p, stream);
    if (p->dtype == FLASH_FP16)
        return launch_main_sm90_dtype<__half>(p, stream);
    return cudaErrorInvalidValue;
}
