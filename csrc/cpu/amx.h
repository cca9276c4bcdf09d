/* amx.h: the fp32 CPU kernels' matrix products (flash_cpu.c gemm) on Intel AMX tiles (or AVX512-BF16 dot
 * products, the same arithmetic: FLASH_AMX_DP) when the call's inputs are fp16 / bf16 tensors (the binding's fp32
 * copies hold their values exactly). A tile product multiplies bf16
 * numbers exactly and adds in fp32, so an fp32 operand split into bf16 terms that sum to it exactly (by
 * truncation: 1 term for a bf16 value, 2 for an fp16 value, 3 for any fp32 value) gives the fp32 product up to
 * the order of the additions: the results stay those of the fp32 kernels (tests/test_cpu_half.py), only faster.
 * One exception: with bf16 inputs the forward's P V takes P in 2 terms (flash_amx_softmax_pack: 16 significant
 * bits, the second term rounded to nearest), as far below out's rounding to bf16 as torch's CPU SDPA, which rounds
 * P to bf16, is above it. x86-64 Linux with gcc >= 11 or clang >= 14; elsewhere flash_amx_usable() is 0. */
#ifndef FLASHATTN_EXT_CPU_AMX_H
#define FLASHATTN_EXT_CPU_AMX_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The backend of the products, 0 where none (FLASHATTN_EXT_CPU_AMX, read per call: "0" none, "dp" FLASH_AMX_DP
 * even where tiles exist): FLASH_AMX_TILES where the CPU has AMX-BF16 and the kernel lets this process use the
 * tile state (arch_prctl ARCH_REQ_XCOMP_PERM, asked once), else FLASH_AMX_DP where it has AVX512-BF16 (VDPBF16PS,
 * e.g. AMD Zen 4: the same packed operands and products, 16 columns per instruction). */
#define FLASH_AMX_TILES 1
#define FLASH_AMX_DP 2
int flash_amx_usable(void);
/* The backends this CPU and kernel allow (FLASH_AMX_TILES | FLASH_AMX_DP bits), whatever FLASHATTN_EXT_CPU_AMX says. */
int flash_amx_backends(void);

/* uint16 elements of the scratch for packing one product's A and B (three terms each at most) with m, n, k up to
 * max_m, max_n, max_k. */
int64_t flash_amx_scratch_elems(int64_t max_m, int64_t max_n, int64_t max_k);

/* uint16 elements of one term of a packed operand of rows x cols (zero-padded to multiples of 32). */
static inline int64_t flash_amx_packed_elems(int64_t rows, int64_t cols)
{
    return (rows + 31) / 32 * 32 * ((cols + 31) / 32 * 32);
}

/* Pack A (m, k), a(i, kk) = a[i * a_rs + kk * a_ks] (any layout), or B (k, n) row-major with leading dimension
 * ldb, into parts consecutive terms of flash_amx_packed_elems(m, k) / (k, n) elements each (dst 64-byte
 * aligned). parts: the bf16 terms each value splits into exactly (1: bf16 values, 2: fp16 values, 3: any fp32
 * value). */
void flash_amx_pack_a(uint16_t *dst, int parts, int64_t m, int64_t k, const float *a, int64_t a_rs, int64_t a_ks);
void flash_amx_pack_b(uint16_t *dst, int parts, int64_t k, int64_t n, const float *b, int64_t ldb);
/* pack_a of 16-bit values as they are (one term: bf16 values, or any 16-bit pattern), from row pointers (NULL: a
 * zero row), without widening: A (m, k) with A[i][kk] = rows[i][kk] (flash_amx_pack_a_rows16), or A = rows^T with
 * A[i][kk] = rows[kk][i] for i < m_valid, zero for m_valid <= i < m (flash_amx_pack_at_rows16; 16 x 16 transposes
 * of the pairs). rows has ROUND32(m) (resp. ROUND32(k)) entries. */
void flash_amx_pack_a_rows16(uint16_t *dst, int64_t m, int64_t k, const uint16_t *const *rows);
void flash_amx_pack_at_rows16(uint16_t *dst, int64_t m, int64_t m_valid, int64_t k, const uint16_t *const *rows);

/* The forward's online-softmax step on an S^T tile fused with the packing of P^T as the B operand of O^T += V^T P^T:
 * s (kn key rows x cols query columns, leading dim ld; masked entries -inf) times scale (> 0) are the scores; per
 * query column u the running max m[u] (natural units; -inf before any key) moves only when the tile's max passes it
 * by 8 ln 2 (so P <= 2^8: no overflow, the same result after the final division by l), l[u] = alpha[u] l[u] + sum
 * of the column's exp(score - m[u]), and P^T is packed as flash_amx_pack_b would pack it (k = kn, n = cols, a
 * multiple of 32; parts terms: 3 keep P exact). Returns the groups of 16 columns (bit g: columns 16 g .. 16 g + 15)
 * where some alpha[u] != 1 (the caller rescales those columns of its accumulator by alpha, flash_amx_scale_columns;
 * alpha[u] = 1 elsewhere), 0 when none. */
uint32_t flash_amx_softmax_pack(const float *s, int64_t kn, int64_t cols, int64_t ld, float scale, float *m, float *l,
                                float *alpha, uint16_t *dst, int parts);

/* acc (rows x 16-column groups, leading dim ld): the columns of every group g set in groups (bit g: columns
 * 16 g .. 16 g + 15) times alpha, row by row (the online softmax's rescale of its accumulator). alpha must be 1 in
 * the groups below the highest one set that are not set (flash_amx_softmax_pack's): those pass through it too. */
void flash_amx_scale_columns(float *acc, int64_t ld, int64_t rows, uint32_t groups, const float *alpha);

/* pack_b of B = rows^T (k, n): B[kk][j] = rows[j * rs + kk] for j < n_valid (zero for n_valid <= j < n), i.e. the
 * transposed operand packed straight from its rows (16 x 16 transposes of bf16 pairs); rows of float values, or of
 * fp16 / bf16 ones (kind; rs in elements of that type). */
enum { FLASH_AMX_SRC_FP32 = 0, FLASH_AMX_SRC_BF16 = 1, FLASH_AMX_SRC_FP16 = 2 };
void flash_amx_pack_b_rows(uint16_t *dst, int parts, int64_t k, int64_t n, const void *rows, int kind, int64_t rs,
                           int64_t n_valid);

/* o[u * o_rs + c] = acc[c * ld + u] * factor[u] for c < rows, u < cols (16 x 16 transposes); where oh is not
 * NULL, also oh[u * o_rs + c] = that value rounded to nearest even in oh_kind (FLASH_AMX_SRC_BF16: NaN as 0x7FC0;
 * FLASH_AMX_SRC_FP16), as torch's conversion rounds it. */
void flash_amx_store_rows(float *o, int64_t o_rs, const float *acc, int64_t ld, int64_t rows, int64_t cols,
                          const float *factor, uint16_t *oh, int oh_kind);

/* c (m, n) = [c +] A B of operands packed as above (a_parts * b_parts tile products per step), c row-major with
 * leading dimension ldc; any m, n, k >= 1. Runs under the tile configuration that flash_amx_begin loads in the
 * calling thread; flash_amx_end releases the tile state after the thread's last product. Only where
 * flash_amx_usable() said 1. */
void flash_amx_gemm_packed(int64_t m, int64_t n, int64_t k, const uint16_t *ap, int a_parts, const uint16_t *bp,
                           int b_parts, float *c, int64_t ldc, int accumulate);
void flash_amx_begin(void);
void flash_amx_end(void);

#ifdef __cplusplus
}
#endif

#endif
