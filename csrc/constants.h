/* constants.h: the numbers every part of the core shares (C CPU code, CUDA kernels, the binding). */
#ifndef FLASHATTN_EXT_CONSTANTS_H
#define FLASHATTN_EXT_CONSTANTS_H

#define FLASH_WARP_SIZE 32
#define FLASH_LOG2E 1.4426950408889634
#define FLASH_LOG2E_F 1.4426950408889634f
/* largest head dim of the fp16 / bf16 CUDA kernels (the CPU path has no limit) */
#define FLASH_CUDA_MAX_HEAD_DIM 256
/* largest head dim of the fp16 / bf16 CUDA forward (fwd_sm80.cu's d512 config, 227 KB of shared memory per block:
 * Hopper; not paged) and backward (bwd_sm80.cu's, Hopper; not deterministic mode) */
#define FLASH_CUDA_FWD_MAX_HEAD_DIM 512
#define FLASH_CUDA_BWD_MAX_HEAD_DIM 512
/* largest head dim of the fp32 / fp64 CUDA kernels (simple.cu) */
#define FLASH_CUDA_SIMPLE_MAX_HEAD_DIM 512
/* rows and columns of one block of the attn_mask block flags (mask.h) */
#define FLASH_MASK_BLOCK 16
/* page sizes of a paged KV cache (flash_params.block_table) are multiples of this many rows */
#define FLASH_PAGE_MULTIPLE 16
/* the fp16/bf16 forward takes the decode kernel (fwd_decode.cu) when seqlen_q * (nheads / nheads_kv) is at
 * most this (the rows that share one KV head) */
#define FLASH_DECODE_MAX_ROWS 64
/* query rows per entry of the deterministic backward's dQ semaphores (flash_params.dq_semaphore): the
 * smallest query tile of the kernels that order their dQ additions */
#define FLASH_DQ_SEM_ROWS 64
/* query rows per tile of dq_accum's tiled layout (mask.h flash_dq_tiled_row0; launch.cu
 * bwd_dq_tiled): the query tile of bwd_sm90.cu's d > 128 kernel */
#define FLASH_DQ_TILE_ROWS 64
/* largest grid dimension y or z of a CUDA launch (batch and nheads index them), and the CTA cap of the kernels
 * whose loops stride over the rest */
#define FLASH_MAX_GRID_YZ 65535
/* the fp32 / fp64 backward (flash_cpu.c renorm_rows, simple.cu's delta kernel) renormalizes the
 * probabilities of rows whose finite |lse| is at least this: lse holds log l only to an ulp of the row maximum,
 * 2^-13 of fp32's, beyond fp32's tolerance from here on */
#define FLASH_LSE_RENORM_MIN 1024

#endif
