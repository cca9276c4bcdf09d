/* tiles.h: the tile configs of every CUDA kernel family by head dim, the only place tiles are chosen. The kernel
 * files take their template arguments, shared-memory sizes and grids from these structs. D is the compiled head
 * dim: smaller head dims run in the next one up, zero-filled. Each value was measured on the H200 (the kernel
 * headers give the current speed, benchmarks/results/h200/history_*.md what was tried). A change here is a
 * kernel change: CUDA tests, the harness checks and an A/B (`dev/device.sh ab` takes a patch of this file).
 * What a kernel's structure fixes (mma / wgmma shapes, warpgroup roles) stays in its file.
 */
#ifndef FLASHATTN_EXT_CUDA_TILES_H
#define FLASHATTN_EXT_CUDA_TILES_H

/* fwd_sm80.cu, flash_fwd_sm80_kernel: D the head dim of Q and K, DV that of V and O (DV <= D), BM query rows x BN
 * keys per tile, WARPS warps splitting the rows, Q_IN_REGS
 * (the Q fragments kept in registers, else read from shared memory per k step). The dense kernels
 * (fwd80_dense_*) and the HOOK kernels (BN % 32 == 0: the permuted key order; 128 x 64 spills at d128), whose d128
 * kernel also serves the dense d <= 128 calls with a paged KV cache (the dense 128 x 48 spills with the page rows). */
struct fwd80_dense_d64 {
    static constexpr int D = 64, DV = 64, BM = 128, BN = 64, WARPS = 4;
    static constexpr bool Q_IN_REGS = true;
};
struct fwd80_dense_d128 {
    static constexpr int D = 128, DV = 128, BM = 128, BN = 48, WARPS = 4;
    static constexpr bool Q_IN_REGS = false;
};
struct fwd80_dense_d256 {
    static constexpr int D = 256, DV = 256, BM = 128, BN = 64, WARPS = 8;
    static constexpr bool Q_IN_REGS = false;
};
struct fwd80_hook_d64 {
    static constexpr int D = 64, DV = 64, BM = 128, BN = 64, WARPS = 4;
    static constexpr bool Q_IN_REGS = true;
};
struct fwd80_hook_d128 {
    static constexpr int D = 128, DV = 128, BM = 128, BN = 32, WARPS = 4;
    static constexpr bool Q_IN_REGS = false;
};
struct fwd80_hook_d256 {
    static constexpr int D = 256, DV = 256, BM = 128, BN = 64, WARPS = 8;
    static constexpr bool Q_IN_REGS = false;
};
/* Head dims 257..512, every variant but a paged KV cache (224 KB: Hopper's shared memory): O in DV-column halves, one
 * launch each (fwd_sm80.cu launch_fwd_halves; S computed in both), the O accumulators of d256's. H100: 166 TFLOP/s
 * (bf16 s2k, ~0.26x our d256 forward; benchmarks/results/h100/session_2026-12-07). */
struct fwd80_hook_d512 {
    static constexpr int D = 512, DV = 256, BM = 128, BN = 32, WARPS = 8;
    static constexpr bool Q_IN_REGS = false;
};

/* fwd_sm90.cu, flash_fwd_sm90_kernel (128 query rows: two consumer warpgroups of one wgmma M each): BN keys per
 * tile (the N of a wgmma.cuh wrapper), STAGES K / V ring stages, Q_STAGES Q tiles (2: the next work tile's Q loads
 * while the consumers read the current one; no room at d256), LAZY_RESCALE (skip the O rescale where no row of a
 * warp changed its max: the vote costs more than it saves at d64), MASK_DROPOUT (the kHook kernel takes attn_mask
 * and dropout too; at d256 their registers spill in the main loop, so fwd_sm80.cu serves them). */
template <int D>
struct fwd90_cfg;
template <>
struct fwd90_cfg<64> {
    static constexpr int BN = 128, STAGES = 3, Q_STAGES = 1;
    static constexpr bool LAZY_RESCALE = false, MASK_DROPOUT = true;
};
template <>
struct fwd90_cfg<128> {
    static constexpr int BN = 128, STAGES = 2, Q_STAGES = 2;
    static constexpr bool LAZY_RESCALE = true, MASK_DROPOUT = true;
};
template <>
struct fwd90_cfg<256> {
    static constexpr int BN = 80, STAGES = 2, Q_STAGES = 1;
    static constexpr bool LAZY_RESCALE = true, MASK_DROPOUT = false;
};

/* fwd_decode.cu, flash_fwd_decode_kernel (16 query rows, 16-key warp tiles: one m16 tile, two n8 tiles): STAGES of
 * each warp's cp.async ring; WARPS warps per CTA, or WARPS_FEW where the unsplit grid is small (decode_warps; at
 * d <= 128 only, where their rings fit). */
template <int D>
struct decode_tiles;
template <>
struct decode_tiles<64> {
    static constexpr int STAGES = 4;
};
template <>
struct decode_tiles<128> {
    static constexpr int STAGES = 3;
};
template <>
struct decode_tiles<256> {
    static constexpr int STAGES = 2;
};
struct decode_warps_per_cta {
    static constexpr int WARPS = 4, WARPS_FEW = 8;
};

/* bwd_sm80.cu: main kernel BC keys per CTA, BR queries per pipeline stage, WK warps along the keys of S^T
 * (MAIN_WARPS / WK along its queries), DQ_WM warps along the rows of dQ, DQC dQ columns per chunk, DO columns of
 * dK, dV and dQ per CTA (D / DO CTAs per key tile, each computing all of S^T and dP^T, or with CL a cluster whose
 * CTAs add each other's partial S^T and dP^T), QST stages of Q and dO;
 * BRQ x BCQ the tile of the deterministic dQ kernel. The large ones need the 227 KB per CTA of sm90; the small ones
 * fit the A100's 163 KB and, up to d = 128, the 99 KB of sm86 / sm89 (not measured: no such GPU here). */
struct bwd80_tiles_d64_large {
    static constexpr int D = 64, BC = 128, BR = 128, WK = 4, DQ_WM = 4, DQC = 32, DO = D, QST = 2, BRQ = 128, BCQ = 64;
    static constexpr bool CL = false;
};
struct bwd80_tiles_d64_small {
    static constexpr int D = 64, BC = 64, BR = 64, WK = 2, DQ_WM = 2, DQC = 16, DO = D, QST = 2, BRQ = 128, BCQ = 64;
    static constexpr bool CL = false;
};
struct bwd80_tiles_d128_large {
    static constexpr int D = 128, BC = 128, BR = 64, WK = 4, DQ_WM = 2, DQC = 32, DO = D, QST = 2, BRQ = 128, BCQ = 64;
    static constexpr bool CL = false;
};
struct bwd80_tiles_d128_small {
    static constexpr int D = 128, BC = 64, BR = 32, WK = 4, DQ_WM = 2, DQC = 32, DO = D, QST = 2, BRQ = 64, BCQ = 32;
    static constexpr bool CL = false;
};
struct bwd80_tiles_d256_large {
    static constexpr int D = 256, BC = 64, BR = 64, WK = 2, DQ_WM = 2, DQC = 32, DO = D, QST = 2, BRQ = 64, BCQ = 32;
    static constexpr bool CL = false;
};
struct bwd80_tiles_d256_small {
    static constexpr int D = 256, BC = 64, BR = 32, WK = 4, DQ_WM = 2, DQC = 32, DO = D, QST = 2, BRQ = 64, BCQ = 32;
    static constexpr bool CL = false;
};

/* Head dims 257..512 (Hopper: thread-block clusters; not deterministic mode, whose dQ kernel stops at 256): the two
 * CTAs of a key tile one cluster (CL), each holding 256 of the columns of K, V, Q and dO and computing its partial
 * S^T and dP^T, which the two swap through distributed shared memory (16 KB each way per step), then the dK, dV
 * and dQ of its 256 columns: nothing computed twice; two Q / dO stages (178 KB). */
struct bwd80_tiles_d512 {
    static constexpr int D = 512, BC = 64, BR = 32, WK = 4, DQ_WM = 2, DQC = 32, DO = 256, QST = 2, BRQ = 0, BCQ = 0;
    static constexpr bool CL = true;
};

/* bwd_sm90.cu. bwd_main_sm90_kernel (D <= 128): BN keys per CTA (64 per MMA warpgroup: one value for both head
 * dims), BM queries per step, BM_HOOK in the HOOK kernels. bwd_main_sm90_d256_kernel: BN keys per CTA (the M of
 * every key-side wgmma), BM queries per step, QW of them per warpgroup in S^T and dP^T, COLS columns of dK, dV and
 * dQ per warpgroup, dQ in passes of DQ_CHUNK columns (32 accumulator registers). */
template <int D>
struct bwd90_tiles;
template <>
struct bwd90_tiles<64> {
    static constexpr int BN = 128, BM = 128, BM_HOOK = 64;
};
template <>
struct bwd90_tiles<128> {
    static constexpr int BN = 128, BM = 64, BM_HOOK = 64;
};
template <>
struct bwd90_tiles<256> {
    static constexpr int BN = 64, BM = 64, QW = 32, COLS = 128, DQ_CHUNK = 64;
};

#endif
