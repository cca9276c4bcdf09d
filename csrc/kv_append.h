/* kv_append.h: the append of new keys and values into a KV cache (flash_attn_with_kvcache's k, v; the op
 * flashattn_ext::kv_append), shared by the binding (csrc/ops.cpp, csrc/ops_cuda.cpp), the C11 CPU loop
 * (csrc/cpu/kv_append.c) and the CUDA kernel (csrc/cuda/kv_append.cu).
 *
 * Row i of sequence b (new k[b, i], v[b, i], every head) goes to cache row r = start[b] + i, start[b] =
 * cache_seqlens[b] clamped to [0, seqlen_k]; rows r >= seqlen_k (the rows a sequence can reach) are dropped,
 * never written. Row r of sequence b is, in a dense cache, row r of cache batch cache_batch_idx[b] (default
 * b; entries clamped to [0, cache_batches - 1]); in a paged cache, row r % page_size of page
 * block_table[b, r / page_size] (entries clamped to [0, cache_batches - 1], the pages). Elements are copied
 * as bytes (any dtype of elem_size bytes); every stride is in elements, the last one (head dim) 1.
 * Sequences whose rows land on the same cache row (duplicate cache_batch_idx entries, shared pages) race:
 * each element of that row ends up with the value one of them wrote (which one is unspecified).
 */
#ifndef FLASHATTN_EXT_KV_APPEND_H
#define FLASHATTN_EXT_KV_APPEND_H

#include <stddef.h>
#include <stdint.h>

#include "flash.h"
#include "mask.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct flash_kv_append_params {
    void *k_cache, *v_cache;            /* (cache_batches, cache_rows, nheads_kv, d / d_v) */
    const void *k, *v;                  /* (batch, seqlen_new, nheads_kv, d / d_v) */
    flash_strides k_cache_s, v_cache_s; /* batch (page), row, head strides */
    flash_strides k_s, v_s;
    const int32_t *cache_seqlens;       /* (batch,) */
    const int32_t *cache_batch_idx;     /* (batch,) or NULL: sequence b writes cache batch b (dense only) */
    const int32_t *block_table;         /* (batch, max_pages) through table_s0 / table_s1, or NULL: dense */
    int64_t table_s0, table_s1;
    int64_t batch, seqlen_new, nheads_kv, d, d_v;
    int64_t cache_batches;              /* dimension 0 of the caches: batches, or pages (>= 1) */
    int64_t page_size;                  /* dimension 1 of a paged cache (rows per page); unused when dense */
    int64_t seqlen_k;                   /* rows a sequence can reach: seqlen_cache, or max_pages * page_size */
    int64_t elem_size;                  /* bytes per element: 2, 4 or 8 */
} flash_kv_append_params;

/* Element offset of the cache row (head 0, channel 0) that new row i of sequence b goes to, with the
 * cache's batch (page) stride bs and row stride rs; -1 when the row is dropped (past seqlen_k). */
FLASH_HD int64_t flash_kv_append_row(const flash_kv_append_params *p, int64_t b, int64_t i, int64_t bs, int64_t rs)
{
    const int64_t r = flash_clamp64(p->cache_seqlens[b], 0, p->seqlen_k) + i;
    if (r >= p->seqlen_k)
        return -1;
    if (p->block_table) {
        const int64_t page = flash_clamp64(p->block_table[b * p->table_s0 + (r / p->page_size) * p->table_s1], 0,
                                           p->cache_batches - 1);
        return page * bs + (r % p->page_size) * rs;
    }
    const int64_t cb = p->cache_batch_idx ? flash_clamp64(p->cache_batch_idx[b], 0, p->cache_batches - 1) : b;
    return cb * bs + r * rs;
}

/* The C11 CPU append (csrc/cpu/kv_append.c), OpenMP over the new rows when they are many. */
void flash_kv_append_cpu(const flash_kv_append_params *p);

#ifdef __cplusplus
}
#endif

#endif
