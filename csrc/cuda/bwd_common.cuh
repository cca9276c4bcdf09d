/* bwd_common.cuh: pieces shared by the backward kernels of bwd_sm80.cu and bwd_sm90.cu: the lse helper, the
 * band constants of a key tile (and the per-CTA copy of its sequence's constants in shared memory), the dQ
 * reduction into the fp32 accumulator, the per-CTA tensor slices, and the dK/dV epilogue. Fragment layouts are those of common.cuh
 * (mma.sync m16n8k16; wgmma uses the same per-warp layouts). Varlen: the epilogue addresses one sequence's keys
 * through its flash_seq (mask.h). */
#ifndef FLASHATTN_EXT_BWD_COMMON_CUH
#define FLASHATTN_EXT_BWD_COMMON_CUH

#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "../constants.h"
#include "../flash.h"
#include "../mask.h"
#include "common.cuh"

/* lse (natural log) -> the log2-domain subtrahend of the exponent; -inf (row sees no key) maps to
 * +inf so that exp2(s - inf) = 0 without ever forming inf - inf. */
__device__ __forceinline__ float lse_to_log2(float lse)
{
    return lse == -INFINITY ? INFINITY : lse * FLASH_LOG2E_F;
}

/* lse_to_log2 of the HOOK kernels whose scores are not in natural units (bwd_sm90.cu: units of mul, hook_cta_init):
 * a finite lse with |lse| >= 2^64 is one the preprocess wrote (flash.h lse_fix: +-HUGE, score.h flash_score_huge,
 * huge_rows.cuh huge_row_fix) for a row whose maximum score is a huge attn_mask entry; its log2-domain form in
 * these units is +-HUGE mul (exact: a power of two times a float), at which P = exp2(fma(s, mul, -lse2)) of a key
 * at s = +-HUGE is exactly 1. No natural lse the forward writes for another row is that large. lse_fix holds a
 * natural-unit value, not HUGE mul, because bwd_sm80.cu's dQ kernel (natural units, lse_to_log2) reads the same
 * buffer where it runs beside this kernel (deterministic mode at d > 128). */
__device__ __forceinline__ float lse_to_log2_hook(float lse, float mul)
{
    return fabsf(lse) >= 0x1p64f && lse != -INFINITY ? lse * mul : lse_to_log2(lse);
}

/* The band [lo, hi] of flash_tile_diag for the query tiles m0 of key tile n0 (dK/dV kernels), in a
 * per-CTA part and a cheap per-tile part: band_tile_hi(band_cta_hi(s, n0), m0) and
 * band_tile_lo(band_cta_lo(s, n0), m0) equal flash_tile_diag(s.diag_hi / s.diag_lo, m0, n0) in every
 * tile that flash_query_tiles yields (there hi >= -(BM - 1) and lo <= BN - 1: the tile meets the union
 * of its keys' visible query ranges), and stay within [-FLASH_DIAG_CLAMP, FLASH_DIAG_CLAMP] without
 * overflowing an int. */
__host__ __device__ __forceinline__ int band_cta_hi(const flash_seq &s, int n0)
{
    return (int)flash_max64(flash_min64(s.diag_hi - n0, FLASH_DIAG_CLAMP), INT_MIN);
}

__host__ __device__ __forceinline__ int band_cta_lo(const flash_seq &s, int n0)
{
    return (int)flash_max64(s.diag_lo - n0, INT_MIN); /* <= sk - n0 */
}

__host__ __device__ __forceinline__ int band_tile_hi(int hb, int m0)
{
    const int cap = FLASH_DIAG_CLAMP - m0;
    return m0 + (hb < cap ? hb : cap);
}

__host__ __device__ __forceinline__ int band_tile_lo(int lb, int m0)
{
    const int v = lb + m0;
    return v > -FLASH_DIAG_CLAMP ? v : -FLASH_DIAG_CLAMP;
}

/* A dK/dV CTA's slices of the tensors (the per-CTA prologue of every backward kernel): key tile n0 of head hq's
 * sequence seq (batch b, kv head hk) and the query rows and row statistics it meets; the kernels copy the fields
 * into locals of the same names. */
template <typename T>
struct bwd_cta_slices {
    const T *kg, *vg;           /* (sk - n0, d): the keys and values from n0 on */
    const T *qg, *dog;          /* (sq, d): the sequence's queries and output gradients */
    const float *lseg, *deltag; /* (sq): its rows' lse and delta */
    float *dqa;                 /* (sq, d): its rows of the fp32 dQ accumulator */
    int kvalid, kn;             /* keys from n0 on; of them, those of the tile (at most BN) */
    flash_tile_range qt;        /* the query tiles of BM rows that see a key of the tile */
};

template <typename T, int BN, int BM>
__device__ __forceinline__ bwd_cta_slices<T> bwd_cta_slices_of(const flash_params &p, const flash_seq &seq, int b,
                                                               int hq, int64_t hk, int n0)
{
    bwd_cta_slices<T> s;
    const int64_t krow = seq.k_row0 + n0, lse0 = flash_lse_offset(&p, &seq, b, hq);
    s.kg = (const T *)p.k + seq.k_batch * p.k_s.batch + hk * p.k_s.head + krow * p.k_s.row;
    s.vg = (const T *)p.v + seq.k_batch * p.v_s.batch + hk * p.v_s.head + krow * p.v_s.row;
    s.qg = (const T *)p.q + b * p.q_s.batch + hq * p.q_s.head + seq.q_row0 * p.q_s.row;
    s.dog = (const T *)p.dout + b * p.do_s.batch + hq * p.do_s.head + seq.q_row0 * p.do_s.row;
    s.lseg = (const float *)p.lse + lse0;
    s.deltag = (const float *)p.delta + lse0;
    s.dqa = p.dq_accum + lse0 * (int)p.d;
    s.kvalid = (int)seq.sk - n0;
    s.kn = s.kvalid < BN ? s.kvalid : BN;
    s.qt = flash_query_tiles(&seq, n0, s.kn, BM);
    return s;
}

/* What a dK/dV kernel's loop over query tiles needs of its sequence in every tile, written to shared
 * memory once by the CTA and read where used (bwd_seq_* at the struct's shared address): held in
 * registers across the loop these values cost the largest dense kernels spills or packed predicates
 * (the flash_params fields they replace were constant-bank operands, rematerialized where needed). */
typedef struct __align__(16) bwd_seq_consts {
    int hb, lb;       /* band_cta_hi / band_cta_lo of the CTA's key tile (one 8-byte load) */
    int sq;           /* the sequence's query rows */
    int kvalid;       /* its keys from the tile's first, sk - n0 */
    int alibi_offset; /* flash_seq.alibi_offset */
} bwd_seq_consts;

__device__ __forceinline__ void bwd_seq_consts_set(bwd_seq_consts *sc, const flash_seq &s, int n0)
{
    sc->hb = band_cta_hi(s, n0);
    sc->lb = band_cta_lo(s, n0);
    sc->sq = (int)s.sq;
    sc->kvalid = (int)s.sk - n0;
    sc->alibi_offset = (int)s.alibi_offset;
}

/* volatile: read again at each use, never held across the loop */
__device__ __forceinline__ int bwd_seq_sq(uint32_t sc)
{
    int v;
    asm volatile("ld.shared.s32 %0, [%1];\n" : "=r"(v) : "r"(sc + (uint32_t)offsetof(bwd_seq_consts, sq)));
    return v;
}

__device__ __forceinline__ void bwd_seq_band(uint32_t sc, int &hb, int &lb)
{
    static_assert(offsetof(bwd_seq_consts, hb) == 0 && offsetof(bwd_seq_consts, lb) == sizeof(int), "one v2 load");
    asm volatile("ld.shared.v2.s32 {%0, %1}, [%2];\n" : "=r"(hb), "=r"(lb) : "r"(sc));
}

__device__ __forceinline__ int bwd_seq_kvalid(uint32_t sc)
{
    int v;
    asm volatile("ld.shared.s32 %0, [%1];\n" : "=r"(v) : "r"(sc + (uint32_t)offsetof(bwd_seq_consts, kvalid)));
    return v;
}

__device__ __forceinline__ int bwd_seq_alibi(uint32_t sc)
{
    int v;
    asm volatile("ld.shared.s32 %0, [%1];\n" : "=r"(v) : "r"(sc + (uint32_t)offsetof(bwd_seq_consts, alibi_offset)));
    return v;
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
    /* one predicated red per lane, no divergent paths: odd lanes row + 8, columns col - 2 .. col + 1 */
    float *dst = base + (row + (odd ? 8 : 0)) * ld + col - (odd ? 2 : 0);
    const float4 v = odd ? make_float4(r0, r1, c[2], c[3]) : make_float4(c[0], c[1], r0, r1);
    if (odd ? row8_ok : row_ok)
        atomicAdd((float4 *)dst, v);
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

/* Write a warp's MT*16 x DW block of a gradient (keys j0 + [0, MT*16) of sequence s, columns
 * c0 + [0, DW)) held as accumulator fragments, times `mul`: in the dtype into out (rows k_row0 + j of
 * batch k_batch of a (b, sk, h_kv, d) tensor) when h == h_kv, else in fp32 into accum (rows
 * flash_kaccum_row, (rows, h, d)) for this query head. Keys past s.sk are not written. */
template <typename T, int MT, int DW, bool ALL_COLS>
__device__ __forceinline__ void store_kv_grad_cols(const flash_params &p, const flash_seq &s,
                                                   const float acc[MT][DW / 8][4], float mul, void *out,
                                                   const flash_strides &os, float *accum, int b, int hq, int j0, int c0)
{
    const int lane = threadIdx.x % FLASH_WARP_SIZE;
    const int lr = lane / 4, lc = lane % 4;
    const int sk = (int)s.sk, d = (int)p.d;
    const int64_t hk = hq / p.h_per_kv;
    const bool gqa = p.h != p.h_kv;
    /* one row pointer per (mt, h8); the DW/8 column blocks are immediate offsets from it */
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h8 = 0; h8 < 2; ++h8) {
            const int j = j0 + mt * 16 + lr + 8 * h8;
            if (j >= sk)
                continue;
            if (gqa) {
                float *dst = accum + (flash_kaccum_row(&p, &s, b, j) * p.h + hq) * d + c0 + 2 * lc; /* (DW) */
#pragma unroll
                for (int t = 0; t < DW / 8; ++t)
                    if (ALL_COLS || c0 + t * 8 < d)
                        *(float2 *)(dst + t * 8) = make_float2(acc[mt][t][2 * h8] * mul, acc[mt][t][2 * h8 + 1] * mul);
            } else {
                T *dst = (T *)out + s.k_batch * os.batch + (s.k_row0 + j) * os.row + hk * os.head + c0 +
                         2 * lc; /* (DW) */
#pragma unroll
                for (int t = 0; t < DW / 8; ++t)
                    if (ALL_COLS || c0 + t * 8 < d)
                        *(uint32_t *)(dst + t * 8) = pack2<T>(acc[mt][t][2 * h8] * mul, acc[mt][t][2 * h8 + 1] * mul);
            }
        }
}

/* ... with the column bounds tested once (a uniform branch) where the block lies inside d, the common case, rather
 * than per 8 columns and row. */
template <typename T, int MT, int DW>
__device__ __forceinline__ void store_kv_grad(const flash_params &p, const flash_seq &s, const float acc[MT][DW / 8][4],
                                              float mul, void *out, const flash_strides &os, float *accum, int b,
                                              int hq, int j0, int c0)
{
    if (c0 + DW <= (int)p.d)
        store_kv_grad_cols<T, MT, DW, true>(p, s, acc, mul, out, os, accum, b, hq, j0, c0);
    else
        store_kv_grad_cols<T, MT, DW, false>(p, s, acc, mul, out, os, accum, b, hq, j0, c0);
}

#endif
