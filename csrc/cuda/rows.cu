/* rows.cu: the arch-neutral row-wise kernels of the CUDA code: memory-bound passes of one thread (or an aligned
 * group of lanes) per row or per element, no tensor cores, one kernel each for all the dtypes it serves (its
 * threads take the body of the dtype, a uniform branch); speed is set by memory bandwidth.
 *
 * The backward's passes around the main kernels of bwd_sm80.cu and bwd_sm90.cu (fp16 / bf16; launch.cu calls
 * them in the order of launch.h):
 *   flash_bwd_pre (bwd_preprocess_kernel), grid (row blocks, h, b), a power of two of lanes per query row
 *   (row_lanes_log2: one per CHUNK columns): delta_i = rowsum(dO_i * O_i) in fp32; zeroes the row's dq_accum
 *   and, with p->dq_semaphore, its semaphore entry.
 *   With an additive attn_mask (p->dout_fix set; the kernel's FIX branch, the others keep their code): dO' = dO
 *   (dO / l in a row whose maximum score is a huge entry, huge_row_fix) into dout_fix, lse_fix, and delta_i =
 *   rowsum(dO'_i * O_i) of the rounded dO'.
 *   flash_bwd_dq_post (bwd_dq_post_kernel), the same grid: dq = scale * dq_accum in the dtype.
 *   Where Hopper's d > 128 kernel runs (launch.cu bwd_dq_tiled; dq_accum in its tile order, mask.h
 *   flash_dq_tiled_row0): flash_bwd_pre_tiled (bwd_preprocess_kernel, tiled = 1) zeroes whole tiles, and
 *   flash_bwd_dq_post_tiled (bwd_dq_post_kernel, tiled = 1), one CTA per tile, un-permutes through shared memory.
 *   One kernel per pass: its cases (tiled, FIX) are run-time branches uniform over the grid, not instantiations.
 *   flash_bwd_dkv_post (bwd_dkv_post_kernel), GQA only, one thread per CHUNK elements of a key row: dk, dv =
 *   the sums of dk_accum, dv_accum over the group's query heads, in head order.
 *   Around bwd_sm90.cu's main kernel (programmatic dependent launches, launch.h): each preprocess CTA lets it start
 *   at once (grid_dependency_trigger), and the dQ postprocess waits for its end (grid_dependency_wait) first thing.
 *   POST_THREADS threads per CTA. Varlen: each thread takes its sequence from flash_seq_of (mask.h); the grids
 *   span the longest sequence, rows past their sequence's end do nothing.
 *
 * The dropout keep mask of one call, materialized for return_attn_probs (a test aid on small shapes: it is
 * sq x sk per head): flash_dropout_mask_cuda (flash_mask_pass_kernel), keep (b, h, sq, sk) contiguous
 * uint8, keep[b, hq, i, j] = flash_dropout_keep(p, b * h + hq, i, j) (mask.h), for every (i, j) whatever the
 * band or attn_mask (the caller combines them). One thread per FLASH_DROPOUT_KEYS_PER_CALL keys of one row:
 * one flash_dropout_bits call gives all their draws. Grid-stride loop over the b * h * sq * ceil(sk / 4)
 * groups, kFlagThreads per CTA. Dense batches only: a varlen p (cu_seqlens_q set) is refused with
 * cudaErrorInvalidValue. Not measured.
 *
 * The attn_mask's block flags of one call (flash.h mask_blocks, mask.h), in one pass over the mask:
 * flash_mask_flags_cuda (flash_mask_pass_kernel). Flag (b', h', rb, cb) of the mask's own dimensions (mask.h
 * flash_mask_flag_dims: a broadcast dimension counts once) covers rows [16 rb, 16 rb + 16) and keys
 * [16 cb, 16 cb + 16) (FLASH_MASK_BLOCK; only the entries inside the mask): FLASH_MASK_ANY_VISIBLE if some
 * entry is visible (bool: true; additive: above -inf), FLASH_MASK_ANY_MASKED if some entry is masked (bool:
 * false; additive: not 0). The same flags as the binding's CPU reduction (ops.cpp mask_block_flags), written
 * contiguous to `blocks`. One thread per flag, a grid-stride loop, kFlagThreads per CTA; a row of 16 entries is
 * read as 16-byte vectors where it is contiguous, aligned and inside the mask (one 16-byte load per row for
 * bool, two for fp16 / bf16), else entry by entry through the strides; a block stops reading once both flags
 * are set. Not measured alone (bench_variants.py times it inside each masked call).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "../constants.h"
#include "../mask.h"
#include "common.cuh"
#include "huge_rows.cuh"
#include "launch.h"

/* ------------------------------------------------------------------------------------------------ */
/* the backward's row-wise passes: preprocess, dQ postprocess, dK / dV postprocess (GQA)            */

#define POST_THREADS 256 /* threads per block of the preprocess and postprocess kernels */

/* The row-wise kernels (preprocess, dQ postprocess) give each query row 2^row_lanes_log2(d) threads, one per
 * CHUNK columns rounded up to a power of two, at most a warp (a row's threads are an aligned group of lanes of one
 * warp; above d = 256 each takes every 32nd CHUNK of the row), and block x of the grid (row blocks, h, b) rows
 * [x R, x R + R), R = POST_THREADS >> row_lanes_log2(d), of query head y of batch z: index arithmetic in shifts,
 * every lane busy at d = 64, 128, 256, 512. */
__host__ __device__ inline int row_lanes_log2(int d)
{
    int lg = 0;
    while ((CHUNK << lg) < d && (1 << lg) < FLASH_WARP_SIZE)
        ++lg;
    return lg;
}

/* The row-wise kernels (preprocess, dQ and dK / dV postprocess) are memory-bound passes: one kernel each for
 * both 16-bit dtypes, whose threads take the body of p.dtype (a uniform branch; launched for fp16 / bf16 only)
 * instead of an instantiation per dtype. */

/* The mask of the aligned group of `lanes` lanes (a power of two <= 32) holding this lane. */
__device__ __forceinline__ unsigned group_mask(int lanes)
{
    const unsigned lane = threadIdx.x % FLASH_WARP_SIZE;
    return lanes == FLASH_WARP_SIZE ? FULL_MASK : ((1u << lanes) - 1u) << (lane & ~(unsigned)(lanes - 1));
}

/* One row of a (b, hq) per 2^lg threads (varlen: sq = max_seqlen_q, rows past the sequence's end do nothing;
 * they take part in the row's shuffles with a zero sum); thread l of the row reads CHUNK consecutive elements
 * of O and dO at columns CHUNK l, + CHUNK 2^lg, ... and zeroes float4 columns l, l + 2^lg, ... of the row's
 * dq_accum (where the main kernel adds dQ into it) and, at every FLASH_DQ_SEM_ROWS-th row, the row's dq_semaphore
 * entry. TILED (d > 128, mask.h flash_dq_tiled_row0): the zeroing is that of the tiled dq_accum instead, by the
 * threads of rows [sq, sq rounded up to FLASH_DQ_TILE_ROWS) too, each row's threads the 256 contiguous floats of the
 * row's index in the tiles (which hold values of other rows); the grid spans p->sq rounded up likewise. */
template <typename T, bool TILED = false, bool FIX = false>
__device__ __forceinline__ void preprocess_rows(const flash_params &p)
{
    const int d = (int)p.d, lg = row_lanes_log2(d), lanes = 1 << lg, lr = threadIdx.x & (lanes - 1);
    const int64_t i = (int64_t)blockIdx.x * (POST_THREADS >> lg) + (threadIdx.x >> lg), hq = blockIdx.y, b = blockIdx.z;
    const flash_seq s = flash_seq_of(&p, b);
    const bool live = i < s.sq;
    float sum = 0.f, inv_l = 1.f;
    if (FIX && live) { /* uniform over the row's lanes */
        const int64_t row = flash_lse_offset(&p, &s, b, hq) + i;
        float lse_fix;
        inv_l = huge_row_fix<T, float>(p, s, b, hq, i, ((const float *)p.lse)[row], lanes, lr, group_mask(lanes),
                                       &lse_fix);
        if (lr == 0)
            ((float *)p.lse_fix)[row] = lse_fix;
    }
    for (int c = lr * CHUNK; live && c < d; c += lanes * CHUNK) {
        const T *o = (const T *)p.o + b * p.o_s.batch + (s.q_row0 + i) * p.o_s.row + hq * p.o_s.head;       /* (d) */
        const T *dout = (const T *)p.dout + b * p.do_s.batch + (s.q_row0 + i) * p.do_s.row + hq * p.do_s.head; /* (d) */
        const uint4 ov = *(const uint4 *)(o + c);
        uint4 dv = *(const uint4 *)(dout + c);
        uint32_t ow[4] = {ov.x, ov.y, ov.z, ov.w}, dw[4] = {dv.x, dv.y, dv.z, dv.w};
        if (FIX) { /* dO' = dO / l rounded to T (a copy where inv_l = 1), written where the main kernels read it */
            if (inv_l != 1.f) {
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const float2 df = unpack2<T>(dw[k]);
                    dw[k] = pack2<T>(df.x * inv_l, df.y * inv_l);
                }
            }
            const flash_strides fs = flash_dout_fix_strides(&p);
            T *dfix = (T *)p.dout_fix + b * fs.batch + (s.q_row0 + i) * fs.row + hq * fs.head;
            *(uint4 *)(dfix + c) = make_uint4(dw[0], dw[1], dw[2], dw[3]);
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const float2 of = unpack2<T>(ow[k]), df = unpack2<T>(dw[k]);
            sum += of.x * df.x + of.y * df.y;
        }
    }
    for (int off = lanes / 2; off > 0; off /= 2)
        sum += __shfl_xor_sync(FULL_MASK, sum, off);
    if (TILED && i < flash_cdiv64(s.sq, FLASH_DQ_TILE_ROWS) * FLASH_DQ_TILE_ROWS &&
        (!p.deterministic || p.dq_semaphore != NULL)) {
        float4 *acc = (float4 *)(p.dq_accum + (flash_dq_tiled_row0(&p, &s, b, hq) + i) * FLASH_CUDA_MAX_HEAD_DIM);
        for (int c4 = lr; c4 < FLASH_CUDA_MAX_HEAD_DIM / 4; c4 += lanes)
            acc[c4] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    if (!live)
        return;
    const int64_t row = flash_lse_offset(&p, &s, b, hq) + i; /* of delta; dq_accum: times d */
    if (lr == 0)
        ((float *)p.delta)[row] = sum;
    if (!TILED && (!p.deterministic || p.dq_semaphore != NULL)) {
        float4 *acc = (float4 *)(p.dq_accum + row * d); /* (d / 4) */
        for (int c4 = lr; c4 < d / 4; c4 += lanes)
            acc[c4] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    if (p.dq_semaphore != NULL && lr == 0 && i % FLASH_DQ_SEM_ROWS == 0) {
        const int64_t sem_tiles = flash_dq_sem_tiles(&p);
        p.dq_semaphore[(b * p.h + hq) * sem_tiles + i / FLASH_DQ_SEM_ROWS] = 0;
    }
}

/* The tiled dq_accum exists only where bwd_sm90.cu's d > 128 kernel runs (launch.cu bwd_dq_tiled: Hopper, which
 * runs the sm_90a code): an arch pass below sm_90 compiles the tiled branches out, so that they do not set the
 * registers (occupancy) of its row branches (sm_80: the dQ postprocess 22 registers instead of 78). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define ROWS_TILED 0
#else
#define ROWS_TILED 1
#endif

/* The preprocess of dtype T for the case of the launch: the tiled dq_accum (the kernel argument `tiled`, set by
 * flash_bwd_pre_tiled) and an additive attn_mask (p.dout_fix set: dO', lse_fix, huge_row_fix), each a uniform
 * branch over the grid. */
template <typename T>
__device__ __forceinline__ void preprocess_case(const flash_params &p, int tiled)
{
    if (p.dout_fix != NULL) {
        if (ROWS_TILED && tiled)
            preprocess_rows<T, true, true>(p);
        else
            preprocess_rows<T, false, true>(p);
    } else {
        if (ROWS_TILED && tiled)
            preprocess_rows<T, true>(p);
        else
            preprocess_rows<T>(p);
    }
}

__global__ void __launch_bounds__(POST_THREADS) bwd_preprocess_kernel(const flash_params p, const int tiled)
{
    grid_dependency_trigger(); /* the sm90 main kernel may start (it waits before reading what this writes) */
    if (p.dtype == FLASH_BF16)
        preprocess_case<__nv_bfloat16>(p, tiled);
    else
        preprocess_case<__half>(p, tiled);
}

/* dq = dq_accum * scale, one row of a (b, hq) per 2^lg threads as the preprocess (varlen: rows past the
 * sequence's end do nothing); thread l of the row converts CHUNK consecutive elements at columns CHUNK l,
 * + CHUNK 2^lg, ... */
template <typename T>
__device__ __forceinline__ void dq_post_rows(const flash_params &p)
{
    const int d = (int)p.d, lg = row_lanes_log2(d), lanes = 1 << lg;
    const int64_t i = (int64_t)blockIdx.x * (POST_THREADS >> lg) + (threadIdx.x >> lg), hq = blockIdx.y, b = blockIdx.z;
    const flash_seq s = flash_seq_of(&p, b);
    if (i >= s.sq)
        return;
    const int64_t row = flash_lse_offset(&p, &s, b, hq) + i;
    const float scale = (float)p.scale;
    for (int c = (int)(threadIdx.x & (lanes - 1)) * CHUNK; c < d; c += lanes * CHUNK) {
        const float4 *src = (const float4 *)(p.dq_accum + row * d + c); /* (8) of dq_accum (lse layout, d) */
        const float4 x = src[0], y = src[1];
        uint4 out;
        out.x = pack2<T>(x.x * scale, x.y * scale);
        out.y = pack2<T>(x.z * scale, x.w * scale);
        out.z = pack2<T>(y.x * scale, y.y * scale);
        out.w = pack2<T>(y.z * scale, y.w * scale);
        *(uint4 *)((T *)p.dq + b * p.dq_s.batch + (s.q_row0 + i) * p.dq_s.row + hq * p.dq_s.head + c) = out;
    }
}

#define DQ_STAGE_LD (FLASH_CUDA_MAX_HEAD_DIM / 2 + 4) /* 32-bit words per row of dq_post_tile's staging tile: the
                                                       * + 4 makes its fragment-order stores conflict-free */

/* dq = dq_accum * scale from the tiled layout, one CTA per tile (FLASH_DQ_TILE_ROWS query rows of a (b, hq);
 * varlen: tiles past the sequence's end do nothing): each thread loads its 16 float4 of the tile at once, coalesced
 * (float4 q holds rows 16 (q % 128 / 32) + q % 32 / 4 and + 8, columns 8 (q / 128) + 2 (q % 4) and + 1; column
 * groups past d, padding, are not read), packs their pairs into the staging tile, then writes CHUNK consecutive
 * elements of a row at a time (rows below sq, columns below d). */
template <typename T>
__device__ __forceinline__ void dq_post_tile(const flash_params &p, uint32_t (*stage)[DQ_STAGE_LD])
{
    constexpr int R = FLASH_DQ_TILE_ROWS, C = FLASH_CUDA_MAX_HEAD_DIM, GROUP_V4 = R * 8 / 4; /* float4 per group */
    constexpr int NV4 = R * C / 4 / POST_THREADS, GSTEP = POST_THREADS / GROUP_V4; /* per thread; groups per pass */
    static_assert(POST_THREADS % GROUP_V4 == 0, "a thread's float4 share their rows");
    const int64_t m0 = (int64_t)blockIdx.x * R, hq = blockIdx.y, b = blockIdx.z;
    const flash_seq s = flash_seq_of(&p, b);
    if (m0 >= s.sq)
        return;
    const int d = (int)p.d, t = threadIdx.x;
    const int r = 16 * (t % GROUP_V4 / 32) + t % 32 / 4, g0 = t / GROUP_V4; /* rows r, r + 8; first group */
    const float scale = (float)p.scale;
    const float4 *src = (const float4 *)(p.dq_accum + (flash_dq_tiled_row0(&p, &s, b, hq) + m0) * C) + t;
    float4 x[NV4];
#pragma unroll
    for (int k = 0; k < NV4; ++k)
        x[k] = (g0 + GSTEP * k) * 8 < d ? src[k * POST_THREADS] : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int k = 0; k < NV4; ++k) {
        const int w = 4 * (g0 + GSTEP * k) + t % 4;
        stage[r][w] = pack2<T>(x[k].x * scale, x[k].y * scale);
        stage[r + 8][w] = pack2<T>(x[k].z * scale, x[k].w * scale);
    }
    __syncthreads();
    const int rows = (int)flash_min64(R, s.sq - m0);
    T *dq = (T *)p.dq + b * p.dq_s.batch + (s.q_row0 + m0) * p.dq_s.row + hq * p.dq_s.head;
#pragma unroll
    for (int k = 0; k < R * C / CHUNK / POST_THREADS; ++k) {
        const int e = k * POST_THREADS + t, r = e / (C / CHUNK), c = e % (C / CHUNK) * CHUNK;
        if (r < rows && c < d)
            *(uint4 *)(dq + r * p.dq_s.row + c) = *(const uint4 *)&stage[r][c / 2];
    }
}

#define DQ_STAGE_BYTES (FLASH_DQ_TILE_ROWS * DQ_STAGE_LD * 4) /* dq_post_tile's staging tile: dynamic shared memory
                                                              * of the tiled launches only (33 KB, under 48 KB) */

/* The dQ postprocess: the tiled dq_accum (the kernel argument `tiled`, set by flash_bwd_dq_post_tiled, a uniform
 * branch over the grid; its launch gives the DQ_STAGE_BYTES of the staging tile) or the row layout. */
__global__ void __launch_bounds__(POST_THREADS) bwd_dq_post_kernel(const flash_params p, const int tiled)
{
    extern __shared__ __align__(16) uint32_t dq_stage[];
    uint32_t(*stage)[DQ_STAGE_LD] = (uint32_t(*)[DQ_STAGE_LD])dq_stage;
    grid_dependency_wait(); /* pdl: the main kernel's dq_accum (every thread: this grid ends after that one) */
    if (ROWS_TILED && tiled) {
        if (p.dtype == FLASH_BF16)
            dq_post_tile<__nv_bfloat16>(p, stage);
        else
            dq_post_tile<__half>(p, stage);
    } else {
        if (p.dtype == FLASH_BF16)
            dq_post_rows<__nv_bfloat16>(p);
        else
            dq_post_rows<__half>(p);
    }
}

/* GQA: one thread per 8 consecutive elements of dk and dv (b, key j < sk, h_kv; varlen: keys past
 * the sequence's end do nothing): the sum over the group's query heads, in head order. */
template <typename T>
__device__ __forceinline__ void dkv_post_rows(const flash_params &p)
{
    const int64_t idx = (int64_t)blockIdx.x * POST_THREADS + threadIdx.x;
    const int d = (int)p.d, cpr = d / CHUNK;
    if (idx >= p.b * p.sk * p.h_kv * cpr)
        return;
    const int c = (int)(idx % cpr) * CHUNK;
    const int64_t row = idx / cpr, hk = row % p.h_kv, bj = row / p.h_kv, j = bj % p.sk, b = bj / p.sk;
    const flash_seq s = flash_seq_of(&p, b);
    if (j >= s.sk)
        return;
    const int64_t arow = flash_kaccum_row(&p, &s, b, j);
#pragma unroll
    for (int which = 0; which < 2; ++which) {
        const float *acc = which == 0 ? p.dk_accum : p.dv_accum; /* (rows, h, d) */
        const float *src = acc + (arow * p.h + hk * p.h_per_kv) * d + c;
        float v[CHUNK] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int64_t g = 0; g < p.h_per_kv; ++g) {
            const float4 x = ((const float4 *)(src + g * d))[0], y = ((const float4 *)(src + g * d))[1];
            v[0] += x.x; v[1] += x.y; v[2] += x.z; v[3] += x.w;
            v[4] += y.x; v[5] += y.y; v[6] += y.z; v[7] += y.w;
        }
        uint4 out;
        out.x = pack2<T>(v[0], v[1]);
        out.y = pack2<T>(v[2], v[3]);
        out.z = pack2<T>(v[4], v[5]);
        out.w = pack2<T>(v[6], v[7]);
        const flash_strides &os = which == 0 ? p.dk_s : p.dv_s;
        T *dst = (T *)(which == 0 ? p.dk : p.dv) + s.k_batch * os.batch + (s.k_row0 + j) * os.row + hk * os.head + c;
        *(uint4 *)dst = out;
    }
}

__global__ void __launch_bounds__(POST_THREADS) bwd_dkv_post_kernel(const flash_params p)
{
    if (p.dtype == FLASH_BF16)
        dkv_post_rows<__nv_bfloat16>(p);
    else
        dkv_post_rows<__half>(p);
}

static unsigned int blocks_for(int64_t items, int per_block)
{
    return (unsigned int)((items + per_block - 1) / per_block);
}

/* The grid of the row-wise kernels (preprocess, dQ postprocess): (row blocks, h, b). */
static dim3 row_grid(const flash_params *p)
{
    return dim3(blocks_for(p->sq, POST_THREADS >> row_lanes_log2((int)p->d)), (unsigned int)p->h, (unsigned int)p->b);
}

extern "C" cudaError_t flash_bwd_pre(const flash_params *p, cudaStream_t stream)
{
    if (p->b == 0 || p->h == 0 || p->sq == 0)
        return cudaSuccess;
    if (p->dtype != FLASH_BF16 && p->dtype != FLASH_FP16)
        return cudaErrorInvalidValue;
    bwd_preprocess_kernel<<<row_grid(p), POST_THREADS, 0, stream>>>(*p, 0);
    return cudaGetLastError();
}

/* The dQ postprocess's launch (grid x POST_THREADS, smem bytes of dynamic shared memory, the layout `tiled`) on
 * stream, programmatic where pdl (flash_launch_pdl). */
static cudaError_t launch_dq_post(const flash_params *p, dim3 grid, size_t smem, int tiled, int pdl,
                                  cudaStream_t stream)
{
    cudaLaunchAttribute attr;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(POST_THREADS);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    flash_launch_pdl(&cfg, &attr, pdl);
    return cudaLaunchKernelEx(&cfg, bwd_dq_post_kernel, *p, tiled);
}

extern "C" cudaError_t flash_bwd_dq_post(const flash_params *p, int pdl, cudaStream_t stream)
{
    if (p->b == 0 || p->h == 0 || p->sq == 0)
        return cudaSuccess;
    if (p->dtype != FLASH_BF16 && p->dtype != FLASH_FP16)
        return cudaErrorInvalidValue;
    return launch_dq_post(p, row_grid(p), 0, 0, pdl, stream);
}

extern "C" cudaError_t flash_bwd_pre_tiled(const flash_params *p, cudaStream_t stream)
{
    if (p->b == 0 || p->h == 0 || p->sq == 0)
        return cudaSuccess;
    if ((p->dtype != FLASH_BF16 && p->dtype != FLASH_FP16) || p->d <= 128 || p->d > FLASH_CUDA_MAX_HEAD_DIM)
        return cudaErrorInvalidValue;
    const int64_t rows = flash_cdiv64(p->sq, FLASH_DQ_TILE_ROWS) * FLASH_DQ_TILE_ROWS;
    const unsigned int row_blocks = blocks_for(rows, POST_THREADS >> row_lanes_log2((int)p->d));
    const dim3 grid(row_blocks, (unsigned int)p->h, (unsigned int)p->b);
    bwd_preprocess_kernel<<<grid, POST_THREADS, 0, stream>>>(*p, 1);
    return cudaGetLastError();
}

extern "C" cudaError_t flash_bwd_dq_post_tiled(const flash_params *p, int pdl, cudaStream_t stream)
{
    if (p->b == 0 || p->h == 0 || p->sq == 0)
        return cudaSuccess;
    if ((p->dtype != FLASH_BF16 && p->dtype != FLASH_FP16) || p->d <= 128 || p->d > FLASH_CUDA_MAX_HEAD_DIM)
        return cudaErrorInvalidValue;
    const dim3 grid(blocks_for(p->sq, FLASH_DQ_TILE_ROWS), (unsigned int)p->h, (unsigned int)p->b);
    return launch_dq_post(p, grid, DQ_STAGE_BYTES, 1, pdl, stream);
}

extern "C" cudaError_t flash_bwd_dkv_post(const flash_params *p, cudaStream_t stream)
{
    const unsigned int blocks = blocks_for(p->b * p->sk * p->h_kv * (p->d / CHUNK), POST_THREADS);
    if (p->h == p->h_kv || blocks == 0)
        return cudaSuccess;
    if (p->dtype != FLASH_BF16 && p->dtype != FLASH_FP16)
        return cudaErrorInvalidValue;
    bwd_dkv_post_kernel<<<blocks, POST_THREADS, 0, stream>>>(*p);
    return cudaGetLastError();
}

/* ------------------------------------------------------------------------------------------------ */
/* the dropout keep mask (return_attn_probs)                                                        */

/* The keep mask's pass (flash_mask_pass_kernel's body where it is launched with FLASH_PASS_DROPOUT). */
__device__ __forceinline__ void dropout_mask_of(const flash_params &p, uint8_t *keep /* (b, h, sq, sk) */)
{
    const int64_t groups_per_row = flash_cdiv64(p.sk, FLASH_DROPOUT_KEYS_PER_CALL);
    const uint32_t cut = flash_dropout_cut(&p); /* kept iff draw > cut */
    const int64_t groups = p.b * p.h * p.sq * groups_per_row;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < groups; t += stride) {
        const int64_t c = t % groups_per_row, row = t / groups_per_row; /* row = (b * h + hq) * sq + i */
        const int64_t i = row % p.sq, bh = row / p.sq;
        uint32_t bits[4];
        flash_dropout_bits(&p, bh, i, c, bits);
        const int64_t j0 = c * FLASH_DROPOUT_KEYS_PER_CALL;
        uint8_t *out = keep + row * p.sk + j0; /* keys [j0, j0 + 4) of (sk): key j0 + jj is draw jj */
#pragma unroll
        for (int jj = 0; jj < FLASH_DROPOUT_KEYS_PER_CALL; ++jj)
            if (j0 + jj < p.sk)
                out[jj] = bits[jj] > cut;
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* the attn_mask block flags                                                                        */

static constexpr int kFlagThreads = 256;       /* threads per CTA (of the keep mask's pass too) */
enum { FLASH_PASS_FLAGS, FLASH_PASS_DROPOUT }; /* flash_mask_pass_kernel's `what` */
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

/* One kernel for the keep mask's pass and the flags' of the five entry types (passes over memory): its threads
 * take the body of `what` and the mask's type (uniform branches; launched for a bool or an additive mask of dtype
 * fp16 / bf16 / fp32 / fp64). out: the keep mask (b, h, sq, sk), or the flags (flash_mask_flag_dims, contiguous). */
__global__ void __launch_bounds__(kFlagThreads, kFlagMinCtas)
flash_mask_pass_kernel(const flash_params p, uint8_t *out, const int what)
{
    if (what == FLASH_PASS_DROPOUT)
        dropout_mask_of(p, out);
    else if (p.mask_kind == FLASH_MASK_BOOL)
        mask_flags_of<uint8_t>(p, out);
    else if (p.dtype == FLASH_FP16)
        mask_flags_of<__half>(p, out);
    else if (p.dtype == FLASH_BF16)
        mask_flags_of<__nv_bfloat16>(p, out);
    else if (p.dtype == FLASH_FP32)
        mask_flags_of<float>(p, out);
    else
        mask_flags_of<double>(p, out);
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
    flash_mask_pass_kernel<<<ctas, kFlagThreads, 0, stream>>>(*p, blocks, FLASH_PASS_FLAGS);
    return cudaGetLastError();
}

extern "C" cudaError_t flash_dropout_mask_cuda(const flash_params *p, uint8_t *keep, cudaStream_t stream)
{
    if (p->cu_seqlens_q != NULL)
        return cudaErrorInvalidValue;
    if (p->b == 0 || p->h == 0 || p->sq == 0 || p->sk == 0)
        return cudaSuccess;
    const int64_t groups = p->b * p->h * p->sq * flash_cdiv64(p->sk, FLASH_DROPOUT_KEYS_PER_CALL);
    const int64_t ctas = flash_min64(flash_cdiv64(groups, kFlagThreads), FLASH_MAX_GRID_YZ);
    flash_mask_pass_kernel<<<(unsigned)ctas, kFlagThreads, 0, stream>>>(*p, keep, FLASH_PASS_DROPOUT);
    return cudaGetLastError();
}
