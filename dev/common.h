/* common.h: what the torch-free harnesses (dev/bwd_harness.cu, dev/fwd_harness.cu) share: CUDA_CHECK, the dtype
 * helpers (names, sizes, tolerances, element conversion), the poison byte, the size, scale and dropout fields of
 * flash_params as the binding fills them, and the timing of a launch (median of CUDA events, L2 flushed before
 * each timed run). Built with nvcc, included once per harness. */
#ifndef FLASHATTN_EXT_DEV_COMMON_H
#define FLASHATTN_EXT_DEV_COMMON_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "flash.h"
#include "mask.h"

#define CUDA_CHECK(x)                                                                                 \
    do {                                                                                              \
        cudaError_t err_ = (x);                                                                       \
        if (err_ != cudaSuccess) {                                                                    \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(err_));     \
            exit(2);                                                                                  \
        }                                                                                             \
    } while (0)

/* Outputs and workspaces are filled with these bytes before a run: all-ones is a NaN in every float format. */
static const unsigned char kPoison = 0xff;

static inline const char *dtype_name(flash_dtype t)
{
    return t == FLASH_FP64 ? "fp64" : t == FLASH_FP32 ? "fp32" : t == FLASH_FP16 ? "fp16" : "bf16";
}

static inline size_t elem_size(flash_dtype t)
{
    return t == FLASH_FP64 ? 8 : t == FLASH_FP32 ? 4 : 2;
}

/* The dtype of lse (and of the backward's delta) for inputs of dtype t. */
static inline flash_dtype lse_type(flash_dtype t)
{
    return t == FLASH_FP64 ? FLASH_FP64 : FLASH_FP32;
}

/* Largest relative L2 error of an output against the double reference. */
static inline double tolerance(flash_dtype t)
{
    return t == FLASH_FP64 ? 1e-12 : t == FLASH_FP32 ? 1e-5 : t == FLASH_FP16 ? 2e-3 : 1e-2;
}

/* Rounds x to the element type, stores it at dst[i], returns the rounded value. */
static inline double store_elem(void *dst, size_t i, flash_dtype t, double x)
{
    switch (t) {
    case FLASH_FP64: ((double *)dst)[i] = x; return x;
    case FLASH_FP32: ((float *)dst)[i] = (float)x; return (float)x;
    case FLASH_FP16: ((__half *)dst)[i] = __double2half(x); return __half2float(((__half *)dst)[i]);
    default: ((__nv_bfloat16 *)dst)[i] = __double2bfloat16(x); return __bfloat162float(((__nv_bfloat16 *)dst)[i]);
    }
}

static inline double load_elem(const void *src, size_t i, flash_dtype t)
{
    switch (t) {
    case FLASH_FP64: return ((const double *)src)[i];
    case FLASH_FP32: return ((const float *)src)[i];
    case FLASH_FP16: return __half2float(((const __half *)src)[i]);
    default: return __bfloat162float(((const __nv_bfloat16 *)src)[i]);
    }
}

static inline double round_to(flash_dtype t, double v)
{
    unsigned char tmp[8];
    return store_elem(tmp, 0, t, v);
}

/* The size and scale fields of p for a dense batch (b, sq, h, d) queries against (b, sk, h_kv, d) keys, lse
 * (b, h, sq); scale 0: 1 / sqrt(d). The pointers, strides, band and variants are the caller's. */
static inline void fill_sizes(flash_params *p, flash_dtype t, int64_t b, int64_t h, int64_t h_kv, int64_t sq,
                              int64_t sk, int64_t d, double scale)
{
    p->b = b;
    p->h = h;
    p->h_kv = h_kv;
    p->sq = sq;
    p->sk = sk;
    p->d = d;
    p->d_v = d; /* the CUDA kernels take d_v == d (flash.h) */
    p->h_per_kv = h / h_kv;
    p->lse_batch = h * sq;
    p->lse_head = sq;
    p->scale = scale != 0 ? scale : 1.0 / sqrt((double)d);
    p->scale_log2 = (float)(p->scale * FLASH_LOG2E);
    p->dtype = t;
}

/* Dropout fields as the binding sets them (csrc/ops.cpp set_dropout_params); prob 0: none. */
static inline void set_dropout(flash_params *p, double prob, uint64_t seed, uint64_t offset)
{
    if (prob <= 0)
        return;
    flash_dropout_set(p, prob);
    p->philox_seed = seed;
    p->philox_offset = offset;
}

/* Median milliseconds of `reps` calls of run() (a launch on stream 0 returning its cudaError_t) after `warmup`
 * untimed ones, by CUDA events. Before each timed call the L2 cache is flushed (a memset of twice its size,
 * outside the events), so that no call finds the inputs of the one before in L2. */
template <typename Run>
static inline double time_ms(Run run, int warmup, int reps)
{
    static void *flush = NULL;
    static size_t flush_bytes = 0;
    if (flush == NULL) {
        int dev = 0, l2 = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
        flush_bytes = 2 * (size_t)std::max(l2, 1);
        CUDA_CHECK(cudaMalloc(&flush, flush_bytes));
    }
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    for (int i = 0; i < warmup; i++)
        CUDA_CHECK(run());
    std::vector<float> ms(reps);
    for (int i = 0; i < reps; i++) {
        CUDA_CHECK(cudaMemsetAsync(flush, i & 1, flush_bytes, 0));
        CUDA_CHECK(cudaEventRecord(start, 0));
        CUDA_CHECK(run());
        CUDA_CHECK(cudaEventRecord(stop, 0));
        CUDA_CHECK(cudaEventSynchronize(stop));
        CUDA_CHECK(cudaEventElapsedTime(&ms[i], start, stop));
    }
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    std::sort(ms.begin(), ms.end());
    return ms[reps / 2];
}

#endif
