/* mask.h: the one mask geometry, score hook and probability hook of every kernel (docs/DESIGN.md section 2).
 *
 * Plain C (C11 and CUDA C++), included by csrc/cpu/flash_cpu.c and every CUDA kernel file; the binding
 * fills the fields it reads (csrc/flash.h). Everything here is a small inline function; kernels may
 * fold these formulas into cheaper per-thread forms (one compare per value, log2 units), but derive
 * them from the functions here and from nothing else.
 *
 * Geometry: per sequence (flash_seq_of: one of a varlen batch, or any of a dense one), key j is
 * visible to query i iff diag_lo <= j - i <= diag_hi (both clamped to [-sq, sk]). A key tile outside the band of a query tile is never loaded; a "full" tile is wholly
 * inside the band and inside [0, sk) and needs no per-element test (the attn_mask, if any, is data on
 * top of this: see the block flags below).
 *
 * Score hook, on the scaled score s = scale * q.k (natural-log units), in this order:
 *   softcap > 0      s = softcap * tanh(s / softcap)       derivative 1 - (s_capped / softcap)^2
 *   alibi_slopes     s -= slope * |j - i - alibi_offset|   (no gradient)
 *   mask additive    s += mask[b, h, i, j]                 gradient dS (written to dbias)
 *   mask bool        s = -inf where mask[b, h, i, j] is 0
 * The backward's dS = P * (dP - delta) is the gradient of the final s; the gradient of q.k is
 * dS * softcap_derivative * scale.
 * The kernels and the CPU passes compose it through score.h (its units and derivative there); the
 * scalar forms below are the element-by-element definition (dev/attn_ref.h).
 *
 * Probability hook:
 *   dropout  P_ij is kept iff the 32-bit Philox draw of (seed, offset, b * h + hq, i, j) is
 *            >= dropout_threshold = round(p 2^32), and a kept P is scaled by dropout_scale =
 *            1 / (1 - p) of the user's p (flash_dropout_set). The forward sums the
 *            undropped P into the row sum l and the dropped P into the output; the backward uses
 *            the dropped P for dV and multiplies dP by the same keep/scale before dS = P (dP - delta).
 *   sink     the row's softmax denominator gains exp(sink[hq]): at the forward's end,
 *            (out, lse) = flash_sink_merge(...). The backward kernels need nothing: P = exp(s - lse)
 *            with the merged lse is the true probability; d sink is computed from lse and delta
 *            outside the kernels.
 */
#ifndef FLASHATTN_EXT_MASK_H
#define FLASHATTN_EXT_MASK_H

#include <math.h>
#include <stdint.h>

#include "constants.h"
#include "flash.h"

#ifdef __CUDACC__
#define FLASH_HD static __host__ __device__ __forceinline__
#else
#define FLASH_HD static inline
#endif

/* ---------------------------------------------------------------------------------------------- */
/* Geometry                                                                                        */
/* ---------------------------------------------------------------------------------------------- */

FLASH_HD int64_t flash_min64(int64_t a, int64_t b) { return a < b ? a : b; }
FLASH_HD int64_t flash_max64(int64_t a, int64_t b) { return a > b ? a : b; }
FLASH_HD int64_t flash_cdiv64(int64_t a, int64_t b) { return (a + b - 1) / b; } /* a >= 0, b > 0 */

/* One sequence of the batch as the kernels see it: a dense batch's every sequence has the lengths
 * sq, sk of flash_params and first rows 0; a varlen batch's sequence s has its cu_seqlens slice. */
typedef struct flash_seq {
    int64_t sq, sk;            /* its query and key counts (sk: seqused_k where given) */
    int64_t q_row0, k_row0;    /* its first row in the row dimension of q/o/dout/dq and k/v/dk/dv:
                                * element (b, i, hq, c) of q is at b * q_s.batch + (q_row0 + i) *
                                * q_s.row + hq * q_s.head + c (varlen: q_s.batch = 0) */
    int64_t k_batch;           /* the batch index of its k/v/dk/dv (b; k_batch_idx[b] where given); with
                                * a block_table its table row (b) */
    int64_t lse_row0;          /* see flash_lse_offset */
    int64_t diag_lo, diag_hi;  /* key j visible to query i iff diag_lo <= j - i <= diag_hi, both
                                * clamped to [-sq, sk] (so they fit an int32 on CUDA) */
    int64_t alibi_offset;      /* sk - sq */
} flash_seq;

FLASH_HD int64_t flash_clamp64(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : (x > hi ? hi : x); }

/* Sequence b of the batch. Index contents are clamped (to [0, total], lengths to max_seqlen,
 * seqused_k and k_leftpad to the sequence's keys, k_batch_idx to k's batches; a paged varlen key count
 * to the table's capacity): a bad index tensor gives wrong rows, never an access outside q/k/v. */
FLASH_HD flash_seq flash_seq_of(const flash_params *p, int64_t b)
{
    flash_seq s;
    s.k_batch = b;
    if (p->cu_seqlens_q) {
        const int64_t q0 = flash_clamp64(p->cu_seqlens_q[b], 0, p->total_q);
        s.q_row0 = s.lse_row0 = q0;
        s.sq = flash_min64(flash_clamp64(p->cu_seqlens_q[b + 1], q0, p->total_q) - q0, p->sq);
        if (p->block_table) {
            /* paged: the keys are rows 0 .. sk - 1 of table row b's pages, sk the cu_seqlens_k difference */
            const int64_t count = (int64_t)p->cu_seqlens_k[b + 1] - p->cu_seqlens_k[b];
            s.k_row0 = 0;
            s.sk = flash_min64(flash_clamp64(count, 0, p->block_table_stride * p->page_size), p->sk);
        } else {
            const int64_t k0 = flash_clamp64(p->cu_seqlens_k[b], 0, p->total_k);
            s.k_row0 = k0;
            s.sk = flash_min64(flash_clamp64(p->cu_seqlens_k[b + 1], k0, p->total_k) - k0, p->sk);
        }
        if (p->seqused_k)
            s.sk = flash_clamp64(p->seqused_k[b], 0, s.sk);
    } else {
        s.q_row0 = s.lse_row0 = 0;
        s.sq = p->sq;
        const int64_t k_end = p->seqused_k ? flash_clamp64(p->seqused_k[b], 0, p->sk) : p->sk;
        s.k_row0 = p->k_leftpad ? flash_clamp64(p->k_leftpad[b], 0, k_end) : 0;
        s.sk = k_end - s.k_row0;
        if (p->k_batch_idx)
            s.k_batch = flash_clamp64(p->k_batch_idx[b], 0, p->k_batches - 1);
    }
    const int64_t offset = p->band_bottom_right ? s.sk - s.sq : 0;
    const int64_t lo = p->band_left >= 0 ? offset - p->band_left : -s.sq;
    const int64_t hi = p->band_right >= 0 ? offset + p->band_right : s.sk;
    s.diag_lo = flash_clamp64(lo, -s.sq, s.sk);
    s.diag_hi = flash_clamp64(hi, -s.sq, s.sk);
    s.alibi_offset = s.sk - s.sq;
    return s;
}

/* The grouped walk of the Hopper kernels' grids (fwd_sm90.cu fwd90_work_grouped, bwd_sm90.cu bwd90_grouped):
 * item lin (0, 1, ...) of `pairs` (batch, head) pairs x `tiles` tiles, the pairs taken in groups of `group`
 * (>= 1; the last group may be short), the tile position the outer index inside a group: item lin is tile
 * position *pos of pair *pair. */
FLASH_HD void flash_group_walk(uint32_t lin, uint32_t tiles, uint32_t pairs, uint32_t group, uint32_t *pair,
                               uint32_t *pos)
{
    const uint32_t g = lin / (group * tiles), r = lin - g * group * tiles;
    const uint32_t in_group = pairs - g * group < group ? pairs - g * group : group;
    *pair = g * group + r % in_group;
    *pos = r / in_group;
}

/* Entries per (batch, query head) of flash_params.dq_semaphore: one per FLASH_DQ_SEM_ROWS query rows of sq
 * (varlen: max_seqlen_q). Entry (b, hq, m) is at (b h + hq) flash_dq_sem_tiles(p) + m. */
FLASH_HD int64_t flash_dq_sem_tiles(const flash_params *p) { return flash_cdiv64(p->sq, FLASH_DQ_SEM_ROWS); }

/* Offset of lse / delta element (b, hq, 0) of sequence s (row i: + i; dq_accum: times d). */
FLASH_HD int64_t flash_lse_offset(const flash_params *p, const flash_seq *s, int64_t b, int64_t hq)
{
    return b * p->lse_batch + hq * p->lse_head + s->lse_row0;
}

/* dq_accum in the tile order of bwd_sm90.cu's d > 128 kernel (launch.cu bwd_dq_tiled): tiles of
 * FLASH_DQ_TILE_ROWS query rows x FLASH_CUDA_MAX_HEAD_DIM columns (every head dim 129..256 padded to 256), each
 * 64 x 256 contiguous floats, a sequence's rows padded to whole tiles. Element (r, c) of a tile is at
 * (c / 8) 512 + (r / 16) 128 + (r % 8) 16 + (c % 8 / 2) 4 + (r % 16 / 8) 2 + c % 2: column group c / 8 is the
 * wgmma accumulator fragments of a 64 x 8 block, thread t of a warpgroup owning the float4 at 4 t. Query
 * tile m of (b, hq) is at tiled row flash_dq_tiled_row0 + 64 m (floats: times 256). Dense: (b h + hq)
 * ceil(sq / 64) 64. Varlen: hq R + (q_row0 / 64 + b) 64 with R = (ceil(total_q / 64) + b_count) 64 rows per
 * head (FA3's padding: each sequence's tiles end before the next one's begin, and the size needs no host read
 * of cu_seqlens). */
FLASH_HD int64_t flash_dq_tiled_head_rows(const flash_params *p)
{
    return (flash_cdiv64(p->total_q, FLASH_DQ_TILE_ROWS) + p->b) * FLASH_DQ_TILE_ROWS;
}

FLASH_HD int64_t flash_dq_tiled_row0(const flash_params *p, const flash_seq *s, int64_t b, int64_t hq)
{
    if (p->cu_seqlens_q)
        return hq * flash_dq_tiled_head_rows(p) + (s->q_row0 / FLASH_DQ_TILE_ROWS + b) * FLASH_DQ_TILE_ROWS;
    return (b * p->h + hq) * flash_cdiv64(p->sq, FLASH_DQ_TILE_ROWS) * FLASH_DQ_TILE_ROWS;
}

/* Floats of the tiled dq_accum. */
FLASH_HD int64_t flash_dq_tiled_floats(const flash_params *p)
{
    const int64_t rows = p->cu_seqlens_q ? p->h * flash_dq_tiled_head_rows(p)
                                         : p->b * p->h * flash_cdiv64(p->sq, FLASH_DQ_TILE_ROWS) * FLASH_DQ_TILE_ROWS;
    return rows * FLASH_CUDA_MAX_HEAD_DIM;
}

/* Row of key j of sequence s (batch b) in the GQA workspaces dk_accum / dv_accum, (rows, h, d):
 * dense rows = b * sk + j, varlen k_row0 + j. */
FLASH_HD int64_t flash_kaccum_row(const flash_params *p, const flash_seq *s, int64_t b, int64_t j)
{
    return (p->cu_seqlens_q ? 0 : b * p->sk) + s->k_row0 + j;
}

/* Element offset of key j (0 <= j < s->sk) of sequence s in k or v (dk / dv) with those batch and
 * row strides: row k_row0 + j of batch k_batch, or, with a block_table, of its page (entries
 * clamped to the table and the pages). */
FLASH_HD int64_t flash_key_offset(const flash_params *p, const flash_seq *s, int64_t batch_stride,
                                  int64_t row_stride, int64_t j)
{
    const int64_t r = s->k_row0 + j;
    if (p->block_table) {
        const int64_t slot = flash_min64(r / p->page_size, p->block_table_stride - 1);
        const int64_t page = flash_clamp64(p->block_table[s->k_batch * p->block_table_stride + slot], 0,
                                           p->k_batches - 1);
        return page * batch_stride + (r % p->page_size) * row_stride;
    }
    return s->k_batch * batch_stride + r * row_stride;
}

/* The block_table fields describe a cache the kernels can address, or there is none: one table row per
 * sequence (no k_batch_idx), at least one entry per row and one page, a page size that is a positive multiple
 * of FLASH_PAGE_MULTIPLE. */
FLASH_HD int flash_block_table_ok(const flash_params *p)
{
    return p->block_table == 0 || (p->k_batch_idx == 0 && p->block_table_stride >= 1 && p->k_batches >= 1 &&
                                   p->page_size >= FLASH_PAGE_MULTIPLE && p->page_size % FLASH_PAGE_MULTIPLE == 0);
}

/* Per-element test. */
FLASH_HD int flash_visible(const flash_seq *s, int64_t i, int64_t j)
{
    const int64_t t = j - i;
    return t >= s->diag_lo && t <= s->diag_hi;
}

/* Tiles [first, end) of one axis hold every position visible to the other axis's rows; tiles
 * [full_first, full_end) are visible to every one of them and lie wholly inside the axis (no
 * per-element test). first <= full_first <= full_end <= end; no tile at all: first = end = 0. */
typedef struct flash_tile_range {
    int64_t first, full_first, full_end, end;
} flash_tile_range;

/* lo/hi are the band on the tile axis's position minus the other axis's position; [a0, a0 + an) the
 * other axis's rows (an >= 1), n the length of the tile axis, bn its tile size. */
FLASH_HD flash_tile_range flash_tiles_in_band(int64_t lo, int64_t hi, int64_t n, int64_t a0, int64_t an, int64_t bn)
{
    flash_tile_range r = {0, 0, 0, 0};
    const int64_t begin = flash_max64(0, a0 + lo);             /* union of the rows' visible ranges */
    const int64_t end = flash_min64(n, a0 + an - 1 + hi + 1);
    if (begin >= end)
        return r;
    r.first = begin / bn;
    r.end = flash_cdiv64(end, bn);
    const int64_t fbegin = flash_max64(0, a0 + an - 1 + lo);   /* intersection of those ranges */
    const int64_t fend = flash_min64(n, a0 + hi + 1);
    r.full_first = r.full_end = r.first;
    if (fbegin < fend) {
        r.full_first = flash_cdiv64(fbegin, bn);
        r.full_end = fend / bn;
        if (r.full_end <= r.full_first)
            r.full_first = r.full_end = r.first;
    }
    return r;
}

/* Key tiles of width bn for query rows [q0, q0 + qn), qn >= 1, of sequence s (forward, dQ). */
FLASH_HD flash_tile_range flash_key_tiles(const flash_seq *s, int64_t q0, int64_t qn, int64_t bn)
{
    return flash_tiles_in_band(s->diag_lo, s->diag_hi, s->sk, q0, qn, bn);
}

/* Query tiles of height bm for key rows [k0, k0 + kn), kn >= 1 (dK/dV): i - j in [-hi, -lo]. */
FLASH_HD flash_tile_range flash_query_tiles(const flash_seq *s, int64_t k0, int64_t kn, int64_t bm)
{
    return flash_tiles_in_band(-s->diag_hi, -s->diag_lo, s->sq, k0, kn, bm);
}

/* Tile-local form of the band: inside a tile whose first query row is m0 and first key n0, element
 * (il, jl) is visible iff flash_tile_diag(diag_lo, m0, n0) <= jl - il <= flash_tile_diag(diag_hi, m0, n0).
 * Clamped to +-FLASH_DIAG_CLAMP (beyond any tile edge) so it fits an int. */
#define FLASH_DIAG_CLAMP (1 << 20)
FLASH_HD int flash_tile_diag(int64_t bound, int64_t m0, int64_t n0)
{
    const int64_t v = bound - (n0 - m0);
    return (int)(v < -FLASH_DIAG_CLAMP ? -FLASH_DIAG_CLAMP : (v > FLASH_DIAG_CLAMP ? FLASH_DIAG_CLAMP : v));
}

/* The per-element test in that form: element t = jl - il of a tile with lo = flash_tile_diag(diag_lo, m0, n0)
 * and band = flash_tile_diag(diag_hi, m0, n0) - lo: lo <= t <= lo + band as one unsigned compare. */
FLASH_HD int flash_tile_band_in(int t, int lo, int band) { return (unsigned)(t - lo) <= (unsigned)band; }

/* ---------------------------------------------------------------------------------------------- */
/* attn_mask data: per-block flags                                                                */
/* ---------------------------------------------------------------------------------------------- */

#define FLASH_MASK_ANY_VISIBLE 1u /* some entry of the block is True / above -inf */
#define FLASH_MASK_ANY_MASKED 2u  /* some entry of the block is False / not 0 */

/* Sizes of the block flags the binding computes (flash.h mask_blocks), over the mask's own dimensions (a
 * broadcast one, stride 0 in mask_s, counts once): dims = (b or 1, h or 1, ceil(sq / FLASH_MASK_BLOCK) or 1,
 * ceil(sk / FLASH_MASK_BLOCK) or 1), stored contiguous; the kernels read them through mask_blocks_s. */
FLASH_HD void flash_mask_flag_dims(const flash_params *p, int64_t dims[4])
{
    dims[0] = p->mask_s.batch ? p->b : 1;
    dims[1] = p->mask_s.head ? p->h : 1;
    dims[2] = p->mask_s.row ? flash_cdiv64(p->sq, FLASH_MASK_BLOCK) : 1;
    dims[3] = p->mask_s.col ? flash_cdiv64(p->sk, FLASH_MASK_BLOCK) : 1;
}

/* OR of the flags of the mask blocks covering rows [q0, q0 + qn) x keys [k0, k0 + kn) of (b, hq).
 * No FLASH_MASK_ANY_VISIBLE: the tile sees nothing (skip it); no FLASH_MASK_ANY_MASKED: the mask is
 * plain there (do not read it); both: read it. Without a mask: FLASH_MASK_ANY_VISIBLE. */
FLASH_HD unsigned flash_mask_tile_flags(const flash_params *p, int64_t b, int64_t hq, int64_t q0, int64_t qn,
                                        int64_t k0, int64_t kn)
{
    if (p->mask_blocks == 0)
        return FLASH_MASK_ANY_VISIBLE;
    const uint8_t *f = p->mask_blocks + b * p->mask_blocks_s.batch + hq * p->mask_blocks_s.head;
    unsigned flags = 0;
    for (int64_t r = q0 / FLASH_MASK_BLOCK; r <= (q0 + qn - 1) / FLASH_MASK_BLOCK; r++)
        for (int64_t c = k0 / FLASH_MASK_BLOCK; c <= (k0 + kn - 1) / FLASH_MASK_BLOCK; c++)
            flags |= f[r * p->mask_blocks_s.row + c * p->mask_blocks_s.col];
    return flags;
}

/* Element offset of mask[b, hq, i, j]. */
FLASH_HD int64_t flash_mask_offset(const flash_params *p, int64_t b, int64_t hq, int64_t i, int64_t j)
{
    return b * p->mask_s.batch + hq * p->mask_s.head + i * p->mask_s.row + j * p->mask_s.col;
}

/* ---------------------------------------------------------------------------------------------- */
/* Score hook                                                                                      */
/* ---------------------------------------------------------------------------------------------- */

FLASH_HD float flash_softcap_f(float s, float cap) { return cap * tanhf(s / cap); }
FLASH_HD double flash_softcap_d(double s, double cap) { return cap * tanh(s / cap); }
/* d s_capped / d s, from the capped value c */
FLASH_HD float flash_softcap_grad_f(float c, float cap) { const float t = c / cap; return 1.0f - t * t; }
FLASH_HD double flash_softcap_grad_d(double c, double cap) { const double t = c / cap; return 1.0 - t * t; }

/* ALiBi slope of (b, hq); 0 without ALiBi. */
FLASH_HD float flash_alibi_slope(const flash_params *p, int64_t b, int64_t hq)
{
    return p->alibi_slopes ? p->alibi_slopes[b * p->alibi_batch_stride + hq] : 0.0f;
}

/* The distance ALiBi multiplies by the slope (the bias is -slope * distance). */
FLASH_HD int64_t flash_alibi_distance(const flash_seq *s, int64_t i, int64_t j)
{
    const int64_t t = j - i - s->alibi_offset;
    return t < 0 ? -t : t;
}

/* ---------------------------------------------------------------------------------------------- */
/* Probability hook: dropout by Philox4x32-10, sinks                                              */
/* ---------------------------------------------------------------------------------------------- */

#define FLASH_PHILOX_M0 0xD2511F53u
#define FLASH_PHILOX_M1 0xCD9E8D57u
#define FLASH_PHILOX_W0 0x9E3779B9u
#define FLASH_PHILOX_W1 0xBB67AE85u
#define FLASH_PHILOX_ROUNDS 10
/* One Philox call gives 4 x 32 bits = the 32-bit draws of keys 4c .. 4c + 3 of one row (key 4c + k: word k). */
#define FLASH_DROPOUT_KEYS_PER_CALL 4
#define FLASH_DROPOUT_ONE 4294967296.0 /* 2^32: the draws are uniform on [0, FLASH_DROPOUT_ONE) */

/* The dropout fields of p for the probability prob in [0, 1] (the bindings check the range):
 * dropout_threshold = round(prob 2^32) (half away from zero; exact, prob 2^32 is exact in double), at least
 * 1 when prob > 0 (0 means no dropout), at most 2^32 (prob >= 1 - 2^-33, prob = 1 included: nothing kept);
 * dropout_scale = 1 / (1 - prob) in double, 0 when nothing is kept (so that a sum of kept values, none,
 * times the scale is 0, never 0 * inf). The keep probability is 1 - prob to within 2^-33. */
FLASH_HD void flash_dropout_set(flash_params *p, double prob)
{
    if (!(prob > 0.0)) {
        p->dropout_threshold = 0;
        p->dropout_scale = 1.0;
        return;
    }
    const double t = round(prob * FLASH_DROPOUT_ONE);
    p->dropout_threshold = t < 1.0 ? 1u : t >= FLASH_DROPOUT_ONE ? (uint64_t)1 << 32 : (uint64_t)t;
    p->dropout_scale = p->dropout_threshold == (uint64_t)1 << 32 ? 0.0 : 1.0 / (1.0 - prob);
}

/* The kernels' form of the rule: a 32-bit draw is kept iff draw > flash_dropout_cut(p) (= threshold - 1,
 * which fits 32 bits), i.e. iff draw >= dropout_threshold. Only meaningful with dropout on. */
FLASH_HD uint32_t flash_dropout_cut(const flash_params *p) { return (uint32_t)(p->dropout_threshold - 1); }

FLASH_HD uint32_t flash_mulhi32(uint32_t a, uint32_t b) { return (uint32_t)(((uint64_t)a * b) >> 32); }

/* Philox4x32-10 of the counter (c0, c1, c2, c3) under the key (k0, k1). */
FLASH_HD void flash_philox(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1,
                           uint32_t out[4])
{
    for (int r = 0; r < FLASH_PHILOX_ROUNDS; r++) {
        const uint32_t hi0 = flash_mulhi32(FLASH_PHILOX_M0, c0), lo0 = FLASH_PHILOX_M0 * c0;
        const uint32_t hi1 = flash_mulhi32(FLASH_PHILOX_M1, c2), lo1 = FLASH_PHILOX_M1 * c2;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += FLASH_PHILOX_W0;
        k1 += FLASH_PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* The 32-bit draws of keys [4 c, 4 c + 4) of query row i of (batch, query head) bh = b * h + hq: counter
 * (c, i, bh, offset_lo), key (seed_lo, seed_hi ^ offset_hi); key 4 c + k's draw is bits[k]. */
FLASH_HD void flash_dropout_bits(const flash_params *p, int64_t bh, int64_t i, int64_t c, uint32_t bits[4])
{
    flash_philox((uint32_t)c, (uint32_t)i, (uint32_t)bh, (uint32_t)p->philox_offset, (uint32_t)p->philox_seed,
                 (uint32_t)(p->philox_seed >> 32) ^ (uint32_t)(p->philox_offset >> 32), bits);
}

/* 1 iff P[b, hq, i, j] is kept (always 1 without dropout). One Philox call per element: for
 * reference-grade kernels; fast kernels call flash_dropout_bits once per 4 keys. */
FLASH_HD int flash_dropout_keep(const flash_params *p, int64_t bh, int64_t i, int64_t j)
{
    if (p->dropout_threshold == 0)
        return 1;
    uint32_t bits[4];
    flash_dropout_bits(p, bh, i, j / FLASH_DROPOUT_KEYS_PER_CALL, bits);
    return bits[j % FLASH_DROPOUT_KEYS_PER_CALL] >= p->dropout_threshold;
}

/* Sink of query head hq in the lse type, as double; -inf without sinks. */
FLASH_HD double flash_sink(const flash_params *p, int64_t hq)
{
    if (p->sink == 0)
        return -INFINITY;
    return p->dtype == FLASH_FP64 ? ((const double *)p->sink)[hq] : (double)((const float *)p->sink)[hq];
}

/* Forward epilogue of one row with running max m and sum l (natural-log units; l = 0 and m = -inf
 * when the row saw no key): the factor that turns the unnormalized accumulator into out, and lse.
 * sink = -inf (no sink) gives factor 1 / l and lse = m + log l; a row that saw no key gives factor 0
 * and lse = sink. */
FLASH_HD void flash_row_finish_f(float m, float l, float sink, float *factor, float *lse)
{
    if (l == 0.0f) {
        *factor = 0.0f;
        *lse = sink;
        return;
    }
    if (sink == -INFINITY) {
        *factor = 1.0f / l;
        *lse = m + logf(l);
        return;
    }
    const float mm = m > sink ? m : sink;
    const float a = expf(m - mm);
    const float total = l * a + expf(sink - mm);
    *factor = a / total;
    *lse = mm + logf(total);
}

FLASH_HD void flash_row_finish_d(double m, double l, double sink, double *factor, double *lse)
{
    if (l == 0.0) {
        *factor = 0.0;
        *lse = sink;
        return;
    }
    if (sink == -INFINITY) {
        *factor = 1.0 / l;
        *lse = m + log(l);
        return;
    }
    const double mm = m > sink ? m : sink;
    const double a = exp(m - mm);
    const double total = l * a + exp(sink - mm);
    *factor = a / total;
    *lse = mm + log(total);
}

/* The strides of flash.h's dout_fix (the CUDA backward with an additive attn_mask): (b, sq, h, d) contiguous. In d,
 * not d_v: the CUDA kernels take d_v == d (flash.h) and read and write dout's rows by d columns, and a caller that
 * leaves d_v unset (the harnesses, before dev/common.h fill_sizes set it) would otherwise get strides of 0. */
FLASH_HD flash_strides flash_dout_fix_strides(const flash_params *p)
{
    flash_strides s;
    s.head = p->d;
    s.row = p->h * p->d;
    s.batch = p->sq * s.row;
    return s;
}

#endif
