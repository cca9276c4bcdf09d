/* bwd_harness.cu: torch-free test and benchmark of the backward kernels (bwd_sm80.cu, bwd_sm90.cu,
 * bwd_simple.cu).
 *
 * Build (here or on the device):
 *   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -DFLASHATTN_EXT_SM90A -Icsrc -Icsrc/cuda \
 *        dev/bwd_harness.cu csrc/cuda/bwd_sm80.cu csrc/cuda/bwd_sm90.cu csrc/cuda/bwd_simple.cu \
 *        -o dev/bin/bwd_harness
 *   (dev/sm90_run.sh builds it and runs everything below on the device.) On a Hopper GPU the main
 *   kernel is bwd_sm90.cu's (every head dim); FLASHATTN_EXT_DISABLE_SM90=1 selects bwd_sm80.cu's.
 * Run:
 *   bwd_harness test [DTYPE]   all correctness configs, or those of one dtype (bf16, fp16, fp32,
 *                              fp64); one line each, a summary at the end
 *   bwd_harness small   a few small configs (for compute-sanitizer memcheck / racecheck)
 *   bwd_harness time    bf16 TFLOP/s, 16k tokens, nheads = 2048/d (CUDA events, median of 10)
 *   bwd_harness time1 D SEQLEN CAUSAL DET    one timing config (e.g. under ncu)
 *
 * Correctness: random N(0,1) q, k, v, dout rounded to the dtype; a double CPU reference computes the
 * forward (o, lse) and then the backward from those rounded inputs; o and lse are handed to the
 * kernels in the device types. Outputs and workspaces are poisoned with NaN (0xff bytes) first; every
 * logical element must be finite, the padding of strided outputs must still hold the poison, rows
 * that see no key must have dq exactly 0, and the relative L2 errors of dq, dk, dv must be below
 * bf16 1e-2, fp16 2e-3, fp32 1e-5, fp64 1e-12. Deterministic configs must give bitwise identical
 * dq, dk, dv over 5 runs.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "cuda/launch.h"

#define CHECK_CUDA(call)                                                                             \
    do {                                                                                             \
        cudaError_t err_ = (call);                                                                   \
        if (err_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(err_), __FILE__, __LINE__, #call); \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

#define POISON_BYTE 0xff /* all-ones is a NaN in every float format */
#define DET_RUNS 5
#define TIME_WARMUP 2
#define TIME_REPS 10
#define TIME_TOKENS 16384
#define TIME_HIDDEN 2048

enum { CAUSAL_NONE = 0, CAUSAL_TOP_LEFT = 1, CAUSAL_BOTTOM_RIGHT = 2 };

static const char *dtype_name(flash_dtype t)
{
    switch (t) {
    case FLASH_FP32: return "fp32";
    case FLASH_FP64: return "fp64";
    case FLASH_FP16: return "fp16";
    default: return "bf16";
    }
}

static size_t elem_size(flash_dtype t)
{
    return t == FLASH_FP64 ? 8 : (t == FLASH_FP32 ? 4 : 2);
}

static double tolerance(flash_dtype t)
{
    switch (t) {
    case FLASH_FP32: return 1e-5;
    case FLASH_FP64: return 1e-12;
    case FLASH_FP16: return 2e-3;
    default: return 1e-2;
    }
}

/* ---- element conversion --------------------------------------------------------------------- */

static void store_elem(void *buf, int64_t idx, flash_dtype t, double v)
{
    switch (t) {
    case FLASH_FP64: ((double *)buf)[idx] = v; break;
    case FLASH_FP32: ((float *)buf)[idx] = (float)v; break;
    case FLASH_FP16: ((__half *)buf)[idx] = __float2half_rn((float)v); break;
    default: ((__nv_bfloat16 *)buf)[idx] = __float2bfloat16_rn((float)v); break;
    }
}

static double load_elem(const void *buf, int64_t idx, flash_dtype t)
{
    switch (t) {
    case FLASH_FP64: return ((const double *)buf)[idx];
    case FLASH_FP32: return ((const float *)buf)[idx];
    case FLASH_FP16: return __half2float(((const __half *)buf)[idx]);
    default: return __bfloat162float(((const __nv_bfloat16 *)buf)[idx]);
    }
}

static double round_to(flash_dtype t, double v)
{
    unsigned char tmp[8];
    store_elem(tmp, 0, t, v);
    return load_elem(tmp, 0, t);
}

/* ---- random numbers --------------------------------------------------------------------------- */

static uint64_t rng_state;

static double rng_uniform(void) /* (0, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return ((rng_state >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static double rng_normal(void)
{
    return sqrt(-2.0 * log(rng_uniform())) * cos(6.283185307179586 * rng_uniform());
}

/* ---- parallel for on the host ----------------------------------------------------------------- */

template <typename F>
static void parallel_for(int64_t n, F fn)
{
    const int64_t nt = std::max<int64_t>(1, std::min<int64_t>(n, std::thread::hardware_concurrency()));
    std::vector<std::thread> th;
    for (int64_t t = 0; t < nt; ++t)
        th.emplace_back([=, &fn]() {
            for (int64_t i = t; i < n; i += nt)
                fn(i);
        });
    for (auto &x : th)
        x.join();
}

/* ---- test configuration --------------------------------------------------------------------- */

typedef struct test_cfg {
    flash_dtype dtype;
    int b, h, h_kv, sq, sk, d;
    int causal;  /* CAUSAL_* */
    int strided; /* tensors stored as (b, h, s, d + 8): non-contiguous strides, padded rows */
    int det;     /* deterministic mode, checked over DET_RUNS runs */
} test_cfg;

/* Layout of one (b, s, h, d) tensor. */
typedef struct layout {
    flash_strides st;
    int64_t elems; /* allocation, in elements */
} layout;

static layout make_layout(int b, int s, int h, int d, int strided)
{
    layout l;
    if (strided) {
        const int64_t dp = d + 8;
        l.st.row = dp;
        l.st.head = (int64_t)s * dp;
        l.st.batch = (int64_t)h * s * dp;
    } else {
        l.st.head = d;
        l.st.row = (int64_t)h * d;
        l.st.batch = (int64_t)s * h * d;
    }
    l.elems = (int64_t)b * l.st.batch;
    return l;
}

/* host tensors are logical (b, s, h, d) contiguous doubles */
static int64_t lidx(int s, int h, int d, int bi, int si, int hi, int di)
{
    return (((int64_t)bi * s + si) * h + hi) * d + di;
}

/* ---- double reference ------------------------------------------------------------------------- */

typedef struct reference {
    std::vector<double> o, lse, dq, dk, dv;
} reference;

static reference cpu_reference(const test_cfg &c, const std::vector<double> &q, const std::vector<double> &k,
                               const std::vector<double> &v, const std::vector<double> &dout, int64_t offset,
                               double scale)
{
    const int b = c.b, h = c.h, hkv = c.h_kv, sq = c.sq, sk = c.sk, d = c.d, hpk = h / hkv;
    reference r;
    r.o.assign((size_t)b * sq * h * d, 0.0);
    r.lse.assign((size_t)b * h * sq, -INFINITY);
    r.dq.assign((size_t)b * sq * h * d, 0.0);
    r.dk.assign((size_t)b * sk * hkv * d, 0.0);
    r.dv.assign((size_t)b * sk * hkv * d, 0.0);
    std::vector<double> P((size_t)sq * sk), dS((size_t)sq * sk);
    auto visible = [&](int64_t i, int64_t j) { return c.causal == CAUSAL_NONE || j <= i + offset; };
    for (int bi = 0; bi < b; ++bi)
        for (int hq = 0; hq < h; ++hq) {
            const int hk = hq / hpk;
            parallel_for(sq, [&](int64_t i) {
                double m = -INFINITY;
                std::vector<double> s(sk);
                for (int j = 0; j < sk; ++j) {
                    s[j] = -INFINITY;
                    if (!visible(i, j))
                        continue;
                    double acc = 0;
                    for (int x = 0; x < d; ++x)
                        acc += q[lidx(sq, h, d, bi, i, hq, x)] * k[lidx(sk, hkv, d, bi, j, hk, x)];
                    s[j] = acc * scale;
                    m = std::max(m, s[j]);
                }
                double *o = &r.o[lidx(sq, h, d, bi, i, hq, 0)];
                if (m == -INFINITY) {
                    for (int j = 0; j < sk; ++j)
                        P[i * sk + j] = dS[i * sk + j] = 0;
                    return;
                }
                double sum = 0;
                for (int j = 0; j < sk; ++j)
                    sum += s[j] == -INFINITY ? 0 : exp(s[j] - m);
                const double lse = m + log(sum);
                r.lse[((int64_t)bi * h + hq) * sq + i] = lse;
                for (int j = 0; j < sk; ++j) {
                    const double pv = s[j] == -INFINITY ? 0 : exp(s[j] - lse);
                    P[i * sk + j] = pv;
                    if (pv != 0)
                        for (int x = 0; x < d; ++x)
                            o[x] += pv * v[lidx(sk, hkv, d, bi, j, hk, x)];
                }
                double delta = 0;
                for (int x = 0; x < d; ++x)
                    delta += o[x] * dout[lidx(sq, h, d, bi, i, hq, x)];
                for (int j = 0; j < sk; ++j) {
                    double dp = 0;
                    if (P[i * sk + j] != 0)
                        for (int x = 0; x < d; ++x)
                            dp += dout[lidx(sq, h, d, bi, i, hq, x)] * v[lidx(sk, hkv, d, bi, j, hk, x)];
                    dS[i * sk + j] = P[i * sk + j] * (dp - delta);
                }
                double *dq = &r.dq[lidx(sq, h, d, bi, i, hq, 0)];
                for (int j = 0; j < sk; ++j)
                    if (dS[i * sk + j] != 0)
                        for (int x = 0; x < d; ++x)
                            dq[x] += scale * dS[i * sk + j] * k[lidx(sk, hkv, d, bi, j, hk, x)];
            });
            parallel_for(sk, [&](int64_t j) {
                double *dk = &r.dk[lidx(sk, hkv, d, bi, j, hk, 0)];
                double *dv = &r.dv[lidx(sk, hkv, d, bi, j, hk, 0)];
                for (int i = 0; i < sq; ++i) {
                    const double pv = P[i * sk + j], ds = dS[i * sk + j];
                    if (pv == 0 && ds == 0)
                        continue;
                    for (int x = 0; x < d; ++x) {
                        dk[x] += scale * ds * q[lidx(sq, h, d, bi, i, hq, x)];
                        dv[x] += pv * dout[lidx(sq, h, d, bi, i, hq, x)];
                    }
                }
            });
        }
    return r;
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
    CHECK_CUDA(cudaMalloc(&dev, host.size()));
    CHECK_CUDA(cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice));
    return dev;
}

typedef struct out_check {
    double rel_l2;
    int64_t non_finite; /* logical elements not written (still NaN) or inf */
    int64_t pad_touched;
} out_check;

/* Compare device output with layout l against the logical reference. */
static out_check check_output(const std::vector<unsigned char> &host, const std::vector<double> &ref, const layout &l,
                              int b, int s, int h, int d, flash_dtype t, int strided)
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
    if (strided)
        for (int64_t e = 0; e < l.elems; ++e)
            if (!logical[e])
                for (size_t byte = 0; byte < es; ++byte)
                    if (host[e * es + byte] != POISON_BYTE) {
                        r.pad_touched++;
                        break;
                    }
    return r;
}

/* ---- one correctness config ------------------------------------------------------------------- */

typedef struct dev_bufs {
    void *q, *k, *v, *o, *dout, *lse, *dq, *dk, *dv, *delta;
    float *dq_accum, *dk_accum, *dv_accum;
    size_t dq_bytes, dk_bytes, dv_bytes, delta_bytes, dqa_bytes, dkva_bytes;
} dev_bufs;

static void poison(const dev_bufs &db)
{
    CHECK_CUDA(cudaMemset(db.dq, POISON_BYTE, db.dq_bytes));
    CHECK_CUDA(cudaMemset(db.dk, POISON_BYTE, db.dk_bytes));
    CHECK_CUDA(cudaMemset(db.dv, POISON_BYTE, db.dv_bytes));
    CHECK_CUDA(cudaMemset(db.delta, POISON_BYTE, db.delta_bytes));
    if (db.dq_accum)
        CHECK_CUDA(cudaMemset(db.dq_accum, POISON_BYTE, db.dqa_bytes));
    if (db.dk_accum) {
        CHECK_CUDA(cudaMemset(db.dk_accum, POISON_BYTE, db.dkva_bytes));
        CHECK_CUDA(cudaMemset(db.dv_accum, POISON_BYTE, db.dkva_bytes));
    }
}

static cudaError_t run_bwd(const flash_params *p)
{
    if (p->dtype == FLASH_FP32 || p->dtype == FLASH_FP64)
        return flash_bwd_simple(p, 0);
    return flash_bwd_sm80(p, 0);
}

static int run_test(const test_cfg &c, uint64_t seed)
{
    const flash_dtype t = c.dtype;
    const int b = c.b, h = c.h, hkv = c.h_kv, sq = c.sq, sk = c.sk, d = c.d;
    const int64_t offset = c.causal == CAUSAL_BOTTOM_RIGHT ? (int64_t)sk - sq : 0;
    const double scale = 1.0 / sqrt((double)d);
    const int half = t == FLASH_FP16 || t == FLASH_BF16;

    rng_state = seed * 0x9E3779B97F4A7C15ull + 1;
    std::vector<double> q((size_t)b * sq * h * d), k((size_t)b * sk * hkv * d), v(k.size()), dout(q.size());
    for (auto *x : {&q, &k, &v, &dout})
        for (auto &e : *x)
            e = round_to(t, rng_normal());
    const reference ref = cpu_reference(c, q, k, v, dout, offset, scale);

    const layout lq = make_layout(b, sq, h, d, c.strided), lk = make_layout(b, sk, hkv, d, c.strided);
    dev_bufs db;
    memset(&db, 0, sizeof(db));
    db.q = upload(q, lq, b, sq, h, d, t);
    db.k = upload(k, lk, b, sk, hkv, d, t);
    db.v = upload(v, lk, b, sk, hkv, d, t);
    db.dout = upload(dout, lq, b, sq, h, d, t);
    db.o = upload(ref.o, lq, b, sq, h, d, t);
    const flash_dtype lse_t = t == FLASH_FP64 ? FLASH_FP64 : FLASH_FP32;
    {
        std::vector<unsigned char> lh(ref.lse.size() * elem_size(lse_t));
        for (size_t i = 0; i < ref.lse.size(); ++i)
            store_elem(lh.data(), i, lse_t, ref.lse[i]);
        CHECK_CUDA(cudaMalloc(&db.lse, lh.size()));
        CHECK_CUDA(cudaMemcpy(db.lse, lh.data(), lh.size(), cudaMemcpyHostToDevice));
        db.delta_bytes = lh.size();
        CHECK_CUDA(cudaMalloc(&db.delta, db.delta_bytes));
    }
    db.dq_bytes = lq.elems * elem_size(t);
    db.dk_bytes = db.dv_bytes = lk.elems * elem_size(t);
    CHECK_CUDA(cudaMalloc(&db.dq, db.dq_bytes));
    CHECK_CUDA(cudaMalloc(&db.dk, db.dk_bytes));
    CHECK_CUDA(cudaMalloc(&db.dv, db.dv_bytes));
    if (half) {
        db.dqa_bytes = (size_t)b * h * sq * d * sizeof(float);
        CHECK_CUDA(cudaMalloc(&db.dq_accum, db.dqa_bytes));
        if (h != hkv) {
            db.dkva_bytes = (size_t)b * sk * h * d * sizeof(float);
            CHECK_CUDA(cudaMalloc(&db.dk_accum, db.dkva_bytes));
            CHECK_CUDA(cudaMalloc(&db.dv_accum, db.dkva_bytes));
        }
    }

    flash_params p;
    memset(&p, 0, sizeof(p));
    p.q = db.q; p.k = db.k; p.v = db.v; p.o = db.o; p.lse = db.lse; p.dout = db.dout;
    p.dq = db.dq; p.dk = db.dk; p.dv = db.dv; p.delta = db.delta;
    p.dq_accum = db.dq_accum; p.dk_accum = db.dk_accum; p.dv_accum = db.dv_accum;
    p.q_s = p.o_s = p.do_s = p.dq_s = lq.st;
    p.k_s = p.v_s = p.dk_s = p.dv_s = lk.st;
    p.b = b; p.h = h; p.h_kv = hkv; p.sq = sq; p.sk = sk; p.d = d; p.h_per_kv = h / hkv;
    p.scale = scale;
    p.scale_log2 = (float)(scale * 1.4426950408889634);
    p.causal = c.causal != CAUSAL_NONE;
    p.causal_offset = offset;
    p.deterministic = c.det;
    p.dtype = t;

    std::vector<unsigned char> hq(db.dq_bytes), hk(db.dk_bytes), hv(db.dv_bytes);
    std::vector<unsigned char> hq0, hk0, hv0;
    int nondet = 0;
    const int runs = c.det ? DET_RUNS : 1;
    for (int r = 0; r < runs; ++r) {
        poison(db);
        CHECK_CUDA(run_bwd(&p));
        CHECK_CUDA(cudaDeviceSynchronize());
        CHECK_CUDA(cudaMemcpy(hq.data(), db.dq, db.dq_bytes, cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaMemcpy(hk.data(), db.dk, db.dk_bytes, cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaMemcpy(hv.data(), db.dv, db.dv_bytes, cudaMemcpyDeviceToHost));
        if (r == 0) {
            hq0 = hq; hk0 = hk; hv0 = hv;
        } else if (hq != hq0 || hk != hk0 || hv != hv0) {
            nondet++;
        }
    }

    const out_check eq = check_output(hq, ref.dq, lq, b, sq, h, d, t, c.strided);
    const out_check ek = check_output(hk, ref.dk, lk, b, sk, hkv, d, t, c.strided);
    const out_check ev = check_output(hv, ref.dv, lk, b, sk, hkv, d, t, c.strided);
    /* rows that see no key: dq exactly 0 */
    int64_t empty_rows = 0, empty_bad = 0;
    if (c.causal != CAUSAL_NONE)
        for (int bi = 0; bi < b; ++bi)
            for (int i = 0; i < sq && i + offset < 0; ++i)
                for (int hi = 0; hi < h; ++hi) {
                    empty_rows++;
                    for (int x = 0; x < d; ++x)
                        if (load_elem(hq.data(), bi * lq.st.batch + i * lq.st.row + hi * lq.st.head + x, t) != 0.0) {
                            empty_bad++;
                            break;
                        }
                }

    const double tol = tolerance(t);
    const int ok = eq.rel_l2 < tol && ek.rel_l2 < tol && ev.rel_l2 < tol && eq.non_finite + ek.non_finite + ev.non_finite == 0 &&
                   eq.pad_touched + ek.pad_touched + ev.pad_touched == 0 && empty_bad == 0 && nondet == 0;
    static const char *causal_names[] = {"none", "top-left", "bottom-right"};
    printf("%s %-4s d=%3d b=%d h=%d/%d sq=%4d sk=%4d causal=%-12s%s%s | dq %.2e dk %.2e dv %.2e",
           ok ? "PASS" : "FAIL", dtype_name(t), d, b, h, hkv, sq, sk, causal_names[c.causal], c.strided ? " strided" : "",
           c.det ? " det" : "", eq.rel_l2, ek.rel_l2, ev.rel_l2);
    if (empty_rows)
        printf(" | %lld empty rows", (long long)empty_rows);
    if (c.det)
        printf(" | %d/%d runs identical", runs - nondet, runs);
    if (eq.non_finite + ek.non_finite + ev.non_finite)
        printf(" | non-finite dq %lld dk %lld dv %lld", (long long)eq.non_finite, (long long)ek.non_finite,
               (long long)ev.non_finite);
    if (eq.pad_touched + ek.pad_touched + ev.pad_touched)
        printf(" | padding written %lld", (long long)(eq.pad_touched + ek.pad_touched + ev.pad_touched));
    if (empty_bad)
        printf(" | %lld empty rows with dq != 0", (long long)empty_bad);
    printf("\n");
    fflush(stdout);

    for (void *x : {db.q, db.k, db.v, db.o, db.dout, db.lse, db.dq, db.dk, db.dv, db.delta, (void *)db.dq_accum,
                    (void *)db.dk_accum, (void *)db.dv_accum})
        if (x)
            CHECK_CUDA(cudaFree(x));
    return ok;
}

/* ---- config lists ---------------------------------------------------------------------------- */

static std::vector<test_cfg> full_configs(void)
{
    std::vector<test_cfg> v;
    const flash_dtype dtypes[] = {FLASH_BF16, FLASH_FP16, FLASH_FP32, FLASH_FP64};
    const int dims[] = {8, 64, 80, 96, 128, 200, 256};
    const int sizes[][2] = {{1, 1},     {17, 17},  {129, 129}, {300, 300},  {1000, 1000},
                            {1, 300},   {17, 129}, {300, 17},  {129, 1000}, {1000, 129}};
    const int nd = sizeof(dims) / sizeof(dims[0]), ns = sizeof(sizes) / sizeof(sizes[0]);
    for (flash_dtype t : dtypes) {
        const int half = t == FLASH_FP16 || t == FLASH_BF16;
        for (int di = 0; di < nd; ++di)
            for (int si = 0; si < ns; ++si) {
                const int sq = sizes[si][0], sk = sizes[si][1];
                const int bsz = sq <= 300 && sk <= 300 ? 2 : 1;
                v.push_back({t, bsz, 2, 2, sq, sk, dims[di], (si + di) % 3, 0, 0});
            }
        /* sq > sk with bottom-right alignment: rows without keys */
        for (int d : {64, 128, 256}) {
            v.push_back({t, 1, 2, 2, 300, 17, d, CAUSAL_BOTTOM_RIGHT, 0, 0});
            v.push_back({t, 1, 2, 2, 1000, 129, d, CAUSAL_BOTTOM_RIGHT, 0, 0});
            v.push_back({t, 2, 2, 2, 129, 17, d, CAUSAL_TOP_LEFT, 0, 0});
        }
        /* GQA 4:1 and 2:1 */
        for (int d : {64, 128, 256}) {
            v.push_back({t, 1, 8, 2, 129, 129, d, CAUSAL_BOTTOM_RIGHT, 0, 0});
            v.push_back({t, 2, 4, 2, 300, 17, d, CAUSAL_TOP_LEFT, 0, 0});
            v.push_back({t, 1, 8, 2, 17, 300, d, CAUSAL_NONE, 0, 0});
            v.push_back({t, 1, 4, 2, 300, 1000, d, CAUSAL_BOTTOM_RIGHT, 0, 0});
        }
        /* strided */
        for (int d : {64, 96, 256}) {
            v.push_back({t, 2, 4, 2, 129, 300, d, CAUSAL_BOTTOM_RIGHT, 1, 0});
            v.push_back({t, 2, 2, 2, 300, 129, d, CAUSAL_NONE, 1, 0});
        }
        /* deterministic */
        for (int d : {64, 128, 200, 256}) {
            v.push_back({t, 1, 4, 1, 300, 300, d, CAUSAL_BOTTOM_RIGHT, 0, 1});
            v.push_back({t, 2, 2, 2, 129, 1000, d, CAUSAL_NONE, 0, 1});
        }
        if (!half)
            for (int d : {1, 33, 255}) {
                v.push_back({t, 2, 4, 2, 129, 300, d, CAUSAL_BOTTOM_RIGHT, 1, 0});
                v.push_back({t, 1, 2, 2, 300, 17, d, CAUSAL_TOP_LEFT, 0, 0});
            }
    }
    return v;
}

static std::vector<test_cfg> small_configs(void)
{
    std::vector<test_cfg> v;
    v.push_back({FLASH_BF16, 1, 2, 2, 17, 129, 64, CAUSAL_BOTTOM_RIGHT, 0, 0});
    v.push_back({FLASH_BF16, 1, 4, 2, 129, 17, 128, CAUSAL_TOP_LEFT, 0, 0});
    v.push_back({FLASH_FP16, 1, 2, 1, 70, 70, 256, CAUSAL_NONE, 1, 0});
    v.push_back({FLASH_BF16, 1, 2, 2, 100, 100, 96, CAUSAL_BOTTOM_RIGHT, 0, 1});
    v.push_back({FLASH_FP16, 1, 2, 2, 40, 200, 200, CAUSAL_BOTTOM_RIGHT, 0, 1});
    v.push_back({FLASH_FP16, 2, 4, 2, 150, 300, 48, CAUSAL_BOTTOM_RIGHT, 1, 0});
    v.push_back({FLASH_FP32, 1, 4, 2, 17, 33, 40, CAUSAL_BOTTOM_RIGHT, 1, 0});
    v.push_back({FLASH_FP64, 1, 2, 2, 20, 9, 8, CAUSAL_TOP_LEFT, 0, 0});
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

static void time_config(int d, int s, int causal, int det)
{
    const int b = TIME_TOKENS / s, h = TIME_HIDDEN / d;
    const int64_t n = (int64_t)b * s * h * d;
    __nv_bfloat16 *q, *k, *v, *o, *dout, *dq, *dk, *dv;
    float *lse, *delta, *dqa;
    for (__nv_bfloat16 **x : {&q, &k, &v, &o, &dout, &dq, &dk, &dv})
        CHECK_CUDA(cudaMalloc(x, n * sizeof(__nv_bfloat16)));
    CHECK_CUDA(cudaMalloc(&lse, (size_t)b * h * s * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&delta, (size_t)b * h * s * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&dqa, n * sizeof(float)));
    uint32_t seed = 1;
    for (__nv_bfloat16 *x : {q, k, v, o, dout})
        fill_bf16<<<1024, 256>>>(x, n, seed++);
    fill_f32<<<1024, 256>>>(lse, (int64_t)b * h * s, logf((float)s));
    CHECK_CUDA(cudaDeviceSynchronize());

    flash_params p;
    memset(&p, 0, sizeof(p));
    const layout l = make_layout(b, s, h, d, 0);
    p.q = q; p.k = k; p.v = v; p.o = o; p.lse = lse; p.dout = dout;
    p.dq = dq; p.dk = dk; p.dv = dv; p.delta = delta; p.dq_accum = dqa;
    p.q_s = p.k_s = p.v_s = p.o_s = p.do_s = p.dq_s = p.dk_s = p.dv_s = l.st;
    p.b = b; p.h = h; p.h_kv = h; p.sq = s; p.sk = s; p.d = d; p.h_per_kv = 1;
    p.scale = 1.0 / sqrt((double)d);
    p.scale_log2 = (float)(p.scale * 1.4426950408889634);
    p.causal = causal;
    p.causal_offset = 0;
    p.deterministic = det;
    p.dtype = FLASH_BF16;

    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int r = 0; r < TIME_WARMUP + TIME_REPS; ++r) {
        CHECK_CUDA(cudaEventRecord(e0));
        CHECK_CUDA(flash_bwd_sm80(&p, 0));
        CHECK_CUDA(cudaEventRecord(e1));
        CHECK_CUDA(cudaEventSynchronize(e1));
        float t;
        CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
        if (r >= TIME_WARMUP)
            ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2];
    const double flops = 2.5 * 4.0 * b * h * (double)s * s * d / (causal ? 2.0 : 1.0);
    printf("bf16 d=%3d seqlen=%5d b=%2d h=%2d causal=%d det=%d : %8.3f ms  %6.1f TFLOP/s\n", d, s, b, h, causal, det, med,
           flops / (med * 1e-3) / 1e12);
    fflush(stdout);
    CHECK_CUDA(cudaEventDestroy(e0));
    CHECK_CUDA(cudaEventDestroy(e1));
    for (void *x : {(void *)q, (void *)k, (void *)v, (void *)o, (void *)dout, (void *)dq, (void *)dk, (void *)dv,
                    (void *)lse, (void *)delta, (void *)dqa})
        CHECK_CUDA(cudaFree(x));
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "test";
    if (!strcmp(mode, "time")) {
        for (int d : {64, 128, 256})
            for (int causal : {0, 1})
                for (int s : {512, 2048, 8192})
                    time_config(d, s, causal, 0);
        for (int causal : {0, 1})
            time_config(128, 8192, causal, 1);
        return 0;
    }
    if (!strcmp(mode, "time1") && argc == 6) { /* time1 d seqlen causal det: one config (for ncu) */
        time_config(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
        return 0;
    }
    const std::vector<test_cfg> cfgs = !strcmp(mode, "small") ? small_configs() : full_configs();
    const char *only = argc > 2 ? argv[2] : NULL; /* optional dtype filter, e.g. "bf16" */
    int pass = 0, ran = 0;
    for (size_t i = 0; i < cfgs.size(); ++i) {
        if (only && strcmp(only, dtype_name(cfgs[i].dtype)))
            continue;
        ran++;
        pass += run_test(cfgs[i], i + 1);
    }
    printf("SUMMARY: %d/%d configs passed\n", pass, ran);
    return pass == ran ? 0 : 1;
}
