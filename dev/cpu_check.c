/* cpu_check.c: checks csrc/cpu/flash_cpu.c (fwd: out, lse; bwd: dq, dk, dv) in fp32 and fp64
 * against a naive O(sq * sk) double-precision reference, then (with the argument "bench") times it.
 *
 *   gcc -std=c11 -O2 -fopenmp -Icsrc dev/cpu_check.c csrc/cpu/flash_cpu.c -lm -o /tmp/cpu_check
 *   /tmp/cpu_check            # all checks; exit status 1 on any failure
 *   /tmp/cpu_check bench      # checks, then b1 h8 d64 fp32 timings
 * Add -DFLASH_CPU_TILE_K=2 (and e.g. -DFLASH_CPU_TILE_Q=5) to run every check with tiny tiles; the
 * seed case then is exactly scores [0,0 | 10,10], values [0,0 | 1,1] with a key tile of 2.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/flash_cpu.h"

#define TOL_FP32 1e-5
#define TOL_FP64 1e-12
#define SEED_EXPECTED 0.99995460007023751 /* e^10 / (1 + e^10) */
#define SEED_TOL 1e-6
#define LARGE_Q 100.0 /* d = 1, scale 1: scores q * k of magnitude 1e4 */
#define BENCH_REPS 3

enum init { INIT_RANDOM, INIT_SEED, INIT_LARGE };
enum causal { NONCAUSAL, CAUSAL_TOP_LEFT, CAUSAL_BOTTOM_RIGHT };

typedef struct config {
    int64_t b, h, h_kv, sq, sk, d;
    enum causal causal;
    int strided; /* 1: every tensor is a (b, h, s, d) buffer addressed as (b, s, h, d) */
    enum init init;
} config;

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double uniform(void) /* [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / (double)(1ull << 52) - 1.0;
}

/* A (b, s, heads, d) tensor: double values (what the reference reads), the typed copy the kernel
 * reads or writes, and its strides. */
typedef struct tensor {
    int64_t n, s, heads;
    double *ref;
    void *data;
    flash_strides st;
} tensor;

static double get(const tensor *t, flash_dtype dt, int64_t i)
{
    return dt == FLASH_FP32 ? ((float *)t->data)[i] : ((double *)t->data)[i];
}

static void tensor_init(tensor *t, const config *c, int64_t s, int64_t heads, flash_dtype dt)
{
    t->s = s;
    t->heads = heads;
    t->n = c->b * s * heads * c->d;
    t->ref = calloc((size_t)t->n, sizeof(double));
    t->data = malloc((size_t)t->n * (dt == FLASH_FP32 ? sizeof(float) : sizeof(double)));
    t->st = c->strided ? (flash_strides){heads * s * c->d, c->d, s * c->d}
                       : (flash_strides){s * heads * c->d, heads * c->d, c->d};
    for (int64_t i = 0; i < t->n; i++)
        if (dt == FLASH_FP32)
            ((float *)t->data)[i] = NAN;
        else
            ((double *)t->data)[i] = NAN;
}

/* Element i = x, rounded to the kernel's type; the reference sees the rounded value. */
static void tensor_set(tensor *t, flash_dtype dt, int64_t i, double x)
{
    if (dt == FLASH_FP32)
        ((float *)t->data)[i] = (float)(t->ref[i] = (float)x);
    else
        ((double *)t->data)[i] = t->ref[i] = x;
}

static int64_t at(const tensor *t, int64_t bi, int64_t si, int64_t hi)
{
    return bi * t->st.batch + si * t->st.row + hi * t->st.head;
}

/* Naive reference, one query row at a time: out, lse, dq, and dk, dv accumulated over all rows. */
static void reference(const config *c, double scale, int64_t off, const tensor *q, const tensor *k,
                      const tensor *v, const tensor *dout, double *o, double *lse, double *dq,
                      double *dk, double *dv)
{
    double *pr = malloc((size_t)c->sk * sizeof(double)), *dp = malloc((size_t)c->sk * sizeof(double));
    const int64_t d = c->d, group = c->h / c->h_kv;
    memset(dk, 0, (size_t)k->n * sizeof(double));
    memset(dv, 0, (size_t)v->n * sizeof(double));
    for (int64_t bi = 0; bi < c->b; bi++)
        for (int64_t hq = 0; hq < c->h; hq++)
            for (int64_t i = 0; i < c->sq; i++) {
                const int64_t hk = hq / group, qi = at(q, bi, i, hq);
                int64_t n_vis = c->causal ? i + off + 1 : c->sk;
                n_vis = n_vis < 0 ? 0 : n_vis > c->sk ? c->sk : n_vis;
                double m = -INFINITY, l = 0, delta = 0;
                for (int64_t j = 0; j < n_vis; j++) {
                    pr[j] = 0;
                    for (int64_t x = 0; x < d; x++)
                        pr[j] += q->ref[qi + x] * k->ref[at(k, bi, j, hk) + x];
                    pr[j] *= scale;
                    m = fmax(m, pr[j]);
                }
                for (int64_t j = 0; j < n_vis; j++)
                    l += (pr[j] = exp(pr[j] - m));
                lse[(bi * c->h + hq) * c->sq + i] = n_vis ? m + log(l) : -INFINITY;
                for (int64_t x = 0; x < d; x++)
                    o[qi + x] = dq[qi + x] = 0;
                for (int64_t j = 0; j < n_vis; j++) {
                    const int64_t vj = at(v, bi, j, hk);
                    pr[j] /= l;
                    dp[j] = 0;
                    for (int64_t x = 0; x < d; x++) {
                        o[qi + x] += pr[j] * v->ref[vj + x];
                        dp[j] += dout->ref[qi + x] * v->ref[vj + x];
                    }
                    delta += pr[j] * dp[j];
                }
                for (int64_t j = 0; j < n_vis; j++) {
                    const double ds = pr[j] * (dp[j] - delta);
                    const int64_t kj = at(k, bi, j, hk);
                    for (int64_t x = 0; x < d; x++) {
                        dq[qi + x] += scale * ds * k->ref[kj + x];
                        dk[kj + x] += scale * ds * q->ref[qi + x];
                        dv[kj + x] += pr[j] * dout->ref[qi + x];
                    }
                }
            }
    free(pr);
    free(dp);
}

/* max |got - want| / max |want| over the n elements (-inf must match exactly); 1 on a NaN. */
static double rel_err(const void *got, flash_dtype dt, const double *want, int64_t n)
{
    double err = 0, norm = 0;
    for (int64_t i = 0; i < n; i++) {
        const double g = dt == FLASH_FP32 ? ((const float *)got)[i] : ((const double *)got)[i];
        if (isnan(g) || (isinf(want[i]) != isinf(g)) || (isinf(g) && g != want[i]))
            return 1;
        if (!isinf(g)) {
            err = fmax(err, fabs(g - want[i]));
            norm = fmax(norm, fabs(want[i]));
        }
    }
    return norm > 0 ? err / norm : err;
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

static int run_case(const config *c, flash_dtype dt, const char *what)
{
    const double scale = c->init == INIT_RANDOM ? 1 / sqrt((double)c->d) : 1;
    const int64_t off = c->causal == CAUSAL_BOTTOM_RIGHT ? c->sk - c->sq : 0;
    const size_t esize = dt == FLASH_FP32 ? sizeof(float) : sizeof(double);
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
                        tensor_set(inputs[w], dt, at(inputs[w], bi, si, hi) + x,
                                   init_value(c, w, si));
    const int64_t n_rows = c->b * c->h * c->sq;
    void *lse = malloc((size_t)n_rows * esize), *delta = malloc((size_t)n_rows * esize);
    double *lse_ref = malloc((size_t)n_rows * sizeof(double));
    for (int64_t r = 0; r < n_rows; r++) /* NaN until written */
        if (dt == FLASH_FP32)
            ((float *)lse)[r] = NAN;
        else
            ((double *)lse)[r] = NAN;
    flash_params p = {
        .q = q.data, .k = k.data, .v = v.data, .o = o.data, .lse = lse, .dout = dout.data,
        .dq = dq.data, .dk = dk.data, .dv = dv.data, .delta = delta,
        .q_s = q.st, .k_s = k.st, .v_s = v.st, .o_s = o.st, .do_s = dout.st, .dq_s = dq.st,
        .dk_s = dk.st, .dv_s = dv.st, .b = c->b, .h = c->h, .h_kv = c->h_kv, .sq = c->sq,
        .sk = c->sk, .d = c->d, .h_per_kv = c->h / c->h_kv, .scale = scale,
        .causal = c->causal != NONCAUSAL, .causal_offset = off, .dtype = dt,
    };
    int fail = flash_fwd_cpu(&p) != FLASH_CPU_OK || flash_bwd_cpu(&p) != FLASH_CPU_OK;
    reference(c, scale, off, &q, &k, &v, &dout, o.ref, lse_ref, dq.ref, dk.ref, dv.ref);
    const double err[5] = {rel_err(o.data, dt, o.ref, o.n), rel_err(lse, dt, lse_ref, n_rows),
                           rel_err(dq.data, dt, dq.ref, dq.n), rel_err(dk.data, dt, dk.ref, dk.n),
                           rel_err(dv.data, dt, dv.ref, dv.n)};
    const double tol = dt == FLASH_FP32 ? TOL_FP32 : TOL_FP64;
    /* The seed case checks the forward; its gradients are ill-conditioned (dP - delta cancels to
     * ~5e-5 of dP, amplifying rounding ~2e4x) and need only be finite. */
    double worst = 0;
    for (int e = 0; e < 5; e++)
        worst = fmax(worst, c->init == INIT_SEED && e >= 2 ? (err[e] < 1 ? 0 : err[e]) : err[e]);
    fail |= !(worst <= tol);
    if (c->init == INIT_SEED)
        fail |= !(fabs(get(&o, dt, 0) - SEED_EXPECTED) < SEED_TOL);
    int64_t empty_rows = 0; /* rows that see no key: out and dq exactly 0 (lse -inf: rel_err) */
    for (int64_t r = 0; r < n_rows; r++)
        if (lse_ref[r] == -INFINITY) {
            const int64_t bi = r / (c->h * c->sq), hq = r / c->sq % c->h, i = r % c->sq;
            empty_rows++;
            for (int64_t x = 0; x < c->d; x++)
                fail |= get(&o, dt, at(&o, bi, i, hq) + x) != 0 || get(&dq, dt, at(&dq, bi, i, hq) + x) != 0;
        }
    char note[64] = "";
    if (empty_rows)
        snprintf(note, sizeof note, " [%lld rows see no key]", (long long)empty_rows);
    printf("%s %s b%lld h%lld/%lld sq%lld sk%lld d%lld %s%s: out %.1e lse %.1e dq %.1e dk %.1e "
           "dv %.1e%s\n", fail ? "FAIL" : "ok  ", dt == FLASH_FP32 ? "fp32" : "fp64", (long long)c->b,
           (long long)c->h, (long long)c->h_kv, (long long)c->sq, (long long)c->sk,
           (long long)c->d, c->causal == NONCAUSAL ? "" : c->causal == CAUSAL_TOP_LEFT
           ? "causal-tl " : "causal-br ", what, err[0], err[1], err[2], err[3], err[4], note);
    tensor *all[8] = {&q, &k, &v, &dout, &o, &dq, &dk, &dv};
    for (int w = 0; w < 8; w++) {
        free(all[w]->ref);
        free(all[w]->data);
    }
    free(lse);
    free(delta);
    free(lse_ref);
    return fail;
}

static void bench(int64_t s, int causal)
{
    const int64_t h = 8, d = 64, n = s * h * d;
    float *buf = malloc((size_t)(8 * n + 2 * s * h) * sizeof(float));
    for (int64_t i = 0; i < 8 * n + 2 * s * h; i++)
        buf[i] = (float)uniform();
    const flash_strides st = {s * h * d, h * d, d};
    flash_params p = {
        .q = buf, .k = buf + n, .v = buf + 2 * n, .o = buf + 3 * n, .dout = buf + 4 * n,
        .dq = buf + 5 * n, .dk = buf + 6 * n, .dv = buf + 7 * n, .lse = buf + 8 * n,
        .delta = buf + 8 * n + s * h, .q_s = st, .k_s = st, .v_s = st, .o_s = st, .do_s = st,
        .dq_s = st, .dk_s = st, .dv_s = st, .b = 1, .h = h, .h_kv = h, .h_per_kv = 1, .sq = s,
        .sk = s, .d = d, .scale = 1 / sqrt((double)d), .causal = causal, .dtype = FLASH_FP32,
    };
    double best_fwd = INFINITY, best_bwd = INFINITY;
    for (int r = 0; r < BENCH_REPS; r++) {
        const double t0 = omp_get_wtime();
        flash_fwd_cpu(&p);
        const double t1 = omp_get_wtime();
        flash_bwd_cpu(&p);
        const double t2 = omp_get_wtime();
        best_fwd = fmin(best_fwd, t1 - t0);
        best_bwd = fmin(best_bwd, t2 - t1);
    }
    const double flop = 4.0 * h * s * s * d / (causal ? 2 : 1);
    printf("bench b1 h8 s%lld d64 fp32%s: fwd %.1f ms (%.0f GFLOP/s)  bwd %.1f ms (%.0f GFLOP/s)\n",
           (long long)s, causal ? " causal" : "", best_fwd * 1e3, flop / best_fwd * 1e-9,
           best_bwd * 1e3, 2.5 * flop / best_bwd * 1e-9);
    free(buf);
}

int main(int argc, char **argv)
{
    static const int64_t lengths[] = {1, 7, 63, 64, 65, 130, 257};
    static const int64_t pairs[][2] = {{63, 130}, {7, 257}, {1, 65}, {130, 63}, {257, 7}, {65, 1}};
    static const int64_t dims[] = {1, 3, 64, 80, 96, 128, 256};
    config cases[128];
    const char *names[128];
    int n = 0;
    for (size_t i = 0; i < sizeof lengths / sizeof *lengths; i++)
        for (int cz = NONCAUSAL; cz <= CAUSAL_TOP_LEFT; cz++) {
            names[n] = "length";
            cases[n++] = (config){1, 2, 1, lengths[i], lengths[i], 64, cz, 0, INIT_RANDOM};
        }
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++)
        for (int cz = NONCAUSAL; cz <= CAUSAL_BOTTOM_RIGHT; cz++) {
            names[n] = pairs[i][0] < pairs[i][1] ? "sq<sk" : "sq>sk";
            cases[n++] = (config){1, 2, 2, pairs[i][0], pairs[i][1], 64, cz, 0, INIT_RANDOM};
        }
    for (int64_t group = 1; group <= 4; group *= 2) {
        names[n] = "gqa";
        cases[n++] = (config){2, 4, 4 / group, 65, 130, 64, CAUSAL_BOTTOM_RIGHT, 0, INIT_RANDOM};
    }
    for (size_t i = 0; i < sizeof dims / sizeof *dims; i++) {
        names[n] = "headdim";
        cases[n++] = (config){1, 2, 1, 130, 65, dims[i], CAUSAL_BOTTOM_RIGHT, 0, INIT_RANDOM};
    }
    names[n] = "strided";
    cases[n++] = (config){2, 4, 2, 63, 130, 80, NONCAUSAL, 1, INIT_RANDOM};
    names[n] = "strided";
    cases[n++] = (config){2, 4, 1, 130, 63, 64, CAUSAL_BOTTOM_RIGHT, 1, INIT_RANDOM};
    names[n] = "seed";
    cases[n++] = (config){1, 1, 1, 1, 2 * FLASH_CPU_TILE_K, 1, NONCAUSAL, 0, INIT_SEED};
    names[n] = "scores~1e4";
    cases[n++] = (config){1, 1, 1, 65, 130, 1, NONCAUSAL, 0, INIT_LARGE};

    printf("tiles: %d query x %d key rows, %d OpenMP threads\n", FLASH_CPU_TILE_Q,
           FLASH_CPU_TILE_K, omp_get_max_threads());
    int failures = 0, runs = 0;
    for (int i = 0; i < n; i++)
        for (int dt = FLASH_FP32; dt <= FLASH_FP64; dt++, runs++)
            failures += run_case(&cases[i], (flash_dtype)dt, names[i]);
    printf("%s: %d of %d checks failed\n", failures ? "FAIL" : "PASS", failures, runs);
    if (argc > 1 && strcmp(argv[1], "bench") == 0)
        for (int64_t s = 1024; s <= 8192; s *= 2)
            for (int causal = 0; causal <= 1; causal++)
                bench(s, causal);
    return failures != 0;
}
