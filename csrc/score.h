/* score.h: the one composition of the score hook of mask.h (softcap, then the position bias, then the
 * attn_mask), its units and its derivative, for the C CPU passes and every CUDA kernel.
 *
 * Units. A kernel holds a score x whose natural-log value is s = x u (u = |scale| for raw q.k, log2(e)
 * for log2 units, 1 for natural units). flash_score_of_* folds the hook's constants into those units
 * (to_units = 1 / u), so that each step below is one or two operations per element and the kernel's
 * softmax applies unchanged:
 *   1. softcap   x = cap tanh(x inv_cap)        (cap = softcap / u; the tanh is the caller's: tanh.approx in
 *                                                the tensor-core kernels, libm or a polynomial elsewhere)
 *                d capped / d x = 1 - th^2, th = the tanh (flash_score_cap_grad)
 *   2. bias      x -= slope |j - i'|             (ALiBi, slope / u; i' = i + alibi_offset; no gradient)
 *                or x += table[bucket(j - i')] / u (T5's relative position bias, FLASH_SCORE_TABLE below: the
 *                bucket of each relative position from the caller's lookup table, clamped at +-rel_range);
 *                its gradient, the sum of dS per bucket, goes to flash_score_grad_table
 *   3. attn_mask additive x += entry / u, bool x = -inf where the entry is 0; its gradient, dS of the
 *                final score (before the softcap factor), goes to flash_score_grad_* (dbias)
 *                Huge entries (CUDA only, issue 33; flash_score_mask_huge): a finite entry with |entry| >=
 *                HUGE_MIN (2^28 float, 2^60 double) makes the score exactly +-HUGE (2^100 float, 2^900 double)
 *                in the kernel's units, x dropped (see "Huge additive entries" below)
 * Step 2 is per element of j - i' = d0 + k: d0 the caller's per-thread / per-row origin, k a per-value
 * offset (a compile-time constant in the tensor-core kernels, frag.cuh).
 *
 * FLASH_SCORE_TABLE: the T5 table of step 2, compiled where it is defined: always in the C / C++ host build,
 * under nvcc only in the files that define it before including this header (the fp32 / fp64 kernels,
 * simple.cu). Every other kernel compiles the ALiBi-only form, so its machine code is
 * as without the table (the CUDA binding refuses rel_bias for fp16 / bf16, launch.cu for any kernel but the
 * simple ones). Under nvcc the bucket read from rel_buckets is clamped to [0, rel_nb): the CUDA binding does
 * not read rel_buckets on the host (that would synchronize), so out-of-range entries stay memory-safe; the
 * CPU binding checks them.
 *
 * The kinds a kernel may compile for (flash_score_kind): DENSE (band geometry only, no hook field read),
 * HOOK (the hook and dropout, a runtime softcap where the kernel has no SOFTCAP kind), SOFTCAP (the hook
 * with softcap).
 *
 * Huge additive entries (CUDA only). Hugging Face pads with rows of a float mask at torch.finfo(dtype).min;
 * in the kernels' units (entry / u, u = |scale| for raw q.k) such an entry overflows to -inf (the row would
 * look fully masked), and even where it does not, a row max m of that size leaves no room for log l in
 * lse = m + log l, nor for the exponent's fma(s, c, -m c) to be exact (its residual is an ulp of m c, up to
 * 2^100). So an entry with HUGE_MIN <= |entry| < inf gives the score exactly sign(entry) HUGE, a power of
 * two in the kernel's units, whatever x: then every exponent fma(HUGE, c, -(HUGE c)) is exactly 0 (a power of
 * two times a float is exact), the huge keys of a row tie exactly, a row whose maximum is -HUGE gets P = 1 / l
 * on its huge keys (torch: uniform over them, q.k being far below the ulp of the entry), and a row with any
 * key below HUGE_MIN gives its huge keys P = 0 (torch: exp(-huge) = 0). +-inf entries and NaN keep the old
 * rule (x + entry / u: -inf masks the key). What this gives up: distinct entries below -HUGE_MIN merge (a row
 * whose visible keys are all at or below -2^28, with two different such values, gets uniform attention over
 * all of them, torch only over those at the largest). The CPU (natural units, to_units = 1: nothing
 * overflows) keeps the plain add and renormalizes in its backward (flash_cpu.c renorm_rows). The backward
 * kernels cannot recover 1 / l from such an lse: fp16 / bf16, rows.cu's preprocess (huge_row_fix) finds the
 * rows whose maximum is a huge entry, scales their dO by 1 / l and gives the main kernels the lse +-HUGE, at
 * which their P of the huge keys is exactly 1 (flash.h dout_fix, lse_fix); fp32 / fp64 (natural units, as the
 * CPU), simple.cu's preprocess scales dO of every row with |lse| >= 1024 by 1 / its P's sum (flash.h).
 * fp64's HUGE_MIN is 2^60: a double row at -1e9 is an ordinary one (exact through that renormalization).
 *
 * The float and double forms are one text: this file includes itself with FLASH_SCORE_T defined. Their
 * types are flash_score_f / flash_score_d; C names the functions with the same suffix (flash_score_bias_f),
 * C++ overloads them (flash_score_bias; flash_score_type<T>::type is the struct of T). In C the expressions are not contracted (no fma, which would be a libm call
 * without FMA hardware); nvcc contracts them into the same FFMA's as an explicit fmaf.
 */
#ifndef FLASH_SCORE_GENERIC
#ifndef FLASHATTN_EXT_SCORE_H
#define FLASHATTN_EXT_SCORE_H

#include "mask.h"

#if !defined(__CUDACC__) && !defined(FLASH_SCORE_TABLE)
#define FLASH_SCORE_TABLE 1
#endif

typedef enum flash_score_kind {
    FLASH_SCORE_DENSE = 0,
    FLASH_SCORE_HOOK = 1,
    FLASH_SCORE_SOFTCAP = 2,
} flash_score_kind;

/* 1 when step 1 runs. */
FLASH_HD int flash_score_capped(const flash_params *p) { return p->softcap > 0; }

/* 1 when step 2 runs (flash_score_bias_* is the identity otherwise). */
#ifdef FLASH_SCORE_TABLE
FLASH_HD int flash_score_biased(const flash_params *p) { return p->alibi_slopes != 0 || p->rel_bias != 0; }

/* 1 when flash_score_grad_* (dbias) or flash_score_grad_table_* (the T5 table) is to be called. */
FLASH_HD int flash_score_has_grad(const flash_params *p) { return p->dbias != 0 || p->rel_bias_grad != 0; }
#else
FLASH_HD int flash_score_biased(const flash_params *p) { return p->alibi_slopes != 0; }

/* 1 when flash_score_grad_* is to be called. */
FLASH_HD int flash_score_has_grad(const flash_params *p) { return p->dbias != 0; }
#endif

#define FLASH_SCORE_GENERIC
#define FLASH_SCORE_T float
#define FLASH_SCORE_S flash_score_f
#define FLASH_SCORE_FABS fabsf
#define FLASH_SCORE_HUGE_MIN 0x1p28f
#define FLASH_SCORE_HUGE 0x1p100f
#ifdef __cplusplus
#define FLASH_SCORE_FN(name) name
#else
#define FLASH_SCORE_FN(name) name##_f
#endif
#include "score.h"
#undef FLASH_SCORE_T
#undef FLASH_SCORE_S
#undef FLASH_SCORE_FN
#undef FLASH_SCORE_FABS
#undef FLASH_SCORE_HUGE_MIN
#undef FLASH_SCORE_HUGE

#define FLASH_SCORE_T double
#define FLASH_SCORE_S flash_score_d
#define FLASH_SCORE_FABS fabs
#define FLASH_SCORE_HUGE_MIN 0x1p60
#define FLASH_SCORE_HUGE 0x1p900
#ifdef __cplusplus
#define FLASH_SCORE_FN(name) name
#else
#define FLASH_SCORE_FN(name) name##_d
#endif
#include "score.h"
#undef FLASH_SCORE_T
#undef FLASH_SCORE_S
#undef FLASH_SCORE_FN
#undef FLASH_SCORE_FABS
#undef FLASH_SCORE_HUGE_MIN
#undef FLASH_SCORE_HUGE
#undef FLASH_SCORE_GENERIC

#ifdef __cplusplus
template <typename T> struct flash_score_type;
template <> struct flash_score_type<float> { typedef flash_score_f type; };
template <> struct flash_score_type<double> { typedef flash_score_d type; };
#endif

#endif
#else /* FLASH_SCORE_GENERIC: the type-generic part */

#define T_ FLASH_SCORE_T

/* The hook's constants of (batch b, query head hq) of a sequence with that flash_seq.alibi_offset, in units
 * of 1 / to_units (see above). */
typedef struct FLASH_SCORE_S {
    T_ cap, inv_cap;      /* step 1 in units; 0, 0 without softcap */
    T_ slope;             /* step 2: the ALiBi slope in units; 0 without ALiBi */
    T_ to_units;          /* step 3: an additive attn_mask entry times this */
    int64_t alibi_offset; /* i' = i + alibi_offset (flash_seq) */
#ifdef FLASH_SCORE_TABLE
    const T_ *table;      /* step 2, T5: the row of (b, hq) in rel_bias (natural units), or 0 */
    const int32_t *bucket; /* rel_buckets at relative position 0 (index -rel_range .. rel_range) */
    int64_t range;        /* rel_range */
    int64_t nb;           /* rel_nb */
#endif
} FLASH_SCORE_S;

/* The constants of the call alone (slope 0, alibi_offset 0): reads no device memory, so a launcher may
 * form them on the host. flash_score_at completes them for one (b, hq) and sequence. */
FLASH_HD FLASH_SCORE_S FLASH_SCORE_FN(flash_score_base)(const flash_params *p, T_ to_units)
{
    FLASH_SCORE_S sc;
    sc.cap = sc.inv_cap = 0;
    if (flash_score_capped(p)) {
        sc.cap = (T_)(p->softcap * to_units);
        sc.inv_cap = 1 / sc.cap;
    }
    sc.slope = 0;
    sc.to_units = to_units;
    sc.alibi_offset = 0;
#ifdef FLASH_SCORE_TABLE
    sc.table = 0;
    sc.bucket = p->rel_buckets ? p->rel_buckets + p->rel_range : 0; /* (no offset on a null pointer) */
    sc.range = p->rel_range;
    sc.nb = p->rel_nb;
#endif
    return sc;
}

FLASH_HD void FLASH_SCORE_FN(flash_score_at)(FLASH_SCORE_S *sc, const flash_params *p, int64_t alibi_offset, int64_t b,
                                             int64_t hq)
{
    sc->slope = (T_)flash_alibi_slope(p, b, hq) * sc->to_units;
    sc->alibi_offset = alibi_offset;
#ifdef FLASH_SCORE_TABLE
    sc->table = p->rel_bias ? (const T_ *)p->rel_bias + hq * p->rel_nb : 0;
#endif
}

FLASH_HD FLASH_SCORE_S
    FLASH_SCORE_FN(flash_score_of)(const flash_params *p, int64_t alibi_offset, int64_t b, int64_t hq, T_ to_units)
{
    FLASH_SCORE_S sc = FLASH_SCORE_FN(flash_score_base)(p, to_units);
    FLASH_SCORE_FN(flash_score_at)(&sc, p, alibi_offset, b, hq);
    return sc;
}

/* Step 1: the argument of the tanh, and the capped score from the tanh th. */
FLASH_HD T_ FLASH_SCORE_FN(flash_score_cap_in)(const FLASH_SCORE_S *sc, T_ x) { return x * sc->inv_cap; }
FLASH_HD T_ FLASH_SCORE_FN(flash_score_cap_out)(const FLASH_SCORE_S *sc, T_ th) { return sc->cap * th; }

/* d capped / d x of step 1 from its tanh th (mask.h flash_softcap_grad_*: 1 - (capped / cap)^2). */
FLASH_HD T_ FLASH_SCORE_FN(flash_score_cap_grad)(T_ th) { return 1 - th * th; }

/* Step 2 on x, the element's j - i' being d0 + k. */
#ifdef FLASH_SCORE_TABLE
/* The T5 bucket of relative position d = j - i'. */
FLASH_HD int64_t FLASH_SCORE_FN(flash_score_bucket)(const FLASH_SCORE_S *sc, int64_t d)
{
    const int64_t b = sc->bucket[d < -sc->range ? -sc->range : d > sc->range ? sc->range : d];
#ifdef __CUDACC__
    return b < 0 ? 0 : b >= sc->nb ? sc->nb - 1 : b;
#else
    return b;
#endif
}
#endif

FLASH_HD T_ FLASH_SCORE_FN(flash_score_bias)(const FLASH_SCORE_S *sc, T_ x, int64_t d0, int k)
{
#ifdef FLASH_SCORE_TABLE
    if (sc->table)
        return x + sc->table[FLASH_SCORE_FN(flash_score_bucket)(sc, d0 + k)] * sc->to_units;
#endif
    return x - sc->slope * FLASH_SCORE_FABS((T_)d0 + (T_)k);
}

/* 1 when an additive entry is huge (see "Huge additive entries" above): HUGE_MIN <= |entry| < inf. */
FLASH_HD int FLASH_SCORE_FN(flash_score_mask_huge)(T_ entry)
{
    const T_ a = FLASH_SCORE_FABS(entry);
    return a >= FLASH_SCORE_HUGE_MIN && a < (T_)INFINITY;
}

/* The score of a huge entry, in any kernel's units: +-HUGE. */
FLASH_HD T_ FLASH_SCORE_FN(flash_score_huge)(T_ entry) { return entry < 0 ? -FLASH_SCORE_HUGE : FLASH_SCORE_HUGE; }

/* Step 3 on x: the additive entry (CUDA: a huge one gives +-HUGE, x dropped), and the bool entry (0: the key
 * is masked). */
FLASH_HD T_ FLASH_SCORE_FN(flash_score_mask_add)(const FLASH_SCORE_S *sc, T_ x, T_ entry)
{
#ifdef __CUDACC__
    if (FLASH_SCORE_FN(flash_score_mask_huge)(entry))
        return FLASH_SCORE_FN(flash_score_huge)(entry);
#endif
    return x + entry * sc->to_units;
}
FLASH_HD T_ FLASH_SCORE_FN(flash_score_mask_bool)(T_ x, unsigned entry) { return entry ? x : (T_)-INFINITY; }

/* Steps 2 and 3 of element (i, j) of (b, hq) on a capped x, for the per-element kernels: the attn_mask
 * entry is read when read_mask (a tile the block flags call partial), through mask_s in the type E of the
 * additive mask (the lse type: T_ here). */
FLASH_HD T_ FLASH_SCORE_FN(flash_score_element)(const flash_params *p, const FLASH_SCORE_S *sc, T_ x,
                                                int read_mask, int64_t b, int64_t hq, int64_t i, int64_t j)
{
    if (flash_score_biased(p))
        x = FLASH_SCORE_FN(flash_score_bias)(sc, x, j - i - sc->alibi_offset, 0);
    if (read_mask) {
        const int64_t off = flash_mask_offset(p, b, hq, i, j);
        if (p->mask_kind == FLASH_MASK_ADD)
            x = FLASH_SCORE_FN(flash_score_mask_add)(sc, x, ((const T_ *)p->mask)[off]);
        else
            x = FLASH_SCORE_FN(flash_score_mask_bool)(x, ((const uint8_t *)p->mask)[off]);
    }
    return x;
}

/* The gradient sink: ds = dS of element (i, j) of (b, hq) (the gradient of the final score, before the
 * softcap factor), into dbias (b, h, sq, sk) of the lse type (dense batches only). */
FLASH_HD void FLASH_SCORE_FN(flash_score_grad)(const flash_params *p, int64_t b, int64_t hq, int64_t i, int64_t j, T_ ds)
{
    ((T_ *)p->dbias)[((b * p->h + hq) * p->sq + i) * p->sk + j] = ds;
}

#ifdef FLASH_SCORE_TABLE
/* The T5 table's sink: ds of element (i, j) of (b, hq) added to its bucket's partial of key tile
 * j / rel_grad_tile in rel_bias_grad (the caller's tasks own disjoint key tiles of each (b, hq)). */
FLASH_HD void FLASH_SCORE_FN(flash_score_grad_table)(const flash_params *p, const FLASH_SCORE_S *sc, int64_t b,
                                                     int64_t hq, int64_t i, int64_t j, T_ ds)
{
    const int64_t tiles = (p->sk + p->rel_grad_tile - 1) / p->rel_grad_tile;
    T_ *part = (T_ *)p->rel_bias_grad + ((b * p->h + hq) * tiles + j / p->rel_grad_tile) * p->rel_nb;
    part[FLASH_SCORE_FN(flash_score_bucket)(sc, j - i - sc->alibi_offset)] += ds;
}
#endif

#undef T_

#endif /* FLASH_SCORE_GENERIC */
