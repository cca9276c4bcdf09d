/* launch.cu: picks the kernel family from the dtype. Tile configurations by head dim are chosen
 * inside each family's file (fwd_sm80.cu, bwd_sm80.cu), next to the measurements that justify them. */
#include "launch.h"

extern "C" cudaError_t flash_fwd_cuda(const flash_params *p, cudaStream_t stream)
{
    if (p->dtype == FLASH_FP32 || p->dtype == FLASH_FP64)
        return flash_fwd_simple(p, stream);
    return flash_fwd_sm80(p, stream);
}

extern "C" cudaError_t flash_bwd_cuda(const flash_params *p, cudaStream_t stream)
{
    if (p->dtype == FLASH_FP32 || p->dtype == FLASH_FP64)
        return flash_bwd_simple(p, stream);
    return flash_bwd_sm80(p, stream);
}
