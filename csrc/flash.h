/* flash.h: the one parameter block passed from the binding (csrc/ops.cpp) to every kernel.
 *
 * Plain C, shared by the C11 CPU code and the CUDA kernels. The binding zero-fills it and fills it
 * once per call (flash_params_fill in ops.cpp); kernels only read it.
 *
 * Layouts (element strides, int64; the last dimension of every tensor has stride 1):
 *   q, o, dout, dq : (b, sq, h,    d)
 *   k, v, dk, dv   : (b, sk, h_kv, d)
 *   lse, delta     : (b, h, sq)   contiguous; float for fp16/bf16/fp32 inputs, double for fp64
 * Causal masking: query row i sees key j iff j <= i + causal_offset.
 *   bottom-right alignment (flash_attn_func):  causal_offset = sk - sq
 *   top-left alignment (torch SDPA is_causal): causal_offset = 0
 * A row that sees no key has out = 0, lse = -inf and zero gradients.
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

typedef struct flash_params {
    /* forward inputs / outputs */
    const void *q;          /* (b, sq, h, d)    */
    const void *k;          /* (b, sk, h_kv, d) */
    const void *v;          /* (b, sk, h_kv, d) */
    void *o;                /* (b, sq, h, d)    */
    void *lse;              /* (b, h, sq) contiguous, float (double for fp64) */

    /* backward only */
    const void *dout;       /* (b, sq, h, d)    */
    void *dq;               /* (b, sq, h, d)    */
    void *dk;               /* (b, sk, h_kv, d) */
    void *dv;               /* (b, sk, h_kv, d) */
    void *delta;            /* (b, h, sq) contiguous workspace, same type as lse: rowsum(dout * o) */
    float *dq_accum;        /* (b, h, sq, d) contiguous fp32 workspace (CUDA half paths) */
    float *dk_accum;        /* (b, sk, h, d) contiguous fp32 workspace, GQA only (CUDA half paths) */
    float *dv_accum;        /* (b, sk, h, d) contiguous fp32 workspace, GQA only (CUDA half paths) */

    flash_strides q_s, k_s, v_s, o_s, do_s, dq_s, dk_s, dv_s;

    int64_t b, h, h_kv, sq, sk, d;
    int64_t h_per_kv;       /* h / h_kv */

    double scale;           /* softmax scale applied to q.k */
    float scale_log2;       /* scale * log2(e), for exp2-based kernels */

    int causal;             /* 0 or 1 */
    int64_t causal_offset;  /* key j visible to query i iff j <= i + causal_offset */

    int deterministic;      /* 1: bitwise reproducible backward */
    flash_dtype dtype;
} flash_params;

#ifdef __cplusplus
}
#endif

#endif
