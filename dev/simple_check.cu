/* simple_check.cu: torch-free check of the fp32 / fp64 CUDA-core kernels (simple.cu,
 * rows.cu's dropout mask) with every variant of issue 10, against the double reference dev/attn_ref.h.
 *
 * Build: nvcc -std=c++17 -O2 -gencode=arch=compute_90a,code=sm_90a -Icsrc dev/simple_check.cu \
 *            csrc/cuda/simple.cu csrc/cuda/rows.cu -o /tmp/simple_check
 * Run:   /tmp/simple_check        every case in fp64 and fp32; exit 1 on any failure
 *        /tmp/simple_check fd     only the host self-check: attn_ref.h's gradients against central
 *                                 finite differences of its forward (no GPU needed)
 * Checked per case: out, lse, dq, dk, dv, dbias (max abs error / max(1, max |ref|)), padding of the
 * strided outputs untouched (NaN poison), the dropout keep mask against mask.h on the host.
 */
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
#include "flash.h"
#include "mask.h"

static const double kTolFp64 = 1e-12;
static const double kTolFp32 = 2e-5;
static const double kTolFd = 1e-6;
static const int kPad = 3; /* extra elements per row of every (b, s, h, d) tensor and of the mask */

enum geom { G_NONE, G_CAUSAL_BR, G_CAUSAL_TL, G_WINDOW };
enum mask_mode { M_NONE, M_BOOL, M_ADD };

struct tcase {
    const char *name;
    int b, h, hkv, sq, sk, d;
    int geom, left, right; /* G_WINDOW: flash-attn window (left, right), -1 unbounded, bottom-right */
    float softcap;
    int alibi;             /* 0 off, 1 per head, 2 per (batch, head) */
    int mask;              /* mask_mode */
    int mask_bcast;        /* mask broadcast over heads (head stride 0) */
    double dropout;
    int sink;
    int dbias;
};

static uint64_t rng = 0x243F6A8885A308D3ull;
static double urand(void) /* [0, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) * (1.0 / 9007199254740992.0);
}
static double srand1(void) { return 2.0 * urand() - 1.0; }

/* ---- problem: host data (double, rounded to T), params ------------------------------------------ */

struct problem {
    tcase c;
    flash_params p;                 /* host pointers replaced by device ones before the launch */
    std::vector<double> q, k, v, dout; /* (b, s, h, d) logical, contiguous */
    std::vector<double> mask;       /* (b, hm, sq, sk + kPad), hm = 1 when broadcast; bool as 0/1 */
    std::vector<double> mask_ref;   /* (b, h, sq, sk) additive, -inf where hidden (attn_ref.h's form) */
    std::vector<uint8_t> blocks;    /* (b, hm, ceil(sq / 16), ceil(sk / 16)) */
    std::vector<float> slopes;      /* (b or 1, h) */
    std::vector<double> sink;       /* (h) */
    int hm;
};

static int64_t li(int s, int h, int d, int bi, int si, int hi, int di)
{
    return (((int64_t)bi * s + si) * h + hi) * d + di;
}

template <typename T> static double rnd(double x) { return (double)(T)x; }

template <typename T>
static problem make_problem(const tcase &c, flash_dtype dt)
{
    problem pr;
    pr.c = c;
    flash_params &p = pr.p;
    memset(&p, 0, sizeof(p));
    p.b = c.b, p.h = c.h, p.h_kv = c.hkv, p.sq = c.sq, p.sk = c.sk, p.d = c.d, p.h_per_kv = c.h / c.hkv;
    p.scale = 1.0 / sqrt((double)c.d);
    p.scale_log2 = (float)(p.scale * FLASH_LOG2E);
    p.dtype = dt;
    p.lse_batch = (int64_t)c.h * c.sq;
    p.lse_head = c.sq;
    const int64_t sq = c.sq, sk = c.sk;
    /* the binding's band: causal band_right 0, window (left, right), -1 unbounded, bottom-right aligned
     * except G_CAUSAL_TL */
    p.band_left = p.band_right = -1;
    p.band_bottom_right = c.geom != G_CAUSAL_TL;
    if (c.geom == G_CAUSAL_BR || c.geom == G_CAUSAL_TL)
        p.band_right = 0;
    if (c.geom == G_WINDOW) {
        p.band_left = c.left;
        p.band_right = c.right;
    }
    auto fill = [](std::vector<double> &x, size_t n) {
        x.resize(n);
        for (auto &e : x)
            e = rnd<T>(srand1());
    };
    fill(pr.q, (size_t)c.b * sq * c.h * c.d);
    fill(pr.k, (size_t)c.b * sk * c.hkv * c.d);
    fill(pr.v, (size_t)c.b * sk * c.hkv * c.d);
    fill(pr.dout, (size_t)c.b * sq * c.h * c.d);
    for (auto &e : pr.q)
        e = rnd<T>(e * 2.0); /* scores of a few units: the softcap and the mask matter */
    if (c.softcap > 0)
        p.softcap = c.softcap;
    if (c.alibi) {
        const int nb = c.alibi == 2 ? c.b : 1;
        pr.slopes.resize((size_t)nb * c.h);
        for (auto &s : pr.slopes)
            s = (float)(0.05 + 0.3 * urand());
        p.alibi_batch_stride = c.alibi == 2 ? c.h : 0;
    }
    pr.hm = c.mask_bcast ? 1 : c.h;
    if (c.mask != M_NONE) {
        p.mask_kind = c.mask == M_BOOL ? FLASH_MASK_BOOL : FLASH_MASK_ADD;
        const int64_t row = sk + kPad;
        p.mask_s.col = 1;
        p.mask_s.row = row;
        p.mask_s.head = c.mask_bcast ? 0 : sq * row;
        p.mask_s.batch = (int64_t)pr.hm * sq * row;
        pr.mask.assign((size_t)c.b * pr.hm * sq * row, 0.0);
        const int64_t nbr = flash_cdiv64(sq, FLASH_MASK_BLOCK), nbc = flash_cdiv64(sk, FLASH_MASK_BLOCK);
        /* per 16 x 16 block: empty, plain or mixed; row 1 of each (b, h) fully hidden */
        for (int bi = 0; bi < c.b; ++bi)
            for (int hh = 0; hh < pr.hm; ++hh)
                for (int64_t br = 0; br < nbr; ++br)
                    for (int64_t bc = 0; bc < nbc; ++bc) {
                        const double u = urand();
                        const int kind = u < 0.2 ? 0 : (u < 0.5 ? 1 : 2); /* 0 empty, 1 plain, 2 mixed */
                        for (int64_t i = br * 16; i < std::min(sq, br * 16 + 16); ++i)
                            for (int64_t j = bc * 16; j < std::min(sk, bc * 16 + 16); ++j) {
                                double val;
                                const bool hide = kind == 0 || i == 1 || (kind == 2 && urand() < 0.35);
                                if (c.mask == M_BOOL)
                                    val = hide ? 0.0 : 1.0;
                                else
                                    val = hide ? -INFINITY : (kind == 1 ? 0.0 : rnd<T>(2.0 * srand1()));
                                pr.mask[p.mask_s.batch * bi + (int64_t)sq * row * hh + row * i + j] = val;
                            }
                    }
        p.mask_blocks_s.col = 1;
        p.mask_blocks_s.row = nbc;
        p.mask_blocks_s.head = c.mask_bcast ? 0 : nbr * nbc;
        p.mask_blocks_s.batch = (int64_t)pr.hm * nbr * nbc;
        pr.blocks.assign((size_t)c.b * pr.hm * nbr * nbc, 0);
        for (int bi = 0; bi < c.b; ++bi)
            for (int hh = 0; hh < pr.hm; ++hh)
                for (int64_t i = 0; i < sq; ++i)
                    for (int64_t j = 0; j < sk; ++j) {
                        const double val = pr.mask[p.mask_s.batch * bi + (int64_t)sq * row * hh + row * i + j];
                        const bool vis = c.mask == M_BOOL ? val != 0.0 : val != -INFINITY;
                        const bool plain = c.mask == M_BOOL ? val != 0.0 : val == 0.0;
                        uint8_t &f = pr.blocks[p.mask_blocks_s.batch * bi + p.mask_blocks_s.head * hh +
                                               nbc * (i / FLASH_MASK_BLOCK) + j / FLASH_MASK_BLOCK];
                        f |= (vis ? FLASH_MASK_ANY_VISIBLE : 0) | (plain ? 0 : FLASH_MASK_ANY_MASKED);
                    }
        pr.mask_ref.resize((size_t)c.b * c.h * sq * sk);
        for (int bi = 0; bi < c.b; ++bi)
            for (int hq = 0; hq < c.h; ++hq)
                for (int64_t i = 0; i < sq; ++i)
                    for (int64_t j = 0; j < sk; ++j) {
                        const double val = pr.mask[p.mask_s.batch * bi + p.mask_s.head * hq + p.mask_s.row * i + j];
                        pr.mask_ref[(((size_t)bi * c.h + hq) * sq + i) * sk + j] =
                            c.mask == M_BOOL ? (val != 0.0 ? 0.0 : -INFINITY) : val;
                    }
    }
    set_dropout(&p, c.dropout, 0x1234567890abcdefull, 0x0000000500000010ull);
    if (c.sink) {
        pr.sink.resize(c.h);
        for (auto &s : pr.sink)
            s = rnd<T>(1.5 * srand1() + 0.5);
    }
    p.has_hook = p.softcap > 0 || c.alibi || c.mask != M_NONE || c.dropout > 0;
    return pr;
}

/* ---- double reference (dev/attn_ref.h) ---------------------------------------------------------- */

struct result {
    std::vector<double> o, lse, dq, dk, dv, dbias;
};

/* out, lse and the gradients of sum(out * dout) from attn_ref.h; mask_ref: (b, h, sq, sk) additive or
 * empty. */
static result reference(const problem &pr, const std::vector<double> &q, const std::vector<double> &k,
                        const std::vector<double> &v, const std::vector<double> &mask_ref)
{
    const tcase &c = pr.c;
    flash_params p = pr.p; /* attn_ref.h reads the host slopes through mask.h */
    p.alibi_slopes = pr.slopes.empty() ? NULL : pr.slopes.data();
    const double *mask = mask_ref.empty() ? NULL : mask_ref.data();
    const double *sink = pr.sink.empty() ? NULL : pr.sink.data();
    result r;
    r.o.resize((size_t)c.b * c.sq * c.h * c.d);
    r.lse.resize((size_t)c.b * c.h * c.sq);
    r.dq.resize((size_t)c.b * c.sq * c.h * c.d);
    r.dk.resize((size_t)c.b * c.sk * c.hkv * c.d);
    r.dv.resize((size_t)c.b * c.sk * c.hkv * c.d);
    r.dbias.resize((size_t)c.b * c.h * c.sq * c.sk);
    ref_forward(&p, q.data(), k.data(), v.data(), mask, sink, r.o.data(), r.lse.data());
    ref_backward(&p, q.data(), k.data(), v.data(), mask, sink, pr.dout.data(), r.dq.data(), r.dk.data(),
                 r.dv.data(), r.dbias.data(), NULL);
    return r;
}

/* Finite differences of L = sum(out * dout) through the reference forward against its gradients (the
 * additive mask's: dbias). */
static int fd_check(void)
{
    tcase c = {"fd", 1, 2, 1, 5, 7, 3, G_WINDOW, 4, 1, 1.5f, 2, M_ADD, 0, 0.3, 1, 1};
    problem pr = make_problem<double>(c, FLASH_FP64);
    for (auto &e : pr.q)
        e *= 0.5;
    for (auto &e : pr.mask_ref)
        if (e != -INFINITY)
            e = 0.3 * srand1();
    pr.mask_ref[2 * c.sk + 3] = -INFINITY; /* (head 0, row 2, key 3) */
    const result r = reference(pr, pr.q, pr.k, pr.v, pr.mask_ref);
    auto loss = [&](const std::vector<double> &q, const std::vector<double> &k, const std::vector<double> &v,
                    const std::vector<double> &mask) {
        const result x = reference(pr, q, k, v, mask);
        double L = 0;
        for (size_t t = 0; t < x.o.size(); ++t)
            L += x.o[t] * pr.dout[t];
        return L;
    };
    const double eps = 1e-6;
    double worst = 0;
    auto probe = [&](std::vector<double> &x, const std::vector<double> &g, int which) {
        for (size_t t = 0; t < x.size(); ++t) {
            if (x[t] == -INFINITY)
                continue;
            const double x0 = x[t];
            std::vector<double> qq = pr.q, kk = pr.k, vv = pr.v, mm = pr.mask_ref;
            std::vector<double> *tgt[4] = {&qq, &kk, &vv, &mm};
            (*tgt[which])[t] = x0 + eps;
            const double lp = loss(qq, kk, vv, mm);
            (*tgt[which])[t] = x0 - eps;
            const double lm = loss(qq, kk, vv, mm);
            worst = std::max(worst, fabs((lp - lm) / (2 * eps) - g[t]));
        }
    };
    probe(pr.q, r.dq, 0);
    probe(pr.k, r.dk, 1);
    probe(pr.v, r.dv, 2);
    probe(pr.mask_ref, r.dbias, 3); /* both (b, h, sq, sk) */
    printf("%s reference gradients vs finite differences: max abs error %.2e\n", worst < kTolFd ? "PASS" : "FAIL", worst);
    return worst < kTolFd;
}

/* ---- GPU run ----------------------------------------------------------------------------------- */

template <typename T>
static T *upload(const std::vector<double> &x)
{
    std::vector<T> h(x.begin(), x.end());
    T *d;
    CUDA_CHECK(cudaMalloc(&d, std::max<size_t>(1, h.size()) * sizeof(T)));
    CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

/* (b, s, h, d) logical -> device buffer with rows of h * d + kPad elements; poison: NaN padding */
template <typename T>
static T *upload_rows(const std::vector<double> &x, int b, int s, int h, int d, flash_strides *st, bool poison)
{
    st->head = d;
    st->row = (int64_t)h * d + kPad;
    st->batch = st->row * s;
    std::vector<double> buf((size_t)b * st->batch, poison ? NAN : 0.0);
    for (int bi = 0; bi < b; ++bi)
        for (int si = 0; si < s; ++si)
            for (int hi = 0; hi < h; ++hi)
                for (int di = 0; di < d; ++di)
                    buf[st->batch * bi + st->row * si + st->head * hi + di] =
                        poison ? NAN : x[li(s, h, d, bi, si, hi, di)];
    return upload<T>(buf);
}

template <typename T>
static std::vector<double> download(const T *d, size_t n)
{
    std::vector<T> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return std::vector<double>(h.begin(), h.end());
}

/* error of a strided (b, s, h, d) device result; padding must still be NaN */
static double err_rows(const std::vector<double> &dev, const std::vector<double> &ref, int b, int s, int h, int d,
                       const flash_strides &st, bool *pad_ok)
{
    double worst = 0, mag = 1;
    for (int bi = 0; bi < b; ++bi)
        for (int si = 0; si < s; ++si) {
            for (int hi = 0; hi < h; ++hi)
                for (int di = 0; di < d; ++di) {
                    const double x = dev[st.batch * bi + st.row * si + st.head * hi + di];
                    const double y = ref[li(s, h, d, bi, si, hi, di)];
                    worst = std::max(worst, isnan(x) ? INFINITY : fabs(x - y));
                    mag = std::max(mag, fabs(y));
                }
            for (int e = 0; e < kPad; ++e)
                *pad_ok &= (bool)isnan(dev[st.batch * bi + st.row * si + (int64_t)h * d + e]);
        }
    return worst / mag;
}

static double err_flat(const std::vector<double> &dev, const std::vector<double> &ref)
{
    double worst = 0, mag = 1;
    for (size_t t = 0; t < ref.size(); ++t) {
        if (ref[t] == -INFINITY || dev[t] == -INFINITY) {
            if (ref[t] != dev[t])
                worst = INFINITY;
            continue;
        }
        worst = std::max(worst, isnan(dev[t]) ? INFINITY : fabs(dev[t] - ref[t]));
        mag = std::max(mag, fabs(ref[t]));
    }
    return worst / mag;
}

template <typename T>
static int run_case(const tcase &c, flash_dtype dt, const char *tname)
{
    problem pr = make_problem<T>(c, dt);
    const result ref = reference(pr, pr.q, pr.k, pr.v, pr.mask_ref);
    flash_params p = pr.p;
    const int b = c.b, h = c.h, hkv = c.hkv, sq = c.sq, sk = c.sk, d = c.d;
    T *q = upload_rows<T>(pr.q, b, sq, h, d, &p.q_s, false);
    T *k = upload_rows<T>(pr.k, b, sk, hkv, d, &p.k_s, false);
    T *v = upload_rows<T>(pr.v, b, sk, hkv, d, &p.v_s, false);
    T *dout = upload_rows<T>(pr.dout, b, sq, h, d, &p.do_s, false);
    T *o = upload_rows<T>(pr.dout, b, sq, h, d, &p.o_s, true);
    T *dq = upload_rows<T>(pr.dout, b, sq, h, d, &p.dq_s, true);
    T *dk = upload_rows<T>(pr.k, b, sk, hkv, d, &p.dk_s, true);
    T *dv = upload_rows<T>(pr.k, b, sk, hkv, d, &p.dv_s, true);
    T *lse = upload<T>(std::vector<double>((size_t)b * h * sq, NAN));
    T *delta = upload<T>(std::vector<double>((size_t)b * h * sq, NAN));
    T *dbias = c.dbias ? upload<T>(std::vector<double>((size_t)b * h * sq * sk, 0.0)) : NULL;
    T *mask = NULL, *sink = NULL;
    uint8_t *mask_u8 = NULL, *blocks = NULL, *keep = NULL;
    float *slopes = NULL;
    if (c.mask == M_ADD)
        mask = upload<T>(pr.mask);
    if (c.mask == M_BOOL) {
        std::vector<uint8_t> mb(pr.mask.begin(), pr.mask.end());
        CUDA_CHECK(cudaMalloc(&mask_u8, mb.size()));
        CUDA_CHECK(cudaMemcpy(mask_u8, mb.data(), mb.size(), cudaMemcpyHostToDevice));
    }
    if (c.mask != M_NONE) {
        CUDA_CHECK(cudaMalloc(&blocks, pr.blocks.size()));
        CUDA_CHECK(cudaMemcpy(blocks, pr.blocks.data(), pr.blocks.size(), cudaMemcpyHostToDevice));
    }
    if (c.alibi) {
        CUDA_CHECK(cudaMalloc(&slopes, pr.slopes.size() * sizeof(float)));
        CUDA_CHECK(cudaMemcpy(slopes, pr.slopes.data(), pr.slopes.size() * sizeof(float), cudaMemcpyHostToDevice));
    }
    if (c.sink)
        sink = upload<T>(pr.sink);
    p.q = q, p.k = k, p.v = v, p.o = o, p.lse = lse, p.dout = dout, p.dq = dq, p.dk = dk, p.dv = dv;
    p.delta = delta, p.dbias = dbias, p.sink = sink, p.alibi_slopes = slopes, p.mask_blocks = blocks;
    p.mask = c.mask == M_ADD ? (const void *)mask : (const void *)mask_u8;
    CUDA_CHECK(flash_fwd_simple(&p, 0));
    CUDA_CHECK(flash_bwd_simple(&p, 0));
    const size_t nkeep = (size_t)b * h * sq * sk;
    CUDA_CHECK(cudaMalloc(&keep, nkeep));
    CUDA_CHECK(flash_dropout_mask_cuda(&p, keep, 0));
    CUDA_CHECK(cudaDeviceSynchronize());

    bool pad_ok = true;
    const double e_o = err_rows(download(o, (size_t)b * p.o_s.batch), ref.o, b, sq, h, d, p.o_s, &pad_ok);
    const double e_lse = err_flat(download(lse, (size_t)b * h * sq), ref.lse);
    const double e_dq = err_rows(download(dq, (size_t)b * p.dq_s.batch), ref.dq, b, sq, h, d, p.dq_s, &pad_ok);
    const double e_dk = err_rows(download(dk, (size_t)b * p.dk_s.batch), ref.dk, b, sk, hkv, d, p.dk_s, &pad_ok);
    const double e_dv = err_rows(download(dv, (size_t)b * p.dv_s.batch), ref.dv, b, sk, hkv, d, p.dv_s, &pad_ok);
    const double e_db = c.dbias ? err_flat(download(dbias, nkeep), ref.dbias) : 0.0;
    std::vector<uint8_t> kh(nkeep);
    CUDA_CHECK(cudaMemcpy(kh.data(), keep, nkeep, cudaMemcpyDeviceToHost));
    int64_t keep_bad = 0, kept = 0;
    for (int64_t bh = 0; bh < (int64_t)b * h; ++bh)
        for (int64_t i = 0; i < sq; ++i)
            for (int64_t j = 0; j < sk; ++j) {
                const uint8_t x = kh[(bh * sq + i) * sk + j];
                keep_bad += x != (uint8_t)flash_dropout_keep(&p, bh, i, j);
                kept += x;
            }
    const double tol = dt == FLASH_FP64 ? kTolFp64 : kTolFp32;
    const double worst = std::max({e_o, e_lse, e_dq, e_dk, e_dv, e_db});
    const bool ok = worst <= tol && pad_ok && keep_bad == 0;
    printf("%s %s %-22s b=%d h=%d/%d sq=%3d sk=%3d d=%3d | o %.1e lse %.1e dq %.1e dk %.1e dv %.1e dbias %.1e"
           " | keep %.3f%s%s\n",
           ok ? "PASS" : "FAIL", tname, c.name, b, h, hkv, sq, sk, d, e_o, e_lse, e_dq, e_dk, e_dv, e_db,
           (double)kept / (double)nkeep, pad_ok ? "" : " PADDING-WRITTEN", keep_bad ? " KEEP-MISMATCH" : "");
    void *bufs[] = {q, k, v, dout, o, dq, dk, dv, lse, delta, dbias, mask, sink, mask_u8, blocks, keep, slopes};
    for (void *x : bufs)
        if (x)
            CUDA_CHECK(cudaFree(x));
    return ok;
}

static const tcase kCases[] = {
    /* name                b  h hkv sq  sk   d  geom        l   r  cap  alibi mask  bc  drop sink dbias */
    {"dense",              2, 4, 2, 37, 53, 40, G_NONE,      0,  0, 0.f, 0, M_NONE, 0, 0.0, 0, 0},
    {"causal-br sq>sk",    2, 4, 2, 50, 20, 64, G_CAUSAL_BR, 0,  0, 0.f, 0, M_NONE, 0, 0.0, 0, 0},
    {"causal-tl",          1, 2, 1, 45, 61, 33, G_CAUSAL_TL, 0,  0, 0.f, 0, M_NONE, 0, 0.0, 0, 0},
    {"window 7,3",         2, 2, 2, 70, 90, 16, G_WINDOW,    7,  3, 0.f, 0, M_NONE, 0, 0.0, 0, 0},
    {"window 0,0",         1, 2, 1, 40, 40,  8, G_WINDOW,    0,  0, 0.f, 0, M_NONE, 0, 0.0, 0, 0},
    {"window -1,5",        1, 2, 2, 33, 47, 24, G_WINDOW,   -1,  5, 0.f, 0, M_NONE, 0, 0.0, 0, 0},
    {"window 9,-1",        1, 2, 2, 47, 33, 24, G_WINDOW,    9, -1, 0.f, 0, M_NONE, 0, 0.0, 0, 0},
    {"softcap",            2, 4, 2, 37, 53, 40, G_NONE,      0,  0, 2.f, 0, M_NONE, 0, 0.0, 0, 0},
    {"alibi head",         2, 4, 2, 37, 53, 40, G_CAUSAL_BR, 0,  0, 0.f, 1, M_NONE, 0, 0.0, 0, 0},
    {"alibi batch",        2, 4, 4, 53, 37, 40, G_NONE,      0,  0, 0.f, 2, M_NONE, 0, 0.0, 0, 0},
    {"bool mask",          2, 4, 2, 37, 53, 40, G_NONE,      0,  0, 0.f, 0, M_BOOL, 0, 0.0, 0, 0},
    {"bool mask bcast",    2, 4, 2, 64, 80, 64, G_NONE,      0,  0, 0.f, 0, M_BOOL, 1, 0.0, 0, 0},
    {"add mask +dbias",    2, 4, 2, 37, 53, 40, G_NONE,      0,  0, 0.f, 0, M_ADD,  0, 0.0, 0, 1},
    {"add mask bcast",     2, 4, 1, 48, 35, 32, G_NONE,      0,  0, 0.f, 0, M_ADD,  1, 0.0, 0, 0},
    {"dropout",            2, 4, 2, 37, 53, 40, G_NONE,      0,  0, 0.f, 0, M_NONE, 0, 0.2, 0, 0},
    {"sink",               2, 4, 2, 37, 53, 40, G_NONE,      0,  0, 0.f, 0, M_NONE, 0, 0.0, 1, 0},
    {"sink causal sq>sk",  1, 2, 1, 30, 10, 16, G_CAUSAL_BR, 0,  0, 0.f, 0, M_NONE, 0, 0.0, 1, 0},
    {"window+softcap",     2, 2, 1, 60, 60, 48, G_WINDOW,    8,  0, 3.f, 0, M_NONE, 0, 0.0, 0, 0},
    {"window+alibi",       2, 2, 1, 60, 75, 48, G_WINDOW,   10,  4, 0.f, 1, M_NONE, 0, 0.0, 0, 0},
    {"mask+dropout",       2, 4, 2, 37, 53, 40, G_NONE,      0,  0, 0.f, 0, M_BOOL, 0, 0.3, 0, 0},
    {"sink+window",        2, 2, 2, 50, 50, 20, G_WINDOW,    5,  2, 0.f, 0, M_NONE, 0, 0.0, 1, 0},
    {"add+softcap+dbias",  1, 2, 1, 40, 40, 32, G_CAUSAL_TL, 0,  0, 4.f, 0, M_ADD,  0, 0.0, 0, 1},
    {"everything",         2, 4, 2, 41, 67, 72, G_WINDOW,   20,  6, 5.f, 2, M_ADD,  0, 0.15, 1, 1},
    {"everything d256",    1, 2, 1, 19, 35, 256, G_CAUSAL_BR, 0, 0, 5.f, 1, M_ADD,  1, 0.25, 1, 1},
    {"d1",                 1, 3, 3, 17, 65,  1, G_CAUSAL_BR, 0,  0, 1.f, 0, M_BOOL, 0, 0.1, 1, 0},
};

int main(int argc, char **argv)
{
    int ok = fd_check();
    if (argc > 1 && !strcmp(argv[1], "fd"))
        return ok ? 0 : 1;
    for (const tcase &c : kCases) {
        ok &= run_case<double>(c, FLASH_FP64, "fp64");
        ok &= run_case<float>(c, FLASH_FP32, "fp32");
    }
    printf("%s\n", ok ? "ALL PASS" : "SOME FAILED");
    return ok ? 0 : 1;
}
