/* huge_rows.cuh: the fp16 / bf16 backward preprocess's fix of the rows whose maximum score is a huge additive
 * attn_mask entry (score.h "Huge additive entries"; rows.cu). The fp32 / fp64 backward renormalizes such rows, and
 * every other row with a large |lse|, by their mass instead (simple.cu simple_row_mass). */
#ifndef FLASHATTN_EXT_HUGE_ROWS_CUH
#define FLASHATTN_EXT_HUGE_ROWS_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "../flash.h"
#include "../mask.h"
#include "../score.h"

/* An attn_mask entry in the score type S. */
__device__ __forceinline__ float mask_entry(__half x) { return __half2float(x); }
__device__ __forceinline__ float mask_entry(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float mask_entry(float x) { return x; }
__device__ __forceinline__ double mask_entry(double x) { return x; }

/* score.h "Huge additive entries": the fix of query row i of (b, hq) whose forward lse is lse, for the backward
 * of a call with an additive attn_mask of type TM (scores in S: float, or double for fp64). A row whose lse is
 * finite with |lse| >= 2^32 (every other row's maximum score is below HUGE_MIN + |q.k| in magnitude) has its
 * visible keys scanned (the band of s, sk, entries above -inf; dense batches: the attn_mask exists for them
 * only) by its `lanes` lanes (lane lr of them, gm their mask in the warp: the caller's branch to here is uniform
 * over them), counting the keys whose entry is huge and positive (pos), huge and negative (neg), and the other
 * visible keys. Its maximum score is a huge entry's (the main kernel's score of it is exactly +-HUGE, x dropped)
 * when pos > 0 (l = pos, sign +) or when pos = other = 0 < neg (l = neg, sign -): the forward's P of those keys
 * is 1 / l and 0 elsewhere, while the main kernel's P at lse_fix = sign HUGE is exactly 1 on them (and 0
 * elsewhere: a key below HUGE_MIN sits 2^100 units off), so dO / l makes dV = P^T dO', dP' = dO' V^T, delta' =
 * rowsum(dO' o O) and dS = P (dP' - delta') exact. sign HUGE is a natural-unit lse, the same for every kernel
 * that reads lse_fix (in deterministic mode on Hopper at d > 128, bwd_sm90.cu's main kernel and bwd_sm80.cu's
 * dQ kernel both do): bwd_sm80.cu's exponent fma(+-HUGE, log2e, -(+-HUGE log2e)) is exactly 0, and bwd_sm90.cu,
 * whose scores are in units of mul, maps it to +-HUGE mul (bwd_common.cuh lse_to_log2_hook). Returns 1 / l and
 * sets *lse_fix; else returns 1, *lse_fix = lse. A sink only lowers P: with one, a row at -HUGE has lse = the
 * sink's and is left alone; at +HUGE the sink's weight is exp(sink - huge) = 0. */
template <typename TM, typename S>
__device__ __forceinline__ S huge_row_fix(const flash_params &p, const flash_seq &s, int64_t b, int64_t hq, int64_t i,
                                       S lse, int lanes, int lr, unsigned gm, S *lse_fix)
{
    *lse_fix = lse;
    if (!(fabs((double)lse) >= 0x1p32) || !(fabs((double)lse) < (double)INFINITY))
        return (S)1;
    const int64_t lo = i + s.diag_lo < 0 ? 0 : i + s.diag_lo, hi = i + s.diag_hi < s.sk - 1 ? i + s.diag_hi : s.sk - 1;
    const TM *m = (const TM *)p.mask + flash_mask_offset(&p, b, hq, i, 0);
    unsigned pos = 0, neg = 0, other = 0;
    for (int64_t j = lo + lr; j <= hi; j += lanes) {
        const S e = mask_entry(m[j * p.mask_s.col]);
        if (flash_score_mask_huge(e))
            e < 0 ? ++neg : ++pos;
        else if (e != (S)-INFINITY)
            ++other;
    }
    for (int off = lanes / 2; off > 0; off /= 2) {
        pos += __shfl_xor_sync(gm, pos, off);
        neg += __shfl_xor_sync(gm, neg, off);
        other += __shfl_xor_sync(gm, other, off);
    }
    if (pos > 0) {
        *lse_fix = flash_score_huge((S)1);
        return (S)1 / (S)pos;
    }
    if (other == 0 && neg > 0) {
        *lse_fix = flash_score_huge((S)-1);
        return (S)1 / (S)neg;
    }
    return (S)1;
}

#endif
