/* attn_ref.h: naive O(sq * sk) double-precision reference of attention with every variant of
 * flash_params (band, softcap, ALiBi, attn_mask, dropout, sinks), forward and backward, for the
 * torch-free harnesses (dev/cpu_check.c; the CUDA harnesses in dev/ (.cu) compile it as C++ host code).
 * Header-only, valid C11 and C++; the semantics are those of csrc/mask.h, whose functions it calls.
 *
 * Layouts, all contiguous double:
 *   q, out, dout, dq  (b, sq, h, d)        k, v, dk, dv  (b, sk, h_kv, d)       lse  (b, h, sq)
 *   mask   NULL or (b, h, sq, sk) additive (-inf where a bool mask is False: the caller converts
 *          and expands broadcast dimensions)
 *   sink   NULL or (h,)                    dsink NULL or (h,)
 *   dbias  NULL or (b, h, sq, sk): the gradient of the additive mask, dS where visible, else 0
 * From p it reads b, h, h_kv, sq, sk, d, scale, band_left, band_right, band_bottom_right, softcap,
 * alibi_slopes, alibi_batch_stride, dropout_threshold, dropout_scale, philox_seed, philox_offset;
 * it ignores every other pointer, stride and dtype field of p. p is a dense batch (cu_seqlens_q and
 * seqused_k NULL): a harness checks one sequence of a varlen batch against this reference run on
 * that sequence alone, as a batch of one (dropout: a batch index of the sequence's own).
 * A row that sees no key: out 0, lse -inf (sink with a sink), zero gradients.
 */
#ifndef FLASHATTN_EXT_DEV_ATTN_REF_H
#define FLASHATTN_EXT_DEV_ATTN_REF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "flash.h"
#include "mask.h"

/* Scores of query row i of (bi, hq) against every key: s[j] the final score (-inf where key j is
 * not visible), capped[j] the softcapped scaled score (what the softcap derivative needs); returns
 * the row's lse (the sink included). norm[0] = m, the row's maximum (the sink's included), norm[1] = l =
 * sum_j exp(s_j - m) + exp(sink - m): the probabilities are exp(s_j - m) / l (ref_prob), not exp(s_j - lse),
 * which a row at finfo.min (Hugging Face's padding: m ~ -3.4e38, log l below an ulp of it, lse = m) would
 * turn into 1 per key instead of 1 / l (issue 33). */
static double ref_row_scores(const flash_params *p, const double *q, const double *k, const double *mask,
                             const double *sink, int64_t bi, int64_t hq, int64_t i, double *s, double *capped,
                             double norm[2])
{
    const int64_t d = p->d, hk = hq / (p->h / p->h_kv);
    const double *qi = q + ((bi * p->sq + i) * p->h + hq) * d;
    const double slope = (double)flash_alibi_slope(p, bi, hq);
    const flash_seq seq = flash_seq_of(p, bi);
    double m = sink ? sink[hq] : -INFINITY;
    for (int64_t j = 0; j < p->sk; j++) {
        s[j] = -INFINITY;
        capped[j] = 0;
        if (!flash_visible(&seq, i, j))
            continue;
        const double *kj = k + ((bi * p->sk + j) * p->h_kv + hk) * d;
        double x = 0;
        for (int64_t c = 0; c < d; c++)
            x += qi[c] * kj[c];
        x *= p->scale;
        if (p->softcap > 0)
            x = flash_softcap_d(x, (double)p->softcap);
        capped[j] = x;
        x -= slope * (double)flash_alibi_distance(&seq, i, j);
        if (mask)
            x += mask[((bi * p->h + hq) * p->sq + i) * p->sk + j];
        s[j] = x;
        if (x > m)
            m = x;
    }
    norm[0] = m;
    norm[1] = 0;
    if (m == -INFINITY)
        return -INFINITY;
    double l = sink ? exp(sink[hq] - m) : 0;
    for (int64_t j = 0; j < p->sk; j++)
        l += exp(s[j] - m);
    norm[1] = l;
    return m + log(l);
}

/* The probability of score x (a key's, or the sink) in a row of ref_row_scores' norm. */
static double ref_prob(double x, const double norm[2])
{
    return exp(x - norm[0]) / norm[1];
}

/* keep * dropout_scale of element (bi, hq, i, j); 1 without dropout. */
static double ref_dropout_factor(const flash_params *p, int64_t bi, int64_t hq, int64_t i, int64_t j)
{
    if (p->dropout_threshold == 0)
        return 1;
    return flash_dropout_keep(p, bi * p->h + hq, i, j) ? p->dropout_scale : 0;
}

static void ref_forward(const flash_params *p, const double *q, const double *k, const double *v,
                        const double *mask, const double *sink, double *out, double *lse)
{
    const int64_t d = p->d, group = p->h / p->h_kv;
    double *s = (double *)malloc((size_t)p->sk * sizeof(double));
    double *capped = (double *)malloc((size_t)p->sk * sizeof(double));
    for (int64_t bi = 0; bi < p->b; bi++)
        for (int64_t hq = 0; hq < p->h; hq++)
            for (int64_t i = 0; i < p->sq; i++) {
                double norm[2];
                const double row_lse = ref_row_scores(p, q, k, mask, sink, bi, hq, i, s, capped, norm);
                double *oi = out + ((bi * p->sq + i) * p->h + hq) * d;
                lse[(bi * p->h + hq) * p->sq + i] = row_lse;
                for (int64_t c = 0; c < d; c++)
                    oi[c] = 0;
                for (int64_t j = 0; j < p->sk; j++) {
                    if (s[j] == -INFINITY)
                        continue;
                    const double pd = ref_prob(s[j], norm) * ref_dropout_factor(p, bi, hq, i, j);
                    const double *vj = v + ((bi * p->sk + j) * p->h_kv + hq / group) * d;
                    for (int64_t c = 0; c < d; c++)
                        oi[c] += pd * vj[c];
                }
            }
    free(s);
    free(capped);
}

/* dsink[h] = -sum over (b, i) of exp(sink - lse) * delta, delta = rowsum(dout * out). */
static void ref_backward(const flash_params *p, const double *q, const double *k, const double *v,
                         const double *mask, const double *sink, const double *dout, double *dq, double *dk,
                         double *dv, double *dbias, double *dsink)
{
    const int64_t d = p->d, group = p->h / p->h_kv;
    double *s = (double *)malloc((size_t)p->sk * sizeof(double));
    double *capped = (double *)malloc((size_t)p->sk * sizeof(double));
    double *dp = (double *)malloc((size_t)p->sk * sizeof(double));
    memset(dq, 0, (size_t)(p->b * p->sq * p->h * d) * sizeof(double));
    memset(dk, 0, (size_t)(p->b * p->sk * p->h_kv * d) * sizeof(double));
    memset(dv, 0, (size_t)(p->b * p->sk * p->h_kv * d) * sizeof(double));
    if (dbias)
        memset(dbias, 0, (size_t)(p->b * p->h * p->sq * p->sk) * sizeof(double));
    if (dsink)
        memset(dsink, 0, (size_t)p->h * sizeof(double));
    for (int64_t bi = 0; bi < p->b; bi++)
        for (int64_t hq = 0; hq < p->h; hq++)
            for (int64_t i = 0; i < p->sq; i++) {
                const int64_t hk = hq / group, qoff = ((bi * p->sq + i) * p->h + hq) * d;
                double norm[2];
                ref_row_scores(p, q, k, mask, sink, bi, hq, i, s, capped, norm);
                double delta = 0;
                for (int64_t j = 0; j < p->sk; j++) {
                    dp[j] = 0;
                    if (s[j] == -INFINITY)
                        continue;
                    const double *vj = v + ((bi * p->sk + j) * p->h_kv + hk) * d;
                    for (int64_t c = 0; c < d; c++)
                        dp[j] += dout[qoff + c] * vj[c];
                    dp[j] *= ref_dropout_factor(p, bi, hq, i, j); /* dP of the dropped P */
                    delta += ref_prob(s[j], norm) * dp[j];
                }
                if (dsink && sink)
                    dsink[hq] -= ref_prob(sink[hq], norm) * delta;
                for (int64_t j = 0; j < p->sk; j++) {
                    if (s[j] == -INFINITY)
                        continue;
                    const double pr = ref_prob(s[j], norm);
                    const double ds = pr * (dp[j] - delta);
                    const double pd = pr * ref_dropout_factor(p, bi, hq, i, j);
                    if (dbias)
                        dbias[((bi * p->h + hq) * p->sq + i) * p->sk + j] = ds;
                    const double dsc = p->softcap > 0 ? ds * flash_softcap_grad_d(capped[j], (double)p->softcap) : ds;
                    const int64_t koff = ((bi * p->sk + j) * p->h_kv + hk) * d;
                    for (int64_t c = 0; c < d; c++) {
                        dq[qoff + c] += p->scale * dsc * k[koff + c];
                        dk[koff + c] += p->scale * dsc * q[qoff + c];
                        dv[koff + c] += pd * dout[qoff + c];
                    }
                }
            }
    free(s);
    free(capped);
    free(dp);
}

#endif
