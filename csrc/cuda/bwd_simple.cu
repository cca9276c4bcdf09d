/* bwd_simple.cu: attention backward for fp32 and fp64 on CUDA cores. Correctness over speed: this
 * path exists so that torch.autograd.gradcheck runs on the GPU. No atomics, bitwise deterministic,
 * O(N) memory (only delta, b*h*sq values of the input type).
 *
 * Algorithm (scalar type T = float or double; lse and delta are T too):
 *   1. bwd_simple_delta_kernel: one warp per (b, h, query row): delta_i = dO_i . O_i.
 *   2. bwd_simple_dkv_kernel, grid (key rows / SIMPLE_WARPS, h_kv, b): one warp per key row j,
 *      lane l holding columns l, l+32, ... of k_j, v_j, dk_j, dv_j. It walks the group's query heads
 *      and the query rows that see j, in order:
 *        s = scale q_i.k_j, p = exp(s - lse_i), dp = dO_i.v_j (warp butterfly sums, identical in all
 *        lanes), ds = p (dp - delta_i); dv_j += p dO_i; dk_j += ds q_i;  finally dk_j *= scale.
 *   3. bwd_simple_dq_kernel, grid (query rows / SIMPLE_WARPS, h, b): one warp per query row i, the
 *      keys j <= i + causal_offset in order: dq_i += ds k_j; finally dq_i *= scale.
 *   Any head dim 1..256 (8 columns per lane at most). Rows with lse = -inf see no key and get 0.
 *
 * Speed is not a goal (each query row is read once per key row); not measured.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "launch.h"

#define WARP_SIZE 32
#define FULL_MASK 0xffffffffu
#define SIMPLE_WARPS 4                                /* warps (rows) per block */
#define SIMPLE_MAX_D 256
#define SIMPLE_CPL (SIMPLE_MAX_D / WARP_SIZE)         /* columns per lane */

__device__ __forceinline__ float simple_exp(float x)
{
    return expf(x);
}

__device__ __forceinline__ double simple_exp(double x)
{
    return exp(x);
}

/* Sum over the warp by butterfly: every lane ends with the same value, in a fixed order. */
template <typename T>
__device__ __forceinline__ T warp_sum(T v)
{
#pragma unroll
    for (int off = WARP_SIZE / 2; off > 0; off /= 2)
        v += __shfl_xor_sync(FULL_MASK, v, off);
    return v;
}

/* x[c] = row[lane + 32c] for the columns below d, 0 beyond. */
template <typename T>
__device__ __forceinline__ void load_row(T x[SIMPLE_CPL], const T *row, int d, int lane)
{
#pragma unroll
    for (int c = 0; c < SIMPLE_CPL; ++c) {
        const int col = lane + WARP_SIZE * c;
        x[c] = col < d ? row[col] : (T)0;
    }
}

template <typename T>
__device__ __forceinline__ void store_row(T *row, const T x[SIMPLE_CPL], T mul, int d, int lane)
{
#pragma unroll
    for (int c = 0; c < SIMPLE_CPL; ++c) {
        const int col = lane + WARP_SIZE * c;
        if (col < d)
            row[col] = x[c] * mul;
    }
}

template <typename T>
__device__ __forceinline__ T dot_row(const T x[SIMPLE_CPL], const T y[SIMPLE_CPL])
{
    T s = 0;
#pragma unroll
    for (int c = 0; c < SIMPLE_CPL; ++c)
        s += x[c] * y[c];
    return warp_sum(s);
}

/* delta (b, h, sq) = rowsum(dout * o); one warp per row. */
template <typename T>
__global__ void __launch_bounds__(SIMPLE_WARPS *WARP_SIZE) bwd_simple_delta_kernel(const flash_params p)
{
    const int lane = threadIdx.x % WARP_SIZE;
    const int64_t row = (int64_t)blockIdx.x * SIMPLE_WARPS + threadIdx.x / WARP_SIZE; /* (b*h + hq)*sq + i */
    if (row >= p.b * p.h * p.sq)
        return;
    const int64_t i = row % p.sq, bh = row / p.sq, hq = bh % p.h, b = bh / p.h;
    const int d = (int)p.d;
    const T *o = (const T *)p.o + b * p.o_s.batch + i * p.o_s.row + hq * p.o_s.head;         /* (d) */
    const T *dout = (const T *)p.dout + b * p.do_s.batch + i * p.do_s.row + hq * p.do_s.head; /* (d) */
    T ov[SIMPLE_CPL], dv[SIMPLE_CPL];
    load_row(ov, o, d, lane);
    load_row(dv, dout, d, lane);
    const T sum = dot_row(ov, dv);
    if (lane == 0)
        ((T *)p.delta)[row] = sum;
}

/* dk, dv (b, sk, h_kv, d): one warp per key row, summing over the group's query heads. */
template <typename T>
__global__ void __launch_bounds__(SIMPLE_WARPS *WARP_SIZE) bwd_simple_dkv_kernel(const flash_params p)
{
    const int lane = threadIdx.x % WARP_SIZE;
    const int64_t j = (int64_t)blockIdx.x * SIMPLE_WARPS + threadIdx.x / WARP_SIZE;
    const int64_t hk = blockIdx.y, b = blockIdx.z;
    if (j >= p.sk)
        return;
    const int d = (int)p.d;
    const T scale = (T)p.scale;
    T kv[SIMPLE_CPL], vv[SIMPLE_CPL], dk[SIMPLE_CPL], dv[SIMPLE_CPL];
    load_row(kv, (const T *)p.k + b * p.k_s.batch + j * p.k_s.row + hk * p.k_s.head, d, lane);
    load_row(vv, (const T *)p.v + b * p.v_s.batch + j * p.v_s.row + hk * p.v_s.head, d, lane);
#pragma unroll
    for (int c = 0; c < SIMPLE_CPL; ++c) {
        dk[c] = 0;
        dv[c] = 0;
    }
    /* query i sees key j iff i >= j - causal_offset */
    int64_t i_first = 0;
    if (p.causal && j - p.causal_offset > 0)
        i_first = j - p.causal_offset;
    for (int64_t g = 0; g < p.h_per_kv; ++g) {
        const int64_t hq = hk * p.h_per_kv + g;
        const T *lse = (const T *)p.lse + (b * p.h + hq) * p.sq;     /* (sq) */
        const T *delta = (const T *)p.delta + (b * p.h + hq) * p.sq; /* (sq) */
        for (int64_t i = i_first; i < p.sq; ++i) {
            const T l = lse[i];
            if (l == (T)-INFINITY)
                continue;
            T qv[SIMPLE_CPL], dov[SIMPLE_CPL];
            load_row(qv, (const T *)p.q + b * p.q_s.batch + i * p.q_s.row + hq * p.q_s.head, d, lane);
            load_row(dov, (const T *)p.dout + b * p.do_s.batch + i * p.do_s.row + hq * p.do_s.head, d, lane);
            const T pv = simple_exp(dot_row(qv, kv) * scale - l);
            const T ds = pv * (dot_row(dov, vv) - delta[i]);
#pragma unroll
            for (int c = 0; c < SIMPLE_CPL; ++c) {
                dv[c] += pv * dov[c];
                dk[c] += ds * qv[c];
            }
        }
    }
    store_row((T *)p.dk + b * p.dk_s.batch + j * p.dk_s.row + hk * p.dk_s.head, dk, scale, d, lane);
    store_row((T *)p.dv + b * p.dv_s.batch + j * p.dv_s.row + hk * p.dv_s.head, dv, (T)1, d, lane);
}

/* dq (b, sq, h, d): one warp per query row. */
template <typename T>
__global__ void __launch_bounds__(SIMPLE_WARPS *WARP_SIZE) bwd_simple_dq_kernel(const flash_params p)
{
    const int lane = threadIdx.x % WARP_SIZE;
    const int64_t i = (int64_t)blockIdx.x * SIMPLE_WARPS + threadIdx.x / WARP_SIZE;
    const int64_t hq = blockIdx.y, b = blockIdx.z, hk = hq / p.h_per_kv;
    if (i >= p.sq)
        return;
    const int d = (int)p.d;
    const T scale = (T)p.scale;
    const int64_t row = (b * p.h + hq) * p.sq + i;
    const T l = ((const T *)p.lse)[row], delta = ((const T *)p.delta)[row];
    T qv[SIMPLE_CPL], dov[SIMPLE_CPL], dq[SIMPLE_CPL];
    load_row(qv, (const T *)p.q + b * p.q_s.batch + i * p.q_s.row + hq * p.q_s.head, d, lane);
    load_row(dov, (const T *)p.dout + b * p.do_s.batch + i * p.do_s.row + hq * p.do_s.head, d, lane);
#pragma unroll
    for (int c = 0; c < SIMPLE_CPL; ++c)
        dq[c] = 0;
    int64_t j_end = p.sk; /* keys [0, j_end) are visible */
    if (p.causal && i + p.causal_offset + 1 < j_end)
        j_end = i + p.causal_offset + 1;
    if (l == (T)-INFINITY)
        j_end = 0;
    for (int64_t j = 0; j < j_end; ++j) {
        T kv[SIMPLE_CPL], vv[SIMPLE_CPL];
        load_row(kv, (const T *)p.k + b * p.k_s.batch + j * p.k_s.row + hk * p.k_s.head, d, lane);
        load_row(vv, (const T *)p.v + b * p.v_s.batch + j * p.v_s.row + hk * p.v_s.head, d, lane);
        const T pv = simple_exp(dot_row(qv, kv) * scale - l);
        const T ds = pv * (dot_row(dov, vv) - delta);
#pragma unroll
        for (int c = 0; c < SIMPLE_CPL; ++c)
            dq[c] += ds * kv[c];
    }
    store_row((T *)p.dq + b * p.dq_s.batch + i * p.dq_s.row + hq * p.dq_s.head, dq, scale, d, lane);
}

static unsigned int simple_blocks(int64_t rows)
{
    return (unsigned int)((rows + SIMPLE_WARPS - 1) / SIMPLE_WARPS);
}

template <typename T>
static cudaError_t run_bwd_simple(const flash_params *p, cudaStream_t stream)
{
    cudaError_t err;
    const flash_params pv = *p;
    const dim3 block(SIMPLE_WARPS * WARP_SIZE);
    bwd_simple_delta_kernel<T><<<simple_blocks(p->b * p->h * p->sq), block, 0, stream>>>(pv);
    if ((err = cudaGetLastError()) != cudaSuccess)
        return err;
    bwd_simple_dkv_kernel<T><<<dim3(simple_blocks(p->sk), (unsigned int)p->h_kv, (unsigned int)p->b), block, 0, stream>>>(pv);
    if ((err = cudaGetLastError()) != cudaSuccess)
        return err;
    bwd_simple_dq_kernel<T><<<dim3(simple_blocks(p->sq), (unsigned int)p->h, (unsigned int)p->b), block, 0, stream>>>(pv);
    return cudaGetLastError();
}

extern "C" cudaError_t flash_bwd_simple(const flash_params *p, cudaStream_t stream)
{
    if (p->d < 1 || p->d > SIMPLE_MAX_D || p->h_kv < 1 || p->h % p->h_kv != 0)
        return cudaErrorInvalidValue;
    if (p->b == 0 || p->h == 0 || p->sq == 0 || p->sk == 0)
        return cudaSuccess;
    if (p->dtype == FLASH_FP32)
        return run_bwd_simple<float>(p, stream);
    if (p->dtype == FLASH_FP64)
        return run_bwd_simple<double>(p, stream);
    return cudaErrorInvalidValue;
}
