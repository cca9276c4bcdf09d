/* kv_append.cu: the CUDA append of new keys and values into a KV cache (csrc/kv_append.h), both caches in
 * one launch.
 *
 * The head rows of k (d elements) and of v (d_v elements) are cut into units of the same size, 16 bytes
 * where every address and stride of the cache and the new rows allows it (else 8, 4 or 2: kv_unit, decided
 * once per cache on the host from the pointers, strides and row bytes); one thread copies one unit, in a
 * grid-stride loop over (new row, head, unit of k then of v). Each thread finds its cache row through
 * flash_kv_append_row (cache_seqlens, cache_batch_idx or block_table read on the device, clamped there) and
 * writes nothing for a dropped row. One kernel for every dtype: it copies bytes.
 */
#include <stdint.h>

#include "../kv_append.h"
#include "launch.h"

static constexpr int kAppendThreads = 256; /* threads per CTA */
static constexpr int64_t kAppendMaxBlocks = 1 << 16;
static constexpr int64_t kMaxUnit = 16;    /* one 16-byte vector */

/* One unit of `unit` bytes (16, 8, 4 or 2), both addresses aligned to it. */
__device__ __forceinline__ void copy_unit(char *dst, const char *src, int64_t unit)
{
    switch (unit) {
    case 16: *(uint4 *)dst = __ldg((const uint4 *)src); break;
    case 8: *(uint2 *)dst = __ldg((const uint2 *)src); break;
    case 4: *(uint32_t *)dst = __ldg((const uint32_t *)src); break;
    default: *(uint16_t *)dst = __ldg((const unsigned short *)src); break;
    }
}

__global__ void __launch_bounds__(kAppendThreads)
flash_kv_append_kernel(const flash_kv_append_params p, int64_t k_unit, int64_t v_unit)
{
    const int64_t es = p.elem_size;
    const int64_t k_units = p.d * es / k_unit, v_units = p.d_v * es / v_unit, units = k_units + v_units;
    const int64_t total = p.batch * p.seqlen_new * p.nheads_kv * units;
    for (int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; x < total; x += (int64_t)gridDim.x * blockDim.x) {
        const int64_t u = x % units, rh = x / units;
        const int64_t h = rh % p.nheads_kv, row = rh / p.nheads_kv;
        const int64_t b = row / p.seqlen_new, i = row % p.seqlen_new;
        if (u < k_units) {
            const int64_t c = flash_kv_append_row(&p, b, i, p.k_cache_s.batch, p.k_cache_s.row);
            if (c >= 0)
                copy_unit((char *)p.k_cache + (c + h * p.k_cache_s.head) * es + u * k_unit,
                          (const char *)p.k + (b * p.k_s.batch + i * p.k_s.row + h * p.k_s.head) * es + u * k_unit,
                          k_unit);
        } else {
            const int64_t c = flash_kv_append_row(&p, b, i, p.v_cache_s.batch, p.v_cache_s.row);
            const int64_t o = (u - k_units) * v_unit;
            if (c >= 0)
                copy_unit((char *)p.v_cache + (c + h * p.v_cache_s.head) * es + o,
                          (const char *)p.v + (b * p.v_s.batch + i * p.v_s.row + h * p.v_s.head) * es + o, v_unit);
        }
    }
}

/* The largest unit of at most 16 bytes that divides a cache's and its new rows' addresses, strides (bytes)
 * and head row bytes: every unit of every row is then aligned to it. */
static int64_t kv_unit(const void *cache, const void *rows, flash_strides cs, flash_strides rs, int64_t d,
                       int64_t es)
{
    const int64_t x[] = {(int64_t)(uintptr_t)cache, (int64_t)(uintptr_t)rows, cs.batch * es, cs.row * es,
                         cs.head * es, rs.batch * es, rs.row * es, rs.head * es, d * es};
    int64_t unit = kMaxUnit;
    for (int j = 0; j < (int)(sizeof(x) / sizeof(x[0])); j++)
        while (x[j] % unit != 0)
            unit /= 2;
    return unit;
}

extern "C" cudaError_t flash_kv_append_cuda(const flash_kv_append_params *p, cudaStream_t stream)
{
    const int64_t es = p->elem_size;
    if (es != 2 && es != 4 && es != 8)
        return cudaErrorInvalidValue;
    const int64_t k_unit = kv_unit(p->k_cache, p->k, p->k_cache_s, p->k_s, p->d, es);
    const int64_t v_unit = kv_unit(p->v_cache, p->v, p->v_cache_s, p->v_s, p->d_v, es);
    if (k_unit < 2 || v_unit < 2)
        return cudaErrorMisalignedAddress;
    const int64_t units = p->d * es / k_unit + p->d_v * es / v_unit;
    const int64_t total = p->batch * p->seqlen_new * p->nheads_kv * units;
    if (total == 0)
        return cudaSuccess;
    const int64_t blocks = flash_min64((total + kAppendThreads - 1) / kAppendThreads, kAppendMaxBlocks);
    flash_kv_append_kernel<<<(unsigned)blocks, kAppendThreads, 0, stream>>>(*p, k_unit, v_unit);
    return cudaGetLastError();
}
