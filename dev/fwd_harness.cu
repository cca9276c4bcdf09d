/* fwd_harness.cu: torch-free correctness and speed harness for the forward kernels.
 *
 * Build: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc dev/fwd_harness.cu \
 *            csrc/cuda/fwd_sm80.cu csrc/cuda/fwd_simple.cu -o /tmp/fwd_harness
 * Run:   /tmp/fwd_harness check [t] every correctness case (or those of dtype t), relative L2 error of out
 *                                   and lse against a double CPU reference; exit 1 on any failure
 *        /tmp/fwd_harness bench [d] bf16 TFLOP/s, 16k tokens, nheads = 2048 / d, d 64/128/256 (or only
 *                                   d), seqlen 512/2048/8192, causal and not (median of kTimedRuns)
 * Outputs are poisoned with NaN bytes before every run: every valid element must be overwritten and
 * every padding element (strided outputs) left untouched.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "cuda/launch.h"
#include "flash.h"

#define CUDA_CHECK(x)                                                                                 \
    do {                                                                                              \
        cudaError_t err_ = (x);                                                                       \
        if (err_ != cudaSuccess) {                                                                    \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(err_));     \
            exit(2);                                                                                  \
        }                                                                                             \
    } while (0)

static const unsigned char kPoison = 0xff; /* all-ones bytes: NaN in every float format */
static const double kLog2e = 1.4426950408889634;
static const int kWarmupRuns = 3;
static const int kTimedRuns = 20;
static const int kBenchTokens = 16384;
static const int kBenchHidden = 2048;
static const int64_t kBigGap = (int64_t)1 << 31;

enum input_mode {
    MODE_NORMAL = 0, /* uniform(-1, 1) */
    MODE_LATE_MAX,   /* all queries close to u, the last 8 keys equal u: the row max arrives in the last tile */
    MODE_HUGE,       /* uniform(-16, 16), scale 10: scores of magnitude ~1e4 */
};

typedef struct test_case {
    flash_dtype dtype;
    int b, h, h_kv, sq, sk, d;
    int causal, bottom_right;
    int row_pad;     /* extra elements per row (row stride = h * d + row_pad) */
    int bhsd;        /* (b, h, s, d) memory layout viewed as (b, s, h, d) */
    int mode;
    double scale;    /* 0: 1/sqrt(d) */
    int big;         /* batches kBigGap elements apart on the device: offsets past 2^31 elements */
} test_case;

static size_t dtype_size(flash_dtype t)
{
    return t == FLASH_FP64 ? 8 : t == FLASH_FP32 ? 4 : 2;
}

static const char *dtype_name(flash_dtype t)
{
    return t == FLASH_FP64 ? "fp64" : t == FLASH_FP32 ? "fp32" : t == FLASH_FP16 ? "fp16" : "bf16";
}

static double threshold(flash_dtype t)
{
    return t == FLASH_FP64 ? 1e-12 : t == FLASH_FP32 ? 1e-5 : t == FLASH_FP16 ? 2e-3 : 1e-2;
}

/* Round x to the element type, store it at dst[i], return the rounded value. */
static double store_elem(void *dst, size_t i, flash_dtype t, double x)
{
    switch (t) {
    case FLASH_FP64: ((double *)dst)[i] = x; return x;
    case FLASH_FP32: ((float *)dst)[i] = (float)x; return (float)x;
    case FLASH_FP16: ((__half *)dst)[i] = __double2half(x); return __half2float(((__half *)dst)[i]);
    default: ((__nv_bfloat16 *)dst)[i] = __double2bfloat16(x); return __bfloat162float(((__nv_bfloat16 *)dst)[i]);
    }
}

static double load_elem(const void *src, size_t i, flash_dtype t)
{
    switch (t) {
    case FLASH_FP64: return ((const double *)src)[i];
    case FLASH_FP32: return ((const float *)src)[i];
    case FLASH_FP16: return __half2float(((const __half *)src)[i]);
    default: return __bfloat162float(((const __nv_bfloat16 *)src)[i]);
    }
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static double uniform(double lo, double hi)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return lo + (hi - lo) * (double)(g_rng >> 11) / (double)(1ull << 53);
}

/* One (b, s, h, d) tensor: host bytes, the rounded values as double (dense (b, s, h, d)), strides.
 * The host copy packs the batches (host_batch apart); on the device they are st.batch apart. */
typedef struct tensor {
    flash_strides st;
    int64_t host_batch;
    size_t elems; /* host elements */
    std::vector<unsigned char> host;
    std::vector<double> val;
    void *dev;
} tensor;

static void tensor_init(tensor *x, const test_case *c, int s, int h)
{
    if (c->bhsd) {
        x->st.row = c->d + c->row_pad;
        x->st.head = (int64_t)s * x->st.row;
        x->st.batch = (int64_t)h * x->st.head;
    } else {
        x->st.head = c->d;
        x->st.row = (int64_t)h * c->d + c->row_pad;
        x->st.batch = (int64_t)s * x->st.row;
    }
    x->host_batch = x->st.batch;
    if (c->big)
        x->st.batch += kBigGap;
    x->elems = (size_t)c->b * x->host_batch;
    x->host.assign(x->elems * dtype_size(c->dtype), kPoison);
    x->val.assign((size_t)c->b * s * h * c->d, 0.0);
    CUDA_CHECK(cudaMalloc(&x->dev, ((c->b - 1) * x->st.batch + x->host_batch) * dtype_size(c->dtype)));
}

/* Host <-> device, batch by batch; with to_device == 2, poison the device batches instead. */
static void tensor_copy(tensor *x, const test_case *c, int to_device)
{
    const size_t es = dtype_size(c->dtype);
    for (int b = 0; b < c->b; b++) {
        unsigned char *dev = (unsigned char *)x->dev + b * x->st.batch * es;
        unsigned char *host = x->host.data() + b * x->host_batch * es;
        if (to_device == 2)
            CUDA_CHECK(cudaMemset(dev, kPoison, x->host_batch * es));
        else if (to_device)
            CUDA_CHECK(cudaMemcpy(dev, host, x->host_batch * es, cudaMemcpyHostToDevice));
        else
            CUDA_CHECK(cudaMemcpy(host, dev, x->host_batch * es, cudaMemcpyDeviceToHost));
    }
}

static size_t offset_of(const tensor *x, int b, int s, int h, int i)
{
    return (size_t)(b * x->host_batch + s * x->st.row + h * x->st.head + i);
}

static size_t dense_index(const test_case *c, int s_len, int h_len, int b, int s, int h, int i)
{
    return (((size_t)b * s_len + s) * h_len + h) * c->d + i;
}

/* Double reference: out (b, sq, h, d) dense, lse (b, h, sq). */
static void reference(const test_case *c, double scale, const tensor *q, const tensor *k, const tensor *v,
                      std::vector<double> *out, std::vector<double> *lse)
{
    const int per_kv = c->h / c->h_kv;
    const int64_t off = c->bottom_right ? (int64_t)c->sk - c->sq : 0;
    std::vector<double> s(c->sk);
    out->assign((size_t)c->b * c->sq * c->h * c->d, 0.0);
    lse->assign((size_t)c->b * c->h * c->sq, -INFINITY);
    for (int b = 0; b < c->b; b++)
        for (int h = 0; h < c->h; h++)
            for (int i = 0; i < c->sq; i++) {
                const int kh = h / per_kv;
                int64_t lim = c->sk;
                if (c->causal)
                    lim = std::min<int64_t>(std::max<int64_t>(i + off + 1, 0), c->sk);
                if (lim == 0)
                    continue;
                double m = -INFINITY;
                for (int j = 0; j < lim; j++) {
                    double dot = 0;
                    for (int e = 0; e < c->d; e++)
                        dot += q->val[dense_index(c, c->sq, c->h, b, i, h, e)] *
                               k->val[dense_index(c, c->sk, c->h_kv, b, j, kh, e)];
                    s[j] = dot * scale;
                    m = std::max(m, s[j]);
                }
                double l = 0;
                double *o = &(*out)[dense_index(c, c->sq, c->h, b, i, h, 0)];
                for (int j = 0; j < lim; j++) {
                    const double pj = exp(s[j] - m);
                    l += pj;
                    for (int e = 0; e < c->d; e++)
                        o[e] += pj * v->val[dense_index(c, c->sk, c->h_kv, b, j, kh, e)];
                }
                for (int e = 0; e < c->d; e++)
                    o[e] /= l;
                (*lse)[((size_t)b * c->h + h) * c->sq + i] = m + log(l);
            }
}

static void fill_inputs(const test_case *c, tensor *q, tensor *k, tensor *v)
{
    const double amp = c->mode == MODE_HUGE ? 16.0 : 1.0;
    std::vector<double> u(c->d);
    for (int e = 0; e < c->d; e++)
        u[e] = uniform(0, 1) < 0.5 ? -1.0 : 1.0;
    for (int b = 0; b < c->b; b++) {
        for (int s = 0; s < c->sq; s++)
            for (int h = 0; h < c->h; h++)
                for (int e = 0; e < c->d; e++) {
                    double x = uniform(-amp, amp);
                    if (c->mode == MODE_LATE_MAX)
                        x = u[e] + 0.1 * x;
                    q->val[dense_index(c, c->sq, c->h, b, s, h, e)] =
                        store_elem(q->host.data(), offset_of(q, b, s, h, e), c->dtype, x);
                }
        for (int s = 0; s < c->sk; s++)
            for (int h = 0; h < c->h_kv; h++)
                for (int e = 0; e < c->d; e++) {
                    double xk = uniform(-amp, amp);
                    if (c->mode == MODE_LATE_MAX)
                        xk = s >= c->sk - 8 ? u[e] : 0.1 * xk;
                    k->val[dense_index(c, c->sk, c->h_kv, b, s, h, e)] =
                        store_elem(k->host.data(), offset_of(k, b, s, h, e), c->dtype, xk);
                    v->val[dense_index(c, c->sk, c->h_kv, b, s, h, e)] =
                        store_elem(v->host.data(), offset_of(v, b, s, h, e), c->dtype, uniform(-1, 1));
                }
    }
}

static cudaError_t run_fwd(const flash_params *p, cudaStream_t stream)
{
    if (p->dtype == FLASH_FP32 || p->dtype == FLASH_FP64)
        return flash_fwd_simple(p, stream);
    return flash_fwd_sm80(p, stream);
}

static void params_fill(flash_params *p, const test_case *c, double scale, const tensor *q, const tensor *k,
                        const tensor *v, const tensor *o, void *lse)
{
    memset(p, 0, sizeof(*p));
    p->q = q->dev;
    p->k = k->dev;
    p->v = v->dev;
    p->o = o->dev;
    p->lse = lse;
    p->q_s = q->st;
    p->k_s = k->st;
    p->v_s = v->st;
    p->o_s = o->st;
    p->b = c->b;
    p->h = c->h;
    p->h_kv = c->h_kv;
    p->sq = c->sq;
    p->sk = c->sk;
    p->d = c->d;
    p->h_per_kv = c->h / c->h_kv;
    p->scale = scale;
    p->scale_log2 = (float)(scale * kLog2e);
    p->causal = c->causal;
    p->causal_offset = c->bottom_right ? (int64_t)c->sk - c->sq : 0;
    p->dtype = c->dtype;
}

/* Runs one case; returns 1 when it passes. */
static int check_case(const test_case *c)
{
    const double scale = c->scale != 0 ? c->scale : 1.0 / sqrt((double)c->d);
    const size_t es = dtype_size(c->dtype);
    tensor q, k, v, o;
    tensor_init(&q, c, c->sq, c->h);
    tensor_init(&k, c, c->sk, c->h_kv);
    tensor_init(&v, c, c->sk, c->h_kv);
    tensor_init(&o, c, c->sq, c->h);
    fill_inputs(c, &q, &k, &v);
    tensor_copy(&q, c, 1);
    tensor_copy(&k, c, 1);
    tensor_copy(&v, c, 1);
    tensor_copy(&o, c, 2);
    const size_t lse_elems = (size_t)c->b * c->h * c->sq;
    const size_t lse_es = c->dtype == FLASH_FP64 ? 8 : 4;
    void *lse_dev;
    CUDA_CHECK(cudaMalloc(&lse_dev, lse_elems * lse_es));
    CUDA_CHECK(cudaMemset(lse_dev, kPoison, lse_elems * lse_es));

    flash_params p;
    params_fill(&p, c, scale, &q, &k, &v, &o, lse_dev);
    CUDA_CHECK(run_fwd(&p, 0));
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<unsigned char> lse_host(lse_elems * lse_es);
    tensor_copy(&o, c, 0);
    CUDA_CHECK(cudaMemcpy(lse_host.data(), lse_dev, lse_host.size(), cudaMemcpyDeviceToHost));

    std::vector<double> ref_o, ref_lse;
    reference(c, scale, &q, &k, &v, &ref_o, &ref_lse);

    /* every valid element written, every padding element untouched */
    std::vector<unsigned char> valid(o.elems, 0);
    long unwritten = 0, clobbered = 0, inf_mismatch = 0;
    double eo = 0, no = 0, el = 0, nl = 0;
    for (int b = 0; b < c->b; b++)
        for (int s = 0; s < c->sq; s++)
            for (int h = 0; h < c->h; h++)
                for (int e = 0; e < c->d; e++) {
                    const size_t at = offset_of(&o, b, s, h, e);
                    valid[at] = 1;
                    const double g = load_elem(o.host.data(), at, c->dtype);
                    const double r = ref_o[dense_index(c, c->sq, c->h, b, s, h, e)];
                    if (isnan(g))
                        unwritten++;
                    eo += (g - r) * (g - r);
                    no += r * r;
                }
    for (size_t i = 0; i < o.elems; i++)
        if (!valid[i])
            for (size_t byte = 0; byte < es; byte++)
                clobbered += o.host[i * es + byte] != kPoison;
    for (size_t i = 0; i < lse_elems; i++) {
        const double g = lse_es == 8 ? ((double *)lse_host.data())[i] : ((float *)lse_host.data())[i];
        const double r = ref_lse[i];
        if (isnan(g))
            unwritten++;
        else if (isinf(r) || isinf(g))
            inf_mismatch += !(isinf(r) && isinf(g) && r < 0 && g < 0);
        else {
            el += (g - r) * (g - r);
            nl += r * r;
        }
    }
    const double rel_o = no > 0 ? sqrt(eo / no) : sqrt(eo);
    const double rel_l = nl > 0 ? sqrt(el / nl) : sqrt(el);
    const double tol = threshold(c->dtype);
    const int ok = unwritten == 0 && clobbered == 0 && inf_mismatch == 0 && rel_o <= tol && rel_l <= tol;
    printf("%-4s b%-2d h%-2d/%-2d sq%-5d sk%-5d d%-3d %-6s%-3s pad%-3d %-4s%s %-8s | out %.2e lse %.2e | %s",
           dtype_name(c->dtype), c->b, c->h, c->h_kv, c->sq, c->sk, c->d, c->causal ? "causal" : "full",
           c->causal ? (c->bottom_right ? "br" : "tl") : "", c->row_pad, c->bhsd ? "bhsd" : "bshd", c->big ? "+4G" : "",
           c->mode == MODE_LATE_MAX ? "late-max" : c->mode == MODE_HUGE ? "huge" : "normal", rel_o, rel_l,
           ok ? "ok" : "FAIL");
    if (c->scale != 0)
        printf(" (scale %g)", c->scale);
    if (!ok)
        printf(" (unwritten %ld, clobbered %ld, -inf mismatch %ld)", unwritten, clobbered, inf_mismatch);
    printf("\n");
    CUDA_CHECK(cudaFree(q.dev));
    CUDA_CHECK(cudaFree(k.dev));
    CUDA_CHECK(cudaFree(v.dev));
    CUDA_CHECK(cudaFree(o.dev));
    CUDA_CHECK(cudaFree(lse_dev));
    return ok;
}

/* Arguments the kernels must refuse with cudaErrorInvalidValue. */
static int check_rejects(void)
{
    int ok = 1;
    const struct { flash_dtype t; int d; } bad[] = {{FLASH_BF16, 36}, {FLASH_FP16, 264}, {FLASH_FP32, 257},
                                                   {FLASH_FP64, 300}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        flash_params p;
        memset(&p, 0, sizeof(p));
        p.dtype = bad[i].t;
        p.b = p.h = p.h_kv = p.h_per_kv = 1;
        p.sq = p.sk = 1;
        p.d = bad[i].d;
        const cudaError_t e = run_fwd(&p, 0);
        printf("reject %s d%d: %s\n", dtype_name(bad[i].t), bad[i].d, e == cudaErrorInvalidValue ? "ok" : "FAIL");
        ok &= e == cudaErrorInvalidValue;
    }
    return ok;
}

static int run_checks(const char *only_dtype)
{
    std::vector<test_case> cases;
    const flash_dtype halves[] = {FLASH_BF16, FLASH_FP16};
    for (flash_dtype t : halves) {
        /* every head-dim config and padded head dims */
        const int dims[] = {8, 40, 64, 80, 96, 128, 200, 256};
        for (int d : dims)
            cases.push_back({t, 2, 3, 3, 200, 300, d, 0, 0, 0, 0, MODE_NORMAL, 0, 0});
        /* tails, full and causal both alignments */
        const int tails[][2] = {{1, 1}, {17, 17}, {127, 129}, {129, 127}, {1000, 1000}, {1, 1000}, {1000, 17},
                                {300, 100}};
        for (auto &sz : tails)
            for (int causal = 0; causal < 2; causal++)
                for (int br = 0; br < 1 + causal; br++) {
                    const int d = sz[0] == 1000 && sz[1] == 1000 ? 64 : 128;
                    cases.push_back({t, 1, 2, 2, sz[0], sz[1], d, causal, br, 0, 0, MODE_NORMAL, 0, 0});
                }
        cases.push_back({t, 1, 2, 2, 257, 383, 256, 1, 1, 0, 0, MODE_NORMAL, 0, 0});
        cases.push_back({t, 1, 2, 2, 383, 257, 256, 1, 1, 0, 0, MODE_NORMAL, 0, 0});
        cases.push_back({t, 1, 2, 2, 200, 450, 80, 1, 0, 0, 0, MODE_NORMAL, 0, 0});
        /* GQA 4:1, strided rows, (b, h, s, d) layout */
        cases.push_back({t, 2, 8, 2, 150, 222, 64, 1, 1, 0, 0, MODE_NORMAL, 0, 0});
        cases.push_back({t, 2, 8, 2, 130, 130, 128, 0, 0, 24, 0, MODE_NORMAL, 0, 0});
        cases.push_back({t, 2, 4, 4, 100, 260, 96, 1, 1, 16, 0, MODE_NORMAL, 0, 0});
        cases.push_back({t, 2, 4, 1, 190, 190, 64, 1, 0, 8, 1, MODE_NORMAL, 0, 0});
        /* row max in the last key tile; scores of magnitude 1e4; negative scale */
        cases.push_back({t, 1, 2, 2, 64, 512, 128, 0, 0, 0, 0, MODE_LATE_MAX, 0, 0});
        cases.push_back({t, 1, 2, 2, 64, 300, 64, 0, 0, 0, 0, MODE_LATE_MAX, 0, 0});
        cases.push_back({t, 1, 2, 2, 64, 200, 256, 0, 0, 0, 0, MODE_LATE_MAX, 0, 0});
        cases.push_back({t, 1, 2, 2, 150, 333, 128, 0, 0, 0, 0, MODE_HUGE, 10.0, 0});
        cases.push_back({t, 1, 2, 2, 150, 333, 64, 1, 1, 0, 0, MODE_HUGE, 10.0, 0});
        cases.push_back({t, 1, 2, 2, 100, 140, 128, 1, 1, 0, 0, MODE_NORMAL, -0.2, 0});
        cases.push_back({t, 2, 2, 1, 100, 130, 64, 1, 1, 0, 0, MODE_NORMAL, 0, 1});
    }
    const flash_dtype fulls[] = {FLASH_FP32, FLASH_FP64};
    for (flash_dtype t : fulls) {
        const int dims[] = {1, 3, 8, 33, 64, 200, 256};
        for (int d : dims)
            cases.push_back({t, 2, 3, 3, 70, 90, d, 0, 0, 0, 0, MODE_NORMAL, 0, 0});
        const int tails[][2] = {{1, 1}, {17, 17}, {127, 129}, {1, 300}, {300, 100}};
        for (auto &sz : tails)
            for (int causal = 0; causal < 2; causal++)
                for (int br = 0; br < 1 + causal; br++)
                    cases.push_back({t, 1, 2, 2, sz[0], sz[1], 48, causal, br, 0, 0, MODE_NORMAL, 0, 0});
        cases.push_back({t, 2, 8, 2, 60, 77, 40, 1, 1, 5, 0, MODE_NORMAL, 0, 0});
        cases.push_back({t, 2, 4, 1, 50, 50, 24, 1, 0, 3, 1, MODE_NORMAL, 0, 0});
        cases.push_back({t, 1, 2, 2, 40, 200, 64, 0, 0, 0, 0, MODE_LATE_MAX, 0, 0});
        cases.push_back({t, 1, 2, 2, 50, 90, 64, 1, 1, 0, 0, MODE_HUGE, 10.0, 0});
        cases.push_back({t, 2, 2, 1, 40, 50, 16, 1, 1, 0, 0, MODE_NORMAL, 0, 1});
    }
    int passed = 0, failed = 0;
    for (const test_case &c : cases)
        if (!only_dtype || !strcmp(only_dtype, dtype_name(c.dtype)))
            check_case(&c) ? passed++ : failed++;
    check_rejects() ? passed++ : failed++;
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0;
}

__global__ void fill_random_bf16(__nv_bfloat16 *x, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        x[i] = __float2bfloat16((float)(h & 0xffff) / 32768.0f - 1.0f);
    }
}

static void run_bench(int only_d)
{
    const size_t n = (size_t)kBenchTokens * kBenchHidden;
    __nv_bfloat16 *q, *k, *v, *o;
    float *lse;
    CUDA_CHECK(cudaMalloc(&q, n * 2));
    CUDA_CHECK(cudaMalloc(&k, n * 2));
    CUDA_CHECK(cudaMalloc(&v, n * 2));
    CUDA_CHECK(cudaMalloc(&o, n * 2));
    CUDA_CHECK(cudaMalloc(&lse, (size_t)kBenchTokens * kBenchHidden / 8 * sizeof(float)));
    fill_random_bf16<<<1024, 256>>>(q, n, 1);
    fill_random_bf16<<<1024, 256>>>(k, n, 2);
    fill_random_bf16<<<1024, 256>>>(v, n, 3);
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    const int dims[] = {64, 128, 256};
    const int seqs[] = {512, 2048, 8192};
    printf("bf16 fwd TFLOP/s (16k tokens, nheads = 2048 / d)\n");
    printf("%-5s %-6s %-7s %-9s %s\n", "d", "seq", "causal", "ms", "TFLOP/s");
    for (int d : dims)
        for (int causal = 0; causal < 2; causal++)
            for (int s : seqs) {
                if (only_d && d != only_d)
                    continue;
                test_case c = {FLASH_BF16, kBenchTokens / s, kBenchHidden / d, kBenchHidden / d, s, s, d, causal,
                               1, 0, 0, MODE_NORMAL, 0, 0};
                flash_params p;
                memset(&p, 0, sizeof(p));
                p.q = q;
                p.k = k;
                p.v = v;
                p.o = o;
                p.lse = lse;
                p.q_s.head = p.k_s.head = p.v_s.head = p.o_s.head = d;
                p.q_s.row = p.k_s.row = p.v_s.row = p.o_s.row = kBenchHidden;
                p.q_s.batch = p.k_s.batch = p.v_s.batch = p.o_s.batch = (int64_t)s * kBenchHidden;
                p.b = c.b;
                p.h = p.h_kv = c.h;
                p.h_per_kv = 1;
                p.sq = p.sk = s;
                p.d = d;
                p.scale = 1.0 / sqrt((double)d);
                p.scale_log2 = (float)(p.scale * kLog2e);
                p.causal = causal;
                p.dtype = FLASH_BF16;
                std::vector<float> ms(kTimedRuns);
                for (int i = 0; i < kWarmupRuns; i++)
                    CUDA_CHECK(flash_fwd_sm80(&p, 0));
                for (int i = 0; i < kTimedRuns; i++) {
                    CUDA_CHECK(cudaEventRecord(start));
                    CUDA_CHECK(flash_fwd_sm80(&p, 0));
                    CUDA_CHECK(cudaEventRecord(stop));
                    CUDA_CHECK(cudaEventSynchronize(stop));
                    CUDA_CHECK(cudaEventElapsedTime(&ms[i], start, stop));
                }
                std::sort(ms.begin(), ms.end());
                const double t = ms[kTimedRuns / 2] * 1e-3;
                const double flops = 4.0 * c.b * c.h * (double)s * s * d / (causal ? 2 : 1);
                printf("%-5d %-6d %-7s %-9.3f %.1f\n", d, s, causal ? "yes" : "no", t * 1e3, flops / t * 1e-12);
            }
    CUDA_CHECK(cudaFree(q));
    CUDA_CHECK(cudaFree(k));
    CUDA_CHECK(cudaFree(v));
    CUDA_CHECK(cudaFree(o));
    CUDA_CHECK(cudaFree(lse));
}

int main(int argc, char **argv)
{
    if (argc < 2 || (strcmp(argv[1], "check") && strcmp(argv[1], "bench"))) {
        fprintf(stderr, "usage: %s check [bf16|fp16|fp32|fp64] | bench [head dim]\n", argv[0]);
        return 2;
    }
    if (!strcmp(argv[1], "bench")) {
        run_bench(argc > 2 ? atoi(argv[2]) : 0);
        return 0;
    }
    return run_checks(argc > 2 ? argv[2] : NULL) ? 0 : 1;
}
