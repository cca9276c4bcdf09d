/* amx.c: the products C = [C +] A B on AMX tiles (amx.h) for flash_cpu.c's fp32 kernels, or, on CPUs with
 * AVX512-BF16 but no AMX (AMD Zen 4), the same products by VDPBF16PS (gemm_dp: the bf16 forward only, amx_on).
 *
 * Tiles: C blocks of 32 x 32 fp32 (tiles 0-3, 2 x 2 of 16 x 16), A in 16 rows x 32 bf16 (tiles 4, 5), B in the
 * VNNI layout, 16 pairs of k rows x 16 columns (tiles 6, 7); one TDPBF16PS per (A tile, B tile, term pair) and
 * k step of 32. The operands are packed, A as [mt][kt][16][32] and B as [kt][nt][16][16][2], zero-padded to
 * multiples of 32, with every value split by truncation into a_parts / b_parts bf16 terms: t1 = x with its low 16
 * bits cleared, t2 the same of x - t1, t3 = x - t1 - t2 (each difference exact in fp32; 24 significand bits = 3
 * x 8, so three terms are x exactly, two an fp16 value, one a bf16 value). C blocks that pass the edge of c go
 * through a 32 x 32 buffer. flash_amx_begin loads the one tile configuration (8 tiles of 16 rows x 64 bytes) in the
 * calling thread, flash_amx_end releases the tile state.
 * The forward's AVX-512 passes around the products (amx.h): the online softmax fused with P^T's packing
 * (flash_amx_softmax_pack), the accumulator's rescale by 16-column groups, Q^T / K / V^T packed from fp16 / bf16
 * rows as they are (16 x 16 transposes, no fp32 copies), O stored transposed with its fp16 / bf16 rounding.
 * Speed (2026-12-06, one thread of a Sapphire Rapids, B1 H8 D64, benchmarks/results/cpu/amx_pack_2026-12-06): bf16
 * forward 0.95-1.11x torch's CPU SDPA time without causal masking, 0.85-0.91x causal, forward+backward 0.67-0.87x. */
#define _DEFAULT_SOURCE /* syscall() under -std=c11 */
#include "amx.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__linux__) && \
    ((defined(__clang__) && __clang_major__ >= 14) || (!defined(__clang__) && __GNUC__ >= 11))
#define FLASH_AMX 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#define FLASH_AMX 0
#endif

#define ROUND32(x) (((x) + 31) / 32 * 32)

int64_t flash_amx_scratch_elems(int64_t max_m, int64_t max_n, int64_t max_k)
{
    const int64_t kp = ROUND32(max_k);
    return 3 * (ROUND32(max_m) * kp + kp * ROUND32(max_n));
}

#if FLASH_AMX

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static int amx_state; /* 0: not probed yet; else 1 + the backends found (AMX_TILES, AMX_DP bits) */
#define AMX_TILES FLASH_AMX_TILES
#define AMX_DP FLASH_AMX_DP

static int amx_probe(void)
{
    unsigned a, b, c, d;
    int found = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 1;
    const unsigned amx_bf16 = 1u << 22, amx_tile = 1u << 24;
    if ((d & (amx_bf16 | amx_tile)) == (amx_bf16 | amx_tile) &&
        syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0)
        found |= AMX_TILES;
    const unsigned f = 1u << 16, bw = 1u << 30, vl = 1u << 31, osxsave = 1u << 27;
    unsigned a1, b1, c1, d1, c0 = 0;
    if ((b & (f | bw | vl)) == (f | bw | vl) && __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1) && (a1 & (1u << 5)) &&
        __get_cpuid(1, &a1, &b1, &c0, &d1) && (c0 & osxsave)) {
        unsigned lo, hi;
        __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        if ((lo & 0xE6) == 0xE6) /* SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM state enabled */
            found |= AMX_DP;
    }
    return 1 + found;
}

int flash_amx_backends(void)
{
    int s = __atomic_load_n(&amx_state, __ATOMIC_ACQUIRE);
    if (!s) {
        s = amx_probe();
        __atomic_store_n(&amx_state, s, __ATOMIC_RELEASE);
    }
    return s - 1;
}

/* The backend of this call: AMX_TILES, AMX_DP or 0 (FLASHATTN_EXT_CPU_AMX: "0" none, "dp" the dot products even
 * where tiles exist; read per call). */
int flash_amx_usable(void)
{
    const char *env = getenv("FLASHATTN_EXT_CPU_AMX");
    if (env && strcmp(env, "0") == 0)
        return 0;
    const int found = flash_amx_backends();
    if (env && strcmp(env, "dp") == 0)
        return found & AMX_DP;
    return found & AMX_TILES ? AMX_TILES : found & AMX_DP;
}

#define AMX_PACK_TARGET __attribute__((target("avx512f,avx512bw,avx512vl")))
#define HI16 0xFFFF0000u

/* The next term of 16 values: their top 16 bits (as 32-bit words, low half zero); x -= the term. */
AMX_PACK_TARGET static inline __m512i term(__m512 *x)
{
    const __m512i hi = _mm512_and_si512(_mm512_castps_si512(*x), _mm512_set1_epi32((int)HI16));
    *x = _mm512_sub_ps(*x, _mm512_castsi512_ps(hi));
    return hi;
}

/* x rounded to the nearest bf16, ties to even, in the top 16 bits of each 32-bit word (low half zero; NaN not
 * special-cased). */
AMX_PACK_TARGET static inline __m512i bf16_rne(__m512 x)
{
    const __m512i b = _mm512_castps_si512(x);
    const __m512i even = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    return _mm512_and_si512(_mm512_add_epi32(b, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), even)),
                            _mm512_set1_epi32((int)HI16));
}

/* term, or for the last term (last set) x rounded to the nearest bf16 (ties to even): exact where the terms
 * before left at most 8 significant bits (the third of three), and without truncation's bias where they did not. */
AMX_PACK_TARGET static inline __m512i term_last(__m512 *x, int last)
{
    return last ? bf16_rne(*x) : term(x);
}

static inline __mmask16 lanes(int64_t valid)
{
    return valid >= 16 ? (__mmask16)0xFFFF : valid <= 0 ? (__mmask16)0 : (__mmask16)((1u << valid) - 1);
}

AMX_PACK_TARGET void flash_amx_scale_columns(float *acc, int64_t ld, int64_t rows, uint32_t groups, const float *alpha)
{
    if (!groups)
        return;
    const int n = 32 - __builtin_clz(groups); /* groups 0 .. n - 1, row by row (alpha is 1 in the others) */
    __m512 a[32];
    for (int g = 0; g < n; g++)
        a[g] = _mm512_loadu_ps(alpha + 16 * g);
    for (int64_t r = 0; r < rows; r++)
        for (int g = 0; g < n; g++)
            _mm512_storeu_ps(acc + r * ld + 16 * g, _mm512_mul_ps(_mm512_loadu_ps(acc + r * ld + 16 * g), a[g]));
}

/* r[i] (16 rows of 16 32-bit elements) -> r[c] = column c. Unpacks pair rows, then quads, within 128-bit lanes;
 * two lane shuffles gather each column's four quads. */
AMX_PACK_TARGET static inline void transpose16(__m512i r[16])
{
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) { /* r[i + e], lane L: rows i .. i + 3 of column 4 L + e */
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int e = 0; e < 4; e++) {
        const __m512i ab_lo = _mm512_shuffle_i32x4(r[e], r[4 + e], 0x44),
                      ab_hi = _mm512_shuffle_i32x4(r[e], r[4 + e], 0xEE);
        const __m512i cd_lo = _mm512_shuffle_i32x4(r[8 + e], r[12 + e], 0x44),
                      cd_hi = _mm512_shuffle_i32x4(r[8 + e], r[12 + e], 0xEE);
        t[e] = _mm512_shuffle_i32x4(ab_lo, cd_lo, 0x88);
        t[4 + e] = _mm512_shuffle_i32x4(ab_lo, cd_lo, 0xDD);
        t[8 + e] = _mm512_shuffle_i32x4(ab_hi, cd_hi, 0x88);
        t[12 + e] = _mm512_shuffle_i32x4(ab_hi, cd_hi, 0xDD);
    }
    for (int i = 0; i < 16; i++)
        r[i] = t[i];
}

/* The 16 x 16 block of 32-bit words r (r[i]: row i) stored transposed as one packed tile of 16 rows x 32 bf16. */
AMX_PACK_TARGET static inline void store_transposed16(uint16_t *blk, __m512i r[16])
{
    transpose16(r);
    for (int c = 0; c < 16; c++)
        _mm512_storeu_si512(blk + c * 32, r[c]);
}

AMX_PACK_TARGET void flash_amx_pack_a_rows16(uint16_t *dst, int64_t m, int64_t k, const uint16_t *const *rows)
{
    const int64_t mp = ROUND32(m), kt_n = ROUND32(k) / 32;
    for (int64_t i = 0; i < mp; i++)
        for (int64_t kt = 0; kt < kt_n; kt++) {
            const int64_t left = k - kt * 32; /* elements of this 32-wide block inside the row */
            const __mmask32 mk = left >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << left) - 1);
            const __m512i x = i < m && rows[i] ? _mm512_maskz_loadu_epi16(mk, rows[i] + kt * 32)
                                               : _mm512_setzero_si512();
            _mm512_storeu_si512(dst + ((i / 16) * kt_n + kt) * 512 + (i % 16) * 32, x);
        }
}

AMX_PACK_TARGET void flash_amx_pack_at_rows16(uint16_t *dst, int64_t m, int64_t m_valid, int64_t k,
                                              const uint16_t *const *rows)
{
    const int64_t mp = ROUND32(m), kt_n = ROUND32(k) / 32;
    for (int64_t kt = 0; kt < kt_n; kt++)
        for (int64_t i0 = 0; i0 < mp; i0 += 16) {
            const __mmask16 ml = lanes(m_valid - i0);
            __m512i words[16]; /* lane c of words[w]: A row i0 + c's word w, i.e. rows 2 w, 2 w + 1 of the block */
            for (int w = 0; w < 16; w++) {
                const int64_t kk = kt * 32 + 2 * w;
                const __m256i lo = kk < k && rows[kk] ? _mm256_maskz_loadu_epi16(ml, rows[kk] + i0)
                                                      : _mm256_setzero_si256();
                const __m256i hi = kk + 1 < k && rows[kk + 1] ? _mm256_maskz_loadu_epi16(ml, rows[kk + 1] + i0)
                                                              : _mm256_setzero_si256();
                words[w] = _mm512_or_si512(_mm512_cvtepu16_epi32(lo), _mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
            }
            store_transposed16(dst + ((i0 / 16) * kt_n + kt) * 512, words);
        }
}

AMX_PACK_TARGET void flash_amx_pack_a(uint16_t *dst, int parts, int64_t m, int64_t k, const float *a, int64_t a_rs,
                                      int64_t a_ks)
{
    const int64_t mp = ROUND32(m), kp = ROUND32(k), kt_n = kp / 32, plane = mp * kp;
    if (a_rs == 1 && a_ks != 1) { /* a^T rows: pairs of them give the 32-bit words of 16 A rows, transposed */
        for (int64_t kt = 0; kt < kt_n; kt++)
            for (int64_t i0 = 0; i0 < mp; i0 += 16) {
                const __mmask16 ml = lanes(m - i0);
                __m512 x[16][2];
                for (int w = 0; w < 16; w++) /* x[w][h]: a^T row kk = 32 kt + 2 w + h, elements i0 .. i0 + 15 */
                    for (int h = 0; h < 2; h++) {
                        const int64_t kk = kt * 32 + 2 * w + h;
                        x[w][h] = kk < k ? _mm512_maskz_loadu_ps(ml, a + i0 + kk * a_ks) : _mm512_setzero_ps();
                    }
                for (int p = 0; p < parts; p++) {
                    __m512i words[16]; /* lane c of words[w]: A row i0 + c's word w (its elements 2 w, 2 w + 1) */
                    for (int w = 0; w < 16; w++) {
                        const __m512i u0 = term(&x[w][0]), u1 = term(&x[w][1]);
                        words[w] = _mm512_or_si512(u1, _mm512_srli_epi32(u0, 16));
                    }
                    store_transposed16(dst + p * plane + ((i0 / 16) * kt_n + kt) * 512, words);
                }
            }
        return;
    }
    for (int64_t i = 0; i < mp; i++)
        for (int64_t kt = 0; kt < kt_n; kt++) {
            uint16_t *row = dst + ((i / 16) * kt_n + kt) * 512 + (i % 16) * 32;
            const int64_t k0 = kt * 32;
            __m512 x0, x1;
            if (i < m && a_ks == 1) {
                x0 = _mm512_maskz_loadu_ps(lanes(k - k0), a + i * a_rs + k0);
                x1 = _mm512_maskz_loadu_ps(lanes(k - k0 - 16), a + i * a_rs + k0 + 16);
            } else {
                _Alignas(64) float t[32];
                for (int e = 0; e < 32; e++)
                    t[e] = i < m && k0 + e < k ? a[i * a_rs + (k0 + e) * a_ks] : 0.0f;
                x0 = _mm512_load_ps(t);
                x1 = _mm512_load_ps(t + 16);
            }
            for (int p = 0; p < parts; p++) {
                const __m256i h0 = _mm512_cvtepi32_epi16(_mm512_srli_epi32(term(&x0), 16));
                const __m256i h1 = _mm512_cvtepi32_epi16(_mm512_srli_epi32(term(&x1), 16));
                _mm512_storeu_si512(row + p * plane, _mm512_inserti64x4(_mm512_castsi256_si512(h0), h1, 1));
            }
        }
}

AMX_PACK_TARGET void flash_amx_pack_b(uint16_t *dst, int parts, int64_t k, int64_t n, const float *b, int64_t ldb)
{
    const int64_t kp = ROUND32(k), np = ROUND32(n), nt_n = np / 16, plane = kp * np;
    for (int64_t kk = 0; kk < kp; kk += 2)
        for (int64_t j0 = 0; j0 < np; j0 += 16) {
            const __mmask16 ml = lanes(n - j0);
            __m512 x0 = kk < k ? _mm512_maskz_loadu_ps(ml, b + kk * ldb + j0) : _mm512_setzero_ps();
            __m512 x1 = kk + 1 < k ? _mm512_maskz_loadu_ps(ml, b + (kk + 1) * ldb + j0) : _mm512_setzero_ps();
            uint16_t *row = dst + ((kk / 32) * nt_n + j0 / 16) * 512 + ((kk % 32) / 2) * 32;
            for (int p = 0; p < parts; p++) {
                const __m512i u0 = term(&x0), u1 = term(&x1);
                _mm512_storeu_si512(row + p * plane, _mm512_or_si512(u1, _mm512_srli_epi32(u0, 16)));
            }
        }
}

/* 2^x for 16 lanes: 2^n * 2^f with n = round(x), |f| <= 1/2, 2^f by a degree-5 polynomial fitted for the least
 * maximum relative error on [-1/2, 1/2] (7.5e-8 in exact arithmetic, 2.2e-7 evaluated in fp32: within 2 ulp);
 * x below -125 (-inf included: masked scores) gives exactly 0 without computing a denormal (whose microcode assists
 * made causal tiles 2.5x slower), NaN stays NaN (max keeps its second operand when one is NaN; NLT_UQ keeps NaN
 * lanes). */
AMX_PACK_TARGET static inline __m512 exp2_16(__m512 x)
{
    const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-125.0f), _CMP_NLT_UQ);
    x = _mm512_max_ps(_mm512_set1_ps(-125.0f), x);
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(x, n);
    __m512 e = _mm512_set1_ps(1.3276735553517938e-03f);
    e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(9.6756387501955032e-03f));
    e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(5.5507130920886993e-02f));
    e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(2.4022117257118225e-01f));
    e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(6.9314694404602051e-01f));
    e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(1.0000001192092896e+00f));
    return _mm512_maskz_scalef_ps(keep, e, n);
}

#define LOG2E 1.4426950408889634f
#define STALE_MAX_NAT 5.5451774444795623f /* 8 ln 2: a column's running max is kept until passed by this much */

/* One 16-column vector of flash_amx_softmax_pack's column group: m and alpha updated, the shift of its exponents
 * (natural units: scaled by log2 e only after the subtraction, so that a score near -FLT_MAX, Hugging Face's
 * padding rows, cannot overflow); returns 1 where the max moved. */
AMX_PACK_TARGET static inline int column_stats(__m512 mx, float scale, float *m, float *alpha, __m512 *shift)
{
    const __m512 ninf = _mm512_set1_ps(-INFINITY), old = _mm512_loadu_ps(m);
    const __m512 cand = _mm512_mul_ps(mx, _mm512_set1_ps(scale));
    /* a new max only past the stale one by STALE_MAX_NAT (any finite one while the column has seen none) */
    const __mmask16 up = _mm512_cmp_ps_mask(cand, _mm512_add_ps(old, _mm512_set1_ps(STALE_MAX_NAT)), _CMP_GT_OQ);
    const __m512 mnew = _mm512_mask_blend_ps(up, old, cand);
    _mm512_storeu_ps(m, mnew);
    _mm512_storeu_ps(alpha, _mm512_mask_blend_ps(up, _mm512_set1_ps(1.0f),
                                                 exp2_16(_mm512_mul_ps(_mm512_sub_ps(old, mnew),
                                                                       _mm512_set1_ps(LOG2E)))));
    /* a column that has seen no key keeps m = -inf and shifts by 0: exp(-inf - 0) = 0 */
    *shift = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(mnew, ninf, _CMP_NEQ_UQ), mnew);
    return up != 0;
}

AMX_PACK_TARGET uint32_t flash_amx_softmax_pack(const float *s, int64_t kn, int64_t cols, int64_t ld, float scale,
                                                float *m, float *l, float *alpha, uint16_t *dst, int parts)
{
    const int64_t kp = ROUND32(kn), nt_n = cols / 16, plane = kp * cols;
    const __m512 sv = _mm512_set1_ps(scale), log2e = _mm512_set1_ps(LOG2E), ninf = _mm512_set1_ps(-INFINITY);
    uint32_t rescale = 0;
    for (int64_t c0 = 0; c0 < cols; c0 += 32) { /* two vectors of 16 columns, rows in pairs: 4 independent chains */
        const float *sc = s + c0;
        __m512 mx[4] = {ninf, ninf, ninf, ninf};
        int64_t j = 0;
        for (; j + 1 < kn; j += 2) {
            mx[0] = _mm512_max_ps(mx[0], _mm512_loadu_ps(sc + j * ld));
            mx[1] = _mm512_max_ps(mx[1], _mm512_loadu_ps(sc + j * ld + 16));
            mx[2] = _mm512_max_ps(mx[2], _mm512_loadu_ps(sc + (j + 1) * ld));
            mx[3] = _mm512_max_ps(mx[3], _mm512_loadu_ps(sc + (j + 1) * ld + 16));
        }
        if (j < kn) {
            mx[0] = _mm512_max_ps(mx[0], _mm512_loadu_ps(sc + j * ld));
            mx[1] = _mm512_max_ps(mx[1], _mm512_loadu_ps(sc + j * ld + 16));
        }
        __m512 shift0, shift1;
        rescale |= column_stats(_mm512_max_ps(mx[0], mx[2]), scale, m + c0, alpha + c0, &shift0) << (c0 / 16);
        rescale |= column_stats(_mm512_max_ps(mx[1], mx[3]), scale, m + c0 + 16, alpha + c0 + 16, &shift1)
                   << (c0 / 16 + 1);
        __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
        for (j = 0; j < kp; j += 2) {
            __m512 e[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
            if (j < kn) {
                e[0] = exp2_16(_mm512_mul_ps(_mm512_fmsub_ps(_mm512_loadu_ps(sc + j * ld), sv, shift0), log2e));
                e[1] = exp2_16(_mm512_mul_ps(_mm512_fmsub_ps(_mm512_loadu_ps(sc + j * ld + 16), sv, shift1), log2e));
            }
            if (j + 1 < kn) {
                e[2] = exp2_16(_mm512_mul_ps(_mm512_fmsub_ps(_mm512_loadu_ps(sc + (j + 1) * ld), sv, shift0), log2e));
                e[3] = exp2_16(
                    _mm512_mul_ps(_mm512_fmsub_ps(_mm512_loadu_ps(sc + (j + 1) * ld + 16), sv, shift1), log2e));
            }
            sum0 = _mm512_add_ps(sum0, _mm512_add_ps(e[0], e[2]));
            sum1 = _mm512_add_ps(sum1, _mm512_add_ps(e[1], e[3]));
            uint16_t *row = dst + ((j / 32) * nt_n + c0 / 16) * 512 + ((j % 32) / 2) * 32;
            for (int p = 0; p < parts; p++) {
                const int last = p == parts - 1;
                const __m512i u0 = term_last(&e[0], last), u1 = term_last(&e[1], last), u2 = term_last(&e[2], last),
                              u3 = term_last(&e[3], last);
                _mm512_storeu_si512(row + p * plane, _mm512_or_si512(u2, _mm512_srli_epi32(u0, 16)));
                _mm512_storeu_si512(row + p * plane + 512, _mm512_or_si512(u3, _mm512_srli_epi32(u1, 16)));
            }
        }
        const __m512 a0 = _mm512_loadu_ps(alpha + c0), a1 = _mm512_loadu_ps(alpha + c0 + 16);
        _mm512_storeu_ps(l + c0, _mm512_fmadd_ps(a0, _mm512_loadu_ps(l + c0), sum0));
        _mm512_storeu_ps(l + c0 + 16, _mm512_fmadd_ps(a1, _mm512_loadu_ps(l + c0 + 16), sum1));
    }
    return rescale;
}

/* 16 values of row src (kind: FLASH_AMX_SRC_*) from element c0, lanes past `valid` zero, as fp32 (exact). */
AMX_PACK_TARGET static inline __m512 load16(const void *src, int kind, int64_t c0, int64_t valid)
{
    const __mmask16 m = lanes(valid);
    if (kind == FLASH_AMX_SRC_FP32)
        return _mm512_maskz_loadu_ps(m, (const float *)src + c0);
    const __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)src + c0);
    if (kind == FLASH_AMX_SRC_FP16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

AMX_PACK_TARGET void flash_amx_pack_b_rows(uint16_t *dst, int parts, int64_t k, int64_t n, const void *rows, int kind,
                                           int64_t rs, int64_t n_valid)
{
    const int64_t es = kind == FLASH_AMX_SRC_FP32 ? 4 : 2;
    const int64_t kp = ROUND32(k), np = ROUND32(n), nt_n = np / 16, plane = kp * np;
    /* 16-bit element m of the result: the high half of 32-bit element m of the pair (x0, x1) */
    const __m512i hi_halves = _mm512_add_epi16(_mm512_slli_epi16(_mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23,
        22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 1), _mm512_set1_epi16(1));
    for (int64_t j0 = 0; j0 < np; j0 += 16)
        for (int64_t k0 = 0; k0 < kp; k0 += 32) {
            __m512 x[16][2];
            for (int r = 0; r < 16; r++) {
                const char *row = (const char *)rows + (j0 + r) * rs * es;
                const int valid = j0 + r < n_valid;
                x[r][0] = valid ? load16(row, kind, k0, k - k0) : _mm512_setzero_ps();
                x[r][1] = valid ? load16(row, kind, k0 + 16, k - k0 - 16) : _mm512_setzero_ps();
            }
            for (int p = 0; p < parts; p++) {
                __m512i w[16];
                for (int r = 0; r < 16; r++) { /* row r's 16 words: pairs (k0 + 2 i, k0 + 2 i + 1) */
                    const __m512i u0 = term(&x[r][0]), u1 = term(&x[r][1]);
                    w[r] = _mm512_permutex2var_epi16(u0, hi_halves, u1);
                }
                store_transposed16(dst + p * plane + ((k0 / 32) * nt_n + j0 / 16) * 512, w);
            }
        }
}

/* 16 floats rounded to nearest even in bf16 (NaN as 0x7FC0, c10::BFloat16's) or fp16 (kind). */
AMX_PACK_TARGET static inline __m256i round16(__m512 x, int kind)
{
    if (kind == FLASH_AMX_SRC_FP16)
        return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512i r = _mm512_srli_epi32(bf16_rne(x), 16);
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
    return _mm512_cvtepi32_epi16(r);
}

AMX_PACK_TARGET void flash_amx_store_rows(float *o, int64_t o_rs, const float *acc, int64_t ld, int64_t rows,
                                          int64_t cols, const float *factor, uint16_t *oh, int oh_kind)
{
    for (int64_t u0 = 0; u0 < cols; u0 += 16)
        for (int64_t c0 = 0; c0 < rows; c0 += 16) {
            __m512i r[16];
            for (int i = 0; i < 16; i++)
                r[i] = c0 + i < rows ? _mm512_maskz_loadu_epi32(lanes(cols - u0), acc + (c0 + i) * ld + u0)
                                     : _mm512_setzero_si512();
            transpose16(r);
            for (int64_t u = u0; u < cols && u < u0 + 16; u++) {
                const __mmask16 m = lanes(rows - c0);
                const __m512 x = _mm512_mul_ps(_mm512_castsi512_ps(r[u - u0]), _mm512_set1_ps(factor[u]));
                _mm512_mask_storeu_ps(o + u * o_rs + c0, m, x);
                if (oh)
                    _mm256_mask_storeu_epi16(oh + u * o_rs + c0, m, round16(x, oh_kind));
            }
        }
}

typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;

/* The 32 x 32 C block at (i0, j0) of the products: c itself where the block lies inside (m, n), else the 32 x 32
 * buffer edge, zeroed and holding c's part of the block where accumulate (block_end copies that part back). */
static inline float *block_begin(float *c, int64_t ldc, int64_t m, int64_t n, int64_t i0, int64_t j0, int accumulate,
                                 float *edge, int64_t *cs)
{
    if (i0 + 32 <= m && j0 + 32 <= n) {
        *cs = ldc;
        return c + i0 * ldc + j0;
    }
    *cs = 32;
    memset(edge, 0, 32 * 32 * sizeof(float));
    if (accumulate)
        for (int64_t i = i0; i < m && i < i0 + 32; i++)
            for (int64_t j = j0; j < n && j < j0 + 32; j++)
                edge[(i - i0) * 32 + (j - j0)] = c[i * ldc + j];
    return edge;
}

static inline void block_end(float *c, int64_t ldc, int64_t m, int64_t n, int64_t i0, int64_t j0, const float *edge,
                             const float *cb)
{
    if (cb == edge)
        for (int64_t i = i0; i < m && i < i0 + 32; i++)
            for (int64_t j = j0; j < n && j < j0 + 32; j++)
                c[i * ldc + j] = edge[(i - i0) * 32 + (j - j0)];
}

__attribute__((target("amx-tile,amx-bf16"))) static void gemm_tiles(int64_t m, int64_t n, int64_t k,
                                                                    const uint16_t *ap, int a_parts,
                                                                    const uint16_t *bp, int b_parts, float *c,
                                                                    int64_t ldc, int accumulate)
{
    const int64_t mp = ROUND32(m), np = ROUND32(n), kp = ROUND32(k), kt_n = kp / 32, nt_n = np / 16;
    _Alignas(64) float edge[32 * 32];
    for (int64_t i0 = 0; i0 < mp; i0 += 32)
        for (int64_t j0 = 0; j0 < np; j0 += 32) {
            int64_t cs;
            float *cb = block_begin(c, ldc, m, n, i0, j0, accumulate, edge, &cs);
            if (accumulate) {
                _tile_loadd(0, cb, cs * 4);
                _tile_loadd(1, cb + 16, cs * 4);
                _tile_loadd(2, cb + 16 * cs, cs * 4);
                _tile_loadd(3, cb + 16 * cs + 16, cs * 4);
            } else {
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
            }
            for (int pa = 0; pa < a_parts; pa++)
                for (int pb = 0; pb < b_parts; pb++)
                    for (int64_t kt = 0; kt < kt_n; kt++) {
                        const uint16_t *a0 = ap + pa * mp * kp + ((i0 / 16) * kt_n + kt) * 512;
                        const uint16_t *b0 = bp + pb * kp * np + (kt * nt_n + j0 / 16) * 512;
                        _tile_loadd(4, a0, 64);
                        _tile_loadd(5, a0 + kt_n * 512, 64);
                        _tile_loadd(6, b0, 64);
                        _tile_loadd(7, b0 + 512, 64);
                        _tile_dpbf16ps(0, 4, 6);
                        _tile_dpbf16ps(1, 4, 7);
                        _tile_dpbf16ps(2, 5, 6);
                        _tile_dpbf16ps(3, 5, 7);
                    }
            _tile_stored(0, cb, cs * 4);
            _tile_stored(1, cb + 16, cs * 4);
            _tile_stored(2, cb + 16 * cs, cs * 4);
            _tile_stored(3, cb + 16 * cs + 16, cs * 4);
            block_end(c, ldc, m, n, i0, j0, edge, cb);
        }
}

#define DP_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

/* gemm_tiles on VDPBF16PS (AMX_DP): the same packed operands, the same products (each term pair of a k pair
 * multiplied exactly and added in fp32). Per 32 x 32 C block, groups of 8 rows x 32 columns in 16 zmm
 * accumulators: per k pair one load of B for each 16 columns, one 32-bit broadcast of A per row. Row groups
 * wholly past m and the column half past n are skipped (the packing's zero padding). */
DP_TARGET static void gemm_dp(int64_t m, int64_t n, int64_t k, const uint16_t *ap, int a_parts, const uint16_t *bp,
                              int b_parts, float *c, int64_t ldc, int accumulate)
{
    const int64_t mp = ROUND32(m), np = ROUND32(n), kp = ROUND32(k), kt_n = kp / 32, nt_n = np / 16;
    _Alignas(64) float edge[32 * 32];
    for (int64_t i0 = 0; i0 < mp; i0 += 32)
        for (int64_t j0 = 0; j0 < np; j0 += 32) {
            const int two = j0 + 16 < n;
            int64_t cs;
            float *cb = block_begin(c, ldc, m, n, i0, j0, accumulate, edge, &cs);
            for (int g = 0; g < 4 && i0 + 8 * g < m; g++) {
                __m512 acc[8][2];
                for (int r = 0; r < 8; r++)
                    for (int h = 0; h < 2; h++)
                        acc[r][h] = accumulate ? _mm512_loadu_ps(cb + (8 * g + r) * cs + 16 * h) : _mm512_setzero_ps();
                for (int pa = 0; pa < a_parts; pa++)
                    for (int pb = 0; pb < b_parts; pb++)
                        for (int64_t kt = 0; kt < kt_n; kt++) {
                            /* A tile (i0 + 8 g) / 16 at k tile kt: rows 8 (g % 2) .. + 7, 32 bf16 each */
                            const uint16_t *a0 = ap + pa * mp * kp + (((i0 + 8 * g) / 16) * kt_n + kt) * 512 +
                                                 (g % 2) * 8 * 32;
                            const uint16_t *b0 = bp + pb * kp * np + (kt * nt_n + j0 / 16) * 512;
                            for (int q = 0; q < 16; q++) { /* k pair q of the k tile */
                                const __m512bh b_lo = (__m512bh)_mm512_loadu_si512(b0 + q * 32);
                                const __m512bh b_hi = two ? (__m512bh)_mm512_loadu_si512(b0 + 512 + q * 32)
                                                          : (__m512bh)_mm512_setzero_si512();
                                for (int r = 0; r < 8; r++) {
                                    int32_t pair;
                                    memcpy(&pair, a0 + r * 32 + 2 * q, sizeof pair);
                                    const __m512bh av = (__m512bh)_mm512_set1_epi32(pair);
                                    acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b_lo);
                                    if (two)
                                        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b_hi);
                                }
                            }
                        }
                for (int r = 0; r < 8; r++)
                    for (int h = 0; h < 2; h++)
                        _mm512_storeu_ps(cb + (8 * g + r) * cs + 16 * h, acc[r][h]);
            }
            block_end(c, ldc, m, n, i0, j0, edge, cb);
        }
}

static _Thread_local int thread_backend; /* the calling thread's, from flash_amx_begin */

void flash_amx_gemm_packed(int64_t m, int64_t n, int64_t k, const uint16_t *ap, int a_parts, const uint16_t *bp,
                           int b_parts, float *c, int64_t ldc, int accumulate)
{
    if (thread_backend == AMX_TILES)
        gemm_tiles(m, n, k, ap, a_parts, bp, b_parts, c, ldc, accumulate);
    else
        gemm_dp(m, n, k, ap, a_parts, bp, b_parts, c, ldc, accumulate);
}

/* Palette 1, tiles 0-7 of 16 rows x 64 bytes. Static: the compiler cannot drop the stores of a local that only
 * ldtilecfg reads. */
static const amx_config amx_tiles = {1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

__attribute__((target("amx-tile"))) void flash_amx_begin(void)
{
    thread_backend = flash_amx_usable();
    if (thread_backend == AMX_TILES)
        _tile_loadconfig(&amx_tiles);
}

__attribute__((target("amx-tile"))) void flash_amx_end(void)
{
    if (thread_backend == AMX_TILES)
        _tile_release();
}

#else /* no AMX build */

int flash_amx_usable(void)
{
    return 0;
}

int flash_amx_backends(void)
{
    return 0;
}

/* Never called: flash_amx_usable() is 0. */
void flash_amx_begin(void)
{
    abort();
}

void flash_amx_end(void)
{
    abort();
}

void flash_amx_pack_a_rows16(uint16_t *dst, int64_t m, int64_t k, const uint16_t *const *rows)
{
    (void)dst, (void)m, (void)k, (void)rows;
    abort();
}

void flash_amx_pack_at_rows16(uint16_t *dst, int64_t m, int64_t m_valid, int64_t k, const uint16_t *const *rows)
{
    (void)dst, (void)m, (void)m_valid, (void)k, (void)rows;
    abort();
}

void flash_amx_pack_a(uint16_t *dst, int parts, int64_t m, int64_t k, const float *a, int64_t a_rs, int64_t a_ks)
{
    (void)dst, (void)parts, (void)m, (void)k, (void)a, (void)a_rs, (void)a_ks;
    abort();
}

void flash_amx_pack_b(uint16_t *dst, int parts, int64_t k, int64_t n, const float *b, int64_t ldb)
{
    (void)dst, (void)parts, (void)k, (void)n, (void)b, (void)ldb;
    abort();
}

void flash_amx_gemm_packed(int64_t m, int64_t n, int64_t k, const uint16_t *ap, int a_parts, const uint16_t *bp,
                           int b_parts, float *c, int64_t ldc, int accumulate)
{
    (void)m, (void)n, (void)k, (void)ap, (void)a_parts, (void)bp, (void)b_parts, (void)c, (void)ldc, (void)accumulate;
    abort();
}

void flash_amx_scale_columns(float *acc, int64_t ld, int64_t rows, uint32_t groups, const float *alpha)
{
    (void)acc, (void)ld, (void)rows, (void)groups, (void)alpha;
    abort();
}

uint32_t flash_amx_softmax_pack(const float *s, int64_t kn, int64_t cols, int64_t ld, float scale, float *m, float *l,
                                float *alpha, uint16_t *dst, int parts)
{
    (void)s, (void)kn, (void)cols, (void)ld, (void)scale, (void)m, (void)l, (void)alpha, (void)dst, (void)parts;
    abort();
}

void flash_amx_pack_b_rows(uint16_t *dst, int parts, int64_t k, int64_t n, const void *rows, int kind, int64_t rs,
                           int64_t n_valid)
{
    (void)dst, (void)parts, (void)k, (void)n, (void)rows, (void)kind, (void)rs, (void)n_valid;
    abort();
}

void flash_amx_store_rows(float *o, int64_t o_rs, const float *acc, int64_t ld, int64_t rows, int64_t cols,
                          const float *factor, uint16_t *oh, int oh_kind)
{
    (void)o, (void)o_rs, (void)acc, (void)ld, (void)rows, (void)cols, (void)factor, (void)oh, (void)oh_kind;
    abort();
}

#endif
