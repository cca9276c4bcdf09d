/* flash.h: the one parameter block passed from the binding (csrc/ops.cpp) to every kernel.
 *
 * Plain C, shared by the C11 CPU code and the CUDA kernels. The binding zero-fills it and fills it
 * once per call (flash_params_fill in ops.cpp); kernels only read it.
 *
 * Layouts (element strides, int64; the last dimension of every tensor has stride 1):
 *   q, dq          : (b, sq, h,    d)
 *   o, dout        : (b, sq, h,    d_v)
 *   k, dk          : (b, sk, h_kv, d)
 *   v, dv          : (b, sk, h_kv, d_v)
 *   lse, delta     : (b, h, sq)   read through lse_batch / lse_head (row stride 1); float for
 *                    fp16/bf16/fp32 inputs, double for fp64
 * Variable-length batches (cu_seqlens_q != NULL, flash_attn_varlen_func): b sequences packed along
 * the row dimension, batch strides 0; sequence s owns query rows [cu_seqlens_q[s], cu_seqlens_q[s+1])
 * and key rows [cu_seqlens_k[s], cu_seqlens_k[s+1]); sq / sk are max_seqlen_q / max_seqlen_k (the
 * grid), lse / delta are (h, total_q). With a block_table (forward only) k / v are a paged cache and
 * sequence s's keys are its first cu_seqlens_k[s+1] - cu_seqlens_k[s] rows through table row s (see
 * block_table). Kernels see one sequence through flash_seq_of (mask.h), which gives its lengths, first
 * rows and band; nothing else reads cu_seqlens or seqused_k.
 * Variants (csrc/mask.h is the one place that interprets these fields):
 *   mask geometry  key j is visible to query i iff diag_lo <= j - i <= diag_hi (causal in both
 *                  alignments, sliding windows); tiles outside the band are never loaded.
 *   score hook     on the scaled score s = scale * q.k, in this order: softcap, ALiBi, attn_mask.
 *   probability    dropout (Philox by counter, regenerated in the backward), sinks (an extra term
 *                  of each row's softmax denominator, applied in the forward's epilogue).
 * A row that sees no key has out = 0, lse = -inf (lse = sink with a sink) and zero gradients.
 */
#ifndef FLASHATTN_EXT_FLASH_H
#define FLASHATTN_EXT_FLASH_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum flash_dtype {
    FLASH_FP32 = 0,
    FLASH_FP64 = 1,
    FLASH_FP16 = 2,
    FLASH_BF16 = 3,
} flash_dtype;

/* Strides of one (b, s, h, d) tensor, in elements. */
typedef struct flash_strides {
    int64_t batch, row, head;
} flash_strides;

/* Strides of one (b, h, sq, sk) tensor, in elements; 0 on a broadcast dimension. */
typedef struct flash_strides4 {
    int64_t batch, head, row, col;
} flash_strides4;

typedef enum flash_mask_kind {
    FLASH_MASK_NONE = 0,
    FLASH_MASK_BOOL = 1, /* uint8 0/1 (torch.bool), 1 = the key takes part */
    FLASH_MASK_ADD = 2,  /* additive, in the dtype of q (-inf = the key is masked) */
} flash_mask_kind;

typedef struct flash_params {
    /* forward inputs / outputs */
    const void *q;          /* (b, sq, h, d)      */
    const void *k;          /* (b, sk, h_kv, d)   */
    const void *v;          /* (b, sk, h_kv, d_v) */
    void *o;                /* (b, sq, h, d_v)    */
    void *lse;              /* (b, h, sq) contiguous, float (double for fp64) */

    /* backward only */
    const void *dout;       /* (b, sq, h, d_v)    */
    void *dq;               /* (b, sq, h, d)      */
    void *dk;               /* (b, sk, h_kv, d)   */
    void *dv;               /* (b, sk, h_kv, d_v) */
    void *delta;            /* (b, h, sq) contiguous workspace, same type as lse: rowsum(dout * o)
                             * (with dropout o is the dropped output, which is what the formula needs) */
    float *dq_accum;        /* (b, h, sq, d) contiguous fp32 workspace (CUDA half paths), but in the tile order
                             * of the Hopper d > 128 backward where that runs (mask.h flash_dq_tiled_row0).
                             * Its size: launch.h flash_bwd_dq_accum_floats */
    float *dk_accum;        /* (b, sk, h, d) contiguous fp32 workspace, GQA only (CUDA half paths) */
    float *dv_accum;        /* (b, sk, h, d) contiguous fp32 workspace, GQA only (CUDA half paths) */

    flash_strides q_s, k_s, v_s, o_s, do_s, dq_s, dk_s, dv_s;

    int64_t b, h, h_kv, sq, sk, d;
    int64_t d_v;            /* head dim of v, o, dout, dv (d: that of q, k, dq, dk). The CPU kernels take any
                             * d_v; the CUDA kernels need d_v == d (ops_cuda.cpp pads the smaller to the larger) */
    int64_t h_per_kv;       /* h / h_kv */

    /* lse / delta element (b, hq, i) is at b * lse_batch + hq * lse_head + flash_seq.lse_row0 + i:
     * dense (h * sq, sq), varlen (0, total_q). dq_accum has d floats per lse element, same order. */
    int64_t lse_batch, lse_head;

    /* Variable-length batches and per-sequence key counts (mask.h flash_seq_of reads these). */
    const int32_t *cu_seqlens_q;  /* (b + 1) on the kernels' device, or NULL: dense batch */
    const int32_t *cu_seqlens_k;  /* (b + 1), non-NULL iff cu_seqlens_q is */
    const int32_t *seqused_k;     /* (b) or NULL: sequence s uses only its first seqused_k[s] keys */
    const int32_t *k_batch_idx;   /* (b) or NULL, dense only: sequence s reads batch k_batch_idx[s] of
                                   * k / v (flash_attn_with_kvcache's cache_batch_idx) */
    const int32_t *k_leftpad;     /* (b) or NULL, dense only: sequence s's keys are rows [k_leftpad[s],
                                   * seqused_k[s] or sk) (cache_leftpad) */
    int64_t k_batches;            /* batch size of k / v (k_batch_idx entries are clamped to it);
                                   * with a block_table: the number of pages */
    const int32_t *block_table;   /* (b, block_table_stride) or NULL (paged KV cache; no k_batch_idx):
                                   * k / v are (pages, page_size, h_kv, d) and key row r of sequence s
                                   * is row r % page_size of page block_table[s, r / page_size]; read
                                   * through flash_key_offset (mask.h) alone. Dense batches: rows from
                                   * k_leftpad[s]. Varlen batches (forward only, flash_attn_varlen_func's
                                   * block_table): rows 0 .. sk_s - 1, sk_s = cu_seqlens_k[s + 1] -
                                   * cu_seqlens_k[s] clamped to [0, block_table_stride * page_size] (the
                                   * table's capacity; total_k is not read) and to sk, then to seqused_k */
    int64_t block_table_stride;   /* entries per sequence (the table's second dimension) */
    int64_t page_size;            /* rows per page, a multiple of FLASH_PAGE_MULTIPLE (constants.h) */
    int64_t total_q, total_k;     /* rows of q and k (varlen; total_k unused with a block_table);
                                   * contents of the index tensors are clamped to them, so bad offsets
                                   * never address outside */

    double scale;           /* softmax scale applied to q.k */
    float scale_log2;       /* scale * log2(e), for exp2-based kernels */

    /* Mask geometry, per sequence (mask.h flash_seq_of turns it into the band diag_lo <= j - i <=
     * diag_hi of one sequence's lengths sq_s, sk_s): aligned at offset = band_bottom_right ? sk_s - sq_s
     * : 0, diag_lo = offset - band_left, diag_hi = offset + band_right; a negative band_left /
     * band_right is unbounded. causal: band_right = 0; window (left, right): those values. */
    int64_t band_left, band_right;
    int band_bottom_right;

    /* Score hook (mask.h), applied to s = scale * q.k in this order. has_hook = 1 when any of
     * softcap, alibi_slopes, mask or dropout is on: the kernels take their general path. */
    int has_hook;
    double softcap;               /* > 0: s = softcap * tanh(s / softcap); 0: off (double: exact for fp64) */
    const float *alibi_slopes;    /* (b or 1, h) fp32, or NULL: s -= slope * |j - i - (sk_s - sq_s)|
                                   * (flash-attn's bottom-right convention, per sequence) */
    int64_t alibi_batch_stride;   /* h when the slopes are per batch, else 0 */
    const void *mask;             /* attn_mask (b, h, sq, sk) read through mask_s, or NULL (always
                                   * NULL in a varlen batch, as are mask_blocks and dbias) */
    flash_mask_kind mask_kind;
    flash_strides4 mask_s;
    /* Per-block flags of the mask, blocks of FLASH_MASK_BLOCK x FLASH_MASK_BLOCK (constants.h):
     * (b, h, ceil(sq / 16), ceil(sk / 16)) uint8 read through mask_blocks_s, bits FLASH_MASK_ANY_*
     * (mask.h); computed once per call by the binding. NULL iff mask is NULL. */
    const uint8_t *mask_blocks;
    flash_strides4 mask_blocks_s;
    void *dbias;                  /* backward: (b, h, sq, sk) contiguous, lse type, zero-filled by the
                                   * binding; receives dS (the gradient of an additive mask) where
                                   * visible, or NULL */

    /* Probability hook. */
    const void *sink;             /* (h,) in the lse type, or NULL: each row's softmax denominator
                                   * gains exp(sink[h]) */
    uint64_t dropout_threshold;   /* 0: no dropout; else an element is kept iff its 32-bit Philox
                                   * draw is >= this: round(p 2^32) in [1, 2^32] (mask.h
                                   * flash_dropout_set; 2^32: nothing kept) */
    double dropout_scale;         /* 1 / (1 - p) of the user's p, in double (0 when nothing is
                                   * kept): kept values are scaled */
    uint64_t philox_seed, philox_offset;

    int deterministic;      /* 1: bitwise reproducible backward */
    flash_dtype dtype;

    /* Split-KV forward (Flash-Decoding; launch.h flash_fwd_splits): num_splits > 1 cuts each row block's key
     * tiles into that many slices, whose CTAs write the normalized partial out and its lse here; a combine
     * kernel merges them into o / lse. 0 or 1: no split (o_accum / lse_accum unused, may be NULL). */
    int num_splits;
    union {
        float *o_accum;     /* (num_splits, b, h, sq, d) contiguous fp32 workspace */
        void *dout_fix;     /* the CUDA backward: see below */
    };
    union {
        float *lse_accum;   /* (num_splits, b, h, sq) contiguous fp32 workspace */
        void *lse_fix;      /* the CUDA backward: see below */
    };

    /* The Hopper forward's dynamic tile scheduler (launch.h flash_fwd_wants_tile_counter): one int32, zero at
     * launch, that its persistent CTAs count work items off with atomicAdd; NULL: a static order. */
    int32_t *tile_counter;

    /* The CUDA backward with an additive attn_mask (score.h "Huge additive entries"; dout_fix NULL: off; the CPU
     * ignores these), in the slots of the forward's o_accum and lse_accum (no call needs both: the kernels'
     * parameter layout stays as it was): the preprocess reads dout and lse and writes dout_fix (dout's sizes
     * (b, sq, h, d) and dtype, contiguous: mask.h flash_dout_fix_strides) and lse_fix (lse's layout and type),
     * and delta = rowsum(dout_fix * o). fp16 / bf16 (rows.cu, huge_rows.cuh huge_row_fix): dout and lse, except in
     * a row whose maximum score is a huge entry, l of its keys at it: dout / l and sign * HUGE (score.h
     * flash_score_huge, a natural-unit lse: bwd_sm80.cu's P of a key at +-HUGE is then exactly 1, and bwd_sm90.cu
     * maps it to its units of mul, bwd_common.cuh lse_to_log2_hook). fp32 / fp64 (simple.cu): dout / mass in
     * a row with |lse| >= FLASH_LSE_RENORM_MIN (mass = sum_j exp(s_j - lse) + exp(sink - lse), as flash_cpu.c's
     * renorm_rows), dout elsewhere; lse_fix unused (the kernels keep lse). The main kernels then run with dout =
     * dout_fix, do_s = flash_dout_fix_strides (and, fp16 / bf16, lse = lse_fix). */

    /* Deterministic backward on Hopper (launch.h flash_bwd_wants_dq_semaphore): (b, h, cdiv(sq,
     * FLASH_DQ_SEM_ROWS)) int32 workspace, zeroed by the preprocess, through which the main kernel's CTAs
     * add their dQ partials of one query tile into dq_accum in a fixed order; NULL: the dQ kernel. */
    int32_t *dq_semaphore;

    /* T5's relative position bias (score.h step 2, in ALiBi's place; the C CPU path and the fp32 / fp64 CUDA
     * kernels, launch.h): s += rel_bias[hq, rel_buckets[clamp(j - i', -rel_range, rel_range) + rel_range]], i' =
     * i + (sk_s - sq_s) as ALiBi's. Kept last: the fields above keep their offsets in the CUDA kernels. */
    const void *rel_bias;         /* (h, rel_nb) contiguous, lse type, or NULL */
    const int32_t *rel_buckets;   /* (2 rel_range + 1,) the bucket of each relative position */
    int64_t rel_range, rel_nb;
    void *rel_bias_grad;          /* backward: (b, h, cdiv(sk, rel_grad_tile), rel_nb) contiguous, lse type,
                                   * zero-filled, or NULL: per key tile of rel_grad_tile keys, the sum of dS
                                   * (before the softcap factor) over the visible elements of each bucket */
    int64_t rel_grad_tile;        /* keys per partial of rel_bias_grad: the backward's key tile */

    /* The C CPU path: the dtype of the tensors whose fp32 copies q, k, v (and dout) are (FLASH_FP16 / FLASH_BF16:
     * the binding runs fp16 / bf16 calls on the fp32 kernels), else FLASH_FP32 (zero): with AMX, their
     * products run on bf16 tiles, exactly (cpu/amx.h). Kept last, as rel_bias. */
    flash_dtype cpu_src_dtype;
    /* The C CPU decode path (flash_cpu_decodes): FLASH_BF16 / FLASH_FP16 where k and v are the half tensors
     * themselves (strides in their elements) beside fp32 copies of q: their rows are widened per key block as they
     * are read, instead of the whole cache per call. Else FLASH_FP32 (zero): k and v hold the kernel's type. */
    flash_dtype cpu_kv_dtype;
    /* The C CPU forward on AMX that packs every key tile once per call (flash_cpu_fwd_reads_half): FLASH_BF16 /
     * FLASH_FP16 where q is that tensor itself (strides in its elements), read only as it is packed. Else
     * FLASH_FP32 (zero): q holds the kernel's type. */
    flash_dtype cpu_q_dtype;
    /* The same forward: where not NULL, out rounded to cpu_src_dtype (fp16 / bf16, as torch rounds), written beside
     * the fp32 out o with o's strides, so that the binding need not convert o afterwards. */
    void *cpu_o_half;
} flash_params;

#ifdef __cplusplus
}
#endif

#endif
