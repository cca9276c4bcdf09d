/* launch.h: the plain-C entry points of the CUDA kernels, called by the binding (csrc/ops_cuda.cpp).
 * Each launches on `stream`, allocates nothing, never synchronizes the host, and returns the first
 * CUDA error met (cudaSuccess otherwise). The params block is described in csrc/flash.h. */
#ifndef FLASHATTN_EXT_LAUNCH_H
#define FLASHATTN_EXT_LAUNCH_H

#include <cuda_runtime.h>

#include "../flash.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Forward: writes o and lse. Dispatches on dtype: fp16/bf16 -> tensor-core kernel (fwd_sm80.cu),
 * fp32/fp64 -> CUDA-core tiled kernel (fwd_simple.cu). */
cudaError_t flash_fwd_cuda(const flash_params *p, cudaStream_t stream);
cudaError_t flash_fwd_sm80(const flash_params *p, cudaStream_t stream);
cudaError_t flash_fwd_simple(const flash_params *p, cudaStream_t stream);

/* Backward: reads q, k, v, o, lse, dout; writes dq, dk, dv; uses the workspaces named in flash.h. */
cudaError_t flash_bwd_cuda(const flash_params *p, cudaStream_t stream);
cudaError_t flash_bwd_sm80(const flash_params *p, cudaStream_t stream);
cudaError_t flash_bwd_simple(const flash_params *p, cudaStream_t stream);

/* Shared memory per CTA that the fp16/bf16 forward and backward need at head dim p->d (the backward's
 * smallest tiles), and what the current device offers (opt-in limit, capped by
 * FLASHATTN_EXT_SMEM_LIMIT); the binding reports a clear error when short. */
size_t flash_fwd_smem_needed(const flash_params *p);
size_t flash_bwd_smem_needed(const flash_params *p);
size_t flash_smem_available(void);

/* Hopper main backward kernel (bwd_sm90.cu), used by flash_bwd_sm80 in place of its own main kernel
 * when flash_bwd_sm90_supported(p): an sm_90a build (FLASHATTN_EXT_SM90A), an sm_90 device, fp16/bf16,
 * d <= 256, and FLASHATTN_EXT_DISABLE_SM90 unset. */
int flash_bwd_sm90_supported(const flash_params *p);
cudaError_t flash_bwd_main_sm90(const flash_params *p, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
