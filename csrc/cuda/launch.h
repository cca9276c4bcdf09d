/* launch.h: the plain-C entry points of the CUDA code. The binding (csrc/ops_cuda.cpp) calls only
 * flash_fwd_cuda / flash_bwd_cuda / flash_dropout_mask_cuda / flash_mask_flags_cuda and the shared-memory
 * queries; launch.cu, the one dispatcher, picks dtype -> arch -> tile configuration -> variant and calls the
 * family entry points below. Each launches on `stream`, allocates nothing, never synchronizes the host, and
 * returns the first CUDA error met (cudaSuccess otherwise). The params block is described in csrc/flash.h, the
 * variants in csrc/mask.h. Within a family, p->has_hook selects the general (score / probability hook) kernels.
 * Dense and variable-length batches (p->cu_seqlens_q) take the same entry points: grids cover p->sq /
 * p->sk (in varlen the max lengths) and each block finds its sequence through mask.h flash_seq_of. So do
 * KV caches (flash_attn_with_kvcache: seqused_k, k_batch_idx, k_leftpad, a paged block_table, forward
 * only), whose key rows the kernels address through flash_key_offset; p->sk is then the rows of the
 * cache a sequence can reach (max_pages * page_size when paged). */
#ifndef FLASHATTN_EXT_LAUNCH_H
#define FLASHATTN_EXT_LAUNCH_H

#include <cuda_runtime.h>

#include "../flash.h"
#include "../kv_append.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- called by the binding ---- */

/* Forward: writes o and lse. */
cudaError_t flash_fwd_cuda(const flash_params *p, cudaStream_t stream);
/* The number of key splits the forward of p will run (Flash-Decoding): 1 = none; n > 1: the binding sets
 * p->num_splits = n and passes the workspaces o_accum / lse_accum of csrc/flash.h. requested: the user's
 * num_splits (flash_attn_with_kvcache), 0 = chosen from the SM count and the sizes. Host only, no sync. */
int flash_fwd_splits(const flash_params *p, int requested);
/* 1 where the forward of p runs fwd_sm90.cu's dynamic tile scheduler: the binding then passes a zeroed int32
 * in p->tile_counter (csrc/flash.h). Host only, no sync. */
int flash_fwd_wants_tile_counter(const flash_params *p);
/* 1 where the backward of p adds its dQ partials in a fixed order (deterministic mode, Hopper's main kernels
 * but the d > 128 variants: bwd_sm90.cu flash_bwd_sm90_orders_dq) instead of running the dQ kernel: the binding then passes the int32 workspace
 * p->dq_semaphore of csrc/flash.h. Host only, no sync. */
int flash_bwd_wants_dq_semaphore(const flash_params *p);
/* Floats of the dq_accum workspace (csrc/flash.h) that the backward of p needs: b h sq d (varlen h total_q d),
 * or flash_dq_tiled_floats where it keeps the tiled layout. Host only, no sync. */
int64_t flash_bwd_dq_accum_floats(const flash_params *p);
/* Backward: reads q, k, v, o, lse, dout; writes dq, dk, dv (and dbias, rel_bias_grad if set); uses the
 * workspaces named in flash.h. */
cudaError_t flash_bwd_cuda(const flash_params *p, cudaStream_t stream);
/* T5's relative position bias (p->rel_bias, flash.h) runs on the fp32 / fp64 kernels only: flash_fwd_cuda and
 * flash_bwd_cuda return cudaErrorInvalidValue for it in fp16 / bf16. flash_bwd_rel_grad_tile: the keys per
 * partial of p->rel_bias_grad (flash.h rel_grad_tile) that the backward of p takes, which sizes that zero-filled
 * workspace (b, h, cdiv(sk, tile), rel_nb); 0 where the backward of p takes no rel_bias. Host only, no sync. */
int64_t flash_bwd_rel_grad_tile(const flash_params *p);
/* The kernel files (static strings; NULL: none yet) that the process's last flash_fwd_cuda and flash_bwd_cuda
 * launched (any host thread: autograd's included) (python -m flashattn_ext reports them per device). */
void flash_last_kernels(const char **fwd, const char **bwd);
/* keep (b, h, sq, sk) contiguous uint8: 1 where dropout keeps P[b, h, i, j] (mask.h; rows.cu), for
 * return_attn_probs. */
cudaError_t flash_dropout_mask_cuda(const flash_params *p, uint8_t *keep, cudaStream_t stream);

/* The KV-cache append (csrc/kv_append.h, kv_append.cu; also called by the binding): new keys and values into
 * both caches in one launch; cudaErrorMisalignedAddress when an address is not aligned to its element size. */
cudaError_t flash_kv_append_cuda(const flash_kv_append_params *p, cudaStream_t stream);

/* blocks (mask.h flash_mask_flag_dims, contiguous uint8): the block flags of the attn_mask p->mask (its kind,
 * strides, and dtype p->dtype when additive; sizes b, h, sq, sk), in one pass on the device (rows.cu). */
cudaError_t flash_mask_flags_cuda(const flash_params *p, uint8_t *blocks, cudaStream_t stream);

/* Shared memory per CTA that the fp16/bf16 forward and backward need at head dim p->d (the smallest
 * tiles that launch.cu would pick; SIZE_MAX where no kernel of this build runs it on the current device: the
 * d512 backward's clusters off Hopper), and what the current device offers (opt-in limit, capped by
 * FLASHATTN_EXT_SMEM_LIMIT); the binding reports a clear error when short. */
size_t flash_fwd_smem_needed(const flash_params *p);
size_t flash_bwd_smem_needed(const flash_params *p);
size_t flash_smem_available(void);

/* ---- family entry points, called by launch.cu only ---- */

/* Programmatic dependent launch (common.cuh grid_dependency_trigger / grid_dependency_wait), for the family
 * launchers: sets cfg's attributes (attr: their storage) to cudaLaunchAttributeProgrammaticStreamSerialization
 * where pdl and the current device takes it (sm90+), else to none. The kernel launched by
 * cudaLaunchKernelEx(cfg, ...) may then start before the previous kernel in the stream has finished. Host only. */
void flash_launch_pdl(cudaLaunchConfig_t *cfg, cudaLaunchAttribute *attr, int pdl);

/* Tile configurations of a family at one head dim: the large ones need sm90's 227 KB of shared
 * memory, the small ones fit an A100 (and sm86/sm89 up to d = 128). */
typedef enum flash_tiles {
    FLASH_TILES_LARGE = 0,
    FLASH_TILES_SMALL = 1,
} flash_tiles;

/* fp32 / fp64 on CUDA cores (simple.cu), T5's rel_bias included; flash_bwd_simple_rel_grad_tile:
 * the rel_grad_tile that flash_bwd_simple takes. */
cudaError_t flash_fwd_simple(const flash_params *p, cudaStream_t stream);
cudaError_t flash_bwd_simple(const flash_params *p, cudaStream_t stream);
int64_t flash_bwd_simple_rel_grad_tile(void);

/* fp16 / bf16 forward of a few rows per KV head (decode) with split-KV, sm80+ (fwd_decode.cu).
 * flash_fwd_decode_ok: p is one it serves (no attn_mask, no dropout, no varlen, seqlen_q * h / h_kv <=
 * FLASH_DECODE_MAX_ROWS); flash_fwd_decode_smem: the least shared memory per CTA it runs with (its fewest warps;
 * it takes as many as the device's shared memory holds); flash_fwd_decode_splits: the
 * split count for `requested` (0: fill the num_sms SMs' CTA slots, FA2's wave-efficiency rule). */
int flash_fwd_decode_ok(const flash_params *p);
size_t flash_fwd_decode_smem(const flash_params *p);
int flash_fwd_decode_splits(const flash_params *p, int requested, int num_sms);
cudaError_t flash_fwd_decode(const flash_params *p, cudaStream_t stream);

/* fp16 / bf16 forward on wgmma + TMA, sm_90a builds on Hopper (fwd_sm90.cu). flash_fwd_sm90_ok: p is one it
 * serves (no paged KV cache, no split-KV, aligned strides, a positive scale; attn_mask and dropout up to head
 * dim 128); flash_fwd_sm90_smem: its shared memory per CTA. */
int flash_fwd_sm90_ok(const flash_params *p);
size_t flash_fwd_sm90_smem(const flash_params *p);
/* 1 where it schedules its work items dynamically given p->tile_counter (varlen batches of the dense
 * kernel; else one CTA per query tile). */
int flash_fwd_sm90_dynamic(const flash_params *p);
cudaError_t flash_fwd_sm90(const flash_params *p, cudaStream_t stream);

/* fp16 / bf16 forward on mma.sync, sm80+ (fwd_sm80.cu). */
cudaError_t flash_fwd_sm80(const flash_params *p, cudaStream_t stream);
size_t flash_fwd_sm80_smem(const flash_params *p);

/* fp16 / bf16 backward, in this order (launch.cu):
 *   flash_bwd_pre                delta = rowsum(dout * o), dq_accum = 0, dq_semaphore = 0  (rows.cu)
 *                                (flash_bwd_pre_tiled where dq_accum is tiled, below)
 *   flash_bwd_main_sm90 (Hopper) or flash_bwd_main_sm80: dK, dV (and dQ partials into dq_accum unless
 *                                deterministic without dq_semaphore)     (bwd_sm90.cu / bwd_sm80.cu)
 *   flash_bwd_sm80_dq            deterministic without dq_semaphore: the dQ kernel   (bwd_sm80.cu)
 *   or flash_bwd_dq_post         dq = scale * dq_accum                                (rows.cu)
 *                                (flash_bwd_dq_post_tiled where dq_accum is tiled)
 *   flash_bwd_dkv_post           GQA only: dk, dv = sums of dk_accum, dv_accum over each group (rows.cu)
 * Where flash_bwd_main_sm90 runs, it and flash_bwd_dq_post(_tiled) are programmatic dependent launches
 * (flash_launch_pdl): each may start once every CTA of the kernel before it has started (grid_dependency_trigger)
 * and touches what that kernel writes only after grid_dependency_wait (common.cuh), in every thread, so that its
 * end implies the earlier kernels' (those launched after it, normally, rely on that).
 * flash_bwd_sm80_check validates what these kernels require of p (alignment, strides, head dim):
 * cudaErrorInvalidValue when unmet. flash_bwd_sm80_smem: shared memory of the sm80 main and dQ kernels
 * with tiles t at head dim p->d (SIZE_MAX: none runs on the current device). */
cudaError_t flash_bwd_sm80_check(const flash_params *p);
size_t flash_bwd_sm80_smem(const flash_params *p, flash_tiles t);
cudaError_t flash_bwd_pre(const flash_params *p, cudaStream_t stream);
cudaError_t flash_bwd_main_sm80(const flash_params *p, flash_tiles t, cudaStream_t stream);
cudaError_t flash_bwd_main_sm90(const flash_params *p, cudaStream_t stream);
/* 1 where flash_bwd_main_sm90 serves deterministic mode with ordered dQ additions (p->dq_semaphore). */
int flash_bwd_sm90_orders_dq(const flash_params *p);
cudaError_t flash_bwd_sm80_dq(const flash_params *p, flash_tiles t, cudaStream_t stream);
/* pdl: a programmatic dependent launch (flash_launch_pdl; flash_bwd_main_sm90 before it) */
cudaError_t flash_bwd_dq_post(const flash_params *p, int pdl, cudaStream_t stream);
/* flash_bwd_pre and flash_bwd_dq_post for the tiled dq_accum, wherever bwd_sm90.cu's d > 128 kernel runs (launch.cu
 * bwd_dq_tiled): that kernel adds dQ into dq_accum in its tile order (mask.h flash_dq_tiled_row0), one float4
 * red.add per accumulator quad at a per-thread base plus constant offsets, with no shuffles and no bounds (the
 * tiles are padded). */
cudaError_t flash_bwd_pre_tiled(const flash_params *p, cudaStream_t stream);
cudaError_t flash_bwd_dq_post_tiled(const flash_params *p, int pdl, cudaStream_t stream);
cudaError_t flash_bwd_dkv_post(const flash_params *p, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
