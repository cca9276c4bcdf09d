/* dsmem_probe.cu: what one exchange of partial scores between the two CTAs of a cluster costs on Hopper, the open
 * question of issue 36's d512 design (dev/pending/README.md: two CTAs split the head dim and swap their partial
 * S / dP tiles through distributed shared memory instead of computing them twice).
 *
 * Clusters of 2 CTAs, 256 threads each, one CTA per SM (dynamic shared memory as the real kernel's), every SM busy.
 * Per step each CTA sends BYTES to its peer (st.async into the peer's receive buffer, completing the peer's mbarrier
 * by those bytes), runs WORK dependent fma's per thread (the work an exchange could hide under), then arms its own
 * mbarrier (expect_tx BYTES), waits for the peer's bytes and adds them. Receive buffers and mbarriers are double-
 * buffered (step s: buffer s % 2, phase (s / 2) % 2), as a kernel would run them. Every received value is checked
 * against what the peer sent (exact small integers).
 *
 * Build and run (sm_90a; dev/pending/scripts/run_q.sh dsmem):
 *   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc/cuda dev/dsmem_probe.cu -o /tmp/dsmem_probe
 *   /tmp/dsmem_probe
 * Prints per (bytes, work): ns per step with the exchange and without it (the same fma's), their difference (what a
 * step pays for the exchange), and PASS / FAIL of the values.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "cluster.cuh" /* the exchange's primitives, as bwd_sm80.cu's d512 cluster kernel uses them */

#define THREADS 256
#define SMEM_BYTES (150 * 1024) /* one CTA per SM, as the d512 kernels' ~180-205 KB */

__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* The value CTA `rank` sends at step s, thread t, vector k, lane e: an integer below 2^24 (exact in fp32). */
__device__ __forceinline__ float sent(int s, uint32_t rank, int t, int k, int e)
{
    return (float)(((s * 7 + (int)rank * 3 + t * 5 + k * 11 + e) & 0xffff) + 1);
}

template <int BYTES>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(THREADS, 1)
    probe_kernel(int steps, int work, int exchange, float *out, int *bad)
{
    constexpr int V4 = BYTES / 16 / THREADS; /* float4 per thread and step */
    static_assert(V4 >= 1 && V4 * 16 * THREADS == BYTES, "bytes per step");
    extern __shared__ __align__(16) uint8_t smem[];
    float4 *recv = (float4 *)smem;                   /* [2][V4][THREADS] */
    const uint32_t bars = smem_addr(smem + 2 * BYTES); /* 2 mbarriers */
    const uint32_t rank = cl_rank();
    const uint32_t peer = rank ^ 1u;
    const int tid = threadIdx.x;
    if (tid == 0) {
        cl_bar_init(bars);
        cl_bar_init(bars + 8);
    }
    cl_sync(); /* both CTAs' mbarriers initialized before any st.async */
    const uint32_t recv_peer = cl_peer_addr(smem_addr(recv), peer), bars_peer = cl_peer_addr(bars, peer);
    float acc = (float)tid;
    int wrong = 0;
    for (int s = 0; s < steps; ++s) {
        const int buf = s & 1, parity = (s >> 1) & 1;
        if (exchange) {
#pragma unroll
            for (int k = 0; k < V4; ++k) {
                const float v[4] = {sent(s, rank, tid, k, 0), sent(s, rank, tid, k, 1), sent(s, rank, tid, k, 2),
                                    sent(s, rank, tid, k, 3)};
                cl_send(recv_peer + (uint32_t)(((buf * V4 + k) * THREADS + tid) * 16), v, bars_peer + 8 * buf);
            }
        }
        for (int w = 0; w < work; ++w)
            acc = fmaf(acc, 0.999f, 0.25f);
        if (exchange) {
            if (tid == 0)
                cl_expect(bars + 8 * buf, BYTES);
            cl_wait(bars + 8 * buf, parity);
#pragma unroll
            for (int k = 0; k < V4; ++k) {
                const float4 r = recv[(buf * V4 + k) * THREADS + tid];
                wrong += r.x != sent(s, peer, tid, k, 0) || r.y != sent(s, peer, tid, k, 1) ||
                         r.z != sent(s, peer, tid, k, 2) || r.w != sent(s, peer, tid, k, 3);
                acc += r.x + r.y + r.z + r.w;
            }
        }
    }
    cl_sync(); /* no CTA leaves while its peer may still write into it */
    out[blockIdx.x * THREADS + tid] = acc;
    if (wrong)
        atomicAdd(bad, wrong);
}

template <int BYTES>
static void run(int ctas, int steps, int work, float *out, int *bad)
{
    cudaFuncSetAttribute(probe_kernel<BYTES>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES);
    float ms[2] = {0.f, 0.f};
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    for (int exchange = 0; exchange < 2; ++exchange) {
        probe_kernel<BYTES><<<ctas, THREADS, SMEM_BYTES>>>(steps / 10, work, exchange, out, bad); /* warm-up */
        cudaEventRecord(a);
        probe_kernel<BYTES><<<ctas, THREADS, SMEM_BYTES>>>(steps, work, exchange, out, bad);
        cudaEventRecord(b);
        cudaEventSynchronize(b);
        cudaEventElapsedTime(&ms[exchange], a, b);
    }
    int wrong = 0;
    cudaMemcpy(&wrong, bad, sizeof(int), cudaMemcpyDeviceToHost);
    const cudaError_t err = cudaGetLastError();
    const double with = 1e6 * ms[1] / steps, without = 1e6 * ms[0] / steps;
    printf("%6d bytes  work %5d fma  %8.1f ns/step with the exchange, %8.1f without, %+8.1f  %s\n", BYTES, work, with,
           without, with - without, err != cudaSuccess ? cudaGetErrorString(err) : wrong ? "FAIL" : "PASS");
    cudaEventDestroy(a);
    cudaEventDestroy(b);
}

int main(void)
{
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    const int ctas = sms / 2 * 2, steps = 20000;
    float *out;
    int *bad;
    cudaMalloc(&out, (size_t)ctas * THREADS * sizeof(float));
    cudaMalloc(&bad, sizeof(int));
    cudaMemset(bad, 0, sizeof(int));
    printf("%d CTAs in clusters of 2, %d threads each, %d steps\n", ctas, THREADS, steps);
    const int works[] = {0, 250, 1000};
    for (int w : works) {
        run<8192>(ctas, steps, w, out, bad);
        run<16384>(ctas, steps, w, out, bad);
        run<32768>(ctas, steps, w, out, bad);
    }
    cudaFree(out);
    cudaFree(bad);
    return 0;
}
