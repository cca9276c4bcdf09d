/* bwd_harness.cu: torch-free test and benchmark of the CUDA backward (flash_bwd_cuda of launch.cu:
 * bwd_sm80.cu, bwd_sm90.cu, simple.cu, rows.cu), every variant of csrc/mask.h included.
 *
 * Build (here or on the device; `dev/device.sh harness` builds it and runs everything below on the device):
 *   F="-std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -DFLASHATTN_EXT_SM90A -Icsrc -Icsrc/cuda"
 *   nvcc $F dev/bwd_harness.cu csrc/cuda/launch.cu csrc/cuda/bwd_sm80.cu csrc/cuda/bwd_sm90.cu \
 *        csrc/cuda/simple.cu csrc/cuda/rows.cu csrc/cuda/fwd_sm80.cu csrc/cuda/fwd_sm90.cu csrc/cuda/fwd_decode.cu \
 *        -o dev/bin/bwd_harness
 *   (launch.cu also dispatches the forward, hence the four forward files; rows.cu: the row-wise passes.) On a Hopper GPU the main
 *   kernel is bwd_sm90.cu's (every head dim); FLASHATTN_EXT_DISABLE_SM90=1 selects bwd_sm80.cu's,
 *   FLASHATTN_EXT_SMEM_LIMIT=$((163 * 1024)) its A100 tiles.
 * Run:
 *   bwd_harness test [DTYPE [FILTER]]  all correctness configs, or those of one dtype (bf16, fp16,
 *                              fp32, fp64, or "all"), optionally only those whose line contains FILTER
 *                              (e.g. "dropout", "mask=", "window"); one line each, a summary at the end
 *   bwd_harness small   a few small configs, variants included (for compute-sanitizer)
 *   bwd_harness time    bf16 TFLOP/s, 16k tokens, nheads = 2048/d (CUDA events, median of 10)
 *   bwd_harness time1 D SEQLEN CAUSAL DET    one timing config (e.g. under ncu)
 *   bwd_harness timedet d64 / d128 / d256, s2048 / s8192, causal and not: the default and deterministic mode one
 *                       after the other (their ratio)
 *   bwd_harness timev   bf16 d128 TFLOP/s of each variant (also softcap / dropout at d64, softcap / ALiBi at
 *                              d256), counted on the visible (i, j) pairs
 *   bwd_harness timevl  bf16 d64 / d128 TFLOP/s of time's shapes dense, as one varlen batch of equal
 *                              lengths (the varlen path's own cost) and of lengths drawn from [1, 2 seqlen]
 *
 * Correctness: random N(0,1) q, k, v, dout rounded to the dtype; dev/attn_ref.h (double) computes
 * the forward (o, lse, with every variant) and then the backward from those rounded inputs; o and lse
 * are handed to the kernels in the device types. Outputs and workspaces are poisoned with NaN (0xff
 * bytes) first (dbias is zero-filled, as the binding does); every logical element must be finite, the
 * padding of strided outputs must still hold the poison, rows that see no key must have dq exactly 0
 * and keys that no query sees dk = dv = 0 exactly, and the relative L2 errors of dq, dk, dv (and
 * dbias) must be below bf16 1e-2, fp16 2e-3, fp32 1e-5, fp64 1e-12. Deterministic configs must give
 * bitwise identical dq, dk, dv (and dbias) over 5 runs.
 * Variants per config: window (flash-attn's window_size, bottom-right aligned like causal), softcap,
 * ALiBi slopes per head or per (batch, head), attn_mask bool or additive (random entries with an
 * all-masked row and key, key padding, or 128 x 128 block-sparse; stored with stride 0 on its
 * broadcast dimensions and, in strided configs, a padded row stride; block flags computed here as the
 * binding does), dropout (Philox seed and offset with high bits set), sinks (lse includes them),
 * dbias (the additive mask's gradient).
 * Varlen configs (the "varlen" lines; FILTER "varlen" selects them): b sequences packed along the rows
 * (cu_seqlens, sometimes seqused_k, copied to the device), one flash_bwd_cuda call over the batch; each
 * sequence's dq, dk, dv checked against dev/attn_ref.h run on that sequence alone (a dense batch of one:
 * its queries, its first seqused_k keys); lengths 0 and 1 in every batch of 6 or more, sq != sk, GQA,
 * max_seqlen above the longest sequence, rows of no sequence after the last one or none (the last
 * sequence ending at the tensors' end), each band and hook but the attn_mask, dbias and dropout. Rows
 * of no sequence and keys past seqused_k hold NaN in every input and must keep the poison in dq, dk, dv.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "attn_ref.h"
#include "common.h"
#include "cuda/launch.h"

#define DET_RUNS 5
#define TIME_WARMUP 2
#define TIME_REPS 10
#define TIME_TOKENS 16384
#define TIME_HIDDEN 2048
#define BWD_FLOPS_PER_PAIR (2.5 * 4.0) /* times d: the five matmuls of the backward per (i, j) */
#define ROW_PAD 8                      /* extra elements per row of strided (b, h, s, d + 8) tensors */
#define MASK_ROW_PAD 3                 /* extra elements per row of a strided attn_mask */
#define SPARSE_BLOCK 128               /* block edge of the block-sparse mask pattern */

enum { CAUSAL_NONE = 0, CAUSAL_TOP_LEFT = 1, CAUSAL_BOTTOM_RIGHT = 2 };
enum { ALIBI_NONE = 0, ALIBI_HEAD = 1, ALIBI_BATCH = 2 };
enum { MASK_NONE = 0, MASK_BOOL = 1, MASK_ADD = 2 };
/* attn_mask patterns; PAT_BLOCKS / PAT_SPARSE: 128 x 128 blocks, 40% empty, 40% plain, 20% random
 * entries / 90% empty, 10% plain */
/* PAT_FINFO (additive only): Hugging Face's padding, random entries with the padded keys and the first fifth of
 * the rows at the dtype's finfo.min (score.h "Huge additive entries", issue 33) */
enum { PAT_RANDOM = 0, PAT_PADDING = 1, PAT_BLOCKS = 2, PAT_SPARSE = 3, PAT_FINFO = 4 };
/* broadcast (stride 0) dimensions of the attn_mask */
enum { BC_B = 1, BC_H = 2, BC_Q = 4, BC_K = 8 };
/* layouts of the (b, s, h, d) tensors */
enum { LAYOUT_BSHD = 0, LAYOUT_STRIDED = 1, LAYOUT_ODD_UNIT = 2 };

/* ---- random numbers (one generator per config, so configs can be prepared in parallel) -------- */

typedef struct rng {
    uint64_t state;
} rng;

static double rng_uniform(rng *r) /* (0, 1) */
{
    r->state ^= r->state << 13;
    r->state ^= r->state >> 7;
    r->state ^= r->state << 17;
    return ((r->state >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static double rng_normal(rng *r)
{
    return sqrt(-2.0 * log(rng_uniform(r))) * cos(6.283185307179586 * rng_uniform(r));
}

static uint64_t rng_u64(rng *r)
{
    const uint64_t hi = (uint64_t)(rng_uniform(r) * 4294967296.0), lo = (uint64_t)(rng_uniform(r) * 4294967296.0);
    return hi << 32 | lo;
}

/* ---- test configuration --------------------------------------------------------------------- */

typedef struct test_cfg {
    flash_dtype dtype;
    int b, h, h_kv, sq, sk, d;
    int causal;                /* CAUSAL_* */
    int win_left, win_right;   /* flash-attn window_size, -1 = unbounded */
    int layout;                /* LAYOUT_* */
    int det;                   /* deterministic mode, checked over DET_RUNS runs */
    double scale;              /* 0: 1 / sqrt(d) */
    float softcap;             /* 0: off */
    int alibi;                 /* ALIBI_* */
    int mask, mask_pat, mask_bc; /* MASK_*, PAT_*, BC_* bits */
    double dropout;            /* dropout probability, 0: off */
    int sink;                  /* per-head sink logits */
    int dbias;                 /* the additive mask's gradient (needs MASK_ADD) */
    /* varlen batch (cu_seqlens): b sequences of lengths drawn from [0, sq] and [0, sk] (make_lens) */
    int varlen;
    int seqused;               /* seqused_k given */
    int vl_tail;               /* rows of q and k after the last sequence (of no sequence) */
    int vl_maxpad;             /* max_seqlen_q / _k exceed the longest sequence by this */
    uint32_t lens_seed;
} test_cfg;

static test_cfg make_cfg(flash_dtype t, int b, int h, int h_kv, int sq, int sk, int d, int causal)
{
    test_cfg c;
    memset(&c, 0, sizeof(c));
    c.dtype = t;
    c.b = b; c.h = h; c.h_kv = h_kv; c.sq = sq; c.sk = sk; c.d = d;
    c.causal = causal;
    c.win_left = c.win_right = -1;
    return c;
}

static test_cfg with_layout(test_cfg c, int layout) { c.layout = layout; return c; }
static test_cfg with_det(test_cfg c) { c.det = 1; return c; }
static test_cfg with_window(test_cfg c, int left, int right) { c.win_left = left; c.win_right = right; return c; }
static test_cfg with_softcap(test_cfg c, float cap) { c.softcap = cap; return c; }
static test_cfg with_alibi(test_cfg c, int kind) { c.alibi = kind; return c; }
static test_cfg with_mask(test_cfg c, int kind, int pat, int bc) { c.mask = kind; c.mask_pat = pat; c.mask_bc = bc; return c; }
static test_cfg with_dropout(test_cfg c, double p) { c.dropout = p; return c; }
static test_cfg with_sink(test_cfg c) { c.sink = 1; return c; }
static test_cfg with_dbias(test_cfg c) { c.dbias = 1; return c; }
static test_cfg with_scale(test_cfg c, double s) { c.scale = s; return c; }

/* A varlen batch: b sequences, lengths up to sq / sk (lengths 0 and 1 among them), tail rows of no
 * sequence, max_seqlen padding, lengths from lens_seed; bottom-right aligned like the op (flash-attn). */
static test_cfg make_varlen(flash_dtype t, int b, int h, int h_kv, int cap_q, int cap_k, int d, int causal, int seqused,
                            int tail, int maxpad, uint32_t lens_seed)
{
    test_cfg c = make_cfg(t, b, h, h_kv, cap_q, cap_k, d, causal);
    c.varlen = 1;
    c.seqused = seqused;
    c.vl_tail = tail;
    c.vl_maxpad = maxpad;
    c.lens_seed = lens_seed;
    return c;
}

/* ---- varlen lengths ------------------------------------------------------------------------------ */

/* Sequence positions (s + lens_seed) % b: VL_FORCED gets the caps (sk one less if they are equal);
 * 0..VL_FORCED-1 get sq 0, sk 0, sq 1, sk 1 when b >= VL_FORCED + 2; the other lengths are drawn: 15%
 * 0..1, 35% 2..64, 35% up to half the cap, 15% up to the cap, sk += 1 where it would equal sq.
 * seqused_k: 30% all keys, 15% none, else a random count. */
#define VL_FORCED 4

typedef struct varlen_lens {
    std::vector<int> sq, sk, used;  /* per sequence: queries, keys of its slice, keys used (seqused_k) */
    std::vector<int32_t> cu_q, cu_k; /* (b + 1) */
    int max_q, max_k;               /* max_seqlen_q / _k handed to the kernels */
    int total_q, total_k;           /* rows of q / k: the sequences and vl_tail more */
} varlen_lens;

static int draw_len(rng *r, int cap)
{
    const double u = rng_uniform(r);
    const int lo = u < 0.15 ? 0 : (u < 0.5 ? 2 : (u < 0.85 ? 65 : cap / 2 + 1));
    const int hi = u < 0.15 ? 1 : (u < 0.5 ? 64 : (u < 0.85 ? cap / 2 : cap));
    const int a = std::min(lo, cap), e = std::min(std::max(hi, a), cap);
    return a + (int)(rng_uniform(r) * (e - a + 1)) % (e - a + 1);
}

static varlen_lens make_lens(const test_cfg &c)
{
    varlen_lens l;
    rng r = {(uint64_t)c.lens_seed * 0x2545F4914F6CDD1Dull + 11};
    l.sq.resize(c.b);
    l.sk.resize(c.b);
    l.used.resize(c.b);
    for (int s = 0; s < c.b; ++s) {
        int q = draw_len(&r, c.sq), k = draw_len(&r, c.sk);
        const int pos = (s + (int)c.lens_seed) % c.b, forced = c.b >= VL_FORCED + 2 ? pos : -1;
        if (pos == VL_FORCED % c.b) {
            q = c.sq;
            k = c.sk;
        }
        if (k == q)
            k += k < c.sk ? 1 : -1;
        if (forced == 0)
            q = 0;
        else if (forced == 1)
            k = 0;
        else if (forced == 2)
            q = 1;
        else if (forced == 3)
            k = 1;
        l.sq[s] = q;
        l.sk[s] = k;
        const double u = rng_uniform(&r);
        l.used[s] = !c.seqused || u < 0.3 ? k : (u < 0.45 ? 0 : (int)(rng_uniform(&r) * (k + 1)) % (k + 1));
    }
    l.cu_q.assign(c.b + 1, 0);
    l.cu_k.assign(c.b + 1, 0);
    for (int s = 0; s < c.b; ++s) {
        l.cu_q[s + 1] = l.cu_q[s] + l.sq[s];
        l.cu_k[s + 1] = l.cu_k[s] + l.sk[s];
    }
    l.max_q = *std::max_element(l.sq.begin(), l.sq.end()) + c.vl_maxpad;
    l.max_k = *std::max_element(l.sk.begin(), l.sk.end()) + c.vl_maxpad;
    l.total_q = l.cu_q[c.b] + c.vl_tail;
    l.total_k = l.cu_k[c.b] + c.vl_tail;
    return l;
}

static std::string cfg_name(const test_cfg &c)
{
    static const char *causal_names[] = {"none", "top-left", "bottom-right"};
    static const char *alibi_names[] = {"", " alibi=head", " alibi=batch"};
    static const char *mask_names[] = {"", "bool", "add"};
    static const char *pat_names[] = {"random", "padding", "blocks", "sparse", "finfo"};
    char buf[512];
    int n = snprintf(buf, sizeof(buf), "%-4s d=%3d b=%d h=%d/%d sq=%4d sk=%4d causal=%-12s", dtype_name(c.dtype), c.d,
                     c.b, c.h, c.h_kv, c.sq, c.sk, causal_names[c.causal]);
    if (c.win_left >= 0 || c.win_right >= 0)
        n += snprintf(buf + n, sizeof(buf) - n, " window=(%d,%d)", c.win_left, c.win_right);
    if (c.layout == LAYOUT_STRIDED)
        n += snprintf(buf + n, sizeof(buf) - n, " strided");
    if (c.layout == LAYOUT_ODD_UNIT)
        n += snprintf(buf + n, sizeof(buf) - n, " unit-strides-on-size-1");
    if (c.scale != 0)
        n += snprintf(buf + n, sizeof(buf) - n, " scale=%g", c.scale);
    if (c.softcap > 0)
        n += snprintf(buf + n, sizeof(buf) - n, " softcap=%g", c.softcap);
    n += snprintf(buf + n, sizeof(buf) - n, "%s", alibi_names[c.alibi]);
    if (c.mask)
        n += snprintf(buf + n, sizeof(buf) - n, " mask=%s/%s/bc%s%s%s%s", mask_names[c.mask], pat_names[c.mask_pat],
                      c.mask_bc & BC_B ? "b" : "", c.mask_bc & BC_H ? "h" : "", c.mask_bc & BC_Q ? "q" : "",
                      c.mask_bc & BC_K ? "k" : "");
    if (c.dropout > 0)
        n += snprintf(buf + n, sizeof(buf) - n, " dropout=%g", c.dropout);
    if (c.sink)
        n += snprintf(buf + n, sizeof(buf) - n, " sink");
    if (c.dbias)
        n += snprintf(buf + n, sizeof(buf) - n, " dbias");
    if (c.varlen) {
        const varlen_lens l = make_lens(c);
        n += snprintf(buf + n, sizeof(buf) - n, " varlen total=%d/%d max=%d/%d%s", l.total_q, l.total_k, l.max_q,
                      l.max_k, c.seqused ? " seqused" : "");
    }
    if (c.det)
        n += snprintf(buf + n, sizeof(buf) - n, " det");
    return std::string(buf);
}

/* The band as the binding sets it (csrc/ops.cpp): window (left, right), -1 unbounded; causal right = 0;
 * aligned bottom-right except under CAUSAL_TOP_LEFT (flash_seq_of turns it into each sequence's
 * diag_lo <= j - i <= diag_hi). */
static void set_band(flash_params *p, const test_cfg &c)
{
    p->band_left = c.win_left;
    p->band_right = c.causal != CAUSAL_NONE ? 0 : c.win_right;
    p->band_bottom_right = c.causal != CAUSAL_TOP_LEFT;
}

/* Layout of one (b, s, h, d) tensor. */
typedef struct layout {
    flash_strides st;
    int64_t elems; /* allocation, in elements */
} layout;

static layout make_layout(int b, int s, int h, int d, int kind)
{
    layout l;
    if (kind == LAYOUT_STRIDED) {
        const int64_t dp = d + ROW_PAD;
        l.st.row = dp;
        l.st.head = (int64_t)s * dp;
        l.st.batch = (int64_t)h * s * dp;
        l.elems = (int64_t)b * l.st.batch;
        return l;
    }
    l.st.head = d;
    l.st.row = (int64_t)h * d;
    l.st.batch = (int64_t)s * h * d;
    l.elems = (int64_t)b * l.st.batch;
    if (kind == LAYOUT_ODD_UNIT) { /* what a channels-last padded tensor has: stride 1 on size-1 dims */
        if (s == 1)
            l.st.row = 1;
        if (b == 1)
            l.st.batch = 1;
        if (h == 1)
            l.st.head = 1;
        l.elems = (int64_t)(b - 1) * l.st.batch + (int64_t)(s - 1) * l.st.row + (int64_t)(h - 1) * l.st.head + d;
    }
    return l;
}

/* host tensors are logical (b, s, h, d) contiguous doubles */
static int64_t lidx(int s, int h, int d, int bi, int si, int hi, int di)
{
    return (((int64_t)bi * s + si) * h + hi) * d + di;
}

/* ---- attn_mask -------------------------------------------------------------------------------- */

/* The mask of one config: compact storage (size 1 on broadcast dimensions) and, if asked for, its
 * logical expansion as the reference wants it (additive double (b, h, sq, sk), -inf where a bool mask
 * is False). */
typedef struct mask_data {
    int mb, mh, mq, mk;            /* compact sizes */
    std::vector<double> compact;   /* (mb, mh, mq, mk): additive value, or 1 / 0 for bool */
    std::vector<double> logical;   /* (b, h, sq, sk) additive */
} mask_data;

static double mask_additive(int kind, double v)
{
    return kind == MASK_BOOL ? (v != 0 ? 0.0 : -INFINITY) : v;
}

static mask_data make_mask(const test_cfg &c, rng *r, int expand)
{
    mask_data m;
    m.mb = c.mask_bc & BC_B ? 1 : c.b;
    m.mh = c.mask_bc & BC_H ? 1 : c.h;
    m.mq = c.mask_bc & BC_Q ? 1 : c.sq;
    m.mk = c.mask_bc & BC_K ? 1 : c.sk;
    m.compact.assign((size_t)m.mb * m.mh * m.mq * m.mk, 0.0);
    const double masked = c.mask == MASK_BOOL ? 0.0 : -INFINITY, plain = c.mask == MASK_BOOL ? 1.0 : 0.0;
    for (int bi = 0; bi < m.mb; ++bi)
        for (int hi = 0; hi < m.mh; ++hi)
            for (int i = 0; i < m.mq; ++i)
                for (int j = 0; j < m.mk; ++j) {
                    double v = plain;
                    if (c.mask_pat == PAT_PADDING) {
                        const int len = c.sk - (bi + 1) * c.sk / (2 * m.mb + 2); /* keys [len, sk) are padding */
                        v = j < len ? plain : masked;
                    } else if (c.mask_pat == PAT_FINFO) {
                        const double low = c.dtype == FLASH_FP16 ? -65504.0 : c.dtype == FLASH_BF16 ?
                                           -3.3895313892515355e38 : c.dtype == FLASH_FP32 ? -FLT_MAX : -DBL_MAX;
                        const int len = c.sk - (bi + 1) * c.sk / (2 * m.mb + 2); /* keys [len, sk) are padding */
                        v = j >= len || i < m.mq / 5 ? low : round_to(c.dtype, 0.5 * rng_normal(r));
                    } else {
                        int partial = 1;
                        if (c.mask_pat == PAT_BLOCKS || c.mask_pat == PAT_SPARSE) {
                            const uint32_t hsh = (uint32_t)(i / SPARSE_BLOCK) * 2654435761u ^
                                                 (uint32_t)(j / SPARSE_BLOCK) * 40503u ^ (uint32_t)(bi * 7 + hi);
                            const uint32_t kind = (hsh ^ (hsh >> 13)) % 10; /* in tenths */
                            if (c.mask_pat == PAT_SPARSE)
                                v = kind == 0 ? plain : masked;
                            else if (kind < 8)
                                v = kind < 4 ? masked : plain;
                            partial = c.mask_pat == PAT_BLOCKS && kind >= 8;
                        }
                        if (partial) {
                            const double u = rng_uniform(r);
                            if (c.mask == MASK_BOOL)
                                v = u < 0.75 ? plain : masked;
                            else
                                v = u < 0.15 ? masked : round_to(c.dtype, 0.5 * rng_normal(r));
                            if ((c.mask_pat == PAT_RANDOM && m.mq > 2 && i == m.mq / 2) ||
                                (c.mask_pat == PAT_RANDOM && m.mk > 2 && j == m.mk / 3))
                                v = masked; /* a row that sees no key, a key that no row sees */
                        }
                    }
                    m.compact[(((size_t)bi * m.mh + hi) * m.mq + i) * m.mk + j] = v;
                }
    if (!expand)
        return m;
    m.logical.assign((size_t)c.b * c.h * c.sq * c.sk, 0.0);
    for (int bi = 0; bi < c.b; ++bi)
        for (int hi = 0; hi < c.h; ++hi)
            for (int i = 0; i < c.sq; ++i)
                for (int j = 0; j < c.sk; ++j) {
                    const size_t ci = (((size_t)(m.mb == 1 ? 0 : bi) * m.mh + (m.mh == 1 ? 0 : hi)) * m.mq +
                                       (m.mq == 1 ? 0 : i)) * m.mk + (m.mk == 1 ? 0 : j);
                    m.logical[(((size_t)bi * c.h + hi) * c.sq + i) * c.sk + j] = mask_additive(c.mask, m.compact[ci]);
                }
    return m;
}

/* Device copies of the mask and its block flags (csrc/ops.cpp mask_block_flags: stride 0 on the
 * broadcast dimensions, flags of (b or 1, h or 1, blocks of sq or 1, blocks of sk or 1)). */
typedef struct mask_dev {
    void *mask;
    uint8_t *blocks;
    flash_strides4 mask_s, blocks_s;
} mask_dev;

static mask_dev upload_mask(const test_cfg &c, const mask_data &m)
{
    mask_dev md;
    const flash_dtype t = c.dtype;
    const size_t es = c.mask == MASK_BOOL ? 1 : elem_size(t);
    const int64_t row = m.mk + (c.layout == LAYOUT_STRIDED ? MASK_ROW_PAD : 0);
    md.mask_s.col = m.mk == 1 ? 0 : 1;
    md.mask_s.row = m.mq == 1 ? 0 : row;
    md.mask_s.head = m.mh == 1 ? 0 : (int64_t)m.mq * row;
    md.mask_s.batch = m.mb == 1 ? 0 : (int64_t)m.mh * m.mq * row;
    std::vector<unsigned char> host((size_t)m.mb * m.mh * m.mq * row * es, 0);
    for (int bi = 0; bi < m.mb; ++bi)
        for (int hi = 0; hi < m.mh; ++hi)
            for (int i = 0; i < m.mq; ++i)
                for (int j = 0; j < m.mk; ++j) {
                    const double v = m.compact[(((size_t)bi * m.mh + hi) * m.mq + i) * m.mk + j];
                    const int64_t at = (((int64_t)bi * m.mh + hi) * m.mq + i) * row + j;
                    if (c.mask == MASK_BOOL)
                        host[at] = v != 0;
                    else
                        store_elem(host.data(), at, t, v);
                }
    CUDA_CHECK(cudaMalloc(&md.mask, host.size()));
    CUDA_CHECK(cudaMemcpy(md.mask, host.data(), host.size(), cudaMemcpyHostToDevice));

    const int nqb = (c.sq + FLASH_MASK_BLOCK - 1) / FLASH_MASK_BLOCK, nkb = (c.sk + FLASH_MASK_BLOCK - 1) / FLASH_MASK_BLOCK;
    const int fq = m.mq == 1 ? 1 : nqb, fk = m.mk == 1 ? 1 : nkb;
    std::vector<uint8_t> flags((size_t)m.mb * m.mh * fq * fk, 0);
    for (int bi = 0; bi < m.mb; ++bi)
        for (int hi = 0; hi < m.mh; ++hi)
            for (int i = 0; i < m.mq; ++i)
                for (int j = 0; j < m.mk; ++j) {
                    const double v = mask_additive(c.mask, m.compact[(((size_t)bi * m.mh + hi) * m.mq + i) * m.mk + j]);
                    uint8_t &f = flags[(((size_t)bi * m.mh + hi) * fq + i / FLASH_MASK_BLOCK) * fk + j / FLASH_MASK_BLOCK];
                    f |= (v > -INFINITY ? FLASH_MASK_ANY_VISIBLE : 0) | (v != 0 ? FLASH_MASK_ANY_MASKED : 0);
                }
    md.blocks_s.col = fk == 1 ? 0 : 1;
    md.blocks_s.row = fq == 1 ? 0 : fk;
    md.blocks_s.head = m.mh == 1 ? 0 : (int64_t)fq * fk;
    md.blocks_s.batch = m.mb == 1 ? 0 : (int64_t)m.mh * fq * fk;
    CUDA_CHECK(cudaMalloc(&md.blocks, flags.size()));
    CUDA_CHECK(cudaMemcpy(md.blocks, flags.data(), flags.size(), cudaMemcpyHostToDevice));
    return md;
}

/* ---- one config's inputs and reference (prepared on host threads) ---------------------------- */

typedef struct prepared {
    flash_params rp;                          /* reference params (host pointers) */
    std::vector<double> q, k, v, dout, o, lse, dq, dk, dv, dbias, sink;
    std::vector<float> slopes;
    mask_data mask;
    std::vector<char> empty_row; /* (b, h, sq): sees no key */
    std::vector<char> empty_key; /* (b, h_kv, sk): seen by no query of its group */
    /* varlen (then q-side tensors are (total_q, h, d), k-side (total_k, h_kv, d), lse (h, total_q), and
     * empty_row / empty_key (h, total_q) / (h_kv, total_k)) */
    varlen_lens lens;
    std::vector<char> q_live;    /* (total_q): the row is a sequence's */
    std::vector<char> k_live;    /* (total_k): the key is a sequence's and below its seqused_k */
} prepared;

static void prepare(const test_cfg &c, uint64_t seed, prepared *pr)
{
    const flash_dtype t = c.dtype;
    const int b = c.b, h = c.h, hkv = c.h_kv, sq = c.sq, sk = c.sk, d = c.d;
    rng r = {seed * 0x9E3779B97F4A7C15ull + 1};
    flash_params &rp = pr->rp;
    memset(&rp, 0, sizeof(rp));
    fill_sizes(&rp, t, b, h, hkv, sq, sk, d, c.scale); /* lse, delta (b, h, sq) */
    set_band(&rp, c);
    rp.softcap = c.softcap;
    if (c.alibi != ALIBI_NONE) {
        pr->slopes.resize((size_t)(c.alibi == ALIBI_BATCH ? b : 1) * h);
        for (auto &s : pr->slopes)
            s = (float)(0.05 + 0.5 * rng_uniform(&r));
        rp.alibi_slopes = pr->slopes.data();
        rp.alibi_batch_stride = c.alibi == ALIBI_BATCH ? h : 0;
    }
    set_dropout(&rp, c.dropout, rng_u64(&r) | (1ull << 63), rng_u64(&r) | (1ull << 40));
    if (c.sink) {
        pr->sink.resize(h);
        for (auto &s : pr->sink)
            s = round_to(lse_type(t), 0.5 + rng_normal(&r));
    }

    pr->q.resize((size_t)b * sq * h * d);
    pr->k.resize((size_t)b * sk * hkv * d);
    pr->v.resize(pr->k.size());
    pr->dout.resize(pr->q.size());
    for (auto *x : {&pr->q, &pr->k, &pr->v, &pr->dout})
        for (auto &e : *x)
            e = round_to(t, rng_normal(&r));
    if (c.mask)
        pr->mask = make_mask(c, &r, 1);
    const double *mask = c.mask ? pr->mask.logical.data() : NULL;
    const double *sink = c.sink ? pr->sink.data() : NULL;

    pr->o.resize(pr->q.size());
    pr->lse.resize((size_t)b * h * sq);
    ref_forward(&rp, pr->q.data(), pr->k.data(), pr->v.data(), mask, sink, pr->o.data(), pr->lse.data());
    for (auto &e : pr->lse)
        e = round_to(lse_type(t), e);
    pr->dq.resize(pr->q.size());
    pr->dk.resize(pr->k.size());
    pr->dv.resize(pr->k.size());
    if (c.dbias)
        pr->dbias.resize((size_t)b * h * sq * sk);
    ref_backward(&rp, pr->q.data(), pr->k.data(), pr->v.data(), mask, sink, pr->dout.data(), pr->dq.data(),
                 pr->dk.data(), pr->dv.data(), c.dbias ? pr->dbias.data() : NULL, NULL);

    pr->empty_row.assign((size_t)b * h * sq, 1);
    pr->empty_key.assign((size_t)b * hkv * sk, 1);
    const flash_seq seq = flash_seq_of(&rp, 0); /* every sequence of a dense batch */
    for (int bi = 0; bi < b; ++bi)
        for (int hq = 0; hq < h; ++hq)
            for (int i = 0; i < sq; ++i)
                for (int j = 0; j < sk; ++j)
                    if (flash_visible(&seq, i, j) && (!mask || mask[(((size_t)bi * h + hq) * sq + i) * sk + j] > -INFINITY)) {
                        pr->empty_row[((size_t)bi * h + hq) * sq + i] = 0;
                        pr->empty_key[((size_t)bi * hkv + hq / (h / hkv)) * sk + j] = 0;
                    }
}

/* A varlen config's inputs and references: each sequence run alone through dev/attn_ref.h as a dense
 * batch of one (its queries, its first seqused_k keys; bottom-right band, ALiBi and sinks of its own).
 * Rows of no sequence and keys past seqused_k hold NaN in q, k, v, dout, o and lse: a kernel that
 * reads one into a tile shows it. */
static void prepare_varlen(const test_cfg &c, uint64_t seed, prepared *pr)
{
    const flash_dtype t = c.dtype;
    const int b = c.b, h = c.h, hkv = c.h_kv, d = c.d;
    rng r = {seed * 0x9E3779B97F4A7C15ull + 1};
    pr->lens = make_lens(c);
    const varlen_lens &l = pr->lens;
    const int tq = l.total_q, tk = l.total_k;
    flash_params &rp = pr->rp; /* the kernels' params without device pointers */
    memset(&rp, 0, sizeof(rp));
    fill_sizes(&rp, t, b, h, hkv, l.max_q, l.max_k, d, c.scale);
    rp.total_q = tq;
    rp.total_k = tk;
    rp.lse_batch = 0; /* lse, delta (h, total_q) */
    rp.lse_head = tq;
    set_band(&rp, c);
    rp.softcap = c.softcap;
    if (c.alibi != ALIBI_NONE) {
        pr->slopes.resize((size_t)(c.alibi == ALIBI_BATCH ? b : 1) * h);
        for (auto &s : pr->slopes)
            s = (float)(0.05 + 0.5 * rng_uniform(&r));
        rp.alibi_slopes = pr->slopes.data();
        rp.alibi_batch_stride = c.alibi == ALIBI_BATCH ? h : 0;
    }
    if (c.sink) {
        pr->sink.resize(h);
        for (auto &s : pr->sink)
            s = round_to(lse_type(t), 0.5 + rng_normal(&r));
    }
    pr->q_live.assign(tq, 0);
    pr->k_live.assign(tk, 0);
    for (int s = 0; s < b; ++s) {
        std::fill(pr->q_live.begin() + l.cu_q[s], pr->q_live.begin() + l.cu_q[s + 1], 1);
        std::fill(pr->k_live.begin() + l.cu_k[s], pr->k_live.begin() + l.cu_k[s] + l.used[s], 1);
    }
    const size_t qe = (size_t)h * d, ke = (size_t)hkv * d; /* elements per row */
    pr->q.resize(tq * qe);
    pr->dout.resize(tq * qe);
    pr->k.resize(tk * ke);
    pr->v.resize(tk * ke);
    for (int i = 0; i < tq; ++i)
        for (size_t e = 0; e < qe; ++e) {
            pr->q[i * qe + e] = pr->q_live[i] ? round_to(t, rng_normal(&r)) : NAN;
            pr->dout[i * qe + e] = pr->q_live[i] ? round_to(t, rng_normal(&r)) : NAN;
        }
    for (int j = 0; j < tk; ++j)
        for (size_t e = 0; e < ke; ++e) {
            pr->k[j * ke + e] = pr->k_live[j] ? round_to(t, rng_normal(&r)) : NAN;
            pr->v[j * ke + e] = pr->k_live[j] ? round_to(t, rng_normal(&r)) : NAN;
        }
    pr->o.assign(tq * qe, NAN);
    pr->lse.assign((size_t)h * tq, NAN);
    pr->dq.assign(tq * qe, 0.0);
    pr->dk.assign(tk * ke, 0.0);
    pr->dv.assign(tk * ke, 0.0);
    pr->empty_row.assign((size_t)h * tq, 0);
    pr->empty_key.assign((size_t)hkv * tk, 0);
    const double *sink = c.sink ? pr->sink.data() : NULL;
    for (int s = 0; s < b; ++s) {
        const int sq = l.sq[s], sk = l.used[s], q0 = l.cu_q[s], k0 = l.cu_k[s];
        flash_params sp = rp; /* sequence s as a dense batch of one */
        sp.b = 1;
        sp.sq = sq;
        sp.sk = sk;
        sp.total_q = sp.total_k = 0;
        sp.lse_batch = (int64_t)h * sq;
        sp.lse_head = sq;
        if (c.alibi != ALIBI_NONE) {
            sp.alibi_slopes = pr->slopes.data() + (c.alibi == ALIBI_BATCH ? (size_t)s * h : 0);
            sp.alibi_batch_stride = 0;
        }
        std::vector<double> lse_s((size_t)h * sq);
        const double *qs = pr->q.data() + q0 * qe, *ks = pr->k.data() + k0 * ke, *vs = pr->v.data() + k0 * ke;
        ref_forward(&sp, qs, ks, vs, NULL, sink, pr->o.data() + q0 * qe, lse_s.data());
        for (int hq = 0; hq < h; ++hq)
            for (int i = 0; i < sq; ++i)
                pr->lse[(size_t)hq * tq + q0 + i] = round_to(lse_type(t), lse_s[(size_t)hq * sq + i]);
        ref_backward(&sp, qs, ks, vs, NULL, sink, pr->dout.data() + q0 * qe, pr->dq.data() + q0 * qe,
                     pr->dk.data() + k0 * ke, pr->dv.data() + k0 * ke, NULL, NULL);
        const flash_seq seq = flash_seq_of(&sp, 0);
        for (int hq = 0; hq < h; ++hq)
            for (int i = 0; i < sq; ++i)
                pr->empty_row[(size_t)hq * tq + q0 + i] = 1;
        for (int hk = 0; hk < hkv; ++hk)
            for (int j = 0; j < sk; ++j)
                pr->empty_key[(size_t)hk * tk + k0 + j] = 1;
        for (int hq = 0; hq < h; ++hq)
            for (int i = 0; i < sq; ++i)
                for (int j = 0; j < sk; ++j)
                    if (flash_visible(&seq, i, j)) {
                        pr->empty_row[(size_t)hq * tq + q0 + i] = 0;
                        pr->empty_key[(size_t)(hq / (h / hkv)) * tk + k0 + j] = 0;
                    }
    }
}

/* ---- device tensors --------------------------------------------------------------------------- */

/* Upload logical (b, s, h, d) doubles into a fresh device buffer with layout l. */
static void *upload(const std::vector<double> &x, const layout &l, int b, int s, int h, int d, flash_dtype t)
{
    const size_t es = elem_size(t);
    std::vector<unsigned char> host(l.elems * es, 0);
    for (int bi = 0; bi < b; ++bi)
        for (int si = 0; si < s; ++si)
            for (int hi = 0; hi < h; ++hi)
                for (int di = 0; di < d; ++di)
                    store_elem(host.data(), bi * l.st.batch + si * l.st.row + hi * l.st.head + di, t,
                               x[lidx(s, h, d, bi, si, hi, di)]);
    void *dev;
    CUDA_CHECK(cudaMalloc(&dev, host.size()));
    CUDA_CHECK(cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice));
    return dev;
}

static void *upload_flat(const void *src, size_t bytes)
{
    void *dev;
    CUDA_CHECK(cudaMalloc(&dev, bytes));
    CUDA_CHECK(cudaMemcpy(dev, src, bytes, cudaMemcpyHostToDevice));
    return dev;
}

static void *upload_typed(const std::vector<double> &x, flash_dtype t)
{
    std::vector<unsigned char> host(x.size() * elem_size(t));
    for (size_t i = 0; i < x.size(); ++i)
        store_elem(host.data(), i, t, x[i]);
    return upload_flat(host.data(), host.size());
}

typedef struct out_check {
    double rel_l2;
    int64_t non_finite; /* logical elements not written (still NaN) or inf */
    int64_t pad_touched;
} out_check;

/* Compare device output with layout l against the logical reference. */
static out_check check_output(const std::vector<unsigned char> &host, const std::vector<double> &ref, const layout &l,
                              int b, int s, int h, int d, flash_dtype t, int check_pad)
{
    out_check r = {0, 0, 0};
    const size_t es = elem_size(t);
    std::vector<char> logical(l.elems, 0);
    double num = 0, den = 0;
    for (int bi = 0; bi < b; ++bi)
        for (int si = 0; si < s; ++si)
            for (int hi = 0; hi < h; ++hi)
                for (int di = 0; di < d; ++di) {
                    const int64_t pidx = bi * l.st.batch + si * l.st.row + hi * l.st.head + di;
                    logical[pidx] = 1;
                    const double x = load_elem(host.data(), pidx, t), y = ref[lidx(s, h, d, bi, si, hi, di)];
                    if (!std::isfinite(x)) {
                        r.non_finite++;
                        continue;
                    }
                    num += (x - y) * (x - y);
                    den += y * y;
                }
    r.rel_l2 = den > 0 ? sqrt(num / den) : sqrt(num);
    if (check_pad)
        for (int64_t e = 0; e < l.elems; ++e)
            if (!logical[e])
                for (size_t byte = 0; byte < es; ++byte)
                    if (host[e * es + byte] != kPoison) {
                        r.pad_touched++;
                        break;
                    }
    return r;
}

/* Rows of a (b, s, h, d) output flagged in `which` ((b, h, s) or, for k-side tensors, (b, h_kv, s))
 * that are not exactly 0. */
static int64_t nonzero_rows(const std::vector<unsigned char> &host, const std::vector<char> &which, const layout &l,
                            int b, int s, int h, int d, flash_dtype t)
{
    int64_t bad = 0;
    for (int bi = 0; bi < b; ++bi)
        for (int hi = 0; hi < h; ++hi)
            for (int si = 0; si < s; ++si) {
                if (!which[((size_t)bi * h + hi) * s + si])
                    continue;
                for (int x = 0; x < d; ++x)
                    if (load_elem(host.data(), bi * l.st.batch + si * l.st.row + hi * l.st.head + x, t) != 0.0) {
                        bad++;
                        break;
                    }
            }
    return bad;
}

/* ---- one correctness config ------------------------------------------------------------------- */

typedef struct dev_bufs {
    void *q, *k, *v, *o, *dout, *lse, *dq, *dk, *dv, *delta, *dbias, *sink, *dout_fix, *lse_fix;
    float *dq_accum, *dk_accum, *dv_accum, *slopes;
    int32_t *dq_sem;
    mask_dev mask;
    size_t dq_bytes, dk_bytes, dv_bytes, delta_bytes, dqa_bytes, dkva_bytes, dbias_bytes, sem_bytes;
} dev_bufs;

/* The int32 dQ semaphores, set in p and allocated where the backward of p takes them (deterministic mode on
 * Hopper: flash_bwd_wants_dq_semaphore), as the binding does; NULL elsewhere. Call with p complete. */
static int32_t *alloc_dq_semaphore(flash_params *p, size_t *bytes)
{
    *bytes = 0;
    if (!flash_bwd_wants_dq_semaphore(p))
        return NULL;
    *bytes = (size_t)p->b * p->h * flash_dq_sem_tiles(p) * sizeof(int32_t);
    CUDA_CHECK(cudaMalloc(&p->dq_semaphore, *bytes)); /* the preprocess zeroes it (the tests poison it first) */
    return p->dq_semaphore;
}

/* dq_accum, of the size (and layout) the backward of p takes (launch.h flash_bwd_dq_accum_floats), as the
 * binding allocates it. Call with p complete. */
static float *alloc_dq_accum(const flash_params *p, size_t *bytes)
{
    float *x;
    *bytes = (size_t)flash_bwd_dq_accum_floats(p) * sizeof(float);
    CUDA_CHECK(cudaMalloc(&x, *bytes));
    return x;
}

static void poison(const dev_bufs &db)
{
    CUDA_CHECK(cudaMemset(db.dq, kPoison, db.dq_bytes));
    CUDA_CHECK(cudaMemset(db.dk, kPoison, db.dk_bytes));
    CUDA_CHECK(cudaMemset(db.dv, kPoison, db.dv_bytes));
    CUDA_CHECK(cudaMemset(db.delta, kPoison, db.delta_bytes));
    if (db.dq_accum)
        CUDA_CHECK(cudaMemset(db.dq_accum, kPoison, db.dqa_bytes));
    if (db.dk_accum) {
        CUDA_CHECK(cudaMemset(db.dk_accum, kPoison, db.dkva_bytes));
        CUDA_CHECK(cudaMemset(db.dv_accum, kPoison, db.dkva_bytes));
    }
    if (db.dbias)
        CUDA_CHECK(cudaMemset(db.dbias, 0, db.dbias_bytes)); /* the binding zero-fills it */
    if (db.dq_sem)
        CUDA_CHECK(cudaMemset(db.dq_sem, kPoison, db.sem_bytes));
}

static int run_test(const test_cfg &c, const prepared &pr)
{
    const flash_dtype t = c.dtype, lt = lse_type(t);
    const int b = c.b, h = c.h, hkv = c.h_kv, sq = c.sq, sk = c.sk, d = c.d;
    const int half = t == FLASH_FP16 || t == FLASH_BF16;

    const layout lq = make_layout(b, sq, h, d, c.layout), lk = make_layout(b, sk, hkv, d, c.layout);
    dev_bufs db;
    memset(&db, 0, sizeof(db));
    db.q = upload(pr.q, lq, b, sq, h, d, t);
    db.k = upload(pr.k, lk, b, sk, hkv, d, t);
    db.v = upload(pr.v, lk, b, sk, hkv, d, t);
    db.dout = upload(pr.dout, lq, b, sq, h, d, t);
    db.o = upload(pr.o, lq, b, sq, h, d, t);
    db.lse = upload_typed(pr.lse, lt);
    db.delta_bytes = pr.lse.size() * elem_size(lt);
    CUDA_CHECK(cudaMalloc(&db.delta, db.delta_bytes));
    db.dq_bytes = lq.elems * elem_size(t);
    db.dk_bytes = db.dv_bytes = lk.elems * elem_size(t);
    CUDA_CHECK(cudaMalloc(&db.dq, db.dq_bytes));
    CUDA_CHECK(cudaMalloc(&db.dk, db.dk_bytes));
    CUDA_CHECK(cudaMalloc(&db.dv, db.dv_bytes));
    if (half) {
        if (h != hkv) {
            db.dkva_bytes = (size_t)b * sk * h * d * sizeof(float);
            CUDA_CHECK(cudaMalloc(&db.dk_accum, db.dkva_bytes));
            CUDA_CHECK(cudaMalloc(&db.dv_accum, db.dkva_bytes));
        }
    }
    if (c.dbias) {
        db.dbias_bytes = (size_t)b * h * sq * sk * elem_size(lt);
        CUDA_CHECK(cudaMalloc(&db.dbias, db.dbias_bytes));
    }

    flash_params p = pr.rp;
    p.q = db.q; p.k = db.k; p.v = db.v; p.o = db.o; p.lse = db.lse; p.dout = db.dout;
    p.dq = db.dq; p.dk = db.dk; p.dv = db.dv; p.delta = db.delta;
    p.dq_accum = db.dq_accum; p.dk_accum = db.dk_accum; p.dv_accum = db.dv_accum;
    p.q_s = p.o_s = p.do_s = p.dq_s = lq.st;
    p.k_s = p.v_s = p.dk_s = p.dv_s = lk.st;
    if (c.alibi != ALIBI_NONE) {
        db.slopes = (float *)upload_flat(pr.slopes.data(), pr.slopes.size() * sizeof(float));
        p.alibi_slopes = db.slopes;
    }
    if (c.mask) {
        db.mask = upload_mask(c, pr.mask);
        p.mask = db.mask.mask;
        p.mask_kind = c.mask == MASK_BOOL ? FLASH_MASK_BOOL : FLASH_MASK_ADD;
        p.mask_s = db.mask.mask_s;
        p.mask_blocks = db.mask.blocks;
        p.mask_blocks_s = db.mask.blocks_s;
        if (p.mask_kind == FLASH_MASK_ADD) { /* the preprocess's dO' and lse, as the binding (flash.h dout_fix) */
            CUDA_CHECK(cudaMalloc(&db.dout_fix, lq.elems * elem_size(t)));
            CUDA_CHECK(cudaMalloc(&db.lse_fix, db.delta_bytes));
            p.dout_fix = db.dout_fix; /* contiguous (b, sq, h, d): mask.h flash_dout_fix_strides */
            p.lse_fix = db.lse_fix;
        }
    }
    if (c.sink) {
        db.sink = upload_typed(pr.sink, lt);
        p.sink = db.sink;
    }
    p.dbias = db.dbias;
    p.has_hook = (p.softcap > 0 || p.alibi_slopes || p.mask || p.dropout_threshold) ? 1 : 0;
    p.deterministic = c.det;
    db.dq_sem = alloc_dq_semaphore(&p, &db.sem_bytes);
    if (half)
        p.dq_accum = db.dq_accum = alloc_dq_accum(&p, &db.dqa_bytes);

    std::vector<unsigned char> hq(db.dq_bytes), hk(db.dk_bytes), hv(db.dv_bytes), hb(db.dbias_bytes);
    std::vector<unsigned char> hq0, hk0, hv0, hb0;
    int nondet = 0;
    const int runs = c.det ? DET_RUNS : 1;
    for (int r = 0; r < runs; ++r) {
        poison(db);
        const cudaError_t err = flash_bwd_cuda(&p, 0);
        if (err != cudaSuccess) {
            printf("FAIL %s | flash_bwd_cuda: %s\n", cfg_name(c).c_str(), cudaGetErrorString(err));
            exit(1);
        }
        CUDA_CHECK(cudaDeviceSynchronize());
        CUDA_CHECK(cudaMemcpy(hq.data(), db.dq, db.dq_bytes, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(hk.data(), db.dk, db.dk_bytes, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(hv.data(), db.dv, db.dv_bytes, cudaMemcpyDeviceToHost));
        if (db.dbias)
            CUDA_CHECK(cudaMemcpy(hb.data(), db.dbias, db.dbias_bytes, cudaMemcpyDeviceToHost));
        if (r == 0) {
            hq0 = hq; hk0 = hk; hv0 = hv; hb0 = hb;
        } else if (hq != hq0 || hk != hk0 || hv != hv0 || hb != hb0) {
            nondet++;
        }
    }

    const int check_pad = c.layout == LAYOUT_STRIDED;
    const out_check eq = check_output(hq, pr.dq, lq, b, sq, h, d, t, check_pad);
    const out_check ek = check_output(hk, pr.dk, lk, b, sk, hkv, d, t, check_pad);
    const out_check ev = check_output(hv, pr.dv, lk, b, sk, hkv, d, t, check_pad);
    out_check eb = {0, 0, 0};
    if (c.dbias) { /* (b, h, sq, sk) seen as (b, sq, h = 1, d = sk) rows; here h is folded into the batch */
        const layout lb = make_layout(b * h, sq, 1, sk, LAYOUT_BSHD);
        eb = check_output(hb, pr.dbias, lb, b * h, sq, 1, sk, lt, 0);
    }
    int64_t empty_rows = 0, empty_keys = 0;
    for (char e : pr.empty_row)
        empty_rows += e;
    for (char e : pr.empty_key)
        empty_keys += e;
    const int64_t rows_bad = nonzero_rows(hq, pr.empty_row, lq, b, sq, h, d, t);
    const int64_t keys_bad = nonzero_rows(hk, pr.empty_key, lk, b, sk, hkv, d, t) +
                             nonzero_rows(hv, pr.empty_key, lk, b, sk, hkv, d, t);

    const double tol = tolerance(t);
    const int64_t non_finite = eq.non_finite + ek.non_finite + ev.non_finite + eb.non_finite;
    const int64_t pad = eq.pad_touched + ek.pad_touched + ev.pad_touched;
    const int ok = eq.rel_l2 < tol && ek.rel_l2 < tol && ev.rel_l2 < tol && eb.rel_l2 < tol && non_finite == 0 &&
                   pad == 0 && rows_bad == 0 && keys_bad == 0 && nondet == 0;
    printf("%s %s | dq %.2e dk %.2e dv %.2e", ok ? "PASS" : "FAIL", cfg_name(c).c_str(), eq.rel_l2, ek.rel_l2, ev.rel_l2);
    if (c.dbias)
        printf(" dbias %.2e", eb.rel_l2);
    if (empty_rows || empty_keys)
        printf(" | empty rows %lld keys %lld", (long long)empty_rows, (long long)empty_keys);
    if (c.det)
        printf(" | %d/%d runs identical", runs - nondet, runs);
    if (non_finite)
        printf(" | non-finite dq %lld dk %lld dv %lld dbias %lld", (long long)eq.non_finite, (long long)ek.non_finite,
               (long long)ev.non_finite, (long long)eb.non_finite);
    if (pad)
        printf(" | padding written %lld", (long long)pad);
    if (rows_bad)
        printf(" | %lld empty rows with dq != 0", (long long)rows_bad);
    if (keys_bad)
        printf(" | %lld unseen keys with dk/dv != 0", (long long)keys_bad);
    printf("\n");
    fflush(stdout);

    for (void *x : {db.q, db.k, db.v, db.o, db.dout, db.lse, db.dq, db.dk, db.dv, db.delta, db.dbias, db.sink,
                    (void *)db.dq_accum, (void *)db.dk_accum, (void *)db.dv_accum, (void *)db.slopes, db.mask.mask,
                    (void *)db.mask.blocks, (void *)db.dq_sem, db.dout_fix, db.lse_fix})
        if (x)
            CUDA_CHECK(cudaFree(x));
    return ok;
}

/* ---- one varlen config --------------------------------------------------------------------------- */

/* Squared error and reference norm of rows [row0, row0 + n) of a (1, s, h, d) device output with
 * layout l against the logical reference; non-finite elements counted instead. */
static void rows_err(const std::vector<unsigned char> &host, const std::vector<double> &ref, const layout &l, int s,
                     int h, int d, flash_dtype t, int row0, int n, double *num, double *den, int64_t *non_finite)
{
    *num = *den = 0;
    for (int si = row0; si < row0 + n; ++si)
        for (int hi = 0; hi < h; ++hi)
            for (int di = 0; di < d; ++di) {
                const double x = load_elem(host.data(), si * l.st.row + hi * l.st.head + di, t);
                const double y = ref[lidx(s, h, d, 0, si, hi, di)];
                if (!std::isfinite(x)) {
                    (*non_finite)++;
                    continue;
                }
                *num += (x - y) * (x - y);
                *den += y * y;
            }
}

/* Elements of a (1, s, h, d) output with layout l that must still hold the poison (every byte): all but
 * the logical elements of live rows (padding, rows of no sequence, keys past seqused_k). Returns how many
 * were written. */
static int64_t poison_touched(const std::vector<unsigned char> &host, const std::vector<char> &live, const layout &l,
                              int s, int h, int d, flash_dtype t)
{
    const size_t es = elem_size(t);
    std::vector<char> owned(l.elems, 0);
    for (int si = 0; si < s; ++si)
        if (live[si])
            for (int hi = 0; hi < h; ++hi)
                for (int di = 0; di < d; ++di)
                    owned[si * l.st.row + hi * l.st.head + di] = 1;
    int64_t bad = 0;
    for (int64_t e = 0; e < l.elems; ++e)
        if (!owned[e])
            for (size_t byte = 0; byte < es; ++byte)
                if (host[e * es + byte] != kPoison) {
                    bad++;
                    break;
                }
    return bad;
}

/* One flash_bwd_cuda call over the whole varlen batch (DET_RUNS in deterministic mode, bitwise equal);
 * each sequence's dq, dk, dv against its own reference (the relative L2 error of the worst sequence
 * below the dtype's tolerance); rows of no sequence and keys past seqused_k never written; rows that
 * see no key dq = 0 and keys that no query sees dk = dv = 0 exactly. */
static int run_varlen(const test_cfg &c, const prepared &pr)
{
    const flash_dtype t = c.dtype, lt = lse_type(t);
    const int b = c.b, h = c.h, hkv = c.h_kv, d = c.d;
    const int half = t == FLASH_FP16 || t == FLASH_BF16;
    const varlen_lens &l = pr.lens;
    const int tq = l.total_q, tk = l.total_k;

    layout lq = make_layout(1, tq, h, d, c.layout), lk = make_layout(1, tk, hkv, d, c.layout);
    lq.st.batch = lk.st.batch = 0; /* varlen: batch strides 0 */
    dev_bufs db;
    memset(&db, 0, sizeof(db));
    db.q = upload(pr.q, lq, 1, tq, h, d, t);
    db.k = upload(pr.k, lk, 1, tk, hkv, d, t);
    db.v = upload(pr.v, lk, 1, tk, hkv, d, t);
    db.dout = upload(pr.dout, lq, 1, tq, h, d, t);
    db.o = upload(pr.o, lq, 1, tq, h, d, t);
    db.lse = upload_typed(pr.lse, lt);
    db.delta_bytes = pr.lse.size() * elem_size(lt);
    CUDA_CHECK(cudaMalloc(&db.delta, db.delta_bytes));
    db.dq_bytes = lq.elems * elem_size(t);
    db.dk_bytes = db.dv_bytes = lk.elems * elem_size(t);
    CUDA_CHECK(cudaMalloc(&db.dq, db.dq_bytes));
    CUDA_CHECK(cudaMalloc(&db.dk, db.dk_bytes));
    CUDA_CHECK(cudaMalloc(&db.dv, db.dv_bytes));
    if (half) {
        if (h != hkv) {
            db.dkva_bytes = (size_t)tk * h * d * sizeof(float); /* (total_k, h, d) */
            CUDA_CHECK(cudaMalloc(&db.dk_accum, db.dkva_bytes));
            CUDA_CHECK(cudaMalloc(&db.dv_accum, db.dkva_bytes));
        }
    }
    int32_t *cu_q = (int32_t *)upload_flat(l.cu_q.data(), l.cu_q.size() * sizeof(int32_t));
    int32_t *cu_k = (int32_t *)upload_flat(l.cu_k.data(), l.cu_k.size() * sizeof(int32_t));
    int32_t *used = c.seqused ? (int32_t *)upload_flat(l.used.data(), l.used.size() * sizeof(int32_t)) : NULL;

    flash_params p = pr.rp;
    p.q = db.q; p.k = db.k; p.v = db.v; p.o = db.o; p.lse = db.lse; p.dout = db.dout;
    p.dq = db.dq; p.dk = db.dk; p.dv = db.dv; p.delta = db.delta;
    p.dq_accum = db.dq_accum; p.dk_accum = db.dk_accum; p.dv_accum = db.dv_accum;
    p.q_s = p.o_s = p.do_s = p.dq_s = lq.st;
    p.k_s = p.v_s = p.dk_s = p.dv_s = lk.st;
    p.cu_seqlens_q = cu_q;
    p.cu_seqlens_k = cu_k;
    p.seqused_k = used;
    if (c.alibi != ALIBI_NONE) {
        db.slopes = (float *)upload_flat(pr.slopes.data(), pr.slopes.size() * sizeof(float));
        p.alibi_slopes = db.slopes;
    }
    if (c.sink) {
        db.sink = upload_typed(pr.sink, lt);
        p.sink = db.sink;
    }
    p.has_hook = (p.softcap > 0 || p.alibi_slopes) ? 1 : 0;
    p.deterministic = c.det;
    db.dq_sem = alloc_dq_semaphore(&p, &db.sem_bytes);
    if (half)
        p.dq_accum = db.dq_accum = alloc_dq_accum(&p, &db.dqa_bytes);

    std::vector<unsigned char> hq(db.dq_bytes), hk(db.dk_bytes), hv(db.dv_bytes);
    std::vector<unsigned char> hq0, hk0, hv0;
    int nondet = 0;
    const int runs = c.det ? DET_RUNS : 1;
    for (int r = 0; r < runs; ++r) {
        poison(db);
        const cudaError_t err = flash_bwd_cuda(&p, 0);
        if (err != cudaSuccess) {
            printf("FAIL %s | flash_bwd_cuda: %s\n", cfg_name(c).c_str(), cudaGetErrorString(err));
            exit(1);
        }
        CUDA_CHECK(cudaDeviceSynchronize());
        CUDA_CHECK(cudaMemcpy(hq.data(), db.dq, db.dq_bytes, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(hk.data(), db.dk, db.dk_bytes, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(hv.data(), db.dv, db.dv_bytes, cudaMemcpyDeviceToHost));
        if (r == 0) {
            hq0 = hq; hk0 = hk; hv0 = hv;
        } else if (hq != hq0 || hk != hk0 || hv != hv0) {
            nondet++;
        }
    }

    /* the worst sequence of each output */
    double eq = 0, ek = 0, ev = 0;
    int64_t non_finite = 0;
    for (int s = 0; s < b; ++s) {
        double num, den;
        rows_err(hq, pr.dq, lq, tq, h, d, t, l.cu_q[s], l.sq[s], &num, &den, &non_finite);
        eq = std::max(eq, den > 0 ? sqrt(num / den) : sqrt(num));
        rows_err(hk, pr.dk, lk, tk, hkv, d, t, l.cu_k[s], l.used[s], &num, &den, &non_finite);
        ek = std::max(ek, den > 0 ? sqrt(num / den) : sqrt(num));
        rows_err(hv, pr.dv, lk, tk, hkv, d, t, l.cu_k[s], l.used[s], &num, &den, &non_finite);
        ev = std::max(ev, den > 0 ? sqrt(num / den) : sqrt(num));
    }
    const int64_t touched = poison_touched(hq, pr.q_live, lq, tq, h, d, t) +
                            poison_touched(hk, pr.k_live, lk, tk, hkv, d, t) +
                            poison_touched(hv, pr.k_live, lk, tk, hkv, d, t);
    int64_t empty_rows = 0, empty_keys = 0;
    for (char e : pr.empty_row)
        empty_rows += e;
    for (char e : pr.empty_key)
        empty_keys += e;
    const int64_t rows_bad = nonzero_rows(hq, pr.empty_row, lq, 1, tq, h, d, t);
    const int64_t keys_bad = nonzero_rows(hk, pr.empty_key, lk, 1, tk, hkv, d, t) +
                             nonzero_rows(hv, pr.empty_key, lk, 1, tk, hkv, d, t);

    const double tol = tolerance(t);
    const int ok = eq < tol && ek < tol && ev < tol && non_finite == 0 && touched == 0 && rows_bad == 0 &&
                   keys_bad == 0 && nondet == 0;
    printf("%s %s | worst sequence: dq %.2e dk %.2e dv %.2e", ok ? "PASS" : "FAIL", cfg_name(c).c_str(), eq, ek, ev);
    if (empty_rows || empty_keys)
        printf(" | empty rows %lld keys %lld", (long long)empty_rows, (long long)empty_keys);
    if (c.det)
        printf(" | %d/%d runs identical", runs - nondet, runs);
    if (non_finite)
        printf(" | %lld non-finite", (long long)non_finite);
    if (touched)
        printf(" | %lld elements outside the sequences written", (long long)touched);
    if (rows_bad)
        printf(" | %lld empty rows with dq != 0", (long long)rows_bad);
    if (keys_bad)
        printf(" | %lld unseen keys with dk/dv != 0", (long long)keys_bad);
    printf("\n");
    fflush(stdout);

    for (void *x : {db.q, db.k, db.v, db.o, db.dout, db.lse, db.dq, db.dk, db.dv, db.delta, db.sink,
                    (void *)db.dq_accum, (void *)db.dk_accum, (void *)db.dv_accum, (void *)db.slopes, (void *)cu_q,
                    (void *)cu_k, (void *)used, (void *)db.dq_sem})
        if (x)
            CUDA_CHECK(cudaFree(x));
    return ok;
}

/* ---- config lists ---------------------------------------------------------------------------- */

static void dense_configs(std::vector<test_cfg> &v, flash_dtype t)
{
    const int half = t == FLASH_FP16 || t == FLASH_BF16;
    const int dims[] = {8, 64, 80, 96, 128, 200, 256};
    const int sizes[][2] = {{1, 1},     {17, 17},  {129, 129}, {300, 300},  {1000, 1000},
                            {1, 300},   {17, 129}, {300, 17},  {129, 1000}, {1000, 129}};
    const int nd = sizeof(dims) / sizeof(dims[0]), ns = sizeof(sizes) / sizeof(sizes[0]);
    for (int di = 0; di < nd; ++di)
        for (int si = 0; si < ns; ++si) {
            const int sq = sizes[si][0], sk = sizes[si][1];
            const int bsz = sq <= 300 && sk <= 300 ? 2 : 1;
            v.push_back(make_cfg(t, bsz, 2, 2, sq, sk, dims[di], (si + di) % 3));
        }
    /* sq > sk with bottom-right alignment: rows without keys */
    for (int d : {64, 128, 256}) {
        v.push_back(make_cfg(t, 1, 2, 2, 300, 17, d, CAUSAL_BOTTOM_RIGHT));
        v.push_back(make_cfg(t, 1, 2, 2, 1000, 129, d, CAUSAL_BOTTOM_RIGHT));
        v.push_back(make_cfg(t, 2, 2, 2, 129, 17, d, CAUSAL_TOP_LEFT));
    }
    /* GQA 4:1 and 2:1 */
    for (int d : {64, 128, 256}) {
        v.push_back(make_cfg(t, 1, 8, 2, 129, 129, d, CAUSAL_BOTTOM_RIGHT));
        v.push_back(make_cfg(t, 2, 4, 2, 300, 17, d, CAUSAL_TOP_LEFT));
        v.push_back(make_cfg(t, 1, 8, 2, 17, 300, d, CAUSAL_NONE));
        v.push_back(make_cfg(t, 1, 4, 2, 300, 1000, d, CAUSAL_BOTTOM_RIGHT));
    }
    /* strided */
    for (int d : {64, 96, 256}) {
        v.push_back(with_layout(make_cfg(t, 2, 4, 2, 129, 300, d, CAUSAL_BOTTOM_RIGHT), LAYOUT_STRIDED));
        v.push_back(with_layout(make_cfg(t, 2, 2, 2, 300, 129, d, CAUSAL_NONE), LAYOUT_STRIDED));
    }
    /* deterministic */
    for (int d : {64, 128, 200, 256}) {
        v.push_back(with_det(make_cfg(t, 1, 4, 1, 300, 300, d, CAUSAL_BOTTOM_RIGHT)));
        v.push_back(with_det(make_cfg(t, 2, 2, 2, 129, 1000, d, CAUSAL_NONE)));
    }
    /* size-1 dimensions with stride 1 (the head-dim-1 inputs of issue 10, padded to 8 by the binding) */
    v.push_back(with_layout(make_cfg(t, 1, 4, 4, 1, 65, 8, CAUSAL_NONE), LAYOUT_ODD_UNIT));
    v.push_back(with_scale(with_layout(make_cfg(t, 1, 2, 2, 1, 17, 8, CAUSAL_TOP_LEFT), LAYOUT_ODD_UNIT), 0.5));
    v.push_back(with_layout(make_cfg(t, 1, 1, 1, 1, 300, 64, CAUSAL_NONE), LAYOUT_ODD_UNIT));
    if (!half)
        for (int d : {1, 33, 255}) {
            v.push_back(with_layout(make_cfg(t, 2, 4, 2, 129, 300, d, CAUSAL_BOTTOM_RIGHT), LAYOUT_STRIDED));
            v.push_back(make_cfg(t, 1, 2, 2, 300, 17, d, CAUSAL_TOP_LEFT));
        }
}

static void variant_configs(std::vector<test_cfg> &v, flash_dtype t)
{
    /* sliding windows and one-sided bands: tiles outside the band skipped, partial tiles on both edges */
    for (int d : {64, 128, 256}) {
        v.push_back(with_window(make_cfg(t, 2, 2, 2, 300, 300, d, CAUSAL_BOTTOM_RIGHT), 40, -1));
        v.push_back(with_window(make_cfg(t, 1, 2, 2, 1000, 1000, d, CAUSAL_NONE), 100, 50));
        v.push_back(with_window(make_cfg(t, 1, 2, 2, 129, 1000, d, CAUSAL_NONE), 0, 0));
        v.push_back(with_window(make_cfg(t, 1, 4, 2, 1000, 129, d, CAUSAL_NONE), 200, -1));
        v.push_back(with_window(make_cfg(t, 2, 2, 2, 300, 17, d, CAUSAL_NONE), -1, 5));
        v.push_back(with_window(make_cfg(t, 1, 2, 2, 300, 1000, d, CAUSAL_TOP_LEFT), 130, -1));
    }
    v.push_back(with_det(with_window(make_cfg(t, 1, 2, 1, 1000, 1000, 128, CAUSAL_NONE), 300, 10)));
    v.push_back(with_layout(with_window(make_cfg(t, 2, 2, 2, 129, 300, 96, CAUSAL_NONE), 64, 64), LAYOUT_STRIDED));
    /* softcap (Gemma-2's 50; a small cap that saturates) */
    for (int d : {64, 128, 256}) {
        v.push_back(with_softcap(make_cfg(t, 2, 2, 2, 300, 300, d, CAUSAL_NONE), 1.5f));
        v.push_back(with_softcap(make_cfg(t, 1, 4, 2, 129, 1000, d, CAUSAL_BOTTOM_RIGHT), 50.f));
    }
    v.push_back(with_det(with_softcap(make_cfg(t, 1, 2, 2, 300, 300, 128, CAUSAL_BOTTOM_RIGHT), 2.f)));
    /* ALiBi per head and per (batch, head) */
    for (int d : {64, 128, 256}) {
        v.push_back(with_alibi(make_cfg(t, 2, 4, 2, 300, 300, d, CAUSAL_BOTTOM_RIGHT), ALIBI_HEAD));
        v.push_back(with_alibi(make_cfg(t, 2, 2, 2, 129, 1000, d, CAUSAL_NONE), ALIBI_BATCH));
    }
    v.push_back(with_det(with_alibi(make_cfg(t, 2, 2, 2, 300, 129, 64, CAUSAL_NONE), ALIBI_BATCH)));
    /* attn_mask: bool / additive x random / padding / block-sparse, broadcast dimensions by stride 0 */
    for (int d : {64, 128, 256}) {
        v.push_back(with_mask(make_cfg(t, 2, 2, 2, 129, 300, d, CAUSAL_NONE), MASK_BOOL, PAT_RANDOM, 0));
        v.push_back(with_mask(make_cfg(t, 2, 2, 2, 300, 129, d, CAUSAL_NONE), MASK_ADD, PAT_RANDOM, BC_B));
        v.push_back(with_mask(make_cfg(t, 2, 4, 2, 300, 1000, d, CAUSAL_NONE), MASK_BOOL, PAT_PADDING, BC_H | BC_Q));
        v.push_back(with_mask(make_cfg(t, 1, 2, 2, 1000, 1000, d, CAUSAL_NONE), MASK_BOOL, PAT_BLOCKS, BC_B | BC_H));
        v.push_back(with_mask(make_cfg(t, 1, 2, 1, 600, 600, d, CAUSAL_NONE), MASK_ADD, PAT_BLOCKS, BC_H));
    }
    v.push_back(with_mask(make_cfg(t, 2, 2, 2, 300, 300, 64, CAUSAL_NONE), MASK_ADD, PAT_PADDING, BC_H | BC_Q));
    if (t == FLASH_BF16) { /* finfo.min rows (fp16's, -65504, is an ordinary entry) */
        v.push_back(with_dbias(with_mask(make_cfg(t, 2, 4, 2, 300, 200, 64, CAUSAL_NONE), MASK_ADD, PAT_FINFO, 0)));
        v.push_back(with_det(with_mask(make_cfg(t, 1, 2, 1, 200, 300, 256, CAUSAL_NONE), MASK_ADD, PAT_FINFO, BC_H)));
        v.push_back(with_softcap(with_mask(make_cfg(t, 2, 2, 2, 129, 300, 128, CAUSAL_NONE), MASK_ADD, PAT_FINFO, BC_B),
                                 20.f));
    }
    v.push_back(with_mask(make_cfg(t, 2, 2, 2, 129, 129, 64, CAUSAL_NONE), MASK_BOOL, PAT_RANDOM, BC_B | BC_H | BC_K));
    v.push_back(with_layout(with_mask(make_cfg(t, 2, 2, 2, 129, 300, 96, CAUSAL_NONE), MASK_ADD, PAT_RANDOM, BC_H),
                            LAYOUT_STRIDED));
    v.push_back(with_det(with_mask(make_cfg(t, 1, 2, 2, 600, 600, 128, CAUSAL_NONE), MASK_BOOL, PAT_BLOCKS, 0)));
    /* dropout */
    for (int d : {64, 128, 256}) {
        v.push_back(with_dropout(make_cfg(t, 2, 2, 2, 300, 300, d, CAUSAL_NONE), 0.17));
        v.push_back(with_dropout(make_cfg(t, 1, 4, 2, 129, 1000, d, CAUSAL_BOTTOM_RIGHT), 0.5));
        v.push_back(with_det(with_dropout(make_cfg(t, 1, 2, 2, 300, 129, d, CAUSAL_TOP_LEFT), 0.1)));
    }
    /* sinks: lse includes them; rows without keys have lse = sink */
    for (int d : {64, 128}) {
        v.push_back(with_sink(make_cfg(t, 2, 2, 2, 300, 300, d, CAUSAL_BOTTOM_RIGHT)));
        v.push_back(with_sink(make_cfg(t, 1, 2, 2, 300, 17, d, CAUSAL_BOTTOM_RIGHT)));
    }
    /* dbias: the additive mask's gradient, in both modes */
    for (int d : {64, 128, 256}) {
        v.push_back(with_dbias(with_mask(make_cfg(t, 2, 2, 2, 129, 300, d, CAUSAL_NONE), MASK_ADD, PAT_RANDOM, 0)));
        v.push_back(with_det(with_dbias(with_mask(make_cfg(t, 1, 4, 2, 300, 129, d, CAUSAL_NONE), MASK_ADD, PAT_BLOCKS, BC_B))));
    }
    /* pairs */
    for (int d : {64, 128}) {
        v.push_back(with_softcap(with_window(make_cfg(t, 1, 2, 2, 1000, 1000, d, CAUSAL_BOTTOM_RIGHT), 256, -1), 30.f));
        v.push_back(with_alibi(with_window(make_cfg(t, 2, 2, 2, 300, 300, d, CAUSAL_NONE), 64, 32), ALIBI_HEAD));
        v.push_back(with_dropout(with_mask(make_cfg(t, 2, 2, 2, 300, 300, d, CAUSAL_NONE), MASK_BOOL, PAT_PADDING, BC_H | BC_Q), 0.2));
        v.push_back(with_sink(with_window(make_cfg(t, 1, 4, 2, 300, 300, d, CAUSAL_BOTTOM_RIGHT), 50, -1)));
        v.push_back(with_alibi(with_softcap(make_cfg(t, 2, 2, 2, 129, 300, d, CAUSAL_NONE), 5.f), ALIBI_BATCH));
        v.push_back(with_dropout(with_window(make_cfg(t, 1, 2, 2, 600, 600, d, CAUSAL_NONE), 100, 100), 0.3));
        v.push_back(with_alibi(with_mask(make_cfg(t, 2, 2, 2, 300, 129, d, CAUSAL_NONE), MASK_ADD, PAT_RANDOM, BC_H), ALIBI_HEAD));
        v.push_back(with_mask(make_cfg(t, 1, 2, 2, 300, 300, d, CAUSAL_BOTTOM_RIGHT), MASK_BOOL, PAT_RANDOM, BC_B));
        v.push_back(with_dbias(with_dropout(with_softcap(with_mask(make_cfg(t, 2, 2, 2, 129, 129, d, CAUSAL_NONE),
                                                                   MASK_ADD, PAT_RANDOM, 0), 3.f), 0.25)));
        test_cfg all = with_window(make_cfg(t, 1, 4, 2, 300, 300, d, CAUSAL_NONE), 90, 20);
        all = with_dropout(with_softcap(with_mask(all, MASK_ADD, PAT_RANDOM, BC_B), 4.f), 0.15);
        v.push_back(with_det(with_dbias(with_sink(with_alibi(all, ALIBI_BATCH)))));
    }
}

/* Varlen batches (one flash_bwd_cuda call each; no attn_mask, dbias or dropout): lengths 0 and 1 in
 * every batch, sq != sk per sequence, GQA, seqused_k, rows of no sequence after the last one (or none:
 * the last sequence ends at the tensor's end), max_seqlen above the longest sequence, each band and
 * hook, deterministic mode, strided storage; head dims 32..256 (fp32 / fp64: any). */
static void varlen_configs(std::vector<test_cfg> &v, flash_dtype t)
{
    const int NO = CAUSAL_NONE, BR = CAUSAL_BOTTOM_RIGHT;
    const uint32_t s0 = 100u * (uint32_t)t; /* other lengths per dtype */
    if (t == FLASH_FP16 || t == FLASH_BF16) {
        v.push_back(make_varlen(t, 6, 4, 4, 300, 300, 64, NO, 0, 3, 0, s0 + 1));
        v.push_back(make_varlen(t, 8, 8, 2, 400, 300, 128, BR, 1, 5, 7, s0 + 2));
        v.push_back(with_window(make_varlen(t, 5, 4, 1, 200, 500, 256, NO, 1, 0, 0, s0 + 3), 64, 16));
        v.push_back(with_det(make_varlen(t, 7, 6, 3, 300, 200, 96, BR, 0, 2, 0, s0 + 4)));
        v.push_back(with_softcap(make_varlen(t, 6, 4, 2, 250, 250, 32, NO, 0, 1, 3, s0 + 5), 30.f));
        v.push_back(with_alibi(make_varlen(t, 6, 4, 4, 300, 300, 160, BR, 1, 4, 0, s0 + 6), ALIBI_BATCH));
        v.push_back(with_window(make_varlen(t, 9, 4, 2, 150, 350, 128, NO, 0, 2, 0, s0 + 7), 100, -1));
        v.push_back(with_layout(with_det(make_varlen(t, 4, 2, 2, 700, 600, 64, BR, 0, 0, 0, s0 + 8)), LAYOUT_STRIDED));
        v.push_back(with_det(with_alibi(with_softcap(make_varlen(t, 6, 8, 2, 300, 300, 256, BR, 1, 1, 0, s0 + 9), 5.f),
                                        ALIBI_HEAD)));
        v.push_back(with_sink(make_varlen(t, 6, 4, 2, 300, 300, 128, NO, 0, 2, 0, s0 + 10)));
        v.push_back(with_det(
            with_alibi(with_window(make_varlen(t, 5, 4, 4, 300, 300, 128, BR, 1, 3, 0, s0 + 11), 32, 8), ALIBI_BATCH)));
        v.push_back(with_det(make_varlen(t, 12, 2, 1, 130, 130, 64, BR, 0, 1, 0, s0 + 12)));
        v.push_back(make_varlen(t, 6, 4, 2, 200, 300, 200, BR, 1, 2, 0, s0 + 13));
        v.push_back(with_det(make_varlen(t, 8, 8, 2, 300, 300, 32, BR, 1, 0, 0, s0 + 14)));
        v.push_back(with_layout(with_window(make_varlen(t, 6, 4, 2, 300, 300, 96, NO, 1, 3, 0, s0 + 15), 20, 60),
                                LAYOUT_STRIDED));
        v.push_back(
            with_det(with_sink(with_window(make_varlen(t, 5, 4, 2, 400, 300, 256, BR, 0, 2, 0, s0 + 16), 50, -1))));
        v.push_back(with_softcap(make_varlen(t, 7, 4, 4, 500, 500, 64, BR, 1, 2, 0, s0 + 17), 50.f));
        v.push_back(with_window(make_varlen(t, 6, 6, 2, 300, 250, 128, NO, 0, 0, 2, s0 + 18), -1, 5));
        v.push_back(make_varlen(t, 3, 2, 1, 1500, 1400, 64, BR, 1, 2, 0, s0 + 19)); /* many tiles per sequence */
        v.push_back(with_det(make_varlen(t, 3, 2, 2, 1200, 1000, 128, NO, 0, 1, 0, s0 + 20)));
        /* d > 128 with many tiles per sequence (Hopper: the tiled dq_accum, padded per sequence) */
        v.push_back(make_varlen(t, 3, 4, 2, 1000, 900, 200, BR, 1, 1, 0, s0 + 41));
        v.push_back(with_det(make_varlen(t, 3, 2, 2, 800, 900, 256, NO, 0, 0, 0, s0 + 42)));
        return;
    }
    v.push_back(make_varlen(t, 5, 4, 2, 70, 60, 33, BR, 1, 2, 0, s0 + 21));
    v.push_back(with_alibi(with_softcap(make_varlen(t, 6, 2, 2, 60, 80, 64, NO, 0, 0, 3, s0 + 22), 3.f), ALIBI_BATCH));
    v.push_back(
        with_layout(with_window(make_varlen(t, 4, 4, 1, 90, 70, 80, NO, 1, 1, 0, s0 + 23), 10, 3), LAYOUT_STRIDED));
    v.push_back(with_sink(make_varlen(t, 5, 2, 1, 50, 50, 256, BR, 1, 2, 0, s0 + 24)));
}

static std::vector<test_cfg> full_configs(void)
{
    std::vector<test_cfg> v;
    for (flash_dtype t : {FLASH_BF16, FLASH_FP16, FLASH_FP32, FLASH_FP64}) {
        dense_configs(v, t);
        variant_configs(v, t);
        varlen_configs(v, t);
    }
    return v;
}

static std::vector<test_cfg> small_configs(void)
{
    std::vector<test_cfg> v;
    v.push_back(make_cfg(FLASH_BF16, 1, 2, 2, 17, 129, 64, CAUSAL_BOTTOM_RIGHT));
    v.push_back(make_cfg(FLASH_BF16, 1, 4, 2, 129, 17, 128, CAUSAL_TOP_LEFT));
    v.push_back(with_layout(make_cfg(FLASH_FP16, 1, 2, 1, 70, 70, 256, CAUSAL_NONE), LAYOUT_STRIDED));
    v.push_back(with_det(make_cfg(FLASH_BF16, 1, 2, 2, 100, 100, 96, CAUSAL_BOTTOM_RIGHT)));
    v.push_back(with_det(make_cfg(FLASH_FP16, 1, 2, 2, 40, 200, 200, CAUSAL_BOTTOM_RIGHT)));
    v.push_back(with_layout(make_cfg(FLASH_FP16, 2, 4, 2, 150, 300, 48, CAUSAL_BOTTOM_RIGHT), LAYOUT_STRIDED));
    v.push_back(with_layout(make_cfg(FLASH_FP32, 1, 4, 2, 17, 33, 40, CAUSAL_BOTTOM_RIGHT), LAYOUT_STRIDED));
    v.push_back(make_cfg(FLASH_FP64, 1, 2, 2, 20, 9, 8, CAUSAL_TOP_LEFT));
    v.push_back(with_window(make_cfg(FLASH_BF16, 1, 2, 2, 300, 300, 128, CAUSAL_NONE), 70, 20));
    v.push_back(with_softcap(with_alibi(make_cfg(FLASH_FP16, 1, 2, 2, 129, 200, 64, CAUSAL_NONE), ALIBI_BATCH), 3.f));
    v.push_back(with_dbias(with_dropout(with_mask(make_cfg(FLASH_BF16, 1, 4, 2, 150, 260, 64, CAUSAL_NONE), MASK_ADD,
                                                  PAT_BLOCKS, BC_B), 0.2)));
    v.push_back(with_det(with_dbias(with_dropout(with_mask(make_cfg(FLASH_FP16, 1, 2, 2, 200, 150, 256, CAUSAL_NONE),
                                                           MASK_ADD, PAT_RANDOM, 0), 0.3))));
    v.push_back(with_dropout(with_mask(make_cfg(FLASH_FP32, 1, 2, 2, 40, 70, 32, CAUSAL_NONE), MASK_BOOL, PAT_RANDOM,
                                       BC_H), 0.2));
    v.push_back(with_layout(make_cfg(FLASH_FP16, 1, 4, 4, 1, 65, 8, CAUSAL_NONE), LAYOUT_ODD_UNIT));
    /* varlen, the last sequence ending at the tensors' end (memcheck sees a read past it) */
    v.push_back(make_varlen(FLASH_BF16, 5, 4, 2, 100, 90, 64, CAUSAL_BOTTOM_RIGHT, 1, 0, 0, 31));
    v.push_back(with_det(with_window(make_varlen(FLASH_FP16, 4, 2, 1, 80, 100, 256, CAUSAL_NONE, 0, 0, 2, 32), 20, 4)));
    v.push_back(with_alibi(make_varlen(FLASH_BF16, 4, 4, 4, 140, 140, 128, CAUSAL_NONE, 1, 0, 0, 33), ALIBI_HEAD));
    v.push_back(
        with_alibi(make_varlen(FLASH_FP32, 4, 2, 1, 40, 50, 40, CAUSAL_BOTTOM_RIGHT, 1, 0, 0, 34), ALIBI_BATCH));
    v.push_back(make_varlen(FLASH_BF16, 5, 2, 1, 150, 140, 200, CAUSAL_BOTTOM_RIGHT, 1, 0, 0, 35));
    return v;
}

/* ---- timing ------------------------------------------------------------------------------------ */

/* fill n bf16 values with a hash-based pseudo-normal-ish spread in (-2, 2) */
__global__ void fill_bf16(__nv_bfloat16 *x, int64_t n, uint32_t seed)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t hsh = (uint32_t)i * 2654435761u ^ seed;
        hsh ^= hsh >> 16;
        hsh *= 0x7feb352du;
        hsh ^= hsh >> 15;
        x[i] = __float2bfloat16((float)(hsh & 0xffff) / 16384.0f - 2.0f);
    }
}

__global__ void fill_f32(float *x, int64_t n, float val)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = val;
}

/* Median time of flash_bwd_cuda(p) over TIME_REPS runs after TIME_WARMUP, in ms (common.h time_ms). */
static double median_ms(const flash_params &p)
{
    return time_ms([&] { return flash_bwd_cuda(&p, 0); }, TIME_WARMUP, TIME_REPS);
}

/* One timing config: bf16, b x s tokens, h heads of d; c carries the variant (c.b, c.h, c.sq, c.sk,
 * c.d are used; masks are broadcast over heads). TFLOP/s counted on the visible (i, j) pairs. */
static void time_variant(const test_cfg &c, const char *label)
{
    const int b = c.b, h = c.h, s = c.sq, d = c.d;
    const int64_t n = (int64_t)b * s * h * d;
    __nv_bfloat16 *q, *k, *v, *o, *dout, *dq, *dk, *dv;
    float *lse, *delta, *dqa, *slopes = NULL, *dbias = NULL;
    void *dout_fix = NULL, *lse_fix = NULL;
    for (__nv_bfloat16 **x : {&q, &k, &v, &o, &dout, &dq, &dk, &dv})
        CUDA_CHECK(cudaMalloc(x, n * sizeof(__nv_bfloat16)));
    CUDA_CHECK(cudaMalloc(&lse, (size_t)b * h * s * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&delta, (size_t)b * h * s * sizeof(float)));
    uint32_t seed = 1;
    for (__nv_bfloat16 *x : {q, k, v, o, dout})
        fill_bf16<<<1024, 256>>>(x, n, seed++);
    fill_f32<<<1024, 256>>>(lse, (int64_t)b * h * s, logf((float)s));
    CUDA_CHECK(cudaDeviceSynchronize());

    flash_params p;
    memset(&p, 0, sizeof(p));
    const layout l = make_layout(b, s, h, d, LAYOUT_BSHD);
    p.q = q; p.k = k; p.v = v; p.o = o; p.lse = lse; p.dout = dout;
    p.dq = dq; p.dk = dk; p.dv = dv; p.delta = delta;
    p.q_s = p.k_s = p.v_s = p.o_s = p.do_s = p.dq_s = p.dk_s = p.dv_s = l.st;
    fill_sizes(&p, FLASH_BF16, b, h, h, s, s, d, 0);
    size_t dqa_bytes;
    p.dq_accum = dqa = alloc_dq_accum(&p, &dqa_bytes);
    set_band(&p, c);
    p.softcap = c.softcap;
    rng r = {12345};
    if (c.alibi != ALIBI_NONE) {
        std::vector<float> hs(h);
        for (int i = 0; i < h; ++i)
            hs[i] = powf(2.f, -8.f * (i + 1) / h);
        slopes = (float *)upload_flat(hs.data(), hs.size() * sizeof(float));
        p.alibi_slopes = slopes;
    }
    set_dropout(&p, c.dropout, 7, 11);
    mask_dev md;
    memset(&md, 0, sizeof(md));
    mask_data m;
    if (c.mask) {
        m = make_mask(c, &r, 0);
        md = upload_mask(c, m);
        p.mask = md.mask;
        p.mask_kind = c.mask == MASK_BOOL ? FLASH_MASK_BOOL : FLASH_MASK_ADD;
        p.mask_s = md.mask_s;
        p.mask_blocks = md.blocks;
        p.mask_blocks_s = md.blocks_s;
        if (p.mask_kind == FLASH_MASK_ADD) { /* the preprocess's dO' and lse, as the binding (flash.h dout_fix) */
            CUDA_CHECK(cudaMalloc(&dout_fix, n * sizeof(__nv_bfloat16)));
            CUDA_CHECK(cudaMalloc(&lse_fix, (size_t)b * h * s * sizeof(float)));
            p.dout_fix = dout_fix; /* contiguous (b, sq, h, d): mask.h flash_dout_fix_strides */
            p.lse_fix = lse_fix;
        }
    }
    if (c.dbias) {
        CUDA_CHECK(cudaMalloc(&dbias, (size_t)b * h * s * s * sizeof(float)));
        p.dbias = dbias;
    }
    p.has_hook = (p.softcap > 0 || p.alibi_slopes || p.mask || p.dropout_threshold) ? 1 : 0;
    p.deterministic = c.det;
    size_t sem_bytes;
    int32_t *sem = alloc_dq_semaphore(&p, &sem_bytes);

    /* visible pairs: the band, and the mask (broadcast over heads) */
    double pairs = 0;
    const flash_seq seq = flash_seq_of(&p, 0);
    for (int bi = 0; bi < b; ++bi)
        for (int i = 0; i < s; ++i) {
            const int64_t lo = std::max<int64_t>(0, i + seq.diag_lo), hi = std::min<int64_t>(s - 1, i + seq.diag_hi);
            if (!c.mask) {
                pairs += hi >= lo ? (double)(hi - lo + 1) * h : 0;
                continue;
            }
            for (int64_t j = lo; j <= hi; ++j) {
                const size_t ci = (((size_t)(m.mb == 1 ? 0 : bi) * m.mh) * m.mq + (m.mq == 1 ? 0 : i)) * m.mk + (m.mk == 1 ? 0 : j);
                pairs += mask_additive(c.mask, m.compact[ci]) > -INFINITY ? h : 0;
            }
        }

    const double med = median_ms(p);
    const double flops = BWD_FLOPS_PER_PAIR * d * pairs;
    printf("bf16 d=%3d seqlen=%5d b=%2d h=%2d %-28s: %8.3f ms  %6.1f TFLOP/s (visible %.3f)\n", d, s, b, h, label, med,
           flops / (med * 1e-3) / 1e12, pairs / ((double)b * h * s * s));
    fflush(stdout);
    for (void *x : {(void *)q, (void *)k, (void *)v, (void *)o, (void *)dout, (void *)dq, (void *)dk, (void *)dv,
                    (void *)lse, (void *)delta, (void *)dqa, (void *)slopes, (void *)dbias, md.mask, (void *)md.blocks,
                    (void *)sem, dout_fix, lse_fix})
        if (x)
            CUDA_CHECK(cudaFree(x));
}

static void time_config(int d, int s, int causal, int det)
{
    test_cfg c = make_cfg(FLASH_BF16, TIME_TOKENS / s, TIME_HIDDEN / d, TIME_HIDDEN / d, s, s, d,
                          causal ? CAUSAL_TOP_LEFT : CAUSAL_NONE);
    c.det = det;
    char label[64];
    snprintf(label, sizeof(label), "causal=%d det=%d", causal, det);
    time_variant(c, label);
}

/* time_config's shapes as one varlen batch (bf16, TIME_TOKENS tokens, nheads = TIME_HIDDEN / d): equal
 * lengths s (the cost of the varlen path itself against time_config), or lengths drawn from [1, 2 s]
 * (the last one cut to fill the tokens). TFLOP/s on each sequence's visible pairs. */
static void time_varlen(int d, int s, int causal, int random_lengths)
{
    const int h = TIME_HIDDEN / d, tokens = TIME_TOKENS;
    std::vector<int32_t> cu(1, 0);
    rng r = {(uint64_t)s * 977 + d};
    while (cu.back() < tokens) {
        const int len = random_lengths ? 1 + (int)(rng_uniform(&r) * 2 * s) % (2 * s) : s;
        cu.push_back(std::min(tokens, cu.back() + len));
    }
    const int b = (int)cu.size() - 1;
    int max_len = 0;
    for (int i = 0; i < b; ++i)
        max_len = std::max(max_len, cu[i + 1] - cu[i]);
    const int64_t n = (int64_t)tokens * h * d;
    __nv_bfloat16 *q, *k, *v, *o, *dout, *dq, *dk, *dv;
    float *lse, *delta, *dqa;
    for (__nv_bfloat16 **x : {&q, &k, &v, &o, &dout, &dq, &dk, &dv})
        CUDA_CHECK(cudaMalloc(x, n * sizeof(__nv_bfloat16)));
    CUDA_CHECK(cudaMalloc(&lse, (size_t)h * tokens * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&delta, (size_t)h * tokens * sizeof(float)));
    int32_t *cu_dev = (int32_t *)upload_flat(cu.data(), cu.size() * sizeof(int32_t));
    uint32_t seed = 1;
    for (__nv_bfloat16 *x : {q, k, v, o, dout})
        fill_bf16<<<1024, 256>>>(x, n, seed++);
    fill_f32<<<1024, 256>>>(lse, (int64_t)h * tokens, logf((float)s));
    CUDA_CHECK(cudaDeviceSynchronize());

    flash_params p;
    memset(&p, 0, sizeof(p));
    layout l = make_layout(1, tokens, h, d, LAYOUT_BSHD);
    l.st.batch = 0;
    p.q = q; p.k = k; p.v = v; p.o = o; p.lse = lse; p.dout = dout;
    p.dq = dq; p.dk = dk; p.dv = dv; p.delta = delta;
    p.q_s = p.k_s = p.v_s = p.o_s = p.do_s = p.dq_s = p.dk_s = p.dv_s = l.st;
    fill_sizes(&p, FLASH_BF16, b, h, h, max_len, max_len, d, 0);
    p.total_q = p.total_k = tokens;
    p.cu_seqlens_q = p.cu_seqlens_k = cu_dev;
    size_t dqa_bytes;
    p.dq_accum = dqa = alloc_dq_accum(&p, &dqa_bytes);
    p.lse_batch = 0;
    p.lse_head = tokens;
    p.band_left = -1;
    p.band_right = causal ? 0 : -1;
    p.band_bottom_right = 1;

    double pairs = 0; /* visible pairs, sequence by sequence (a dense batch of one each) */
    for (int i = 0; i < b; ++i) {
        flash_params one = p;
        one.cu_seqlens_q = one.cu_seqlens_k = NULL;
        one.b = 1;
        one.sq = one.sk = cu[i + 1] - cu[i];
        const flash_seq seq = flash_seq_of(&one, 0);
        for (int64_t row = 0; row < one.sq; ++row) {
            const int64_t lo = std::max<int64_t>(0, row + seq.diag_lo);
            const int64_t hi = std::min<int64_t>(one.sk - 1, row + seq.diag_hi);
            pairs += hi >= lo ? (double)(hi - lo + 1) * h : 0;
        }
    }
    const double med = median_ms(p);
    char label[64];
    snprintf(label, sizeof(label), "varlen %s causal=%d", random_lengths ? "1..2 seq" : "equal", causal);
    printf("bf16 d=%3d seqlen=%5d b=%2d h=%2d %-28s: %8.3f ms  %6.1f TFLOP/s (visible %.3f)\n", d, s, b, h, label, med,
           BWD_FLOPS_PER_PAIR * d * pairs / (med * 1e-3) / 1e12, pairs / ((double)tokens * h * s));
    fflush(stdout);
    for (void *x : {(void *)q, (void *)k, (void *)v, (void *)o, (void *)dout, (void *)dq, (void *)dk, (void *)dv,
                    (void *)lse, (void *)delta, (void *)dqa, (void *)cu_dev})
        CUDA_CHECK(cudaFree(x));
}

static void time_variants(void)
{
    const int s = 8192, b = TIME_TOKENS / s, h = 16;
    const test_cfg dense = make_cfg(FLASH_BF16, b, h, h, s, s, 128, CAUSAL_NONE);
    const test_cfg causal = make_cfg(FLASH_BF16, b, h, h, s, s, 128, CAUSAL_BOTTOM_RIGHT);
    time_variant(dense, "dense");
    time_variant(causal, "causal");
    time_variant(with_window(make_cfg(FLASH_BF16, 1, h, h, 2 * s, 2 * s, 128, CAUSAL_BOTTOM_RIGHT), 4096, -1),
                 "causal window 4096 (s16k)");
    time_variant(with_softcap(dense, 50.f), "softcap 50");
    time_variant(with_softcap(make_cfg(FLASH_BF16, b, 8, 8, s, s, 256, CAUSAL_NONE), 50.f), "softcap 50 (d256)");
    time_variant(with_softcap(make_cfg(FLASH_BF16, b, 32, 32, s, s, 64, CAUSAL_NONE), 50.f), "softcap 50 (d64)");
    time_variant(with_dropout(make_cfg(FLASH_BF16, b, 32, 32, s, s, 64, CAUSAL_NONE), 0.1), "dropout 0.1 (d64)");
    time_variant(with_alibi(make_cfg(FLASH_BF16, b, 8, 8, s, s, 256, CAUSAL_BOTTOM_RIGHT), ALIBI_HEAD),
                 "alibi causal (d256)");
    time_variant(with_alibi(causal, ALIBI_HEAD), "alibi causal");
    time_variant(with_mask(dense, MASK_BOOL, PAT_PADDING, BC_H | BC_Q), "padding mask (bool)");
    time_variant(with_mask(dense, MASK_BOOL, PAT_SPARSE, BC_B | BC_H), "block-sparse 10% (bool)");
    time_variant(with_dropout(dense, 0.1), "dropout 0.1");
    time_variant(with_det(dense), "dense det");
    time_variant(with_det(with_dropout(dense, 0.1)), "dropout 0.1 det");
}

/* ---- main ------------------------------------------------------------------------------------ */

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "test";
    if (!strcmp(mode, "time")) {
        for (int d : {64, 128, 256})
            for (int causal : {0, 1})
                for (int s : {512, 2048, 8192})
                    time_config(d, s, causal, 0);
        for (int causal : {0, 1}) /* deterministic mode (every shape beside the default: timedet) */
            time_config(128, 8192, causal, 1);
        return 0;
    }
    if (!strcmp(mode, "timedet")) { /* deterministic mode beside the default, the same shapes interleaved */
        for (int d : {64, 128, 256})
            for (int causal : {0, 1})
                for (int s : {2048, 8192})
                    for (int det : {0, 1})
                        time_config(d, s, causal, det);
        return 0;
    }
    if (!strcmp(mode, "time1") && argc == 6) { /* time1 d seqlen causal det: one config (for ncu) */
        time_config(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
        return 0;
    }
    if (!strcmp(mode, "timev")) {
        time_variants();
        return 0;
    }
    if (!strcmp(mode, "timevl")) {
        for (int d : {64, 128})
            for (int causal : {0, 1})
                for (int s : {512, 2048, 8192}) {
                    time_config(d, s, causal, 0);
                    time_varlen(d, s, causal, 0);
                    time_varlen(d, s, causal, 1);
                }
        return 0;
    }
    const std::vector<test_cfg> all = !strcmp(mode, "small") ? small_configs() : full_configs();
    const char *only = argc > 2 && strcmp(argv[2], "all") ? argv[2] : NULL; /* dtype filter, e.g. "bf16" */
    const char *filter = argc > 3 ? argv[3] : NULL;                        /* substring of the config line */
    std::vector<test_cfg> cfgs;
    std::vector<uint64_t> seeds;
    for (size_t i = 0; i < all.size(); ++i) {
        if (only && strcmp(only, dtype_name(all[i].dtype)))
            continue;
        if (filter && cfg_name(all[i]).find(filter) == std::string::npos)
            continue;
        cfgs.push_back(all[i]);
        seeds.push_back(i + 1);
    }
    /* references on host threads, a batch at a time; the GPU runs each batch in order */
    const size_t batch = std::max<size_t>(1, std::thread::hardware_concurrency());
    int pass = 0, ran = 0;
    for (size_t first = 0; first < cfgs.size(); first += batch) {
        const size_t n = std::min(batch, cfgs.size() - first);
        std::vector<prepared> prep(n);
        std::vector<std::thread> th;
        for (size_t i = 0; i < n; ++i)
            th.emplace_back([&, i]() {
                if (cfgs[first + i].varlen)
                    prepare_varlen(cfgs[first + i], seeds[first + i], &prep[i]);
                else
                    prepare(cfgs[first + i], seeds[first + i], &prep[i]);
            });
        for (auto &x : th)
            x.join();
        for (size_t i = 0; i < n; ++i) {
            ran++;
            pass += cfgs[first + i].varlen ? run_varlen(cfgs[first + i], prep[i]) : run_test(cfgs[first + i], prep[i]);
        }
    }
    printf("SUMMARY: %d/%d configs passed\n", pass, ran);
    return pass == ran ? 0 : 1;
}
