/* fwd_sm90.cu: the FlashAttention forward on Hopper tensor cores (wgmma + TMA, sm_90a), fp16 / bf16, head
 * dims up to 256, warp-specialized (FlashAttention-3's design, written from the PTX ISA).
 *
 * Algorithm. A work tile is FWD90_BM = 128 query rows of one (batch, query head); its CTA visits the key tiles
 * that flash_key_tiles (mask.h) puts in its rows' band, last first (a causal band's masked diagonal first).
 * Scheduling (sched.cuh): where every item costs the same (dense; a square causal band, heavy and light query
 * tiles paired) one persistent CTA per SM walks a static order; varlen in the dense kernel at d <= 128 (kDynamic)
 * runs persistent on a dynamic scheduler (warp 1 counts items off p.tile_counter, heaviest first within groups
 * of heads sharing K / V in L2); elsewhere (other varlen, windows, non-square bands, attn_mask, seqused_k,
 * leftpad) one CTA per query tile, heaviest first.
 * Warpgroup 0, the producer (setmaxnreg FWD90_PRODUCER_REGS): one thread issues the TMA loads of K_j, V_j into a
 *   ring of kStages stages running on across work tiles, and of Q into a ring of kQStages; each completes on
 *   its mbarrier. K and V of a stage are released apart (K_EMPTY after both consumers' S, V_EMPTY after their
 *   P V), so the next K loads a whole P V ahead of the next V. Where a sequence's keys end before the tensor's
 *   rows (varlen, seqused_k), warp 0 copies the last V tile itself, zero-filling rows past the sequence.
 * Warpgroups 1 and 2, the consumers (FWD90_CONSUMER_REGS): 64 query rows each. Per key tile j, in registers:
 *   S_j = Q K_j^T (wgmma SS, fp32); kHook kernels: score.h's composition (softcap in a kernel of its own,
 *   ALiBi, attn_mask in partial tiles); tiles outside [full_first, full_end): the band mask (a separate copy of
 *   the loop body); online softmax in base 2 (quad shuffles; O rescaled only where a row's max changed:
 *   LAZY_RESCALE); kHook: dropout after the row sum (quad_dropout_words of the Philox draws); O += P_j V_j (wgmma
 *   RS, P converted in registers; n = head dim, two n128 halves at 256).
 *   Overlap: iteration t issues S_t, then P_{t-1} V_{t-1}, waits for S_t alone (releases K_t), runs the softmax
 *   under the P V, then rescales O; named barriers ping-pong the wgmma issue between the two warpgroups so one's
 *   softmax runs under the other's GEMMs.
 * Epilogue: flash_row_finish_f (with a sink) per row; O * factor straight from the accumulators to global memory
 *   (a quad transposes its words so each lane stores 16 contiguous bytes; no smem, the next Q loads meanwhile).
 *   A row with no visible key: O = 0, lse = -inf (the sink with one).
 * attn_mask (kHook, d <= 128): producer and consumers walk the same visible key tiles (fwd90_tiles, the block
 *   flags 32 tiles per ballot); hidden tiles are never loaded.
 *
 * Tiles (tiles.h fwd90_cfg): 128 x kBlockN 128 at d <= 64 (3 stages, 1 Q stage) and d <= 128 (2 stages, 2 Q),
 *   128 x 80 at d <= 256 (2 stages, 1 Q); 128-byte swizzled smem (wgmma.cuh, TMA SWIZZLE_128B, 64-column
 *   boxes): 113 / 193 / 225 KB. Head dims below the config's are zero-filled by the TMA; only stores are guarded.
 * Serves (launch.cu flash_fwd_sm90_ok): fp16 / bf16, d % 8 == 0, 16-byte aligned pointers and strides, positive
 *   scale, no paged KV cache or split-KV; dense and varlen, seqused_k, k_batch_idx, k_leftpad, GQA, every band,
 *   sinks, softcap, ALiBi; attn_mask and dropout up to d128 (MASK_DROPOUT; d256: fwd_sm80.cu).
 *
 * Speed (H200, dev/fwd_harness.cu bench, bf16 16k tokens): d128 s8k 659 TFLOP/s (causal 624). Every shape, the
 * hook kernels, varlen, the scheduling choices and the runs beside cuDNN / FA2: benchmarks/results/h200/
 * history_fwd_sm90.md.
 */
#ifdef FLASHATTN_EXT_SM90A /* the whole file: builds with sm_90a only (launch.cu calls it under the same macro) */
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "../constants.h"
#include "../mask.h"
#include "../score.h"
#include "common.cuh"
#include "frag.cuh"
#include "launch.h"
#include "sched.cuh"
#include "tiles.h"
#include "wgmma.cuh"

#define FWD90_CONSUMER_WGS 2
#define FWD90_THREADS ((FWD90_CONSUMER_WGS + 1) * WARPGROUP_THREADS) /* producer + consumers */
#define FWD90_WG_ROWS 64                                          /* query rows per consumer: wgmma M */
#define FWD90_BM (FWD90_CONSUMER_WGS * FWD90_WG_ROWS)             /* query rows per CTA */
#define FWD90_PRODUCER_REGS 24  /* setmaxnreg of the producer warpgroup ... */
#define FWD90_CONSUMER_REGS 240 /* ... and of the consumers: 24 x 128 + 240 x 256 <= 64 K registers */
#define FWD90_PANEL 64          /* columns of one sw128 panel = the TMA box's inner dimension */
#define FWD90_WGMMA_K 16        /* K of one wgmma step */
#define FWD90_PV_N 128 /* largest N of one P V wgmma (d256 issues two; one n256 measured no faster) */
#define FWD90_BAR_BYTES 8       /* one mbarrier (64 bits) */
#define FWD90_SCHED_WARP 1      /* the producer warpgroup's warp that runs the dynamic scheduler */
/* The dynamic scheduler runs varlen batches of the dense kernel up to this head dim (d256: one CTA per query
 * tile, no kDynamic instantiation) */
#define FWD90_DYNAMIC_MAX_D 128
/* wgmma D fragment (wgmma.cuh): warp w of a warpgroup holds rows 16 w + lane / 4 and + 8 of each n8 block of
 * columns, value 4 i + 2 h + e = (row + 8 h, column 8 i + 2 (lane % 4) + e) */
#define FWD90_WARP_ROWS 16
#define FWD90_QUAD 4            /* lanes sharing a row */
#define FWD90_HALF_ROWS 8       /* the second row of a lane: + 8 */
#define FWD90_N8 8              /* columns of one n8 block */
#define FWD90_N8_VALS 4         /* a lane's values of one n8 block */
#define FWD90_ELEM_BYTES 2
/* smallest scale_log2 of the kHook kernels (as fwd_sm80.cu's): their raw units divide by the scale */
#define FWD90_HOOK_MIN_SCALE_LOG2 1e-20f
/* named barriers: 0 is __syncthreads; ping-pong turn of consumer c: FWD90_BAR_TURN + c (both consumers'
 * threads); epilogue of consumer c: FWD90_BAR_EPI + c (its own threads) */
#define FWD90_BAR_TURN 1
#define FWD90_BAR_EPI 3
/* dynamic scheduler: its work slot for the producer warp (FULL / EMPTY, the two warps' threads) and for the
 * consumers (FULL / EMPTY, the scheduler warp's and the consumers' threads) */
#define FWD90_BAR_WORK_P_FULL 5
#define FWD90_BAR_WORK_P_EMPTY 6
#define FWD90_BAR_WORK_C_FULL 7
#define FWD90_BAR_WORK_C_EMPTY 8
#define FWD90_WORK_P_THREADS (2 * FLASH_WARP_SIZE)
#define FWD90_WORK_C_THREADS (FLASH_WARP_SIZE + FWD90_CONSUMER_WGS * WARPGROUP_THREADS)
typedef fwd90_slot<FWD90_BAR_WORK_P_FULL, FWD90_BAR_WORK_P_EMPTY, FWD90_WORK_P_THREADS> fwd90_slot_p; /* sched.cuh */
typedef fwd90_slot<FWD90_BAR_WORK_C_FULL, FWD90_BAR_WORK_C_EMPTY, FWD90_WORK_C_THREADS> fwd90_slot_c;

/* The kernel's kScore is a flash_score_kind (score.h): FLASH_SCORE_SOFTCAP is a kernel of its own (a runtime
 * softcap branch measured 4-6% slower, and a copy of the loop in one kernel spilled in the main loop). */

/* The TMA tensor maps of q, k, v, 4-D (d, rows, heads, batches), boxes of 64 columns x FWD90_BM (q) or
 * kBlockN (k, v) rows, 128-byte swizzle. Built per call by the launcher from the params' pointers and
 * strides; passed beside them as a __grid_constant__ parameter. */
typedef struct fwd90_maps {
    CUtensorMap q, k, v;
} fwd90_maps;

/* Shared-memory layout from a 1024-byte aligned base: Q[kQStages], K[kStages], V[kStages], then the mbarriers
 * Q_FULL[kQStages], Q_EMPTY[kQStages], K_FULL[kStages], V_FULL[kStages], K_EMPTY[kStages], V_EMPTY[kStages],
 * then the dynamic scheduler's work slots (int32) for the producer warp and for the consumers. */
template <int kHeadDim>
struct fwd90_smem {
    static constexpr int kBlockN = fwd90_cfg<kHeadDim>::BN, kStages = fwd90_cfg<kHeadDim>::STAGES;
    static constexpr int kQStages = fwd90_cfg<kHeadDim>::Q_STAGES;
    static constexpr int kQBytes = FWD90_BM * kHeadDim * FWD90_ELEM_BYTES;
    static constexpr int kKVBytes = kBlockN * kHeadDim * FWD90_ELEM_BYTES;
    static constexpr int kK = kQStages * kQBytes, kV = kK + kStages * kKVBytes, kBars = kV + kStages * kKVBytes;
    static constexpr int kQFull = kBars, kQEmpty = kQFull + FWD90_BAR_BYTES * kQStages,
                         kKFull = kQEmpty + FWD90_BAR_BYTES * kQStages,
                         kVFull = kKFull + FWD90_BAR_BYTES * kStages, kKEmpty = kVFull + FWD90_BAR_BYTES * kStages,
                         kVEmpty = kKEmpty + FWD90_BAR_BYTES * kStages, kWorkP = kVEmpty + FWD90_BAR_BYTES * kStages,
                         kWorkC = kWorkP + (int)sizeof(int32_t);
    static constexpr size_t kBytes =
        (size_t)kWorkC + sizeof(int32_t) + SW128_ATOM_BYTES; /* + alignment */
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* Compiler-level fence on accumulator registers: keeps their reads and writes on their side of the
 * wgmma issue / wait around it. */
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N])
{
#pragma unroll
    for (int i = 0; i < N; i++)
        asm volatile("" : "+f"(r[i])::"memory");
}

/* S = Q_wg K^T for one key tile: kHeadDim / 16 wgmma SS steps, committed as one group. sq: the consumer's
 * 64 rows of the Q tile (FWD90_BM rows), sk: the K stage. */
template <typename T, int kHeadDim, int kBlockN>
__device__ __forceinline__ void gemm_qk(float (&s)[kBlockN / 2], uint32_t sq, int q_row0, uint32_t sk)
{
    fence_regs(s);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / FWD90_WGMMA_K; kk++)
        wgmma_op<T, kBlockN>::template ss<0, 0>(s, desc_k_major<FWD90_BM>(sq, q_row0, kk * FWD90_WGMMA_K),
                                                desc_k_major<kBlockN>(sk, 0, kk * FWD90_WGMMA_K), kk > 0);
    wgmma_commit();
    fence_regs(s);
}

/* O += P V for one key tile: kBlockN / 16 k steps of wgmma RS (P from registers), V MN-major; one n128
 * wgmma per 128 output columns. Committed as one group. */
template <typename T, int kHeadDim, int kBlockN>
__device__ __forceinline__ void gemm_pv(float (&o)[kHeadDim / 2], const uint32_t (&pa)[kBlockN / 16][4], uint32_t sv)
{
    constexpr int kN = kHeadDim < FWD90_PV_N ? kHeadDim : FWD90_PV_N;
    fence_regs(o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / FWD90_WGMMA_K; kk++)
#pragma unroll
        for (int nh = 0; nh < kHeadDim / kN; nh++)
            wgmma_op<T, kN>::template rs<1>(o + nh * (kN / 2), pa[kk],
                                            desc_mn_major<kBlockN>(sv, kk * FWD90_WGMMA_K, nh * kN), 1);
    wgmma_commit();
    fence_regs(o);
}

/* Band and tail mask of one tile on the raw scores: value 4 i + 2 h + e is row r_t + 8 h, key c_t + 8 i + e;
 * -inf where the key is >= sk or j - i is outside [diag_lo, diag_hi] (one unsigned compare). */
template <int kN>
__device__ __forceinline__ void mask_tile(float (&s)[kN], int r_t, int c_t, int sk, int diag_lo, int diag_hi)
{
    const unsigned from_lo0 = (unsigned)(c_t - r_t) - (unsigned)diag_lo;
    const unsigned band = (unsigned)diag_hi - (unsigned)diag_lo;
#pragma unroll
    for (int i = 0; i < kN / FWD90_N8_VALS; i++)
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int col = c_t + FWD90_N8 * i + e;
                if (col >= sk || from_lo0 + (unsigned)(FWD90_N8 * i + e - FWD90_HALF_ROWS * h) > band)
                    s[4 * i + 2 * h + e] = -INFINITY;
            }
}

/* Online softmax of one tile: s (raw scores) becomes P = exp2(s scale - m scale); m, l updated; alpha =
 * exp2((m_old - m) scale), the factor O must be rescaled by. A row whose max is still -inf exponentiates
 * against 0 (P = 0, never NaN). */
template <int kN>
__device__ __forceinline__ void softmax_tile(float (&s)[kN], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                             float scale)
{
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float mx = m[h];
#pragma unroll
        for (int i = 0; i < kN / FWD90_N8_VALS; i++)
            mx = fmaxf(mx, fmaxf(s[4 * i + 2 * h], s[4 * i + 2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 2));
        const float ms = mx == -INFINITY ? 0.f : mx * scale;
        alpha[h] = exp2_approx(m[h] * scale - ms);
        m[h] = mx;
        float sum = 0.f;
#pragma unroll
        for (int i = 0; i < kN / FWD90_N8_VALS; i++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float pe = exp2_approx(fmaf(s[4 * i + 2 * h + e], scale, -ms));
                s[4 * i + 2 * h + e] = pe;
                sum += pe;
            }
        l[h] = l[h] * alpha[h] + sum;
    }
}

/* P (the S accumulators after softmax_tile) as kN / 8 A fragments of k16: n8 blocks 2 kk, 2 kk + 1. */
template <typename T, int kN>
__device__ __forceinline__ void p_to_frags(const float (&s)[kN], uint32_t (&pa)[kN / 8][4])
{
#pragma unroll
    for (int kk = 0; kk < kN / 8; kk++) {
        pa[kk][0] = pack2<T>(s[8 * kk + 0], s[8 * kk + 1]);
        pa[kk][1] = pack2<T>(s[8 * kk + 2], s[8 * kk + 3]);
        pa[kk][2] = pack2<T>(s[8 * kk + 4], s[8 * kk + 5]);
        pa[kk][3] = pack2<T>(s[8 * kk + 6], s[8 * kk + 7]);
    }
}

/* O *= alpha per row; kLazy: not at all when no row of the warp changed its max (alpha exactly 1). */
template <bool kLazy, int kN>
__device__ __forceinline__ void rescale_o(float (&o)[kN], const float (&alpha)[2])
{
    if (kLazy && !__any_sync(FULL_MASK, alpha[0] != 1.f || alpha[1] != 1.f))
        return;
#pragma unroll
    for (int i = 0; i < kN / FWD90_N8_VALS; i++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            o[4 * i + e] *= alpha[e / 2];
}

/* The consumers' turn to issue wgmma's (ping-pong): consumer c waits for its barrier, issues, then hands the
 * turn to the other. */
__device__ __forceinline__ void turn_wait(int c)
{
    named_sync(FWD90_BAR_TURN + c, FWD90_CONSUMER_WGS * WARPGROUP_THREADS);
}
__device__ __forceinline__ void turn_pass(int c)
{
    named_arrive(FWD90_BAR_TURN + (c ^ 1), FWD90_CONSUMER_WGS * WARPGROUP_THREADS);
}

/* What a consumer's main loop carries. */
template <int kHeadDim, int kBlockN>
struct fwd90_state {
    float o[kHeadDim / 2];       /* O accumulators (wgmma D layout; columns 128 nh + 8 i + 2 (lane % 4) + e) */
    float s[kBlockN / 2];        /* S, then P of the current tile */
    uint32_t pa[kBlockN / 16][4]; /* P of the previous tile as A fragments (read by the in-flight P V wgmma) */
    float m[2], l[2];            /* running max (raw units) and this lane's part of the row sum, rows r, r + 8 */
};

/* A consumer thread's constants of one work tile: its first row r_t and first key column lane_c of a key tile
 * (value 4 i + 2 h + e of S is row r_t + 8 h, key j kBlockN + lane_c + 8 i + e), the band and key count of
 * the sequence, and (kHook) the score hook's constants in the raw units of q.k (score.h, s = x scale), the
 * attn_mask of (b, hq) (element (i, j) at mask + mask_es (i mask_s.row + j mask_s.col); NULL:
 * none), and the dropout counter's bh = b h + hq. */
struct fwd90_tile {
    int r_t, lane_c, sk, diag_lo, diag_hi;
    flash_score_f hook;
    const unsigned char *mask;
    uint32_t bh;
};

/* attn_mask of one tile on the raw scores (step 3 of score.h): additive x += mask[b, hq, i, j] / scale, bool
 * x = -inf where mask[b, hq, i, j] == 0. A lane's values of a row in one n8 block are 2 consecutive keys: one 2-element
 * load where the keys are contiguous and aligned and the tile lies inside sk, else 2 scalar loads with rows
 * past sq and keys past sk reading the last row / key (values never used), so every read stays inside. */
template <typename T, int kN>
__device__ __forceinline__ void mask_tile_data(float (&s)[kN], const flash_params &p, const fwd90_tile &tl, int c_t)
{
    constexpr int kBlockN = 2 * kN;
    const bool additive = p.mask_kind == FLASH_MASK_ADD;
    const int64_t es = additive ? (int64_t)sizeof(T) : 1;
    const int last_row = (int)p.sq - 1, last_key = (int)p.sk - 1;
    const bool pairs = c_t - tl.lane_c + kBlockN <= p.sk && p.mask_s.col == 1 && p.mask_s.row % 2 == 0 &&
                       (uintptr_t)tl.mask % (2 * es) == 0;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const unsigned char *row = tl.mask + es * (int64_t)min(tl.r_t + FWD90_HALF_ROWS * h, last_row) * p.mask_s.row;
#pragma unroll
        for (int i = 0; i < kN / FWD90_N8_VALS; i++) {
            const int key = c_t + FWD90_N8 * i;
            float *x = &s[4 * i + 2 * h];
            if (additive) {
                uint32_t w;
                if (pairs)
                    w = __ldg((const unsigned int *)(row + es * key));
                else
                    w = (uint32_t)__ldg((const unsigned short *)(row + es * min(key, last_key) * p.mask_s.col)) |
                        (uint32_t)__ldg((const unsigned short *)(row + es * min(key + 1, last_key) * p.mask_s.col))
                            << 16;
                x[0] = flash_score_mask_add(&tl.hook, x[0], bits_to_float(T(), w));
                x[1] = flash_score_mask_add(&tl.hook, x[1], bits_to_float(T(), w >> 16));
            } else {
                uint32_t w;
                if (pairs)
                    w = __ldg((const unsigned short *)(row + key));
                else
                    w = (uint32_t)__ldg(row + min(key, last_key) * p.mask_s.col) |
                        (uint32_t)__ldg(row + min(key + 1, last_key) * p.mask_s.col) << 8;
                x[0] = flash_score_mask_bool(x[0], w & 0xffu);
                x[1] = flash_score_mask_bool(x[1], w >> 8);
            }
        }
    }
}

/* The score hook of one tile (score.h's order; kHook kernels), on raw scores: softcap where kCap (the
 * kernel's FLASH_SCORE_SOFTCAP; tanh.approx, as every tensor-core kernel, so that the backward recomputes
 * these scores), the position bias (a branch uniform over the CTA; value v sits wgmma_d_row(v) rows and
 * wgmma_d_col(v) keys from the thread's first), then the attn_mask where the tile's block flags say it is
 * partial (mask_partial). */
template <typename T, bool kHook, bool kCap, int kN>
__device__ __forceinline__ void hook_tile(float (&s)[kN], const flash_params &p, const fwd90_tile &tl, int c_t,
                                          bool mask_partial)
{
    if (!kHook)
        return;
    if (kCap) {
#pragma unroll
        for (int v = 0; v < kN; v++)
            s[v] = flash_score_cap_out(&tl.hook, tanh_approx(flash_score_cap_in(&tl.hook, s[v])));
    }
    if (flash_score_biased(&p)) {
        const int d0 = c_t - tl.r_t - (int)tl.hook.alibi_offset; /* j - i' of the thread's first value */
#pragma unroll
        for (int v = 0; v < kN; v++)
            s[v] = flash_score_bias(&tl.hook, s[v], d0, wgmma_d_col(v) - wgmma_d_row(v));
    }
    if (mask_partial)
        mask_tile_data<T>(s, p, tl, c_t);
}

/* 4 x 4 transpose of 32-bit words across the lanes of a quad (q = lane % 4): in, lane t holds w[k] = word k of
 * row t; out, lane q holds f[u] = word q of row u. Two butterfly stages (xor 2, xor 1), 4 shuffles. */
__device__ __forceinline__ void quad_transpose(const uint32_t (&w)[4], uint32_t (&f)[4], int q)
{
    const bool b1 = q & 2, b0 = q & 1;
    /* stage 1: keep words 2 b1, 2 b1 + 1 of the own row, take the same words of row q ^ 2 */
    const uint32_t s0 = __shfl_xor_sync(FULL_MASK, b1 ? w[0] : w[2], 2);
    const uint32_t s1 = __shfl_xor_sync(FULL_MASK, b1 ? w[1] : w[3], 2);
    const uint32_t k0 = b1 ? w[2] : w[0], k1 = b1 ? w[3] : w[1];
    /* c[a][kk]: word 2 b1 + kk of the row with bit 1 = a and bit 0 = b0 */
    const uint32_t c[2][2] = {{b1 ? s0 : k0, b1 ? s1 : k1}, {b1 ? k0 : s0, b1 ? k1 : s1}};
    /* stage 2: keep word q of those rows, take word q of the rows of q ^ 1 */
#pragma unroll
    for (int a = 0; a < 2; a++) {
        const uint32_t keep = b0 ? c[a][1] : c[a][0];
        const uint32_t recv = __shfl_xor_sync(FULL_MASK, b0 ? c[a][0] : c[a][1], 1);
        f[2 * a] = b0 ? recv : keep;
        f[2 * a + 1] = b0 ? keep : recv;
    }
}

/* The Philox draws of two n8 blocks handed round a quad (q = lane % 4): in, lane t holds w[k] = word k of
 * call t, where call 2 b + e draws keys 4 e .. 4 e + 3 of block b; out, lane q holds f[2 b + x] = the draw of
 * key 2 q + x of block b (word 2 (q % 2) + x of call 2 b + q / 2). Two butterfly stages (xor 1: lane bit 0
 * for word bit 1; xor 2: lane bit 1 for slot bit 1), 4 shuffles. */
__device__ __forceinline__ void quad_dropout_words(const uint32_t (&w)[4], uint32_t (&f)[4], int q)
{
    const bool b1 = q & 2, b0 = q & 1;
    /* stage 1: keep words 2 b0, 2 b0 + 1, take the same words of lane q ^ 1; c[z][x]: word 2 b0 + x of call
     * 2 b1 + z (block b1, half z) */
    const uint32_t r0 = __shfl_xor_sync(FULL_MASK, b0 ? w[0] : w[2], 1);
    const uint32_t r1 = __shfl_xor_sync(FULL_MASK, b0 ? w[1] : w[3], 1);
    const uint32_t k0 = b0 ? w[2] : w[0], k1 = b0 ? w[3] : w[1];
    const uint32_t c[2][2] = {{b0 ? r0 : k0, b0 ? r1 : k1}, {b0 ? k0 : r0, b0 ? k1 : r1}};
    /* stage 2: lane q needs half b1 of both blocks: keep c[b1], send c[b1 ^ 1] (which lane q ^ 2 needs) and
     * take lane q ^ 2's half b1 of block b1 ^ 1 */
#pragma unroll
    for (int x = 0; x < 2; x++) {
        const uint32_t keep = b1 ? c[1][x] : c[0][x];
        const uint32_t recv = __shfl_xor_sync(FULL_MASK, b1 ? c[0][x] : c[1][x], 2);
        f[x] = b1 ? recv : keep;
        f[2 + x] = b1 ? keep : recv;
    }
}

/* Dropout of one tile's P (mask.h): the 8 keys of n8 block i of a row are two Philox calls of 4 keys
 * (flash_dropout_bits, counters key0 / 4 + 2 i, + 1), of which lane q holds keys 2 q, 2 q + 1. Lane q of a
 * quad computes call q of blocks 2 g, 2 g + 1 (counter key0 / 4 + 4 g + q) and quad_dropout_words hands each
 * lane its draws. Dropped values become 0 (the row sum already holds the undropped P; dropout_scale is applied
 * in the epilogue). */
template <int kN>
__device__ __forceinline__ void dropout_tile(float (&s)[kN], const flash_params &p, const fwd90_tile &tl, int key0,
                                             int lane)
{
    static_assert(FWD90_N8 == 2 * FLASH_DROPOUT_KEYS_PER_CALL && FWD90_QUAD == 4, "two Philox calls per n8 block");
    constexpr int kN8 = kN / FWD90_N8_VALS;
    const int q = lane % FWD90_QUAD;
    const uint32_t cut = flash_dropout_cut(&p); /* kept iff draw > cut */
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int g = 0; g < (kN8 + 1) / 2; g++) {
            uint32_t w[4], f[4];
            flash_dropout_bits(&p, tl.bh, tl.r_t + FWD90_HALF_ROWS * h,
                               key0 / FLASH_DROPOUT_KEYS_PER_CALL + FWD90_QUAD * g + q, w);
            quad_dropout_words(w, f, q);
#pragma unroll
            for (int b = 0; b < 2; b++) {
                const int i = 2 * g + b;
                if (i < kN8) {
                    float *x = &s[4 * i + 2 * h];
                    x[0] = f[2 * b] > cut ? x[0] : 0.f;
                    x[1] = f[2 * b + 1] > cut ? x[1] : 0.f;
                }
            }
        }
}

/* The key tiles of one work tile that its attn_mask leaves visible (kHook kernels; without a mask every tile
 * of [first, end)). Block flags (mask.h flash_mask_tile_flags) of 32 tiles per ballot; lane w holds the words
 * of tiles base + 32 w + bit of a chunk of FWD90_CHUNK_TILES tiles: vis (some entry visible) and part (some
 * entry masked). Every warp of the CTA computes the same, so producer and consumers walk one sequence. */
#define FWD90_CHUNK_TILES (FLASH_WARP_SIZE * FLASH_WARP_SIZE) /* a ballot's 32 bits in each of 32 lanes */
struct fwd90_tiles {
    int first, base, b, hq, m0, qn;
    uint32_t vis, part;
};

__device__ __forceinline__ fwd90_tiles fwd90_tiles_init(int first, int end, int b, int hq, int m0, int qn)
{
    fwd90_tiles it;
    it.first = first;
    it.base = end; /* no chunk yet */
    it.b = b, it.hq = hq, it.m0 = m0, it.qn = qn;
    it.vis = it.part = 0;
    return it;
}

/* flash_mask_tile_flags (mask.h) of key tile `tile` for the work tile's rows: the OR of its blocks' flags,
 * 8 at a time (one 64-bit load per block row, one at all where the rows broadcast) where a full tile's 8
 * blocks are contiguous, aligned bytes; else mask.h's byte loop. */
#define FWD90_FLAGS_PER_LOAD 8
template <int kBlockN>
__device__ __forceinline__ unsigned fwd90_tile_flags(const fwd90_tiles &it, const flash_params &p, int tile)
{
    const int64_t k0 = (int64_t)tile * kBlockN;
    const flash_strides4 &fs = p.mask_blocks_s;
    const uint8_t *f = p.mask_blocks + it.b * fs.batch + it.hq * fs.head + it.m0 / FLASH_MASK_BLOCK * fs.row +
                       k0 / FLASH_MASK_BLOCK * fs.col;
    if (kBlockN == FWD90_FLAGS_PER_LOAD * FLASH_MASK_BLOCK && fs.col == 1 && k0 + kBlockN <= p.sk &&
        fs.row % FWD90_FLAGS_PER_LOAD == 0 && (uintptr_t)f % FWD90_FLAGS_PER_LOAD == 0) {
        const int rows = fs.row == 0 ? 1 : (it.qn + FLASH_MASK_BLOCK - 1) / FLASH_MASK_BLOCK;
        unsigned long long acc = 0;
#pragma unroll
        for (int r = 0; r < FWD90_BM / FLASH_MASK_BLOCK; r++)
            if (r < rows)
                acc |= __ldg((const unsigned long long *)(f + r * fs.row));
        acc |= acc >> 32;
        acc |= acc >> 16;
        acc |= acc >> 8;
        return (unsigned)(acc & 0xffu);
    }
    return flash_mask_tile_flags(&p, it.b, it.hq, it.m0, it.qn, k0, flash_min64(kBlockN, p.sk - k0));
}

/* The chunk of tiles [top - FWD90_CHUNK_TILES + 1, top] (clamped to first). */
template <int kBlockN>
__device__ __forceinline__ void fwd90_tiles_scan(fwd90_tiles &it, const flash_params &p, int top, int lane)
{
    it.base = max(it.first, top - FWD90_CHUNK_TILES + 1);
    it.vis = it.part = 0;
    for (int k = 0; k < FLASH_WARP_SIZE && it.base + FLASH_WARP_SIZE * k <= top; k++) {
        const int tile = it.base + FLASH_WARP_SIZE * k + lane;
        const unsigned f = tile <= top ? fwd90_tile_flags<kBlockN>(it, p, tile) : 0u;
        const uint32_t v = __ballot_sync(FULL_MASK, f & FLASH_MASK_ANY_VISIBLE);
        const uint32_t m = __ballot_sync(FULL_MASK, f & FLASH_MASK_ANY_MASKED);
        if (lane == k)
            it.vis = v, it.part = m;
    }
}

/* The largest visible tile <= j (first - 1 if none). */
template <int kBlockN>
__device__ __forceinline__ int fwd90_tiles_prev(fwd90_tiles &it, const flash_params &p, int j, int lane)
{
    if (p.mask_blocks == NULL)
        return j;
    while (j >= it.first) {
        if (j < it.base)
            fwd90_tiles_scan<kBlockN>(it, p, j, lane);
        const int rel = j - it.base, w = rel / FLASH_WARP_SIZE;
        const uint32_t word = __shfl_sync(FULL_MASK, it.vis, w) &
                              (FULL_MASK >> (FLASH_WARP_SIZE - 1 - rel % FLASH_WARP_SIZE));
        if (word)
            return it.base + FLASH_WARP_SIZE * w + FLASH_WARP_SIZE - 1 - __clz(word);
        const uint32_t lower = __ballot_sync(FULL_MASK, lane < w && it.vis != 0);
        if (lower) {
            const int w2 = FLASH_WARP_SIZE - 1 - __clz(lower);
            return it.base + FLASH_WARP_SIZE * w2 + FLASH_WARP_SIZE - 1 -
                   __clz(__shfl_sync(FULL_MASK, it.vis, w2));
        }
        j = it.base - 1;
    }
    return it.first - 1;
}

/* Tile j (just returned by fwd90_tiles_prev) holds masked entries of the attn_mask: read it. */
__device__ __forceinline__ bool fwd90_tiles_partial(const fwd90_tiles &it, const flash_params &p, int j)
{
    if (p.mask_blocks == NULL)
        return false;
    const int rel = j - it.base;
    return (__shfl_sync(FULL_MASK, it.part, rel / FLASH_WARP_SIZE) >> (rel % FLASH_WARP_SIZE)) & 1u;
}

/* A consumer's view of the shared memory: the Q tile (its rows q_row0 .. + 63 of FWD90_BM), the K / V ring
 * and its mbarriers; c the consumer (its ping-pong turn), releaser the thread that arrives on K_EMPTY, V_EMPTY
 * and Q_EMPTY. */
struct fwd90_ring {
    uint32_t sq, sk0, sv0, kfull, vfull, kempty, vempty;
    int q_row0, c;
    bool releaser;
};

/* One iteration of a consumer's loop past a work tile's first key tile: key tile j, ring index g (the
 * CTA's count of K / V tiles so far: stage g % kStages, phase g / kStages), the previous key tile at g - 1:
 * issue S_g and O += P_{g-1} V_{g-1}, softmax S_g under the P V wgmma, release ring slot g - 1, rescale O,
 * convert P_g. kMask: the tile needs the band / tail mask; kHook: the score hook (hook_tile; kCap: softcap,
 * mask_partial: the tile reads the attn_mask) and dropout. */
template <typename T, int kHeadDim, int kBlockN, int kStages, bool kMask, bool kHook, bool kCap>
__device__ __forceinline__ void consumer_step(fwd90_state<kHeadDim, kBlockN> &st, const flash_params &p,
                                              const fwd90_ring &r, int g, int j, float scale, const fwd90_tile &tl,
                                              bool mask_partial, int lane)
{
    constexpr int kKV = kBlockN * kHeadDim * FWD90_ELEM_BYTES;
    const int s_cur = g % kStages, s_prev = (g - 1) % kStages;
    turn_wait(r.c);
    mbar_wait(r.kfull + FWD90_BAR_BYTES * s_cur, (g / kStages) & 1);
    gemm_qk<T, kHeadDim, kBlockN>(st.s, r.sq, r.q_row0, r.sk0 + s_cur * kKV);
    mbar_wait(r.vfull + FWD90_BAR_BYTES * s_prev, ((g - 1) / kStages) & 1);
    gemm_pv<T, kHeadDim, kBlockN>(st.o, st.pa, r.sv0 + s_prev * kKV);
    turn_pass(r.c);
    wgmma_wait<1>();
    fence_regs(st.s);
    if (r.releaser)
        mbar_arrive(r.kempty + FWD90_BAR_BYTES * s_cur);
    hook_tile<T, kHook, kCap>(st.s, p, tl, j * kBlockN + tl.lane_c, mask_partial);
    if (kMask)
        mask_tile(st.s, tl.r_t, j * kBlockN + tl.lane_c, tl.sk, tl.diag_lo, tl.diag_hi);
    float alpha[2];
    softmax_tile(st.s, st.m, st.l, alpha, scale);
    if (kHook && fwd90_cfg<kHeadDim>::MASK_DROPOUT && p.dropout_threshold != 0)
        dropout_tile(st.s, p, tl, j * kBlockN, lane);
    wgmma_wait<0>();
    fence_regs(st.o);
    if (r.releaser)
        mbar_arrive(r.vempty + FWD90_BAR_BYTES * s_prev);
    rescale_o<fwd90_cfg<kHeadDim>::LAZY_RESCALE>(st.o, alpha);
    p_to_frags<T>(st.s, st.pa);
}

/* The first key tile j of a work tile (ring index g; the last visible tile of the band): S, the score hook,
 * the band mask where j is outside [full_first, full_end), softmax, dropout and P, without a P V yet. */
template <typename T, int kHeadDim, int kBlockN, int kStages, bool kHook, bool kData, bool kCap>
__device__ __forceinline__ void consumer_first(fwd90_state<kHeadDim, kBlockN> &st, const flash_params &p,
                                               const fwd90_ring &r, const fwd90_tiles &it, int g, int j,
                                               bool band_masked, float scale, const fwd90_tile &tl, int lane)
{
    const int s0 = g % kStages;
    turn_wait(r.c);
    mbar_wait(r.kfull + FWD90_BAR_BYTES * s0, (g / kStages) & 1);
    gemm_qk<T, kHeadDim, kBlockN>(st.s, r.sq, r.q_row0, r.sk0 + s0 * fwd90_smem<kHeadDim>::kKVBytes);
    turn_pass(r.c);
    wgmma_wait<0>();
    fence_regs(st.s);
    if (r.releaser)
        mbar_arrive(r.kempty + FWD90_BAR_BYTES * s0);
    hook_tile<T, kHook, kCap>(st.s, p, tl, j * kBlockN + tl.lane_c, kData && fwd90_tiles_partial(it, p, j));
    if (band_masked)
        mask_tile(st.s, tl.r_t, j * kBlockN + tl.lane_c, tl.sk, tl.diag_lo, tl.diag_hi);
    float alpha[2];
    softmax_tile(st.s, st.m, st.l, alpha, scale);
    if (kData && p.dropout_threshold != 0)
        dropout_tile(st.s, p, tl, j * kBlockN, lane);
    p_to_frags<T>(st.s, st.pa);
}

/* The key tiles of one work tile but the last P V: the first one (j, ring index g), then the rest from the
 * last one down, in any order of band-masked, full and attn_mask-partial tiles (kData with a mask: hidden ones
 * skipped, fwd90_tiles). kHook: the score hook. Returns the tiles visited. */
template <typename T, int kHeadDim, int kBlockN, int kStages, bool kHook, bool kData, bool kCap>
__device__ __forceinline__ int consumer_tiles(fwd90_state<kHeadDim, kBlockN> &st, const flash_params &p,
                                              const fwd90_ring &r, fwd90_tiles &it, const flash_tile_range &kt,
                                              int g, int j, float scale, const fwd90_tile &tl, int lane)
{
    const int first = (int)kt.first, full_first = (int)kt.full_first, full_end = (int)kt.full_end;
    consumer_first<T, kHeadDim, kBlockN, kStages, kHook, kData, kCap>(st, p, r, it, g, j,
                                                                      j < full_first || j >= full_end, scale, tl, lane);
    int t = 1;
    if (kData && p.mask_blocks != NULL) {
        /* the visible tiles of the attn_mask's block flags, each by the copy its band position needs */
        for (j = fwd90_tiles_prev<kBlockN>(it, p, j - 1, lane); j >= first;
             j = fwd90_tiles_prev<kBlockN>(it, p, j - 1, lane), t++) {
            const bool partial = fwd90_tiles_partial(it, p, j);
            if (j < full_first || j >= full_end)
                consumer_step<T, kHeadDim, kBlockN, kStages, true, kHook, kCap>(st, p, r, g + t, j, scale, tl, partial,
                                                                               lane);
            else
                consumer_step<T, kHeadDim, kBlockN, kStages, false, kHook, kCap>(st, p, r, g + t, j, scale, tl,
                                                                                partial, lane);
        }
        return t;
    }
    /* every tile of the band: its masked tiles, full tiles, masked tiles, each by its compile-time copy */
    const int end = (int)kt.end, n_tiles = end - first;
    for (; t < n_tiles && end - 1 - t >= full_end; t++)
        consumer_step<T, kHeadDim, kBlockN, kStages, true, kHook, kCap>(st, p, r, g + t, end - 1 - t, scale, tl, false,
                                                                       lane);
    for (; t < n_tiles && end - 1 - t >= full_first; t++)
        consumer_step<T, kHeadDim, kBlockN, kStages, false, kHook, kCap>(st, p, r, g + t, end - 1 - t, scale, tl, false,
                                                                        lane);
    for (; t < n_tiles; t++)
        consumer_step<T, kHeadDim, kBlockN, kStages, true, kHook, kCap>(st, p, r, g + t, end - 1 - t, scale, tl, false,
                                                                       lane);
    return t;
}

/* The producer warp's copy of a V tile whose rows past `rows` must read as zeros (see the header): cp.async
 * of rows [0, rows) from g (row stride `stride`, columns < d), zeros elsewhere, in the sw128 layout. */
template <typename T, int kHeadDim, int kBlockN>
__device__ __forceinline__ void copy_v_tail(uint32_t sv, const T *g, int64_t stride, int rows, int d, int lane)
{
    constexpr int kChunks = kHeadDim / CHUNK;
#pragma unroll 4
    for (int idx = lane; idx < kBlockN * kChunks; idx += FLASH_WARP_SIZE) {
        const int r = idx / kChunks, cc = (idx % kChunks) * CHUNK;
        const bool ok = r < rows && cc < d;
        cp_async_16(sv + sw128_offset(kBlockN, r, cc), ok ? (const void *)(g + r * stride + cc) : (const void *)g, ok);
    }
    cp_async_commit();
    cp_async_wait<0>();
    fence_proxy_async();
}

#endif

/* One CTA per SM (persistent) walks the work tiles w = blockIdx.x, + gridDim.x, ... (static)
 * or those the dynamic scheduler hands it (p.tile_counter), or one CTA per work tile; the producer runs ahead into
 * the next work tile (its first K / V tile, then its Q once the consumers are done with the current Q:
 * Q_EMPTY) while the consumers finish the current one. */
template <typename T, int kHeadDim, int kScore, bool kDynamic>
__global__ void __launch_bounds__(FWD90_THREADS, 1)
    flash_fwd_sm90_kernel(const __grid_constant__ flash_params p, const __grid_constant__ fwd90_maps maps)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using L = fwd90_smem<kHeadDim>;
    constexpr int kBlockN = L::kBlockN, kStages = L::kStages, kQStages = L::kQStages;
    constexpr bool kHook = kScore != FLASH_SCORE_DENSE, kCap = kScore == FLASH_SCORE_SOFTCAP;
    constexpr bool kData = kHook && fwd90_cfg<kHeadDim>::MASK_DROPOUT; /* attn_mask and dropout */
    extern __shared__ uint8_t smem_raw[];
    const uint32_t base = (smem_u32(smem_raw) + SW128_ATOM_BYTES - 1) & ~(uint32_t)(SW128_ATOM_BYTES - 1);
    const uint32_t sq = base, sk0 = base + L::kK, sv0 = base + L::kV;
    const uint32_t qfull = base + L::kQFull, qempty = base + L::kQEmpty, kfull = base + L::kKFull,
                   vfull = base + L::kVFull, kempty = base + L::kKEmpty, vempty = base + L::kVEmpty;
    const uint32_t slot_p = base + L::kWorkP, slot_c = base + L::kWorkC; /* [1] int32 each: dynamic scheduler */
    const int tid = threadIdx.x;
    const int m_tiles = (int)((p.sq + FWD90_BM - 1) / FWD90_BM);
    static_assert(!kDynamic || kScore == FLASH_SCORE_DENSE, "the dynamic scheduler serves the dense kernels");
    constexpr bool dynamic = kDynamic; /* p.tile_counter set: launch_fwd90 */
    const bool paired = !dynamic && fwd90_paired(p) && !(kData && p.mask != NULL);
    const int n_work = fwd90_items_per_head(m_tiles, paired) * (int)p.h * (int)p.b;

    if (tid == 0) {
        for (int s = 0; s < kQStages; s++) {
            mbar_init(qfull + FWD90_BAR_BYTES * s, 1);
            mbar_init(qempty + FWD90_BAR_BYTES * s, FWD90_CONSUMER_WGS);
        }
        for (int s = 0; s < kStages; s++) {
            mbar_init(kfull + FWD90_BAR_BYTES * s, 1);
            mbar_init(vfull + FWD90_BAR_BYTES * s, 1);
            mbar_init(kempty + FWD90_BAR_BYTES * s, FWD90_CONSUMER_WGS);
            mbar_init(vempty + FWD90_BAR_BYTES * s, FWD90_CONSUMER_WGS);
        }
        mbar_fence_init();
    }
    __syncthreads();

    const int wg = tid / WARPGROUP_THREADS;
    if (wg == 0) {
        /* ---- producer: warp 0 (lane 0 issues the TMA loads; the whole warp copies V tails) ---- */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(FWD90_PRODUCER_REGS));
        if (tid >= FLASH_WARP_SIZE) {
            if (dynamic && tid / FLASH_WARP_SIZE == FWD90_SCHED_WARP)
                fwd90_schedule<FWD90_BM, fwd90_slot_p, fwd90_slot_c>(p, n_work, m_tiles,
                                                                     fwd90_group(p, kHeadDim, FWD90_ELEM_BYTES), slot_p,
                                                                     slot_c, tid % FLASH_WARP_SIZE);
            return;
        }
        const int lane = tid;
        /* the V rows past the sequence's keys are the tensor's own end (zero-filled by the TMA) only in a
         * dense batch without seqused_k */
        const bool tail_by_tma = p.cu_seqlens_q == NULL && p.seqused_k == NULL;
        if (lane == 0) {
            tma_prefetch_map(&maps.q);
            tma_prefetch_map(&maps.k);
            tma_prefetch_map(&maps.v);
        }
        int g = 0, qc = 0; /* K / V tiles and Q tiles loaded so far */
        for (int w = blockIdx.x; w < n_work;
             w = dynamic ? fwd90_take<fwd90_slot_p>(slot_p, n_work)
                         : w + (int)gridDim.x) {
            for (int part = 0; part < fwd90_parts(w, m_tiles, paired); part++) {
                const fwd90_work wk =
                    dynamic ? fwd90_work_grouped<FWD90_BM>(w, m_tiles, p, fwd90_group(p, kHeadDim, FWD90_ELEM_BYTES))
                            : fwd90_work_of<FWD90_BM>(w, part, m_tiles, (int)p.h, paired);
                const flash_seq seq = flash_seq_of(&p, wk.b);
                if (wk.m0 >= seq.sq)
                    continue; /* varlen: the grid spans the longest sequence */
                const int skn = (int)seq.sk, qn = (int)flash_min64(seq.sq - wk.m0, FWD90_BM);
                const flash_tile_range kt = flash_key_tiles(&seq, wk.m0, qn, kBlockN);
                const int end = (int)kt.end, first = (int)kt.first;
                const int hk = (int)(wk.hq / p.h_per_kv);
                const int qb = p.cu_seqlens_q ? 0 : wk.b, kb = p.cu_seqlens_q ? 0 : (int)seq.k_batch;
                const int krow = (int)seq.k_row0;
                fwd90_tiles it = fwd90_tiles_init(first, end, wk.b, wk.hq, wk.m0, qn);
                const int n_tiles = end - first;
                /* key tiles from the last one down (kData: the visible ones) */
                int j = kData ? fwd90_tiles_prev<kBlockN>(it, p, end - 1, lane) : end - 1;
                for (int t = 0; kData ? j >= first : t < n_tiles; t++, g++) {
                    if (!kData)
                        j = end - 1 - t;
                    const int s = g % kStages;
                    const uint32_t dk = sk0 + s * L::kKVBytes, dv = sv0 + s * L::kKVBytes;
                    const int row = krow + j * kBlockN;
                    mbar_wait(kempty + FWD90_BAR_BYTES * s, ((g / kStages) & 1) ^ 1);
                    if (lane == 0) {
                        mbar_arrive_expect_tx(kfull + FWD90_BAR_BYTES * s, L::kKVBytes);
                        for (int pn = 0; pn < kHeadDim / FWD90_PANEL; pn++)
                            tma_load_4d(dk + pn * kBlockN * SW128_ROW_BYTES, &maps.k, kfull + FWD90_BAR_BYTES * s,
                                        pn * FWD90_PANEL, row, hk, kb);
                    }
                    mbar_wait(vempty + FWD90_BAR_BYTES * s, ((g / kStages) & 1) ^ 1);
                    if (!tail_by_tma && (j + 1) * kBlockN > skn) {
                        const T *vg = (const T *)p.v +
                                      flash_key_offset(&p, &seq, p.v_s.batch, p.v_s.row, (int64_t)j * kBlockN) +
                                      (int64_t)hk * p.v_s.head;
                        copy_v_tail<T, kHeadDim, kBlockN>(dv, vg, p.v_s.row, skn - j * kBlockN, (int)p.d, lane);
                        __syncwarp();
                        if (lane == 0)
                            mbar_arrive(vfull + FWD90_BAR_BYTES * s);
                    } else if (lane == 0) {
                        mbar_arrive_expect_tx(vfull + FWD90_BAR_BYTES * s, L::kKVBytes);
                        for (int pn = 0; pn < kHeadDim / FWD90_PANEL; pn++)
                            tma_load_4d(dv + pn * kBlockN * SW128_ROW_BYTES, &maps.v, vfull + FWD90_BAR_BYTES * s,
                                        pn * FWD90_PANEL, row, hk, kb);
                    }
                    if (t == 0) {
                        /* Q after the first K / V tile, into stage qc % kQStages: the consumers release a
                         * stage at their last wgmma on it */
                        const int qs = qc % kQStages;
                        const uint32_t qf = qfull + FWD90_BAR_BYTES * qs, dq = sq + qs * L::kQBytes;
                        mbar_wait(qempty + FWD90_BAR_BYTES * qs, ((qc / kQStages) & 1) ^ 1);
                        if (lane == 0) {
                            mbar_arrive_expect_tx(qf, L::kQBytes);
                            for (int pn = 0; pn < kHeadDim / FWD90_PANEL; pn++)
                                tma_load_4d(dq + pn * FWD90_BM * SW128_ROW_BYTES, &maps.q, qf, pn * FWD90_PANEL,
                                            (int)(seq.q_row0 + wk.m0), wk.hq, qb);
                        }
                        qc++;
                    }
                    if (kData)
                        j = fwd90_tiles_prev<kBlockN>(it, p, j - 1, lane);
                }
            }
        }
        return;
    }

    /* ---- consumers ---- */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(FWD90_CONSUMER_REGS));
    const int c = wg - 1, ctid = tid - c * WARPGROUP_THREADS - WARPGROUP_THREADS;
    const int lane = tid % FLASH_WARP_SIZE, warp = ctid / FLASH_WARP_SIZE;
    const int q_row0 = c * FWD90_WG_ROWS;             /* the consumer's rows in the Q tile */
    const int r_loc = q_row0 + warp * FWD90_WARP_ROWS + lane / FWD90_QUAD; /* the thread's first row in the tile */
    const int lane_c = 2 * (lane % FWD90_QUAD);
    const float scale = p.scale_log2;
    const bool releaser = ctid == 0;
    fwd90_ring ring;
    ring.sq = sq, ring.sk0 = sk0, ring.sv0 = sv0, ring.kfull = kfull, ring.vfull = vfull, ring.kempty = kempty;
    ring.vempty = vempty;
    ring.q_row0 = q_row0, ring.c = c, ring.releaser = releaser;
    int g = 0, qc = 0; /* as the producer's */
    for (int w = blockIdx.x; w < n_work;
         w = dynamic ? fwd90_take<fwd90_slot_c>(slot_c, n_work)
                     : w + (int)gridDim.x) {
        for (int part = 0; part < fwd90_parts(w, m_tiles, paired); part++) {
            const fwd90_work wk =
                dynamic ? fwd90_work_grouped<FWD90_BM>(w, m_tiles, p, fwd90_group(p, kHeadDim, FWD90_ELEM_BYTES))
                        : fwd90_work_of<FWD90_BM>(w, part, m_tiles, (int)p.h, paired);
            const flash_seq seq = flash_seq_of(&p, wk.b);
            if (wk.m0 >= seq.sq)
                continue;
            const int m0 = wk.m0, skn = (int)seq.sk, qn = (int)flash_min64(seq.sq - m0, FWD90_BM);
            const flash_tile_range kt = flash_key_tiles(&seq, m0, qn, kBlockN);
            const int end = (int)kt.end, first = (int)kt.first, n_tiles = end - first;
            fwd90_tile tl;
            tl.r_t = m0 + r_loc;
            tl.lane_c = lane_c;
            tl.sk = skn;
            tl.diag_lo = (int)seq.diag_lo;
            tl.diag_hi = (int)seq.diag_hi;
            tl.hook.cap = tl.hook.inv_cap = tl.hook.slope = tl.hook.to_units = 0.f;
            tl.hook.alibi_offset = 0;
            tl.mask = NULL;
            tl.bh = 0;
            if (kHook) {
                /* natural units -> raw units: 1 / scale */
                tl.hook = flash_score_of(&p, seq.alibi_offset, wk.b, wk.hq, FLASH_LOG2E_F / scale);
                if (kData && p.mask != NULL)
                    tl.mask = (const unsigned char *)p.mask +
                              (p.mask_kind == FLASH_MASK_ADD ? (int64_t)sizeof(T) : 1) *
                                  flash_mask_offset(&p, wk.b, wk.hq, 0, 0);
                tl.bh = (uint32_t)(wk.b * p.h + wk.hq);
            }
            fwd90_tiles it = fwd90_tiles_init(first, end, wk.b, wk.hq, m0, qn);

            fwd90_state<kHeadDim, kBlockN> st;
#pragma unroll
            for (int i = 0; i < kHeadDim / 2; i++)
                st.o[i] = 0.f;
            st.m[0] = st.m[1] = -INFINITY;
            st.l[0] = st.l[1] = 0.f;

            /* the first key tile: the last visible one of the band */
            const int j = kData ? fwd90_tiles_prev<kBlockN>(it, p, end - 1, lane) : end - 1;
            if (j >= first) {
                if (c == 1)
                    turn_pass(c); /* consumer 0 issues first */
                const int qs = qc % kQStages;
                ring.sq = sq + qs * L::kQBytes;
                mbar_wait(qfull + FWD90_BAR_BYTES * qs, (qc / kQStages) & 1);
                /* key tiles of this work tile */
                const int t = consumer_tiles<T, kHeadDim, kBlockN, kStages, kHook, kData, kCap>(st, p, ring, it, kt, g,
                                                                                              j, scale, tl, lane);
                /* the last key tile's O += P V */
                g += kHook ? t : n_tiles; /* equal; n_tiles keeps the dense kernels' measured SASS */
                const int s_last = (g - 1) % kStages;
                turn_wait(c);
                mbar_wait(vfull + FWD90_BAR_BYTES * s_last, ((g - 1) / kStages) & 1);
                gemm_pv<T, kHeadDim, kBlockN>(st.o, st.pa, sv0 + s_last * L::kKVBytes);
                if (c == 0)
                    turn_pass(c); /* consumer 1's last turn is never waited for */
                wgmma_wait<0>();
                fence_regs(st.o);
                if (releaser) {
                    mbar_arrive(vempty + FWD90_BAR_BYTES * s_last);
                    mbar_arrive(qempty + FWD90_BAR_BYTES * qs); /* this consumer's rows of Q read for the last time */
                }
                qc++;
            }

            /* ---- epilogue: O * factor straight from the accumulators to global memory ---- */
            const float sink = p.sink != NULL ? ((const float *)p.sink)[wk.hq] : -INFINITY;
            float *lse = (float *)p.lse + flash_lse_offset(&p, &seq, wk.b, wk.hq) + m0; /* (qn) */
            T *og = (T *)p.o + wk.b * p.o_s.batch + wk.hq * p.o_s.head + (seq.q_row0 + m0) * p.o_s.row; /* (qn, d) */
            const int d = (int)p.d;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float l = st.l[h];
                l += __shfl_xor_sync(FULL_MASK, l, 1);
                l += __shfl_xor_sync(FULL_MASK, l, 2);
                float factor, row_lse;
                flash_row_finish_f(st.m[h] * scale * (float)(1.0 / FLASH_LOG2E), l, sink, &factor, &row_lse);
                if (kData && p.dropout_threshold != 0)
                    factor *= (float)p.dropout_scale;
                const int r = r_loc + FWD90_HALF_ROWS * h;
                /* the quad's words of n8 blocks 4 u .. 4 u + 3 transposed (quad_transpose): lane q stores block
                 * 4 u + q, 16 contiguous bytes, under a predicate (d % 8 == 0: a block is in or out), without
                 * branches (4-byte stores behind a branch each measured 10-20% slower at s512 / s1k) */
                const bool row_in = r < qn;
                if (row_in && lane % FWD90_QUAD == 0)
                    lse[r] = row_lse;
                T *orow = og + (int64_t)r * p.o_s.row;
                const int q = lane % FWD90_QUAD;
#pragma unroll
                for (int u = 0; u < kHeadDim / FWD90_N8 / FWD90_QUAD; u++) {
                    uint32_t w[FWD90_QUAD], f[FWD90_QUAD];
#pragma unroll
                    for (int k = 0; k < FWD90_QUAD; k++) {
                        const int i = FWD90_QUAD * u + k;
                        w[k] = pack2<T>(st.o[4 * i + 2 * h] * factor, st.o[4 * i + 2 * h + 1] * factor);
                    }
                    quad_transpose(w, f, q);
                    const int col = FWD90_N8 * (FWD90_QUAD * u + q);
                    if (row_in && col < d)
                        *(uint4 *)(orow + col) = make_uint4(f[0], f[1], f[2], f[3]);
                }
            }
        }
    }
#endif
}

/* ------------------------------------------------------------------------------------------------ */
/* Host side                                                                                        */

/* The 4-D map of q, k or v (wgmma.cuh tma_map_4d), boxes of one panel x box_rows. */
static int fwd90_make_map(CUtensorMap *map, const flash_params *p, const void *ptr, const flash_strides *s,
                          int64_t rows, int64_t heads, int64_t batches, int box_rows)
{
    static_assert(FWD90_PANEL == SW128_ROW_BYTES / 2 && FWD90_ELEM_BYTES == 2, "tma_map_4d's box and elements");
    return tma_map_4d(map, p->dtype == FLASH_BF16, ptr, p->d, rows, heads, batches, s->row, s->head, s->batch,
                      box_rows);
}

static int fwd90_aligned(const void *ptr, const flash_strides *s)
{
    return (uintptr_t)ptr % 16 == 0 && s->row % CHUNK == 0 && s->head % CHUNK == 0 &&
           s->batch % CHUNK == 0;
}

static int fwd90_head_dim(int64_t d)
{
    return d <= 64 ? 64 : d <= 128 ? 128 : 256;
}

/* Rows of the q and k / v tensors: per batch (dense) or in all (varlen). */
static void fwd90_rows(const flash_params *p, int64_t *q_rows, int64_t *k_rows)
{
    *q_rows = p->cu_seqlens_q ? p->total_q : p->sq;
    *k_rows = p->cu_seqlens_q ? p->total_k : p->sk;
}

extern "C" size_t flash_fwd_sm90_smem(const flash_params *p)
{
    const int hd = fwd90_head_dim(p->d);
    return hd == 64 ? fwd90_smem<64>::kBytes : hd == 128 ? fwd90_smem<128>::kBytes : fwd90_smem<256>::kBytes;
}

extern "C" int flash_fwd_sm90_dynamic(const flash_params *p)
{
    return p->cu_seqlens_q != NULL && !p->has_hook && fwd90_head_dim(p->d) <= FWD90_DYNAMIC_MAX_D;
}

extern "C" int flash_fwd_sm90_ok(const flash_params *p)
{
    int64_t q_rows, k_rows;
    fwd90_rows(p, &q_rows, &k_rows);
    /* hooks with has_hook (a hook field without it is an error that fwd_sm80.cu reports) and a scale its raw
     * units can divide by; the attn_mask (with its block flags) in dense batches only, as fwd_sm80.cu's: key j
     * of a sequence is the mask's column j; attn_mask and dropout up to d128 (fwd90_cfg::MASK_DROPOUT) */
    const bool mask_ok = p->mask == NULL ? p->mask_blocks == NULL
                                         : p->mask_blocks != NULL && p->cu_seqlens_q == NULL && p->k_leftpad == NULL &&
                                               (p->mask_kind == FLASH_MASK_BOOL || p->mask_kind == FLASH_MASK_ADD);
    const int hd = fwd90_head_dim(p->d);
    const bool data_ok = (p->mask == NULL && p->dropout_threshold == 0) ||
                         (hd == 64    ? fwd90_cfg<64>::MASK_DROPOUT
                          : hd == 128 ? fwd90_cfg<128>::MASK_DROPOUT
                                      : fwd90_cfg<256>::MASK_DROPOUT);
    const bool hooks_ok = mask_ok && data_ok && (p->has_hook ? p->scale_log2 >= FWD90_HOOK_MIN_SCALE_LOG2
                                                  : p->softcap == 0.0 && p->alibi_slopes == NULL && p->mask == NULL &&
                                                        p->dropout_threshold == 0);
    return (p->dtype == FLASH_FP16 || p->dtype == FLASH_BF16) && hooks_ok && p->block_table == NULL &&
           p->num_splits <= 1 && p->b >= 1 && p->h >= 1 && p->d >= 1 && p->d <= FLASH_CUDA_MAX_HEAD_DIM &&
           p->d % CHUNK == 0 &&
           p->scale_log2 > 0.f && p->sq >= 1 && p->sk >= 1 && q_rows >= 1 && k_rows >= 1 && q_rows < INT_MAX &&
           k_rows < INT_MAX && (p->sq + FWD90_BM - 1) / FWD90_BM * p->h * p->b < INT_MAX && p->h_per_kv >= 1 &&
           (p->k_batch_idx == NULL || p->k_batches >= 1) && fwd90_aligned(p->q, &p->q_s) &&
           fwd90_aligned(p->k, &p->k_s) &&
           fwd90_aligned(p->v, &p->v_s) && fwd90_aligned(p->o, &p->o_s) && tma_encoder() != NULL;
}

template <typename T, int kHeadDim, int kScore>
static cudaError_t launch_fwd90(const flash_params *p, cudaStream_t stream)
{
    fwd90_maps maps;
    const int varlen = p->cu_seqlens_q != NULL;
    int64_t q_rows, k_rows;
    fwd90_rows(p, &q_rows, &k_rows);
    const int64_t k_batches = varlen ? 1 : p->k_batch_idx ? p->k_batches : p->b; /* k / v's batch dimension */
    if (!fwd90_make_map(&maps.q, p, p->q, &p->q_s, q_rows, p->h, varlen ? 1 : p->b, FWD90_BM) ||
        !fwd90_make_map(&maps.k, p, p->k, &p->k_s, k_rows, p->h_kv, k_batches, fwd90_cfg<kHeadDim>::BN) ||
        !fwd90_make_map(&maps.v, p, p->v, &p->v_s, k_rows, p->h_kv, k_batches, fwd90_cfg<kHeadDim>::BN))
        return cudaErrorInvalidValue;
    void (*kernel)(const flash_params, const fwd90_maps) = flash_fwd_sm90_kernel<T, kHeadDim, kScore, false>;
    bool dynamic = false; /* varlen batches: where the caller passes a counter (flash_fwd_sm90_dynamic) */
    if constexpr (kScore == FLASH_SCORE_DENSE && kHeadDim <= FWD90_DYNAMIC_MAX_D) {
        if (p->tile_counter != NULL) {
            kernel = flash_fwd_sm90_kernel<T, kHeadDim, kScore, true>;
            dynamic = true;
        }
    }
    const size_t smem = fwd90_smem<kHeadDim>::kBytes;
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess)
        return err;
    /* items of unequal cost (an attn_mask makes them data): the dynamic scheduler or one CTA per query tile */
    const bool paired = !dynamic && fwd90_paired(*p) && p->mask == NULL;
    const int64_t n_work = fwd90_items_per_head((int)((p->sq + FWD90_BM - 1) / FWD90_BM), paired) * p->h * p->b;
    int dev = 0, sms = 0;
    if ((err = cudaGetDevice(&dev)) != cudaSuccess ||
        (err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess)
        return err;
    const int64_t grid = (dynamic || fwd90_static(*p)) && n_work > sms ? sms : n_work;
    kernel<<<(unsigned)grid, FWD90_THREADS, smem, stream>>>(*p, maps);
    return cudaGetLastError();
}

template <typename T, int kScore>
static cudaError_t dispatch_head_dim(const flash_params *p, cudaStream_t stream)
{
    const int hd = fwd90_head_dim(p->d);
    return hd == 64    ? launch_fwd90<T, 64, kScore>(p, stream)
           : hd == 128 ? launch_fwd90<T, 128, kScore>(p, stream)
                       : launch_fwd90<T, 256, kScore>(p, stream);
}

template <typename T>
static cudaError_t dispatch_fwd90(const flash_params *p, cudaStream_t stream)
{
    if (!p->has_hook)
        return dispatch_head_dim<T, FLASH_SCORE_DENSE>(p, stream);
    return p->softcap > 0.0 ? dispatch_head_dim<T, FLASH_SCORE_SOFTCAP>(p, stream)
                            : dispatch_head_dim<T, FLASH_SCORE_HOOK>(p, stream);
}

extern "C" cudaError_t flash_fwd_sm90(const flash_params *p, cudaStream_t stream)
{
    if (!flash_fwd_sm90_ok(p))
        return cudaErrorInvalidValue;
    return p->dtype == FLASH_BF16 ? dispatch_fwd90<__nv_bfloat16>(p, stream) : dispatch_fwd90<__half>(p, stream);
}

#endif /* FLASHATTN_EXT_SM90A */
