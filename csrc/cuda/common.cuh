/* common.cuh: what the CUDA kernel families share: the warp's and the warpgroup's sizes in threads and the
 * 16-byte copy's in 16-bit elements, the few inline-PTX wrappers the tensor-core kernels are built from, and the
 * helpers they all use on top of them.
 *
 * sm80+ (also run on Hopper): mma.sync m16n8k16 with fp32 accumulators, ldmatrix (plain and .trans),
 * cp.async 16-byte copies with zero fill, exp2, an acquire spin / release store on a global int32 (sm70+);
 * programmatic dependent launch's trigger and wait (sm90+, no-ops below);
 * fp16 / bf16 packing (pack2, unpack2, half_to_float), accumulator repacking into an A fragment (acc_to_a),
 * flash_seq_uniform (a CTA's sequence as warp-uniform values), load_vec_async (an fp32 vector into shared memory).
 * Everything is __device__ __forceinline__; no state.
 * Fragment layouts follow the PTX ISA "Matrix Fragments for mma.m16n8k16" section:
 *   A (16x16, row): 4 x b32 regs, lane = 4*row_in_8 + col_pair; regs a0:(r, k0..7) a1:(r+8, k0..7)
 *                   a2:(r, k8..15) a3:(r+8, k8..15), each reg holding 2 consecutive k.
 *   B (16x8, col):  2 x b32 regs, b0: k = 2*(lane%4) + {0,1}, n = lane/4; b1: same with k + 8.
 *   C/D (16x8 f32): 4 regs, c0,c1: row lane/4, cols 2*(lane%4)+{0,1}; c2,c3: row lane/4 + 8.
 */
#ifndef FLASHATTN_EXT_COMMON_CUH
#define FLASHATTN_EXT_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "../mask.h"

/* every lane of a warp (the member mask of the *_sync warp intrinsics) */
#define FULL_MASK 0xffffffffu
/* threads of a warpgroup, the 4 warps that issue one wgmma (Hopper) */
#define WARPGROUP_THREADS 128
/* elements of a 16-bit type per 16-byte copy (cp.async, TMA rows, vector loads) */
#define CHUNK 8

/* D = A * B + D for one m16n8k16 tile, fp32 accumulators. T is __half or __nv_bfloat16. */
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float d[4], const uint32_t a[4], const uint32_t b[2]);

template <>
__device__ __forceinline__ void mma_m16n8k16<__nv_bfloat16>(float d[4], const uint32_t a[4], const uint32_t b[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <>
__device__ __forceinline__ void mma_m16n8k16<__half>(float d[4], const uint32_t a[4], const uint32_t b[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t smem_u32(const void *ptr)
{
    return (uint32_t)__cvta_generic_to_shared(ptr);
}

/* Shared-memory loads and stores by 32-bit shared address: ld/st.shared directly, where a generic
 * pointer would cost an address conversion per access. volatile: kept in order with the barriers and wgmma's. */
__device__ __forceinline__ void st_shared_v2_f32(uint32_t addr, float x, float y)
{
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}

__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t x)
{
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(x) : "memory");
}

__device__ __forceinline__ uint32_t ld_shared_u32(uint32_t addr)
{
    uint32_t v;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
    return v;
}

__device__ __forceinline__ float2 ld_shared_v2_f32(uint32_t addr)
{
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr));
    return v;
}

__device__ __forceinline__ float4 ld_shared_v4_f32(uint32_t addr)
{
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr));
    return v;
}

/* Four 8x8 b16 matrices from shared memory; lane l supplies the row address for matrix l/8. */
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], uint32_t smem_addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], uint32_t smem_addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr));
}

/* 16-byte global -> shared copy, bypassing L1. valid == false writes 16 zero bytes and reads nothing
 * (src-size 0), so tails are predicated without branches; gmem must still be a mapped address. */
__device__ __forceinline__ void cp_async_16(uint32_t smem_addr, const void *gmem, bool valid)
{
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit(void)
{
    asm volatile("cp.async.commit_group;\n" ::);
}

/* Wait until at most N committed groups are still in flight. */
template <int N>
__device__ __forceinline__ void cp_async_wait(void)
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ float exp2_approx(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* tanh.approx.f32 (MUFU.TANH, sm75+): maximum relative error about 1.1e-5 over all floats (measured on
 * the H200), so a softcapped score cap * tanh(x) is off by at most 1.1e-5 cap. Every tensor-core kernel's
 * softcap uses it, so that the backward recomputes exactly the forward's scores. */
__device__ __forceinline__ float tanh_approx(float x)
{
    float y;
    asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* Two floats -> one b32 register of two 16-bit values (lo = first), as mma A/B fragments want. */
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi)
{
    __half2 v = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&v;
}

/* The 16-bit float in the low half of b. */
__device__ __forceinline__ float bits_to_float(__half, uint32_t b)
{
    return __half2float(__ushort_as_half((unsigned short)b));
}
__device__ __forceinline__ float bits_to_float(__nv_bfloat16, uint32_t b)
{
    return __bfloat162float(__ushort_as_bfloat16((unsigned short)b));
}

/* 4-byte global -> shared copy through L1 (for per-row fp32 vectors such as lse); valid == false
 * writes 4 zero bytes and reads nothing. gmem must still be a mapped address. */
__device__ __forceinline__ void cp_async_4(uint32_t smem_addr, const void *gmem, bool valid)
{
    const int src_bytes = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(src_bytes));
}

/* Spins until the int32 at gmem (global) reads `value`, with acquire semantics at GPU scope: what the
 * thread that stored it (st_release_gpu) wrote before is visible after. (Relaxed polls with one fence after
 * the last were slower on the H200: benchmarks/results/h200/det_ab_2026-12-02.) */
__device__ __forceinline__ void spin_until_equal_gpu(const int32_t *gmem, int32_t value)
{
    int32_t v;
    do
        asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(gmem) : "memory");
    while (v != value);
}

/* Stores `value` to the int32 at gmem (global) with release semantics at GPU scope. */
__device__ __forceinline__ void st_release_gpu(int32_t *gmem, int32_t value)
{
    asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(gmem), "r"(value) : "memory");
}

/* Programmatic dependent launch (sm90+; launch.h flash_launch_pdl). grid_dependency_trigger: this CTA lets the
 * next kernel in the stream, if launched with the attribute, start once every CTA of this grid has triggered or
 * exited. grid_dependency_wait: the thread waits until the previous kernel in the stream has completed and its
 * writes are visible; every read of what that kernel writes (and every write it must not race) comes after it.
 * Without the attribute (and below sm90) both are no-ops and the stream orders the kernels. */
__device__ __forceinline__ void grid_dependency_trigger(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void grid_dependency_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

/* One b32 register of two 16-bit values -> two floats (lo first): the inverse of pack2. */
template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t v);

template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t v)
{
    return __bfloat1622float2(*(__nv_bfloat162 *)&v);
}

template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t v)
{
    return __half22float2(*(__half2 *)&v);
}

/* One fp16 / bf16 element as float (torch builds with __CUDA_NO_HALF_CONVERSIONS__: no implicit casts). */
__device__ __forceinline__ float half_to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float half_to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

/* flash_seq_of(p, b) of a CTA's sequence, each field broadcast from lane 0: ptxas then treats the
 * values as warp-uniform (and drops the shuffles), so that what is derived from them, the CTA's base
 * pointers above all, stays on the uniform datapath like the flash_params fields they replace (a value
 * loaded from cu_seqlens is otherwise a per-thread register: measured +5% instructions per tile). */
__device__ __forceinline__ flash_seq flash_seq_uniform(const flash_params &p, int64_t b)
{
    flash_seq s = flash_seq_of(&p, b);
    int64_t *f[] = {&s.sq,       &s.sk,      &s.q_row0,  &s.k_row0,      &s.k_batch,
                    &s.lse_row0, &s.diag_lo, &s.diag_hi, &s.alibi_offset};
#pragma unroll
    for (int i = 0; i < (int)(sizeof(f) / sizeof(f[0])); ++i)
        *f[i] = __shfl_sync(FULL_MASK, *f[i], 0);
    return s;
}

/* Async copy of n fp32 values g[0, n_valid) into s[0, n), zero beyond. */
template <int N, int NT>
__device__ __forceinline__ void load_vec_async(float *s, const float *g, int n_valid, int tid)
{
#pragma unroll
    for (int it = 0; it < (N + NT - 1) / NT; ++it) {
        const int idx = it * NT + tid;
        if (N % NT == 0 || idx < N) {
            const bool valid = idx < n_valid;
            cp_async_4(smem_u32(s + idx), valid ? g + idx : g, valid);
        }
    }
}

/* Repack two adjacent n8 accumulator tiles (16 x 16, fp32) into one A fragment of the dtype. */
template <typename T>
__device__ __forceinline__ void acc_to_a(uint32_t a[4], const float c0[4], const float c1[4])
{
    a[0] = pack2<T>(c0[0], c0[1]);
    a[1] = pack2<T>(c0[2], c0[3]);
    a[2] = pack2<T>(c1[0], c1[1]);
    a[3] = pack2<T>(c1[2], c1[3]);
}

#endif
