/* racecheck_probe.cu: does compute-sanitizer racecheck model the dQ handshake of bwd_sm90.cu?
 *
 * bwd_main_sm90_kernel passes every correctness test, but racecheck reports hazards between the MMA
 * warpgroups' stores into the dQ buffers and the reducer warpgroup's loads from them, although every
 * such pair is ordered by bar.sync on BAR_DQ with all 384 threads (buffer t % 2 is rewritten at tile
 * t + 2 only after the barrier of tile t + 1, which the reducer reaches once it has read tile t).
 * This kernel keeps only that skeleton: 2 "MMA" warpgroups write a BM x D fp32 tile into buffer t % 2
 * and meet the "reducer" warpgroup on barrier 2 (384 threads); the reducer reads the tile and adds it
 * to a global sum. Variants switch off the parts racecheck might mis-model:
 *   bar1     the MMA warpgroups also meet each other on barrier 1 (256 threads) twice per tile
 *   maxnreg  setmaxnreg.dec 24 / .inc 240 at the role split
 *   mbar     the handshake through mbarriers instead of barrier 2: FULL[b] (256 MMA arrivals, the
 *            reducer waits), EMPTY[b] (128 reducer arrivals, the MMA warps wait before rewriting b)
 * Usage (sm_90a): nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a dev/racecheck_probe.cu -o probe
 *   for v in 0 1 2 3 4 5 6 7; do compute-sanitizer --tool racecheck ./probe $v | tail -1; done
 * Variant v: bar1 = v & 1, maxnreg = v & 2, mbar = v & 4. The sums are checked, so a real race that
 * changes them also shows up as FAIL. */
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cuda_runtime.h>

#define THREADS 384
#define MMA_THREADS 256
#define TILE_ROWS 64
#define TILE_COLS 64
#define TILES 16

__device__ __forceinline__ void bar_sync(int id, int count)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_init(uint64_t *bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"((uint32_t)__cvta_generic_to_shared(bar)), "r"(count)
                 : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t *bar)
{
    asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.release.cta.shared::cta.b64 state, [%0];\n}\n" ::"r"(
                     (uint32_t)__cvta_generic_to_shared(bar))
                 : "memory");
}

/* Wait until the phase of parity `parity` of the mbarrier has completed (acquire). */
__device__ __forceinline__ void mbar_wait(uint64_t *bar, int parity)
{
    asm volatile("{\n.reg .pred done;\nwait_%=:\n"
                 "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra wait_%=;\n}\n" ::"r"((uint32_t)__cvta_generic_to_shared(bar)),
                 "r"(parity)
                 : "memory");
}

template <bool BAR1, bool MAXNREG, bool MBAR>
__global__ void __launch_bounds__(THREADS, 1) probe_kernel(float *sums)
{
    __shared__ float buf[2][TILE_ROWS * TILE_COLS];
    __shared__ uint64_t full[2], empty[2];
    const int tid = threadIdx.x;
    if (MBAR) {
        if (tid == 0)
            for (int b = 0; b < 2; ++b) {
                mbar_init(&full[b], MMA_THREADS);
                mbar_init(&empty[b], THREADS - MMA_THREADS);
            }
        __syncthreads();
    }
    if (tid >= MMA_THREADS) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
        if (MAXNREG)
            asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
#endif
        float acc = 0.f;
        for (int t = 0; t < TILES; ++t) {
            if (MBAR)
                mbar_wait(&full[t % 2], (t / 2) & 1); /* tile t written */
            else
                bar_sync(2, THREADS); /* tile t written */
            for (int i = tid - MMA_THREADS; i < TILE_ROWS * TILE_COLS; i += THREADS - MMA_THREADS)
                acc += buf[t % 2][i];
            if (MBAR)
                mbar_arrive(&empty[t % 2]);
        }
        atomicAdd(&sums[blockIdx.x], acc);
    } else {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
        if (MAXNREG)
            asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
#endif
        for (int t = 0; t < TILES; ++t) {
            if (BAR1)
                bar_sync(1, MMA_THREADS);
            if (MBAR && t >= 2)
                mbar_wait(&empty[t % 2], (t / 2 - 1) & 1); /* the reducer has read tile t - 2 */
            for (int i = tid; i < TILE_ROWS * TILE_COLS; i += MMA_THREADS)
                buf[t % 2][i] = (float)(t + 1);
            if (BAR1)
                bar_sync(1, MMA_THREADS);
            if (MBAR)
                mbar_arrive(&full[t % 2]);
            else
                bar_sync(2, THREADS); /* the reducer has read tile t - 1: buffer (t + 1) % 2 is free */
        }
    }
}

int main(int argc, char **argv)
{
    const int v = argc > 1 ? atoi(argv[1]) : 0, blocks = 4;
    float *sums;
    cudaMalloc(&sums, blocks * sizeof(float));
    cudaMemset(sums, 0, blocks * sizeof(float));
    void (*kernels[8])(float *) = {probe_kernel<false, false, false>, probe_kernel<true, false, false>,
                                   probe_kernel<false, true, false>,  probe_kernel<true, true, false>,
                                   probe_kernel<false, false, true>,  probe_kernel<true, false, true>,
                                   probe_kernel<false, true, true>,   probe_kernel<true, true, true>};
    kernels[v & 7]<<<blocks, THREADS>>>(sums);
    float h[blocks];
    cudaMemcpy(h, sums, sizeof(h), cudaMemcpyDeviceToHost);
    const float want = (float)(TILE_ROWS * TILE_COLS) * TILES * (TILES + 1) / 2;
    int ok = cudaGetLastError() == cudaSuccess;
    for (int b = 0; b < blocks; ++b)
        ok &= h[b] == want;
    printf("variant %d (bar1 %d, maxnreg %d, mbar %d): %s\n", v, v & 1, (v >> 1) & 1, (v >> 2) & 1,
           ok ? "sums ok" : "FAIL");
    cudaFree(sums);
    return ok ? 0 : 1;
}
