/* wgmma.cuh: warpgroup matrix-multiply, barrier and TMA wrappers for Hopper (sm_90a only; include from code
 * that is compiled for sm_90a and guard its use with __CUDA_ARCH_FEAT_SM90_ALL).
 *
 * wgmma.mma_async m64nNk16, fp32 accumulators, issued by the 4 warps (128 threads) of a warpgroup:
 *   D (64 x N fp32): N/2 regs per thread. Warp w of the warpgroup holds rows 16w + lane/4 (+8); for
 *                    each n8 block i, d[4i], d[4i+1] are (row, cols 8i + 2*(lane%4) + {0,1}) and
 *                    d[4i+2], d[4i+3] the same columns of row + 8: the mma.sync m16n8 C layout,
 *                    repeated over N/8 blocks (PTX ISA, "Register Fragments", wgmma .m64nNk16).
 *   A from registers (64 x 16): 4 b32 regs per thread, the mma.sync m16n8k16 A layout of the warp's
 *                    16 rows, so two adjacent n8 blocks of a D fragment repack into one A fragment.
 *   A, B from shared memory: a 64-bit descriptor (make_desc_sw128) of a tile in the 128-byte swizzled
 *                    layout below, K-major (TRANS = 0) or MN-major (TRANS = 1).
 *
 * Shared-memory tiles ("sw128"): an R x C tile of 16-bit elements (R % 8 == 0, C % 64 == 0) is stored
 * as C/64 panels of R rows x 128 bytes; the 16-byte chunk c of row r sits at chunk c ^ (r % 8) of its
 * row (the hardware's 128-byte swizzle: address bits 4-6 ^= bits 7-9), tile base 1024-byte aligned.
 *   Used K-major (rows = M or N, columns = K): SBO = 1024 (next 8 rows), LBO unused; a K step of 16
 *   inside a panel adds 32 bytes to the start address, the next panel adds R * 128.
 *   Used MN-major (rows = K, columns = M or N): SBO = 1024 (next 8 K rows), LBO = R * 128 (next 64
 *   columns, i.e. the next panel); a K step of 16 adds 16 * 128 bytes.
 */
#ifndef FLASHATTN_EXT_WGMMA_CUH
#define FLASHATTN_EXT_WGMMA_CUH

#include <cuda.h> /* CUtensorMap and its enums (no libcuda link: the encoder comes from cudaGetDriverEntryPoint) */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#define SW128_ROW_BYTES 128  /* bytes per row of a swizzled panel (64 16-bit elements) */
#define SW128_ATOM_BYTES 1024 /* 8 rows: the repeat of the swizzle pattern */
#define DESC_SWIZZLE_128B 1ull
#define SW128_LBO_UNUSED 16 /* K-major swizzled layouts ignore the leading byte offset */

/* Byte offset of element (r, c) in an R-row sw128 tile of 16-bit elements. */
__device__ __forceinline__ uint32_t sw128_offset(int rows, int r, int c)
{
    const uint32_t ur = (uint32_t)r, uc = (uint32_t)c; /* unsigned: the divisions become shifts and masks */
    return (uc / 64) * (uint32_t)rows * SW128_ROW_BYTES + ur * SW128_ROW_BYTES + ((((uc % 64) / 8) ^ (ur % 8)) * 16) +
           (uc % 8) * 2;
}

/* Matrix descriptor (PTX ISA "Matrix Descriptor Format"): start address, leading and stride byte
 * offsets (each >> 4, 14 bits), base offset 0 (tiles are 1024-byte aligned), 128-byte swizzle. */
__device__ __forceinline__ uint64_t make_desc_sw128(uint32_t smem_addr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((smem_addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32) | (DESC_SWIZZLE_128B << 62);
}

/* The descriptor of a tile start advanced by `bytes` (a multiple of 16): a 32-bit add on the start
 * address field, which cannot carry out of its 14 bits (shared memory ends below 256 KB). Keeps the
 * per-wgmma cost at one add when the tile's own descriptor is shared by all of its steps. */
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes)
{
    const uint32_t lo = (uint32_t)desc + (bytes >> 4), hi = (uint32_t)(desc >> 32);
    return ((uint64_t)hi << 32) | lo;
}

/* Descriptor of rows [row0, row0 + 64) x columns [col0, col0 + 16) of an sw128 tile of ROWS rows at s,
 * read K-major (columns = K). */
template <int ROWS>
__device__ __forceinline__ uint64_t desc_k_major(uint32_t s, int row0, int col0)
{
    return desc_advance(make_desc_sw128(s, SW128_LBO_UNUSED, SW128_ATOM_BYTES),
                        (uint32_t)((col0 / 64) * ROWS * SW128_ROW_BYTES + row0 * SW128_ROW_BYTES + (col0 % 64) * 2));
}

/* Descriptor of rows [row0, row0 + 16) (= K) x columns from col0 (a multiple of 64; = M or N) of an
 * sw128 tile of ROWS rows at s, read MN-major: LBO = the distance between 64-column panels, SBO = 8
 * rows. */
template <int ROWS>
__device__ __forceinline__ uint64_t desc_mn_major(uint32_t s, int row0, int col0)
{
    return desc_advance(make_desc_sw128(s, ROWS * SW128_ROW_BYTES, SW128_ATOM_BYTES),
                        (uint32_t)((col0 / 64) * ROWS * SW128_ROW_BYTES + row0 * SW128_ROW_BYTES));
}

/* Orders this thread's earlier register writes before the next wgmma reads them. */
__device__ __forceinline__ void wgmma_fence(void)
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit(void)
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

/* Wait until at most N committed wgmma groups of this warpgroup are still running. */
template <int N>
__device__ __forceinline__ void wgmma_wait(void)
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* Makes this thread's generic-proxy shared-memory writes (st.shared, cp.async) visible to the async
 * proxy (wgmma operand reads); a barrier must follow before other threads' wgmma read them. */
__device__ __forceinline__ void fence_proxy_async(void)
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* D (+)= A B for one m64nNk16 step. ss: A and B from descriptors; rs: A from registers. accumulate == 0
 * overwrites D. T is __half or __nv_bfloat16. */
template <typename T, int N>
struct wgmma_op;

/* The accumulator operands of one wgmma: R fp32 registers of d (R = N / 2). */
#define WGMMA_ACC8(d) \
    "+f"((d)[0]), "+f"((d)[1]), "+f"((d)[2]), "+f"((d)[3]), "+f"((d)[4]), "+f"((d)[5]), "+f"((d)[6]), "+f"((d)[7])
#define WGMMA_ACC16(d) WGMMA_ACC8(d), WGMMA_ACC8((d) + 8)
#define WGMMA_ACC32(d) WGMMA_ACC16(d), WGMMA_ACC16((d) + 16)
#define WGMMA_ACC40(d) WGMMA_ACC32(d), WGMMA_ACC8((d) + 32)
#define WGMMA_ACC64(d) WGMMA_ACC32(d), WGMMA_ACC32((d) + 32)

/* Their place holders in the instruction text: %0 .. %(R - 1), 8 at a time. */
#define WGMMA_R0 "%0, %1, %2, %3, %4, %5, %6, %7"
#define WGMMA_R1 "%8, %9, %10, %11, %12, %13, %14, %15"
#define WGMMA_R2 "%16, %17, %18, %19, %20, %21, %22, %23"
#define WGMMA_R3 "%24, %25, %26, %27, %28, %29, %30, %31"
#define WGMMA_R4 "%32, %33, %34, %35, %36, %37, %38, %39"
#define WGMMA_R5 "%40, %41, %42, %43, %44, %45, %46, %47"
#define WGMMA_R6 "%48, %49, %50, %51, %52, %53, %54, %55"
#define WGMMA_R7 "%56, %57, %58, %59, %60, %61, %62, %63"
#define WGMMA_REGS16 WGMMA_R0 ", " WGMMA_R1
#define WGMMA_REGS32 WGMMA_REGS16 ", " WGMMA_R2 ", " WGMMA_R3
#define WGMMA_REGS40 WGMMA_REGS32 ", " WGMMA_R4
#define WGMMA_REGS64 WGMMA_REGS40 ", " WGMMA_R5 ", " WGMMA_R6 ", " WGMMA_R7

/* The ss member of wgmma_op<T, N> (R = N / 2 accumulators, then desc_a = %R, desc_b = %R+1, accumulate =
 * %R+2, TRANS_A = %R+3, TRANS_B = %R+4: the operand numbers, written out) for the PTX type PTXT. */
#define WGMMA_SS(PTXT, N, R, DA, DB, AC, TA, TB) \
    template <int TRANS_A, int TRANS_B> \
    static __device__ __forceinline__ void ss(float d[R], uint64_t desc_a, uint64_t desc_b, int accumulate) \
    { \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #AC ", 0;\n" \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTXT "." PTXT " {" WGMMA_REGS##R \
                     "}, %" #DA ", %" #DB ", p, 1, 1, %" #TA ", %" #TB ";\n}\n" \
                     : WGMMA_ACC##R(d) \
                     : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B)); \
    }

/* The rs member (A from registers: a = %R .. %R+3, desc_b = %R+4, accumulate = %R+5, TRANS_B = %R+6). */
#define WGMMA_RS(PTXT, N, R, A0, A1, A2, A3, DB, AC, TB) \
    template <int TRANS_B> \
    static __device__ __forceinline__ void rs(float d[R], const uint32_t a[4], uint64_t desc_b, int accumulate) \
    { \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #AC ", 0;\n" \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTXT "." PTXT " {" WGMMA_REGS##R \
                     "}, {%" #A0 ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #DB ", p, 1, 1, %" #TB ";\n}\n" \
                     : WGMMA_ACC##R(d) \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(TRANS_B)); \
    }

/* The shapes in use, for one dtype (PTXT: bf16, f16):
 *   N 32   ss    S^T and dP^T of the d256 backward (32 queries per warpgroup)
 *   N 64   ss rs
 *   N 80   ss    S of the d256 forward (80 keys per tile)
 *   N 128  ss rs */
#define WGMMA_OPS(T, PTXT) \
    template <> struct wgmma_op<T, 32> { \
        WGMMA_SS(PTXT, 32, 16, 16, 17, 18, 19, 20) \
    }; \
    template <> struct wgmma_op<T, 64> { \
        WGMMA_SS(PTXT, 64, 32, 32, 33, 34, 35, 36) \
        WGMMA_RS(PTXT, 64, 32, 32, 33, 34, 35, 36, 37, 38) \
    }; \
    template <> struct wgmma_op<T, 80> { \
        WGMMA_SS(PTXT, 80, 40, 40, 41, 42, 43, 44) \
    }; \
    template <> struct wgmma_op<T, 128> { \
        WGMMA_SS(PTXT, 128, 64, 64, 65, 66, 67, 68) \
        WGMMA_RS(PTXT, 128, 64, 64, 65, 66, 67, 68, 69, 70) \
    };

WGMMA_OPS(__nv_bfloat16, "bf16")
WGMMA_OPS(__half, "f16")

/* ---- barriers (shared by the sm90 kernels) ---- */

/* Named barrier `id` over `count` threads (0 is __syncthreads'). */
__device__ __forceinline__ void named_sync(int id, int count)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

/* Arrive at named barrier `id` (of `count` threads) without waiting: the producer side of bar.sync. */
__device__ __forceinline__ void named_arrive(int id, int count)
{
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

/* mbarrier (shared address) expecting `count` arrivals per phase. */
__device__ __forceinline__ void mbar_init(uint32_t bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

/* Makes mbarrier initializations visible to the async proxy (TMA completions); then __syncthreads. */
__device__ __forceinline__ void mbar_fence_init(void)
{
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

/* Arrive (release: this thread's earlier memory accesses are ordered before the phase completes). */
__device__ __forceinline__ void mbar_arrive(uint32_t bar)
{
    asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.release.cta.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar)
                 : "memory");
}

/* Arrive and add `bytes` to the phase's expected transaction count (the TMA loads that follow complete
 * them). */
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

/* Wait (acquire) until the phase of parity `parity` has completed: phase k of a barrier is its k-th use. */
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity)
{
    asm volatile("{\n.reg .pred done;\nwait_%=:\n"
                 "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra wait_%=;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}

/* ---- TMA (cp.async.bulk.tensor) ---- */

/* One box of the 4-D tensor map at `map` (a __grid_constant__ kernel parameter) at coordinates c0..c3
 * (innermost first) into shared memory at dst, completing `bar`'s transactions by the box's bytes
 * (out-of-bounds elements are zero-filled and counted). */
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const void *map, uint32_t bar, int c0, int c1, int c2, int c3)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4, %5, %6}], [%2];\n"
                 ::"r"(dst), "l"((uint64_t)map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}

__device__ __forceinline__ void tma_prefetch_map(const void *map)
{
    asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)map) : "memory");
}

/* Host side: the tensor maps' encoder. */
typedef CUresult (*tma_encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                  const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                  CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/* cuTensorMapEncodeTiled from the driver (looked up once per translation unit), or NULL. */
static inline tma_encode_fn tma_encoder(void)
{
    static int looked = 0;
    static tma_encode_fn fn = NULL;
    if (!looked) {
        void *f = NULL;
        cudaDriverEntryPointQueryResult res;
#if CUDART_VERSION >= 12050
        const cudaError_t err =
            cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &res);
#else
        const cudaError_t err = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &f, cudaEnableDefault, &res);
#endif
        fn = err == cudaSuccess && res == cudaDriverEntryPointSuccess ? (tma_encode_fn)f : NULL;
        looked = 1;
    }
    return fn;
}

/* The 4-D map (d, rows, heads, batches) of a 16-bit tensor with element strides row / head / batch, boxes of one
 * 64-column panel x box_rows, 128-byte swizzle (a dimension of size 1 takes any legal stride); 0 where there is no
 * encoder or it refuses. */
static inline int tma_map_4d(CUtensorMap *map, bool bf16, const void *ptr, int64_t d, int64_t rows, int64_t heads,
                             int64_t batches, int64_t row_s, int64_t head_s, int64_t batch_s, int box_rows)
{
    if (tma_encoder() == NULL)
        return 0;
    const cuuint64_t dims[4] = {(cuuint64_t)d, (cuuint64_t)rows, (cuuint64_t)heads, (cuuint64_t)batches};
    const cuuint64_t row = (cuuint64_t)row_s * 2;
    const cuuint64_t head = heads > 1 ? (cuuint64_t)head_s * 2 : row * (cuuint64_t)rows;
    const cuuint64_t batch = batches > 1 ? (cuuint64_t)batch_s * 2 : head * (cuuint64_t)heads;
    const cuuint64_t strides[3] = {row, head, batch};
    const cuuint32_t box[4] = {SW128_ROW_BYTES / 2, (cuuint32_t)box_rows, 1, 1};
    const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
    return tma_encoder()(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4, (void *)ptr,
                         dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                         CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

#endif
