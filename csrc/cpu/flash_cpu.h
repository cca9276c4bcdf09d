/* flash_cpu.h: the C11 CPU entry points (csrc/cpu/flash_cpu.c), called by the binding (csrc/ops.cpp).
 *
 * flash_fwd_cpu and flash_bwd_cpu dispatch on p->dtype: FLASH_FP32 (float data, float lse/delta) and
 * FLASH_FP64 (double data, double lse/delta); other dtypes return FLASH_CPU_ERR_DTYPE. They run on the
 * OpenMP threads the runtime gives, allocate only O(tile * max(d, d_v)) workspace per thread (the decode
 * forward, sq <= 8: O(h / h_kv * sq * (d + d_v + 64)) per thread and, with key splits, per task), and return
 * the first error met (FLASH_CPU_OK otherwise). Any head dims d (q, k) and d_v (v, o), equal or not, with no
 * upper limit. Every variant of flash_params is supported (band,
 * softcap, ALiBi, attn_mask, dropout, sinks: csrc/mask.h), dense and variable-length batches,
 * seqused_k, and the KV-cache fields (k_batch_idx, k_leftpad, a paged cache's block_table); layouts
 * and strides: see csrc/flash.h.
 */
#ifndef FLASHATTN_EXT_FLASH_CPU_H
#define FLASHATTN_EXT_FLASH_CPU_H

#include "../flash.h"

/* Query rows and key rows per tile. Any positive values work (they need not divide the sequence
 * lengths); overriding them with -D is meant for the test harness only. */
#ifndef FLASH_CPU_TILE_Q
#define FLASH_CPU_TILE_Q 128
#endif
#ifndef FLASH_CPU_TILE_K
#define FLASH_CPU_TILE_K 64
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum flash_cpu_status {
    FLASH_CPU_OK = 0,
    FLASH_CPU_ERR_DTYPE = 1,   /* p->dtype is not FLASH_FP32 / FLASH_FP64 */
    FLASH_CPU_ERR_NOMEM = 2,   /* the per-thread workspace could not be allocated */
} flash_cpu_status;

/* Forward: reads q, k, v; writes o and lse (in a varlen batch: the rows of the sequences only). */
flash_cpu_status flash_fwd_cpu(const flash_params *p);

/* 1 when flash_fwd_cpu takes the decode path for p (few query rows, no dropout; FLASHATTN_EXT_DISABLE_DECODE=1
 * says no): the only forward that reads fp16 / bf16 k / v (p->cpu_kv_dtype); the others refuse them. */
int flash_cpu_decodes(const flash_params *p);

/* 1 when flash_fwd_cpu's prefill path for p (not decode; fp16 / bf16 inputs, p->cpu_src_dtype) packs every key
 * tile once per call for the AMX products, the rows of q, k and v read only as they are packed: it then takes them
 * as the fp16 / bf16 tensors themselves (p->cpu_q_dtype, p->cpu_kv_dtype), widening the rows as it packs them. */
int flash_cpu_fwd_reads_half(const flash_params *p);

/* Backward: reads q, k, v, o, lse, dout; writes dq, dk, dv (every element of every sequence, zeros
 * included; in a varlen batch nothing outside the sequences' rows and seqused_k keys).
 * p->delta must point to a caller-allocated buffer of the lse type and layout (lse_batch, lse_head);
 * its rows of every sequence are overwritten with rowsum(dout * o). dq_accum, dk_accum, dv_accum are
 * not used. With p->dbias set (zero-filled by the caller), its visible entries receive dS, the
 * gradient of an additive mask; the gradient of the sinks is left to the caller (from lse and delta). */
flash_cpu_status flash_bwd_cpu(const flash_params *p);

/* The dropout mask of a dense p (dropout_threshold, philox_seed, philox_offset): keep (b, h, sq, sk)
 * contiguous, 1 where flash_dropout_keep (mask.h) keeps the element, else 0; all 1 without dropout.
 * The same bits as every kernel's dropout, whatever the band or attn_mask. */
flash_cpu_status flash_dropout_mask_cpu(const flash_params *p, uint8_t *keep);

/* The block flags of p's attn_mask (flash.h mask_blocks; mask_kind, mask, mask_s, b, h, sq, sk set; an additive
 * mask's entries of mask_dtype FLASH_FP32 / FLASH_FP64, else FLASH_CPU_ERR_DTYPE): blocks (mask.h
 * flash_mask_flag_dims' sizes, contiguous), one pass over the mask, each block's read stopping once both flags are
 * set; as rows.cu's flash_mask_flags_cuda on the GPU. */
flash_cpu_status flash_mask_flags_cpu(const flash_params *p, int mask_dtype, uint8_t *blocks);

#ifdef __cplusplus
}
#endif

#endif
