/* mask_flags.cu: the attn_mask's block flags of one call (flash.h mask_blocks, mask.h), in one pass over
 * the mask on the device.
 *
 * Flag (b', h', rb, cb) of the mask's own dimensions (mask.h flash_mask_flag_dims: a broadcast dimension
 * counts once) covers rows [16 rb, 16 rb + 16) and keys [16 cb, 16 cb + 16) (FLASH_MASK_BLOCK; only the
 * entries inside the mask): FLASH_MASK_ANY_VISIBLE if some entry is visible (bool: true; additive: above
 * -inf), FLASH_MASK_ANY_MASKED if some entry is masked (bool: false; additive: not 0). The same flags as
 * the binding's CPU reduction (ops.cpp mask_block_flags), written contiguous to `blocks`.
 * One thread per flag, a grid-stride loop; a row of 16 entries is read as 16-byte vectors where it is
 * contiguous, aligned and inside the mask (one 16-byte load per row for bool, two for fp16 / bf16), else
 * entry by entry through the strides; a block stops reading once both flags are set. Not measured alone
 * (bench_variants.py times it inside each masked call).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "../mask.h"
#include "launch.h"

static constexpr int kFlagThreads = 256;       /* threads per CTA */
static constexpr int kVecBytes = 16;           /* one vector load */
/* CTAs per SM that the register budget leaves room for: the five entry types' bodies in one kernel need no more
 * registers than the bool one alone (48, no spills; without the bound 64) */
static constexpr int kFlagMinCtas = 5;

/* The flags of one entry: bool (stored as uint8) or additive in the dtype of q. */
__device__ __forceinline__ unsigned entry_flags(uint8_t x)
{
    return x ? FLASH_MASK_ANY_VISIBLE : FLASH_MASK_ANY_MASKED;
}
__device__ __forceinline__ unsigned value_flags(double x)
{
    return (x > -INFINITY ? FLASH_MASK_ANY_VISIBLE : 0u) | (x != 0.0 ? FLASH_MASK_ANY_MASKED : 0u);
}
__device__ __forceinline__ unsigned entry_flags(__half x) { return value_flags(__half2float(x)); }
__device__ __forceinline__ unsigned entry_flags(__nv_bfloat16 x) { return value_flags(__bfloat162float(x)); }
__device__ __forceinline__ unsigned entry_flags(float x) { return value_flags(x); }
__device__ __forceinline__ unsigned entry_flags(double x) { return value_flags(x); }

/* The pass over a mask of entry type T. */
template <typename T>
__device__ __forceinline__ void mask_flags_of(const flash_params &p, uint8_t *blocks)
{
    constexpr unsigned kBoth = FLASH_MASK_ANY_VISIBLE | FLASH_MASK_ANY_MASKED;
    int64_t dims[4];
    flash_mask_flag_dims(&p, dims);
    const int64_t rows = p.mask_s.row ? p.sq : 1, cols = p.mask_s.col ? p.sk : 1;
    const int64_t n = dims[0] * dims[1] * dims[2] * dims[3];
    const T *mask = (const T *)p.mask;
    for (int64_t f = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; f < n; f += (int64_t)gridDim.x * blockDim.x) {
        const int64_t cb = f % dims[3], rb = f / dims[3] % dims[2], hb = f / (dims[3] * dims[2]) % dims[1];
        const int64_t bb = f / (dims[3] * dims[2] * dims[1]);
        const int64_t r0 = rb * FLASH_MASK_BLOCK, c0 = cb * FLASH_MASK_BLOCK;
        const int64_t r1 = flash_min64(r0 + FLASH_MASK_BLOCK, rows), c1 = flash_min64(c0 + FLASH_MASK_BLOCK, cols);
        const T *base = mask + bb * p.mask_s.batch + hb * p.mask_s.head;
        unsigned flags = 0;
        for (int64_t r = r0; r < r1 && flags != kBoth; r++) {
            const T *row = base + r * p.mask_s.row + c0 * p.mask_s.col;
            if (p.mask_s.col == 1 && c1 - c0 == FLASH_MASK_BLOCK && (uintptr_t)row % kVecBytes == 0) {
                uint4 v[FLASH_MASK_BLOCK * sizeof(T) / kVecBytes];
#pragma unroll
                for (int i = 0; i < (int)(FLASH_MASK_BLOCK * sizeof(T) / kVecBytes); i++)
                    v[i] = __ldg((const uint4 *)row + i);
                const T *x = (const T *)v;
#pragma unroll
                for (int c = 0; c < FLASH_MASK_BLOCK; c++)
                    flags |= entry_flags(x[c]);
            } else {
                for (int64_t c = 0; c < c1 - c0; c++)
                    flags |= entry_flags(row[c * p.mask_s.col]);
            }
        }
        blocks[f] = (uint8_t)flags;
    }
}

/* One kernel for the five entry types (a pass over the mask, memory-bound): its threads take the body of the
 * mask's type (a uniform branch; launched for a bool or an additive mask of dtype fp16 / bf16 / fp32 / fp64). */
__global__ void __launch_bounds__(kFlagThreads, kFlagMinCtas)
flash_mask_flags_kernel(const flash_params p, uint8_t *blocks /* flash_mask_flag_dims, contiguous */)
{
    if (p.mask_kind == FLASH_MASK_BOOL)
        mask_flags_of<uint8_t>(p, blocks);
    else if (p.dtype == FLASH_FP16)
        mask_flags_of<__half>(p, blocks);
    else if (p.dtype == FLASH_BF16)
        mask_flags_of<__nv_bfloat16>(p, blocks);
    else if (p.dtype == FLASH_FP32)
        mask_flags_of<float>(p, blocks);
    else
        mask_flags_of<double>(p, blocks);
}

extern "C" cudaError_t flash_mask_flags_cuda(const flash_params *p, uint8_t *blocks, cudaStream_t stream)
{
    if (p->mask == NULL || (p->mask_kind != FLASH_MASK_BOOL && p->mask_kind != FLASH_MASK_ADD))
        return cudaErrorInvalidValue;
    int64_t dims[4];
    flash_mask_flag_dims(p, dims);
    const int64_t n = dims[0] * dims[1] * dims[2] * dims[3];
    if (n == 0 || p->sq == 0 || p->sk == 0)
        return cudaSuccess;
    const unsigned ctas = (unsigned)flash_min64(flash_cdiv64(n, kFlagThreads), FLASH_MAX_GRID_YZ);
    if (p->mask_kind == FLASH_MASK_ADD && p->dtype != FLASH_FP16 && p->dtype != FLASH_BF16 &&
        p->dtype != FLASH_FP32 && p->dtype != FLASH_FP64)
        return cudaErrorInvalidValue;
    flash_mask_flags_kernel<<<ctas, kFlagThreads, 0, stream>>>(*p, blocks);
    return cudaGetLastError();
}
