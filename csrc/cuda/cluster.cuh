/* cluster.cuh: the distributed-shared-memory exchange between the CTAs of a thread-block cluster (sm_90): a thread
 * stores into a peer CTA's shared memory by st.async, which completes the peer's mbarrier by the bytes stored; the
 * receiver arms its own mbarrier with the bytes it expects per phase (one arrival) and waits with acquire at cluster
 * scope. Used by bwd_sm80.cu's d512 cluster kernel (its partial S^T / dP^T) and dev/dsmem_probe.cu (what one exchange
 * costs). Below sm_90 these compile to nothing (the callers trap or are not launched there).
 * Order of use: cl_bar_init by one thread, then cl_sync (every peer's mbarriers initialized before any cl_send), and
 * cl_sync before exit (no CTA leaves while a peer may still store into it). */
#ifndef FLASHATTN_EXT_CUDA_CLUSTER_CUH
#define FLASHATTN_EXT_CUDA_CLUSTER_CUH

#include <stdint.h>

/* This CTA's rank in its cluster. */
__device__ __forceinline__ uint32_t cl_rank(void)
{
    uint32_t r = 0;
#if __CUDA_ARCH__ >= 900
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
#endif
    return r;
}

/* The address of the same shared-memory location in the cluster's CTA `rank`. */
__device__ __forceinline__ uint32_t cl_peer_addr(uint32_t local, uint32_t rank)
{
    uint32_t r = local;
#if __CUDA_ARCH__ >= 900
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(local), "r"(rank));
#endif
    return r;
}

/* Every thread of every CTA of the cluster (release / acquire). */
__device__ __forceinline__ void cl_sync(void)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}

/* An mbarrier (shared address) expecting one arrival per phase, visible to the cluster. */
__device__ __forceinline__ void cl_bar_init(uint32_t bar)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

/* 16 bytes into a peer's shared memory at `remote` (cl_peer_addr), completing the peer's mbarrier at `remote_bar`
 * by 16 bytes. */
__device__ __forceinline__ void cl_send(uint32_t remote, const float v[4], uint32_t remote_bar)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(
                     remote),
                 "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3]), "r"(remote_bar)
                 : "memory");
#endif
}

/* The one arrival of this phase, expecting `bytes` from the peers' cl_send. */
__device__ __forceinline__ void cl_expect(uint32_t bar, uint32_t bytes)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
#endif
}

/* Wait until the phase of parity `parity` has completed (acquire at cluster scope: the peers' stores visible). */
__device__ __forceinline__ void cl_wait(uint32_t bar, int parity)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("{\n.reg .pred done;\nwait_%=:\n"
                 "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra wait_%=;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
#endif
}

#endif
