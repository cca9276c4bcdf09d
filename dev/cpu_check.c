/* cpu_check.c: checks csrc/cpu/flash_cpu.c (fwd: out, lse; bwd: dq, dk, dv, dbias, and the sink
 * gradient formed from its lse and delta) in fp32 and fp64 against the naive double-precision
 * reference dev/attn_ref.h, dense and with every variant (band, softcap, ALiBi, bool / additive
 * attn_mask with broadcast strides, dropout, sinks) alone and in pairs; checks
 * flash_dropout_mask_cpu; checks variable-length batches (cu_seqlens, seqused_k), KV caches
 * (seqused_k, k_batch_idx, k_leftpad, paged with block_table) and paged varlen batches (cu_seqlens with
 * a block_table, forward) sequence by sequence against the reference run on each sequence alone; then
 * (with the argument "bench") times it.
 *
 *   gcc -std=c11 -O2 -fopenmp -Icsrc dev/cpu_check.c csrc/cpu/flash_cpu.c csrc/cpu/amx.c -lm -o /tmp/cpu_check
 *   /tmp/cpu_check            # all checks; exit status 1 on any failure
 *   /tmp/cpu_check bench      # checks, then b1 h8 d64 fp32 timings, dense and with variants: wall
 *                             # time and process CPU time (OMP_NUM_THREADS=1: single-thread time)
 * Add -DFLASH_CPU_TILE_K=2 (and e.g. -DFLASH_CPU_TILE_Q=40: TILE_Q=5 no longer compiles, see flash_cpu.c's
 * static assert on DECODE_KEYS) to run every check with tiny key tiles; the seed case then is exactly scores
 * [0,0 | 10,10], values [0,0 | 1,1] with a key tile of 2.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/flash_cpu.h"
#include "attn_ref.h"

#define TOL_FP32 1e-5
#define TOL_FP64 1e-12
#define SEED_EXPECTED 0.99995460007023751 /* e^10 / (1 + e^10) */
#define SEED_TOL 1e-6
#define LARGE_Q 100.0 /* d = 1, scale 1: scores q * k of magnitude 1e4 */
#define BENCH_REPS 3
#define UNBOUNDED (-1) /* window side without a bound */
#define DROPOUT_SEED 0x243F6A8885A308D3ull
#define DROPOUT_OFFSET 0x13198A2E00000007ull /* high half nonzero: exercises the key's xor */
#define DROPOUT_SIGMAS 6.0                   /* bound on the keep rate's deviation */
#define MASK_PATTERN_BLOCK 64                /* block side of the block-structured masks */
#define EMPTY_ROW_PERIOD 5                   /* rows i % 5 == 2 see no key in the *_EMPTY_ROWS masks */

enum init { INIT_RANDOM, INIT_SEED, INIT_LARGE };
enum causal { NONCAUSAL, CAUSAL_TOP_LEFT, CAUSAL_BOTTOM_RIGHT };
enum mask_type {
    MASK_NONE,
    MASK_BOOL_RANDOM,     /* 70% True */
    MASK_BOOL_BLOCKS,     /* 64 x 64 blocks all False / all True / random */
    MASK_BOOL_PADDING,    /* key j < a per-batch length */
    MASK_BOOL_EMPTY_ROWS, /* random, some rows all False */
    MASK_ADD_RANDOM,      /* values in [-2, 2), 20% -inf */
    MASK_ADD_BLOCKS,      /* 64 x 64 blocks all -inf / all 0 / random */
    MASK_ADD_EMPTY_ROWS,  /* random, some rows all -inf */
};
/* Broadcast dimensions of the mask (stride 0), or-ed. */
enum { BCAST_BATCH = 1, BCAST_HEAD = 2, BCAST_ROW = 4, BCAST_COL = 8 };
enum alibi { ALIBI_NONE, ALIBI_PER_HEAD, ALIBI_PER_BATCH };

typedef struct variant {
    int64_t left, right; /* window sizes, UNBOUNDED or >= 0 (right ignored under causal) */
    float softcap;
    enum alibi alibi;
    enum mask_type mask;
    int bcast;
    double dropout;
    int sink;
} variant;

#define NO_VARIANT ((variant){UNBOUNDED, UNBOUNDED, 0, ALIBI_NONE, MASK_NONE, 0, 0, 0})

typedef struct config {
    int64_t b, h, h_kv, sq, sk, d;
    enum causal causal;
    int strided; /* 1: every tensor is a (b, h, s, d) buffer addressed as (b, s, h, d) */
    enum init init;
    variant v;
} config;

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double uniform(void) /* [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / (double)(1ull << 52) - 1.0;
}

static size_t esize(flash_dtype dt) { return dt == FLASH_FP32 ? sizeof(float) : sizeof(double); }

static double get(const void *data, flash_dtype dt, int64_t i)
{
    return dt == FLASH_FP32 ? ((const float *)data)[i] : ((const double *)data)[i];
}

/* Element i = x rounded to the dtype; returns the rounded value. */
static double set(void *data, flash_dtype dt, int64_t i, double x)
{
    if (dt == FLASH_FP32)
        return ((float *)data)[i] = (float)x;
    return ((double *)data)[i] = x;
}

static void *typed_alloc(int64_t n, flash_dtype dt, double fill)
{
    void *data = malloc((size_t)(n > 0 ? n : 1) * esize(dt));
    for (int64_t i = 0; i < n; i++)
        set(data, dt, i, fill);
    return data;
}

/* A (b, s, heads, d) tensor of the kernel's type (NaN until written) and its strides. */
typedef struct tensor {
    int64_t b, s, heads, d, n;
    void *data;
    flash_strides st;
} tensor;

static void tensor_init(tensor *t, const config *c, int64_t s, int64_t heads, flash_dtype dt)
{
    *t = (tensor){c->b, s, heads, c->d, c->b * s * heads * c->d, NULL, {0, 0, 0}};
    t->data = typed_alloc(t->n, dt, NAN);
    t->st = c->strided ? (flash_strides){heads * s * c->d, c->d, s * c->d}
                       : (flash_strides){s * heads * c->d, heads * c->d, c->d};
}

static int64_t at(const tensor *t, int64_t bi, int64_t si, int64_t hi)
{
    return bi * t->st.batch + si * t->st.row + hi * t->st.head;
}

/* The tensor as contiguous (b, s, heads, d) doubles (what the reference reads and returns). */
static double *contiguous(const tensor *t, flash_dtype dt)
{
    double *out = malloc((size_t)t->n * sizeof(double));
    for (int64_t bi = 0; bi < t->b; bi++)
        for (int64_t si = 0; si < t->s; si++)
            for (int64_t hi = 0; hi < t->heads; hi++)
                for (int64_t x = 0; x < t->d; x++)
                    out[((bi * t->s + si) * t->heads + hi) * t->d + x] = get(t->data, dt, at(t, bi, si, hi) + x);
    return out;
}

/* Accumulates max |got - want| into err[0] and max |want| into err[1] over the n elements
 * (infinities must match exactly); 0 on a NaN or an infinity mismatch, else 1. */
static int accumulate_err(const double *got, const double *want, int64_t n, double err[2])
{
    for (int64_t i = 0; i < n; i++) {
        const double g = got[i];
        if (isnan(g) || isnan(want[i]) || (isinf(want[i]) != isinf(g)) || (isinf(g) && g != want[i]))
            return 0;
        if (!isinf(g)) {
            err[0] = fmax(err[0], fabs(g - want[i]));
            err[1] = fmax(err[1], fabs(want[i]));
        }
    }
    return 1;
}

/* The relative error of accumulated parts (1 when a NaN was met). */
static double err_of(const double err[2], int ok) { return !ok ? 1 : err[1] > 0 ? err[0] / err[1] : err[0]; }

/* max |got - want| / max |want| over the n elements (infinities must match exactly); 1 on a NaN. */
static double rel_err(const double *got, const double *want, int64_t n)
{
    double err[2] = {0, 0};
    const int ok = accumulate_err(got, want, n, err);
    return err_of(err, ok);
}

static double init_value(const config *c, int which, int64_t si)
{
    if (c->init == INIT_SEED) /* q = 1, k = [0 x TILE_K | 10 x TILE_K], v = [0 ... | 1 ...] */
        return which == 0 ? 1 : which == 1 ? (si < FLASH_CPU_TILE_K ? 0 : 10)
                              : which == 2 ? (si < FLASH_CPU_TILE_K ? 0 : 1) : uniform();
    if (c->init == INIT_LARGE) { /* unique max key per row, score gaps >= 370: exact in fp32 */
        if (which == 0)
            return si % 3 == 0 ? LARGE_Q : si % 3 == 1 ? -LARGE_Q : 37;
        if (which == 1)
            return si == 0 ? LARGE_Q : si == 1 ? -LARGE_Q : (double)(si % 181 - 90);
    }
    return 2 * uniform();
}

/* The band fields as the binding sets them (flash.h): window sides (UNBOUNDED is negative), causal
 * band_right = 0, aligned bottom-right except under CAUSAL_TOP_LEFT. */
static void set_band(flash_params *p, enum causal causal, const variant *v)
{
    p->band_left = v->left;
    p->band_right = causal != NONCAUSAL ? 0 : v->right;
    p->band_bottom_right = causal != CAUSAL_TOP_LEFT;
}

/* The score and probability hooks of a varlen / KV-cache case: random ALiBi slopes for b x h (per batch or per
 * head, as var says), var's softcap, h random sinks in dt (*sink; their values in *sink_ref, both to be freed,
 * set in p only with var->sink), and has_hook to match. */
static void set_case_hooks(flash_params *p, const variant *var, float *slopes, int64_t b, int64_t h, flash_dtype dt,
                           void **sink, double **sink_ref)
{
    for (int64_t e = 0; e < b * h; e++)
        slopes[e] = (float)(0.55 + 0.45 * uniform());
    if (var->alibi) {
        p->alibi_slopes = slopes;
        p->alibi_batch_stride = var->alibi == ALIBI_PER_BATCH ? h : 0;
    }
    p->softcap = var->softcap;
    *sink = typed_alloc(h, dt, 0);
    *sink_ref = malloc((size_t)h * sizeof(double));
    for (int64_t hi = 0; hi < h; hi++)
        (*sink_ref)[hi] = set(*sink, dt, hi, 0.5 + 1.5 * uniform());
    if (var->sink)
        p->sink = *sink;
    p->has_hook = p->softcap > 0 || p->alibi_slopes;
}


/* Mask entry (as a bool: 1 = takes part; or additive) at compact position (bi, hi, i, j). */
static double mask_value(const config *c, int64_t bi, int64_t hi, int64_t i, int64_t j)
{
    const int is_bool = c->v.mask <= MASK_BOOL_EMPTY_ROWS;
    const double random = is_bool ? (uniform() > -0.4) : (uniform() < -0.6 ? -INFINITY : 2 * uniform());
    const double none = is_bool ? 0 : -INFINITY, plain = is_bool ? 1 : 0;
    switch (c->v.mask) {
    case MASK_BOOL_BLOCKS:
    case MASK_ADD_BLOCKS: {
        const int64_t kind = (i / MASK_PATTERN_BLOCK * 2 + j / MASK_PATTERN_BLOCK + bi + hi) % 3;
        return kind == 0 ? none : kind == 1 ? plain : random;
    }
    case MASK_BOOL_PADDING:
        return j < c->sk - (c->sk * 2 / 3) * bi % c->sk ? 1 : 0;
    case MASK_BOOL_EMPTY_ROWS:
    case MASK_ADD_EMPTY_ROWS:
        return i % EMPTY_ROW_PERIOD == 2 ? none : random;
    default:
        return random;
    }
}

/* The attn_mask of c in the layout the binding passes: storage of the broadcast shape, strides 0
 * on the broadcast dimensions, block flags (mask.h) of that shape, and the expanded additive
 * (b, h, sq, sk) double mask the reference reads. */
typedef struct mask_data {
    void *data; /* uint8 (bool) or the dtype (additive) */
    uint8_t *blocks;
    flash_strides4 s, blocks_s;
    double *expanded;
} mask_data;

static void mask_init(mask_data *m, const config *c, flash_dtype dt)
{
    const int is_bool = c->v.mask <= MASK_BOOL_EMPTY_ROWS;
    const int64_t mb = c->v.bcast & BCAST_BATCH ? 1 : c->b, mh = c->v.bcast & BCAST_HEAD ? 1 : c->h;
    const int64_t mr = c->v.bcast & BCAST_ROW ? 1 : c->sq, mc = c->v.bcast & BCAST_COL ? 1 : c->sk;
    const int64_t n = mb * mh * mr * mc;
    m->s = (flash_strides4){mb == 1 ? 0 : mh * mr * mc, mh == 1 ? 0 : mr * mc, mr == 1 ? 0 : mc, mc == 1 ? 0 : 1};
    m->data = is_bool ? malloc((size_t)n) : typed_alloc(n, dt, 0);
    for (int64_t e = 0; e < n; e++) {
        const double x = mask_value(c, e / (mh * mr * mc), e / (mr * mc) % mh, e / mc % mr, e % mc);
        if (is_bool)
            ((uint8_t *)m->data)[e] = (uint8_t)x;
        else
            set(m->data, dt, e, x);
    }
    const int64_t nbr = mr == 1 ? 1 : flash_cdiv64(c->sq, FLASH_MASK_BLOCK);
    const int64_t nbc = mc == 1 ? 1 : flash_cdiv64(c->sk, FLASH_MASK_BLOCK);
    m->blocks = calloc((size_t)(mb * mh * nbr * nbc), 1);
    m->blocks_s = (flash_strides4){mb == 1 ? 0 : mh * nbr * nbc, mh == 1 ? 0 : nbr * nbc, nbr == 1 ? 0 : nbc,
                                   nbc == 1 ? 0 : 1};
    m->expanded = malloc((size_t)(c->b * c->h * c->sq * c->sk) * sizeof(double));
    for (int64_t bi = 0; bi < c->b; bi++)
        for (int64_t hi = 0; hi < c->h; hi++)
            for (int64_t i = 0; i < c->sq; i++)
                for (int64_t j = 0; j < c->sk; j++) {
                    const int64_t off = bi * m->s.batch + hi * m->s.head + i * m->s.row + j * m->s.col;
                    const double x = is_bool ? ((uint8_t *)m->data)[off] : get(m->data, dt, off);
                    const int visible = is_bool ? x != 0 : x > -INFINITY, masked = is_bool ? x == 0 : x != 0;
                    m->expanded[((bi * c->h + hi) * c->sq + i) * c->sk + j] = is_bool ? (x != 0 ? 0 : -INFINITY) : x;
                    m->blocks[bi * m->blocks_s.batch + hi * m->blocks_s.head +
                              i / FLASH_MASK_BLOCK * m->blocks_s.row + j / FLASH_MASK_BLOCK * m->blocks_s.col] |=
                        (uint8_t)((visible ? FLASH_MASK_ANY_VISIBLE : 0) | (masked ? FLASH_MASK_ANY_MASKED : 0));
                }
}

static void variant_name(const config *c, char *buf, size_t n)
{
    static const char *masks[] = {"", "bool", "bool-blocks", "bool-padding", "bool-emptyrows",
                                  "add", "add-blocks", "add-emptyrows"};
    const variant *v = &c->v;
    int w = snprintf(buf, n, "%s", c->causal == NONCAUSAL ? "" : c->causal == CAUSAL_TOP_LEFT ? "causal-tl "
                                                                                               : "causal-br ");
    if (v->left != UNBOUNDED || (v->right != UNBOUNDED && c->causal == NONCAUSAL))
        w += snprintf(buf + w, n - w, "win(%lld,%lld) ", (long long)v->left, (long long)v->right);
    if (v->softcap > 0)
        w += snprintf(buf + w, n - w, "softcap%g ", v->softcap);
    if (v->alibi)
        w += snprintf(buf + w, n - w, "alibi%s ", v->alibi == ALIBI_PER_BATCH ? "(b,h)" : "(h)");
    if (v->mask)
        w += snprintf(buf + w, n - w, "mask-%s%s%s%s%s ", masks[v->mask], v->bcast & BCAST_BATCH ? " b0" : "",
                      v->bcast & BCAST_HEAD ? " h0" : "", v->bcast & BCAST_ROW ? " r0" : "", v->bcast & BCAST_COL ? " c0" : "");
    if (v->dropout > 0)
        w += snprintf(buf + w, n - w, "dropout%g ", v->dropout);
    if (v->sink)
        snprintf(buf + w, n - w, "sink ");
}

static int run_case(const config *c, flash_dtype dt, const char *what)
{
    const double scale = c->init == INIT_RANDOM ? 1 / sqrt((double)c->d) : 1;
    const variant *var = &c->v;
    tensor q, k, v, dout, o, dq, dk, dv;
    tensor_init(&q, c, c->sq, c->h, dt);
    tensor_init(&k, c, c->sk, c->h_kv, dt);
    tensor_init(&v, c, c->sk, c->h_kv, dt);
    tensor_init(&dout, c, c->sq, c->h, dt);
    tensor_init(&o, c, c->sq, c->h, dt);
    tensor_init(&dq, c, c->sq, c->h, dt);
    tensor_init(&dk, c, c->sk, c->h_kv, dt);
    tensor_init(&dv, c, c->sk, c->h_kv, dt);
    tensor *inputs[4] = {&q, &k, &v, &dout};
    for (int w = 0; w < 4; w++)
        for (int64_t bi = 0; bi < c->b; bi++)
            for (int64_t si = 0; si < inputs[w]->s; si++)
                for (int64_t hi = 0; hi < inputs[w]->heads; hi++)
                    for (int64_t x = 0; x < c->d; x++)
                        set(inputs[w]->data, dt, at(inputs[w], bi, si, hi) + x, init_value(c, w, si));
    const int64_t n_rows = c->b * c->h * c->sq, n_scores = n_rows * c->sk;
    void *lse = typed_alloc(n_rows, dt, NAN), *delta = typed_alloc(n_rows, dt, NAN);
    flash_params p = {
        .q = q.data, .k = k.data, .v = v.data, .o = o.data, .lse = lse, .dout = dout.data,
        .dq = dq.data, .dk = dk.data, .dv = dv.data, .delta = delta,
        .q_s = q.st, .k_s = k.st, .v_s = v.st, .o_s = o.st, .do_s = dout.st, .dq_s = dq.st,
        .dk_s = dk.st, .dv_s = dv.st, .b = c->b, .h = c->h, .h_kv = c->h_kv, .sq = c->sq,
        .sk = c->sk, .d = c->d, .d_v = c->d, .h_per_kv = c->h / c->h_kv, .scale = scale, .dtype = dt,
        .lse_batch = c->h * c->sq, .lse_head = c->sq,
    };
    set_band(&p, c->causal, var);

    /* variants */
    float *slopes = malloc((size_t)(c->b * c->h) * sizeof(float));
    for (int64_t e = 0; e < c->b * c->h; e++)
        slopes[e] = (float)(0.55 + 0.45 * uniform());
    if (var->alibi) {
        p.alibi_slopes = slopes;
        p.alibi_batch_stride = var->alibi == ALIBI_PER_BATCH ? c->h : 0;
    }
    p.softcap = var->softcap;
    mask_data mask = {NULL, NULL, {0, 0, 0, 0}, {0, 0, 0, 0}, NULL};
    void *dbias = NULL;
    if (var->mask) {
        mask_init(&mask, c, dt);
        p.mask = mask.data;
        p.mask_kind = var->mask <= MASK_BOOL_EMPTY_ROWS ? FLASH_MASK_BOOL : FLASH_MASK_ADD;
        p.mask_s = mask.s;
        p.mask_blocks = mask.blocks;
        p.mask_blocks_s = mask.blocks_s;
        if (p.mask_kind == FLASH_MASK_ADD)
            p.dbias = dbias = typed_alloc(n_scores, dt, 0);
    }
    void *sink = typed_alloc(c->h, dt, 0);
    double *sink_ref = malloc((size_t)c->h * sizeof(double));
    for (int64_t hi = 0; hi < c->h; hi++)
        sink_ref[hi] = set(sink, dt, hi, 0.5 + 1.5 * uniform());
    if (var->sink)
        p.sink = sink;
    if (var->dropout > 0) {
        flash_dropout_set(&p, var->dropout);
        p.philox_seed = DROPOUT_SEED;
        p.philox_offset = DROPOUT_OFFSET;
    }
    p.has_hook = p.softcap > 0 || p.alibi_slopes || p.mask || p.dropout_threshold;

    int fail = flash_fwd_cpu(&p) != FLASH_CPU_OK || flash_bwd_cpu(&p) != FLASH_CPU_OK;

    double *qr = contiguous(&q, dt), *kr = contiguous(&k, dt), *vr = contiguous(&v, dt);
    double *dor = contiguous(&dout, dt);
    double *o_ref = malloc((size_t)o.n * sizeof(double)), *lse_ref = malloc((size_t)n_rows * sizeof(double));
    double *dq_ref = malloc((size_t)dq.n * sizeof(double)), *dk_ref = malloc((size_t)dk.n * sizeof(double));
    double *dv_ref = malloc((size_t)dv.n * sizeof(double));
    double *dbias_ref = dbias ? malloc((size_t)n_scores * sizeof(double)) : NULL;
    double *dsink_ref = malloc((size_t)c->h * sizeof(double));
    const double *sink_arg = var->sink ? sink_ref : NULL;
    ref_forward(&p, qr, kr, vr, mask.expanded, sink_arg, o_ref, lse_ref);
    ref_backward(&p, qr, kr, vr, mask.expanded, sink_arg, dor, dq_ref, dk_ref, dv_ref, dbias_ref,
                 var->sink ? dsink_ref : NULL);

    double *og = contiguous(&o, dt), *dqg = contiguous(&dq, dt), *dkg = contiguous(&dk, dt);
    double *dvg = contiguous(&dv, dt), *lseg = malloc((size_t)n_rows * sizeof(double));
    for (int64_t r = 0; r < n_rows; r++)
        lseg[r] = get(lse, dt, r);
    double err[7] = {rel_err(og, o_ref, o.n), rel_err(lseg, lse_ref, n_rows), rel_err(dqg, dq_ref, dq.n),
                     rel_err(dkg, dk_ref, dk.n), rel_err(dvg, dv_ref, dv.n), 0, 0};
    if (dbias) {
        double *dbg = malloc((size_t)n_scores * sizeof(double));
        for (int64_t e = 0; e < n_scores; e++)
            dbg[e] = get(dbias, dt, e);
        err[5] = rel_err(dbg, dbias_ref, n_scores);
        free(dbg);
    }
    if (var->sink) { /* the binding's formula: dsink[h] = -sum_{b, i} exp(sink - lse) * delta */
        double *dsink = calloc((size_t)c->h, sizeof(double));
        for (int64_t r = 0; r < n_rows; r++)
            dsink[r / c->sq % c->h] -= exp(sink_ref[r / c->sq % c->h] - get(lse, dt, r)) * get(delta, dt, r);
        err[6] = rel_err(dsink, dsink_ref, c->h);
        free(dsink);
    }
    const double tol = dt == FLASH_FP32 ? TOL_FP32 : TOL_FP64;
    /* The seed case checks the forward; its gradients are ill-conditioned (dP - delta cancels to
     * ~5e-5 of dP, amplifying rounding ~2e4x) and need only be finite. */
    double worst = 0;
    for (int e = 0; e < 7; e++)
        worst = fmax(worst, c->init == INIT_SEED && e >= 2 ? (err[e] < 1 ? 0 : err[e]) : err[e]);
    fail |= !(worst <= tol);
    if (c->init == INIT_SEED)
        fail |= !(fabs(get(o.data, dt, 0) - SEED_EXPECTED) < SEED_TOL);
    int64_t empty_rows = 0; /* rows that see no key: out and dq exactly 0 */
    for (int64_t r = 0; r < n_rows; r++) {
        const int64_t bi = r / (c->h * c->sq), hq = r / c->sq % c->h, i = r % c->sq;
        const flash_seq seq = flash_seq_of(&p, bi);
        int64_t seen = 0;
        for (int64_t j = 0; j < c->sk; j++)
            seen += flash_visible(&seq, i, j) && (!mask.expanded || mask.expanded[r * c->sk + j] > -INFINITY);
        if (seen)
            continue;
        empty_rows++;
        for (int64_t x = 0; x < c->d; x++)
            fail |= get(o.data, dt, at(&o, bi, i, hq) + x) != 0 || get(dq.data, dt, at(&dq, bi, i, hq) + x) != 0;
    }
    char note[64] = "", name[160];
    variant_name(c, name, sizeof name);
    if (empty_rows)
        snprintf(note, sizeof note, " [%lld rows see no key]", (long long)empty_rows);
    printf("%s %s b%lld h%lld/%lld sq%lld sk%lld d%lld %s%s: out %.1e lse %.1e dq %.1e dk %.1e dv %.1e",
           fail ? "FAIL" : "ok  ", dt == FLASH_FP32 ? "fp32" : "fp64", (long long)c->b, (long long)c->h,
           (long long)c->h_kv, (long long)c->sq, (long long)c->sk, (long long)c->d, name, what, err[0], err[1],
           err[2], err[3], err[4]);
    if (dbias)
        printf(" dbias %.1e", err[5]);
    if (var->sink)
        printf(" dsink %.1e", err[6]);
    printf("%s\n", note);

    tensor *all[8] = {&q, &k, &v, &dout, &o, &dq, &dk, &dv};
    for (int w = 0; w < 8; w++)
        free(all[w]->data);
    double *refs[] = {qr, kr, vr, dor, o_ref, lse_ref, dq_ref, dk_ref, dv_ref, dbias_ref, dsink_ref,
                      og, dqg, dkg, dvg, lseg, sink_ref, mask.expanded};
    for (size_t e = 0; e < sizeof refs / sizeof *refs; e++)
        free(refs[e]);
    free(mask.data);
    free(mask.blocks);
    free(dbias);
    free(sink);
    free(slopes);
    free(lse);
    free(delta);
    return fail;
}

/* flash_dropout_mask_cpu: equal to flash_dropout_keep everywhere, its keep rate 1 - p within
 * DROPOUT_SIGMAS standard deviations (p = 0.1234567: no short binary expansion, the 32-bit threshold
 * round(p 2^32) keeps 1 - p to within 2^-33), all ones without dropout, all zeros at p = 1, different for
 * another seed. */
static int check_dropout_mask(void)
{
    const int64_t b = 2, h = 3, sq = 67, sk = 301, n = b * h * sq * sk;
    const double drop = 0.1234567;
    flash_params p = {.b = b, .h = h, .sq = sq, .sk = sk, .philox_seed = DROPOUT_SEED, .philox_offset = DROPOUT_OFFSET};
    uint8_t *keep = malloc((size_t)n), *other = malloc((size_t)n);
    int fail = flash_dropout_mask_cpu(&p, keep) != FLASH_CPU_OK;
    for (int64_t e = 0; e < n; e++)
        fail |= keep[e] != 1;
    flash_dropout_set(&p, 1.0);
    fail |= p.dropout_scale != 0 || flash_dropout_mask_cpu(&p, keep) != FLASH_CPU_OK;
    int64_t kept_at_one = 0;
    for (int64_t e = 0; e < n; e++)
        kept_at_one += keep[e];
    flash_dropout_set(&p, drop);
    fail |= p.dropout_scale != 1.0 / (1.0 - drop) || flash_dropout_mask_cpu(&p, keep) != FLASH_CPU_OK;
    int64_t kept = 0, mismatches = 0, differ = 0;
    for (int64_t e = 0; e < n; e++) {
        kept += keep[e];
        mismatches += keep[e] != flash_dropout_keep(&p, e / (sq * sk), e / sk % sq, e % sk);
    }
    p.philox_seed++;
    fail |= flash_dropout_mask_cpu(&p, other) != FLASH_CPU_OK;
    for (int64_t e = 0; e < n; e++)
        differ += keep[e] != other[e];
    const double keep_p = 1 - drop, rate = (double)kept / (double)n;
    const double sigma = sqrt(keep_p * (1 - keep_p) / (double)n);
    fail |= mismatches != 0 || fabs(rate - keep_p) > DROPOUT_SIGMAS * sigma || differ == 0 || kept_at_one != 0;
    printf("%s dropout mask b%lld h%lld sq%lld sk%lld p %.7f: keep rate %.5f (expected %.5f, sigma %.1e), "
           "%lld mismatches with flash_dropout_keep, %lld differ for seed + 1, %lld kept at p = 1\n",
           fail ? "FAIL" : "ok  ", (long long)b, (long long)h, (long long)sq, (long long)sk, drop, rate, keep_p, sigma,
           (long long)mismatches, (long long)differ, (long long)kept_at_one);
    free(keep);
    free(other);
    return fail;
}

/* b1 h8 d64 fp32 timing of one configuration: the band (window sides left, right; UNBOUNDED or >= 0,
 * aligned bottom-right) and the variant fields of extra. */
static void bench(int64_t s, int64_t left, int64_t right, const flash_params *extra, const char *what)
{
    const int64_t h = 8, d = 64, n = s * h * d;
    float *buf = malloc((size_t)(8 * n + 2 * s * h) * sizeof(float));
    for (int64_t i = 0; i < 8 * n + 2 * s * h; i++)
        buf[i] = (float)uniform();
    const flash_strides st = {s * h * d, h * d, d};
    flash_params p = *extra;
    p.q = buf, p.k = buf + n, p.v = buf + 2 * n, p.o = buf + 3 * n, p.dout = buf + 4 * n;
    p.dq = buf + 5 * n, p.dk = buf + 6 * n, p.dv = buf + 7 * n, p.lse = buf + 8 * n, p.delta = buf + 8 * n + s * h;
    p.q_s = p.k_s = p.v_s = p.o_s = p.do_s = p.dq_s = p.dk_s = p.dv_s = st;
    p.b = 1, p.h = h, p.h_kv = h, p.h_per_kv = 1, p.sq = s, p.sk = s, p.d = d, p.d_v = d, p.scale = 1 / sqrt((double)d);
    p.lse_batch = h * s, p.lse_head = s, p.dtype = FLASH_FP32;
    p.band_left = left, p.band_right = right, p.band_bottom_right = 1;
    const flash_seq seq = flash_seq_of(&p, 0);
    double best_fwd = INFINITY, best_bwd = INFINITY, cpu_fwd = INFINITY, cpu_bwd = INFINITY;
    for (int r = 0; r < BENCH_REPS; r++) {
        const double t0 = omp_get_wtime();
        const clock_t c0 = clock();
        flash_fwd_cpu(&p);
        const double t1 = omp_get_wtime();
        const clock_t c1 = clock();
        flash_bwd_cpu(&p);
        const double t2 = omp_get_wtime();
        const clock_t c2 = clock();
        best_fwd = fmin(best_fwd, t1 - t0);
        best_bwd = fmin(best_bwd, t2 - t1);
        cpu_fwd = fmin(cpu_fwd, (double)(c1 - c0) / CLOCKS_PER_SEC);
        cpu_bwd = fmin(cpu_bwd, (double)(c2 - c1) / CLOCKS_PER_SEC);
    }
    double visible = 0; /* (query, key) pairs in the band */
    for (int64_t i = 0; i < s; i++)
        visible += (double)(flash_min64(s - 1, i + seq.diag_hi) - flash_max64(0, i + seq.diag_lo) + 1);
    const double flop = 4.0 * h * visible * d;
    printf("bench b1 h8 s%lld d64 fp32 %s: fwd %.1f ms (%.0f GFLOP/s, cpu %.1f ms)  bwd %.1f ms (%.0f GFLOP/s, "
           "cpu %.1f ms)\n", (long long)s, what, best_fwd * 1e3, flop / best_fwd * 1e-9, cpu_fwd * 1e3,
           best_bwd * 1e3, 2.5 * flop / best_bwd * 1e-9, cpu_bwd * 1e3);
    free(buf);
}

static void bench_all(void)
{
    const flash_params none = {0};
    for (int64_t s = 1024; s <= 8192; s *= 2) {
        bench(s, UNBOUNDED, UNBOUNDED, &none, "dense");
        bench(s, UNBOUNDED, 0, &none, "causal");
    }
    const int64_t s = 2048, window = 256;
    bench(s, window, 0, &none, "causal window 256");
    flash_params v = none;
    v.has_hook = 1, v.softcap = 30;
    bench(s, UNBOUNDED, UNBOUNDED, &v, "softcap");
    static float slopes[8] = {0.5f, 0.25f, 0.125f, 0.0625f, 0.03125f, 0.015625f, 0.0078125f, 0.00390625f};
    v = none, v.has_hook = 1, v.alibi_slopes = slopes;
    bench(s, UNBOUNDED, 0, &v, "causal alibi");
    v = none, v.has_hook = 1;
    flash_dropout_set(&v, 0.1);
    bench(s, UNBOUNDED, UNBOUNDED, &v, "dropout 0.1");
    static const float sink[8] = {0};
    v = none, v.sink = sink;
    bench(s, UNBOUNDED, 0, &v, "causal sink");
}

/* Variant cases: each variant alone, pairs, every one at once, over tails, GQA, both alignments. */
static int variant_cases(config *cases, const char **names)
{
    const variant none = NO_VARIANT;
    variant w = none, sc = none, al = none, alb = none, dr = none, sk = none;
    w.left = 17, w.right = 5;
    sc.softcap = 1.5f;
    al.alibi = ALIBI_PER_HEAD;
    alb.alibi = ALIBI_PER_BATCH;
    dr.dropout = 0.2;
    sk.sink = 1;
    int n = 0;
#define ADD(name_, b_, h_, hkv_, sq_, sk_, d_, causal_, strided_, var_)                                  \
    do {                                                                                               \
        names[n] = name_;                                                                              \
        cases[n++] = (config){b_, h_, hkv_, sq_, sk_, d_, causal_, strided_, INIT_RANDOM, var_};         \
    } while (0)
    /* windows: both sides, one side, a zero width, with causal, rows outside the keys */
    static const int64_t windows[][2] = {{17, 5}, {0, 0}, {40, UNBOUNDED}, {UNBOUNDED, 3}, {3, 70}, {200, 0}};
    for (size_t i = 0; i < sizeof windows / sizeof *windows; i++) {
        variant x = none;
        x.left = windows[i][0], x.right = windows[i][1];
        ADD("window", 1, 2, 1, 130, 257, 64, NONCAUSAL, 0, x);
        ADD("window", 1, 2, 2, 257, 65, 64, NONCAUSAL, 0, x);
    }
    variant wc = none;
    wc.left = 30;
    ADD("window", 2, 2, 1, 200, 131, 64, CAUSAL_BOTTOM_RIGHT, 0, wc);
    ADD("window", 2, 2, 1, 131, 200, 64, CAUSAL_TOP_LEFT, 0, wc);
    /* softcap, ALiBi, sinks, dropout alone */
    ADD("softcap", 1, 2, 1, 130, 257, 64, NONCAUSAL, 0, sc);
    ADD("softcap", 2, 4, 2, 65, 130, 80, CAUSAL_BOTTOM_RIGHT, 1, sc);
    ADD("alibi", 2, 4, 2, 130, 65, 64, CAUSAL_BOTTOM_RIGHT, 0, al);
    ADD("alibi", 2, 4, 4, 63, 257, 64, NONCAUSAL, 0, alb);
    ADD("sink", 2, 4, 2, 130, 65, 64, CAUSAL_BOTTOM_RIGHT, 0, sk);
    ADD("sink", 1, 3, 1, 65, 130, 32, NONCAUSAL, 0, sk);
    ADD("dropout", 2, 2, 1, 130, 257, 64, NONCAUSAL, 0, dr);
    ADD("dropout", 1, 4, 2, 257, 130, 64, CAUSAL_TOP_LEFT, 1, dr);
    variant dx = none;
    dx.dropout = 0.1234567; /* no short binary expansion: the 32-bit threshold and the scale of p itself */
    ADD("dropout", 1, 2, 1, 130, 257, 64, NONCAUSAL, 0, dx);
    dx.dropout = 1, dx.sink = 1; /* nothing kept: out and every gradient 0 */
    ADD("dropout", 1, 2, 2, 65, 130, 64, CAUSAL_BOTTOM_RIGHT, 0, dx);
    /* masks: every kind, broadcast strides, rows fully masked */
    static const struct {
        enum mask_type type;
        int bcast;
    } masks[] = {{MASK_BOOL_RANDOM, 0}, {MASK_BOOL_RANDOM, BCAST_BATCH | BCAST_HEAD},
                 {MASK_BOOL_BLOCKS, 0}, {MASK_BOOL_PADDING, BCAST_HEAD | BCAST_ROW},
                 {MASK_BOOL_EMPTY_ROWS, BCAST_HEAD}, {MASK_BOOL_EMPTY_ROWS, BCAST_HEAD | BCAST_COL},
                 {MASK_ADD_RANDOM, 0}, {MASK_ADD_RANDOM, BCAST_BATCH}, {MASK_ADD_RANDOM, BCAST_ROW},
                 {MASK_ADD_BLOCKS, 0}, {MASK_ADD_BLOCKS, BCAST_HEAD}, {MASK_ADD_EMPTY_ROWS, 0}};
    for (size_t i = 0; i < sizeof masks / sizeof *masks; i++) {
        variant x = none;
        x.mask = masks[i].type, x.bcast = masks[i].bcast;
        ADD("mask", 2, 2, 1, 257, 300, 64, NONCAUSAL, 0, x);
        ADD("mask", 2, 4, 2, 65, 31, 64, NONCAUSAL, 1, x);
    }
    variant mb = none;
    mb.mask = MASK_ADD_BLOCKS;
    ADD("mask", 2, 2, 1, 257, 300, 64, CAUSAL_BOTTOM_RIGHT, 0, mb);
    ADD("mask", 2, 2, 1, 300, 257, 64, CAUSAL_TOP_LEFT, 0, mb);
    /* pairs */
    variant x;
    x = w, x.softcap = sc.softcap;
    ADD("window+softcap", 1, 2, 1, 130, 257, 64, NONCAUSAL, 0, x);
    x = w, x.alibi = ALIBI_PER_HEAD;
    ADD("window+alibi", 2, 2, 1, 257, 130, 64, NONCAUSAL, 0, x);
    x = dr, x.mask = MASK_ADD_RANDOM;
    ADD("mask+dropout", 2, 2, 2, 130, 257, 64, NONCAUSAL, 0, x);
    x = dr, x.mask = MASK_BOOL_PADDING, x.bcast = BCAST_HEAD | BCAST_ROW;
    ADD("mask+dropout", 2, 4, 1, 257, 130, 64, NONCAUSAL, 1, x);
    x = w, x.sink = 1;
    ADD("sink+window", 2, 2, 1, 130, 257, 64, NONCAUSAL, 0, x);
    x = wc, x.sink = 1;
    ADD("sink+window", 1, 2, 1, 257, 130, 64, CAUSAL_BOTTOM_RIGHT, 0, x);
    x = sc, x.alibi = ALIBI_PER_BATCH;
    ADD("softcap+alibi", 2, 2, 1, 130, 130, 64, CAUSAL_BOTTOM_RIGHT, 0, x);
    x = sc, x.dropout = dr.dropout;
    ADD("softcap+dropout", 1, 2, 1, 130, 257, 64, NONCAUSAL, 0, x);
    x = sk, x.mask = MASK_ADD_EMPTY_ROWS;
    ADD("mask+sink", 2, 2, 1, 130, 65, 64, NONCAUSAL, 0, x);
    x = w, x.dropout = dr.dropout;
    ADD("window+dropout", 1, 2, 2, 257, 257, 64, NONCAUSAL, 0, x);
    x = sc, x.mask = MASK_ADD_BLOCKS;
    ADD("softcap+mask", 2, 2, 1, 257, 300, 64, NONCAUSAL, 0, x);
    x = al, x.mask = MASK_BOOL_EMPTY_ROWS;
    ADD("alibi+mask", 2, 2, 1, 130, 257, 64, CAUSAL_BOTTOM_RIGHT, 0, x);
    /* everything at once, GQA, tails, strides, odd head dims */
    x = w, x.softcap = 2.5f, x.alibi = ALIBI_PER_BATCH, x.mask = MASK_ADD_RANDOM, x.bcast = BCAST_HEAD;
    x.dropout = 0.3, x.sink = 1;
    ADD("all", 2, 4, 2, 130, 257, 64, NONCAUSAL, 1, x);
    ADD("all", 2, 4, 1, 257, 63, 3, NONCAUSAL, 0, x);
    x.left = 11, x.mask = MASK_BOOL_EMPTY_ROWS;
    ADD("all", 2, 4, 4, 65, 130, 96, CAUSAL_BOTTOM_RIGHT, 0, x);
    ADD("all", 1, 2, 1, 7, 1, 64, CAUSAL_TOP_LEFT, 0, x);
#undef ADD
    return n;
}

/* ---------------------------------------------------------------------------------------------- */
/* Variable-length batches                                                                         */
/* ---------------------------------------------------------------------------------------------- */

#define VARLEN_MAX_SEQS 8
#define VARLEN_RANDOM_CASES 6
#define VARLEN_RANDOM_MAX_LEN 200
#define VARLEN_NO_SEQUSED (-1) /* used[] entry: the sequence uses all its keys */

/* A packed batch: sequence s has lq[s] query rows and lk[s] key rows (of which it uses used[s] when
 * has_used), back to back from row 0; pad_q / pad_k rows of no sequence follow. strided: the buffers
 * are (heads, rows, d) addressed as (rows, heads, d). No attn_mask, no dropout (attn_ref.h counts
 * dropout by batch index; tests/test_varlen_ops.py checks varlen dropout against the dense op). */
typedef struct varlen_config {
    int64_t nseq, lq[VARLEN_MAX_SEQS], lk[VARLEN_MAX_SEQS], used[VARLEN_MAX_SEQS];
    int has_used;
    int64_t h, h_kv, d, pad_q, pad_k;
    int64_t extra_max; /* max_seqlen_q / _k exceed the longest sequence by this */
    enum causal causal;
    int strided;
    variant v;
} varlen_config;

/* A packed (rows, heads, d) tensor of the kernel's type, NaN until written. */
static tensor packed_init(int64_t rows, int64_t heads, int64_t d, int strided, flash_dtype dt)
{
    tensor t = {1, rows, heads, d, rows * heads * d, NULL, {0, 0, 0}};
    t.data = typed_alloc(t.n, dt, NAN);
    t.st = strided ? (flash_strides){0, d, rows * d} : (flash_strides){0, heads * d, d};
    return t;
}

/* Every element of the n tensors ts uniform on [-2, 2) (the random inputs of the varlen and KV-cache checks). */
static void fill_uniform(tensor *const *ts, int n, flash_dtype dt)
{
    for (int w = 0; w < n; w++)
        for (int64_t bi = 0; bi < ts[w]->b; bi++)
            for (int64_t r = 0; r < ts[w]->s; r++)
                for (int64_t hi = 0; hi < ts[w]->heads; hi++)
                    for (int64_t x = 0; x < ts[w]->d; x++)
                        set(ts[w]->data, dt, at(ts[w], bi, r, hi) + x, 2 * uniform());
}

/* Rows [r0, r0 + n) of a packed tensor as contiguous (n, heads, d) doubles. */
static double *packed_rows(const tensor *t, flash_dtype dt, int64_t r0, int64_t n)
{
    double *out = malloc((size_t)(n * t->heads * t->d + 1) * sizeof(double));
    for (int64_t r = 0; r < n; r++)
        for (int64_t hi = 0; hi < t->heads; hi++)
            for (int64_t x = 0; x < t->d; x++)
                out[(r * t->heads + hi) * t->d + x] = get(t->data, dt, at(t, 0, r0 + r, hi) + x);
    return out;
}

/* 1 unless every element of rows [r0, r0 + n) of t is NaN (never written). */
static int rows_written(const tensor *t, flash_dtype dt, int64_t r0, int64_t n)
{
    for (int64_t r = r0; r < r0 + n; r++)
        for (int64_t hi = 0; hi < t->heads; hi++)
            for (int64_t x = 0; x < t->d; x++)
                if (!isnan(get(t->data, dt, at(t, 0, r, hi) + x)))
                    return 1;
    return 0;
}

static void print_lengths(char *buf, size_t n, const char *label, const int64_t *len, int64_t count)
{
    int w = snprintf(buf, n, "%s[", label);
    for (int64_t s = 0; s < count && (size_t)w < n; s++)
        w += snprintf(buf + w, n - w, "%s%lld", s ? "," : "", (long long)len[s]);
    if ((size_t)w < n)
        snprintf(buf + w, n - w, "] ");
}

/* Runs flash_fwd_cpu / flash_bwd_cpu on the packed batch and checks each sequence against
 * attn_ref.h run on that sequence alone (a dense batch of one; errors relative to the largest
 * reference value of the whole batch, as for dense batches); checks that rows of no sequence and
 * keys past seqused_k are never written, and that rows which see no key get exact zeros. */
static int run_varlen_case(const varlen_config *c, flash_dtype dt)
{
    const double scale = 1 / sqrt((double)c->d);
    const variant *var = &c->v;
    int32_t cu_q[VARLEN_MAX_SEQS + 1] = {0}, cu_k[VARLEN_MAX_SEQS + 1] = {0}, used[VARLEN_MAX_SEQS];
    int64_t max_q = 0, max_k = 0, sk_eff[VARLEN_MAX_SEQS];
    for (int64_t s = 0; s < c->nseq; s++) {
        cu_q[s + 1] = cu_q[s] + (int32_t)c->lq[s];
        cu_k[s + 1] = cu_k[s] + (int32_t)c->lk[s];
        used[s] = (int32_t)(c->has_used && c->used[s] != VARLEN_NO_SEQUSED ? c->used[s] : c->lk[s]);
        sk_eff[s] = used[s] < c->lk[s] ? used[s] : c->lk[s];
        max_q = flash_max64(max_q, c->lq[s]);
        max_k = flash_max64(max_k, c->lk[s]);
    }
    const int64_t total_q = cu_q[c->nseq] + c->pad_q, total_k = cu_k[c->nseq] + c->pad_k;
    const int64_t h = c->h, hk = c->h_kv, d = c->d;
    tensor q = packed_init(total_q, h, d, c->strided, dt), dout = packed_init(total_q, h, d, c->strided, dt);
    tensor o = packed_init(total_q, h, d, c->strided, dt), dq = packed_init(total_q, h, d, c->strided, dt);
    tensor k = packed_init(total_k, hk, d, c->strided, dt), v = packed_init(total_k, hk, d, c->strided, dt);
    tensor dk = packed_init(total_k, hk, d, c->strided, dt), dv = packed_init(total_k, hk, d, c->strided, dt);
    tensor *inputs[4] = {&q, &k, &v, &dout};
    fill_uniform(inputs, 4, dt);
    const int64_t n_rows = c->h * total_q;
    void *lse = typed_alloc(n_rows, dt, NAN), *delta = typed_alloc(n_rows, dt, NAN);
    flash_params p = {
        .q = q.data, .k = k.data, .v = v.data, .o = o.data, .lse = lse, .dout = dout.data,
        .dq = dq.data, .dk = dk.data, .dv = dv.data, .delta = delta,
        .q_s = q.st, .k_s = k.st, .v_s = v.st, .o_s = o.st, .do_s = dout.st, .dq_s = dq.st,
        .dk_s = dk.st, .dv_s = dv.st, .b = c->nseq, .h = c->h, .h_kv = c->h_kv, .sq = max_q + c->extra_max,
        .sk = max_k + c->extra_max, .d = c->d, .d_v = c->d, .h_per_kv = c->h / c->h_kv, .scale = scale, .dtype = dt,
        .lse_batch = 0, .lse_head = total_q, .cu_seqlens_q = cu_q, .cu_seqlens_k = cu_k,
        .seqused_k = c->has_used ? used : NULL, .total_q = total_q, .total_k = total_k,
    };
    set_band(&p, c->causal, var);
    float slopes[VARLEN_MAX_SEQS * 8];
    void *sink;
    double *sink_ref;
    set_case_hooks(&p, var, slopes, c->nseq, c->h, dt, &sink, &sink_ref);

    int fail = flash_fwd_cpu(&p) != FLASH_CPU_OK || flash_bwd_cpu(&p) != FLASH_CPU_OK;

    double err[6] = {0}, parts[5][2] = {{0}};
    int ok[5] = {1, 1, 1, 1, 1};
    double *dsink = calloc((size_t)c->h, sizeof(double)), *dsink_ref = calloc((size_t)c->h, sizeof(double));
    int64_t empty_rows = 0;
    for (int64_t s = 0; s < c->nseq; s++) {
        const int64_t sq = c->lq[s], sk = sk_eff[s], q0 = cu_q[s], k0 = cu_k[s];
        flash_params r = {.b = 1, .h = c->h, .h_kv = c->h_kv, .sq = sq, .sk = sk, .d = c->d, .d_v = c->d,
                          .scale = scale,
                          .band_left = p.band_left, .band_right = p.band_right,
                          .band_bottom_right = p.band_bottom_right, .softcap = p.softcap};
        if (var->alibi)
            r.alibi_slopes = slopes + s * p.alibi_batch_stride;
        double *qr = packed_rows(&q, dt, q0, sq), *kr = packed_rows(&k, dt, k0, sk);
        double *vr = packed_rows(&v, dt, k0, sk), *dor = packed_rows(&dout, dt, q0, sq);
        double *og = packed_rows(&o, dt, q0, sq), *dqg = packed_rows(&dq, dt, q0, sq);
        double *dkg = packed_rows(&dk, dt, k0, sk), *dvg = packed_rows(&dv, dt, k0, sk);
        double *o_ref = malloc((size_t)(sq * c->h * c->d + 1) * sizeof(double));
        double *dq_ref = malloc((size_t)(sq * c->h * c->d + 1) * sizeof(double));
        double *dk_ref = malloc((size_t)(sk * c->h_kv * c->d + 1) * sizeof(double));
        double *dv_ref = malloc((size_t)(sk * c->h_kv * c->d + 1) * sizeof(double));
        double *lse_ref = malloc((size_t)(c->h * sq + 1) * sizeof(double));
        double *lseg = malloc((size_t)(c->h * sq + 1) * sizeof(double));
        double *dsink_seq = calloc((size_t)c->h, sizeof(double));
        const double *sink_arg = var->sink ? sink_ref : NULL;
        ref_forward(&r, qr, kr, vr, NULL, sink_arg, o_ref, lse_ref);
        ref_backward(&r, qr, kr, vr, NULL, sink_arg, dor, dq_ref, dk_ref, dv_ref, NULL, var->sink ? dsink_seq : NULL);
        const flash_seq seq = flash_seq_of(&p, s);
        for (int64_t hq = 0; hq < c->h; hq++) {
            dsink_ref[hq] += dsink_seq[hq];
            for (int64_t i = 0; i < sq; i++) {
                const int64_t e = flash_lse_offset(&p, &seq, s, hq) + i;
                lseg[hq * sq + i] = get(lse, dt, e);
                if (var->sink)
                    dsink[hq] -= exp(sink_ref[hq] - get(lse, dt, e)) * get(delta, dt, e);
            }
        }
        ok[0] &= accumulate_err(og, o_ref, sq * c->h * c->d, parts[0]);
        ok[1] &= accumulate_err(lseg, lse_ref, sq * c->h, parts[1]);
        ok[2] &= accumulate_err(dqg, dq_ref, sq * c->h * c->d, parts[2]);
        ok[3] &= accumulate_err(dkg, dk_ref, sk * c->h_kv * c->d, parts[3]);
        ok[4] &= accumulate_err(dvg, dv_ref, sk * c->h_kv * c->d, parts[4]);
        const flash_seq seq_ref = flash_seq_of(&r, 0);
        for (int64_t i = 0; i < sq; i++) {
            int64_t seen = 0;
            for (int64_t j = 0; j < sk; j++)
                seen += flash_visible(&seq_ref, i, j);
            if (seen)
                continue;
            empty_rows++;
            for (int64_t x = 0; x < c->h * c->d; x++)
                fail |= og[i * c->h * c->d + x] != 0 || dqg[i * c->h * c->d + x] != 0;
        }
        fail |= rows_written(&dk, dt, k0 + sk, c->lk[s] - sk) || rows_written(&dv, dt, k0 + sk, c->lk[s] - sk);
        double *refs[] = {qr, kr, vr, dor, og, dqg, dkg, dvg, o_ref, dq_ref, dk_ref, dv_ref, lse_ref, lseg, dsink_seq};
        for (size_t e = 0; e < sizeof refs / sizeof *refs; e++)
            free(refs[e]);
    }
    for (int e = 0; e < 5; e++)
        err[e] = err_of(parts[e], ok[e]);
    if (var->sink)
        err[5] = rel_err(dsink, dsink_ref, c->h);
    /* rows of no sequence: never written (out, dq, lse; dk, dv past the last sequence) */
    const int64_t end_q = cu_q[c->nseq], end_k = cu_k[c->nseq];
    fail |= rows_written(&o, dt, end_q, c->pad_q) || rows_written(&dq, dt, end_q, c->pad_q);
    fail |= rows_written(&dk, dt, end_k, c->pad_k) || rows_written(&dv, dt, end_k, c->pad_k);
    for (int64_t hq = 0; hq < c->h; hq++)
        for (int64_t i = end_q; i < total_q; i++)
            fail |= !isnan(get(lse, dt, hq * total_q + i));
    const double tol = dt == FLASH_FP32 ? TOL_FP32 : TOL_FP64;
    double worst = 0;
    for (int e = 0; e < 6; e++)
        worst = fmax(worst, err[e]);
    fail |= !(worst <= tol);

    char name[160], lens[3][96], note[64] = "";
    config named = {0};
    named.causal = c->causal, named.v = *var;
    variant_name(&named, name, sizeof name);
    print_lengths(lens[0], sizeof lens[0], "sq", c->lq, c->nseq);
    print_lengths(lens[1], sizeof lens[1], "sk", c->lk, c->nseq);
    lens[2][0] = '\0';
    if (c->has_used)
        print_lengths(lens[2], sizeof lens[2], "used", sk_eff, c->nseq);
    if (empty_rows)
        snprintf(note, sizeof note, " [%lld rows see no key]", (long long)empty_rows);
    printf("%s %s varlen b%lld h%lld/%lld d%lld %s%s%spad %lld/%lld%s %s: out %.1e lse %.1e dq %.1e dk %.1e dv %.1e",
           fail ? "FAIL" : "ok  ", dt == FLASH_FP32 ? "fp32" : "fp64", (long long)c->nseq, (long long)c->h,
           (long long)c->h_kv, (long long)c->d, lens[0], lens[1], lens[2], (long long)c->pad_q, (long long)c->pad_k,
           c->strided ? " strided" : "", name, err[0], err[1], err[2], err[3], err[4]);
    if (var->sink)
        printf(" dsink %.1e", err[5]);
    printf("%s\n", note);

    tensor *all[8] = {&q, &k, &v, &dout, &o, &dq, &dk, &dv};
    for (int w = 0; w < 8; w++)
        free(all[w]->data);
    free(lse);
    free(delta);
    free(sink);
    free(sink_ref);
    free(dsink);
    free(dsink_ref);
    return fail;
}

/* A random length in [0, VARLEN_RANDOM_MAX_LEN], 0 and 1 a quarter of the time each. */
static int64_t random_length(void)
{
    const double u = uniform();
    if (u < -0.5)
        return 0;
    if (u < 0)
        return 1;
    return (int64_t)((uniform() + 1) / 2 * VARLEN_RANDOM_MAX_LEN);
}

/* Varlen cases: length mixes with empty and one-row sequences, sq != sk per sequence, both causal
 * alignments, windows, softcap, ALiBi (per head and per sequence), sinks, GQA, seqused_k, rows of no
 * sequence, strided buffers, max_seqlen beyond the longest sequence, random mixes. */
static int varlen_cases(varlen_config *cases)
{
    const variant none = NO_VARIANT;
    int n = 0;
#define VADD(nseq_, lq_, lk_, h_, hkv_, d_, causal_, var_)                                               \
    do {                                                                                               \
        varlen_config c_ = {0};                                                                        \
        const int64_t lq_init_[] = lq_, lk_init_[] = lk_;                                              \
        c_.nseq = nseq_, c_.h = h_, c_.h_kv = hkv_, c_.d = d_, c_.causal = causal_, c_.v = var_;       \
        memcpy(c_.lq, lq_init_, sizeof lq_init_);                                                      \
        memcpy(c_.lk, lk_init_, sizeof lk_init_);                                                      \
        cases[n++] = c_;                                                                               \
    } while (0)
#define L(...) {__VA_ARGS__}
    VADD(5, L(0, 1, 130, 7, 257), L(3, 0, 65, 7, 300), 2, 1, 64, NONCAUSAL, none);
    VADD(5, L(0, 1, 130, 7, 257), L(3, 0, 65, 7, 300), 2, 1, 64, CAUSAL_BOTTOM_RIGHT, none);
    VADD(4, L(200, 1, 65, 129), L(131, 257, 1, 128), 4, 2, 64, CAUSAL_BOTTOM_RIGHT, none);
    VADD(4, L(200, 1, 65, 129), L(131, 257, 1, 128), 4, 4, 32, CAUSAL_TOP_LEFT, none);
    VADD(1, L(257), L(130), 2, 2, 64, CAUSAL_BOTTOM_RIGHT, none);
    variant x = none;
    x.left = 17, x.right = 5;
    VADD(4, L(130, 0, 64, 257), L(257, 5, 64, 63), 2, 1, 64, NONCAUSAL, x);
    x = none, x.left = 30;
    VADD(4, L(130, 3, 64, 257), L(200, 5, 1, 300), 4, 2, 64, CAUSAL_BOTTOM_RIGHT, x);
    x = none, x.softcap = 1.5f;
    VADD(3, L(65, 130, 1), L(130, 65, 2), 2, 1, 80, CAUSAL_BOTTOM_RIGHT, x);
    x = none, x.alibi = ALIBI_PER_HEAD;
    VADD(3, L(130, 1, 64), L(65, 7, 257), 4, 2, 64, CAUSAL_BOTTOM_RIGHT, x);
    x = none, x.alibi = ALIBI_PER_BATCH;
    VADD(4, L(63, 0, 200, 9), L(257, 4, 100, 9), 4, 4, 64, NONCAUSAL, x);
    x = none, x.sink = 1;
    VADD(4, L(130, 5, 0, 64), L(65, 0, 3, 64), 2, 1, 64, CAUSAL_BOTTOM_RIGHT, x);
    /* GQA, seqused_k (some sequences use none of their keys), rows of no sequence, strides */
    VADD(4, L(65, 130, 1, 7), L(130, 65, 9, 0), 8, 2, 64, CAUSAL_BOTTOM_RIGHT, none);
    cases[n - 1].has_used = 1;
    memcpy(cases[n - 1].used, (int64_t[]){100, 0, VARLEN_NO_SEQUSED, 0}, 4 * sizeof(int64_t));
    cases[n - 1].pad_q = 5, cases[n - 1].pad_k = 9;
    VADD(3, L(130, 64, 257), L(257, 64, 200), 4, 1, 96, NONCAUSAL, none);
    cases[n - 1].has_used = 1;
    memcpy(cases[n - 1].used, (int64_t[]){65, 1, 199}, 3 * sizeof(int64_t));
    cases[n - 1].strided = 1, cases[n - 1].extra_max = 70;
    VADD(3, L(7, 70, 1), L(3, 129, 1), 2, 1, 3, CAUSAL_BOTTOM_RIGHT, none);
    cases[n - 1].strided = 1, cases[n - 1].pad_q = 3;
    /* everything at once */
    x = none, x.left = 11, x.softcap = 2.5f, x.alibi = ALIBI_PER_BATCH, x.sink = 1;
    VADD(5, L(130, 1, 0, 257, 64), L(257, 65, 4, 130, 0), 4, 2, 64, CAUSAL_BOTTOM_RIGHT, x);
    cases[n - 1].has_used = 1;
    memcpy(cases[n - 1].used, (int64_t[]){200, 0, 4, VARLEN_NO_SEQUSED, 0}, 5 * sizeof(int64_t));
    cases[n - 1].pad_q = 2, cases[n - 1].pad_k = 1, cases[n - 1].strided = 1;
    x.left = 40, x.right = 3;
    VADD(3, L(257, 9, 64), L(130, 9, 300), 4, 4, 64, NONCAUSAL, x);
#undef L
#undef VADD
    /* random mixes */
    static const variant random_variants[VARLEN_RANDOM_CASES] = {
        {UNBOUNDED, UNBOUNDED, 0, ALIBI_NONE, MASK_NONE, 0, 0, 0},
        {UNBOUNDED, UNBOUNDED, 0, ALIBI_NONE, MASK_NONE, 0, 0, 1},
        {25, 25, 0, ALIBI_NONE, MASK_NONE, 0, 0, 0},
        {UNBOUNDED, UNBOUNDED, 3.0f, ALIBI_PER_HEAD, MASK_NONE, 0, 0, 0},
        {60, UNBOUNDED, 0, ALIBI_PER_BATCH, MASK_NONE, 0, 0, 1},
        {UNBOUNDED, UNBOUNDED, 0, ALIBI_NONE, MASK_NONE, 0, 0, 0},
    };
    for (int r = 0; r < VARLEN_RANDOM_CASES; r++) {
        varlen_config c = {0};
        c.nseq = 1 + r % VARLEN_MAX_SEQS + (r == VARLEN_RANDOM_CASES - 1 ? VARLEN_MAX_SEQS - 1 - r : 0);
        c.h = 4, c.h_kv = r % 2 ? 2 : 4, c.d = 64;
        c.causal = r % 3 == 0 ? NONCAUSAL : CAUSAL_BOTTOM_RIGHT;
        c.v = random_variants[r];
        c.has_used = r % 2;
        for (int64_t s = 0; s < c.nseq; s++) {
            c.lq[s] = random_length();
            c.lk[s] = random_length();
            c.used[s] = c.has_used ? (int64_t)((uniform() + 1) / 2 * (double)(c.lk[s] + 1)) : VARLEN_NO_SEQUSED;
        }
        c.pad_q = r % 3, c.pad_k = r % 4;
        cases[n++] = c;
    }
    return n;
}

/* ---------------------------------------------------------------------------------------------- */
/* KV caches: seqused_k, k_batch_idx, k_leftpad, block_table (flash_attn_with_kvcache)            */
/* ---------------------------------------------------------------------------------------------- */

#define KV_MAX_BATCH 6
#define KV_RANDOM_CASES 24
#define KV_MAX_PAGE_UNITS 8   /* random page sizes: 1 .. 8 times FLASH_PAGE_MULTIPLE */
#define KV_MAX_CACHE 300      /* longest random cache */
#define KV_SPARE_PAGES 5      /* pages that no table entry names */

/* A dense batch of b sequences of sq queries reading a KV cache. Dense cache: (k_batches, cache_len,
 * h_kv, d), sequence s reading batch batch_idx[s] (has_batch_idx; else s). Paged (page_size > 0):
 * (pages, page_size, h_kv, d) and a (b, max_pages) table of distinct random pages, cache_len =
 * max_pages * page_size. Sequence s's keys are cache rows [leftpad[s], used[s]) (has_leftpad,
 * has_used; else from 0, to cache_len). strided: buffers (batch, heads, rows, d). */
typedef struct kv_config {
    int64_t b, h, h_kv, d, sq, cache_len, page_size, k_batches;
    int has_batch_idx, has_leftpad, has_used, strided;
    int64_t used[KV_MAX_BATCH], leftpad[KV_MAX_BATCH];
    enum causal causal;
    variant v;
} kv_config;

/* A (n, rows, heads, d) buffer of the kernel's type, NaN until written. */
static tensor cache_init(int64_t n, int64_t rows, int64_t heads, int64_t d, int strided, flash_dtype dt)
{
    tensor t = {n, rows, heads, d, n * rows * heads * d, NULL, {0, 0, 0}};
    t.data = typed_alloc(t.n, dt, NAN);
    t.st = strided ? (flash_strides){heads * rows * d, d, rows * d} : (flash_strides){rows * heads * d, heads * d, d};
    return t;
}

static int64_t random_below(int64_t n) /* uniform in [0, n), n >= 1 */
{
    const int64_t x = (int64_t)((uniform() + 1) / 2 * (double)n);
    return x < n ? x : n - 1;
}

/* Element offset of key row r (a row of the cache as sequence s sees it, 0 <= r < cache_len) of kv
 * head hk: computed here from the config, independently of mask.h. */
static int64_t kv_row_offset(const kv_config *c, const tensor *t, const int32_t *table, const int32_t *batch_idx,
                             int64_t max_pages, int64_t s, int64_t r, int64_t hk)
{
    if (c->page_size > 0)
        return at(t, table[s * max_pages + r / c->page_size], r % c->page_size, hk);
    return at(t, c->has_batch_idx ? batch_idx[s] : s, r, hk);
}

/* Key rows [r0, r0 + n) of sequence s as contiguous (n, h_kv, d) doubles. */
static double *kv_rows(const kv_config *c, const tensor *t, flash_dtype dt, const int32_t *table,
                       const int32_t *batch_idx, int64_t max_pages, int64_t s, int64_t r0, int64_t n)
{
    double *out = malloc((size_t)(n * c->h_kv * c->d + 1) * sizeof(double));
    for (int64_t r = 0; r < n; r++)
        for (int64_t hk = 0; hk < c->h_kv; hk++)
            for (int64_t x = 0; x < c->d; x++)
                out[(r * c->h_kv + hk) * c->d + x] =
                    get(t->data, dt, kv_row_offset(c, t, table, batch_idx, max_pages, s, r0 + r, hk) + x);
    return out;
}

/* Runs flash_fwd_cpu / flash_bwd_cpu on the KV-cache batch and checks each sequence against attn_ref.h
 * on its gathered keys alone (a dense batch of one); checks that the cache rows no sequence uses keep
 * NaN in dk / dv (never written). */
static int run_kv_case(const kv_config *c, flash_dtype dt)
{
    const double scale = 1 / sqrt((double)c->d);
    const variant *var = &c->v;
    const int paged = c->page_size > 0;
    const int64_t max_pages = paged ? c->cache_len / c->page_size : 0;
    const int64_t n_pages = c->b * max_pages + KV_SPARE_PAGES;
    const int64_t nb = paged ? n_pages : c->k_batches, rows = paged ? c->page_size : c->cache_len;
    const int64_t h = c->h, hk = c->h_kv, d = c->d;
    int32_t table[KV_MAX_BATCH * (KV_MAX_CACHE / FLASH_PAGE_MULTIPLE + 2)], batch_idx[KV_MAX_BATCH];
    int32_t used[KV_MAX_BATCH], leftpad[KV_MAX_BATCH];
    int32_t *perm = malloc((size_t)(n_pages > c->k_batches ? n_pages : c->k_batches) * sizeof(int32_t));
    const int64_t n_perm = paged ? n_pages : c->k_batches;
    for (int64_t e = 0; e < n_perm; e++)
        perm[e] = (int32_t)e;
    for (int64_t e = n_perm - 1; e > 0; e--) { /* Fisher-Yates: distinct pages / cache rows */
        const int64_t o = random_below(e + 1);
        const int32_t tmp = perm[e];
        perm[e] = perm[o], perm[o] = tmp;
    }
    for (int64_t e = 0; e < c->b * max_pages; e++)
        table[e] = perm[e];
    for (int64_t s = 0; s < c->b; s++) {
        batch_idx[s] = perm[s];
        used[s] = (int32_t)(c->has_used ? c->used[s] : c->cache_len);
        leftpad[s] = (int32_t)(c->has_leftpad ? c->leftpad[s] : 0);
    }
    free(perm);
    tensor q = cache_init(c->b, c->sq, h, d, c->strided, dt), dout = cache_init(c->b, c->sq, h, d, c->strided, dt);
    tensor o = cache_init(c->b, c->sq, h, d, c->strided, dt), dq = cache_init(c->b, c->sq, h, d, c->strided, dt);
    tensor k = cache_init(nb, rows, hk, d, c->strided, dt), v = cache_init(nb, rows, hk, d, c->strided, dt);
    tensor dk = cache_init(nb, rows, hk, d, c->strided, dt), dv = cache_init(nb, rows, hk, d, c->strided, dt);
    tensor *inputs[4] = {&q, &k, &v, &dout};
    fill_uniform(inputs, 4, dt);
    const int64_t n_rows = c->b * h * c->sq;
    void *lse = typed_alloc(n_rows, dt, NAN), *delta = typed_alloc(n_rows, dt, NAN);
    flash_params p = {
        .q = q.data, .k = k.data, .v = v.data, .o = o.data, .lse = lse, .dout = dout.data,
        .dq = dq.data, .dk = dk.data, .dv = dv.data, .delta = delta,
        .q_s = q.st, .k_s = k.st, .v_s = v.st, .o_s = o.st, .do_s = dout.st, .dq_s = dq.st,
        .dk_s = dk.st, .dv_s = dv.st, .b = c->b, .h = h, .h_kv = hk, .sq = c->sq, .sk = c->cache_len, .d = d, .d_v = d,
        .h_per_kv = h / hk, .scale = scale, .dtype = dt, .lse_batch = h * c->sq, .lse_head = c->sq,
        .seqused_k = c->has_used ? used : NULL, .k_leftpad = c->has_leftpad ? leftpad : NULL,
        .k_batch_idx = c->has_batch_idx ? batch_idx : NULL, .k_batches = nb,
        .block_table = paged ? table : NULL, .block_table_stride = max_pages, .page_size = c->page_size,
    };
    set_band(&p, c->causal, var);
    float slopes[KV_MAX_BATCH * 8];
    void *sink;
    double *sink_ref;
    set_case_hooks(&p, var, slopes, c->b, h, dt, &sink, &sink_ref);

    int fail = flash_fwd_cpu(&p) != FLASH_CPU_OK || flash_bwd_cpu(&p) != FLASH_CPU_OK;

    double err[5] = {0}, parts[5][2] = {{0}};
    int ok[5] = {1, 1, 1, 1, 1};
    const int64_t q_elems = c->sq * h * d;
    for (int64_t s = 0; s < c->b; s++) {
        const int64_t end = flash_clamp64(used[s], 0, c->cache_len), k0 = flash_clamp64(leftpad[s], 0, end);
        const int64_t sk = end - k0;
        flash_params r = {.b = 1, .h = h, .h_kv = hk, .sq = c->sq, .sk = sk, .d = d, .d_v = d, .scale = scale,
                          .band_left = p.band_left, .band_right = p.band_right,
                          .band_bottom_right = p.band_bottom_right, .softcap = p.softcap};
        if (var->alibi)
            r.alibi_slopes = slopes + s * p.alibi_batch_stride;
        tensor qs = q, ds = dout, os = o, dqs = dq;
        qs.b = ds.b = os.b = dqs.b = 1;
        qs.n = ds.n = os.n = dqs.n = q_elems;
        qs.data = (char *)q.data + (size_t)(s * q.st.batch) * esize(dt);
        ds.data = (char *)dout.data + (size_t)(s * dout.st.batch) * esize(dt);
        os.data = (char *)o.data + (size_t)(s * o.st.batch) * esize(dt);
        dqs.data = (char *)dq.data + (size_t)(s * dq.st.batch) * esize(dt);
        double *qr = contiguous(&qs, dt), *dor = contiguous(&ds, dt), *og = contiguous(&os, dt);
        double *dqg = contiguous(&dqs, dt);
        double *kr = kv_rows(c, &k, dt, table, batch_idx, max_pages, s, k0, sk);
        double *vr = kv_rows(c, &v, dt, table, batch_idx, max_pages, s, k0, sk);
        double *dkg = kv_rows(c, &dk, dt, table, batch_idx, max_pages, s, k0, sk);
        double *dvg = kv_rows(c, &dv, dt, table, batch_idx, max_pages, s, k0, sk);
        double *o_ref = malloc((size_t)q_elems * sizeof(double)), *dq_ref = malloc((size_t)q_elems * sizeof(double));
        double *dk_ref = malloc((size_t)(sk * hk * d + 1) * sizeof(double));
        double *dv_ref = malloc((size_t)(sk * hk * d + 1) * sizeof(double));
        double *lse_ref = malloc((size_t)(h * c->sq) * sizeof(double));
        double *lseg = malloc((size_t)(h * c->sq) * sizeof(double));
        const double *sink_arg = var->sink ? sink_ref : NULL;
        ref_forward(&r, qr, kr, vr, NULL, sink_arg, o_ref, lse_ref);
        ref_backward(&r, qr, kr, vr, NULL, sink_arg, dor, dq_ref, dk_ref, dv_ref, NULL, NULL);
        for (int64_t e = 0; e < h * c->sq; e++)
            lseg[e] = get(lse, dt, s * h * c->sq + e);
        ok[0] &= accumulate_err(og, o_ref, q_elems, parts[0]);
        ok[1] &= accumulate_err(lseg, lse_ref, h * c->sq, parts[1]);
        ok[2] &= accumulate_err(dqg, dq_ref, q_elems, parts[2]);
        ok[3] &= accumulate_err(dkg, dk_ref, sk * hk * d, parts[3]);
        ok[4] &= accumulate_err(dvg, dv_ref, sk * hk * d, parts[4]);
        /* rows of the cache outside [k0, end): never written */
        double *before = kv_rows(c, &dk, dt, table, batch_idx, max_pages, s, 0, k0);
        double *after = kv_rows(c, &dv, dt, table, batch_idx, max_pages, s, end, c->cache_len - end);
        for (int64_t e = 0; e < k0 * hk * d; e++)
            fail |= !isnan(before[e]);
        for (int64_t e = 0; e < (c->cache_len - end) * hk * d; e++)
            fail |= !isnan(after[e]);
        double *all[] = {qr, dor, og, dqg, kr, vr, dkg, dvg, o_ref, dq_ref, dk_ref, dv_ref,
                         lse_ref, lseg, before, after};
        for (size_t e = 0; e < sizeof all / sizeof *all; e++)
            free(all[e]);
    }
    for (int e = 0; e < 5; e++)
        err[e] = err_of(parts[e], ok[e]);
    const double tol = dt == FLASH_FP32 ? TOL_FP32 : TOL_FP64;
    double worst = 0;
    for (int e = 0; e < 5; e++)
        worst = fmax(worst, err[e]);
    fail |= !(worst <= tol);

    char name[160], lens[2][96], layout[64];
    config named = {0};
    named.causal = c->causal, named.v = *var;
    variant_name(&named, name, sizeof name);
    int64_t show[KV_MAX_BATCH];
    for (int64_t s = 0; s < c->b; s++)
        show[s] = used[s];
    print_lengths(lens[0], sizeof lens[0], "used", show, c->b);
    lens[1][0] = '\0';
    if (c->has_leftpad) {
        for (int64_t s = 0; s < c->b; s++)
            show[s] = leftpad[s];
        print_lengths(lens[1], sizeof lens[1], "leftpad", show, c->b);
    }
    if (paged)
        snprintf(layout, sizeof layout, "paged %lld x %lld", (long long)n_pages, (long long)c->page_size);
    else
        snprintf(layout, sizeof layout, "cache %lld x %lld%s", (long long)nb, (long long)c->cache_len,
                 c->has_batch_idx ? " batch_idx" : "");
    printf("%s %s kvcache b%lld h%lld/%lld d%lld sq%lld %s %s%s%s%s: out %.1e lse %.1e dq %.1e dk %.1e dv %.1e\n",
           fail ? "FAIL" : "ok  ", dt == FLASH_FP32 ? "fp32" : "fp64", (long long)c->b, (long long)h, (long long)hk,
           (long long)d, (long long)c->sq, layout, lens[0], lens[1], c->strided ? "strided " : "", name, err[0],
           err[1], err[2], err[3], err[4]);

    tensor *bufs[8] = {&q, &k, &v, &dout, &o, &dq, &dk, &dv};
    for (int w = 0; w < 8; w++)
        free(bufs[w]->data);
    free(lse);
    free(delta);
    free(sink);
    free(sink_ref);
    return fail;
}

/* KV-cache cases: dense caches with seqused_k (0 and full included), k_batch_idx into a larger cache,
 * k_leftpad; paged caches with random page sizes (multiples of FLASH_PAGE_MULTIPLE) and random tables,
 * with leftpad too; decode (sq 1) and chunked prefill (sq > 1) with causal / window / softcap / ALiBi /
 * sinks, GQA, strided buffers. */
static int kv_cases(kv_config *cases)
{
    static const variant variants[] = {
        {UNBOUNDED, UNBOUNDED, 0, ALIBI_NONE, MASK_NONE, 0, 0, 0},
        {UNBOUNDED, UNBOUNDED, 0, ALIBI_NONE, MASK_NONE, 0, 0, 1},
        {40, UNBOUNDED, 0, ALIBI_NONE, MASK_NONE, 0, 0, 0},
        {17, 5, 0, ALIBI_NONE, MASK_NONE, 0, 0, 0},
        {UNBOUNDED, UNBOUNDED, 2.5f, ALIBI_PER_HEAD, MASK_NONE, 0, 0, 0},
        {UNBOUNDED, UNBOUNDED, 0, ALIBI_PER_BATCH, MASK_NONE, 0, 0, 1},
        {30, UNBOUNDED, 1.5f, ALIBI_PER_BATCH, MASK_NONE, 0, 0, 1},
    };
    static const int64_t sqs[] = {1, 1, 3, 64, 130};
    static const int64_t dims[] = {64, 64, 32, 80, 3};
    const int n_variants = (int)(sizeof variants / sizeof *variants);
    int n = 0;
    for (int r = 0; r < KV_RANDOM_CASES; r++) {
        kv_config c = {0};
        c.b = 1 + random_below(KV_MAX_BATCH);
        c.h = 4, c.h_kv = r % 3 == 0 ? 4 : r % 3 == 1 ? 2 : 1;
        c.d = dims[r % 5];
        c.sq = sqs[(r / 2) % 5];
        c.causal = r % 4 == 3 ? NONCAUSAL : CAUSAL_BOTTOM_RIGHT;
        c.v = variants[r % n_variants];
        c.strided = r % 5 == 4;
        if (r % 2) { /* paged */
            c.page_size = FLASH_PAGE_MULTIPLE * (1 + random_below(KV_MAX_PAGE_UNITS));
            c.cache_len = c.page_size * (1 + random_below(KV_MAX_CACHE / c.page_size));
        } else {
            c.cache_len = 1 + random_below(KV_MAX_CACHE);
            c.has_batch_idx = r % 4 == 0;
            c.k_batches = c.b + (c.has_batch_idx ? 1 + random_below(3) : 0);
        }
        c.has_used = r % 8 != 6;
        c.has_leftpad = r % 3 != 0;
        for (int64_t s = 0; s < c.b; s++) {
            const double u = uniform();
            c.used[s] = u < -0.7 ? 0 : u > 0.7 ? c.cache_len : random_below(c.cache_len + 1);
            const int64_t end = c.has_used ? c.used[s] : c.cache_len;
            c.leftpad[s] = uniform() < -0.5 ? end : random_below(end + 1);
        }
        cases[n++] = c;
    }
    return n;
}

/* ---------------------------------------------------------------------------------------------- */
/* Paged varlen batches: cu_seqlens with a block_table (flash_attn_varlen_func's, forward only)    */
/* ---------------------------------------------------------------------------------------------- */

#define PAGED_VARLEN_K_OFFSET 1000 /* added to cu_seqlens_k: only its differences count */

/* The varlen batch c with its keys in a paged cache of page_size rows: sequence s's keys are written to
 * distinct random pages of a table with one spare entry per sequence, next to KV_SPARE_PAGES pages no entry
 * names (random values everywhere else, never to be read). Runs flash_fwd_cpu and checks each sequence's
 * out and lse against attn_ref.h on its packed keys alone, and that rows of no sequence stay unwritten. */
static int run_paged_varlen_case(const varlen_config *c, int64_t page_size, flash_dtype dt)
{
    const double scale = 1 / sqrt((double)c->d);
    const variant *var = &c->v;
    const int64_t h = c->h, hk = c->h_kv, d = c->d;
    int32_t cu_q[VARLEN_MAX_SEQS + 1] = {0}, cu_k[VARLEN_MAX_SEQS + 1] = {PAGED_VARLEN_K_OFFSET};
    int32_t used[VARLEN_MAX_SEQS];
    int64_t k_row0[VARLEN_MAX_SEQS + 1] = {0}, max_q = 0, max_k = 0, max_pages = 1;
    for (int64_t s = 0; s < c->nseq; s++) {
        cu_q[s + 1] = cu_q[s] + (int32_t)c->lq[s];
        cu_k[s + 1] = cu_k[s] + (int32_t)c->lk[s];
        k_row0[s + 1] = k_row0[s] + c->lk[s];
        used[s] = (int32_t)(c->has_used && c->used[s] != VARLEN_NO_SEQUSED ? c->used[s] : c->lk[s]);
        max_q = flash_max64(max_q, c->lq[s]);
        max_k = flash_max64(max_k, c->lk[s]);
        max_pages = flash_max64(max_pages, flash_cdiv64(c->lk[s], page_size) + 1);
    }
    const int64_t total_q = cu_q[c->nseq] + c->pad_q, total_k = k_row0[c->nseq];
    const int64_t n_pages = c->nseq * max_pages + KV_SPARE_PAGES;
    tensor q = packed_init(total_q, h, d, c->strided, dt), o = packed_init(total_q, h, d, c->strided, dt);
    tensor k = packed_init(total_k, hk, d, 0, dt), v = packed_init(total_k, hk, d, 0, dt);
    tensor kc = cache_init(n_pages, page_size, hk, d, c->strided, dt), vc = cache_init(n_pages, page_size, hk, d,
                                                                                        c->strided, dt);
    tensor *inputs[4] = {&q, &k, &kc, &vc};
    fill_uniform(inputs, 4, dt);
    for (int64_t r = 0; r < total_k; r++) /* v's packed rows differ from k's */
        for (int64_t hi = 0; hi < hk; hi++)
            for (int64_t x = 0; x < d; x++)
                set(v.data, dt, at(&v, 0, r, hi) + x, 2 * uniform());
    int32_t *table = malloc((size_t)(c->nseq * max_pages) * sizeof(int32_t));
    int32_t *perm = malloc((size_t)n_pages * sizeof(int32_t));
    for (int64_t e = 0; e < n_pages; e++)
        perm[e] = (int32_t)e;
    for (int64_t e = n_pages - 1; e > 0; e--) { /* Fisher-Yates: distinct pages */
        const int64_t o2 = random_below(e + 1);
        const int32_t tmp = perm[e];
        perm[e] = perm[o2], perm[o2] = tmp;
    }
    memcpy(table, perm, (size_t)(c->nseq * max_pages) * sizeof(int32_t));
    free(perm);
    for (int64_t s = 0; s < c->nseq; s++) /* key r of sequence s: row r % page_size of page table[s][r / page] */
        for (int64_t r = 0; r < c->lk[s]; r++)
            for (int64_t hi = 0; hi < hk; hi++)
                for (int64_t x = 0; x < d; x++) {
                    const int64_t page = table[s * max_pages + r / page_size], row = r % page_size;
                    set(kc.data, dt, at(&kc, page, row, hi) + x, get(k.data, dt, at(&k, 0, k_row0[s] + r, hi) + x));
                    set(vc.data, dt, at(&vc, page, row, hi) + x, get(v.data, dt, at(&v, 0, k_row0[s] + r, hi) + x));
                }
    void *lse = typed_alloc(h * total_q, dt, NAN);
    flash_params p = {
        .q = q.data, .k = kc.data, .v = vc.data, .o = o.data, .lse = lse, .q_s = q.st, .k_s = kc.st, .v_s = vc.st,
        .o_s = o.st, .b = c->nseq, .h = h, .h_kv = hk, .sq = max_q + c->extra_max, .sk = max_k + c->extra_max,
        .d = d, .d_v = d, .h_per_kv = h / hk, .scale = scale, .dtype = dt, .lse_batch = 0, .lse_head = total_q,
        .cu_seqlens_q = cu_q, .cu_seqlens_k = cu_k, .seqused_k = c->has_used ? used : NULL, .total_q = total_q,
        .k_batches = n_pages, .block_table = table, .block_table_stride = max_pages, .page_size = page_size,
    };
    set_band(&p, c->causal, var);
    float slopes[VARLEN_MAX_SEQS * 8];
    void *sink;
    double *sink_ref;
    set_case_hooks(&p, var, slopes, c->nseq, h, dt, &sink, &sink_ref);

    int fail = flash_fwd_cpu(&p) != FLASH_CPU_OK;

    double err[2], parts[2][2] = {{0}};
    int ok[2] = {1, 1};
    for (int64_t s = 0; s < c->nseq; s++) {
        const int64_t sq = c->lq[s], sk = used[s] < c->lk[s] ? used[s] : c->lk[s], q0 = cu_q[s];
        flash_params r = {.b = 1, .h = h, .h_kv = hk, .sq = sq, .sk = sk, .d = d, .d_v = d, .scale = scale,
                          .band_left = p.band_left, .band_right = p.band_right,
                          .band_bottom_right = p.band_bottom_right, .softcap = p.softcap};
        if (var->alibi)
            r.alibi_slopes = slopes + s * p.alibi_batch_stride;
        double *qr = packed_rows(&q, dt, q0, sq), *kr = packed_rows(&k, dt, k_row0[s], sk);
        double *vr = packed_rows(&v, dt, k_row0[s], sk), *og = packed_rows(&o, dt, q0, sq);
        double *o_ref = malloc((size_t)(sq * h * d + 1) * sizeof(double));
        double *lse_ref = malloc((size_t)(h * sq + 1) * sizeof(double));
        double *lseg = malloc((size_t)(h * sq + 1) * sizeof(double));
        ref_forward(&r, qr, kr, vr, NULL, var->sink ? sink_ref : NULL, o_ref, lse_ref);
        for (int64_t hq = 0; hq < h; hq++)
            for (int64_t i = 0; i < sq; i++)
                lseg[hq * sq + i] = get(lse, dt, hq * total_q + q0 + i);
        ok[0] &= accumulate_err(og, o_ref, sq * h * d, parts[0]);
        ok[1] &= accumulate_err(lseg, lse_ref, sq * h, parts[1]);
        double *bufs[] = {qr, kr, vr, og, o_ref, lse_ref, lseg};
        for (size_t e = 0; e < sizeof bufs / sizeof *bufs; e++)
            free(bufs[e]);
    }
    for (int e = 0; e < 2; e++)
        err[e] = err_of(parts[e], ok[e]);
    fail |= rows_written(&o, dt, cu_q[c->nseq], c->pad_q); /* rows of no sequence: never written */
    for (int64_t hq = 0; hq < h; hq++)
        for (int64_t i = cu_q[c->nseq]; i < total_q; i++)
            fail |= !isnan(get(lse, dt, hq * total_q + i));
    const double tol = dt == FLASH_FP32 ? TOL_FP32 : TOL_FP64;
    fail |= !(fmax(err[0], err[1]) <= tol);

    char name[160], lens[3][96];
    config named = {0};
    named.causal = c->causal, named.v = *var;
    variant_name(&named, name, sizeof name);
    print_lengths(lens[0], sizeof lens[0], "sq", c->lq, c->nseq);
    print_lengths(lens[1], sizeof lens[1], "sk", c->lk, c->nseq);
    lens[2][0] = '\0';
    if (c->has_used) {
        int64_t show[VARLEN_MAX_SEQS];
        for (int64_t s = 0; s < c->nseq; s++)
            show[s] = used[s];
        print_lengths(lens[2], sizeof lens[2], "used", show, c->nseq);
    }
    printf("%s %s paged varlen b%lld h%lld/%lld d%lld %s%s%spages %lld x %lld%s %s: out %.1e lse %.1e\n",
           fail ? "FAIL" : "ok  ", dt == FLASH_FP32 ? "fp32" : "fp64", (long long)c->nseq, (long long)h, (long long)hk,
           (long long)d, lens[0], lens[1], lens[2], (long long)n_pages, (long long)page_size,
           c->strided ? " strided" : "", name, err[0], err[1]);

    tensor *all[6] = {&q, &o, &k, &v, &kc, &vc};
    for (int w = 0; w < 6; w++)
        free(all[w]->data);
    free(table);
    free(lse);
    free(sink);
    free(sink_ref);
    return fail;
}

#define MAX_CASES 256

int main(int argc, char **argv)
{
    static const int64_t lengths[] = {1, 7, 63, 64, 65, 130, 257};
    static const int64_t pairs[][2] = {{63, 130}, {7, 257}, {1, 65}, {130, 63}, {257, 7}, {65, 1}};
    static const int64_t dims[] = {1, 3, 64, 80, 96, 128, 256};
    static config cases[MAX_CASES];
    static const char *names[MAX_CASES];
    const variant none = NO_VARIANT;
    int n = 0;
    for (size_t i = 0; i < sizeof lengths / sizeof *lengths; i++)
        for (int cz = NONCAUSAL; cz <= CAUSAL_TOP_LEFT; cz++) {
            names[n] = "length";
            cases[n++] = (config){1, 2, 1, lengths[i], lengths[i], 64, cz, 0, INIT_RANDOM, none};
        }
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++)
        for (int cz = NONCAUSAL; cz <= CAUSAL_BOTTOM_RIGHT; cz++) {
            names[n] = pairs[i][0] < pairs[i][1] ? "sq<sk" : "sq>sk";
            cases[n++] = (config){1, 2, 2, pairs[i][0], pairs[i][1], 64, cz, 0, INIT_RANDOM, none};
        }
    for (int64_t group = 1; group <= 4; group *= 2) {
        names[n] = "gqa";
        cases[n++] = (config){2, 4, 4 / group, 65, 130, 64, CAUSAL_BOTTOM_RIGHT, 0, INIT_RANDOM, none};
    }
    for (size_t i = 0; i < sizeof dims / sizeof *dims; i++) {
        names[n] = "headdim";
        cases[n++] = (config){1, 2, 1, 130, 65, dims[i], CAUSAL_BOTTOM_RIGHT, 0, INIT_RANDOM, none};
    }
    names[n] = "strided";
    cases[n++] = (config){2, 4, 2, 63, 130, 80, NONCAUSAL, 1, INIT_RANDOM, none};
    names[n] = "strided";
    cases[n++] = (config){2, 4, 1, 130, 63, 64, CAUSAL_BOTTOM_RIGHT, 1, INIT_RANDOM, none};
    names[n] = "seed";
    cases[n++] = (config){1, 1, 1, 1, 2 * FLASH_CPU_TILE_K, 1, NONCAUSAL, 0, INIT_SEED, none};
    names[n] = "scores~1e4";
    cases[n++] = (config){1, 1, 1, 65, 130, 1, NONCAUSAL, 0, INIT_LARGE, none};
    n += variant_cases(cases + n, names + n);

    printf("tiles: %d query x %d key rows, %d OpenMP threads\n", FLASH_CPU_TILE_Q,
           FLASH_CPU_TILE_K, omp_get_max_threads());
    int failures = 0, runs = 0;
    for (int i = 0; i < n; i++)
        for (int dt = FLASH_FP32; dt <= FLASH_FP64; dt++, runs++)
            failures += run_case(&cases[i], (flash_dtype)dt, names[i]);
    failures += check_dropout_mask();
    runs++;
    static varlen_config vcases[MAX_CASES];
    const int nv = varlen_cases(vcases);
    for (int i = 0; i < nv; i++)
        for (int dt = FLASH_FP32; dt <= FLASH_FP64; dt++, runs++)
            failures += run_varlen_case(&vcases[i], (flash_dtype)dt);
    static kv_config kcases[MAX_CASES];
    const int nk = kv_cases(kcases);
    for (int i = 0; i < nk; i++)
        for (int dt = FLASH_FP32; dt <= FLASH_FP64; dt++, runs++)
            failures += run_kv_case(&kcases[i], (flash_dtype)dt);
    static const int64_t page_sizes[] = {FLASH_PAGE_MULTIPLE, 3 * FLASH_PAGE_MULTIPLE, 16 * FLASH_PAGE_MULTIPLE};
    for (int i = 0; i < nv; i++)
        for (int dt = FLASH_FP32; dt <= FLASH_FP64; dt++, runs++)
            failures += run_paged_varlen_case(&vcases[i], page_sizes[i % 3], (flash_dtype)dt);
    printf("%s: %d of %d checks failed\n", failures ? "FAIL" : "PASS", failures, runs);
    if (argc > 1 && strcmp(argv[1], "bench") == 0)
        bench_all();
    return failures != 0;
}
