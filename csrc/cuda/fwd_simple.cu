/* fwd_simple.cu: attention forward for fp32 / fp64 on CUDA cores (reference-grade, for gradcheck).
 *
 * Algorithm: one CTA of kRows warps owns kRows query rows of one (batch, head); warp w owns row w, each
 * lane holding head-dim elements lane, lane + 32, ... of q and of the output accumulator. Key / value
 * tiles of kBlockN rows are staged in shared memory by the whole CTA; per tile a warp forms its kBlockN
 * scores (lane partial dot products, shuffle-xor sum), then applies the online softmax in the data
 * type: m' = max(m, s), a = a exp(m - m') + sum_j exp(s_j - m') v_j, l likewise. End: out = a / l,
 * lse = m + log l (in the data type); a row with no visible key gets out = 0, lse = -inf.
 * O(seqlen) memory, any head dim 1..256, strides, GQA (kv head = h / h_per_kv), causal_offset, tails.
 * Speed is not a goal.
 */
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "launch.h"

static constexpr int kSimpleWarpSize = 32;
static constexpr unsigned kSimpleFullMask = 0xffffffffu;
static constexpr int kRows = 8;                                    /* query rows (= warps) per CTA */
static constexpr int kBlockN = 8;                                  /* keys per shared-memory tile */
static constexpr int kSimpleMaxHeadDim = 256;
static constexpr int kPerLane = kSimpleMaxHeadDim / kSimpleWarpSize; /* head-dim elements per lane */
static constexpr int kSimpleMaxGridYZ = 65535;

__device__ __forceinline__ float exp_t(float x) { return expf(x); }
__device__ __forceinline__ double exp_t(double x) { return exp(x); }
__device__ __forceinline__ float log_t(float x) { return logf(x); }
__device__ __forceinline__ double log_t(double x) { return log(x); }

template <typename T>
__global__ void __launch_bounds__(kRows *kSimpleWarpSize) flash_fwd_simple_kernel(const flash_params p)
{
    __shared__ T sk_tile[kBlockN][kSimpleMaxHeadDim]; /* (kBlockN, d) */
    __shared__ T sv_tile[kBlockN][kSimpleMaxHeadDim]; /* (kBlockN, d) */

    const int tid = threadIdx.x;
    const int warp = tid / kSimpleWarpSize;
    const int lane = tid % kSimpleWarpSize;
    const int head = blockIdx.y;
    const int64_t batch = blockIdx.z;
    const int64_t kv_head = head / p.h_per_kv;
    const int sq = (int)p.sq;
    const int sk = (int)p.sk;
    const int d = (int)p.d;
    const int row0 = blockIdx.x * kRows;
    const int row = row0 + warp;
    const T scale = (T)p.scale;

    const T *q = (const T *)p.q + batch * p.q_s.batch + head * p.q_s.head;    /* (sq, d), row stride q_s.row */
    const T *k = (const T *)p.k + batch * p.k_s.batch + kv_head * p.k_s.head; /* (sk, d), row stride k_s.row */
    const T *v = (const T *)p.v + batch * p.v_s.batch + kv_head * p.v_s.head; /* (sk, d), row stride v_s.row */
    T *o = (T *)p.o + batch * p.o_s.batch + head * p.o_s.head;                /* (sq, d), row stride o_s.row */
    T *lse = (T *)p.lse + (batch * p.h + head) * p.sq;                        /* (sq) */

    /* keys [0, n_end) are visible to some row of the CTA; key j is visible to this row iff j < lim */
    const int last_row = min(row0 + kRows, sq) - 1;
    int64_t n_end = p.sk;
    int64_t lim = p.sk;
    if (p.causal) {
        n_end = min(max(last_row + p.causal_offset + 1, (int64_t)0), p.sk);
        lim = min(max(row + p.causal_offset + 1, (int64_t)0), p.sk);
    }

    T qr[kPerLane];
    T acc[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; i++) {
        const int c = lane + i * kSimpleWarpSize;
        qr[i] = (row < sq && c < d) ? q[(int64_t)row * p.q_s.row + c] : (T)0;
        acc[i] = (T)0;
    }
    T m = -INFINITY;
    T l = 0;

    for (int j0 = 0; j0 < n_end; j0 += kBlockN) {
        __syncthreads(); /* previous tile consumed */
        for (int idx = tid; idx < kBlockN * d; idx += kRows * kSimpleWarpSize) {
            const int r = idx / d;
            const int c = idx % d;
            const bool ok = j0 + r < sk;
            sk_tile[r][c] = ok ? k[(int64_t)(j0 + r) * p.k_s.row + c] : (T)0;
            sv_tile[r][c] = ok ? v[(int64_t)(j0 + r) * p.v_s.row + c] : (T)0;
        }
        __syncthreads();

        T s[kBlockN];
        T m_new = m;
#pragma unroll
        for (int jj = 0; jj < kBlockN; jj++) {
            T dot = 0;
#pragma unroll
            for (int i = 0; i < kPerLane; i++) {
                const int c = lane + i * kSimpleWarpSize;
                if (c < d)
                    dot += qr[i] * sk_tile[jj][c];
            }
            for (int off = kSimpleWarpSize / 2; off > 0; off /= 2)
                dot += __shfl_xor_sync(kSimpleFullMask, dot, off);
            s[jj] = (j0 + jj < lim) ? dot * scale : (T)-INFINITY;
            m_new = max(m_new, s[jj]);
        }
        if (m_new == (T)-INFINITY)
            continue; /* nothing visible to this row yet */
        const T alpha = exp_t(m - m_new); /* 0 while m = -inf */
        l *= alpha;
#pragma unroll
        for (int i = 0; i < kPerLane; i++)
            acc[i] *= alpha;
#pragma unroll
        for (int jj = 0; jj < kBlockN; jj++) {
            const T pj = exp_t(s[jj] - m_new); /* 0 for masked keys */
            l += pj;
#pragma unroll
            for (int i = 0; i < kPerLane; i++) {
                const int c = lane + i * kSimpleWarpSize;
                if (c < d)
                    acc[i] += pj * sv_tile[jj][c];
            }
        }
        m = m_new;
    }

    if (row >= sq)
        return;
    const T inv = l > (T)0 ? (T)1 / l : (T)0;
#pragma unroll
    for (int i = 0; i < kPerLane; i++) {
        const int c = lane + i * kSimpleWarpSize;
        if (c < d)
            o[(int64_t)row * p.o_s.row + c] = acc[i] * inv;
    }
    if (lane == 0)
        lse[row] = l > (T)0 ? m + log_t(l) : (T)-INFINITY;
}

template <typename T>
static cudaError_t launch_simple(const flash_params *p, cudaStream_t stream)
{
    const dim3 grid((unsigned)((p->sq + kRows - 1) / kRows), (unsigned)p->h, (unsigned)p->b);
    flash_fwd_simple_kernel<T><<<grid, kRows * kSimpleWarpSize, 0, stream>>>(*p);
    return cudaGetLastError();
}

extern "C" cudaError_t flash_fwd_simple(const flash_params *p, cudaStream_t stream)
{
    if (p->d < 1 || p->d > kSimpleMaxHeadDim || p->sq > INT_MAX || p->sk > INT_MAX || p->h > kSimpleMaxGridYZ ||
        p->b > kSimpleMaxGridYZ || p->h_per_kv < 1)
        return cudaErrorInvalidValue;
    if (p->b == 0 || p->h == 0 || p->sq == 0)
        return cudaSuccess;
    if (p->dtype == FLASH_FP32)
        return launch_simple<float>(p, stream);
    if (p->dtype == FLASH_FP64)
        return launch_simple<double>(p, stream);
    return cudaErrorInvalidValue;
}
