/* fwd_harness.cu: torch-free correctness and speed harness for the forward kernels.
 *
 * Build: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -DFLASHATTN_EXT_SM90A -Icsrc -Icsrc/cuda \
 *            dev/fwd_harness.cu csrc/cuda/launch.cu csrc/cuda/fwd_sm80.cu csrc/cuda/fwd_sm90.cu csrc/cuda/fwd_decode.cu \
 *            csrc/cuda/simple.cu csrc/cuda/bwd_sm80.cu csrc/cuda/bwd_sm90.cu \
 *            csrc/cuda/rows.cu -o /tmp/fwd_harness
 *        (the checks call launch.cu's flash_fwd_cuda, which links the backward too; dev/device.sh build / ab)
 * Run:   /tmp/fwd_harness check [t]     every correctness case (or those of dtype t), relative L2 error of
 *                                       out and lse against dev/attn_ref.h (double); exit 1 on any failure
 *        /tmp/fwd_harness bench [d]     bf16 TFLOP/s, 16k tokens, nheads = 2048 / d, d 64/128/256 (or only
 *                                       d), seqlen 512/1k/2k/4k/8k, causal and not (median of kTimedRuns),
 *                                       through launch.cu's dispatch (on Hopper fwd_sm90.cu;
 *                                       FLASHATTN_EXT_DISABLE_SM90=1: fwd_sm80.cu), as variants, varlen-bench
 *        /tmp/fwd_harness variants [d]  bf16 TFLOP/s of each variant (window, softcap, ALiBi, masks,
 *                                       dropout, sink) beside the dense kernel, d 128 (or d), 16k tokens;
 *                                       TFLOP/s count the visible (query, key) pairs only
 *        /tmp/fwd_harness varlen-bench [d]  bench's shapes dense, as varlen of equal lengths, and as varlen
 *                                       of random lengths 1..2 seq (TFLOP/s on the visible pairs)
 *        /tmp/fwd_harness paged-bench   bf16 decode (sq 1) b8 h32 (and GQA 32/8) d128, caches 4k / 32k /
 *                                       128k, contiguous and paged (pages of 256 in a random order), through
 *                                       the prefill kernel (fwd_sm80): ms and the K + V read bandwidth
 *        /tmp/fwd_harness decode-bench  the same decode shapes at b8 and b1 through launch.cu's dispatch (the
 *                                       decode kernel, split-KV by its heuristic and with one split)
 * Every forward runs with launch.cu's split-KV choice for HARNESS_NUM_SPLITS (default 0, the heuristic).
 * HARNESS_SEQ=S: bench and varlen-bench time seqlen S only (one config under ncu). HARNESS_STATIC=1: no tile
 * counter, so fwd_sm90.cu's varlen batches run one CTA per query tile (A/B of its dynamic scheduler);
 * HARNESS_DYNAMIC=1: a counter for dense batches too (the dynamic scheduler against the static order).
 * Cases cover the band (full, causal both alignments, sliding windows), softcap, ALiBi (per head and per
 * batch), bool and additive attn_mask (random, key padding, block-sparse, rows with no visible key;
 * broadcast dimensions, strided / transposed storage; block flags), dropout, sinks, and pairs of them.
 * Varlen batches (cu_seqlens, seqused_k) and KV-cache batches (k_batch_idx, k_leftpad, seqused_k): one
 * call over the whole batch, each sequence checked against the reference run on it alone; lengths 0 and
 * 1, sq != sk, GQA, each band and hook (no attn_mask or dropout); K / V rows that are no sequence's keys
 * hold NaN, so a load that reads one into a tile shows.
 * Paged KV caches (block_table, with seqused_k and k_leftpad): random page sizes and page orders, pages
 * shared by two sequences and pages named by no table entry (NaN), cache lengths 0, 1 and full, GQA, v
 * strides other than k's, each band and hook; every key row the harness uses must be the one mask.h's
 * flash_key_offset gives.
 * Outputs are poisoned with NaN bytes before every run: every valid element must be overwritten and
 * every padding element (strided outputs, rows of no sequence) left untouched.
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

#include "attn_ref.h"
#include "common.h"
#include "cuda/launch.h"

static const int kWarmupRuns = 3;
static const int kTimedRuns = 20;
static const int kBenchTokens = 16384;
static const int kBenchHidden = 2048;
static const int64_t kBigGap = (int64_t)1 << 31;
static const uint64_t kSeed = 0x0123456789abcdefull;   /* Philox seed and offset: both 32-bit halves used */
static const uint64_t kOffset = 0x00000005fedcba98ull;
static const int kSparseRows = 128; /* block-sparse masks: blocks of kSparseRows x kSparseCols */
static const int kSparseCols = 64;

enum input_mode {
    MODE_NORMAL = 0, /* uniform(-1, 1) */
    MODE_LATE_MAX,   /* all queries close to u, the last 8 keys equal u: the row max arrives in the last tile */
    MODE_HUGE,       /* uniform(-16, 16), scale 10: scores of magnitude ~1e4 */
    MODE_IDENTITY_V, /* v[j] = unit vector j (sk <= d): out[i][j] is P_ij itself, each dropout / mask bit shows */
};

enum band_kind {
    BAND_FULL = 0,
    BAND_CAUSAL_TL, /* j <= i */
    BAND_CAUSAL_BR, /* j <= i + sk - sq */
    BAND_WINDOW,    /* flash-attn window (left, right), -1 unbounded, bottom-right aligned */
};

enum mask_pattern {
    MASKP_RANDOM = 0, /* bool: True w.p. 0.7; additive: uniform(-2, 2), 20% -inf */
    MASKP_KEYPAD,     /* per batch, keys >= len_b hidden (the usual padding mask; broadcast over rows) */
    MASKP_BLOCKS,     /* blocks of kSparseRows x kSparseCols, each hidden / plain / random */
    MASKP_EMPTY_ROWS, /* random, plus every row i % 7 == 3 wholly hidden */
};

/* attn_mask storage: broadcast flags and layout */
#define MASK_BCAST_B 1 /* (1, h, ., .) */
#define MASK_BCAST_H 2 /* (., 1, ., .) */
#define MASK_BCAST_ROW 4 /* (., ., 1, sk) */
#define MASK_COLMAJOR 8 /* stored (b, h, sk, sq) and viewed transposed: col stride != 1 */

typedef struct variant {
    int band, left, right;  /* BAND_WINDOW: (left, right) */
    float softcap;
    int alibi;              /* 0 none, 1 slopes (h,), 2 slopes (b, h) */
    int mask_kind;          /* flash_mask_kind */
    int mask_pattern;
    int mask_layout;        /* MASK_* flags */
    double dropout;         /* probability of dropping */
    int sink;
    int force_hook;         /* has_hook = 1 even with no hook field set */
} variant;

typedef struct test_case {
    flash_dtype dtype;
    int b, h, h_kv, sq, sk, d;
    variant v;
    int row_pad;     /* extra elements per row (row stride = h * d + row_pad) */
    int bhsd;        /* (b, h, s, d) memory layout viewed as (b, s, h, d) */
    int mode;
    double scale;    /* 0: 1/sqrt(d) */
    int big;         /* batches kBigGap elements apart on the device: offsets past 2^31 elements */
} test_case;

static test_case mk(flash_dtype t, int b, int h, int h_kv, int sq, int sk, int d, int band)
{
    test_case c;
    memset(&c, 0, sizeof(c));
    c.dtype = t;
    c.b = b;
    c.h = h;
    c.h_kv = h_kv;
    c.sq = sq;
    c.sk = sk;
    c.d = d;
    c.v.band = band;
    c.v.left = c.v.right = -1;
    c.mode = MODE_NORMAL;
    return c;
}

static test_case window(test_case c, int left, int right)
{
    c.v.band = BAND_WINDOW;
    c.v.left = left;
    c.v.right = right;
    return c;
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
    x->host.assign(x->elems * elem_size(c->dtype), kPoison);
    x->val.assign((size_t)c->b * s * h * c->d, 0.0);
    CUDA_CHECK(cudaMalloc(&x->dev, ((c->b - 1) * x->st.batch + x->host_batch) * elem_size(c->dtype)));
}

/* Host <-> device, batch by batch; with to_device == 2, poison the device batches instead. */
static void tensor_copy(tensor *x, const test_case *c, int to_device)
{
    const size_t es = elem_size(c->dtype);
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
                    const double xv = c->mode == MODE_IDENTITY_V ? (s == e ? 1.0 : 0.0) : uniform(-1, 1);
                    v->val[dense_index(c, c->sk, c->h_kv, b, s, h, e)] =
                        store_elem(v->host.data(), offset_of(v, b, s, h, e), c->dtype, xv);
                }
    }
}

/* The band fields of flash_params from the case's band kind (the binding's formulas; mask.h's
 * flash_seq_of turns them into each sequence's diag_lo / diag_hi): causal band_right = 0, window
 * (left, right) as given, -1 unbounded; bottom-right aligned except BAND_CAUSAL_TL. */
static void band_fill(flash_params *p, const variant *v)
{
    p->band_left = p->band_right = -1;
    p->band_bottom_right = v->band != BAND_CAUSAL_TL;
    if (v->band == BAND_CAUSAL_TL || v->band == BAND_CAUSAL_BR)
        p->band_right = 0;
    else if (v->band == BAND_WINDOW) {
        p->band_left = v->left;
        p->band_right = v->right;
    }
}

/* Variant inputs of one case: ALiBi slopes, attn_mask (device storage, block flags, and the expanded
 * additive double copy the reference reads), sinks; with their device buffers. */
typedef struct variant_data {
    std::vector<float> slopes;
    std::vector<double> mask;   /* (b, h, sq, sk) additive, -inf = hidden */
    std::vector<double> sink;   /* (h,) */
    void *slopes_dev, *mask_dev, *blocks_dev, *sink_dev;
} variant_data;

/* Fills the variant fields of p (device pointers) and vd. */
static void variants_fill(flash_params *p, const test_case *c, variant_data *vd)
{
    const variant *v = &c->v;
    const int b = c->b, h = c->h, sq = c->sq, sk = c->sk;
    vd->slopes_dev = vd->mask_dev = vd->blocks_dev = vd->sink_dev = NULL;
    p->softcap = v->softcap;
    if (v->alibi) {
        const int ab = v->alibi == 2 ? b : 1;
        vd->slopes.resize((size_t)ab * h);
        for (int i = 0; i < ab * h; i++)
            vd->slopes[i] = (float)(pow(2.0, -8.0 * (i % h + 1) / h) * (1 + 0.25 * (i / h)));
        CUDA_CHECK(cudaMalloc(&vd->slopes_dev, vd->slopes.size() * sizeof(float)));
        CUDA_CHECK(cudaMemcpy(vd->slopes_dev, vd->slopes.data(), vd->slopes.size() * sizeof(float),
                              cudaMemcpyHostToDevice));
        p->alibi_slopes = (const float *)vd->slopes_dev;
        p->alibi_batch_stride = v->alibi == 2 ? h : 0;
    }
    if (v->mask_kind != FLASH_MASK_NONE) {
        const int mb = v->mask_layout & MASK_BCAST_B ? 1 : b;
        const int mh = v->mask_layout & MASK_BCAST_H ? 1 : h;
        const int mr = v->mask_layout & MASK_BCAST_ROW ? 1 : sq;
        const bool additive = v->mask_kind == FLASH_MASK_ADD;
        /* the stored mask (mb, mh, mr, sk), values as double additive */
        std::vector<double> m((size_t)mb * mh * mr * sk);
        std::vector<int> blk_state((size_t)mb * mh * (sq / kSparseRows + 1) * (sk / kSparseCols + 1));
        for (size_t i = 0; i < blk_state.size(); i++)
            blk_state[i] = (int)(uniform(0, 3)); /* 0 hidden, 1 plain, 2 random */
        for (int bi = 0; bi < mb; bi++)
            for (int hi = 0; hi < mh; hi++)
                for (int r = 0; r < mr; r++)
                    for (int j = 0; j < sk; j++) {
                        const int len = sk - (bi * 37 + hi * 11) % (sk / 2 + 1);
                        double x;
                        bool vis;
                        switch (v->mask_pattern) {
                        case MASKP_KEYPAD: vis = j < len; x = 0; break;
                        case MASKP_BLOCKS: {
                            const int st = blk_state[(((size_t)bi * mh + hi) * (sq / kSparseRows + 1) +
                                                      r / kSparseRows) * (sk / kSparseCols + 1) + j / kSparseCols];
                            vis = st == 1 || (st == 2 && uniform(0, 1) < 0.7);
                            x = st == 2 ? uniform(-2, 2) : 0;
                            break;
                        }
                        default:
                            vis = uniform(0, 1) < (additive ? 0.8 : 0.7);
                            x = uniform(-2, 2);
                            if (v->mask_pattern == MASKP_EMPTY_ROWS && r % 7 == 3)
                                vis = false;
                        }
                        m[(((size_t)bi * mh + hi) * mr + r) * sk + j] = vis ? (additive ? x : 0.0) : -INFINITY;
                    }
        /* device storage, rounded to the element type */
        const size_t es = additive ? elem_size(c->dtype) : 1;
        std::vector<unsigned char> host(m.size() * es);
        const bool colmajor = v->mask_layout & MASK_COLMAJOR;
        for (int bi = 0; bi < mb; bi++)
            for (int hi = 0; hi < mh; hi++)
                for (int r = 0; r < mr; r++)
                    for (int j = 0; j < sk; j++) {
                        const size_t at = (((size_t)bi * mh + hi) * mr + r) * sk + j;
                        const size_t to = colmajor ? (((size_t)bi * mh + hi) * sk + j) * mr + r : at;
                        if (additive)
                            m[at] = store_elem(host.data(), to, c->dtype, m[at]);
                        else
                            host[to] = m[at] == 0.0;
                    }
        CUDA_CHECK(cudaMalloc(&vd->mask_dev, host.size()));
        CUDA_CHECK(cudaMemcpy(vd->mask_dev, host.data(), host.size(), cudaMemcpyHostToDevice));
        p->mask = vd->mask_dev;
        p->mask_kind = (flash_mask_kind)v->mask_kind;
        p->mask_s.col = colmajor ? mr : 1;
        p->mask_s.row = mr == 1 ? 0 : colmajor ? 1 : sk;
        p->mask_s.head = mh == 1 ? 0 : (int64_t)mr * sk;
        p->mask_s.batch = mb == 1 ? 0 : (int64_t)mh * mr * sk;
        /* expanded copy for the reference, and the block flags (mb, mh, nr, nc) */
        vd->mask.resize((size_t)b * h * sq * sk);
        const int nr = (sq + FLASH_MASK_BLOCK - 1) / FLASH_MASK_BLOCK;
        const int nc = (sk + FLASH_MASK_BLOCK - 1) / FLASH_MASK_BLOCK;
        std::vector<uint8_t> blocks((size_t)mb * mh * nr * nc, 0);
        for (int bi = 0; bi < b; bi++)
            for (int hi = 0; hi < h; hi++)
                for (int i = 0; i < sq; i++)
                    for (int j = 0; j < sk; j++) {
                        const int sb = mb == 1 ? 0 : bi, sh = mh == 1 ? 0 : hi, sr = mr == 1 ? 0 : i;
                        const double x = m[(((size_t)sb * mh + sh) * mr + sr) * sk + j];
                        vd->mask[(((size_t)bi * h + hi) * sq + i) * sk + j] = x;
                        uint8_t &f =
                            blocks[(((size_t)sb * mh + sh) * nr + i / FLASH_MASK_BLOCK) * nc + j / FLASH_MASK_BLOCK];
                        if (x != -INFINITY)
                            f |= FLASH_MASK_ANY_VISIBLE;
                        if (x != 0.0)
                            f |= FLASH_MASK_ANY_MASKED;
                    }
        CUDA_CHECK(cudaMalloc(&vd->blocks_dev, blocks.size()));
        CUDA_CHECK(cudaMemcpy(vd->blocks_dev, blocks.data(), blocks.size(), cudaMemcpyHostToDevice));
        p->mask_blocks = (const uint8_t *)vd->blocks_dev;
        p->mask_blocks_s.col = 1;
        p->mask_blocks_s.row = nc;
        p->mask_blocks_s.head = mh == 1 ? 0 : (int64_t)nr * nc;
        p->mask_blocks_s.batch = mb == 1 ? 0 : (int64_t)mh * nr * nc;
    }
    set_dropout(p, v->dropout, kSeed, kOffset);
    if (v->sink) {
        vd->sink.resize(h);
        const size_t es = c->dtype == FLASH_FP64 ? 8 : 4;
        std::vector<unsigned char> host(h * es);
        for (int i = 0; i < h; i++) {
            const double x = i == 0 ? 8.0 : uniform(-2, 2); /* head 0: a sink that dominates */
            if (es == 8)
                ((double *)host.data())[i] = vd->sink[i] = x;
            else
                vd->sink[i] = ((float *)host.data())[i] = (float)x;
        }
        CUDA_CHECK(cudaMalloc(&vd->sink_dev, host.size()));
        CUDA_CHECK(cudaMemcpy(vd->sink_dev, host.data(), host.size(), cudaMemcpyHostToDevice));
        p->sink = vd->sink_dev;
    }
    p->has_hook = v->force_hook || p->softcap > 0 || p->alibi_slopes || p->mask || p->dropout_threshold;
}

static void variants_free(variant_data *vd)
{
    void *bufs[] = {vd->slopes_dev, vd->mask_dev, vd->blocks_dev, vd->sink_dev};
    for (void *x : bufs)
        if (x)
            CUDA_CHECK(cudaFree(x));
}

/* The split-KV request of every forward the harness runs (launch.h flash_fwd_splits): HARNESS_NUM_SPLITS, default 0
 * (launch.cu's heuristic); it matters only where launch.cu takes the decode kernel. */
static int harness_splits(void)
{
    const char *env = getenv("HARNESS_NUM_SPLITS");
    return env != NULL ? atoi(env) : 0;
}

static bool env_flag(const char *name)
{
    const char *env = getenv(name);
    return env != NULL && env[0] != '\0' && env[0] != '0';
}

/* HARNESS_STATIC=1: no tile counter for the dynamic scheduler of fwd_sm90.cu (its static schedule, for A/B). */
static bool harness_static(void)
{
    return env_flag("HARNESS_STATIC");
}

/* HARNESS_DYNAMIC=1: a tile counter for every call, dense batches too; fwd_sm90.cu runs its dynamic scheduler
 * wherever its kernel has one (the dense kernels at d <= 128) and every other kernel ignores the counter (A/B
 * against the static persistent order). */
static bool harness_dynamic(void)
{
    return env_flag("HARNESS_DYNAMIC");
}

/* flash_fwd_cuda with launch.cu's split count for `requested` and, where launch.cu asks for one, a zeroed tile
 * counter (as the binding's); the split workspaces live in one buffer kept between calls (grown when short,
 * which synchronizes), the counter in one int32 zeroed on the stream before each call. */
static cudaError_t run_fwd_splits(const flash_params *p0, int requested, cudaStream_t stream)
{
    static float *accum = NULL;
    static size_t accum_bytes = 0;
    static int32_t *counter = NULL;
    flash_params p = *p0;
    p.num_splits = flash_fwd_splits(&p, requested);
    if (p.num_splits > 1) {
        const size_t rows = (size_t)p.num_splits * p.b * p.h * p.sq;
        const size_t bytes = rows * (size_t)(p.d + 1) * sizeof(float);
        if (bytes > accum_bytes) {
            if (accum != NULL)
                CUDA_CHECK(cudaFree(accum));
            CUDA_CHECK(cudaMalloc(&accum, bytes));
            accum_bytes = bytes;
        }
        p.o_accum = accum;
        p.lse_accum = accum + rows * p.d;
    }
    if (!harness_static() && (flash_fwd_wants_tile_counter(&p) || harness_dynamic())) {
        if (counter == NULL)
            CUDA_CHECK(cudaMalloc(&counter, sizeof(int32_t)));
        CUDA_CHECK(cudaMemsetAsync(counter, 0, sizeof(int32_t), stream));
        p.tile_counter = counter;
    }
    return flash_fwd_cuda(&p, stream);
}

static cudaError_t run_fwd(const flash_params *p, cudaStream_t stream)
{
    return run_fwd_splits(p, harness_splits(), stream);
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
    fill_sizes(p, c->dtype, c->b, c->h, c->h_kv, c->sq, c->sk, c->d, scale);
    band_fill(p, &c->v);
}

static void describe(char *buf, size_t n, const test_case *c)
{
    const variant *v = &c->v;
    const char *band[] = {"full", "causal-tl", "causal-br", "window"};
    const char *pat[] = {"random", "keypad", "blocks", "emptyrows"};
    int at = snprintf(buf, n, "%s", band[v->band]);
    if (v->band == BAND_WINDOW)
        at += snprintf(buf + at, n - at, "(%d,%d)", v->left, v->right);
    if (v->softcap > 0)
        at += snprintf(buf + at, n - at, " cap%g", v->softcap);
    if (v->alibi)
        at += snprintf(buf + at, n - at, " alibi%s", v->alibi == 2 ? "(b,h)" : "(h)");
    if (v->mask_kind)
        at += snprintf(buf + at, n - at, " %s-%s%s%s%s%s", v->mask_kind == FLASH_MASK_BOOL ? "bool" : "add",
                       pat[v->mask_pattern], v->mask_layout & MASK_BCAST_B ? " B1" : "",
                       v->mask_layout & MASK_BCAST_H ? " H1" : "", v->mask_layout & MASK_BCAST_ROW ? " R1" : "",
                       v->mask_layout & MASK_COLMAJOR ? " colmajor" : "");
    if (v->dropout > 0)
        at += snprintf(buf + at, n - at, " drop%g", v->dropout);
    if (v->sink)
        at += snprintf(buf + at, n - at, " sink");
    if (v->force_hook)
        at += snprintf(buf + at, n - at, " hook");
}

/* Runs one case; returns 1 when it passes. */
static int check_case(const test_case *c)
{
    const double scale = c->scale != 0 ? c->scale : 1.0 / sqrt((double)c->d);
    const size_t es = elem_size(c->dtype);
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
    const size_t lse_es = elem_size(lse_type(c->dtype));
    void *lse_dev;
    CUDA_CHECK(cudaMalloc(&lse_dev, lse_elems * lse_es));
    CUDA_CHECK(cudaMemset(lse_dev, kPoison, lse_elems * lse_es));

    flash_params p;
    params_fill(&p, c, scale, &q, &k, &v, &o, lse_dev);
    variant_data vd;
    variants_fill(&p, c, &vd);
    CUDA_CHECK(run_fwd(&p, 0));
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<unsigned char> lse_host(lse_elems * lse_es);
    tensor_copy(&o, c, 0);
    CUDA_CHECK(cudaMemcpy(lse_host.data(), lse_dev, lse_host.size(), cudaMemcpyDeviceToHost));

    /* the reference reads p's scalars and, through mask.h, the host ALiBi slopes */
    flash_params hp = p;
    hp.alibi_slopes = vd.slopes.empty() ? NULL : vd.slopes.data();
    std::vector<double> ref_o((size_t)c->b * c->sq * c->h * c->d), ref_lse(lse_elems);
    ref_forward(&hp, q.val.data(), k.val.data(), v.val.data(), vd.mask.empty() ? NULL : vd.mask.data(),
                vd.sink.empty() ? NULL : vd.sink.data(), ref_o.data(), ref_lse.data());

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
    const double tol = tolerance(c->dtype);
    const int ok = unwritten == 0 && clobbered == 0 && inf_mismatch == 0 && rel_o <= tol && rel_l <= tol;
    char desc[256];
    describe(desc, sizeof(desc), c);
    printf("%-4s b%-2d h%-2d/%-2d sq%-5d sk%-5d d%-3d pad%-3d %-4s%s %-8s %-40s | out %.2e lse %.2e | %s",
           dtype_name(c->dtype), c->b, c->h, c->h_kv, c->sq, c->sk, c->d, c->row_pad, c->bhsd ? "bhsd" : "bshd",
           c->big ? "+4G" : "", c->mode == MODE_LATE_MAX  ? "late-max"
           : c->mode == MODE_HUGE   ? "huge"
           : c->mode == MODE_IDENTITY_V ? "v=I"
                                        : "normal",
           desc, rel_o, rel_l, ok ? "ok" : "FAIL");
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
    variants_free(&vd);
    return ok;
}

/* ---- variable-length and KV-cache batches ------------------------------------------------------- */

enum seq_layout {
    LAYOUT_VARLEN = 0, /* packed rows through cu_seqlens_q / cu_seqlens_k (flash_attn_varlen_func) */
    LAYOUT_KVCACHE,    /* dense q (b, sq); k, v (b + 1, sk) through k_batch_idx, k_leftpad, seqused_k
                        * (flash_attn_with_kvcache's cache_batch_idx, cache_leftpad, cache_seqlens) */
    LAYOUT_PAGED,      /* dense q (b, sq); k, v (pages, page_size) through block_table, seqused_k and
                        * optionally k_leftpad (flash_attn_with_kvcache's block_table) */
};

/* paged: page sizes drawn per case (multiples of FLASH_PAGE_MULTIPLE, across and beyond the key tiles),
 * pages that no table entry names (NaN: a trap for a wrong page), one spare table column per sequence */
static const int kPageSizes[] = {16, 32, 48, 64, 80, 128, 256};
static const int kTrapPages = 3;
static const int kSpareSlots = 1;

/* varlen: the rows after the last sequence belong to none: max_seqlen + kTailRows of them, so that a kernel
 * that runs the last sequence up to max_seqlen meets them */
static const int kTailRows = 5;
static const int kForcedSeqs = 4; /* varlen: sequences 0..3 get sq 1, sk 0, sq 0, sk 1 (-1: drawn) */
static const int kForcedLengths[kForcedSeqs][2] = {{1, -1}, {-1, 0}, {0, -1}, {-1, 1}};

typedef struct vl_case {
    flash_dtype dtype;
    int layout;
    int b, h, h_kv, d;
    int max_sq, max_sk; /* varlen: lengths drawn from [0, max] (sequence b / 2 gets the max);
                         * kvcache / paged: sq of every sequence, rows of the cache (paged: rounded up to
                         * whole pages) */
    int seqused;        /* varlen: seqused_k given (kvcache: always, with k_leftpad and k_batch_idx;
                         * paged: always) */
    int page_size;      /* paged: rows per page, 0: drawn from kPageSizes */
    int leftpad;        /* paged: k_leftpad given */
    int v_pad;          /* extra elements per row of v over k's (v strides differ from k's) */
    variant v;          /* band, softcap, ALiBi, sink, force_hook: no attn_mask, no dropout */
    int row_pad;        /* extra elements per row */
    double scale;       /* 0: 1/sqrt(d) */
} vl_case;

static vl_case vl_mk(flash_dtype t, int layout, int b, int h, int h_kv, int max_sq, int max_sk, int d, int band)
{
    vl_case c;
    memset(&c, 0, sizeof(c));
    c.dtype = t;
    c.layout = layout;
    c.b = b;
    c.h = h;
    c.h_kv = h_kv;
    c.max_sq = max_sq;
    c.max_sk = max_sk;
    c.d = d;
    c.v.band = band;
    c.v.left = c.v.right = -1;
    return c;
}

static vl_case vl_window(vl_case c, int left, int right)
{
    c.v.band = BAND_WINDOW;
    c.v.left = left;
    c.v.right = right;
    return c;
}

static int irand(int lo, int hi) /* uniform on [lo, hi] */
{
    return std::min(hi, lo + (int)uniform(0, hi - lo + 1));
}

/* One sequence as the harness lays it out: q rows [q0, q0 + sq) of q batch qb, keys rows [k0, k0 + sk)
 * of k / v batch kb (what flash_seq_of must find; varlen: one batch, whose stride is 0, so flash_seq's
 * k_batch = the sequence index is not compared), first lse element lse0 + hq * lse_head. */
typedef struct seq_layout_row {
    int qb, q0, sq, kb, k0, sk;
    int64_t lse0;
} seq_layout_row;

/* How the harness lays out the keys in k / v: rows_k rows per batch, or, paged, per page of the table. */
typedef struct kv_rows {
    bool paged;
    int rows_k, page_size, table_stride;
    const int32_t *table; /* (b, table_stride) */
} kv_rows;

/* Row of key j of sequence s (its layout row r) in k / v, counted over (batches, rows_k). */
static size_t key_row(const kv_rows *kl, const seq_layout_row *r, int s, int j)
{
    if (!kl->paged)
        return (size_t)r->kb * kl->rows_k + r->k0 + j;
    const int lr = r->k0 + j;
    return (size_t)kl->table[(size_t)s * kl->table_stride + lr / kl->page_size] * kl->page_size + lr % kl->page_size;
}

/* Device int32 copy of x (NULL when x is empty). */
static int32_t *upload_i32(const std::vector<int32_t> &x)
{
    if (x.empty())
        return NULL;
    int32_t *dev;
    CUDA_CHECK(cudaMalloc(&dev, x.size() * sizeof(int32_t)));
    CUDA_CHECK(cudaMemcpy(dev, x.data(), x.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    return dev;
}

/* Runs one varlen / KV-cache / paged case: one flash_fwd_cuda call over the whole batch, each sequence
 * checked against dev/attn_ref.h run on its gathered keys alone (a dense batch of one). Every K / V row
 * that is no sequence's key (past seqused_k, before k_leftpad, the cache batch nobody reads, the tail, the
 * pages no table entry names) holds NaN, so a load that reads it into a tile turns the output into NaN;
 * o and lse rows of no sequence must stay poisoned. The harness's key rows must be the ones mask.h's
 * flash_seq_of and flash_key_offset find. */
static int check_vl_case(const vl_case *c)
{
    const int b = c->b, h = c->h, hkv = c->h_kv, d = c->d;
    const bool varlen = c->layout == LAYOUT_VARLEN;
    const double scale = c->scale != 0 ? c->scale : 1.0 / sqrt((double)c->d);
    const size_t es = elem_size(c->dtype), lse_es = elem_size(lse_type(c->dtype));

    /* lengths and index tensors */
    const bool paged = c->layout == LAYOUT_PAGED;
    std::vector<seq_layout_row> seqs(b);
    std::vector<int32_t> cu_q, cu_k, used, leftpad, batch_idx, table;
    int rows_q, rows_k, batches_q, batches_k, max_sq = 0, max_sk = 0;
    int page_size = 0, table_stride = 0;
    if (varlen) {
        cu_q.assign(1, 0);
        cu_k.assign(1, 0);
        for (int s = 0; s < b; s++) {
            int sq = irand(0, c->max_sq), sk = irand(0, c->max_sk);
            if (s == b / 2) {
                sq = c->max_sq;
                sk = c->max_sk;
            } else if (s < kForcedSeqs) {
                sq = kForcedLengths[s][0] >= 0 ? kForcedLengths[s][0] : sq;
                sk = kForcedLengths[s][1] >= 0 ? kForcedLengths[s][1] : sk;
            }
            const int u = c->seqused ? irand(0, sk) : sk;
            seqs[s] = {0, cu_q.back(), sq, 0, cu_k.back(), u, 0};
            cu_q.push_back(cu_q.back() + sq);
            cu_k.push_back(cu_k.back() + sk);
            if (c->seqused)
                used.push_back(u);
            max_sq = std::max(max_sq, sq);
            max_sk = std::max(max_sk, sk);
        }
        batches_q = batches_k = 1;
        rows_q = cu_q.back() + max_sq + kTailRows;
        rows_k = cu_k.back() + max_sk + kTailRows;
    } else if (paged) {
        /* table (b, table_stride): a random permutation of the pages; sequence 2 holds a full cache and
         * some later sequences share its first page (read-only prefix sharing); the pages the table
         * never names stay NaN */
        page_size = c->page_size ? c->page_size : kPageSizes[irand(0, (int)(sizeof(kPageSizes) / sizeof(int)) - 1)];
        const int pages_per_seq = (c->max_sk + page_size - 1) / page_size;
        table_stride = pages_per_seq + kSpareSlots;
        batches_q = b;
        batches_k = b * table_stride + kTrapPages;
        rows_q = max_sq = c->max_sq;
        rows_k = page_size;
        max_sk = pages_per_seq * page_size;
        std::vector<int> perm(batches_k);
        for (int i = 0; i < batches_k; i++)
            perm[i] = i;
        for (int i = batches_k - 1; i > 0; i--)
            std::swap(perm[i], perm[irand(0, i)]);
        table.assign(perm.begin(), perm.begin() + (size_t)b * table_stride);
        for (int s = 3; s < b; s++)
            if (b > 2 && irand(0, 1))
                table[(size_t)s * table_stride] = table[2 * (size_t)table_stride];
        for (int s = 0; s < b; s++) {
            const int u = s == 0 ? 0 : s == 1 ? 1 : s == 2 ? max_sk : irand(0, max_sk);
            const int lp = !c->leftpad ? 0 : s == 3 ? u : irand(0, u); /* sequence 3: a left pad of all keys */
            used.push_back(u);
            if (c->leftpad)
                leftpad.push_back(lp);
            seqs[s] = {s, 0, rows_q, s, lp, u - lp, 0};
        }
    } else {
        batches_q = b;
        batches_k = b + 1;
        rows_q = max_sq = c->max_sq;
        rows_k = max_sk = c->max_sk;
        std::vector<int> perm(batches_k);
        for (int i = 0; i < batches_k; i++)
            perm[i] = i;
        for (int i = batches_k - 1; i > 0; i--)
            std::swap(perm[i], perm[irand(0, i)]);
        for (int s = 0; s < b; s++) {
            const int u = irand(0, rows_k);
            const int lp = s == 1 ? rows_k : irand(0, u); /* sequence 1: a left pad past its keys (none) */
            used.push_back(u);
            leftpad.push_back(lp);
            batch_idx.push_back(perm[s]);
            seqs[s] = {s, 0, rows_q, perm[s], std::min(lp, u), u - std::min(lp, u), 0};
        }
    }
    const int64_t lse_batch = varlen ? 0 : (int64_t)h * rows_q, lse_head = rows_q;
    for (int s = 0; s < b; s++)
        seqs[s].lse0 = s * lse_batch + seqs[s].q0;

    const kv_rows kl = {paged, rows_k, page_size, table_stride, table.data()};
    /* tensors: (batches, rows, heads, d) with rows of heads * d + row_pad elements (v: + v_pad), NaN where
     * unused */
    const int64_t rs_q = (int64_t)h * d + c->row_pad, rs_k = (int64_t)hkv * d + c->row_pad, rs_v = rs_k + c->v_pad;
    const size_t nq = (size_t)batches_q * rows_q * rs_q, nk = (size_t)batches_k * rows_k * rs_k;
    const size_t nv = (size_t)batches_k * rows_k * rs_v;
    std::vector<unsigned char> qh(nq * es, kPoison), kh(nk * es, kPoison), vh(nv * es, kPoison);
    std::vector<unsigned char> row_written((size_t)batches_k * rows_k, 0); /* shared pages: written once */
    std::vector<std::vector<double>> qd(b), kd(b), vd(b);
    for (int s = 0; s < b; s++) {
        const seq_layout_row &r = seqs[s];
        qd[s].resize((size_t)r.sq * h * d);
        kd[s].resize((size_t)r.sk * hkv * d);
        vd[s].resize((size_t)r.sk * hkv * d);
        for (int i = 0; i < r.sq; i++)
            for (int hq = 0; hq < h; hq++)
                for (int e = 0; e < d; e++)
                    qd[s][((size_t)i * h + hq) * d + e] = store_elem(
                        qh.data(), ((size_t)r.qb * rows_q + r.q0 + i) * rs_q + hq * d + e, c->dtype, uniform(-1, 1));
        for (int j = 0; j < r.sk; j++) {
            const size_t kr = key_row(&kl, &seqs[s], s, j);
            for (int hk = 0; hk < hkv; hk++)
                for (int e = 0; e < d; e++) {
                    const size_t at_k = kr * rs_k + hk * d + e, at_v = kr * rs_v + hk * d + e;
                    const size_t x = ((size_t)j * hkv + hk) * d + e;
                    if (row_written[kr]) {
                        kd[s][x] = load_elem(kh.data(), at_k, c->dtype);
                        vd[s][x] = load_elem(vh.data(), at_v, c->dtype);
                    } else {
                        kd[s][x] = store_elem(kh.data(), at_k, c->dtype, uniform(-1, 1));
                        vd[s][x] = store_elem(vh.data(), at_v, c->dtype, uniform(-1, 1));
                    }
                }
            row_written[kr] = 1;
        }
    }
    void *q_dev, *k_dev, *v_dev, *o_dev, *lse_dev;
    const size_t nlse = (size_t)batches_q * h * rows_q;
    CUDA_CHECK(cudaMalloc(&q_dev, qh.size()));
    CUDA_CHECK(cudaMalloc(&k_dev, kh.size()));
    CUDA_CHECK(cudaMalloc(&v_dev, vh.size()));
    CUDA_CHECK(cudaMalloc(&o_dev, qh.size()));
    CUDA_CHECK(cudaMalloc(&lse_dev, nlse * lse_es));
    CUDA_CHECK(cudaMemcpy(q_dev, qh.data(), qh.size(), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(k_dev, kh.data(), kh.size(), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(v_dev, vh.data(), vh.size(), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(o_dev, kPoison, qh.size()));
    CUDA_CHECK(cudaMemset(lse_dev, kPoison, nlse * lse_es));
    int32_t *cu_q_dev = upload_i32(cu_q), *cu_k_dev = upload_i32(cu_k), *used_dev = upload_i32(used);
    int32_t *leftpad_dev = upload_i32(leftpad), *batch_idx_dev = upload_i32(batch_idx);
    int32_t *table_dev = upload_i32(table);

    flash_params p;
    memset(&p, 0, sizeof(p));
    p.q = q_dev;
    p.k = k_dev;
    p.v = v_dev;
    p.o = o_dev;
    p.lse = lse_dev;
    p.q_s.batch = p.o_s.batch = varlen ? 0 : rows_q * rs_q;
    p.q_s.row = p.o_s.row = rs_q;
    p.q_s.head = p.o_s.head = d;
    p.k_s.batch = varlen ? 0 : rows_k * rs_k;
    p.v_s.batch = varlen ? 0 : rows_k * rs_v;
    p.k_s.row = rs_k;
    p.v_s.row = rs_v;
    p.k_s.head = p.v_s.head = d;
    p.b = b;
    p.h = h;
    p.h_kv = hkv;
    p.h_per_kv = h / hkv;
    p.sq = max_sq;
    p.sk = max_sk;
    p.d = d;
    p.lse_batch = lse_batch;
    p.lse_head = lse_head;
    p.cu_seqlens_q = cu_q_dev;
    p.cu_seqlens_k = cu_k_dev;
    p.seqused_k = used_dev;
    p.k_leftpad = leftpad_dev;
    p.k_batch_idx = batch_idx_dev;
    p.k_batches = batches_k;
    p.block_table = table_dev;
    p.block_table_stride = table_stride;
    p.page_size = page_size;
    if (varlen) {
        p.total_q = rows_q;
        p.total_k = rows_k;
    }
    p.scale = scale;
    p.scale_log2 = (float)(scale * FLASH_LOG2E);
    band_fill(&p, &c->v);
    p.softcap = c->v.softcap;
    p.dtype = c->dtype;
    std::vector<float> slopes;
    std::vector<double> sink;
    float *slopes_dev = NULL;
    void *sink_dev = NULL;
    if (c->v.alibi) {
        slopes.resize((size_t)(c->v.alibi == 2 ? b : 1) * h);
        for (size_t i = 0; i < slopes.size(); i++)
            slopes[i] = (float)(pow(2.0, -8.0 * (i % h + 1) / h) * (1 + 0.25 * (i / h)));
        CUDA_CHECK(cudaMalloc(&slopes_dev, slopes.size() * sizeof(float)));
        CUDA_CHECK(cudaMemcpy(slopes_dev, slopes.data(), slopes.size() * sizeof(float), cudaMemcpyHostToDevice));
        p.alibi_slopes = slopes_dev;
        p.alibi_batch_stride = c->v.alibi == 2 ? h : 0;
    }
    if (c->v.sink) {
        sink.resize(h);
        std::vector<unsigned char> host(h * lse_es);
        for (int i = 0; i < h; i++) {
            const double x = i == 0 ? 8.0 : uniform(-2, 2); /* head 0: a sink that dominates */
            if (lse_es == 8)
                ((double *)host.data())[i] = sink[i] = x;
            else
                sink[i] = ((float *)host.data())[i] = (float)x;
        }
        CUDA_CHECK(cudaMalloc(&sink_dev, host.size()));
        CUDA_CHECK(cudaMemcpy(sink_dev, host.data(), host.size(), cudaMemcpyHostToDevice));
        p.sink = sink_dev;
    }
    p.has_hook = c->v.force_hook || p.softcap > 0 || p.alibi_slopes;

    /* the harness's layout is what mask.h's flash_seq_of reads from these index tensors */
    long layout_mismatch = 0;
    {
        flash_params hp = p;
        hp.cu_seqlens_q = cu_q.empty() ? NULL : cu_q.data();
        hp.cu_seqlens_k = cu_k.empty() ? NULL : cu_k.data();
        hp.seqused_k = used.empty() ? NULL : used.data();
        hp.k_leftpad = leftpad.empty() ? NULL : leftpad.data();
        hp.k_batch_idx = batch_idx.empty() ? NULL : batch_idx.data();
        hp.block_table = table.empty() ? NULL : table.data();
        for (int s = 0; s < b; s++) {
            const flash_seq f = flash_seq_of(&hp, s);
            const seq_layout_row &r = seqs[s];
            layout_mismatch += f.sq != r.sq || f.sk != r.sk || f.q_row0 != r.q0 || f.k_row0 != r.k0 ||
                               (!varlen && f.k_batch != r.kb) || flash_lse_offset(&hp, &f, s, 0) != r.lse0;
            for (int j = 0; j < r.sk; j++)
                layout_mismatch += flash_key_offset(&hp, &f, hp.k_s.batch, hp.k_s.row, j) !=
                                       (int64_t)key_row(&kl, &r, s, j) * rs_k ||
                                   flash_key_offset(&hp, &f, hp.v_s.batch, hp.v_s.row, j) !=
                                       (int64_t)key_row(&kl, &r, s, j) * rs_v;
        }
    }

    CUDA_CHECK(run_fwd(&p, 0));
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<unsigned char> oh(qh.size()), lh(nlse * lse_es);
    CUDA_CHECK(cudaMemcpy(oh.data(), o_dev, oh.size(), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(lh.data(), lse_dev, lh.size(), cudaMemcpyDeviceToHost));

    std::vector<unsigned char> o_valid(nq, 0), l_valid(nlse, 0);
    long unwritten = 0, clobbered = 0, inf_mismatch = 0;
    double eo = 0, no = 0, el = 0, nl = 0;
    for (int s = 0; s < b; s++) {
        const seq_layout_row &r = seqs[s];
        if (r.sq == 0)
            continue;
        flash_params rp; /* sequence s alone: a dense batch of one */
        memset(&rp, 0, sizeof(rp));
        rp.b = 1;
        rp.h = h;
        rp.h_kv = hkv;
        rp.h_per_kv = h / hkv;
        rp.sq = r.sq;
        rp.sk = r.sk;
        rp.d = d;
        rp.scale = scale;
        band_fill(&rp, &c->v);
        rp.softcap = c->v.softcap;
        rp.alibi_slopes = slopes.empty() ? NULL : slopes.data() + (c->v.alibi == 2 ? (size_t)s * h : 0);
        rp.dtype = c->dtype;
        std::vector<double> ro((size_t)r.sq * h * d), rl((size_t)h * r.sq);
        ref_forward(&rp, qd[s].data(), kd[s].data(), vd[s].data(), NULL, sink.empty() ? NULL : sink.data(),
                    ro.data(), rl.data());
        for (int i = 0; i < r.sq; i++)
            for (int hq = 0; hq < h; hq++) {
                for (int e = 0; e < d; e++) {
                    const size_t at = ((size_t)r.qb * rows_q + r.q0 + i) * rs_q + hq * d + e;
                    o_valid[at] = 1;
                    const double g = load_elem(oh.data(), at, c->dtype);
                    const double x = ro[((size_t)i * h + hq) * d + e];
                    unwritten += isnan(g);
                    eo += (g - x) * (g - x);
                    no += x * x;
                }
                const size_t at = (size_t)(r.lse0 + hq * lse_head + i);
                l_valid[at] = 1;
                const double g = lse_es == 8 ? ((double *)lh.data())[at] : ((float *)lh.data())[at];
                const double x = rl[(size_t)hq * r.sq + i];
                if (isnan(g))
                    unwritten++;
                else if (isinf(x) || isinf(g))
                    inf_mismatch += !(isinf(x) && isinf(g) && x < 0 && g < 0);
                else {
                    el += (g - x) * (g - x);
                    nl += x * x;
                }
            }
    }
    for (size_t i = 0; i < nq; i++)
        if (!o_valid[i])
            for (size_t byte = 0; byte < es; byte++)
                clobbered += oh[i * es + byte] != kPoison;
    for (size_t i = 0; i < nlse; i++)
        if (!l_valid[i])
            for (size_t byte = 0; byte < lse_es; byte++)
                clobbered += lh[i * lse_es + byte] != kPoison;
    const double rel_o = no > 0 ? sqrt(eo / no) : sqrt(eo);
    const double rel_l = nl > 0 ? sqrt(el / nl) : sqrt(el);
    const double tol = tolerance(c->dtype);
    const int ok = layout_mismatch == 0 && unwritten == 0 && clobbered == 0 && inf_mismatch == 0 && rel_o <= tol &&
                   rel_l <= tol;
    test_case tc;
    memset(&tc, 0, sizeof(tc));
    tc.v = c->v;
    char desc[256];
    describe(desc, sizeof(desc), &tc);
    char what[32];
    if (paged)
        snprintf(what, sizeof(what), "P%d%s", page_size, c->leftpad ? "+lp" : "");
    else
        snprintf(what, sizeof(what), "%s", varlen ? (c->seqused ? "seqused" : "") : "lp+idx");
    if (c->v_pad)
        snprintf(what + strlen(what), sizeof(what) - strlen(what), " vpad%d", c->v_pad);
    printf("%-4s %-7s b%-2d h%-2d/%-2d sq<=%-4d sk<=%-4d d%-3d pad%-3d %-15s %-40s | out %.2e lse %.2e | %s",
           dtype_name(c->dtype), varlen ? "varlen" : paged ? "paged" : "kvcache", b, h, hkv, max_sq, max_sk, d,
           c->row_pad, what, desc, rel_o, rel_l, ok ? "ok" : "FAIL");
    if (c->scale != 0)
        printf(" (scale %g)", c->scale);
    if (!ok)
        printf(" (layout mismatch %ld, unwritten %ld, clobbered %ld, -inf mismatch %ld)", layout_mismatch, unwritten,
               clobbered, inf_mismatch);
    printf("\n");
    void *bufs[] = {q_dev, k_dev, v_dev, o_dev, lse_dev, cu_q_dev, cu_k_dev, used_dev, leftpad_dev, batch_idx_dev,
                    table_dev, slopes_dev, sink_dev};
    for (void *x : bufs)
        if (x)
            CUDA_CHECK(cudaFree(x));
    return ok;
}

/* The varlen / KV-cache cases of one dtype: every head-dim config, each band, each hook alone and together,
 * GQA, seqused_k, many short and a few long sequences, strided rows. */
static void vl_cases(std::vector<vl_case> *cases, flash_dtype t, bool half)
{
    const int half_dims[] = {32, 64, 96, 128, 192, 256};
    const int full_dims[] = {8, 40, 64};
    const int nd = half ? 6 : 3;
    for (int di = 0; di < nd; di++) {
        const int d = half ? half_dims[di] : full_dims[di];
        cases->push_back(vl_mk(t, LAYOUT_VARLEN, 6, 4, 2, 150, 170, d, BAND_FULL));
        vl_case c = vl_mk(t, LAYOUT_VARLEN, 6, 4, 1, 200, 120, d, BAND_CAUSAL_BR);
        c.seqused = 1;
        cases->push_back(c);
    }
    const int d = half ? 128 : 40;
    vl_case c;
    cases->push_back(vl_mk(t, LAYOUT_VARLEN, 5, 2, 2, 130, 260, d, BAND_CAUSAL_TL));
    c = vl_window(vl_mk(t, LAYOUT_VARLEN, 7, 2, 1, 300, 300, d, 0), 64, 0);
    c.seqused = 1;
    cases->push_back(c);
    cases->push_back(vl_window(vl_mk(t, LAYOUT_VARLEN, 4, 2, 2, 90, 200, d, 0), 20, 10));
    cases->push_back(vl_window(vl_mk(t, LAYOUT_VARLEN, 4, 2, 2, 200, 90, d, 0), -1, 8));
    c = vl_mk(t, LAYOUT_VARLEN, 6, 4, 2, 150, 200, d, BAND_CAUSAL_BR);
    c.v.softcap = 5;
    c.scale = 1.0;
    cases->push_back(c);
    c = vl_mk(t, LAYOUT_VARLEN, 6, 4, 2, 180, 140, d, BAND_CAUSAL_BR);
    c.v.alibi = 1;
    cases->push_back(c);
    c = vl_mk(t, LAYOUT_VARLEN, 6, 4, 4, 120, 160, d, BAND_FULL);
    c.v.alibi = 2;
    c.seqused = 1;
    cases->push_back(c);
    c = vl_mk(t, LAYOUT_VARLEN, 6, 3, 3, 160, 100, d, BAND_CAUSAL_BR);
    c.v.sink = 1;
    cases->push_back(c);
    c = vl_window(vl_mk(t, LAYOUT_VARLEN, 5, 3, 1, 200, 220, d, 0), 50, 0);
    c.v.force_hook = 1;
    c.v.sink = 1;
    c.seqused = 1;
    cases->push_back(c);
    c = vl_window(vl_mk(t, LAYOUT_VARLEN, 5, 8, 2, 170, 190, half ? 64 : 24, 0), 40, 16);
    c.v.softcap = 2;
    c.v.alibi = 2;
    c.v.sink = 1;
    c.seqused = 1;
    c.row_pad = 8;
    cases->push_back(c);
    c = vl_mk(t, LAYOUT_VARLEN, 40, 2, 1, 20, 20, d, BAND_CAUSAL_BR); /* many short: lengths 0 and 1 */
    cases->push_back(c);
    c.v.alibi = 1;
    c.seqused = 1;
    cases->push_back(c);
    c = vl_mk(t, LAYOUT_VARLEN, 3, 2, 2, half ? 1000 : 300, half ? 1100 : 330, half ? 64 : d, BAND_CAUSAL_BR);
    cases->push_back(c);
    c = vl_mk(t, LAYOUT_VARLEN, 6, 4, 2, 140, 150, d, BAND_CAUSAL_BR);
    c.row_pad = 8;
    c.scale = -0.3;
    cases->push_back(c);
    /* KV cache: decode (sq 1), prefill chunks, with hooks */
    cases->push_back(vl_mk(t, LAYOUT_KVCACHE, 4, 4, 1, 1, 300, d, BAND_CAUSAL_BR));
    cases->push_back(vl_mk(t, LAYOUT_KVCACHE, 3, 4, 2, 70, 250, d, BAND_CAUSAL_BR));
    c = vl_window(vl_mk(t, LAYOUT_KVCACHE, 3, 2, 2, 33, 200, d, 0), 40, 0);
    c.v.alibi = 1;
    c.v.sink = 1;
    cases->push_back(c);
    c = vl_mk(t, LAYOUT_KVCACHE, 3, 2, 1, 50, 180, d, BAND_FULL);
    c.v.softcap = 3;
    c.row_pad = 8;
    cases->push_back(c);
    /* paged KV cache: every head-dim config, decode and prefill chunks, page sizes drawn; cache lengths 0, 1,
     * full and drawn (sequences 0, 1, 2, the rest); GQA; each band and hook; k_leftpad; v strides of
     * their own; pages forced across the key tiles (16: four or five per tile, 48, 256: many tiles per page) */
    for (int di = 0; di < nd; di++) {
        const int dd = half ? half_dims[di] : full_dims[di];
        cases->push_back(vl_mk(t, LAYOUT_PAGED, 6, 4, 1, 1, 300, dd, BAND_CAUSAL_BR));
        c = vl_mk(t, LAYOUT_PAGED, 5, 4, 2, 70, 260, dd, BAND_FULL);
        c.leftpad = 1;
        cases->push_back(c);
    }
    const int forced_pages[] = {16, 48, 256};
    for (int ps : forced_pages) {
        c = vl_mk(t, LAYOUT_PAGED, 6, 4, 2, 150, 520, d, BAND_CAUSAL_BR);
        c.page_size = ps;
        cases->push_back(c);
    }
    c = vl_window(vl_mk(t, LAYOUT_PAGED, 5, 4, 2, 40, 300, d, 0), 64, 0);
    c.v.alibi = 1;
    c.v.sink = 1;
    c.page_size = 16;
    c.leftpad = 1;
    cases->push_back(c);
    c = vl_mk(t, LAYOUT_PAGED, 5, 2, 1, 30, 200, d, BAND_FULL);
    c.v.softcap = 3;
    c.scale = 1.0;
    c.row_pad = 8;
    c.v_pad = 8;
    cases->push_back(c);
    c = vl_mk(t, LAYOUT_PAGED, 5, 4, 4, 60, 180, d, BAND_CAUSAL_TL);
    c.v.alibi = 2;
    c.page_size = 32;
    cases->push_back(c);
    c = vl_window(vl_mk(t, LAYOUT_PAGED, 5, 3, 1, 20, 400, d, 0), -1, 8);
    c.v.force_hook = 1;
    c.v.sink = 1;
    c.leftpad = 1;
    cases->push_back(c);
    cases->push_back(vl_mk(t, LAYOUT_PAGED, 5, 2, 2, 200, 100, d, BAND_CAUSAL_BR)); /* sq > sk: rows with no key */
    c = vl_window(vl_mk(t, LAYOUT_PAGED, 6, 8, 2, 3, 700, half ? 64 : 24, 0), 100, 0);
    c.v.softcap = 2;
    c.v.alibi = 2;
    c.v.sink = 1;
    c.leftpad = 1;
    c.v_pad = 16;
    cases->push_back(c);
    c = vl_mk(t, LAYOUT_PAGED, 5, 4, 2, 1, 1000, d, BAND_CAUSAL_BR);
    c.page_size = 16;
    c.scale = -0.3;
    cases->push_back(c);
}

/* Arguments the kernels must refuse with cudaErrorInvalidValue (head dims past each dtype's limit, d_v = d). */
static int check_rejects(void)
{
    int ok = 1;
    const struct { flash_dtype t; int d; } bad[] = {{FLASH_BF16, 36}, {FLASH_FP16, FLASH_CUDA_FWD_MAX_HEAD_DIM + 8},
                                                   {FLASH_FP32, FLASH_CUDA_SIMPLE_MAX_HEAD_DIM + 1},
                                                   {FLASH_FP64, FLASH_CUDA_SIMPLE_MAX_HEAD_DIM + 8}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        flash_params p;
        memset(&p, 0, sizeof(p));
        p.dtype = bad[i].t;
        p.b = p.h = p.h_kv = p.h_per_kv = 1;
        p.sq = p.sk = 1;
        p.d = p.d_v = bad[i].d;
        const cudaError_t e = run_fwd(&p, 0);
        printf("reject %s d%d: %s\n", dtype_name(bad[i].t), bad[i].d, e == cudaErrorInvalidValue ? "ok" : "FAIL");
        ok &= e == cudaErrorInvalidValue;
    }
    /* a hook field without has_hook (the dense kernel would silently ignore it) */
    flash_params p;
    memset(&p, 0, sizeof(p));
    p.dtype = FLASH_BF16;
    p.b = p.h = p.h_kv = p.h_per_kv = 1;
    p.sq = p.sk = 1;
    p.d = 64;
    p.softcap = 1.0f;
    const cudaError_t e = run_fwd(&p, 0);
    printf("reject bf16 softcap without has_hook: %s\n", e == cudaErrorInvalidValue ? "ok" : "FAIL");
    ok &= e == cudaErrorInvalidValue;
    /* an attn_mask with a varlen batch or k_leftpad (its columns are the dense batch's keys); the index
     * tensors are never read when the call is refused */
    int32_t *index_dev;
    uint8_t *mask_dev;
    CUDA_CHECK(cudaMalloc(&index_dev, 2 * sizeof(int32_t)));
    CUDA_CHECK(cudaMalloc(&mask_dev, 1));
    const flash_dtype types[] = {FLASH_BF16, FLASH_FP32};
    for (flash_dtype t : types)
        for (int leftpad = 0; leftpad < 2; leftpad++) {
            memset(&p, 0, sizeof(p));
            p.dtype = t;
            p.b = p.h = p.h_kv = p.h_per_kv = 1;
            p.sq = p.sk = 1;
            p.d = 64;
            p.lse_batch = p.lse_head = 1;
            p.band_left = p.band_right = -1;
            if (leftpad)
                p.k_leftpad = index_dev;
            else {
                p.cu_seqlens_q = p.cu_seqlens_k = index_dev;
                p.total_q = p.total_k = 1;
            }
            p.mask = mask_dev;
            p.mask_blocks = mask_dev;
            p.mask_kind = FLASH_MASK_BOOL;
            p.has_hook = 1;
            const cudaError_t r = run_fwd(&p, 0);
            printf("reject %s attn_mask with %s: %s\n", dtype_name(t), leftpad ? "k_leftpad" : "varlen",
                   r == cudaErrorInvalidValue ? "ok" : "FAIL");
            ok &= r == cudaErrorInvalidValue;
        }
    /* a block_table with an attn_mask, k_batch_idx, or a page size that is no multiple of FLASH_PAGE_MULTIPLE */
    static const char *paged_bad[] = {"attn_mask", "k_batch_idx", "page size 24"};
    for (flash_dtype t : types)
        for (int bad = 0; bad < 3; bad++) {
            memset(&p, 0, sizeof(p));
            p.dtype = t;
            p.b = p.h = p.h_kv = p.h_per_kv = 1;
            p.sq = p.sk = 1;
            p.d = 64;
            p.lse_batch = p.lse_head = 1;
            p.band_left = p.band_right = -1;
            p.block_table = index_dev;
            p.block_table_stride = 1;
            p.page_size = FLASH_PAGE_MULTIPLE;
            p.k_batches = 1;
            if (bad == 0) {
                p.mask = mask_dev;
                p.mask_blocks = mask_dev;
                p.mask_kind = FLASH_MASK_BOOL;
                p.has_hook = 1;
            } else if (bad == 1) {
                p.k_batch_idx = index_dev;
            } else {
                p.page_size = FLASH_PAGE_MULTIPLE + FLASH_PAGE_MULTIPLE / 2;
            }
            const cudaError_t r = run_fwd(&p, 0);
            printf("reject %s block_table with %s: %s\n", dtype_name(t), paged_bad[bad],
                   r == cudaErrorInvalidValue ? "ok" : "FAIL");
            ok &= r == cudaErrorInvalidValue;
        }
    CUDA_CHECK(cudaFree(index_dev));
    CUDA_CHECK(cudaFree(mask_dev));
    return ok;
}

/* The variant cases of one dtype: every variant alone, with tails / GQA / each head-dim config, and pairs. */
static void variant_cases(std::vector<test_case> *cases, flash_dtype t, bool half)
{
    const int dims[] = {64, 128, 256};
    const int nd = half ? 3 : 1;
    for (int di = 0; di < nd; di++) {
        const int d = half ? dims[di] : 40;
        test_case c;
        /* sliding windows: start tile > 0, masked tiles on both sides, rows with no key (sq > sk) */
        cases->push_back(window(mk(t, 1, 2, 2, 1000, 1000, d, 0), 100, 50));
        cases->push_back(window(mk(t, 1, 2, 2, 700, 900, d, 0), 256, 0));
        cases->push_back(window(mk(t, 1, 2, 1, 900, 300, d, 0), 40, 10));
        cases->push_back(window(mk(t, 2, 2, 2, 333, 555, d, 0), -1, 70));
        cases->push_back(window(mk(t, 1, 2, 2, 513, 513, d, 0), 0, 0));
        c = window(mk(t, 1, 2, 2, 600, 600, d, 0), 100, 50);
        c.v.force_hook = 1; /* the HOOK kernel's key order, nothing else */
        cases->push_back(c);
        /* softcap: realistic cap, and caps the scores reach (scale 1: |s| ~ 3) */
        c = mk(t, 1, 2, 2, 300, 450, d, BAND_CAUSAL_BR);
        c.v.softcap = 50;
        cases->push_back(c);
        c.v.softcap = 2;
        c.scale = 1.0;
        cases->push_back(c);
        c = mk(t, 1, 2, 2, 150, 333, d, BAND_FULL);
        c.v.softcap = 5;
        c.mode = MODE_HUGE;
        c.scale = 10.0;
        cases->push_back(c);
        /* ALiBi per head, per batch */
        c = mk(t, 2, 4, 2, 257, 300, d, BAND_CAUSAL_BR);
        c.v.alibi = 1;
        cases->push_back(c);
        c = mk(t, 2, 2, 2, 300, 200, d, BAND_FULL);
        c.v.alibi = 2;
        cases->push_back(c);
        /* attn_mask: bool and additive, patterns, broadcast, layouts */
        const int kinds[] = {FLASH_MASK_BOOL, FLASH_MASK_ADD};
        for (int kind : kinds) {
            c = mk(t, 2, 2, 2, 200, 320, d, BAND_FULL);
            c.v.mask_kind = kind;
            c.v.mask_pattern = MASKP_RANDOM;
            cases->push_back(c);
            c.v.mask_pattern = MASKP_EMPTY_ROWS;
            c.v.mask_layout = MASK_BCAST_H;
            cases->push_back(c);
            c = mk(t, 3, 2, 1, 300, 700, d, BAND_FULL);
            c.v.mask_kind = kind;
            c.v.mask_pattern = MASKP_KEYPAD;
            c.v.mask_layout = MASK_BCAST_H | MASK_BCAST_ROW;
            cases->push_back(c);
            c = mk(t, 1, 2, 2, 600, 640, d, BAND_FULL);
            c.v.mask_kind = kind;
            c.v.mask_pattern = MASKP_BLOCKS;
            c.v.mask_layout = MASK_BCAST_B;
            cases->push_back(c);
            c = mk(t, 2, 2, 2, 130, 203, d, BAND_CAUSAL_BR);
            c.v.mask_kind = kind;
            c.v.mask_pattern = MASKP_RANDOM;
            c.v.mask_layout = MASK_COLMAJOR;
            cases->push_back(c);
        }
        /* every dropout keep bit and mask entry visible in out (v = I, sk <= d) */
        c = mk(t, 2, 2, 1, 200, half ? d : 40, d, BAND_FULL);
        c.mode = MODE_IDENTITY_V;
        c.v.dropout = 0.3;
        cases->push_back(c);
        c.v.mask_kind = FLASH_MASK_BOOL;
        c.v.mask_pattern = MASKP_RANDOM;
        c.v.band = BAND_CAUSAL_BR;
        cases->push_back(c);
        /* dropout, alone and with tails / GQA */
        c = mk(t, 2, 4, 2, 300, 333, d, BAND_FULL);
        c.v.dropout = 0.17;
        cases->push_back(c);
        c = mk(t, 1, 2, 2, 257, 129, d, BAND_CAUSAL_TL);
        c.v.dropout = 0.5;
        cases->push_back(c);
        /* sinks: dense kernel, HOOK kernel, rows with no key (lse = sink) */
        c = mk(t, 1, 3, 3, 200, 300, d, BAND_CAUSAL_BR);
        c.v.sink = 1;
        cases->push_back(c);
        c = window(mk(t, 1, 3, 3, 400, 200, d, 0), 30, 0);
        c.v.sink = 1;
        cases->push_back(c);
        /* pairs */
        c = window(mk(t, 1, 2, 2, 700, 700, d, 0), 128, 0);
        c.v.softcap = 1.5;
        cases->push_back(c);
        c = window(mk(t, 2, 2, 2, 500, 600, d, 0), 64, 64);
        c.v.alibi = 1;
        cases->push_back(c);
        c = mk(t, 2, 2, 2, 400, 500, d, BAND_FULL);
        c.v.mask_kind = FLASH_MASK_BOOL;
        c.v.mask_pattern = MASKP_KEYPAD;
        c.v.mask_layout = MASK_BCAST_H | MASK_BCAST_ROW;
        c.v.dropout = 0.1;
        cases->push_back(c);
        c = window(mk(t, 1, 2, 2, 600, 600, d, 0), 200, 0);
        c.v.sink = 1;
        c.v.softcap = 1;
        cases->push_back(c);
        c = mk(t, 2, 2, 2, 250, 380, d, BAND_CAUSAL_BR);
        c.v.softcap = 0.8;
        c.v.alibi = 2;
        c.v.mask_kind = FLASH_MASK_ADD;
        c.v.mask_pattern = MASKP_BLOCKS;
        cases->push_back(c);
        c = mk(t, 1, 4, 1, 300, 300, d, BAND_CAUSAL_BR);
        c.v.mask_kind = FLASH_MASK_ADD;
        c.v.mask_pattern = MASKP_EMPTY_ROWS;
        c.v.dropout = 0.25;
        c.v.sink = 1;
        c.row_pad = 8;
        cases->push_back(c);
        c = window(mk(t, 2, 2, 2, 190, 190, d, 0), 50, 20);
        c.v.alibi = 1;
        c.v.dropout = 0.3;
        c.bhsd = 1;
        c.scale = -0.2;
        cases->push_back(c);
    }
}

static int run_checks(const char *only_dtype)
{
    std::vector<test_case> cases;
    const flash_dtype halves[] = {FLASH_BF16, FLASH_FP16};
    for (flash_dtype t : halves) {
        /* every head-dim config and padded head dims */
        const int dims[] = {8, 40, 64, 80, 96, 128, 200, 256};
        for (int d : dims)
            cases.push_back(mk(t, 2, 3, 3, 200, 300, d, BAND_FULL));
        /* tails, full and causal both alignments */
        const int tails[][2] = {{1, 1}, {17, 17}, {127, 129}, {129, 127}, {1000, 1000}, {1, 1000}, {1000, 17},
                                {300, 100}};
        const int bands[] = {BAND_FULL, BAND_CAUSAL_TL, BAND_CAUSAL_BR};
        for (auto &sz : tails)
            for (int band : bands) {
                const int d = sz[0] == 1000 && sz[1] == 1000 ? 64 : 128;
                cases.push_back(mk(t, 1, 2, 2, sz[0], sz[1], d, band));
            }
        cases.push_back(mk(t, 1, 2, 2, 257, 383, 256, BAND_CAUSAL_BR));
        cases.push_back(mk(t, 1, 2, 2, 383, 257, 256, BAND_CAUSAL_BR));
        cases.push_back(mk(t, 1, 2, 2, 200, 450, 80, BAND_CAUSAL_TL));
        /* GQA 4:1, strided rows, (b, h, s, d) layout */
        test_case c = mk(t, 2, 8, 2, 150, 222, 64, BAND_CAUSAL_BR);
        cases.push_back(c);
        c = mk(t, 2, 8, 2, 130, 130, 128, BAND_FULL);
        c.row_pad = 24;
        cases.push_back(c);
        c = mk(t, 2, 4, 4, 100, 260, 96, BAND_CAUSAL_BR);
        c.row_pad = 16;
        cases.push_back(c);
        c = mk(t, 2, 4, 1, 190, 190, 64, BAND_CAUSAL_TL);
        c.row_pad = 8;
        c.bhsd = 1;
        cases.push_back(c);
        /* row max in the last key tile; scores of magnitude 1e4; negative scale; offsets past 2^31 */
        const int late_dims[][2] = {{128, 512}, {64, 300}, {256, 200}};
        for (auto &ld : late_dims) {
            c = mk(t, 1, 2, 2, 64, ld[1], ld[0], BAND_FULL);
            c.mode = MODE_LATE_MAX;
            cases.push_back(c);
        }
        c = mk(t, 1, 2, 2, 150, 333, 128, BAND_FULL);
        c.mode = MODE_HUGE;
        c.scale = 10.0;
        cases.push_back(c);
        c = mk(t, 1, 2, 2, 150, 333, 64, BAND_CAUSAL_BR);
        c.mode = MODE_HUGE;
        c.scale = 10.0;
        cases.push_back(c);
        c = mk(t, 1, 2, 2, 100, 140, 128, BAND_CAUSAL_BR);
        c.scale = -0.2;
        cases.push_back(c);
        c = mk(t, 2, 2, 1, 100, 130, 64, BAND_CAUSAL_BR);
        c.big = 1;
        cases.push_back(c);
        c.v.mask_kind = FLASH_MASK_BOOL;
        c.v.dropout = 0.2;
        cases.push_back(c);
        variant_cases(&cases, t, true);
    }
    const flash_dtype fulls[] = {FLASH_FP32, FLASH_FP64};
    for (flash_dtype t : fulls) {
        const int dims[] = {1, 3, 8, 33, 64, 200, 256};
        for (int d : dims)
            cases.push_back(mk(t, 2, 3, 3, 70, 90, d, BAND_FULL));
        const int tails[][2] = {{1, 1}, {17, 17}, {127, 129}, {1, 300}, {300, 100}};
        const int bands[] = {BAND_FULL, BAND_CAUSAL_TL, BAND_CAUSAL_BR};
        for (auto &sz : tails)
            for (int band : bands)
                cases.push_back(mk(t, 1, 2, 2, sz[0], sz[1], 48, band));
        test_case c = mk(t, 2, 8, 2, 60, 77, 40, BAND_CAUSAL_BR);
        c.row_pad = 5;
        cases.push_back(c);
        c = mk(t, 2, 4, 1, 50, 50, 24, BAND_CAUSAL_TL);
        c.row_pad = 3;
        c.bhsd = 1;
        cases.push_back(c);
        c = mk(t, 1, 2, 2, 40, 200, 64, BAND_FULL);
        c.mode = MODE_LATE_MAX;
        cases.push_back(c);
        c = mk(t, 1, 2, 2, 50, 90, 64, BAND_CAUSAL_BR);
        c.mode = MODE_HUGE;
        c.scale = 10.0;
        cases.push_back(c);
        c = mk(t, 2, 2, 1, 40, 50, 16, BAND_CAUSAL_BR);
        c.big = 1;
        cases.push_back(c);
        variant_cases(&cases, t, false);
    }
    std::vector<vl_case> vcases;
    const flash_dtype all[] = {FLASH_BF16, FLASH_FP16, FLASH_FP32, FLASH_FP64};
    for (flash_dtype t : all)
        vl_cases(&vcases, t, t == FLASH_BF16 || t == FLASH_FP16);
    int passed = 0, failed = 0;
    for (const test_case &c : cases)
        if (!only_dtype || !strcmp(only_dtype, dtype_name(c.dtype)))
            check_case(&c) ? passed++ : failed++;
    for (const vl_case &c : vcases)
        if (!only_dtype || !strcmp(only_dtype, dtype_name(c.dtype)))
            check_vl_case(&c) ? passed++ : failed++;
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

/* bf16 inputs of kBenchTokens x kBenchHidden, shared by the benchmarks */
typedef struct bench_buffers {
    __nv_bfloat16 *q, *k, *v, *o;
    float *lse;
} bench_buffers;

static void bench_alloc(bench_buffers *bb)
{
    const size_t n = (size_t)kBenchTokens * kBenchHidden;
    CUDA_CHECK(cudaMalloc(&bb->q, n * 2));
    CUDA_CHECK(cudaMalloc(&bb->k, n * 2));
    CUDA_CHECK(cudaMalloc(&bb->v, n * 2));
    CUDA_CHECK(cudaMalloc(&bb->o, n * 2));
    CUDA_CHECK(cudaMalloc(&bb->lse, (size_t)kBenchTokens * kBenchHidden / 8 * sizeof(float)));
    fill_random_bf16<<<1024, 256>>>(bb->q, n, 1);
    fill_random_bf16<<<1024, 256>>>(bb->k, n, 2);
    fill_random_bf16<<<1024, 256>>>(bb->v, n, 3);
}

static void bench_free(bench_buffers *bb)
{
    CUDA_CHECK(cudaFree(bb->q));
    CUDA_CHECK(cudaFree(bb->k));
    CUDA_CHECK(cudaFree(bb->v));
    CUDA_CHECK(cudaFree(bb->o));
    CUDA_CHECK(cudaFree(bb->lse));
}

/* Dense bf16 params over the bench buffers: seqlen s, head dim d, full band. */
static void bench_params(flash_params *p, const bench_buffers *bb, int s, int d)
{
    memset(p, 0, sizeof(*p));
    p->q = bb->q;
    p->k = bb->k;
    p->v = bb->v;
    p->o = bb->o;
    p->lse = bb->lse;
    p->q_s.head = p->k_s.head = p->v_s.head = p->o_s.head = d;
    p->q_s.row = p->k_s.row = p->v_s.row = p->o_s.row = kBenchHidden;
    p->q_s.batch = p->k_s.batch = p->v_s.batch = p->o_s.batch = (int64_t)s * kBenchHidden;
    fill_sizes(p, FLASH_BF16, kBenchTokens / s, kBenchHidden / d, kBenchHidden / d, s, s, d, 0);
    p->band_left = p->band_right = -1;
    p->band_bottom_right = 1;
}

/* Median milliseconds of kTimedRuns calls of fwd(p, stream 0), L2 flushed before each (common.h time_ms); fwd
 * defaults to launch.cu's dispatch, which on Hopper takes fwd_sm90.cu where it serves p unless
 * FLASHATTN_EXT_DISABLE_SM90=1. */
typedef cudaError_t (*fwd_fn)(const flash_params *, cudaStream_t);
static cudaError_t run_fwd(const flash_params *p, cudaStream_t stream);

static double time_fwd(const flash_params *p, fwd_fn fwd = run_fwd)
{
    return time_ms([&] { return fwd(p, 0); }, kWarmupRuns, kTimedRuns);
}

/* HARNESS_SEQ: the bench modes time only that seqlen (e.g. under ncu); 0 or unset: all. */
static int only_seqlen(void)
{
    const char *env = getenv("HARNESS_SEQ");
    return env ? atoi(env) : 0;
}

static void run_bench(int only_d)
{
    bench_buffers bb;
    bench_alloc(&bb);
    const int dims[] = {64, 128, 256};
    const int seqs[] = {512, 1024, 2048, 4096, 8192};
    const int only_s = only_seqlen();
    printf("bf16 fwd TFLOP/s (16k tokens, nheads = 2048 / d)\n");
    printf("%-5s %-6s %-7s %-9s %s\n", "d", "seq", "causal", "ms", "TFLOP/s");
    for (int d : dims)
        for (int causal = 0; causal < 2; causal++)
            for (int s : seqs) {
                if ((only_d && d != only_d) || (only_s && s != only_s))
                    continue;
                flash_params p;
                bench_params(&p, &bb, s, d);
                if (causal)
                    p.band_right = 0;
                const double t = time_fwd(&p) * 1e-3;
                const double flops = 4.0 * p.b * p.h * (double)s * s * d / (causal ? 2 : 1);
                printf("%-5d %-6d %-7s %-9.3f %.1f\n", d, s, causal ? "yes" : "no", t * 1e3, flops / t * 1e-12);
            }
    bench_free(&bb);
}

/* (query, key) pairs inside the band of p, summed over the rows of every sequence (p's index tensors on
 * the host): the visible work of one head without a mask. */
static double band_pairs(const flash_params *p)
{
    double n = 0;
    for (int64_t b = 0; b < p->b; b++) {
        const flash_seq s = flash_seq_of(p, b);
        for (int64_t i = 0; i < s.sq; i++) {
            const int64_t lo = std::max<int64_t>(0, i + s.diag_lo), hi = std::min<int64_t>(s.sk - 1, i + s.diag_hi);
            n += hi >= lo ? (double)(hi - lo + 1) : 0;
        }
    }
    return n;
}

enum bench_variant {
    BV_DENSE = 0, BV_HOOK, BV_WINDOW, BV_SOFTCAP, BV_ALIBI, BV_DROPOUT, BV_PAD_MASK, BV_SPARSE, BV_SINK, BV_COUNT
};

static void run_variant_bench(int only_d)
{
    static const char *names[BV_COUNT] = {"dense",         "hook (no field)",        "causal window 4096",
                                          "softcap 50",    "alibi causal",           "dropout 0.1",
                                          "bool pad 25%",  "block-sparse 10% 128^2", "sink"};
    bench_buffers bb;
    bench_alloc(&bb);
    const int dims[] = {64, 128, 256};
    const int seqs[] = {8192, 16384};
    printf("bf16 fwd variants, TFLOP/s on the visible pairs (16k tokens, nheads = 2048 / d)\n");
    printf("%-5s %-6s %-26s %-9s %s\n", "d", "seq", "variant", "ms", "TFLOP/s");
    for (int d : dims)
        for (int s : seqs)
            for (int bv = 0; bv < BV_COUNT; bv++) {
                if ((only_d && d != only_d) || (!only_d && d != 128))
                    continue;
                flash_params p;
                bench_params(&p, &bb, s, d);
                void *mask = NULL, *blocks = NULL, *sink = NULL;
                float *slopes = NULL;
                double visible_frac = 1.0;
                switch (bv) {
                case BV_HOOK: p.has_hook = 1; break;
                case BV_WINDOW: p.band_right = 0; p.band_left = 4096; break;
                case BV_SOFTCAP: p.softcap = 50; break;
                case BV_ALIBI: {
                    std::vector<float> sl(p.h);
                    for (int i = 0; i < p.h; i++)
                        sl[i] = (float)pow(2.0, -8.0 * (i + 1) / p.h);
                    CUDA_CHECK(cudaMalloc(&slopes, p.h * sizeof(float)));
                    CUDA_CHECK(cudaMemcpy(slopes, sl.data(), p.h * sizeof(float), cudaMemcpyHostToDevice));
                    p.alibi_slopes = slopes;
                    p.band_right = 0;
                    break;
                }
                case BV_DROPOUT:
                    set_dropout(&p, 0.1, kSeed, kOffset);
                    break;
                case BV_PAD_MASK:
                case BV_SPARSE: {
                    /* pad: (b, 1, 1, sk), the last 25% of keys hidden; sparse: (1, 1, s, s), 10% of the
                     * 128 x 128 blocks visible */
                    const bool pad = bv == BV_PAD_MASK;
                    const int rows = pad ? 1 : s, nb = pad ? (int)p.b : 1;
                    const int nr = (rows + FLASH_MASK_BLOCK - 1) / FLASH_MASK_BLOCK, nc = s / FLASH_MASK_BLOCK;
                    const int big = 128 / FLASH_MASK_BLOCK;
                    std::vector<uint8_t> m((size_t)nb * rows * s), f((size_t)nb * nr * nc);
                    std::vector<uint8_t> vis_blk((size_t)(s / 128 + 1) * (s / 128 + 1));
                    for (auto &x : vis_blk)
                        x = uniform(0, 1) < 0.1;
                    for (int bi = 0; bi < nb; bi++)
                        for (int r = 0; r < rows; r++)
                            for (int j = 0; j < s; j++)
                                m[((size_t)bi * rows + r) * s + j] =
                                    pad ? j < s - s / 4 : vis_blk[(size_t)(r / 128) * (s / 128 + 1) + j / 128];
                    for (int bi = 0; bi < nb; bi++)
                        for (int r = 0; r < nr; r++)
                            for (int c = 0; c < nc; c++) {
                                const bool v = pad ? c * FLASH_MASK_BLOCK < s - s / 4
                                                   : vis_blk[(size_t)(r / big) * (s / 128 + 1) + c / big];
                                f[((size_t)bi * nr + r) * nc + c] = v ? FLASH_MASK_ANY_VISIBLE : FLASH_MASK_ANY_MASKED;
                            }
                    double vis = 0;
                    for (uint8_t x : m)
                        vis += x;
                    visible_frac = vis / m.size();
                    CUDA_CHECK(cudaMalloc(&mask, m.size()));
                    CUDA_CHECK(cudaMemcpy(mask, m.data(), m.size(), cudaMemcpyHostToDevice));
                    CUDA_CHECK(cudaMalloc(&blocks, f.size()));
                    CUDA_CHECK(cudaMemcpy(blocks, f.data(), f.size(), cudaMemcpyHostToDevice));
                    p.mask = mask;
                    p.mask_kind = FLASH_MASK_BOOL;
                    p.mask_s.col = 1;
                    p.mask_s.row = pad ? 0 : s;
                    p.mask_s.head = 0;
                    p.mask_s.batch = pad ? s : 0;
                    p.mask_blocks = (const uint8_t *)blocks;
                    p.mask_blocks_s.col = 1;
                    p.mask_blocks_s.row = pad ? 0 : nc;
                    p.mask_blocks_s.head = 0;
                    p.mask_blocks_s.batch = pad ? nc : 0;
                    break;
                }
                case BV_SINK: {
                    std::vector<float> sv(p.h, 1.0f);
                    CUDA_CHECK(cudaMalloc(&sink, p.h * sizeof(float)));
                    CUDA_CHECK(cudaMemcpy(sink, sv.data(), p.h * sizeof(float), cudaMemcpyHostToDevice));
                    p.sink = sink;
                    break;
                }
                default: break;
                }
                p.has_hook |= p.softcap > 0 || p.alibi_slopes || p.mask || p.dropout_threshold;
                const double t = time_fwd(&p) * 1e-3;
                const double flops = 4.0 * p.h * band_pairs(&p) * visible_frac * d;
                printf("%-5d %-6d %-26s %-9.3f %.1f\n", d, s, names[bv], t * 1e3, flops / t * 1e-12);
                void *bufs[] = {mask, blocks, sink, slopes};
                for (void *x : bufs)
                    if (x)
                        CUDA_CHECK(cudaFree(x));
            }
    bench_free(&bb);
}

/* The bench's 16k bf16 tokens three ways: dense batches of seqlen s; the same batches as a varlen batch of
 * equal lengths (the cost of the varlen path itself); a varlen batch of random lengths in [1, 2 s]
 * (max_seqlen its longest). TFLOP/s on the visible pairs. */
static void run_varlen_bench(int only_d)
{
    bench_buffers bb;
    bench_alloc(&bb);
    const int dims[] = {64, 128, 256};
    const int seqs[] = {512, 2048, 8192};
    const int only_s = only_seqlen();
    printf("bf16 fwd TFLOP/s: dense, varlen of equal lengths, varlen of lengths 1..2 seq (16k tokens, "
           "nheads = 2048 / d)\n");
    printf("%-5s %-6s %-7s %-8s %-8s %s\n", "d", "seq", "causal", "dense", "varlen", "mixed");
    for (int d : dims)
        for (int causal = 0; causal < 2; causal++)
            for (int s : seqs) {
                if ((only_d && d != only_d) || (only_s && s != only_s))
                    continue;
                flash_params p;
                bench_params(&p, &bb, s, d);
                if (causal)
                    p.band_right = 0;
                double tflops[3];
                tflops[0] = 4.0 * p.h * band_pairs(&p) * d / (time_fwd(&p) * 1e-3) * 1e-12;
                for (int mixed = 0; mixed < 2; mixed++) {
                    std::vector<int32_t> cu(1, 0);
                    int longest = 0;
                    while (cu.back() < kBenchTokens) {
                        const int len = std::min(mixed ? irand(1, 2 * s) : s, kBenchTokens - cu.back());
                        cu.push_back(cu.back() + len);
                        longest = std::max(longest, len);
                    }
                    int32_t *cu_dev = upload_i32(cu);
                    flash_params v = p;
                    v.q_s.batch = v.k_s.batch = v.v_s.batch = v.o_s.batch = 0;
                    v.b = (int64_t)cu.size() - 1;
                    v.sq = v.sk = longest;
                    v.total_q = v.total_k = kBenchTokens;
                    v.lse_batch = 0;
                    v.lse_head = kBenchTokens;
                    v.cu_seqlens_q = v.cu_seqlens_k = cu_dev;
                    const double t = time_fwd(&v) * 1e-3;
                    v.cu_seqlens_q = v.cu_seqlens_k = cu.data();
                    tflops[1 + mixed] = 4.0 * v.h * band_pairs(&v) * d / t * 1e-12;
                    CUDA_CHECK(cudaFree(cu_dev));
                }
                printf("%-5d %-6d %-7s %-8.1f %-8.1f %.1f\n", d, s, causal ? "yes" : "no", tflops[0], tflops[1],
                       tflops[2]);
            }
    bench_free(&bb);
}

/* Decode (sq 1) with a KV cache, bf16 d 128, batch kDecodeBatch, kDecodeHeads query heads (kv heads: the same, and
 * GQA 4:1), causal, every sequence using the whole cache (seqused_k): the cache contiguous (b, cache, h_kv, d)
 * and paged (pages of kDecodePage rows in a random order through a block_table). Bandwidth: the bytes of K
 * and V the call must read over its time. */
static const int kDecodeBatch = 8;
static const int kDecodeHeads = 32;
static const int kDecodeDim = 128;
static const int kDecodePage = 256;

/* The decode benchmarks' tensors: caches for kDecodeBatch sequences of up to max_cache rows and kDecodeHeads kv
 * heads (the largest case), random bf16. */
typedef struct decode_buffers {
    __nv_bfloat16 *k, *v, *q, *o;
    float *lse;
} decode_buffers;

static decode_buffers decode_alloc(int max_cache)
{
    const size_t kv_elems = (size_t)kDecodeBatch * max_cache * kDecodeHeads * kDecodeDim;
    const size_t q_elems = (size_t)kDecodeBatch * kDecodeHeads * kDecodeDim;
    decode_buffers db;
    CUDA_CHECK(cudaMalloc(&db.k, kv_elems * sizeof(__nv_bfloat16)));
    CUDA_CHECK(cudaMalloc(&db.v, kv_elems * sizeof(__nv_bfloat16)));
    CUDA_CHECK(cudaMalloc(&db.q, q_elems * sizeof(__nv_bfloat16)));
    CUDA_CHECK(cudaMalloc(&db.o, q_elems * sizeof(__nv_bfloat16)));
    CUDA_CHECK(cudaMalloc(&db.lse, (size_t)kDecodeBatch * kDecodeHeads * sizeof(float)));
    fill_random_bf16<<<1024, 256>>>(db.k, kv_elems, 4);
    fill_random_bf16<<<1024, 256>>>(db.v, kv_elems, 5);
    fill_random_bf16<<<1024, 256>>>(db.q, q_elems, 6);
    CUDA_CHECK(cudaDeviceSynchronize());
    return db;
}

static void decode_free(decode_buffers *db)
{
    void *bufs[] = {db->k, db->v, db->q, db->o, db->lse};
    for (void *x : bufs)
        CUDA_CHECK(cudaFree(x));
}

/* One decode call: b sequences of one query each, kDecodeHeads query heads over hkv kv heads, a contiguous cache
 * (b, cache, hkv, kDecodeDim), causal bottom-right. */
static flash_params decode_params(const decode_buffers *db, int b, int hkv, int cache)
{
    flash_params p;
    memset(&p, 0, sizeof(p));
    p.q = db->q;
    p.k = db->k;
    p.v = db->v;
    p.o = db->o;
    p.lse = db->lse;
    p.q_s.head = p.o_s.head = kDecodeDim;
    p.q_s.row = p.o_s.row = (int64_t)kDecodeHeads * kDecodeDim;
    p.q_s.batch = p.o_s.batch = p.q_s.row;
    p.k_s.head = p.v_s.head = kDecodeDim;
    p.k_s.row = p.v_s.row = (int64_t)hkv * kDecodeDim;
    p.k_s.batch = p.v_s.batch = (int64_t)cache * hkv * kDecodeDim;
    p.b = b;
    p.h = kDecodeHeads;
    p.h_kv = hkv;
    p.h_per_kv = kDecodeHeads / hkv;
    p.sq = 1;
    p.sk = cache;
    p.d = kDecodeDim;
    p.lse_batch = kDecodeHeads;
    p.lse_head = 1;
    p.scale = 1.0 / sqrt((double)kDecodeDim);
    p.scale_log2 = (float)(p.scale * FLASH_LOG2E);
    p.band_left = -1;
    p.band_right = 0;
    p.band_bottom_right = 1;
    p.dtype = FLASH_BF16;
    p.k_batches = b;
    return p;
}

static const int kDecodeCaches[] = {4096, 32768, 131072};
static const int kDecodeMaxCache = 131072;

/* launch.cu's dispatch with its split heuristic, and with one split */
static cudaError_t fwd_split_heuristic(const flash_params *p, cudaStream_t stream)
{
    return run_fwd_splits(p, 0, stream);
}

static cudaError_t fwd_one_split(const flash_params *p, cudaStream_t stream)
{
    return run_fwd_splits(p, 1, stream);
}

/* Decode through launch.cu's dispatch (the decode kernel, split-KV by its heuristic and with one split): batch
 * kDecodeBatch and 1, kv heads kDecodeHeads and a quarter of them, the caches of kDecodeCaches, contiguous. */
static void run_decode_bench(void)
{
    const int batches[] = {kDecodeBatch, 1};
    const int kv_heads[] = {kDecodeHeads, kDecodeHeads / 4};
    decode_buffers db = decode_alloc(kDecodeMaxCache);
    printf("bf16 decode fwd (sq 1) through flash_fwd_cuda, h%d d%d; TB/s = bytes of K + V / time\n", kDecodeHeads,
           kDecodeDim);
    printf("%-4s %-7s %-7s %-7s %-9s %-7s %-9s %s\n", "b", "h/h_kv", "cache", "splits", "ms", "TB/s", "1split ms",
           "1split TB/s");
    for (int b : batches)
        for (int hkv : kv_heads)
            for (int cache : kDecodeCaches) {
                const flash_params p = decode_params(&db, b, hkv, cache);
                const double bytes = 2.0 * b * cache * hkv * kDecodeDim * sizeof(__nv_bfloat16);
                const double t = time_fwd(&p, fwd_split_heuristic) * 1e-3, t1 = time_fwd(&p, fwd_one_split) * 1e-3;
                char hh[16];
                snprintf(hh, sizeof(hh), "%d/%d", kDecodeHeads, hkv);
                printf("%-4d %-7s %-7d %-7d %-9.4f %-7.2f %-9.4f %.2f\n", b, hh, cache, flash_fwd_splits(&p, 0),
                       t * 1e3, bytes / t * 1e-12, t1 * 1e3, bytes / t1 * 1e-12);
            }
    decode_free(&db);
}

/* Decode through the prefill kernel (fwd_sm80), contiguous and paged. */
static void run_paged_bench(void)
{
    const int kv_heads[] = {kDecodeHeads, kDecodeHeads / 4};
    decode_buffers db = decode_alloc(kDecodeMaxCache);
    printf("bf16 decode fwd (sq 1, causal): b%d h%d d%d, every sequence using the whole cache; GB/s = bytes of "
           "K + V / time\n", kDecodeBatch, kDecodeHeads, kDecodeDim);
    printf("%-7s %-7s %-12s %-9s %-8s %s\n", "h/h_kv", "cache", "layout", "ms", "GB/s", "paged / contiguous time");
    for (int hkv : kv_heads)
        for (int cache : kDecodeCaches) {
            flash_params p = decode_params(&db, kDecodeBatch, hkv, cache);
            std::vector<int32_t> used(kDecodeBatch, cache);
            int32_t *used_dev = upload_i32(used);
            p.seqused_k = used_dev;
            const double bytes = 2.0 * kDecodeBatch * cache * hkv * kDecodeDim * sizeof(__nv_bfloat16);
            const double t_dense = time_fwd(&p, flash_fwd_sm80) * 1e-3;
            /* the same memory as pages of kDecodePage rows, in a random order */
            const int pages_per_seq = cache / kDecodePage;
            std::vector<int32_t> table((size_t)kDecodeBatch * pages_per_seq);
            for (size_t i = 0; i < table.size(); i++)
                table[i] = (int32_t)i;
            for (size_t i = table.size() - 1; i > 0; i--)
                std::swap(table[i], table[(size_t)irand(0, (int)i)]);
            int32_t *table_dev = upload_i32(table);
            p.block_table = table_dev;
            p.block_table_stride = pages_per_seq;
            p.page_size = kDecodePage;
            p.k_batches = (int64_t)table.size();
            p.k_s.batch = p.v_s.batch = (int64_t)kDecodePage * hkv * kDecodeDim;
            const double t_paged = time_fwd(&p, flash_fwd_sm80) * 1e-3;
            char hh[16];
            snprintf(hh, sizeof(hh), "%d/%d", kDecodeHeads, hkv);
            printf("%-7s %-7d %-12s %-9.3f %-8.0f\n", hh, cache, "contiguous", t_dense * 1e3, bytes / t_dense * 1e-9);
            printf("%-7s %-7d paged%-7d %-9.3f %-8.0f %.3f\n", hh, cache, kDecodePage, t_paged * 1e3,
                   bytes / t_paged * 1e-9, t_paged / t_dense);
            CUDA_CHECK(cudaFree(used_dev));
            CUDA_CHECK(cudaFree(table_dev));
        }
    decode_free(&db);
}

int main(int argc, char **argv)
{
    if (argc < 2 || (strcmp(argv[1], "check") && strcmp(argv[1], "bench") && strcmp(argv[1], "variants") &&
                     strcmp(argv[1], "varlen-bench") && strcmp(argv[1], "paged-bench") &&
                     strcmp(argv[1], "decode-bench"))) {
        fprintf(stderr, "usage: %s check [bf16|fp16|fp32|fp64] | bench [head dim] | variants [head dim] | "
                        "varlen-bench [head dim] | paged-bench | decode-bench\n", argv[0]);
        return 2;
    }
    if (!strcmp(argv[1], "decode-bench")) {
        run_decode_bench();
        return 0;
    }
    if (!strcmp(argv[1], "paged-bench")) {
        run_paged_bench();
        return 0;
    }
    if (!strcmp(argv[1], "varlen-bench")) {
        run_varlen_bench(argc > 2 ? atoi(argv[2]) : 0);
        return 0;
    }
    if (!strcmp(argv[1], "bench")) {
        run_bench(argc > 2 ? atoi(argv[2]) : 0);
        return 0;
    }
    if (!strcmp(argv[1], "variants")) {
        run_variant_bench(argc > 2 ? atoi(argv[2]) : 0);
        return 0;
    }
    return run_checks(argc > 2 ? argv[2] : NULL) ? 0 : 1;
}
