/* sched.cuh: the work orders of the Hopper kernels (fwd_sm90.cu, bwd_sm90.cu): which tile, query head and batch
 * each CTA (or each turn of a persistent CTA) works on, and in which order.
 *
 * Forward (fwd90_*): work items are query tiles of BM rows x heads x batches.
 *   static: fwd90_work_of, the order of a 3-D grid with query tiles fastest, heaviest causal tile first;
 *     paired (a square causal band) puts query tiles n - 1 - i and i in one item, so that every item costs
 *     the same and a persistent CTA per SM walks them in a fixed stride (fwd90_static says where).
 *   grouped: fwd90_work_grouped, heaviest first within groups of (batch, head) pairs whose K and V fit in
 *     FWD90_GROUP_BYTES of L2; the dynamic scheduler (fwd90_fetch / fwd90_schedule / fwd90_take) hands these
 *     items out off p.tile_counter to the producer warp and the consumers, through work slots in shared memory.
 * Backward (bwd90_*): each CTA is one key tile x query head x batch of the grid (key tiles, h, b).
 *   bwd90_cta_of: the grid's own order, or under a band with an upper bound (causal, windows) heaviest key tile
 *     first within groups of query heads whose Q and dO fit in BWD90_GROUP_BYTES (bwd90_grouped);
 *   bwd90_cta_descending: deterministic mode's ordered dQ additions, key tiles descending.
 * The grouped orders walk the grid with mask.h's flash_group_walk, which stays in mask.h: the host simulation
 * tests/dq_order_sim.c (C) calls it. So does flash_dq_sem_tiles (the binding and dev/bwd_harness.cu size the dQ
 * semaphores with it on the host).
 * Everything is __forceinline__; the dynamic scheduler is sm_90a-only (named barriers of wgmma.cuh, guarded by
 * __CUDA_ARCH_FEAT_SM90_ALL).
 */
#ifndef FLASHATTN_EXT_SCHED_CUH
#define FLASHATTN_EXT_SCHED_CUH

#include <cuda_runtime.h>
#include <limits.h>
#include <stdint.h>

#include "../flash.h"
#include "../mask.h"
#include "common.cuh"
#include "wgmma.cuh"

/* ------------------------------------------------------------------------------------------------ */
/* forward: fwd_sm90.cu                                                                             */

/* The CTAs' list of work: query tiles (of BM rows) x heads x batches, in the order of a 3-D grid with
 * query tiles fastest (the heaviest causal ones first), so the CTAs running together share one head's K / V
 * in L2. With `paired` (a square causal band: query tile m costs m + 1 key tiles) work item w holds query
 * tiles n - 1 - i and i of one head, i = w % ceil(n / 2), which cost n + 1 together: every item costs the
 * same and a static persistent order is balanced. */
struct fwd90_work {
    int m0, hq, b;
};

__host__ __device__ __forceinline__ int fwd90_items_per_head(int m_tiles, bool paired)
{
    return paired ? (m_tiles + 1) / 2 : m_tiles;
}

/* Query tiles in item w: 1, or 2 when paired (1 for the middle tile of an odd count). */
__device__ __forceinline__ int fwd90_parts(int w, int m_tiles, bool paired)
{
    const int i = w % fwd90_items_per_head(m_tiles, paired);
    return paired && i != m_tiles - 1 - i ? 2 : 1;
}

/* Part `part` of item w. */
template <int BM>
__device__ __forceinline__ fwd90_work fwd90_work_of(int w, int part, int m_tiles, int h, bool paired)
{
    const int per_head = fwd90_items_per_head(m_tiles, paired);
    const int i = w % per_head;
    fwd90_work r;
    r.m0 = (part == 0 ? m_tiles - 1 - i : i) * BM;
    r.hq = (w / per_head) % h;
    r.b = w / (per_head * h);
    return r;
}

/* The dynamic scheduler's order: groups of `group` (batch, query head) pairs whose K and V fit in
 * FWD90_GROUP_BYTES (fwd90_group), so that the CTAs in flight share them in L2; within a group the query tiles
 * heaviest first (the last tile of every pair, then the one before, ...): causal tiles cost their index, and in a
 * varlen batch only long sequences have late tiles. The last items are the light ones. */
#define FWD90_GROUP_BYTES (16 << 20)

/* The group size for K and V rows of head_dim elements of elem_bytes each. */
__device__ __forceinline__ int fwd90_group(const flash_params &p, int head_dim, int elem_bytes)
{
    const int64_t kv_bytes = flash_max64(p.sk, 1) * head_dim * 2 * elem_bytes; /* K and V of one head */
    return (int)flash_min64(p.h * p.b, flash_max64(1, FWD90_GROUP_BYTES / kv_bytes));
}

template <int BM>
__device__ __forceinline__ fwd90_work fwd90_work_grouped(int w, int m_tiles, const flash_params &p, int group)
{
    uint32_t pair, pos;
    flash_group_walk((uint32_t)w, (uint32_t)m_tiles, (uint32_t)(p.h * p.b), (uint32_t)group, &pair, &pos);
    fwd90_work wk;
    wk.m0 = (m_tiles - 1 - (int)pos) * BM;
    wk.hq = (int)pair % (int)p.h;
    wk.b = (int)pair / (int)p.h;
    return wk;
}

/* The work items cost the same (fwd90_work's paired: a square causal band) or are uniform anyway (no band):
 * both need a dense batch without per-sequence key counts. */
__host__ __device__ __forceinline__ bool fwd90_paired(const flash_params &p)
{
    return p.cu_seqlens_q == NULL && p.seqused_k == NULL && p.k_leftpad == NULL && p.band_left < 0 &&
           p.band_right == 0 && p.sq == p.sk;
}

__host__ __device__ __forceinline__ bool fwd90_uniform(const flash_params &p)
{
    return p.cu_seqlens_q == NULL && p.seqused_k == NULL && p.k_leftpad == NULL && p.band_left < 0 &&
           p.band_right < 0;
}

/* The work items cost the same, so that a static persistent order is balanced (paired or uniform, without an
 * attn_mask); elsewhere the dynamic scheduler, given p.tile_counter. */
__host__ __device__ __forceinline__ bool fwd90_static(const flash_params &p)
{
    return (fwd90_paired(p) || fwd90_uniform(p)) && p.mask == NULL;
}

/* A work slot of the dynamic scheduler below: its named barriers (full: an item published; empty: the readers
 * took it) and the threads that meet at them (the scheduler warp and the slot's readers), numbered by the kernel. */
template <int kFull, int kEmpty, int kThreads>
struct fwd90_slot {
    static constexpr int full = kFull, empty = kEmpty, threads = kThreads;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* The dynamic scheduler (p.tile_counter != NULL; one CTA per SM). Work item blockIdx.x is each CTA's first;
 * a scheduler warp (fwd_sm90.cu: warp FWD90_SCHED_WARP of the producer warpgroup) counts the next ones off the
 * counter (items gridDim.x, gridDim.x + 1, ...: the order of fwd90_work_grouped), one ahead, and
 * publishes each to the producer warp and to the consumers through a work slot apiece in shared memory
 * (named barriers FULL / EMPTY: no phase to keep in the readers' registers), n_work for "no more".
 * fwd90_fetch: lane 0 only; items past their sequence's rows (varlen: the grid spans the longest) are skipped. */
template <int BM>
__device__ __forceinline__ int fwd90_fetch(const flash_params &p, int n_work, int m_tiles, int group)
{
    for (;;) {
        const int64_t w = (int64_t)atomicAdd(p.tile_counter, 1) + gridDim.x;
        if (w >= n_work)
            return n_work;
        const fwd90_work wk = fwd90_work_grouped<BM>((int)w, m_tiles, p, group);
        if (wk.m0 < flash_seq_of(&p, wk.b).sq)
            return (int)w;
    }
}

/* The scheduler warp: fetches the next item while the readers work, then publishes it in each reader's slot once
 * that reader has taken the previous one (its first publication waits for nobody). SlotP, SlotC: the fwd90_slot
 * of the producer warp's slot (at shared address slot_p) and of the consumers' (slot_c). */
template <int BM, typename SlotP, typename SlotC>
__device__ __forceinline__ void fwd90_schedule(const flash_params &p, int n_work, int m_tiles, int group,
                                               uint32_t slot_p, uint32_t slot_c, int lane)
{
    for (bool first = true;; first = false) {
        int w = 0;
        if (lane == 0)
            w = fwd90_fetch<BM>(p, n_work, m_tiles, group);
        w = __shfl_sync(FULL_MASK, w, 0);
        if (!first)
            named_sync(SlotP::empty, SlotP::threads);
        if (lane == 0)
            st_shared_u32(slot_p, (uint32_t)w);
        named_arrive(SlotP::full, SlotP::threads);
        if (!first)
            named_sync(SlotC::empty, SlotC::threads);
        if (lane == 0)
            st_shared_u32(slot_c, (uint32_t)w);
        named_arrive(SlotC::full, SlotC::threads);
        if (w >= n_work)
            return;
    }
}

/* A reader's next item from its slot (every thread of the reader); it frees the slot unless that was the end. */
template <typename Slot>
__device__ __forceinline__ int fwd90_take(uint32_t slot, int n_work)
{
    named_sync(Slot::full, Slot::threads);
    /* broadcast from lane 0: the compiler's warp-uniform value, so that the item's indices and offsets stay on
     * the uniform datapath as blockIdx.x's do (a plain load spills the producer's 24 registers) */
    const int w = __shfl_sync(FULL_MASK, (int)ld_shared_u32(slot), 0);
    if (w < n_work)
        named_arrive(Slot::empty, Slot::threads);
    return w;
}
#endif

/* ------------------------------------------------------------------------------------------------ */
/* backward: bwd_sm90.cu                                                                            */

/* The CTA's key tile, query head and batch. The grid is (key tiles, h, b), which the hardware starts in
 * x, y, z order. A band with an upper bound (causal, windows) makes a key tile's work fall with its index;
 * there the dense kernels walk the grid heaviest first within groups of query heads whose Q and dO fit in
 * BWD90_GROUP_BYTES (so that the CTAs in flight share them in L2, as in the grid's own order): key tile 0
 * of every head of the group, then key tile 1, ... The last CTAs of the grid are then light ones, not the
 * heavy first key tiles of the last heads. */
#define BWD90_GROUP_BYTES (16 << 20) /* Q and dO bytes of one group of query heads */
struct bwd90_cta {
    int tile, hq, b;
};

/* The grid's linear index walked in groups of query heads (BWD90_GROUP_BYTES of Q and dO each), key tile
 * as the outer index inside a group: c.tile is the key tile's position in that walk (0 first). */
__device__ __forceinline__ bwd90_cta bwd90_grouped(const flash_params &p, int qdo_row_bytes)
{
    bwd90_cta c;
    const unsigned tiles = gridDim.x, pairs = gridDim.y * gridDim.z;
    const unsigned lin = blockIdx.x + tiles * (blockIdx.y + gridDim.y * blockIdx.z);
    const unsigned head_bytes = p.sq > BWD90_GROUP_BYTES / qdo_row_bytes ? BWD90_GROUP_BYTES
                                                                          : (unsigned)flash_max64(p.sq, 1) * qdo_row_bytes;
    const unsigned group = min(pairs, BWD90_GROUP_BYTES / head_bytes); /* query heads per group, >= 1 */
    uint32_t pair, pos;
    flash_group_walk(lin, tiles, pairs, group, &pair, &pos);
    c.tile = (int)pos;
    c.hq = (int)(pair % gridDim.y);
    c.b = (int)(pair / gridDim.y);
    return c;
}

template <bool kOrdered>
__device__ __forceinline__ bwd90_cta bwd90_cta_of(const flash_params &p, int qdo_row_bytes)
{
    const unsigned tiles = gridDim.x, pairs = gridDim.y * gridDim.z;
    if (!kOrdered || p.band_right < 0 || (uint64_t)tiles * pairs > UINT_MAX) {
        bwd90_cta c;
        c.tile = (int)blockIdx.x;
        c.hq = (int)blockIdx.y;
        c.b = (int)blockIdx.z;
        return c;
    }
    return bwd90_grouped(p, qdo_row_bytes);
}

/* Deterministic mode with ordered dQ additions (ORDERED): key tiles in descending order within each (query
 * head, batch), the order in which their dQ partials of a query tile are added (dq_reducer). A CTA then waits
 * only for CTAs that the hardware started before it, and under a causal band the CTAs of a head, started
 * together, reach each query tile one after the other in that order (no waits in lockstep).
 * The dense kernels walk the heads in groups as bwd90_grouped (key tiles descending): the CTAs that start
 * together spread over the group's heads instead of piling onto one head's chain, whose links they would then
 * wait for in a wavefront (non-causal det / default time d64 s2k / s8k 1.30 / 1.19 -> 1.02 / 1.03, d128 s2k
 * 1.26 -> 1.13, against the grid's own order: benchmarks/results/h200/det_ab_2026-12-02). */
template <bool kGrouped> /* false: the HOOK kernels, whose helpers read the head and batch from blockIdx */
__device__ __forceinline__ bwd90_cta bwd90_cta_descending(const flash_params &p, int qdo_row_bytes)
{
    bwd90_cta c;
    if (kGrouped && (uint64_t)gridDim.x * gridDim.y * gridDim.z <= UINT_MAX) {
        c = bwd90_grouped(p, qdo_row_bytes);
    } else {
        c.tile = (int)blockIdx.x;
        c.hq = (int)blockIdx.y;
        c.b = (int)blockIdx.z;
    }
    c.tile = (int)gridDim.x - 1 - c.tile;
    return c;
}

#endif
