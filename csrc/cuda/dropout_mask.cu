/* dropout_mask.cu: the dropout keep mask of one call, materialized for return_attn_probs (a test aid
 * on small shapes: it is sq x sk per head).
 *
 * keep (b, h, sq, sk) contiguous uint8: keep[b, hq, i, j] = flash_dropout_keep(p, b * h + hq, i, j)
 * (mask.h), for every (i, j) whatever the band or attn_mask (the caller combines them). One thread per
 * FLASH_DROPOUT_KEYS_PER_DRAW keys of one row: one flash_dropout_bits call gives all their draws.
 * Grid-stride loop over the b * h * sq * ceil(sk / 8) groups. Speed is not a goal; not measured.
 * Dense batches only: a varlen p (cu_seqlens_q set) is refused with cudaErrorInvalidValue.
 */
#include <stdint.h>

#include "../mask.h"
#include "launch.h"

static constexpr int kMaskThreads = 256;       /* threads per CTA */

__global__ void __launch_bounds__(kMaskThreads)
flash_dropout_mask_kernel(const flash_params p, uint8_t *keep /* (b, h, sq, sk) */)
{
    const int64_t groups_per_row = flash_cdiv64(p.sk, FLASH_DROPOUT_KEYS_PER_DRAW);
    const int64_t groups = p.b * p.h * p.sq * groups_per_row;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < groups; t += stride) {
        const int64_t c = t % groups_per_row, row = t / groups_per_row; /* row = (b * h + hq) * sq + i */
        const int64_t i = row % p.sq, bh = row / p.sq;
        uint32_t bits[4];
        flash_dropout_bits(&p, bh, i, c, bits);
        const int64_t j0 = c * FLASH_DROPOUT_KEYS_PER_DRAW;
        uint8_t *out = keep + row * p.sk + j0; /* keys [j0, j0 + 8) of (sk): key j0 + jj is draw jj */
#pragma unroll
        for (int jj = 0; jj < FLASH_DROPOUT_KEYS_PER_DRAW; ++jj)
            if (j0 + jj < p.sk)
                out[jj] = flash_dropout_draw(bits, jj) >= p.dropout_threshold;
    }
}

extern "C" cudaError_t flash_dropout_mask_cuda(const flash_params *p, uint8_t *keep, cudaStream_t stream)
{
    if (p->cu_seqlens_q != NULL)
        return cudaErrorInvalidValue;
    if (p->b == 0 || p->h == 0 || p->sq == 0 || p->sk == 0)
        return cudaSuccess;
    const int64_t groups = p->b * p->h * p->sq * flash_cdiv64(p->sk, FLASH_DROPOUT_KEYS_PER_DRAW);
    const int64_t ctas = flash_min64(flash_cdiv64(groups, kMaskThreads), FLASH_MAX_GRID_YZ);
    flash_dropout_mask_kernel<<<(unsigned)ctas, kMaskThreads, 0, stream>>>(*p, keep);
    return cudaGetLastError();
}
