/* kv_append.c: the CPU append of new keys and values into a KV cache (csrc/kv_append.h), C11 + OpenMP.
 *
 * One task per new row (b, i): its cache rows in k_cache and v_cache (flash_kv_append_row; none when the
 * row is dropped), then one memcpy per head and cache. Tasks run on OpenMP threads only when the rows carry
 * at least FLASH_KV_APPEND_PARALLEL_BYTES (a decode step's few KB copy faster than a parallel region
 * starts).
 */
#include <string.h>

#include "../kv_append.h"

#define FLASH_KV_APPEND_PARALLEL_BYTES (1 << 20)

void flash_kv_append_cpu(const flash_kv_append_params *p)
{
    const int64_t rows = p->batch * p->seqlen_new;
    const int64_t es = p->elem_size;
    const size_t k_bytes = (size_t)(p->d * es), v_bytes = (size_t)(p->d_v * es);
    const int parallel = rows * p->nheads_kv * (p->d + p->d_v) * es >= FLASH_KV_APPEND_PARALLEL_BYTES;
    char *k_cache = (char *)p->k_cache, *v_cache = (char *)p->v_cache;
    const char *k = (const char *)p->k, *v = (const char *)p->v;
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t t = 0; t < rows; t++) {
        const int64_t b = t / p->seqlen_new, i = t % p->seqlen_new;
        const int64_t kc = flash_kv_append_row(p, b, i, p->k_cache_s.batch, p->k_cache_s.row);
        if (kc < 0)
            continue;
        const int64_t vc = flash_kv_append_row(p, b, i, p->v_cache_s.batch, p->v_cache_s.row);
        const int64_t kn = b * p->k_s.batch + i * p->k_s.row, vn = b * p->v_s.batch + i * p->v_s.row;
        for (int64_t h = 0; h < p->nheads_kv; h++) {
            memcpy(k_cache + (kc + h * p->k_cache_s.head) * es, k + (kn + h * p->k_s.head) * es, k_bytes);
            memcpy(v_cache + (vc + h * p->v_cache_s.head) * es, v + (vn + h * p->v_s.head) * es, v_bytes);
        }
    }
}
