/* flash_cpu.c: exact FlashAttention forward and backward on the CPU, C11 + OpenMP, fp32 and fp64,
 * with every variant of flash_params (csrc/mask.h: band, softcap, ALiBi, attn_mask, dropout, sinks).
 *
 * Algorithm (docs/DESIGN.md section 1). Forward: one task per (batch, head, query tile) streams over the
 * key tiles with the online softmax (running max m, sum l, unnormalized accumulator acc; a new max
 * rescales both l and acc by exp(m_old - m_new)); the epilogue (flash_row_finish_*, which adds the
 * sink) gives out and lse. Backward: delta = rowsum(dout * o), then pass 1, one task per (batch, kv
 * head, key tile), owns its dK, dV rows (and the dbias columns of its keys) and loops over every
 * query head of its GQA group and every query tile that sees the key tile; pass 2, one task per
 * (batch, head, query tile), accumulates dQ. P = exp(S - lse) is recomputed in both passes (times
 * 1 / sum_j P_ij for the rare rows whose |lse| is too large to hold log l: renorm_rows). Where the
 * (batch, kv head) pairs fill the threads twice over, one pass instead (bwd_task): a task per pair runs
 * pass 1 over all its key tiles and adds dS K into its own dQ accumulator, in a fixed order. No buffer
 * of size sq * sk exists; nothing is written by two tasks.
 *
 * Sequences (mask.h flash_seq_of): every task takes its sequence's lengths, first rows and band once;
 * the task counts come from p->sq / p->sk (in a varlen batch the longest sequence), so a task whose
 * query (key) tile starts past its sequence's end returns at once. Rows of no sequence and keys past
 * seqused_k are never read or written (the binding fills them). Key rows of k / v / dk / dv are
 * addressed through flash_key_offset alone (k_batch_idx, k_leftpad, a paged cache's block_table), in
 * runs that stay inside one page (key_run; one run per tile without a block_table). A paged backward
 * writes dk / dv into the pages: sequences that share a page would race there.
 *
 * Geometry (mask.h): a task visits only the keys (queries) of the band, taken with flash_key_tiles /
 * flash_query_tiles at a tile size of 1, in tiles that start at the first visible one; a tile wholly
 * inside the band skips the per-element test, and a tile whose attn_mask block flags lack
 * FLASH_MASK_ANY_VISIBLE is skipped. Variants (p->has_hook), each a separate per-tile pass so that
 * the dense passes stay as they are: the score hook on the scaled scores (softcap through the
 * vectorizable fp32 tanh below, ALiBi, then the attn_mask, read only where the block flags have
 * FLASH_MASK_ANY_MASKED); dropout on P after the row sum in the forward, on dP in dQ, fused with dS
 * in dK/dV (Philox across the contiguous query axis); dS times the softcap derivative after dbias = dS
 * is stored. Sinks enter the forward's epilogue only.
 *
 * Tiles: FLASH_CPU_TILE_Q = 128 query rows x FLASH_CPU_TILE_K = 64 key rows (flash_cpu.h); a tail
 * tile is zero padded. Head dims: q, k have d columns and v, o, dout d_v (flash.h), any two values; the
 * products with Q or K run over d, those with V or dO (P V, dO V^T, P^T dO) over d_v. All matrix products
 * go through one register-blocked kernel (gemm below, FLASH_CPU_MR x FLASH_CPU_NR = 4 x 32 accumulators)
 * that broadcasts A from any strided layout and streams contiguous rows of B and C; for fp16 / bf16 inputs on a
 * CPU with AMX, through amx.h's tile products instead (mm: exact bf16 terms; the operands that stay the same
 * packed once per call or task; the forward's softmax fused with P's packing, flash_amx_softmax_pack). Every pass
 * keeps its per-task operand transposed once per task so no inner loop transposes: forward and dQ work on S^T
 * (keys x queries, the softmax then reduces down the columns, vectorized across queries), the dK/dV pass works on
 * S (queries x keys). The streamed tiles are copied into compact buffers (cheaper than gemm reads at large row
 * strides).
 *
 * Decode (decode_fwd; forwards with at most FLASH_CPU_DECODE_MAX_SQ = 8 query rows and no dropout, where a
 * query tile would be mostly padding): one task per (batch, kv head, key split) holds the rows of every query
 * head of the kv head's GQA group (h_per_kv * sq rows), so each key and value row is read once per group. Per
 * block of DECODE_KEYS keys (row pointers through flash_key_offset, the rows prefetched a block ahead): S by
 * dot products over d (vectorized reductions, four rows per key row) for tasks of fewer than 8 rows, else with
 * the rows in the vector lanes (Q^T, 4 keys x 16 rows per register block), the mask geometry and the score hook
 * per row, the online softmax along the keys, acc += P V in register blocks of 4 rows x 32 columns (a lone
 * row: two keys per pass over its L1-resident accumulator). Key splits
 * (Flash-Decoding) only when the (batch, kv head) groups are fewer than the threads (decode_splits): each split
 * leaves its rows' (m, l, acc), merged per row by decode_merge. FLASHATTN_EXT_DISABLE_DECODE=1 (read per call)
 * sends these calls to the blocked path; FLASHATTN_EXT_CPU_DECODE_SPLITS=n forces n splits (tests).
 *
 * Parallelization: `omp for schedule(dynamic)` over the tasks, the heaviest causal tiles first; each
 * thread owns one workspace of 9 tile buffers carved from a single allocation made before the
 * parallel region. The hot loops are compiled for x86-64-v4 (AVX-512), x86-64-v3 (AVX2) and the
 * baseline (target_clones, picked at load time), with floating-point contraction into FMA enabled for
 * this file (gcc turns it off under -std=c11). exp in fp32 is a branch-free polynomial (below) that
 * vectorizes; fp64 calls libm exp.
 *
 * Measured on the dev machine (AMD EPYC Zen 4, gcc 12 -O3; 2 cores shared with other jobs), b1 h8 d64
 * fp32, fwd / bwd ms, single-thread CPU time (insensitive to the sharing):
 *   s1024: 28 / 92    s2048: 114 / 359    s4096: 446 / 1446    s8192: 1864 / 5978
 *   causal s2048: 59 / 190. fwd at s >= 2048 runs 74-77 GFLOP/s, ~3/4 of a core's fp32 FMA peak.
 * Two threads, wall time, interleaved in one torch process on the loaded machine, s1024..8192: both
 * beat torch 2.14 eager matmul + softmax + matmul at every length (s2048: 232 / 772 vs 676 / 1006);
 * against torch SDPA, forward takes 0.7-1.25x and backward 0.6-1.25x its time.
 * Variants, b1 h8 s1024 d64 fp32 causal, single-thread CPU time relative to causal alone (fwd / bwd,
 * +-15% on the loaded machine): sink 1.0 / 1.0, softcap 1.2 / 1.2, ALiBi 1.0 / 1.2, dropout 0.1
 * 1.25 / 1.5, window 256 0.6 / 0.5 (work scales with the band), a bool padding mask hiding the last
 * quarter of the keys 0.92 of the instructions (the skipped tiles).
 */
#ifndef FLASH_CPU_GENERIC_PASS

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../mask.h"
#include "../score.h"
#include "amx.h"
#include "flash_cpu.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=fast")
#endif

#if defined(__x86_64__) && defined(__linux__) && \
    ((defined(__clang__) && __clang_major__ >= 14) || (!defined(__clang__) && __GNUC__ >= 11))
#define FLASH_CPU_SIMD __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FLASH_CPU_SIMD
#endif

/* For helpers of the FLASH_CPU_SIMD functions: inlined, so that each clone compiles them for its target. */
#if defined(__GNUC__)
#define FLASH_CPU_INLINE inline __attribute__((always_inline))
#else
#define FLASH_CPU_INLINE inline
#endif

/* Square block transposes in registers (GCC >= 12 / Clang vector extensions; each FLASH_CPU_SIMD clone compiles them
 * for its target): dst[j * ld + i] = src[i * rs + j] * scale[j * step] (step 0: one scale for all) for an 8 x 8 float
 * / 4 x 4 double block. The tiles' transposes (Q and dO into the kernels' column layout, results back to rows)
 * otherwise cost a strided scalar store per element: ~20% of a forward at 32 rows. */
#if (defined(__clang__) && __clang_major__ >= 14) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 12)
#define FLASH_CPU_TRANSPOSE_BLOCKS 1
typedef float flash_v8f __attribute__((vector_size(32)));
typedef double flash_v4d __attribute__((vector_size(32)));

static FLASH_CPU_INLINE void transpose_block_f32(float *restrict dst, int64_t ld, const float *restrict src, int64_t rs,
                                                 const float *scale, int64_t step)
{
    flash_v8f r[8], t[8], u[8];
    for (int i = 0; i < 8; i++)
        memcpy(&r[i], src + i * rs, sizeof(r[i]));
    for (int i = 0; i < 8; i += 2) { /* per 128-bit half: rows i, i + 1 interleaved */
        t[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        t[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
    }
    for (int g = 0; g < 8; g += 4) /* rows g .. g + 3: columns (k, k + 4) of each, k = 0 .. 3 */
        for (int h = 0; h < 2; h++) {
            u[g + 2 * h] = __builtin_shufflevector(t[g + h], t[g + h + 2], 0, 1, 8, 9, 4, 5, 12, 13);
            u[g + 2 * h + 1] = __builtin_shufflevector(t[g + h], t[g + h + 2], 2, 3, 10, 11, 6, 7, 14, 15);
        }
    for (int k = 0; k < 4; k++) { /* column k from the low halves, column k + 4 from the high ones */
        const flash_v8f lo = __builtin_shufflevector(u[k], u[k + 4], 0, 1, 2, 3, 8, 9, 10, 11) * scale[k * step];
        const flash_v8f hi = __builtin_shufflevector(u[k], u[k + 4], 4, 5, 6, 7, 12, 13, 14, 15) * scale[(k + 4) * step];
        memcpy(dst + k * ld, &lo, sizeof(lo));
        memcpy(dst + (k + 4) * ld, &hi, sizeof(hi));
    }
}

static FLASH_CPU_INLINE void transpose_block_f64(double *restrict dst, int64_t ld, const double *restrict src,
                                                 int64_t rs, const double *scale, int64_t step)
{
    flash_v4d r[4], t[4];
    for (int i = 0; i < 4; i++)
        memcpy(&r[i], src + i * rs, sizeof(r[i]));
    for (int i = 0; i < 4; i += 2) {
        t[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 4, 2, 6);     /* a0 b0 a2 b2 */
        t[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 1, 5, 3, 7); /* a1 b1 a3 b3 */
    }
    for (int k = 0; k < 2; k++) { /* column k from the low halves, column k + 2 from the high ones */
        const flash_v4d lo = __builtin_shufflevector(t[k], t[k + 2], 0, 1, 4, 5) * scale[k * step];
        const flash_v4d hi = __builtin_shufflevector(t[k], t[k + 2], 2, 3, 6, 7) * scale[(k + 2) * step];
        memcpy(dst + k * ld, &lo, sizeof(lo));
        memcpy(dst + (k + 2) * ld, &hi, sizeof(hi));
    }
}
#else
#define FLASH_CPU_TRANSPOSE_BLOCKS 0
#endif

/* Lets a function's float sums be reassociated (their reductions vectorize, with shuffle-based horizontal
 * sums), where the compiler has no other way; infinities and NaNs keep their meaning. */
#if defined(__GNUC__) && !defined(__clang__)
#define FLASH_CPU_REASSOC __attribute__((optimize("associative-math", "no-signed-zeros", "no-trapping-math")))
#else
#define FLASH_CPU_REASSOC
#endif

/* A hint to load the cache line at address a into the caches (L2 and beyond) for reading. */
#if defined(__GNUC__)
#define FLASH_CPU_PREFETCH(a) __builtin_prefetch((a), 0, 2)
#else
#define FLASH_CPU_PREFETCH(a) ((void)(a))
#endif
#define CACHE_LINE_BYTES 64

/* Register block of the gemm kernel: FLASH_CPU_MR rows of C x FLASH_CPU_NR columns. */
#define FLASH_CPU_MR 4
#define FLASH_CPU_NR 32
#define FLASH_CPU_ALIGN_BYTES 64

#define ROUND_UP(x, m) (((x) + (m) - 1) / (m) * (m))
/* Tile sizes rounded up to what the gemm kernel needs as its n (NR) or m (MR) dimension. */
#define TILE_Q_NR ROUND_UP(FLASH_CPU_TILE_Q, FLASH_CPU_NR)
#define TILE_K_NR ROUND_UP(FLASH_CPU_TILE_K, FLASH_CPU_NR)
#define TILE_MAX_NR (TILE_Q_NR > TILE_K_NR ? TILE_Q_NR : TILE_K_NR)

/* fp32 exp: e^x = 2^n * e^r with n = round(x / ln 2), |r| <= ln(2) / 2, e^r by its Taylor series to
 * degree 7 (relative error < 1e-7). Arguments below EXPF_ARG_MIN (e^-87 is near FLT_MIN) give 0,
 * -inf included; above EXPF_ARG_MAX they are clamped. */
#define EXPF_ARG_MIN (-87.0f)
#define EXPF_ARG_MAX 88.0f
#define EXPF_ROUND_MAGIC 12582912.0f /* 1.5 * 2^23: (t + magic) - magic rounds t to an integer */
#define EXPF_LN2_HI 0.693145751953125f /* ln 2 = LN2_HI + LN2_LO, LN2_HI with few mantissa bits */
#define EXPF_LN2_LO 1.42860682030941723212e-6f
#define FLOAT_EXPONENT_BIAS 127
#define FLOAT_MANTISSA_BITS 23

static inline float expf_poly(float x)
{
    const float xc = x < EXPF_ARG_MIN ? EXPF_ARG_MIN : (x > EXPF_ARG_MAX ? EXPF_ARG_MAX : x);
    const float n = (xc * FLASH_LOG2E_F + EXPF_ROUND_MAGIC) - EXPF_ROUND_MAGIC;
    const float r = (xc - n * EXPF_LN2_HI) - n * EXPF_LN2_LO;
    const float er = 1.0f + r * (1.0f + r * (1.0f / 2 + r * (1.0f / 6 + r * (1.0f / 24 +
                     r * (1.0f / 120 + r * (1.0f / 720 + r * (1.0f / 5040)))))));
    const int32_t bits = ((int32_t)n + FLOAT_EXPONENT_BIAS) << FLOAT_MANTISSA_BITS;
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return x < EXPF_ARG_MIN ? 0.0f : er * two_n;
}

/* fp32 tanh from expf_poly: (e^2y - 1) / (e^2y + 1), vectorizable; absolute error < 1e-7 (the
 * softcap step of score.h in a cheaper form). Beyond |y| = EXPF_ARG_MAX / 2 it gives +-1. */
static inline float tanhf_exp(float y)
{
    const float e = expf_poly(2 * y);
    return (e - 1) / (e + 1);
}

/* The value of fp16 (fp16 set) or bf16 bits h. fp16: the exponent and mantissa moved to fp32's places and rebiased
 * by one exact multiply by 2^112 (subnormals included), inf / nan given fp32's all-ones exponent. */
static FLASH_CPU_INLINE float widen_half(uint16_t h, int fp16)
{
    uint32_t u;
    float f;
    if (!fp16) {
        u = (uint32_t)h << 16;
        memcpy(&f, &u, sizeof f);
        return f;
    }
    const uint32_t em = h & 0x7fffu;
    u = em << 13;
    memcpy(&f, &u, sizeof f);
    f *= 0x1p112f;
    memcpy(&u, &f, sizeof u);
    u = (u | (em >= 0x7c00u ? 0x7f800000u : 0u)) | (uint32_t)(h & 0x8000u) << 16;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline int64_t clamp64(int64_t x, int64_t lo, int64_t hi) { return flash_min64(flash_max64(x, lo), hi); }

/* Length of the run of keys from key j (< j_end) of sequence seq that lie at one row stride from each
 * other in k / v (mask.h flash_key_offset): up to j_end without a block_table, else up to the end of
 * key j's page. */
static inline int64_t key_run(const flash_params *p, const flash_seq *seq, int64_t j, int64_t j_end)
{
    if (p->block_table == NULL)
        return j_end - j;
    return flash_min64(p->page_size - (seq->k_row0 + j) % p->page_size, j_end - j);
}

/* One tile: query rows [q0, q0 + qn) against key rows [k0, k0 + kn). */
typedef struct tile {
    int64_t q0, qn, k0, kn;
} tile;

/* 1 when the tile's scores need the score hook: softcap, ALiBi, or attn_mask data to read. */
static int hooked_scores(const flash_params *p, unsigned mask_flags)
{
    return flash_score_capped(p) || flash_score_biased(p) || (mask_flags & FLASH_MASK_ANY_MASKED) != 0;
}

/* The Philox draws (mask.h flash_dropout_bits) of keys 4 c .. 4 c + 3 for query rows [i0, i0 + n):
 * bits[k][r] is the draw of key 4 c + k in row i0 + r. One loop across the rows, which vectorizes. */
static inline void dropout_group_bits(const flash_params *p, int64_t bh, int64_t i0, int64_t n, int64_t c,
                                      uint32_t bits[4][TILE_Q_NR])
{
    for (int64_t r = 0; r < n; r++) {
        uint32_t b[4];
        flash_dropout_bits(p, bh, i0 + r, c, b);
        for (int w = 0; w < 4; w++)
            bits[w][r] = b[w];
    }
}

/* Per-thread workspace elements for head dims d (q, k) and d_v (v, o): one tile buffer (see the workspace
 * struct), sized for the larger. */
static int64_t tile_buffer_elems(int64_t d, int64_t d_v, int64_t elem_size)
{
    const int64_t dm = ROUND_UP(d > d_v ? d : d_v, FLASH_CPU_MR);
    const int64_t side = dm > TILE_MAX_NR ? dm : TILE_MAX_NR;
    return ROUND_UP(TILE_MAX_NR * side, FLASH_CPU_ALIGN_BYTES / elem_size);
}

/* Query-tile task -> (batch, head, tile's first row); the last query tiles (the heaviest under
 * causal masking) come first. */
static void query_task(const flash_params *p, int64_t task, int64_t *bi, int64_t *hq, int64_t *q0)
{
    const int64_t n_bh = p->b * p->h;
    *bi = task % n_bh / p->h;
    *hq = task % p->h;
    *q0 = (flash_cdiv64(p->sq, FLASH_CPU_TILE_Q) - 1 - task / n_bh) * FLASH_CPU_TILE_Q;
}

/* Each thread's workspace: FLASH_CPU_TILE_BUFFERS buffers of tile_buffer_elems elements. */
#define FLASH_CPU_TILE_BUFFERS 9

/* Which tiles pack_tiles packs: the forward's key tiles (K, V^T), the dQ pass's (K, V, K^T), the dK/dV pass's
 * query tiles (Q, dO, dO^T, Q^T): the A operands of the passes' products, in the order of the part offsets. */
enum { PACK_NONE, PACK_FWD, PACK_DQ, PACK_DKDV };

/* The most memory pack_tiles takes for a pass's packed tiles (at most 2 bytes per element of q / k / v / dout per
 * bf16 term, beside the binding's fp32 copies of 4); above it the tasks pack per step, as they do with
 * FLASHATTN_EXT_CPU_AMX=step (read per call, for tests). */
#define FLASH_CPU_PACK_MAX_BYTES ((int64_t)1 << 30)

/* The most memory of a thread's dQ accumulator for the one-pass backward (bwd_task); above it, two passes. */
#define FLASH_CPU_DQ_ACC_MAX_BYTES ((int64_t)64 << 20)

/* Decode forward (decode_fwd below): forward calls with at most FLASH_CPU_DECODE_MAX_SQ query rows and no
 * dropout. Keys are taken in blocks of DECODE_KEYS; the output columns of P V in register blocks of DECODE_MR
 * rows x DECODE_COLS columns; a key split gets at least DECODE_MIN_SPLIT_KEYS keys. */
#define FLASH_CPU_DECODE_MAX_SQ 8
#define DECODE_KEYS 64
_Static_assert(DECODE_KEYS < TILE_Q_NR + TILE_K_NR, "bias_pass's diagonal buffer holds a 1 x DECODE_KEYS block");
#define DECODE_MR 4
#define DECODE_COLS 32
#define DECODE_MIN_SPLIT_KEYS 256
/* Tasks of at least DECODE_LANES_MIN_ROWS rows compute S with the rows in the vector lanes (decode_scores_lanes,
 * DECODE_LANES rows at a time), fewer rows with dot products over d (decode_scores). */
#define DECODE_LANES_MIN_ROWS 8
#define DECODE_LANES 16

/* A positive integer from the environment variable name, or 0 where it is unset or not one. Read per call,
 * so that a test or a benchmark can switch within one process. */
static int64_t env_count(const char *name)
{
    const char *env = getenv(name);
    if (env == NULL)
        return 0;
    char *end;
    const long long v = strtoll(env, &end, 10);
    return end != env && *end == '\0' && v > 0 ? (int64_t)v : 0;
}

/* 1 when the forward takes the decode path: few query rows, no dropout, and FLASHATTN_EXT_DISABLE_DECODE (the
 * switch of the CUDA decode kernel, csrc/cuda/launch.cu) not set to 1. */
static int decode_shape(const flash_params *p)
{
    return p->sq <= FLASH_CPU_DECODE_MAX_SQ && p->dropout_threshold == 0 &&
           env_count("FLASHATTN_EXT_DISABLE_DECODE") != 1;
}

/* bf16 terms of an input value on AMX (1 for bf16, 2 for fp16: cpu_src_dtype), 0 for fp32 / fp64 inputs. */
static int amx_parts(const flash_params *p)
{
    return p->cpu_src_dtype == FLASH_BF16 ? 1 : p->cpu_src_dtype == FLASH_FP16 ? 2 : 0;
}

/* The packed bf16 products (amx.h) in pass pack (PACK_FWD, PACK_DQ, PACK_DKDV): 1 = every product, 2 = those of
 * two inputs only (q, k, v, dout: one term each; P and dS on the fp32 kernels), 0 = none. On AMX tiles fp16 / bf16
 * inputs take 1 in every pass; on AVX512-BF16 dot products (FLASH_AMX_DP) bf16 takes 1 in the forward and 2 in the
 * backward, fp16 0 (its two terms per input, and the backward's fp32 operands' three, made the dot products slower
 * than the fp32 kernels on a Zen 4: benchmarks/results/cpu/dp_bf16_2026-12-06). */
static int amx_on(const flash_params *p, int pack)
{
    const int backend = amx_parts(p) ? flash_amx_usable() : 0;
    if (backend == FLASH_AMX_TILES)
        return 1;
    return backend == FLASH_AMX_DP && amx_parts(p) == 1 ? (pack == PACK_FWD ? 1 : 2) : 0;
}

/* amx.h's source kind of rows of dtype t (FLASH_FP16 / FLASH_BF16; anything else: the kernel's fp32). */
static int amx_kind(flash_dtype t)
{
    return t == FLASH_FP16 ? FLASH_AMX_SRC_FP16 : t == FLASH_BF16 ? FLASH_AMX_SRC_BF16 : FLASH_AMX_SRC_FP32;
}

/* FLASHATTN_EXT_CPU_AMX=step (tests): the AMX operands packed per step, none once per call. */
static int amx_per_step(void)
{
    const char *env = getenv("FLASHATTN_EXT_CPU_AMX");
    return env && strcmp(env, "step") == 0;
}

/* Key splits per (batch, kv head) of the decode path (Flash-Decoding): none while the groups alone give every
 * thread one; else enough for about two tasks per thread, splits of at least DECODE_MIN_SPLIT_KEYS keys.
 * FLASHATTN_EXT_CPU_DECODE_SPLITS=n forces n, at most one per key (tests: splits that cut a window, a mask block
 * or a page). */
static int64_t decode_splits(const flash_params *p, int n_threads)
{
    const int64_t forced = env_count("FLASHATTN_EXT_CPU_DECODE_SPLITS");
    if (forced)
        return flash_min64(forced, flash_max64(1, p->sk));
    const int64_t groups = p->b * p->h_kv;
    if (groups >= n_threads)
        return 1;
    return clamp64(flash_cdiv64(2 * (int64_t)n_threads, groups), 1, flash_max64(1, p->sk / DECODE_MIN_SPLIT_KEYS));
}

/* The type-generic part below the #else: compiled twice, by this file including itself with T (the
 * element type), FN(name) (name with a type suffix), SC(name) (score.h's name of that type), EXP, LOG,
 * TANH, FABS and ROW_FINISH defined. */
#define FLASH_CPU_GENERIC_PASS

#define T float
#define FN(name) name##_f32
#define TB 8 /* transpose_block's size */
#define TRANSPOSE_BLOCK transpose_block_f32
#define SC(name) name##_f
#define EXP expf_poly
#define LOG logf
#define TANH tanhf_exp
#define FABS fabsf
#define ROW_FINISH flash_row_finish_f
#include "flash_cpu.c"
#undef T
#undef FN
#undef TB
#undef TRANSPOSE_BLOCK
#undef SC
#undef EXP
#undef LOG
#undef TANH
#undef FABS
#undef ROW_FINISH

#define T double
#define FN(name) name##_f64
#define TB 4
#define TRANSPOSE_BLOCK transpose_block_f64
#define SC(name) name##_d
#define EXP exp
#define LOG log
#define TANH tanh
#define FABS fabs
#define ROW_FINISH flash_row_finish_d
#include "flash_cpu.c"
#undef T
#undef FN
#undef TB
#undef TRANSPOSE_BLOCK
#undef SC
#undef EXP
#undef LOG
#undef TANH
#undef FABS
#undef ROW_FINISH

int flash_cpu_decodes(const flash_params *p)
{
    return decode_shape(p);
}

int flash_cpu_fwd_reads_half(const flash_params *p)
{
    return p->dtype == FLASH_FP32 && fwd_reads_half_f32(p);
}

flash_cpu_status flash_fwd_cpu(const flash_params *p)
{
    switch (p->dtype) {
    case FLASH_FP32:
        return fwd_f32(p);
    case FLASH_FP64:
        return fwd_f64(p);
    default:
        return FLASH_CPU_ERR_DTYPE;
    }
}

flash_cpu_status flash_bwd_cpu(const flash_params *p)
{
    switch (p->dtype) {
    case FLASH_FP32:
        return bwd_f32(p);
    case FLASH_FP64:
        return bwd_f64(p);
    default:
        return FLASH_CPU_ERR_DTYPE;
    }
}

flash_cpu_status flash_dropout_mask_cpu(const flash_params *p, uint8_t *keep)
{
    const int64_t rows = p->b * p->h * p->sq;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) { /* r = (b * h + hq) * sq + i */
        const int64_t bh = r / p->sq, i = r % p->sq;
        uint8_t *row = keep + r * p->sk;
        for (int64_t j0 = 0; j0 < p->sk; j0 += FLASH_DROPOUT_KEYS_PER_CALL) {
            const int64_t j_end = flash_min64(p->sk, j0 + FLASH_DROPOUT_KEYS_PER_CALL);
            uint32_t bits[4];
            if (p->dropout_threshold == 0) {
                for (int64_t j = j0; j < j_end; j++)
                    row[j] = 1;
                continue;
            }
            flash_dropout_bits(p, bh, i, j0 / FLASH_DROPOUT_KEYS_PER_CALL, bits);
            for (int64_t j = j0; j < j_end; j++)
                row[j] = bits[j - j0] >= p->dropout_threshold;
        }
    }
    return FLASH_CPU_OK;
}

/* One mask entry's flags (mask.h FLASH_MASK_ANY_*): a bool True / an additive entry above -inf is visible, a bool
 * False / an additive entry other than 0 is masked. */
static unsigned mask_entry_flags(const flash_params *p, int mask_dtype, const void *row, int64_t c)
{
    if (p->mask_kind == FLASH_MASK_BOOL)
        return ((const uint8_t *)row)[c] ? FLASH_MASK_ANY_VISIBLE : FLASH_MASK_ANY_MASKED;
    const double x = mask_dtype == FLASH_FP32 ? (double)((const float *)row)[c] : ((const double *)row)[c];
    return (x > -INFINITY ? FLASH_MASK_ANY_VISIBLE : 0u) | (x != 0.0 ? FLASH_MASK_ANY_MASKED : 0u);
}

flash_cpu_status flash_mask_flags_cpu(const flash_params *p, int mask_dtype, uint8_t *blocks)
{
    if (p->mask_kind != FLASH_MASK_BOOL && mask_dtype != FLASH_FP32 && mask_dtype != FLASH_FP64)
        return FLASH_CPU_ERR_DTYPE;
    const unsigned both = FLASH_MASK_ANY_VISIBLE | FLASH_MASK_ANY_MASKED;
    const size_t size = p->mask_kind == FLASH_MASK_BOOL ? 1 : mask_dtype == FLASH_FP32 ? sizeof(float) : sizeof(double);
    int64_t dims[4];
    flash_mask_flag_dims(p, dims);
    const int64_t rows = p->mask_s.row ? p->sq : 1, cols = p->mask_s.col ? p->sk : 1;
    const int64_t n = dims[0] * dims[1] * dims[2] * dims[3];
    /* threads only where the pass is long enough to pay for them (entries read, at most n blocks of 16 x 16) */
#pragma omp parallel for schedule(static) if (n * FLASH_MASK_BLOCK * FLASH_MASK_BLOCK > (1 << 16))
    for (int64_t f = 0; f < n; f++) {
        const int64_t cb = f % dims[3], rb = f / dims[3] % dims[2], hb = f / (dims[3] * dims[2]) % dims[1];
        const int64_t bb = f / (dims[3] * dims[2] * dims[1]);
        const int64_t r0 = rb * FLASH_MASK_BLOCK, c0 = cb * FLASH_MASK_BLOCK;
        const int64_t r1 = flash_min64(r0 + FLASH_MASK_BLOCK, rows), c1 = flash_min64(c0 + FLASH_MASK_BLOCK, cols);
        const char *base = (const char *)p->mask + (bb * p->mask_s.batch + hb * p->mask_s.head) * (int64_t)size;
        unsigned flags = 0;
        for (int64_t r = r0; r < r1 && flags != both; r++) {
            const char *row = base + (r * p->mask_s.row + c0 * p->mask_s.col) * (int64_t)size;
            for (int64_t c = 0; c < c1 - c0 && flags != both; c++)
                flags |= mask_entry_flags(p, mask_dtype, row, c * p->mask_s.col);
        }
        blocks[f] = (uint8_t)flags;
    }
    return FLASH_CPU_OK;
}

#else /* FLASH_CPU_GENERIC_PASS: the type-generic part */

/* c (m, n) = [c +] a (m, k) * b (k, n). a(i, kk) = a[i * a_rs + kk * a_ks] is read as broadcast
 * scalars, so any layout of a works; b and c are row-major with leading dimensions ldb, ldc.
 * m % FLASH_CPU_MR == 0 and n % FLASH_CPU_NR == 0. */
FLASH_CPU_SIMD static void FN(gemm)(int64_t m, int64_t n, int64_t k, const T *restrict a, int64_t a_rs,
                                    int64_t a_ks, const T *restrict b, int64_t ldb, T *restrict c,
                                    int64_t ldc, int accumulate)
{
    for (int64_t i0 = 0; i0 < m; i0 += FLASH_CPU_MR)
        for (int64_t j0 = 0; j0 < n; j0 += FLASH_CPU_NR) {
            T acc[FLASH_CPU_MR][FLASH_CPU_NR];
            for (int r = 0; r < FLASH_CPU_MR; r++)
                for (int u = 0; u < FLASH_CPU_NR; u++)
                    acc[r][u] = accumulate ? c[(i0 + r) * ldc + j0 + u] : 0;
            for (int64_t kk = 0; kk < k; kk++) {
                const T *restrict brow = b + kk * ldb + j0;
                for (int r = 0; r < FLASH_CPU_MR; r++) {
                    const T ar = a[(i0 + r) * a_rs + kk * a_ks];
                    for (int u = 0; u < FLASH_CPU_NR; u++)
                        acc[r][u] += ar * brow[u];
                }
            }
            for (int r = 0; r < FLASH_CPU_MR; r++)
                for (int u = 0; u < FLASH_CPU_NR; u++)
                    c[(i0 + r) * ldc + j0 + u] = acc[r][u];
        }
}

/* dst (rows_pad, ld): dst[r][c] = src[r * rs + c] for r < rows, c < cols, zero elsewhere in
 * [0, rows_pad) x [0, cols_pad). The gemm reads these compact copies faster than the strided inputs
 * (one input row is a page apart from the next at large row strides). */
static void FN(load_rows)(T *restrict dst, int64_t ld, int64_t rows_pad, int64_t cols_pad,
                          const T *restrict src, int64_t rs, int64_t rows, int64_t cols)
{
    for (int64_t r = 0; r < rows_pad; r++) {
        T *restrict drow = dst + r * ld;
        int64_t c = 0;
        if (r < rows)
            for (; c < cols; c++)
                drow[c] = src[r * rs + c];
        for (; c < cols_pad; c++)
            drow[c] = 0;
    }
}

/* dst[r * rs + c] = src[c * ld + r] * scale[r * step] for r < rows, c < cols (step 0: one scale): TB x TB blocks in
 * registers where they fit (transpose_block), the edges element by element. */
static FLASH_CPU_INLINE void FN(transpose_scaled)(T *restrict dst, int64_t rs, const T *restrict src, int64_t ld,
                                                  int64_t rows, int64_t cols, const T *scale, int64_t step)
{
    int64_t r0 = 0;
#if FLASH_CPU_TRANSPOSE_BLOCKS
    for (; r0 + TB <= rows; r0 += TB) {
        int64_t c0 = 0;
        for (; c0 + TB <= cols; c0 += TB)
            TRANSPOSE_BLOCK(dst + r0 * rs + c0, rs, src + c0 * ld + r0, ld, scale + r0 * step, step);
        for (int64_t r = r0; r < r0 + TB; r++)
            for (int64_t c = c0; c < cols; c++)
                dst[r * rs + c] = src[c * ld + r] * scale[r * step];
    }
#endif
    for (int64_t r = r0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            dst[r * rs + c] = src[c * ld + r] * scale[r * step];
}

/* dst (cols, ld): dst[c][r] = scale * src[r * rs + c] for r < rows, c < cols, zero for r in
 * [rows, rows_pad). */
FLASH_CPU_SIMD static void FN(load_transposed)(T *restrict dst, int64_t ld, int64_t rows_pad, const T *restrict src,
                                               int64_t rs, int64_t rows, int64_t cols, T scale)
{
    FN(transpose_scaled)(dst, ld, src, rs, cols, rows, &scale, 0);
    for (int64_t c = 0; c < cols; c++)
        for (int64_t r = rows; r < rows_pad; r++)
            dst[c * ld + r] = 0;
}

/* dst (rows, ld) = 0 in columns [0, cols) (in all ld where cols is at least half of it). */
static void FN(zero_tile)(T *restrict dst, int64_t ld, int64_t rows, int64_t cols)
{
    if (2 * cols >= ld) { /* the padding columns too, in one pass (a string store per row costs its start-up) */
        memset(dst, 0, (size_t)(rows * ld) * sizeof(T));
        return;
    }
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            dst[r * ld + c] = 0;
}

/* dst[r * rs + c] = scale * src[c][r] for r < rows, c < cols; src is (cols, ld). */
FLASH_CPU_SIMD static void FN(store_transposed)(T *restrict dst, int64_t rs, const T *restrict src, int64_t ld,
                                                int64_t rows, int64_t cols, T scale)
{
    FN(transpose_scaled)(dst, rs, src, ld, rows, cols, &scale, 0);
}

/* dst[r * rs + c] = src[c][r] * row_scale[r] for r < rows, c < cols; src is (cols, ld): the forward's out. */
FLASH_CPU_SIMD static void FN(store_rows_scaled)(T *restrict dst, int64_t rs, const T *restrict src, int64_t ld,
                                                 int64_t rows, int64_t cols, const T *row_scale)
{
    FN(transpose_scaled)(dst, rs, src, ld, rows, cols, row_scale, 1);
}

/* Rows of k / v (dk / dv): key j of sequence seq is at head + flash_key_offset(p, seq, batch_stride,
 * row_stride, j), head being the tensor's pointer at its kv head. The three functions below are
 * load_rows, load_transposed and store_transposed of key rows [j0, j0 + rows) of seq, run by run
 * (key_run: one run without a block_table, else one per page). */
typedef struct FN(key_rows) {
    const T *head;
    int64_t batch_stride, row_stride;
} FN(key_rows);

static void FN(load_key_rows)(T *restrict dst, int64_t ld, int64_t rows_pad, int64_t cols_pad, FN(key_rows) src,
                              const flash_params *p, const flash_seq *seq, int64_t j0, int64_t rows, int64_t cols)
{
    for (int64_t j = j0, run; j < j0 + rows; j += run) {
        run = key_run(p, seq, j, j0 + rows);
        FN(load_rows)(dst + (j - j0) * ld, ld, run, cols_pad,
                      src.head + flash_key_offset(p, seq, src.batch_stride, src.row_stride, j), src.row_stride, run,
                      cols);
    }
    FN(load_rows)(dst + rows * ld, ld, rows_pad - rows, cols_pad, src.head, src.row_stride, 0, cols);
}

/* load_key_rows of fp16 / bf16 (fp16 set) rows of head `head` (strides in its elements), widened; cols_pad = ld. */
FLASH_CPU_SIMD static void FN(load_key_rows_half)(T *restrict dst, int64_t ld, int64_t rows_pad, const uint16_t *head,
                                                 int64_t batch_stride, int64_t row_stride, const flash_params *p,
                                                 const flash_seq *seq, int64_t j0, int64_t rows, int64_t cols,
                                                 int fp16)
{
    for (int64_t j = j0, run; j < j0 + rows; j += run) {
        run = key_run(p, seq, j, j0 + rows);
        const uint16_t *src = head + flash_key_offset(p, seq, batch_stride, row_stride, j);
        for (int64_t x = 0; x < run; x++) {
            T *restrict d = dst + (j - j0 + x) * ld;
            const uint16_t *restrict s = src + x * row_stride;
            if (fp16)
                for (int64_t c = 0; c < cols; c++)
                    d[c] = (T)widen_half(s[c], 1);
            else
                for (int64_t c = 0; c < cols; c++)
                    d[c] = (T)widen_half(s[c], 0);
            for (int64_t c = cols; c < ld; c++)
                d[c] = 0;
        }
    }
    for (int64_t j = rows; j < rows_pad; j++)
        for (int64_t c = 0; c < ld; c++)
            dst[j * ld + c] = 0;
}

static void FN(load_key_transposed)(T *restrict dst, int64_t ld, int64_t rows_pad, FN(key_rows) src,
                                    const flash_params *p, const flash_seq *seq, int64_t j0, int64_t rows,
                                    int64_t cols)
{
    for (int64_t j = j0, run; j < j0 + rows; j += run) {
        run = key_run(p, seq, j, j0 + rows);
        FN(load_transposed)(dst + (j - j0), ld, run,
                            src.head + flash_key_offset(p, seq, src.batch_stride, src.row_stride, j),
                            src.row_stride, run, cols, 1);
    }
    FN(load_transposed)(dst + rows, ld, rows_pad - rows, src.head, src.row_stride, 0, cols, 1);
}

static void FN(store_key_transposed)(T *head, flash_strides st, const T *restrict src, int64_t ld,
                                     const flash_params *p, const flash_seq *seq, int64_t j0, int64_t rows,
                                     int64_t cols, T scale)
{
    for (int64_t j = j0, run; j < j0 + rows; j += run) {
        run = key_run(p, seq, j, j0 + rows);
        FN(store_transposed)(head + flash_key_offset(p, seq, st.batch, st.row, j), st.row, src + (j - j0), ld, run,
                             cols, scale);
    }
}

/* row[x] = value for x in [0, lo) and in [hi, n). */
static void FN(mask_outside)(T *restrict row, int64_t lo, int64_t hi, int64_t n, T value)
{
    for (int64_t x = 0; x < lo; x++)
        row[x] = value;
    for (int64_t x = flash_max64(lo, hi); x < n; x++)
        row[x] = value;
}

/* Row statistics of query rows [0, n_pad) of a tile: lse_eff = lse, or +inf for a row that sees no
 * key and for padding rows (so that exp(s - lse_eff) = 0), delta (0 for padding rows) and the factor
 * renorm of P (renorm_rows; 1 where rn is NULL). */
static void FN(load_row_stats)(T *restrict lse_eff, T *restrict delta, T *restrict renorm, int64_t n_pad,
                               const T *lse, const T *dl, const T *rn, int64_t n)
{
    for (int64_t i = 0; i < n_pad; i++) {
        lse_eff[i] = i < n && lse[i] != -INFINITY ? lse[i] : INFINITY;
        delta[i] = i < n ? dl[i] : 0;
        renorm[i] = i < n && rn ? rn[i] : 1;
    }
}

/* Online-softmax step on one S^T tile s (km key rows x qp query columns, leading dim TILE_Q_NR,
 * masked entries -inf): updates the running max m and sum l of every query column, turns s into
 * exp(s - m_new) and rescales the accumulator acc (dm, TILE_Q_NR) by exp(m_old - m_new). */
FLASH_CPU_SIMD static void FN(softmax_step)(T *restrict s, int64_t km, int64_t qp, T *restrict acc,
                                            int64_t dm, T *restrict m, T *restrict l)
{
    T m_new[TILE_Q_NR], shift[TILE_Q_NR], alpha[TILE_Q_NR], sum[TILE_Q_NR];
    for (int64_t u = 0; u < qp; u++) {
        m_new[u] = m[u];
        sum[u] = 0;
    }
    for (int64_t j = 0; j < km; j++)
        for (int64_t u = 0; u < qp; u++) {
            const T x = s[j * TILE_Q_NR + u];
            m_new[u] = x > m_new[u] ? x : m_new[u];
        }
    /* A column that has seen no key yet keeps m = -inf and shifts by 0: exp(-inf - 0) = 0, never
     * exp(-inf - -inf). */
    for (int64_t u = 0; u < qp; u++) {
        shift[u] = m_new[u] == -INFINITY ? 0 : m_new[u];
        alpha[u] = EXP(m[u] - shift[u]);
        m[u] = m_new[u];
    }
    for (int64_t j = 0; j < km; j++)
        for (int64_t u = 0; u < qp; u++) {
            const T e = EXP(s[j * TILE_Q_NR + u] - shift[u]);
            s[j * TILE_Q_NR + u] = e;
            sum[u] += e;
        }
    for (int64_t u = 0; u < qp; u++)
        l[u] = alpha[u] * l[u] + sum[u];
    for (int64_t c = 0; c < dm; c++)
        for (int64_t u = 0; u < qp; u++)
            acc[c * TILE_Q_NR + u] *= alpha[u];
}

/* Unscaled S^T tile (rows x cols, leading dim ld) -> P^T = exp(scale * s - lse_eff[col]) * renorm[col]. */
FLASH_CPU_SIMD static void FN(probs_by_column)(T *restrict s, int64_t rows, int64_t cols, int64_t ld,
                                               T scale, const T *restrict lse_eff, const T *restrict renorm)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            s[r * ld + c] = EXP(scale * s[r * ld + c] - lse_eff[c]) * renorm[c];
}

/* Unscaled S tile (rows x cols, leading dim ld) -> P = exp(scale * s - lse_eff[row]) * renorm[row]. */
FLASH_CPU_SIMD static void FN(probs_by_row)(T *restrict s, int64_t rows, int64_t cols, int64_t ld,
                                            T scale, const T *restrict lse_eff, const T *restrict renorm)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            s[r * ld + c] = EXP(scale * s[r * ld + c] - lse_eff[r]) * renorm[r];
}

/* dP^T tile -> dS^T = P^T * (dP^T - delta[col]). */
FLASH_CPU_SIMD static void FN(dscores_by_column)(T *restrict ds, const T *restrict pr, int64_t rows,
                                                 int64_t cols, int64_t ld, const T *restrict delta)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            ds[r * ld + c] = pr[r * ld + c] * (ds[r * ld + c] - delta[c]);
}

/* dP tile -> dS = P * (dP - delta[row]). */
FLASH_CPU_SIMD static void FN(dscores_by_row)(T *restrict ds, const T *restrict pr, int64_t rows,
                                              int64_t cols, int64_t ld, const T *restrict delta)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            ds[r * ld + c] = pr[r * ld + c] * (ds[r * ld + c] - delta[r]);
}

/* Sets the entries of the S^T tile s (km key rows x qp query columns, leading dim TILE_Q_NR) of tile
 * t that lie outside the band (or in the padding) to value. Key row j sees the tile's queries u with
 * lo <= j - u <= hi (flash_tile_diag). */
static void FN(mask_band_t)(T *s, int64_t km, int64_t qp, const flash_seq *seq, const tile *t, T value)
{
    const int64_t lo = flash_tile_diag(seq->diag_lo, t->q0, t->k0), hi = flash_tile_diag(seq->diag_hi, t->q0, t->k0);
    for (int64_t j = 0; j < km; j++) {
        const int64_t end = j < t->kn ? clamp64(j - lo + 1, 0, t->qn) : 0;
        FN(mask_outside)(s + j * TILE_Q_NR, clamp64(j - hi, 0, end), end, qp, value);
    }
}

/* Sets the entries of the S tile s (qm query rows x kp key columns, leading dim TILE_K_NR) of tile t
 * that lie outside the band (or in the padding) to value. Query row i sees the tile's keys jl with
 * lo <= jl - i <= hi. */
static void FN(mask_band)(T *s, int64_t qm, int64_t kp, const flash_seq *seq, const tile *t, T value)
{
    const int64_t lo = flash_tile_diag(seq->diag_lo, t->q0, t->k0), hi = flash_tile_diag(seq->diag_hi, t->q0, t->k0);
    for (int64_t i = 0; i < qm; i++) {
        const int64_t end = i < t->qn ? clamp64(i + hi + 1, 0, t->kn) : 0;
        FN(mask_outside)(s + i * TILE_K_NR, clamp64(i + lo, 0, end), end, kp, value);
    }
}

/* The passes of the score hook (score.h, natural units) on a rows x cols score block (leading dim ld).
 * Step 1 on the scaled scores: s = softcap(scale * s); grad = its derivative. */
FLASH_CPU_SIMD static void FN(softcap_pass)(T *restrict s, T *restrict grad, int64_t rows, int64_t cols,
                                            int64_t ld, T scale, const SC(flash_score) *sc)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            const T th = TANH(SC(flash_score_cap_in)(sc, scale * s[r * ld + c]));
            s[r * ld + c] = SC(flash_score_cap_out)(sc, th);
            grad[r * ld + c] = SC(flash_score_cap_grad)(th);
        }
}

FLASH_CPU_SIMD static void FN(scale_pass)(T *restrict s, int64_t rows, int64_t cols, int64_t ld, T scale)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            s[r * ld + c] *= scale;
}

/* Step 2 on the scaled scores: s = bias(scale * s); base = j - i' at element (0, 0), j - i' = base + r - c at
 * element (r, c) of S^T (rows keys), base - r + c of S (rows queries). */
FLASH_CPU_SIMD static void FN(bias_pass)(T *restrict s, int64_t rows, int64_t cols, int64_t ld, T scale,
                                         const SC(flash_score) *sc, int64_t base, int transposed)
{
    const int32_t dir = transposed ? -1 : 1; /* d(j - i') / dc */
    if (sc->table) {
        /* T5: the bias depends on j - i' alone, so it is formed once per diagonal u = c - r + rows - 1
         * (score.h's step 2 at x = 0) and each row adds a contiguous window of it */
        T diag[TILE_Q_NR + TILE_K_NR];
        for (int64_t u = 0; u < rows + cols - 1; u++)
            diag[u] = SC(flash_score_bias)(sc, 0, base + dir * (u - (rows - 1)), 0);
        for (int64_t r = 0; r < rows; r++) {
            const T *restrict dg = diag + (rows - 1 - r);
            for (int64_t c = 0; c < cols; c++)
                s[r * ld + c] = scale * s[r * ld + c] + dg[c];
        }
        return;
    }
    for (int64_t r = 0; r < rows; r++)
        for (int32_t c = 0; c < (int32_t)cols; c++) /* cols <= a tile side: an int32 converts in SIMD */
            s[r * ld + c] = SC(flash_score_bias)(sc, scale * s[r * ld + c], base - dir * r, dir * c);
}

/* Step 3, the attn_mask entries read through mask_s. */
static void FN(mask_pass)(T *restrict s, int64_t rows, int64_t cols, int64_t ld, const flash_params *p,
                          const SC(flash_score) *sc, const tile *t, int transposed, int64_t bi, int64_t hq)
{
    for (int64_t r = 0; r < rows; r++) {
        const int64_t i0 = transposed ? t->q0 : t->q0 + r, j0 = transposed ? t->k0 + r : t->k0;
        const int64_t base = flash_mask_offset(p, bi, hq, i0, j0);
        const int64_t step = transposed ? p->mask_s.row : p->mask_s.col; /* along a row of s */
        T *restrict srow = s + r * ld;
        if (p->mask_kind == FLASH_MASK_ADD) {
            const T *m = (const T *)p->mask + base;
            for (int64_t c = 0; c < cols; c++)
                srow[c] = SC(flash_score_mask_add)(sc, srow[c], m[c * step]);
        } else {
            const uint8_t *m = (const uint8_t *)p->mask + base;
            for (int64_t c = 0; c < cols; c++)
                srow[c] = SC(flash_score_mask_bool)(srow[c], m[c * step]);
        }
    }
}

/* The score hook (score.h) on the tile's elements of a score buffer s (leading dim ld): S^T
 * (transposed = 1: rows are the tile's keys, columns its queries) or S (rows queries, columns keys).
 * s = hook(scale * s) in score.h's order; grad (same layout) receives the softcap derivatives (unused
 * without softcap). Each step is its own elementwise pass so that all but the mask's vectorize. */
static void FN(score_hook)(T *s, int64_t ld, int transposed, const flash_params *p, const flash_seq *seq,
                           const tile *t, int64_t bi, int64_t hq, T scale, unsigned mask_flags, T *grad)
{
    const int64_t rows = transposed ? t->kn : t->qn, cols = transposed ? t->qn : t->kn;
    const SC(flash_score) sc = SC(flash_score_of)(p, seq->alibi_offset, bi, hq, 1);
    if (flash_score_capped(p)) {
        FN(softcap_pass)(s, grad, rows, cols, ld, scale, &sc);
        scale = 1;
    }
    if (flash_score_biased(p)) {
        const int64_t base = t->k0 - t->q0 - sc.alibi_offset;
        FN(bias_pass)(s, rows, cols, ld, scale, &sc, base, transposed);
    } else if (scale != 1) {
        FN(scale_pass)(s, rows, cols, ld, scale);
    }
    if (mask_flags & FLASH_MASK_ANY_MASKED)
        FN(mask_pass)(s, rows, cols, ld, p, &sc, t, transposed, bi, hq);
}

/* dK/dV pass with dropout, on an S tile (query rows il < qn, key columns jl < kn, leading dim
 * TILE_K_NR), replacing dscores_by_row: with f = dropout_scale where kept, 0 where dropped (mask.h),
 * ds = dP -> dS = P * (f * dP - delta) and pr = P -> f * P (the dropped P that dV needs). The Philox
 * calls of one group of 4 keys run across the query rows (dropout_group_bits). */
FLASH_CPU_SIMD static void FN(dscores_dropout_by_row)(T *restrict ds, T *restrict pr, const flash_params *p,
                                                      const tile *t, int64_t bh, const T *restrict delta)
{
    const T keep_scale = (T)p->dropout_scale;
    const uint32_t cut = flash_dropout_cut(p); /* kept iff draw > cut */
    uint32_t bits[4][TILE_Q_NR];
    for (int64_t j0 = t->k0 / FLASH_DROPOUT_KEYS_PER_CALL * FLASH_DROPOUT_KEYS_PER_CALL; j0 < t->k0 + t->kn;
         j0 += FLASH_DROPOUT_KEYS_PER_CALL) {
        dropout_group_bits(p, bh, t->q0, t->qn, j0 / FLASH_DROPOUT_KEYS_PER_CALL, bits);
        const int64_t j_end = flash_min64(j0 + FLASH_DROPOUT_KEYS_PER_CALL, t->k0 + t->kn);
        for (int64_t j = flash_max64(j0, t->k0); j < j_end; j++) {
            const uint32_t *draw = bits[j - j0];
            for (int64_t il = 0; il < t->qn; il++) {
                const int64_t e = il * TILE_K_NR + (j - t->k0);
                const T f = draw[il] > cut ? keep_scale : 0;
                ds[e] = pr[e] * (f * ds[e] - delta[il]);
                pr[e] *= f;
            }
        }
    }
}

/* Dropout of the tile's elements of an S^T tile x (key rows jl < kn, query columns il < qn, leading
 * dim TILE_Q_NR): x = x * dropout_scale where kept, 0 where dropped (mask.h: one Philox call per 4
 * keys of a row), the calls of one group of 4 keys across the query columns (dropout_group_bits). */
FLASH_CPU_SIMD static void FN(dropout_columns)(T *restrict x, const flash_params *p, const tile *t, int64_t bh)
{
    const T keep_scale = (T)p->dropout_scale;
    const uint32_t cut = flash_dropout_cut(p); /* kept iff draw > cut */
    uint32_t bits[4][TILE_Q_NR];
    for (int64_t j0 = t->k0 / FLASH_DROPOUT_KEYS_PER_CALL * FLASH_DROPOUT_KEYS_PER_CALL; j0 < t->k0 + t->kn;
         j0 += FLASH_DROPOUT_KEYS_PER_CALL) {
        dropout_group_bits(p, bh, t->q0, t->qn, j0 / FLASH_DROPOUT_KEYS_PER_CALL, bits);
        const int64_t j_end = flash_min64(j0 + FLASH_DROPOUT_KEYS_PER_CALL, t->k0 + t->kn);
        for (int64_t j = flash_max64(j0, t->k0); j < j_end; j++) {
            const uint32_t *draw = bits[j - j0];
            T *restrict row = x + (j - t->k0) * TILE_Q_NR;
            for (int64_t il = 0; il < t->qn; il++)
                row[il] = draw[il] > cut ? row[il] * keep_scale : 0;
        }
    }
}

/* ds *= grad on the tile's elements (query il < qn, key jl < kn), of buffers whose element (il, jl) is
 * at il * qs + jl * ks (S^T: qs = 1; S: ks = 1). */
static void FN(softcap_backward)(T *restrict ds, const T *restrict grad, int64_t qs, int64_t ks, const tile *t)
{
    for (int64_t il = 0; il < t->qn; il++)
        for (int64_t jl = 0; jl < t->kn; jl++)
            ds[il * qs + jl * ks] *= grad[il * qs + jl * ks];
}

/* Sums of an S-layout tile's elements per diagonal: diag[jl - il + qn - 1] += ds[il][jl] (the rows added
 * into shifted windows, contiguous on both sides). */
FLASH_CPU_SIMD static void FN(diagonal_sums)(T *restrict diag, const T *restrict ds, const tile *t)
{
    for (int64_t c = 0; c < t->qn + t->kn - 1; c++)
        diag[c] = 0;
    for (int64_t il = 0; il < t->qn; il++) {
        T *restrict dg = diag + (t->qn - 1 - il);
        const T *restrict row = ds + il * TILE_K_NR;
        for (int64_t jl = 0; jl < t->kn; jl++)
            dg[jl] += row[jl];
    }
}

/* The score hook's gradient sinks (score.h) for the tile's elements; ds is an S-layout tile (leading dim
 * TILE_K_NR). dbias takes each element; the T5 table's partials one sum per diagonal of the tile (every
 * element of a diagonal has the same j - i', so the same bucket), passed with its first element. */
static void FN(score_grad)(const flash_params *p, const flash_seq *seq, const T *restrict ds, const tile *t,
                           int64_t bi, int64_t hq)
{
    if (p->dbias)
        for (int64_t il = 0; il < t->qn; il++)
            for (int64_t jl = 0; jl < t->kn; jl++)
                SC(flash_score_grad)(p, bi, hq, t->q0 + il, t->k0 + jl, ds[il * TILE_K_NR + jl]);
    if (p->rel_bias_grad) {
        const SC(flash_score) sc = SC(flash_score_of)(p, seq->alibi_offset, bi, hq, 1);
        T diag[TILE_Q_NR + TILE_K_NR];
        FN(diagonal_sums)(diag, ds, t);
        for (int64_t c = 0; c < t->qn + t->kn - 1; c++) {
            const int64_t il = flash_max64(0, t->qn - 1 - c); /* the diagonal's first element (il, jl) */
            SC(flash_score_grad_table)(p, &sc, bi, hq, t->q0 + il, t->k0 + il + c - (t->qn - 1), diag[c]);
        }
    }
}

typedef struct FN(workspace) {
    T *q, *dout, *k, *v, *s, *ds, *acc, *acc2, *grad; /* tile buffers; the layout is per pass */
    const T *renorm; /* backward: renorm_rows' factors (lse layout), or NULL */
    uint16_t *amx;   /* fp32 copies of fp16 / bf16 inputs with AMX usable: packing scratch (amx.h); else NULL */
    uint16_t *amx_b[3]; /* with amx: a task's packed B operands that stay the same over its tiles */
    int parts;       /* with amx: the bf16 terms of an input value (1 for bf16, 2 for fp16) */
    const uint16_t *packed; /* with amx: the A operands of every key tile (forward, dQ) or query tile (dK/dV),
                             * packed once for all the tasks that read them (pack_tiles), or NULL */
    int64_t slot, part[4], tiles; /* elements per (batch, head, tile), each operand's offset in it; tiles per head */
    T *dq_acc; /* the one-pass backward (bwd_task): dQ / scale of the task's query heads, (h_per_kv, sq, dn) */
    T *k_rows; /* the one-pass backward: the key tile's K rows, (TILE_K, dn) */
    int inputs_only; /* with amx: only the products of two inputs packed (amx_on 2), the others on the fp32 kernels */
} FN(workspace);

/* With AMX: B (k, n; row-major, leading dim ldb) of input values packed once into slot of the workspace, for the
 * products of a task that share it (mm's b_packed); NULL without. */
static const uint16_t *FN(pack_b)(const FN(workspace) *w, int slot, int64_t k, int64_t n, const T *b, int64_t ldb)
{
    if (!w->amx)
        return NULL;
    flash_amx_pack_b(w->amx_b[slot], w->parts, k, n, (const float *)b, ldb); /* T is float */
    return w->amx_b[slot];
}

/* c = [c +] a b as gemm, on AMX tiles where the workspace has their scratch (amx.h): a holds input values (q, k,
 * v or dout, of w->parts bf16 terms) where a_inputs (a_packed: packed already, or NULL), b too where b_inputs
 * (b_packed: b as pack_b left it, or NULL); otherwise any fp32 values (P, dS: 3 terms); exact products either
 * way, only the order of the fp32 additions differs. */
static void FN(mm)(const FN(workspace) *w, const uint16_t *a_packed, int a_inputs, const uint16_t *b_packed,
                   int b_inputs, int64_t m, int64_t n, int64_t k, const T *a, int64_t a_rs, int64_t a_ks, const T *b,
                   int64_t ldb, T *c, int64_t ldc, int accumulate)
{
    if (w->amx && (!w->inputs_only || (a_inputs && b_inputs))) { /* T is float */
        const int a_parts = a_inputs ? w->parts : 3, b_parts = b_inputs ? w->parts : 3;
        uint16_t *ap = w->amx, *bp = w->amx;
        if (!a_packed) {
            flash_amx_pack_a(ap, a_parts, m, k, (const float *)a, a_rs, a_ks);
            a_packed = ap;
            bp = ap + a_parts * flash_amx_packed_elems(m, k);
        }
        if (!b_packed) {
            flash_amx_pack_b(bp, b_parts, k, n, (const float *)b, ldb);
            b_packed = bp;
        }
        flash_amx_gemm_packed(m, n, k, a_packed, a_parts, b_packed, b_parts, (float *)c, ldc, accumulate);
        return;
    }
    FN(gemm)(m, n, k, a, a_rs, a_ks, b, ldb, c, ldc, accumulate);
}

/* s (rows x cols, leading dim ld) *= scale. */
FLASH_CPU_SIMD static void FN(scale_tile)(T *restrict s, int64_t rows, int64_t cols, int64_t ld, T scale)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            s[r * ld + c] *= scale;
}

/* Forward task: one (batch, head, query tile), working on S^T = K Q^T (keys x queries):
 *   w->q   (d, TILE_Q_NR)         Q^T of the tile, times scale
 *   w->k   (TILE_K, dm)           K tile rows
 *   w->v   (TILE_K, dvm)          V tile rows
 *   w->s   (TILE_K, TILE_Q_NR)    S^T, then P^T
 *   w->acc (dvm, TILE_Q_NR)       O^T, unnormalized
 * (dm, dvm: d, d_v rounded up to FLASH_CPU_MR) */
static void FN(fwd_task)(const flash_params *p, const FN(workspace) *w, int64_t task)
{
    const int64_t d = p->d, dm = ROUND_UP(d, FLASH_CPU_MR), d_v = p->d_v, dvm = ROUND_UP(d_v, FLASH_CPU_MR);
    int64_t bi, hq, q0;
    query_task(p, task, &bi, &hq, &q0);
    const flash_seq seq = flash_seq_of(p, bi);
    if (q0 >= seq.sq)
        return;
    const int64_t hk = hq / p->h_per_kv;
    tile t = {q0, flash_min64(FLASH_CPU_TILE_Q, seq.sq - q0), 0, 0};
    const int64_t qp = ROUND_UP(t.qn, FLASH_CPU_NR);
    const int64_t q_off = bi * p->q_s.batch + (seq.q_row0 + q0) * p->q_s.row + hq * p->q_s.head;
    const T *q = (const T *)p->q + q_off;
    const FN(key_rows) k = {(const T *)p->k + hk * p->k_s.head, p->k_s.batch, p->k_s.row};
    const FN(key_rows) v = {(const T *)p->v + hk * p->v_s.head, p->v_s.batch, p->v_s.row};
    T *o = (T *)p->o + bi * p->o_s.batch + (seq.q_row0 + q0) * p->o_s.row + hq * p->o_s.head;
    T *lse = (T *)p->lse + flash_lse_offset(p, &seq, bi, hq) + q0;
    T m[TILE_Q_NR], l[TILE_Q_NR], alpha[TILE_Q_NR];
    /* AMX without dropout and with a positive scale: flash_amx_softmax_pack (m in natural units, a stale max), P in
     * p_terms bf16 terms: bf16 inputs 2 (P to 16 significant bits, 2^-17 relative: out32 within 1e-5 of the exact
     * result, 100x below out's rounding to bf16, as torch's CPU SDPA rounds P to bf16), fp16 3 (P exact) */
    const int fused = w->amx && !p->dropout_threshold && p->scale > 0, p_terms = w->parts == 1 ? 2 : 3;

    const uint16_t *q_packed = NULL; /* AMX: Q^T packed from q's rows (fp16 / bf16 ones as they are), unscaled */
    if (w->amx) { /* T is float */
        const int kind = amx_kind(p->cpu_q_dtype);
        const void *rows = kind == FLASH_AMX_SRC_FP32 ? (const void *)q
                                                      : (const void *)((const uint16_t *)p->q + q_off);
        flash_amx_pack_b_rows(w->amx_b[0], w->parts, d, qp, rows, kind, p->q_s.row, t.qn);
        q_packed = w->amx_b[0];
    } else {
        FN(load_transposed)(w->q, TILE_Q_NR, qp, q, p->q_s.row, t.qn, d, (T)p->scale);
    }
    for (int64_t u = 0; u < qp; u++) {
        m[u] = -INFINITY;
        l[u] = 0;
    }
    FN(zero_tile)(w->acc, TILE_Q_NR, dvm, qp);
    const flash_tile_range keys = flash_key_tiles(&seq, q0, t.qn, 1); /* in keys, not tiles */
    /* packed key tiles start at multiples of the tile; keys outside the band are masked as in any partial tile */
    const int64_t first = w->packed ? keys.first / FLASH_CPU_TILE_K * FLASH_CPU_TILE_K : keys.first;
    for (t.k0 = first; t.k0 < keys.end; t.k0 += FLASH_CPU_TILE_K) {
        t.kn = flash_min64(FLASH_CPU_TILE_K, (w->packed ? seq.sk : keys.end) - t.k0);
        const unsigned flags = flash_mask_tile_flags(p, bi, hq, t.q0, t.qn, t.k0, t.kn);
        if (!(flags & FLASH_MASK_ANY_VISIBLE))
            continue;
        const int64_t km = ROUND_UP(t.kn, FLASH_CPU_MR);
        const int full = t.k0 >= keys.full_first && t.k0 + t.kn <= keys.full_end && km == t.kn;
        const uint16_t *kv = NULL;
        if (w->packed) {
            kv = w->packed + ((bi * p->h_kv + hk) * w->tiles + t.k0 / FLASH_CPU_TILE_K) * w->slot;
        } else {
            FN(load_key_rows)(w->k, dm, km, dm, k, p, &seq, t.k0, t.kn, d);
            FN(load_key_rows)(w->v, dvm, t.kn, dvm, v, p, &seq, t.k0, t.kn, d_v);
        }
        FN(mm)(w, kv, 1, q_packed, 1, km, qp, d, w->k, dm, 1, w->q, TILE_Q_NR, w->s, TILE_Q_NR, 0);
        const int hooked = p->has_hook && hooked_scores(p, flags);
        if (w->amx && (!fused || hooked))
            FN(scale_tile)(w->s, km, qp, TILE_Q_NR, (T)p->scale);
        if (hooked)
            FN(score_hook)(w->s, TILE_Q_NR, 1, p, &seq, &t, bi, hq, 1, flags, w->grad);
        if (!full)
            FN(mask_band_t)(w->s, km, qp, &seq, &t, -INFINITY);
        if (fused) { /* T is float: the scale (unless the hook applied it), softmax and P^T's packing in one pass */
            uint16_t *pt = w->amx_b[1]; /* and amx_b[2]: 3 ROUND32(TILE_K) TILE_Q_NR <= 2 amx_b elements */
            const uint32_t moved = flash_amx_softmax_pack((const float *)w->s, t.kn, qp, TILE_Q_NR,
                                                          hooked ? 1.0f : (float)p->scale, (float *)m, (float *)l,
                                                          (float *)alpha, pt, p_terms);
            flash_amx_scale_columns((float *)w->acc, TILE_Q_NR, dvm, moved, (const float *)alpha);
            if (!kv)
                flash_amx_pack_a(w->amx, w->parts, dvm, t.kn, (const float *)w->v, 1, dvm);
            flash_amx_gemm_packed(dvm, qp, t.kn, kv ? kv + w->part[1] : w->amx, w->parts, pt, p_terms,
                                  (float *)w->acc, TILE_Q_NR, 1);
            continue;
        }
        FN(softmax_step)(w->s, km, qp, w->acc, dvm, m, l);
        if (p->dropout_threshold)
            FN(dropout_columns)(w->s, p, &t, bi * p->h + hq);
        FN(mm)(w, kv ? kv + w->part[1] : NULL, 1, NULL, 0, dvm, qp, t.kn, w->v, 1, dvm, w->s, TILE_Q_NR, w->acc,
               TILE_Q_NR, 1);
    }
    const T sink = (T)flash_sink(p, hq);
    for (int64_t u = 0; u < t.qn; u++)
        ROW_FINISH(m[u], l[u], sink, &alpha[u], lse + u); /* alpha: the rows' factors now */
    if (!w->amx)
        FN(store_rows_scaled)(o, p->o_s.row, w->acc, TILE_Q_NR, t.qn, d_v, alpha);
    if (w->amx) /* T is float; out rounded to fp16 / bf16 beside it where the binding asks (flash.h cpu_o_half) */
        flash_amx_store_rows((float *)o, p->o_s.row, (const float *)w->acc, TILE_Q_NR, d_v, t.qn, (const float *)alpha,
                             p->cpu_o_half ? (uint16_t *)p->cpu_o_half + (o - (T *)p->o) : NULL,
                             amx_kind(p->cpu_src_dtype));
}

/* dK/dV task: one (batch, kv head, key tile), working on S = Q K^T (queries x keys):
 *   w->k        (d, TILE_K_NR)    K^T of the tile;  w->v (d_v, TILE_K_NR) V^T
 *   w->q        (TILE_Q, dm)      Q tile rows;  w->dout (TILE_Q, dvm) dO tile rows
 *   w->s        (TILE_Q, TILE_K_NR)  S (unscaled), then P (with dropout: then the dropped P);
 *   w->ds       (TILE_Q, TILE_K_NR)  dP, then dS
 *   w->grad     (TILE_Q, TILE_K_NR)  softcap derivatives
 *   w->acc      (dm, TILE_K_NR)   dK^T / scale;  w->acc2 (dvm, TILE_K_NR) dV^T */
static void FN(dkdv_tile)(const flash_params *p, const FN(workspace) *w, const flash_seq *seqp, int64_t bi, int64_t hk,
                          int64_t k0)
{
    const int64_t d = p->d, dm = ROUND_UP(d, FLASH_CPU_MR), d_v = p->d_v, dvm = ROUND_UP(d_v, FLASH_CPU_MR);
    const int64_t dn = ROUND_UP(d, FLASH_CPU_NR), dq_rows = ROUND_UP(p->sq, FLASH_CPU_TILE_Q) + FLASH_CPU_TILE_Q;
    const flash_seq seq = *seqp;
    tile t = {0, 0, k0, flash_min64(FLASH_CPU_TILE_K, seq.sk - k0)};
    const int64_t kp = ROUND_UP(t.kn, FLASH_CPU_NR);
    const FN(key_rows) k = {(const T *)p->k + hk * p->k_s.head, p->k_s.batch, p->k_s.row};
    const FN(key_rows) v = {(const T *)p->v + hk * p->v_s.head, p->v_s.batch, p->v_s.row};
    T lse_eff[TILE_MAX_NR], delta[TILE_MAX_NR], renorm[TILE_MAX_NR];

    FN(load_key_transposed)(w->k, TILE_K_NR, kp, k, p, &seq, t.k0, t.kn, d);
    FN(load_key_transposed)(w->v, TILE_K_NR, kp, v, p, &seq, t.k0, t.kn, d_v);
    FN(zero_tile)(w->acc, TILE_K_NR, dm, kp);
    FN(zero_tile)(w->acc2, TILE_K_NR, dvm, kp);
    const uint16_t *k_packed = FN(pack_b)(w, 0, d, kp, w->k, TILE_K_NR);
    const uint16_t *v_packed = FN(pack_b)(w, 1, d_v, kp, w->v, TILE_K_NR);
    const uint16_t *k_rows_packed = NULL;
    if (w->dq_acc) { /* the one-pass backward: dQ += dS K here, K's rows zero-padded to dn columns */
        FN(load_key_rows)(w->k_rows, dn, t.kn, dn, k, p, &seq, t.k0, t.kn, d);
        k_rows_packed = FN(pack_b)(w, 2, t.kn, dn, w->k_rows, dn);
    }
    const flash_tile_range rows = flash_query_tiles(&seq, t.k0, t.kn, 1); /* in query rows, not tiles */
    for (int64_t hq = hk * p->h_per_kv; hq < (hk + 1) * p->h_per_kv; hq++) {
        const T *q = (const T *)p->q + bi * p->q_s.batch + seq.q_row0 * p->q_s.row + hq * p->q_s.head; /* (sq, d) */
        const T *dout = (const T *)p->dout + bi * p->do_s.batch + seq.q_row0 * p->do_s.row + hq * p->do_s.head;
        const int64_t row_off = flash_lse_offset(p, &seq, bi, hq);
        const T *lse = (const T *)p->lse + row_off;
        const T *dl = (const T *)p->delta + row_off;
        const T *rn = w->renorm ? w->renorm + row_off : NULL;
        /* packed query tiles start at multiples of the tile; rows outside the band are masked as in any tile */
        const int64_t first = w->packed ? rows.first / FLASH_CPU_TILE_Q * FLASH_CPU_TILE_Q : rows.first;
        for (t.q0 = first; t.q0 < rows.end; t.q0 += FLASH_CPU_TILE_Q) {
            t.qn = flash_min64(FLASH_CPU_TILE_Q, (w->packed ? seq.sq : rows.end) - t.q0);
            const unsigned flags = flash_mask_tile_flags(p, bi, hq, t.q0, t.qn, t.k0, t.kn);
            if (!(flags & FLASH_MASK_ANY_VISIBLE))
                continue;
            const int64_t qm = ROUND_UP(t.qn, FLASH_CPU_MR);
            const int full = t.q0 >= rows.full_first && t.q0 + t.qn <= rows.full_end;
            const int hooked = p->has_hook && hooked_scores(p, flags);
            const uint16_t *qd = NULL;
            if (w->packed) {
                qd = w->packed + ((bi * p->h + hq) * w->tiles + t.q0 / FLASH_CPU_TILE_Q) * w->slot;
            } else {
                FN(load_rows)(w->q, dm, qm, dm, q + t.q0 * p->q_s.row, p->q_s.row, t.qn, d);
                FN(load_rows)(w->dout, dvm, qm, dvm, dout + t.q0 * p->do_s.row, p->do_s.row, t.qn, d_v);
            }
            FN(load_row_stats)(lse_eff, delta, renorm, qm, lse + t.q0, dl + t.q0, rn ? rn + t.q0 : NULL, t.qn);
            FN(mm)(w, qd, 1, k_packed, 1, qm, kp, d, w->q, dm, 1, w->k, TILE_K_NR, w->s, TILE_K_NR, 0);
            if (hooked)
                FN(score_hook)(w->s, TILE_K_NR, 0, p, &seq, &t, bi, hq, (T)p->scale, flags, w->grad);
            FN(probs_by_row)(w->s, qm, kp, TILE_K_NR, hooked ? 1 : (T)p->scale, lse_eff, renorm);
            if (!full)
                FN(mask_band)(w->s, qm, kp, &seq, &t, 0);
            FN(mm)(w, qd ? qd + w->part[1] : NULL, 1, v_packed, 1, qm, kp, d_v, w->dout, dvm, 1, w->v, TILE_K_NR, w->ds,
                   TILE_K_NR, 0);
            if (p->dropout_threshold)
                FN(dscores_dropout_by_row)(w->ds, w->s, p, &t, bi * p->h + hq, delta);
            else
                FN(dscores_by_row)(w->ds, w->s, qm, kp, TILE_K_NR, delta);
            if (flash_score_has_grad(p))
                FN(score_grad)(p, &seq, w->ds, &t, bi, hq);
            if (hooked && p->softcap > 0)
                FN(softcap_backward)(w->ds, w->grad, TILE_K_NR, 1, &t);
            FN(mm)(w, qd ? qd + w->part[2] : NULL, 1, NULL, 0, dvm, kp, t.qn, w->dout, 1, dvm, w->s, TILE_K_NR, w->acc2,
                   TILE_K_NR, 1);
            FN(mm)(w, qd ? qd + w->part[3] : NULL, 1, NULL, 0, dm, kp, t.qn, w->q, 1, dm, w->ds, TILE_K_NR, w->acc,
                   TILE_K_NR, 1);
            if (w->dq_acc)
                FN(mm)(w, NULL, 0, k_rows_packed, 1, qm, dn, t.kn, w->ds, TILE_K_NR, 1, w->k_rows, dn,
                        w->dq_acc + ((hq - hk * p->h_per_kv) * dq_rows + t.q0) * dn, dn, 1);
        }
    }
    FN(store_key_transposed)((T *)p->dk + hk * p->dk_s.head, p->dk_s, w->acc, TILE_K_NR, p, &seq, t.k0, t.kn, d,
                             (T)p->scale);
    FN(store_key_transposed)((T *)p->dv + hk * p->dv_s.head, p->dv_s, w->acc2, TILE_K_NR, p, &seq, t.k0, t.kn, d_v,
                             1);
}

/* dK/dV task: one (batch, kv head, key tile). */
static void FN(dkdv_task)(const flash_params *p, const FN(workspace) *w, int64_t task)
{
    const int64_t n_bh = p->b * p->h_kv, bi = task % n_bh / p->h_kv, hk = task % p->h_kv;
    const flash_seq seq = flash_seq_of(p, bi);
    const int64_t k0 = task / n_bh * FLASH_CPU_TILE_K;
    if (k0 < seq.sk)
        FN(dkdv_tile)(p, w, &seq, bi, hk, k0);
}

/* One-pass backward task: one (batch, kv head); its key tiles in order, each as a dK/dV task that also adds
 * dS K into w->dq_acc (the dQ of the kv head's query heads, summed in this fixed order), then dq = scale *
 * dq_acc for every row of the sequence (rows that see no key get 0). The dQ pass's recomputation of S, P and dP
 * is saved; the tasks are fewer (bwd picks it where they still fill the threads). */
static void FN(bwd_task)(const flash_params *p, const FN(workspace) *w, int64_t task)
{
    const int64_t bi = task / p->h_kv, hk = task % p->h_kv, d = p->d, dn = ROUND_UP(d, FLASH_CPU_NR);
    const int64_t dq_rows = ROUND_UP(p->sq, FLASH_CPU_TILE_Q) + FLASH_CPU_TILE_Q;
    const flash_seq seq = flash_seq_of(p, bi);
    memset(w->dq_acc, 0, (size_t)(p->h_per_kv * dq_rows * dn) * sizeof(T));
    for (int64_t k0 = 0; k0 < seq.sk; k0 += FLASH_CPU_TILE_K)
        FN(dkdv_tile)(p, w, &seq, bi, hk, k0);
    for (int64_t g = 0; g < p->h_per_kv; g++) {
        const int64_t hq = hk * p->h_per_kv + g;
        T *dq = (T *)p->dq + bi * p->dq_s.batch + seq.q_row0 * p->dq_s.row + hq * p->dq_s.head;
        for (int64_t i = 0; i < seq.sq; i++) {
            const T *src = w->dq_acc + (g * dq_rows + i) * dn;
            for (int64_t c = 0; c < d; c++)
                dq[i * p->dq_s.row + c] = src[c] * (T)p->scale;
        }
    }
}

/* dQ task: one (batch, head, query tile), working on S^T like the forward:
 *   w->q (d, TILE_Q_NR) Q^T;  w->dout (d_v, TILE_Q_NR) dO^T
 *   w->k (TILE_K, dm) K tile rows;  w->v (TILE_K, dvm) V tile rows
 *   w->s  (TILE_K, TILE_Q_NR)     S^T (unscaled), then P^T;  w->ds  dP^T, then dS^T
 *   w->grad (TILE_K, TILE_Q_NR)   softcap derivatives
 *   w->acc (dm, TILE_Q_NR)        dQ^T / scale */
static void FN(dq_task)(const flash_params *p, const FN(workspace) *w, int64_t task)
{
    const int64_t d = p->d, dm = ROUND_UP(d, FLASH_CPU_MR), d_v = p->d_v, dvm = ROUND_UP(d_v, FLASH_CPU_MR);
    int64_t bi, hq, q0;
    query_task(p, task, &bi, &hq, &q0);
    const flash_seq seq = flash_seq_of(p, bi);
    if (q0 >= seq.sq)
        return;
    const int64_t hk = hq / p->h_per_kv;
    tile t = {q0, flash_min64(FLASH_CPU_TILE_Q, seq.sq - q0), 0, 0};
    const int64_t qp = ROUND_UP(t.qn, FLASH_CPU_NR);
    const int64_t q_row = seq.q_row0 + q0;
    const T *q = (const T *)p->q + bi * p->q_s.batch + q_row * p->q_s.row + hq * p->q_s.head;
    const T *dout = (const T *)p->dout + bi * p->do_s.batch + q_row * p->do_s.row + hq * p->do_s.head;
    const FN(key_rows) k = {(const T *)p->k + hk * p->k_s.head, p->k_s.batch, p->k_s.row};
    const FN(key_rows) v = {(const T *)p->v + hk * p->v_s.head, p->v_s.batch, p->v_s.row};
    const int64_t row_off = flash_lse_offset(p, &seq, bi, hq) + q0;
    T *dq = (T *)p->dq + bi * p->dq_s.batch + q_row * p->dq_s.row + hq * p->dq_s.head;
    T lse_eff[TILE_Q_NR], delta[TILE_Q_NR], renorm[TILE_Q_NR];

    FN(load_transposed)(w->q, TILE_Q_NR, qp, q, p->q_s.row, t.qn, d, 1);
    FN(load_transposed)(w->dout, TILE_Q_NR, qp, dout, p->do_s.row, t.qn, d_v, 1);
    FN(load_row_stats)(lse_eff, delta, renorm, qp, (const T *)p->lse + row_off, (const T *)p->delta + row_off,
                       w->renorm ? w->renorm + row_off : NULL, t.qn);
    FN(zero_tile)(w->acc, TILE_Q_NR, dm, qp);
    const uint16_t *q_packed = FN(pack_b)(w, 0, d, qp, w->q, TILE_Q_NR);
    const uint16_t *dout_packed = FN(pack_b)(w, 1, d_v, qp, w->dout, TILE_Q_NR);
    const flash_tile_range keys = flash_key_tiles(&seq, q0, t.qn, 1); /* in keys, not tiles */
    const int64_t first = w->packed ? keys.first / FLASH_CPU_TILE_K * FLASH_CPU_TILE_K : keys.first; /* as fwd */
    for (t.k0 = first; t.k0 < keys.end; t.k0 += FLASH_CPU_TILE_K) {
        t.kn = flash_min64(FLASH_CPU_TILE_K, (w->packed ? seq.sk : keys.end) - t.k0);
        const unsigned flags = flash_mask_tile_flags(p, bi, hq, t.q0, t.qn, t.k0, t.kn);
        if (!(flags & FLASH_MASK_ANY_VISIBLE))
            continue;
        const int64_t km = ROUND_UP(t.kn, FLASH_CPU_MR);
        const int full = t.k0 >= keys.full_first && t.k0 + t.kn <= keys.full_end;
        const int hooked = p->has_hook && hooked_scores(p, flags);
        const uint16_t *kv = NULL;
        if (w->packed) {
            kv = w->packed + ((bi * p->h_kv + hk) * w->tiles + t.k0 / FLASH_CPU_TILE_K) * w->slot;
        } else {
            FN(load_key_rows)(w->k, dm, km, dm, k, p, &seq, t.k0, t.kn, d);
            FN(load_key_rows)(w->v, dvm, km, dvm, v, p, &seq, t.k0, t.kn, d_v);
        }
        FN(mm)(w, kv, 1, q_packed, 1, km, qp, d, w->k, dm, 1, w->q, TILE_Q_NR, w->s, TILE_Q_NR, 0);
        if (hooked)
            FN(score_hook)(w->s, TILE_Q_NR, 1, p, &seq, &t, bi, hq, (T)p->scale, flags, w->grad);
        FN(probs_by_column)(w->s, km, qp, TILE_Q_NR, hooked ? 1 : (T)p->scale, lse_eff, renorm);
        if (!full)
            FN(mask_band_t)(w->s, km, qp, &seq, &t, 0);
        FN(mm)(w, kv ? kv + w->part[1] : NULL, 1, dout_packed, 1, km, qp, d_v, w->v, dvm, 1, w->dout, TILE_Q_NR, w->ds,
               TILE_Q_NR, 0);
        if (p->dropout_threshold)
            FN(dropout_columns)(w->ds, p, &t, bi * p->h + hq);
        FN(dscores_by_column)(w->ds, w->s, km, qp, TILE_Q_NR, delta);
        if (hooked && p->softcap > 0)
            FN(softcap_backward)(w->ds, w->grad, 1, TILE_Q_NR, &t);
        FN(mm)(w, kv ? kv + w->part[2] : NULL, 1, NULL, 0, dm, qp, t.kn, w->k, 1, dm, w->ds, TILE_Q_NR, w->acc,
               TILE_Q_NR, 1);
    }
    FN(store_transposed)(dq, p->dq_s.row, w->acc, TILE_Q_NR, t.qn, d, (T)p->scale);
}

/* Decode path: one task per (batch, kv head, key split) takes all rows of the kv head's query heads at once
 * (row r = g * sq + i: query i of head hk * h_per_kv + g), so that one pass over a key block serves every query
 * head of the GQA group. Per block of DECODE_KEYS keys: S (rows x keys; decode_scores or decode_scores_lanes),
 * the online softmax along the keys, acc (rows x d_v) += P V (decode_pv). */
typedef struct FN(decode_ws) {
    T *q;     /* the rows of q times scale: (rows, d), or Q^T (d, rows rounded up to DECODE_LANES) with
               * zero padding columns where the rows go in the lanes */
    T *s;     /* (rows, DECODE_KEYS): S, then P */
    T *acc;   /* (rows, d_v): O, unnormalized */
    T *m, *l, *alpha; /* (rows): running max and sum, rescale factor of the last block */
    T *stage; /* fp16 / bf16 k / v (cpu_kv_dtype): the block's key rows widened, (DECODE_KEYS, d), (DECODE_KEYS, d_v) */
} FN(decode_ws);

/* s[r * DECODE_KEYS + j] = dot(q row r, keys[j]) for r < rows, j < kn; q is (rows, d). Four rows at a time
 * share the loads of a key row. */
FLASH_CPU_SIMD FLASH_CPU_REASSOC static void FN(decode_scores)(T *restrict s, const T *restrict q, int64_t rows,
                                                               int64_t d, const T *const *keys, int64_t kn)
{
    for (int64_t j = 0; j < kn; j++) {
        const T *restrict kj = keys[j];
        int64_t r = 0;
        for (; r + DECODE_MR <= rows; r += DECODE_MR) {
            const T *restrict q0 = q + r * d, *restrict q1 = q0 + d, *restrict q2 = q1 + d, *restrict q3 = q2 + d;
            T s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            for (int64_t c = 0; c < d; c++) {
                s0 += q0[c] * kj[c];
                s1 += q1[c] * kj[c];
                s2 += q2[c] * kj[c];
                s3 += q3[c] * kj[c];
            }
            s[r * DECODE_KEYS + j] = s0;
            s[(r + 1) * DECODE_KEYS + j] = s1;
            s[(r + 2) * DECODE_KEYS + j] = s2;
            s[(r + 3) * DECODE_KEYS + j] = s3;
        }
        for (; r < rows; r++) {
            const T *restrict qr = q + r * d;
            T sr = 0;
            for (int64_t c = 0; c < d; c++)
                sr += qr[c] * kj[c];
            s[r * DECODE_KEYS + j] = sr;
        }
    }
}

/* decode_scores from Q^T (d, rp; rp a multiple of DECODE_LANES): the rows in the vector lanes, a key's element
 * broadcast, a block of 4 keys x DECODE_LANES rows in registers over the d steps (the last block of keys
 * repeats the last key, whose extra results are not stored). */
FLASH_CPU_SIMD static void FN(decode_scores_lanes)(T *restrict s, const T *restrict qt, int64_t rp, int64_t rows,
                                                   int64_t d, const T *const *keys, int64_t kn)
{
    for (int64_t r0 = 0; r0 < rows; r0 += DECODE_LANES) {
        const int64_t rn = flash_min64(DECODE_LANES, rows - r0);
        for (int64_t j0 = 0; j0 < kn; j0 += 4) {
            const T *restrict k0 = keys[j0], *restrict k1 = keys[flash_min64(j0 + 1, kn - 1)];
            const T *restrict k2 = keys[flash_min64(j0 + 2, kn - 1)], *restrict k3 = keys[flash_min64(j0 + 3, kn - 1)];
            T a0[DECODE_LANES], a1[DECODE_LANES], a2[DECODE_LANES], a3[DECODE_LANES];
            for (int u = 0; u < DECODE_LANES; u++)
                a0[u] = a1[u] = a2[u] = a3[u] = 0;
            for (int64_t c = 0; c < d; c++) {
                const T *restrict qc = qt + c * rp + r0;
                const T k0c = k0[c], k1c = k1[c], k2c = k2[c], k3c = k3[c];
                for (int u = 0; u < DECODE_LANES; u++) {
                    a0[u] += k0c * qc[u];
                    a1[u] += k1c * qc[u];
                    a2[u] += k2c * qc[u];
                    a3[u] += k3c * qc[u];
                }
            }
            const T *a[4] = {a0, a1, a2, a3};
            for (int64_t x = 0; x < flash_min64(4, kn - j0); x++)
                for (int64_t u = 0; u < rn; u++)
                    s[(r0 + u) * DECODE_KEYS + j0 + x] = a[x][u];
        }
    }
}

/* Online-softmax step on the rows of a score block s (rows x kn, leading dim DECODE_KEYS, masked entries
 * -inf): updates m and l, turns s into exp(s - m_new) and sets alpha = exp(m_old - m_new), the factor of the
 * accumulator (decode_pv applies it). */
FLASH_CPU_SIMD static void FN(decode_softmax)(T *restrict s, int64_t rows, int64_t kn, T *restrict m,
                                              T *restrict l, T *restrict alpha)
{
    for (int64_t r = 0; r < rows; r++) {
        T *restrict row = s + r * DECODE_KEYS;
        T mx = m[r];
#pragma omp simd reduction(max : mx)
        for (int64_t j = 0; j < kn; j++)
            mx = row[j] > mx ? row[j] : mx;
        /* a row that has seen no key yet keeps m = -inf and shifts by 0 (as softmax_step) */
        const T shift = mx == -INFINITY ? 0 : mx;
        alpha[r] = EXP(m[r] - shift);
        m[r] = mx;
        T sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < kn; j++) {
            const T e = EXP(row[j] - shift);
            row[j] = e;
            sum += e;
        }
        l[r] = alpha[r] * l[r] + sum;
    }
}

/* Columns [c0, c0 + DECODE_COLS) of DECODE_MR rows of acc (leading dim lda): acc = alpha[r] * acc +
 * sum_j p[r][j] vals[j], the block held in registers across the keys. */
static FLASH_CPU_INLINE void FN(decode_pv_block)(T *restrict acc, int64_t lda, const T *restrict pr,
                                                 const T *restrict alpha, int64_t c0, const T *const *vals, int64_t kn)
{
    T a[DECODE_MR][DECODE_COLS];
    for (int r = 0; r < DECODE_MR; r++)
        for (int u = 0; u < DECODE_COLS; u++)
            a[r][u] = alpha[r] * acc[r * lda + c0 + u];
    for (int64_t j = 0; j < kn; j++) {
        const T *restrict vj = vals[j] + c0;
        for (int r = 0; r < DECODE_MR; r++) {
            const T pj = pr[r * DECODE_KEYS + j];
            for (int u = 0; u < DECODE_COLS; u++)
                a[r][u] += pj * vj[u];
        }
    }
    for (int r = 0; r < DECODE_MR; r++)
        for (int u = 0; u < DECODE_COLS; u++)
            acc[r * lda + c0 + u] = a[r][u];
}

/* One row of decode_pv, all d_v columns: acc = alpha * acc + sum_j p[j] vals[j], two keys per pass over the
 * row (which stays in L1). */
static FLASH_CPU_INLINE void FN(decode_pv_row)(T *restrict acc, int64_t d_v, const T *restrict pr, T alpha,
                                               const T *const *vals, int64_t kn)
{
    for (int64_t c = 0; c < d_v; c++)
        acc[c] *= alpha;
    int64_t j = 0;
    for (; j + 2 <= kn; j += 2) {
        const T *restrict v0 = vals[j], *restrict v1 = vals[j + 1];
        const T p0 = pr[j], p1 = pr[j + 1];
        for (int64_t c = 0; c < d_v; c++)
            acc[c] += p0 * v0[c] + p1 * v1[c];
    }
    if (j < kn) {
        const T *restrict v0 = vals[j];
        for (int64_t c = 0; c < d_v; c++)
            acc[c] += pr[j] * v0[c];
    }
}

/* acc (rows, d_v) = alpha[r] * acc + P V for P (rows x kn, leading dim DECODE_KEYS) and the value rows vals. */
FLASH_CPU_SIMD static void FN(decode_pv)(T *restrict acc, int64_t d_v, const T *restrict pr, const T *restrict alpha,
                                         int64_t rows, const T *const *vals, int64_t kn)
{
    const int64_t cols = d_v / DECODE_COLS * DECODE_COLS;
    int64_t r = 0;
    for (; r + DECODE_MR <= rows; r += DECODE_MR) {
        T *restrict ar = acc + r * d_v;
        const T *restrict pb = pr + r * DECODE_KEYS;
        for (int64_t c0 = 0; c0 < cols; c0 += DECODE_COLS)
            FN(decode_pv_block)(ar, d_v, pb, alpha + r, c0, vals, kn);
        if (cols == d_v)
            continue;
        for (int64_t x = 0; x < DECODE_MR; x++)
            for (int64_t c = cols; c < d_v; c++)
                ar[x * d_v + c] *= alpha[r + x];
        for (int64_t j = 0; j < kn; j++)
            for (int64_t x = 0; x < DECODE_MR; x++) {
                const T pj = pb[x * DECODE_KEYS + j];
                for (int64_t c = cols; c < d_v; c++)
                    ar[x * d_v + c] += pj * vals[j][c];
            }
    }
    for (; r < rows; r++)
        FN(decode_pv_row)(acc + r * d_v, d_v, pr + r * DECODE_KEYS, alpha[r], vals, kn);
}

/* kp[x], vp[x]: the rows of key k0 + x of seq in k and v (heads khead, vhead) for x < kn, run by run
 * (key_run); with prefetch set, each row's cache lines are prefetched. */
static void FN(decode_key_rows)(const T **kp, const T **vp, const flash_params *p, const flash_seq *seq,
                                const char *khead, const char *vhead, int64_t es, int64_t k0, int64_t kn,
                                int prefetch)
{
    for (int64_t j = k0, run; j < k0 + kn; j += run) {
        run = key_run(p, seq, j, k0 + kn);
        const char *kr = khead + flash_key_offset(p, seq, p->k_s.batch, p->k_s.row, j) * es;
        const char *vr = vhead + flash_key_offset(p, seq, p->v_s.batch, p->v_s.row, j) * es;
        for (int64_t x = 0; x < run; x++) {
            kp[j - k0 + x] = (const T *)(kr + x * p->k_s.row * es);
            vp[j - k0 + x] = (const T *)(vr + x * p->v_s.row * es);
        }
    }
    if (!prefetch)
        return;
    for (int64_t x = 0; x < kn; x++) {
        for (int64_t b = 0; b < p->d * es; b += CACHE_LINE_BYTES)
            FLASH_CPU_PREFETCH((const char *)kp[x] + b);
        for (int64_t b = 0; b < p->d_v * es; b += CACHE_LINE_BYTES)
            FLASH_CPU_PREFETCH((const char *)vp[x] + b);
    }
}

/* bf16 (fp16 where fp16) rows src[x] (n values each, x < rows) widened into dst (rows, n) as widen_half does;
 * dst_rows[x] points at row x. T is float. */
FLASH_CPU_SIMD static void FN(widen_half_rows)(T *restrict dst, const T *const *src, int64_t rows, int64_t n, int fp16,
                                               const T **dst_rows)
{
    for (int64_t x = 0; x < rows; x++) {
        const uint16_t *restrict s = (const uint16_t *)src[x];
        uint32_t *restrict d = (uint32_t *)(dst + x * n);
        if (!fp16) {
            for (int64_t c = 0; c < n; c++)
                d[c] = (uint32_t)s[c] << 16;
        } else {
            for (int64_t c = 0; c < n; c++)
                dst[x * n + c] = widen_half(s[c], 1);
        }
        dst_rows[x] = dst + x * n;
    }
}

/* decode_scores and decode_pv for fewer than DECODE_MR rows (one or two query rows per kv head: MHA), reading the
 * fp16 / bf16 key and value rows as they are (each row serves too few rows to be worth widening first). T is
 * float. */
FLASH_CPU_SIMD FLASH_CPU_REASSOC static void FN(decode_scores_half)(T *restrict s, const T *restrict q, int64_t rows,
                                                                    int64_t d, const T *const *keys, int64_t kn,
                                                                    int fp16)
{
    for (int64_t j = 0; j < kn; j++) {
        const uint16_t *restrict kj = (const uint16_t *)keys[j];
        for (int64_t r = 0; r < rows; r++) {
            const T *restrict qr = q + r * d;
            T sr = 0;
            if (fp16)
                for (int64_t c = 0; c < d; c++)
                    sr += qr[c] * widen_half(kj[c], 1);
            else
                for (int64_t c = 0; c < d; c++)
                    sr += qr[c] * widen_half(kj[c], 0);
            s[r * DECODE_KEYS + j] = sr;
        }
    }
}

FLASH_CPU_SIMD static void FN(decode_pv_half)(T *restrict acc, int64_t d_v, const T *restrict pr,
                                              const T *restrict alpha, int64_t rows, const T *const *vals, int64_t kn,
                                              int fp16)
{
    for (int64_t r = 0; r < rows; r++) {
        T *restrict ar = acc + r * d_v;
        for (int64_t c = 0; c < d_v; c++)
            ar[c] *= alpha[r];
        for (int64_t j = 0; j < kn; j++) {
            const uint16_t *restrict vj = (const uint16_t *)vals[j];
            const T pj = pr[r * DECODE_KEYS + j];
            if (fp16)
                for (int64_t c = 0; c < d_v; c++)
                    ar[c] += pj * widen_half(vj[c], 1);
            else
                for (int64_t c = 0; c < d_v; c++)
                    ar[c] += pj * widen_half(vj[c], 0);
        }
    }
}

/* Output row of query i of head hq from its running max m, sum l (relative to m) and unnormalized acc (d_v):
 * o and lse, with the sink (flash_row_finish_*). */
static void FN(decode_store_row)(const flash_params *p, const flash_seq *seq, int64_t bi, int64_t hq, int64_t i,
                                 T m, T l, const T *restrict acc)
{
    T *o = (T *)p->o + bi * p->o_s.batch + (seq->q_row0 + i) * p->o_s.row + hq * p->o_s.head;
    T factor;
    ROW_FINISH(m, l, (T)flash_sink(p, hq), &factor, (T *)p->lse + flash_lse_offset(p, seq, bi, hq) + i);
    for (int64_t c = 0; c < p->d_v; c++)
        o[c] = acc[c] * factor;
}

/* Decode task: (batch, kv head) group task / n_splits, key split task % n_splits of the keys its rows see
 * (flash_key_tiles at tile size 1, cut into n_splits equal runs). Without splits it writes o and lse; with
 * them its rows' (m, l, acc) go to partial (rows_max rows of d_v + 2 per task) for decode_merge. */
static void FN(decode_task)(const flash_params *p, const FN(decode_ws) *w, int64_t task, int64_t n_splits,
                            T *partial)
{
    const int64_t d = p->d, d_v = p->d_v, hpk = p->h_per_kv;
    const int64_t group = task / n_splits, split = task % n_splits;
    const int64_t bi = group / p->h_kv, hk = group % p->h_kv;
    const flash_seq seq = flash_seq_of(p, bi);
    const int64_t sq = seq.sq, rows = hpk * sq;
    if (rows == 0)
        return;
    const flash_tile_range keys = flash_key_tiles(&seq, 0, sq, 1); /* in keys, not tiles */
    const int64_t per = flash_cdiv64(keys.end - keys.first, n_splits);
    const int64_t j0 = keys.first + split * per, j1 = flash_min64(keys.end, j0 + per);
    const int half_kv = p->cpu_kv_dtype == FLASH_BF16 || p->cpu_kv_dtype == FLASH_FP16; /* T is float */
    const int64_t es = half_kv ? 2 : (int64_t)sizeof(T);
    const char *khead = (const char *)p->k + hk * p->k_s.head * es;
    const char *vhead = (const char *)p->v + hk * p->v_s.head * es;

    const int lanes = rows >= DECODE_LANES_MIN_ROWS;
    const int64_t rp = ROUND_UP(rows, DECODE_LANES);
    for (int64_t r = 0; r < rows; r++) {
        const int64_t hq = hk * hpk + r / sq, i = r % sq;
        const T *qrow = (const T *)p->q + bi * p->q_s.batch + (seq.q_row0 + i) * p->q_s.row + hq * p->q_s.head;
        for (int64_t c = 0; c < d; c++)
            w->q[lanes ? c * rp + r : r * d + c] = (T)p->scale * qrow[c];
        w->m[r] = -INFINITY;
        w->l[r] = 0;
    }
    if (lanes)
        for (int64_t c = 0; c < d; c++)
            for (int64_t r = rows; r < rp; r++)
                w->q[c * rp + r] = 0;
    FN(zero_tile)(w->acc, d_v, rows, d_v);
    /* the row pointers of this block (kp[cur], vp[cur]) and of the next, whose rows are prefetched meanwhile
     * (at large row strides, each key row in a page of its own, the hardware prefetchers do not follow); the
     * first block's too, so that its misses overlap */
    const T *kp[2][DECODE_KEYS], *vp[2][DECODE_KEYS];
    int cur = 0;
    const T *kw[DECODE_KEYS], *vw[DECODE_KEYS]; /* fp16 / bf16 k / v: the widened rows of the block */
    if (j0 < j1)
        FN(decode_key_rows)(kp[0], vp[0], p, &seq, khead, vhead, es, j0, flash_min64(DECODE_KEYS, j1 - j0), 1);
    for (int64_t k0 = j0; k0 < j1; k0 += DECODE_KEYS, cur ^= 1) {
        const int64_t kn = flash_min64(DECODE_KEYS, j1 - k0);
        if (k0 + kn < j1)
            FN(decode_key_rows)(kp[cur ^ 1], vp[cur ^ 1], p, &seq, khead, vhead, es, k0 + kn,
                                flash_min64(DECODE_KEYS, j1 - k0 - kn), 1);
        const T *const *krows = kp[cur], *const *vrows = vp[cur];
        const int fp16 = p->cpu_kv_dtype == FLASH_FP16, direct = half_kv && rows < DECODE_MR;
        if (half_kv && !direct) {
            FN(widen_half_rows)(w->stage, kp[cur], kn, d, fp16, kw);
            FN(widen_half_rows)(w->stage + DECODE_KEYS * d, vp[cur], kn, d_v, fp16, vw);
            krows = kw;
            vrows = vw;
        }
        if (direct)
            FN(decode_scores_half)(w->s, w->q, rows, d, krows, kn, fp16);
        else if (lanes)
            FN(decode_scores_lanes)(w->s, w->q, rp, rows, d, krows, kn);
        else
            FN(decode_scores)(w->s, w->q, rows, d, krows, kn);
        const int full = k0 >= keys.full_first && k0 + kn <= keys.full_end;
        if (!full || p->has_hook)
            for (int64_t r = 0; r < rows; r++) {
                const int64_t hq = hk * hpk + r / sq, i = r % sq;
                T *row = w->s + r * DECODE_KEYS;
                const unsigned flags = flash_mask_tile_flags(p, bi, hq, i, 1, k0, kn);
                if (!(flags & FLASH_MASK_ANY_VISIBLE)) {
                    FN(mask_outside)(row, kn, kn, kn, -INFINITY);
                    continue;
                }
                if (p->has_hook && hooked_scores(p, flags)) {
                    const tile t = {i, 1, k0, kn};
                    T grad[DECODE_KEYS];
                    FN(score_hook)(row, DECODE_KEYS, 0, p, &seq, &t, bi, hq, 1, flags, grad);
                }
                if (!full)
                    FN(mask_outside)(row, clamp64(i + seq.diag_lo - k0, 0, kn),
                                     clamp64(i + seq.diag_hi + 1 - k0, 0, kn), kn, -INFINITY);
            }
        FN(decode_softmax)(w->s, rows, kn, w->m, w->l, w->alpha);
        if (direct)
            FN(decode_pv_half)(w->acc, d_v, w->s, w->alpha, rows, vrows, kn, fp16);
        else
            FN(decode_pv)(w->acc, d_v, w->s, w->alpha, rows, vrows, kn);
    }
    if (n_splits == 1) {
        for (int64_t r = 0; r < rows; r++)
            FN(decode_store_row)(p, &seq, bi, hk * hpk + r / sq, r % sq, w->m[r], w->l[r], w->acc + r * d_v);
        return;
    }
    T *part = partial + task * hpk * p->sq * (d_v + 2);
    for (int64_t r = 0; r < rows; r++) {
        T *pr = part + r * (d_v + 2);
        pr[0] = w->m[r];
        pr[1] = w->l[r];
        memcpy(pr + 2, w->acc + r * d_v, (size_t)d_v * sizeof(T));
    }
}

/* Merges the n_splits partial (m, l, acc) of each row of (batch, kv head) group into o and lse, as
 * softmax_step merges blocks: with M the largest m, l = sum exp(m_s - M) l_s, acc = sum exp(m_s - M) acc_s.
 * acc: d_v elements of scratch. */
static void FN(decode_merge)(const flash_params *p, int64_t group, int64_t n_splits, const T *partial, T *acc)
{
    const int64_t d_v = p->d_v, hpk = p->h_per_kv, bi = group / p->h_kv, hk = group % p->h_kv;
    const flash_seq seq = flash_seq_of(p, bi);
    const int64_t sq = seq.sq, stride = hpk * p->sq * (d_v + 2);
    const T *first = partial + group * n_splits * stride;
    for (int64_t r = 0; r < hpk * sq; r++) {
        T mx = -INFINITY, l = 0;
        for (int64_t s = 0; s < n_splits; s++)
            mx = first[s * stride + r * (d_v + 2)] > mx ? first[s * stride + r * (d_v + 2)] : mx;
        const T shift = mx == -INFINITY ? 0 : mx;
        FN(zero_tile)(acc, d_v, 1, d_v);
        for (int64_t s = 0; s < n_splits; s++) {
            const T *pr = first + s * stride + r * (d_v + 2);
            const T f = EXP(pr[0] - shift);
            l += f * pr[1];
            for (int64_t c = 0; c < d_v; c++)
                acc[c] += f * pr[2 + c];
        }
        FN(decode_store_row)(p, &seq, bi, hk * hpk + r / sq, r % sq, mx, l, acc);
    }
}

/* The decode forward: decode_task over every (batch, kv head, split) on the OpenMP threads, each thread with
 * its own workspace, then (with splits) decode_merge over the groups. */
static flash_cpu_status FN(decode_fwd)(const flash_params *p)
{
    const int n_threads = omp_get_max_threads();
    const int64_t n_splits = decode_splits(p, n_threads), groups = p->b * p->h_kv, n_tasks = groups * n_splits;
    const int64_t rows_max = p->h_per_kv * p->sq, align = FLASH_CPU_ALIGN_BYTES / (int64_t)sizeof(T);
    const int64_t q_elems = ROUND_UP(rows_max, DECODE_LANES) * p->d;
    const int64_t stage = p->cpu_kv_dtype != FLASH_FP32 ? DECODE_KEYS * (p->d + p->d_v) : 0;
    const int64_t ws = ROUND_UP(q_elems + rows_max * (DECODE_KEYS + p->d_v + 3) + stage, align);
    const int64_t part = n_splits > 1 ? ROUND_UP(n_tasks * rows_max * (p->d_v + 2), align) : 0;
    if (n_tasks <= 0 || rows_max <= 0)
        return FLASH_CPU_OK;
    T *pool = aligned_alloc(FLASH_CPU_ALIGN_BYTES, (size_t)(n_threads * ws + part) * sizeof(T));
    if (!pool)
        return FLASH_CPU_ERR_NOMEM;
    T *partial = pool + n_threads * ws;
#pragma omp parallel num_threads(n_threads)
    {
        T *base = pool + omp_get_thread_num() * ws;
        T *rest = base + q_elems;
        const FN(decode_ws) w = {base, rest, rest + rows_max * DECODE_KEYS, rest + rows_max * (DECODE_KEYS + p->d_v),
                                 rest + rows_max * (DECODE_KEYS + p->d_v + 1),
                                 rest + rows_max * (DECODE_KEYS + p->d_v + 2),
                                 rest + rows_max * (DECODE_KEYS + p->d_v + 3)};
#pragma omp for schedule(dynamic)
        for (int64_t task = 0; task < n_tasks; task++)
            FN(decode_task)(p, &w, task, n_splits, partial);
        if (n_splits > 1) {
#pragma omp for schedule(static)
            for (int64_t group = 0; group < groups; group++)
                FN(decode_merge)(p, group, n_splits, partial, w.acc);
        }
    }
    free(pool);
    return FLASH_CPU_OK;
}

typedef void (*FN(task_fn))(const flash_params *p, const FN(workspace) *w, int64_t task);

/* With AMX: the A operands (pack_what) of every tile of FLASH_CPU_TILE_K keys (FLASH_CPU_TILE_Q query rows) from
 * row 0 of each (batch, kv head)'s ((batch, head)'s) sequence, packed once for all the tasks that read them, where
 * each task re-packed them per step before; w's packed, slot, part and tiles describe them. NULL (the tasks then
 * pack per step) above FLASH_CPU_PACK_MAX_BYTES or when out of memory. T is float. */
/* pack_tiles' layout: w->slot, part and tiles for pass `what`; returns the bytes of all the slots. */
static int64_t FN(pack_layout)(const flash_params *p, FN(workspace) *w, int what)
{
    const int64_t d = p->d, dm = ROUND_UP(d, FLASH_CPU_MR), d_v = p->d_v, dvm = ROUND_UP(d_v, FLASH_CPU_MR);
    const int queries = what == PACK_DKDV;
    const int64_t tile = queries ? FLASH_CPU_TILE_Q : FLASH_CPU_TILE_K, heads = queries ? p->h : p->h_kv;
    int64_t elems[4] = {flash_amx_packed_elems(tile, d), 0, 0, 0};
    elems[1] = what == PACK_FWD ? flash_amx_packed_elems(dvm, tile) : flash_amx_packed_elems(tile, d_v);
    if (what != PACK_FWD)
        elems[2] = what == PACK_DQ ? flash_amx_packed_elems(dm, tile) : flash_amx_packed_elems(dvm, tile);
    if (queries)
        elems[3] = flash_amx_packed_elems(dm, tile);
    w->slot = 0;
    for (int e = 0; e < 4; e++) {
        w->part[e] = w->slot;
        w->slot += w->parts * elems[e];
    }
    w->tiles = flash_cdiv64(queries ? p->sq : p->sk, tile);
    return ROUND_UP(p->b * heads * w->tiles * w->slot * 2, FLASH_CPU_ALIGN_BYTES);
}

static uint16_t *FN(pack_tiles)(const flash_params *p, FN(workspace) *w, int what)
{
    const int64_t d = p->d, dm = ROUND_UP(d, FLASH_CPU_MR), d_v = p->d_v, dvm = ROUND_UP(d_v, FLASH_CPU_MR);
    const int queries = what == PACK_DKDV;
    const int64_t tile = queries ? FLASH_CPU_TILE_Q : FLASH_CPU_TILE_K, heads = queries ? p->h : p->h_kv;
    const int64_t bytes = FN(pack_layout)(p, w, what), n_slots = p->b * heads * w->tiles;
    if (bytes > FLASH_CPU_PACK_MAX_BYTES)
        return NULL;
    uint16_t *packed = aligned_alloc(FLASH_CPU_ALIGN_BYTES, (size_t)bytes);
    const int64_t buf = ROUND_UP(tile * (dm + dvm), FLASH_CPU_ALIGN_BYTES / (int64_t)sizeof(T));
    T *bufs = packed ? aligned_alloc(FLASH_CPU_ALIGN_BYTES, (size_t)(omp_get_max_threads() * buf) * sizeof(T)) : NULL;
    if (!bufs) {
        free(packed);
        return NULL;
    }
    const FN(workspace) *ws = w;
#pragma omp parallel
    {
        T *x = bufs + omp_get_thread_num() * buf, *y = x + tile * dm; /* k or q rows (dm apart), v or dout rows */
#pragma omp for schedule(static)
        for (int64_t slot = 0; slot < n_slots; slot++) {
            const int64_t bi = slot / (heads * ws->tiles), hh = slot / ws->tiles % heads;
            const int64_t r0 = slot % ws->tiles * tile;
            const flash_seq seq = flash_seq_of(p, bi);
            const int64_t len = queries ? seq.sq : seq.sk;
            if (r0 >= len)
                continue;
            const int64_t n = flash_min64(tile, len - r0), nm = ROUND_UP(n, FLASH_CPU_MR);
            if (queries) {
                const int64_t row = seq.q_row0 + r0;
                FN(load_rows)(x, dm, nm, dm, (const T *)p->q + bi * p->q_s.batch + row * p->q_s.row +
                              hh * p->q_s.head, p->q_s.row, n, d);
                FN(load_rows)(y, dvm, nm, dvm, (const T *)p->dout + bi * p->do_s.batch + row * p->do_s.row +
                              hh * p->do_s.head, p->do_s.row, n, d_v);
            } else if (what == PACK_FWD && p->cpu_kv_dtype == FLASH_BF16 && ws->parts == 1) { /* bf16 k, v as is */
                const uint16_t *kr[ROUND_UP(FLASH_CPU_TILE_K, 32)], *vr[ROUND_UP(FLASH_CPU_TILE_K, 32)];
                for (int64_t j = r0, run; j < r0 + n; j += run) {
                    run = key_run(p, &seq, j, r0 + n);
                    const uint16_t *ks = (const uint16_t *)p->k + hh * p->k_s.head +
                                         flash_key_offset(p, &seq, p->k_s.batch, p->k_s.row, j);
                    const uint16_t *vs = (const uint16_t *)p->v + hh * p->v_s.head +
                                         flash_key_offset(p, &seq, p->v_s.batch, p->v_s.row, j);
                    for (int64_t x = 0; x < run; x++) {
                        kr[j - r0 + x] = ks + x * p->k_s.row;
                        vr[j - r0 + x] = vs + x * p->v_s.row;
                    }
                }
                for (int64_t j = n; j < ROUND_UP(FLASH_CPU_TILE_K, 32); j++)
                    kr[j] = vr[j] = NULL;
                uint16_t *dst = packed + slot * ws->slot;
                flash_amx_pack_a_rows16(dst, nm, d, kr);                  /* K rows */
                flash_amx_pack_at_rows16(dst + ws->part[1], dvm, d_v, n, vr); /* V^T */
                continue;
            } else if (p->cpu_kv_dtype != FLASH_FP32) { /* T is float: the fp16 / bf16 k, v widened here */
                const int fp16 = p->cpu_kv_dtype == FLASH_FP16;
                FN(load_key_rows_half)(x, dm, nm, (const uint16_t *)p->k + hh * p->k_s.head, p->k_s.batch, p->k_s.row,
                                       p, &seq, r0, n, d, fp16);
                FN(load_key_rows_half)(y, dvm, nm, (const uint16_t *)p->v + hh * p->v_s.head, p->v_s.batch,
                                       p->v_s.row, p, &seq, r0, n, d_v, fp16);
            } else {
                const FN(key_rows) k = {(const T *)p->k + hh * p->k_s.head, p->k_s.batch, p->k_s.row};
                const FN(key_rows) v = {(const T *)p->v + hh * p->v_s.head, p->v_s.batch, p->v_s.row};
                FN(load_key_rows)(x, dm, nm, dm, k, p, &seq, r0, n, d);
                FN(load_key_rows)(y, dvm, nm, dvm, v, p, &seq, r0, n, d_v);
            }
            uint16_t *dst = packed + slot * ws->slot;
            const float *xf = (const float *)x, *yf = (const float *)y;
            flash_amx_pack_a(dst, ws->parts, nm, d, xf, dm, 1); /* K or Q rows */
            if (what == PACK_FWD)
                flash_amx_pack_a(dst + ws->part[1], ws->parts, dvm, n, yf, 1, dvm); /* V^T */
            else
                flash_amx_pack_a(dst + ws->part[1], ws->parts, nm, d_v, yf, dvm, 1); /* V or dO rows */
            if (what == PACK_DQ)
                flash_amx_pack_a(dst + ws->part[2], ws->parts, dm, n, xf, 1, dm); /* K^T */
            if (queries) {
                flash_amx_pack_a(dst + ws->part[2], ws->parts, dvm, n, yf, 1, dvm); /* dO^T */
                flash_amx_pack_a(dst + ws->part[3], ws->parts, dm, n, xf, 1, dm);  /* Q^T */
            }
        }
    }
    free(bufs);
    return packed;
}

/* Elements of the one-pass backward's per-thread dQ accumulator (bwd_task) and of its K rows buffer. */
static int64_t FN(dq_acc_elems)(const flash_params *p)
{
    const int64_t dq_rows = ROUND_UP(p->sq, FLASH_CPU_TILE_Q) + FLASH_CPU_TILE_Q, dn = ROUND_UP(p->d, FLASH_CPU_NR);
    return ROUND_UP(p->h_per_kv * dq_rows * dn + FLASH_CPU_TILE_K * dn, FLASH_CPU_ALIGN_BYTES / (int64_t)sizeof(T));
}

/* Runs tasks [0, n_tasks) on the OpenMP threads, each thread with its own workspace (renorm: the
 * backward's factors, or NULL; pack: what pack_tiles packs first with AMX, or PACK_NONE; dq_acc: the one-pass
 * backward's dQ accumulator and K rows in each workspace). */
static flash_cpu_status FN(run_tasks)(const flash_params *p, int64_t n_tasks, FN(task_fn) run_task, const T *renorm,
                                      int pack, int dq_acc)
{
    if (n_tasks <= 0)
        return FLASH_CPU_OK;
    const int64_t buf = tile_buffer_elems(p->d, p->d_v, sizeof(T));
    const int n_threads = omp_get_max_threads();
    /* AMX: fp16 / bf16 inputs; each thread's scratch after its tile buffers (64-byte multiples) */
    const int parts = amx_parts(p);
    const int amx_mode = sizeof(T) == sizeof(float) ? amx_on(p, pack) : 0, amx = amx_mode != 0;
    const int64_t big = flash_max64(flash_max64(ROUND_UP(p->d, FLASH_CPU_MR), ROUND_UP(p->d_v, FLASH_CPU_MR)),
                                    FLASH_CPU_TILE_Q > FLASH_CPU_TILE_K ? FLASH_CPU_TILE_Q : FLASH_CPU_TILE_K);
    const int64_t amx_b = ROUND_UP(2 * flash_amx_packed_elems(big, TILE_MAX_NR), FLASH_CPU_ALIGN_BYTES / 2);
    const int64_t amx_elems = amx ? ROUND_UP(flash_amx_scratch_elems(big, TILE_MAX_NR, big),
                                             FLASH_CPU_ALIGN_BYTES / 2) + 3 * amx_b : 0;
    const int64_t dq_elems = dq_acc ? FN(dq_acc_elems)(p) : 0;
    const int64_t per_thread = FLASH_CPU_TILE_BUFFERS * buf + dq_elems + amx_elems * 2 / (int64_t)sizeof(T);
    FN(workspace) shared = {0};
    shared.parts = parts;
    uint16_t *packed = amx_mode == 1 && pack != PACK_NONE && !amx_per_step() ? FN(pack_tiles)(p, &shared, pack) : NULL;
    if (!packed && p->cpu_kv_dtype != FLASH_FP32) /* fp16 / bf16 k, v are read only by pack_tiles */
        return FLASH_CPU_ERR_NOMEM;
    T *pool = aligned_alloc(FLASH_CPU_ALIGN_BYTES, (size_t)(n_threads * per_thread) * sizeof(T));
    if (!pool) {
        free(packed);
        return FLASH_CPU_ERR_NOMEM;
    }
#pragma omp parallel num_threads(n_threads)
    {
        T *base = pool + omp_get_thread_num() * per_thread;
        FN(workspace) w = {base,           base + buf,         base + 2 * buf,
                           base + 3 * buf, base + 4 * buf,     base + 5 * buf,
                           base + 6 * buf, base + 7 * buf,     base + 8 * buf, renorm,
                           NULL,           {NULL, NULL, NULL}, parts,
                           packed,         shared.slot,        {shared.part[0], shared.part[1], shared.part[2],
                                                                shared.part[3]},
                           shared.tiles,   NULL,               NULL,
                           amx_mode == 2};
        if (dq_acc) {
            w.dq_acc = base + FLASH_CPU_TILE_BUFFERS * buf;
            w.k_rows = w.dq_acc + dq_elems - FLASH_CPU_TILE_K * ROUND_UP(p->d, FLASH_CPU_NR);
        }
        if (amx) {
            w.amx = (uint16_t *)(base + FLASH_CPU_TILE_BUFFERS * buf + dq_elems);
            w.amx_b[0] = w.amx + amx_elems - 3 * amx_b;
            w.amx_b[1] = w.amx_b[0] + amx_b;
            w.amx_b[2] = w.amx_b[1] + amx_b;
        }
        if (amx)
            flash_amx_begin();
#pragma omp for schedule(dynamic)
        for (int64_t task = 0; task < n_tasks; task++)
            run_task(p, &w, task);
        if (amx)
            flash_amx_end();
    }
    free(pool);
    free(packed);
    return FLASH_CPU_OK;
}

/* 1 when the forward of p (T float, fp16 / bf16 inputs) runs on AMX with every key tile packed once per call
 * (run_tasks' conditions for pack_tiles), so that q, k and v may be the fp16 / bf16 tensors themselves
 * (cpu_q_dtype, cpu_kv_dtype): then they are read only as they are packed. */
static int FN(fwd_reads_half)(const flash_params *p)
{
    FN(workspace) w = {0};
    w.parts = amx_parts(p);
    return sizeof(T) == sizeof(float) && w.parts && !decode_shape(p) && amx_on(p, PACK_FWD) && !amx_per_step() &&
           FN(pack_layout)(p, &w, PACK_FWD) <= FLASH_CPU_PACK_MAX_BYTES;
}

static flash_cpu_status FN(fwd)(const flash_params *p)
{
    if (p->cpu_kv_dtype != FLASH_FP32 || p->cpu_q_dtype != FLASH_FP32 || p->cpu_o_half) {
        /* fp16 / bf16 tensors themselves: k / v alone in the fp32 decode path; q, k, v and out in the packed AMX
         * forward */
        const int decode_kv = sizeof(T) == sizeof(float) && decode_shape(p) && p->cpu_q_dtype == FLASH_FP32 &&
                              !p->cpu_o_half;
        if (!decode_kv && !FN(fwd_reads_half)(p))
            return FLASH_CPU_ERR_DTYPE;
    }
    if (decode_shape(p))
        return FN(decode_fwd)(p);
    return FN(run_tasks)(p, p->b * p->h * flash_cdiv64(p->sq, FLASH_CPU_TILE_Q), FN(fwd_task), NULL, PACK_FWD, 0);
}

/* delta[b][h][i] = dot(dout_i, o_i), in the data type, for the rows of every sequence. Returns the
 * number of rows whose lse needs renorm_rows. */
static int64_t FN(delta_rows)(const flash_params *p)
{
    const int64_t rows = p->b * p->h * p->sq;
    int64_t wide = 0;
#pragma omp parallel for schedule(static) reduction(+ : wide)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t i = r % p->sq, hq = r / p->sq % p->h, bi = r / (p->sq * p->h);
        const flash_seq seq = flash_seq_of(p, bi);
        if (i >= seq.sq)
            continue;
        const int64_t row = seq.q_row0 + i;
        const T *dout = (const T *)p->dout + bi * p->do_s.batch + row * p->do_s.row + hq * p->do_s.head;
        const T *o = (const T *)p->o + bi * p->o_s.batch + row * p->o_s.row + hq * p->o_s.head;
        T acc = 0;
        for (int64_t c = 0; c < p->d_v; c++)
            acc += dout[c] * o[c];
        const int64_t at = flash_lse_offset(p, &seq, bi, hq) + i;
        ((T *)p->delta)[at] = acc;
        wide += FABS(((const T *)p->lse)[at]) >= FLASH_LSE_RENORM_MIN && isfinite(((const T *)p->lse)[at]);
    }
    return wide;
}

/* sum_j exp(S_ij - lse_i) over the keys query row i of (bi, hq) sees, plus exp(sink - lse_i): 1 up to the
 * rounding of lse (renorm_rows). S by the score hook of score.h, element by element. */
static T FN(row_mass)(const flash_params *p, const flash_seq *seq, int64_t bi, int64_t hq, int64_t i, T lse)
{
    const int64_t hk = hq / p->h_per_kv;
    const T *q = (const T *)p->q + bi * p->q_s.batch + (seq->q_row0 + i) * p->q_s.row + hq * p->q_s.head;
    const T scale = (T)p->scale;
    const SC(flash_score) sc = SC(flash_score_of)(p, seq->alibi_offset, bi, hq, 1);
    T mass = EXP((T)flash_sink(p, hq) - lse);
    for (int64_t j = 0; j < seq->sk; j++) {
        if (!flash_visible(seq, i, j))
            continue;
        const T *k = (const T *)p->k + hk * p->k_s.head + flash_key_offset(p, seq, p->k_s.batch, p->k_s.row, j);
        T s = 0;
        for (int64_t c = 0; c < p->d; c++)
            s += q[c] * k[c];
        s *= scale;
        if (flash_score_capped(p))
            s = SC(flash_score_cap_out)(&sc, TANH(SC(flash_score_cap_in)(&sc, s)));
        s = SC(flash_score_element)(p, &sc, s, p->mask != NULL, bi, hq, i, j);
        mass += EXP(s - lse); /* 0 where a bool attn_mask hides the key */
    }
    return mass;
}

/* Rows with |lse| >= FLASH_LSE_RENORM_MIN: lse = m + log l rounds at the scale of the row maximum m, and a row
 * whose keys are all at finfo.min (Hugging Face's padding) has lse = m, so exp(S - lse) would give every
 * key 1 instead of 1 / l. Their P is multiplied by renorm = 1 / row_mass (exact probabilities again);
 * every other row's factor is 1. Returns the factors in the lse layout, or NULL with *st set on failure. */
static T *FN(renorm_rows)(const flash_params *p, flash_cpu_status *st)
{
    const int64_t n = p->b * p->lse_batch + p->h * p->lse_head; /* covers every flash_lse_offset + i */
    T *renorm = malloc((size_t)n * sizeof(T));
    if (!renorm) {
        *st = FLASH_CPU_ERR_NOMEM;
        return NULL;
    }
    for (int64_t e = 0; e < n; e++)
        renorm[e] = 1;
    const int64_t rows = p->b * p->h * p->sq;
#pragma omp parallel for schedule(dynamic)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t i = r % p->sq, hq = r / p->sq % p->h, bi = r / (p->sq * p->h);
        const flash_seq seq = flash_seq_of(p, bi);
        if (i >= seq.sq)
            continue;
        const int64_t at = flash_lse_offset(p, &seq, bi, hq) + i;
        const T lse = ((const T *)p->lse)[at];
        if (FABS(lse) >= FLASH_LSE_RENORM_MIN && isfinite(lse))
            renorm[at] = 1 / FN(row_mass)(p, &seq, bi, hq, i, lse);
    }
    return renorm;
}

static flash_cpu_status FN(bwd)(const flash_params *p)
{
    if (p->cpu_q_dtype != FLASH_FP32 || p->cpu_kv_dtype != FLASH_FP32)
        return FLASH_CPU_ERR_DTYPE; /* fp16 / bf16 inputs themselves: forwards only */
    flash_cpu_status st = FLASH_CPU_OK;
    T *renorm = FN(delta_rows)(p) ? FN(renorm_rows)(p, &st) : NULL;
    /* One pass (bwd_task: dQ with dK / dV, per (batch, kv head)) where its tasks fill the threads twice over and
     * its dQ accumulators stay small; else the dK/dV pass per key tile, then the dQ pass per query tile. */
    const int one_pass = p->b * p->h_kv >= 2 * (int64_t)omp_get_max_threads() &&
                         FN(dq_acc_elems)(p) * (int64_t)sizeof(T) <= FLASH_CPU_DQ_ACC_MAX_BYTES;
    if (st == FLASH_CPU_OK && one_pass)
        st = FN(run_tasks)(p, p->b * p->h_kv, FN(bwd_task), renorm, PACK_DKDV, 1);
    if (st == FLASH_CPU_OK && !one_pass)
        st = FN(run_tasks)(p, p->b * p->h_kv * flash_cdiv64(p->sk, FLASH_CPU_TILE_K), FN(dkdv_task), renorm,
                           PACK_DKDV, 0);
    if (st == FLASH_CPU_OK && !one_pass)
        st = FN(run_tasks)(p, p->b * p->h * flash_cdiv64(p->sq, FLASH_CPU_TILE_Q), FN(dq_task), renorm, PACK_DQ, 0);
    free(renorm);
    return st;
}

#endif /* FLASH_CPU_GENERIC_PASS */
