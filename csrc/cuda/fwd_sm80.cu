/* fwd_sm80.cu: FlashAttention-2 forward for fp16 / bf16 on tensor cores (mma.sync), sm80 and later.
 *
 * Algorithm. One CTA owns kBlockM query rows of one (batch, head); its warps split the rows (kBlockM / kNWarps
 * each), never the keys, so there is no cross-warp merge. The CTA walks, in order, the key tiles of kBlockN keys
 * that flash_key_tiles (mask.h) puts in its rows' band (HOOK kernels also skip tiles whose attn_mask block flags
 * have no visible entry); K (double buffered) and V (two buffers where they fit, else loaded during S and the
 * softmax) stream through shared memory by cp.async. Per tile and warp:
 *   S = Q K^T (mma.sync m16n8k16, fp32; Q fragments in registers or, short of registers, from smem per k step);
 *   HOOK kernels: score.h's composition (softcap by tanh.approx, ALiBi, attn_mask in partial tiles only), in
 *   the raw units of q.k so the softmax is shared; tiles outside [full_first, full_end): keys outside the band
 *   masked (flash_visible); online softmax in base 2 (log2 e folded into the scale: one FFMA + one EX2 per
 *   score; row max by quad shuffle; a row whose max is -inf stays 0, never NaN); HOOK: dropout after the row
 *   sum (keep scale in the epilogue's factor); O += P V (S repacked in registers as the A fragment, V by
 *   ldmatrix.trans).
 * End: flash_row_finish_f (mask.h) gives factor and lse per row; O goes through the warp's rows of the Q buffer
 * to 16-byte stores. A row with no visible key writes O = 0 and lse = -inf (the sink with one). Query tiles run
 * in reverse order (heaviest causal tiles first). A negative scale negates Q in smem and runs with |scale|; a
 * zero scale runs with FLT_MIN.
 * Varlen (and seqused_k / k_leftpad / k_batch_idx): grid over max_seqlen_q tiles; a CTA reads its sequence once
 * (flash_seq_of) and keeps its slices and band in smem. Paged KV caches (kPaged kernels): threads 0 .. kBlockN - 1
 * write the tile's key offsets (flash_key_offset) to smem before the loads; each cp.async row adds its offset.
 * HOOK key order: the keys of each 32 are permuted so that a lane's 8 values of four n8 tiles are the 8 keys of
 * one dropout draw and 8 consecutive attn_mask entries; K and V rows follow through the ldmatrix addresses and
 * swz_key, at no cost (kBlockN % 32 == 0).
 *
 * Warps and smem: Q (kBlockM, D) | K[2] (kBlockN, D) | V[1 or 2] (kBlockN, D), 16-bit rows, chunk c of row r at
 * c ^ swz_key(r): cp.async, ldmatrix (.trans) and the epilogue are bank-conflict free; head dims below D and
 * rows past the end zero-filled. Every config fits the A100's 163 KB; 2 CTAs (8 warps) per SM at d <= 128, 1 at
 * d256; 2 warps per scheduler with no overlap inside a warp of its mma, softmax and loads.
 *
 * Tiles (tiles.h fwd80_dense_*, fwd80_hook_*):
 *   d <= 64: 128 x 64, 4 warps, Q in registers, 2 x V; d <= 128: 128 x 48, 4 warps, Q from smem, 2 x V;
 *   d <= 256: 128 x 64, 8 warps, Q from smem, 1 x V. HOOK kernels: the same but d <= 128 128 x 32 (128 x 64
 *   spills); paged: the same but dense d <= 128 runs the HOOK kernel's 128 x 32 (the dense 128 x 48 spills with
 *   the page rows; a dense 128 x 32 paged kernel of its own gave its two instantiations to d512).
 *   d <= 512 (fwd80_hook_d512, Hopper's shared memory, not paged): the HOOK kernel for every variant with V's head
 *   dim DV = 256, 128 x 32, 8 warps, Q from smem, 2 x V; one launch per 256 columns of v and o (both compute S).
 * V and O rows are DV wide (kHeadDimV; DV = D but at d512); O goes through sQ at Q's row stride, so each warp
 * writes only its own rows.
 *
 * Speed (H200, dev/fwd_harness.cu bench, bf16 16k tokens): d128 s8k 380 TFLOP/s (causal 327), torch's FA2
 * 339-353. Every shape, the variants, paged and the history: benchmarks/results/h200/history_fwd_sm80.md.
 * Build: nvcc -std=c++17 -O3 -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90a,code=sm_90a
 */
#include <float.h>
#include <limits.h>
#include <stdint.h>

#include "../constants.h"
#include "../mask.h"
#include "../score.h"
#include "common.cuh"
#include "frag.cuh"
#include "launch.h"
#include "tiles.h"

static constexpr int kMmaM = 16;              /* m16n8k16 */
static constexpr int kMmaN = 8;
static constexpr int kMmaK = 16;
static constexpr int kChunkShift = 4;         /* log2(16 bytes) */
static constexpr int kSwizzleMask = 7;        /* 8 chunks of 16 bytes span all 32 banks */
static constexpr int kSwizzleSpanShift = 7;   /* log2(8 chunks x 16 bytes) */
static constexpr int kElemBytes = 2;          /* fp16 / bf16 */
static constexpr int kQuadLanes = 4;          /* lanes sharing one accumulator row */
static constexpr int kHalfRows = 8;           /* accumulator rows lane / 4 and lane / 4 + 8 */
static constexpr int kPermTiles = 4;          /* HOOK key order: n8 tiles per permuted group */
static constexpr int kPermKeys = kPermTiles * kMmaN; /* keys per permuted group */
static constexpr size_t kDefaultSmemBytes = 48 * 1024;
static constexpr size_t kSm80MaxSmemBytes = 163 * 1024; /* A100 opt-in limit per CTA */
static constexpr size_t kSm90MaxSmemBytes = 227 * 1024; /* H100 / H200 opt-in limit per CTA */
static constexpr uint32_t kSignBits2 = 0x80008000u; /* sign bits of two packed 16-bit floats */
static constexpr uint32_t kLowHalf = 0xffffu;       /* low 16 bits */
static constexpr int kHalfBits = 16;
static constexpr float kLn2 = (float)(1.0 / FLASH_LOG2E);
/* smallest |scale_log2| of the HOOK kernels (a zero scale runs with it): their raw-unit hook divides by
 * it (score_hook), which must stay far from float overflow */
static constexpr float kHookMinScaleLog2 = 1e-20f;

static constexpr int kLaneKeys = 2 * kPermTiles; /* HOOK: the consecutive keys of a lane's row in one permuted group */
static_assert(kLaneKeys == kMmaN && kLaneKeys == 2 * FLASH_DROPOUT_KEYS_PER_CALL,
              "two Philox calls = the 2 values a lane holds in each of kPermTiles n8 tiles");

/* Swizzle key of a tile row: chunk c of row r is stored at chunk c ^ swz_key(r). Natural tiles (Q, and K /
 * V of the dense kernels): r % 8, so that 8 consecutive rows (one ldmatrix matrix) hit 8 different
 * chunk columns. K / V tiles of the HOOK kernels (kPerm): (r ^ (r >> 2)) % 8, which does the same for
 * the 8 rows key_row(x, 0..7) one matrix reads in the permuted order (there r % 8 takes only two
 * values: 4-way bank conflicts). Both keys are XOR-linear in r. */
template <bool kPerm>
__host__ __device__ constexpr int swz_key(int row)
{
    return (kPerm ? row ^ (row >> 2) : row) & kSwizzleMask;
}

/* Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile of kHeadDim-wide rows. */
template <int kHeadDim, bool kPerm = false>
__device__ __forceinline__ uint32_t swz(int row, int chunk)
{
    return (uint32_t)(row * kHeadDim * kElemBytes) + ((uint32_t)(chunk ^ swz_key<kPerm>(row)) << kChunkShift);
}

/* cp.async rows [row0, row0 + kRows) of one (batch, head) slice into a swizzled tile at `tile`.
 * base: (nrows, d) with row stride row_stride. Rows >= nrows and chunks past d are zero-filled. */
template <typename T, int kHeadDim, int kRows, int kThreads, bool kPerm = false>
__device__ __forceinline__ void load_tile(uint32_t tile, const T *base, int64_t row_stride, int row0, int nrows,
                                          int d, int tid)
{
    constexpr int kChunks = kHeadDim / CHUNK;
    constexpr int kRowStep = kThreads / kChunks;
    static_assert(kThreads % kChunks == 0 && kRows % kRowStep == 0, "tile does not split evenly over threads");
    asm volatile("" : "+r"(tid)); /* recompute this thread's row / chunk per call, never hoisted (registers) */
    const int chunk = tid % kChunks;
    const int row = tid / kChunks;
    const bool chunk_ok = chunk * CHUNK < d;
    const T *src = base + (int64_t)(row0 + row) * row_stride + chunk * CHUNK;
#pragma unroll
    for (int i = 0; i < kRows / kRowStep; i++) {
        const bool ok = chunk_ok && row0 + row + i * kRowStep < nrows;
        cp_async_16(tile + swz<kHeadDim, kPerm>(row + i * kRowStep, chunk), ok ? (const void *)src : (const void *)base,
                    ok);
        src += kRowStep * row_stride;
    }
}

/* load_tile of a paged KV cache: tile row r is at base + rows[r] (its key's flash_key_offset, page_rows),
 * rows >= nrows zero-filled. */
template <typename T, int kHeadDim, int kRows, int kThreads, bool kPerm = false>
__device__ __forceinline__ void load_tile_paged(uint32_t tile, const T *base, const int64_t *rows, int nrows, int d,
                                                int tid)
{
    constexpr int kChunks = kHeadDim / CHUNK;
    constexpr int kRowStep = kThreads / kChunks;
    static_assert(kThreads % kChunks == 0 && kRows % kRowStep == 0, "tile does not split evenly over threads");
    asm volatile("" : "+r"(tid)); /* as in load_tile */
    const int chunk = tid % kChunks;
    const int row = tid / kChunks;
    const bool chunk_ok = chunk * CHUNK < d;
#pragma unroll
    for (int i = 0; i < kRows / kRowStep; i++) {
        const int r = row + i * kRowStep;
        const bool ok = chunk_ok && r < nrows;
        cp_async_16(tile + swz<kHeadDim, kPerm>(r, chunk), ok ? (const void *)(base + rows[r] + chunk * CHUNK)
                                                              : (const void *)base, ok);
    }
}

/* K or V tile j (keys j kBlockN ..) of the CTA's sequence into the swizzled tile at `tile`: rows from the
 * slice base with row_stride (load_tile), or, kPaged, from the kv head's base at the tile's page rows `rows`
 * (load_tile_paged). */
template <typename T, int kHeadDim, int kBlockN, int kThreads, bool kPerm, bool kPaged>
__device__ __forceinline__ void load_kv_tile(uint32_t tile, const T *base, int64_t row_stride, const int64_t *rows,
                                             int j, int sk, int d, int tid)
{
    if constexpr (kPaged)
        load_tile_paged<T, kHeadDim, kBlockN, kThreads, kPerm>(tile, base, rows, sk - j * kBlockN, d, tid);
    else
        load_tile<T, kHeadDim, kBlockN, kThreads, kPerm>(tile, base, row_stride, j * kBlockN, sk, d, tid);
}

/* Flip the sign of the chunks of a tile this thread loaded with load_tile (after its cp.async wait). */
template <int kHeadDim, int kRows, int kThreads>
__device__ __forceinline__ void negate_tile(unsigned char *tile, int tid)
{
    constexpr int kChunks = kHeadDim / CHUNK;
    constexpr int kRowStep = kThreads / kChunks;
    const int chunk = tid % kChunks;
    const int row = tid / kChunks;
#pragma unroll
    for (int i = 0; i < kRows / kRowStep; i++) {
        uint4 *x = (uint4 *)(tile + swz<kHeadDim>(row + i * kRowStep, chunk));
        uint4 y = *x;
        y.x ^= kSignBits2;
        y.y ^= kSignBits2;
        y.z ^= kSignBits2;
        y.w ^= kSignBits2;
        *x = y;
    }
}

/* ldmatrix address of chunk pair `pair` (chunks 2 pair, 2 pair + 1) of the row row_off rows below the
 * lane's row, given the lane's address of pair 0 in a swizzled tile whose rows start on 128-byte
 * boundaries. row_off is a compile-time constant whose bits below 8 the lane's row never has (see
 * key_row): the row's swizzle key is then the lane's XOR swz_key(row_off), one LOP3 and an immediate
 * per ldmatrix. */
template <uint32_t kRowBytes, bool kPerm = false>
__device__ __forceinline__ uint32_t tile_addr(uint32_t lane_addr, int row_off, int pair)
{
    constexpr int kPairsPerSwizzle = (kSwizzleMask + 1) / 2;
    return ((lane_addr + (uint32_t)row_off * kRowBytes) ^
            ((uint32_t)((2 * (pair % kPairsPerSwizzle)) ^ swz_key<kPerm>(row_off)) << kChunkShift)) +
           ((uint32_t)(pair / kPairsPerSwizzle) << kSwizzleSpanShift);
}

/* Key (row of the K / V tile) behind column c of n8 tile nt of S. Dense order: 8 nt + c. Permuted
 * (HOOK kernels): in each group of kPermTiles n8 tiles, tile u's column c is key 8 (c / 2) + 2 u + c % 2
 * of the group, so lane q's columns 2 q, 2 q + 1 of the four tiles are the group's keys 8 q .. 8 q + 7
 * in order (tile u holds keys 8 q + 2 u, 8 q + 2 u + 1). key_row(nt, 2 q + e) = key_row(0, 2 q) +
 * key_row(nt, e) in both orders; key_row(x, lr) for x < 2, lr < 8 and key_row(2 n, 0) never share a bit
 * (tile_addr). */
template <bool kPerm>
__host__ __device__ constexpr int key_row(int nt, int c)
{
    return kPerm ? kPermKeys * (nt / kPermTiles) + kMmaN * (c / 2) + 2 * (nt % kPermTiles) + c % 2 : kMmaN * nt + c;
}

/* ldmatrix lane offset in a K tile (v = false: matrix lane / 8 = n8 tile (lane / 16) and chunk
 * (lane / 8 % 2) of S = Q K^T) or a V tile (v = true: k half (lane / 8 % 2) and chunk (lane / 16) of
 * O += P V); the matrix row lane % 8 is key key_row(n8 tile or k half, lane % 8), whose swizzle key
 * the offset carries. Add key_row(2 step, 0) rows per step (tile_addr). */
template <bool kPerm, uint32_t kRowBytes>
__device__ __forceinline__ uint32_t kv_lane_offset(int lane, bool v)
{
    const int lr = lane % 8;
    const int mi = lane / 8;
    const int row = key_row<kPerm>(v ? mi & 1 : mi >> 1, lr);
    const int chunk = v ? mi >> 1 : mi & 1;
    return (uint32_t)row * kRowBytes + ((uint32_t)(chunk ^ swz_key<kPerm>(row)) << kChunkShift);
}

/* What the main loop and the epilogue read of the CTA's (sequence, head), in shared memory and loaded at
 * each use: kept in registers through the loop, these (and the 64-bit K / V pointers) spill at kHeadDim
 * 128. k, v, o, lse: row 0 of its (sk, d) / (sq, d) slices and (sq) lse; the rest from its flash_seq. */
typedef struct fwd_seq_consts {
    const void *k, *v;
    void *o;
    float *lse;
    int sq, sk, diag_lo, diag_hi, alibi_offset;
} fwd_seq_consts;

/* Paged KV cache (flash_params.block_table): the sequence's key origin, and per K / V buffer the element
 * offsets in k and in v of the tile's kBlockN keys (page_rows), after fwd_seq_consts; present only in a
 * paged launch. */
typedef struct fwd_page_head {
    int64_t k_row0, k_batch;
} fwd_page_head;

__host__ __device__ constexpr size_t fwd_page_bytes(int block_n)
{
    return sizeof(fwd_page_head) + (size_t)2 * 2 * block_n * sizeof(int64_t);
}

/* V buffers: two (the next tile's V loads during the current one) unless that overflows max_bytes (the config's
 * shared-memory limit: the A100's for every head dim up to 256); then one, V loading during S and the softmax.
 * head_dim: of Q and K; head_dim_v: of V and O. */
__host__ __device__ constexpr int fwd_v_stages(int head_dim, int head_dim_v, int block_m, int block_n, size_t max_bytes)
{
    return (size_t)((block_m + 2 * block_n) * head_dim + 2 * block_n * head_dim_v) * kElemBytes +
                       sizeof(fwd_seq_consts) <=
                   max_bytes
               ? 2
               : 1;
}

/* Shared memory of the tiles: Q, two K buffers, V buffers. */
__host__ __device__ constexpr size_t fwd_tile_bytes(int head_dim, int head_dim_v, int block_m, int block_n,
                                                    size_t max_bytes)
{
    return (size_t)((block_m + 2 * block_n) * head_dim +
                    fwd_v_stages(head_dim, head_dim_v, block_m, block_n, max_bytes) * block_n * head_dim_v) *
           kElemBytes;
}

/* Dynamic shared memory of one CTA: the tiles, then the sequence's constants (no static shared memory,
 * whose 1 KB alignment padding would cost occupancy). */
__host__ __device__ constexpr size_t fwd_smem_bytes(int head_dim, int head_dim_v, int block_m, int block_n,
                                                    size_t max_bytes)
{
    return fwd_tile_bytes(head_dim, head_dim_v, block_m, block_n, max_bytes) + sizeof(fwd_seq_consts);
}

/* The shared-memory limit a config is built for: the A100's up to head dim 256 (every config runs there), the
 * Hopper's above. */
__host__ __device__ constexpr size_t fwd_max_smem(int head_dim)
{
    return head_dim <= 256 ? kSm80MaxSmemBytes : kSm90MaxSmemBytes;
}

/* Paged KV: threads 0 .. kBlockN - 1 write the offsets of key tile j's keys (mask.h flash_key_offset, the one
 * key -> address map; 0 past sk) to rows[0, kBlockN) (k) and rows[kBlockN, 2 kBlockN) (v), for the tile's
 * loads after the next barrier: one table lookup per key and tile, both tensors' when their strides agree.
 * ks: the sequence (its k_row0, k_batch). */
template <int kBlockN>
__device__ __forceinline__ void page_rows(const flash_params &p, const flash_seq *ks, int64_t *rows, int j, int sk,
                                          int tid)
{
    /* the fields read here (strides, table and page counts) are loaded per call, never hoisted out of the
     * main loop into registers (where they spill at kHeadDim 128) */
    const flash_params *pp = &p;
    asm volatile("" : "+l"(pp));
    if (tid < kBlockN) {
        const int key = j * kBlockN + tid;
        int64_t off_k = 0, off_v = 0;
        if (key < sk) {
            off_k = flash_key_offset(pp, ks, pp->k_s.batch, pp->k_s.row, key);
            off_v = pp->v_s.batch == pp->k_s.batch && pp->v_s.row == pp->k_s.row
                        ? off_k
                        : flash_key_offset(pp, ks, pp->v_s.batch, pp->v_s.row, key);
        }
        rows[tid] = off_k;
        rows[kBlockN + tid] = off_v;
    }
}

/* flash_mask_tile_flags (mask.h) of key tile j for query rows [row0, row0 + qn), spread over the lanes
 * (lane = one FLASH_MASK_BLOCK block; both tile edges are block-aligned) and OR-reduced, so every warp
 * holds the CTA's flags. The attn_mask is dense-only: its blocks are bounded by p.sk (blocks past a
 * seqused_k only widen the flags of the last tile, whose tail is masked anyway). */
template <int kBlockM, int kBlockN>
__device__ __forceinline__ unsigned key_tile_flags(const flash_params &p, int batch, int head, int row0, int qn,
                                                   int j, int lane)
{
    constexpr int kBlockRows = kBlockM / FLASH_MASK_BLOCK;
    constexpr int kBlockCols = kBlockN / FLASH_MASK_BLOCK;
    static_assert(kBlockM % FLASH_MASK_BLOCK == 0 && kBlockN % FLASH_MASK_BLOCK == 0 &&
                      kBlockRows * kBlockCols <= FLASH_WARP_SIZE,
                  "one mask block per lane");
    if (p.mask_blocks == nullptr)
        return FLASH_MASK_ANY_VISIBLE;
    const int br = lane / kBlockCols;
    const int bc = lane % kBlockCols;
    const int k0 = j * kBlockN;
    unsigned f = 0;
    if (br < kBlockRows && br * FLASH_MASK_BLOCK < qn && k0 + bc * FLASH_MASK_BLOCK < p.sk) {
        const flash_strides4 s = p.mask_blocks_s;
        f = __ldg(p.mask_blocks + batch * s.batch + head * s.head + (int64_t)(row0 / FLASH_MASK_BLOCK + br) * s.row +
                  (int64_t)(k0 / FLASH_MASK_BLOCK + bc) * s.col);
    }
    return __reduce_or_sync(FULL_MASK, f);
}

/* The first key tile in [j, n_end) with a visible attn_mask entry (n_end if none), and its flags. Tile
 * j by key_tile_flags; past a hidden one, 32 tiles at a time, one per lane (flash_mask_tile_flags) and a
 * ballot, so that block-sparse masks skip runs of hidden tiles quickly. Uniform over the CTA. */
template <int kBlockM, int kBlockN>
__device__ __forceinline__ int next_visible_tile(const flash_params &p, int batch, int head, int row0, int qn, int j,
                                                 int n_end, int lane, unsigned *flags)
{
    if (j >= n_end)
        return j;
    *flags = key_tile_flags<kBlockM, kBlockN>(p, batch, head, row0, qn, j, lane);
    if (*flags & FLASH_MASK_ANY_VISIBLE)
        return j;
    for (j++; j < n_end; j += FLASH_WARP_SIZE) {
        const int64_t k0 = (int64_t)(j + lane) * kBlockN;
        const unsigned f = j + lane < n_end
                               ? flash_mask_tile_flags(&p, batch, head, row0, qn, k0, flash_min64(kBlockN, p.sk - k0))
                               : 0u;
        const unsigned visible = __ballot_sync(FULL_MASK, f & FLASH_MASK_ANY_VISIBLE);
        if (visible != 0) {
            const int first = __ffs(visible) - 1;
            *flags = __shfl_sync(FULL_MASK, f, first);
            return j + first;
        }
    }
    return n_end;
}

/* Band and seqlen_k mask of one tile of a dense kernel (natural key order): s = -inf at keys >= sk or
 * outside diag_lo <= j - i <= diag_hi (flash_visible of the sequence), the band test flash_tile_band_in
 * (one unsigned compare per value; a tile exists only if diag_lo <= diag_hi, and both fit an int). col0:
 * the thread's first key, diag0: its first key minus its first row. */
template <int kMT, int kNT>
__device__ __forceinline__ void mask_band_dense(float (&s)[kMT][kNT][4], int diag_lo, int diag_hi, int sk, int col0,
                                                int diag0)
{
    const int band = diag_hi - diag_lo;
#pragma unroll
    for (int t = 0; t < kMT; t++)
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int nt = 0; nt < kNT; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int col = col0 + nt * kMmaN + mma_c_col(2 * h + e);
                    const int k = nt * kMmaN + mma_c_col(2 * h + e) - t * kMmaM - mma_c_row(2 * h + e);
                    if (col >= sk || !flash_tile_band_in(diag0 + k, diag_lo, band))
                        s[t][nt][2 * h + e] = -INFINITY;
                }
}

/* The thread's first row r_t and first key c_t of key tile j: its accumulator value (t, nt, 2 h + e)
 * is row r_t + 16 t + 8 h, key c_t + key_row(nt, e). Rebuilt from tid at each use (the empty asm stops
 * hoisting): kept through the main loop, they and what derives from them spill at kHeadDim 128. */
template <int kWarpRows, int kBlockN, bool kPerm>
__device__ __forceinline__ void thread_origin(int tid, int row0, int j, int *r_t, int *c_t)
{
    unsigned t = (unsigned)tid;
    asm volatile("" : "+r"(t));
    const unsigned lane = t % FLASH_WARP_SIZE;
    *r_t = row0 + (int)(t / FLASH_WARP_SIZE) * kWarpRows + (int)(lane / kQuadLanes);
    *c_t = j * kBlockN + key_row<kPerm>(0, 2 * (int)(lane % kQuadLanes));
}

/* Band and seqlen_k mask of one tile of a HOOK kernel: s = -inf outside diag_lo <= j - i <= diag_hi or
 * at j >= sk (the sequence's), one pass per edge the tile crosses (lo_edge, hi_edge, tail: uniform over
 * the CTA). The thread's first row is r_t, its first key c_t; its value (t, nt, 2 h + e) sits key_row(nt, e)
 * keys and t * 16 + h * 8 rows further, so flash_tile_diag(bound, r_t, c_t) makes each test one compare
 * against a constant. */
template <int kMT, int kNT, bool kPerm>
__device__ __forceinline__ void mask_band(float (&s)[kMT][kNT][4], int diag_lo, int diag_hi, int sk, int r_t, int c_t,
                                          bool lo_edge, bool hi_edge, bool tail)
{
    if (lo_edge) {
        const int lo = flash_tile_diag(diag_lo, r_t, c_t);
#pragma unroll
        for (int t = 0; t < kMT; t++)
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int nt = 0; nt < kNT; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++)
                        if (key_row<kPerm>(nt, mma_c_col(2 * h + e)) - t * kMmaM - mma_c_row(2 * h + e) < lo)
                            s[t][nt][2 * h + e] = -INFINITY;
    }
    if (hi_edge) {
        const int hi = flash_tile_diag(diag_hi, r_t, c_t);
#pragma unroll
        for (int t = 0; t < kMT; t++)
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int nt = 0; nt < kNT; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++)
                        if (key_row<kPerm>(nt, mma_c_col(2 * h + e)) - t * kMmaM - mma_c_row(2 * h + e) > hi)
                            s[t][nt][2 * h + e] = -INFINITY;
    }
    if (tail) {
        const int kvalid = sk - c_t;
#pragma unroll
        for (int t = 0; t < kMT; t++)
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int nt = 0; nt < kNT; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++)
                        if (key_row<kPerm>(nt, mma_c_col(2 * h + e)) >= kvalid)
                            s[t][nt][2 * h + e] = -INFINITY;
    }
}

/* 8 consecutive mask elements of kBits bits each, packed into 32-bit words (element k at bits
 * kBits (k % per word) of word k / per word): one vector load when vec, else 8 scalar loads of
 * min(key0 + k, sk - 1) through col_stride. row: the row's first element. */
template <int kBits>
__device__ __forceinline__ void load_mask8(uint32_t (&w)[kBits / 4], const unsigned char *row, int key0, int last_key,
                                           int64_t col_stride, bool vec)
{
    constexpr int kBytes = kBits / 8;
    constexpr int kPerWord = 32 / kBits;
    if (vec) {
        if constexpr (kBits == 16) {
            const uint4 x = *(const uint4 *)(row + kBytes * key0);
            w[0] = x.x, w[1] = x.y, w[2] = x.z, w[3] = x.w;
        } else {
            const uint2 x = *(const uint2 *)(row + key0);
            w[0] = x.x, w[1] = x.y;
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < kBits / 4; i++)
        w[i] = 0;
#pragma unroll
    for (int k = 0; k < kLaneKeys; k++) {
        const unsigned char *at = row + kBytes * (min(key0 + k, last_key) * col_stride);
        const uint32_t x = kBits == 16 ? (uint32_t)*(const unsigned short *)at : (uint32_t)*at;
        w[k / kPerWord] |= x << (kBits * (k % kPerWord));
    }
}

/* attn_mask of one tile (step 3 of score.h) in the permuted key order (HOOK kernels), on raw scores
 * (score_hook): additive x += mask[b, hq, i, j] / |scale|, bool x = -inf where mask[b, hq, i, j] == 0. Lane q's values
 * of row i in n8-tile group g are the 8 consecutive keys c_t + 32 g + k, k = 2 u + e at (4 g + u, e):
 * one vector load when the keys are contiguous and aligned (mask_s.col == 1, the row starts a multiple
 * of 8 elements) and the tile lies inside sk; else 8 scalar loads, with rows past sq and keys past sk
 * reading the last row / key (their values are never used) so that every read stays inside the mask.
 * The empty asm with a memory clobber confines each group's loads (registers). */
template <typename T, int kMT, int kNT>
__device__ __forceinline__ void apply_attn_mask(float (&s)[kMT][kNT][4], const flash_params &p, const flash_score_f &sc,
                                                int batch, int head, int r_t, int c_t, bool tile_in_sk)
{
    constexpr int kKeys = kLaneKeys; /* one group's keys per lane */
    constexpr int kAddBits = 8 * sizeof(T);
    constexpr int kBoolBits = 8;
    const bool additive = p.mask_kind == FLASH_MASK_ADD;
    const int64_t es = additive ? (int64_t)sizeof(T) : 1;
    const unsigned char *base = (const unsigned char *)p.mask;
    const bool vec = tile_in_sk && p.mask_s.col == 1 && p.mask_s.row % kKeys == 0 &&
                     ((uintptr_t)(base + es * flash_mask_offset(&p, batch, head, 0, 0)) % (kKeys * es)) == 0;
#pragma unroll
    for (int t = 0; t < kMT; t++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t i = min(r_t + t * kMmaM + h * kHalfRows, (int)p.sq - 1);
            const unsigned char *row = base + es * flash_mask_offset(&p, batch, head, i, 0);
#pragma unroll
            for (int g = 0; g < kNT / kPermTiles; g++) {
                int64_t col_stride = p.mask_s.col;
                asm volatile("" : "+l"(col_stride) : : "memory");
                const int key0 = c_t + g * kPermKeys;
                if (additive) {
                    uint32_t w[kAddBits / 4];
                    load_mask8<kAddBits>(w, row, key0, (int)p.sk - 1, col_stride, vec);
#pragma unroll
                    for (int k = 0; k < kKeys; k++) {
                        float &y = s[t][g * kPermTiles + k / 2][2 * h + k % 2];
                        y = flash_score_mask_add(&sc, y, bits_to_float(T(), w[k / 2] >> (kAddBits * (k % 2))));
                    }
                } else {
                    uint32_t w[kBoolBits / 4];
                    load_mask8<kBoolBits>(w, row, key0, (int)p.sk - 1, col_stride, vec);
#pragma unroll
                    for (int k = 0; k < kKeys; k++) {
                        float &y = s[t][g * kPermTiles + k / 2][2 * h + k % 2];
                        y = flash_score_mask_bool(y, (w[k / 4] >> (kBoolBits * (k % 4))) & ((1u << kBoolBits) - 1));
                    }
                }
            }
        }
}

/* The score hook of one tile (score.h, in its order) on the raw scores x = q.k, keeping the kernel's
 * units: the final score s (natural log units) is x * scale_log2 * ln 2, scale_log2 = |scale| log2(e)
 * (Q holds the sign), so the dense softmax applies unchanged (score.h's units 1 / to_raw = |scale|). The
 * value (t, nt, 2 h + e) of the thread sits t * 16 + mma_c_row rows and key_row(nt, mma_c_col) keys from
 * its first element (r_t, c_t). The attn_mask is read where the tile's block flags say partial
 * (tile_in_sk: the tile ends at or before sk). Permuted key order. */
template <typename T, int kMT, int kNT>
__device__ __forceinline__ void score_hook(float (&s)[kMT][kNT][4], const flash_params &p, float scale_log2,
                                           unsigned flags, int batch, int head, int alibi_offset, int r_t, int c_t,
                                           bool tile_in_sk)
{
    const float to_raw = FLASH_LOG2E_F / scale_log2; /* natural units -> raw units: 1 / |scale| */
    /* each step forms only its own constants (the whole struct every tile cost the HOOK kernels 3-4%) */
    if (flash_score_capped(&p)) {
        const flash_score_f sc = flash_score_base(&p, to_raw);
#pragma unroll
        for (int t = 0; t < kMT; t++)
#pragma unroll
            for (int nt = 0; nt < kNT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    s[t][nt][e] = flash_score_cap_out(&sc, tanh_approx(flash_score_cap_in(&sc, s[t][nt][e])));
    }
    if (flash_score_biased(&p)) {
        const flash_score_f sc = flash_score_of(&p, alibi_offset, batch, head, to_raw);
        const int64_t d0 = (int64_t)c_t - r_t - sc.alibi_offset; /* j - i' of the thread's first value */
#pragma unroll
        for (int t = 0; t < kMT; t++)
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int nt = 0; nt < kNT; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        float &x = s[t][nt][2 * h + e];
                        x = flash_score_bias(&sc, x, d0,
                                             key_row<true>(nt, mma_c_col(2 * h + e)) - t * kMmaM - mma_c_row(2 * h + e));
                    }
    }
    if (flags & FLASH_MASK_ANY_MASKED)
        apply_attn_mask<T, kMT, kNT>(s, p, flash_score_base(&p, to_raw), batch, head, r_t, c_t, tile_in_sk);
}

/* Dropout of one tile's P (permuted key order): lane q's values of row i in the n8 tiles of group g are
 * keys c_t + 32 g .. + 7 (c_t = tile start + 8 q), two flash_dropout_bits calls of 4 keys (mask.h); value
 * (nt = 4 g + u, e) is key 2 u + e, i.e. word 2 (u % 2) + e of call u / 2. Dropped values become 0. */
template <int kMT, int kNT>
__device__ __forceinline__ void apply_dropout(float (&s)[kMT][kNT][4], const flash_params &p, int64_t bh, int r_t,
                                              int c_t)
{
    static_assert(kNT % kPermTiles == 0, "permuted key order");
    constexpr int kCalls = kLaneKeys / FLASH_DROPOUT_KEYS_PER_CALL, kTilesPerCall = kPermTiles / kCalls;
    const uint32_t cut = flash_dropout_cut(&p); /* kept iff draw > cut */
    const int64_t c0 = c_t / FLASH_DROPOUT_KEYS_PER_CALL;
#pragma unroll
    for (int t = 0; t < kMT; t++)
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int g = 0; g < kNT / kPermTiles; g++)
#pragma unroll
                for (int c = 0; c < kCalls; c++) {
                    uint32_t w[FLASH_DROPOUT_KEYS_PER_CALL];
                    flash_dropout_bits(&p, bh, r_t + t * kMmaM + h * kHalfRows,
                                       c0 + (int64_t)g * kPermKeys / FLASH_DROPOUT_KEYS_PER_CALL + c, w);
#pragma unroll
                    for (int u = 0; u < kTilesPerCall; u++) {
                        float *x = &s[t][g * kPermTiles + c * kTilesPerCall + u][2 * h];
                        x[0] = w[2 * u] > cut ? x[0] : 0.f;
                        x[1] = w[2 * u + 1] > cut ? x[1] : 0.f;
                    }
                }
}

/* HOOK: the general kernel (score hook, attn_mask tile skipping, dropout, permuted key order); else the
 * dense one (band geometry only). Both apply sinks in the epilogue. kPaged: K / V rows through the
 * block_table (page_rows, load_tile_paged), a kernel of its own so that the unpaged ones keep their code
 * and registers; else through the slice pointers (load_tile). */
template <typename T, bool HOOK, int kHeadDim, int kHeadDimV, int kBlockM, int kBlockN, int kNWarps, bool kQInRegs,
          bool kPaged>
__global__ void __launch_bounds__(kNWarps *FLASH_WARP_SIZE, 1)
flash_fwd_sm80_kernel(const __grid_constant__ flash_params p)
{
    constexpr int kThreads = kNWarps * FLASH_WARP_SIZE;
    constexpr int kWarpRows = kBlockM / kNWarps; /* query rows per warp */
    constexpr int kMT = kWarpRows / kMmaM;       /* m16 tiles per warp */
    constexpr int kNT = kBlockN / kMmaN;         /* n8 tiles of S */
    constexpr int kDT = kHeadDimV / kMmaN;       /* n8 tiles of O */
    constexpr int kQK = kHeadDim / kMmaK;        /* k16 steps of S = Q K^T */
    constexpr int kPV = kBlockN / kMmaK;         /* k16 steps of O += P V */
    constexpr int kChunks = kHeadDim / CHUNK;
    constexpr int kChunksV = kHeadDimV / CHUNK;
    constexpr uint32_t kRowBytes = kHeadDim * sizeof(T);   /* Q and K rows */
    constexpr uint32_t kRowBytesV = kHeadDimV * sizeof(T); /* V and O rows */
    constexpr uint32_t kKVBytes = kBlockN * kRowBytes;     /* one K buffer */
    constexpr uint32_t kVBytes = kBlockN * kRowBytesV;     /* one V buffer */
    constexpr size_t kMaxSmem = fwd_max_smem(kHeadDim);
    constexpr size_t kSmemBytes = fwd_smem_bytes(kHeadDim, kHeadDimV, kBlockM, kBlockN, kMaxSmem);
    constexpr int kVStages = fwd_v_stages(kHeadDim, kHeadDimV, kBlockM, kBlockN, kMaxSmem);
    static_assert(sizeof(T) == kElemBytes, "16-bit types only");
    static_assert(kWarpRows % kMmaM == 0 && kBlockN % kMmaK == 0, "tile shape");
    static_assert(!HOOK || kBlockN % kPermKeys == 0, "the HOOK key order permutes groups of kPermKeys keys");
    static_assert(kChunks % (kSwizzleMask + 1) == 0 && kChunksV % (kSwizzleMask + 1) == 0,
                  "swizzle needs rows of at least 128 bytes");
    static_assert((kWarpRows * kChunksV) % FLASH_WARP_SIZE == 0 && kHeadDimV <= kHeadDim, "epilogue split (O in sQ)");
    static_assert(kSmemBytes <= kMaxSmem, "tile exceeds the config's shared memory");
    static_assert(kKVBytes <= kLowHalf + 1, "K / V lane offsets packed in 16 bits");
    static_assert(kSmemBytes + fwd_page_bytes(kBlockN) <= kMaxSmem && kBlockN <= kThreads,
                  "paged launch: page rows exceed the config's shared memory, or fewer threads than keys per tile");

    /* sQ (kBlockM, kHeadDim) | sK[2] (kBlockN, kHeadDim) | sV[kVStages] (kBlockN, kHeadDimV), swizzled | sc */
    extern __shared__ __align__(1024) unsigned char smem[];
    fwd_seq_consts &sc = *(fwd_seq_consts *)(smem + kSmemBytes - sizeof(fwd_seq_consts));
    /* paged launches only: the key origin and the page rows of the two K / V buffers (page_rows) */
    fwd_page_head &ph = *(fwd_page_head *)(smem + kSmemBytes);
    int64_t *const page_row_buf = (int64_t *)(&ph + 1);
    constexpr int kPageStage = 2 * kBlockN; /* page rows per buffer: k's, then v's */
    const uint32_t sQ = smem_u32(smem);
    const uint32_t sK = sQ + kBlockM * kRowBytes;
    const uint32_t sV = sK + 2 * kKVBytes;

    const int tid = threadIdx.x;
    const int warp = tid / FLASH_WARP_SIZE;
    const int lane = tid % FLASH_WARP_SIZE;
    const int m_block = gridDim.x - 1 - blockIdx.x;
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    const int row0 = m_block * kBlockM;
    /* the CTA's sequence (mask.h): lengths, first rows, band; rows and keys below are the sequence's own.
     * A varlen grid spans the longest sequence: the CTAs past this one's end leave at once. */
    const flash_seq seq = flash_seq_of(&p, batch);
    if (row0 >= seq.sq)
        return;
    const int64_t kv_head = head / p.h_per_kv;
    const int sq = (int)seq.sq;
    const int sk = (int)seq.sk;
    const int d = (int)p.d;
    /* v's head dim: the kernels with one head dim run at d_v == d (the binding pads the smaller operand) */
    const int dv = kHeadDimV == kHeadDim ? d : (int)p.d_v;

    /* q, o: (sq, d) with row strides q_s.row, o_s.row; k, v: (sk, d) with k_s.row, v_s.row (paged: the
     * kv head of k / v, key rows at page_rows' offsets from it); lse: (sq) */
    const T *q = (const T *)p.q + (int64_t)batch * p.q_s.batch + (int64_t)head * p.q_s.head + seq.q_row0 * p.q_s.row;
    const T *k = kPaged ? (const T *)p.k + kv_head * p.k_s.head
                        : (const T *)p.k + seq.k_batch * p.k_s.batch + kv_head * p.k_s.head + seq.k_row0 * p.k_s.row;
    const T *v = kPaged ? (const T *)p.v + kv_head * p.v_s.head
                        : (const T *)p.v + seq.k_batch * p.v_s.batch + kv_head * p.v_s.head + seq.k_row0 * p.v_s.row;
    if (tid == 0) {
        if constexpr (kPaged) {
            ph.k_row0 = seq.k_row0;
            ph.k_batch = seq.k_batch;
        }
        sc.k = k;
        sc.v = v;
        sc.o = (T *)p.o + (int64_t)batch * p.o_s.batch + (int64_t)head * p.o_s.head + seq.q_row0 * p.o_s.row;
        sc.lse = (float *)p.lse + flash_lse_offset(&p, &seq, batch, head);
        sc.sq = sq;
        sc.sk = sk;
        sc.diag_lo = (int)seq.diag_lo;
        sc.diag_hi = (int)seq.diag_hi;
        sc.alibi_offset = (int)seq.alibi_offset;
    }

    /* Key tiles [first, n_end) hold a key visible to some row of this CTA; [full_first, full_end) need
     * no band / tail mask. HOOK: j and flags step over tiles the attn_mask hides. */
    const int qn = min(kBlockM, sq - row0);
    const flash_tile_range kt = flash_key_tiles(&seq, row0, qn, kBlockN);
    const int full_first = (int)kt.full_first;
    const int full_end = (int)kt.full_end;
    const int n_end = (int)kt.end;
    int j = (int)kt.first;
    unsigned flags = FLASH_MASK_ANY_VISIBLE;
    if constexpr (HOOK)
        j = next_visible_tile<kBlockM, kBlockN>(p, batch, head, row0, qn, j, n_end, lane, &flags);
    const float scale = fmaxf(fabsf(p.scale_log2), HOOK ? kHookMinScaleLog2 : FLT_MIN);

    load_tile<T, kHeadDim, kBlockM, kThreads>(sQ, q, p.q_s.row, row0, sq, d, tid);
    cp_async_commit();
    if constexpr (kPaged) {
        /* the first tile's page rows (the sequence still in registers), published before its loads */
        if (j < n_end)
            page_rows<kBlockN>(p, &seq, page_row_buf + (HOOK ? 0 : j & 1) * kPageStage, j, sk, tid);
        __syncthreads();
    }
    if (j < n_end) {
        const int stage0 = HOOK ? 0 : j & 1;
        const uint32_t buf = stage0 * kKVBytes;
        const int64_t *rows = page_row_buf + stage0 * kPageStage;
        load_kv_tile<T, kHeadDim, kBlockN, kThreads, HOOK, kPaged>(sK + buf, k, p.k_s.row, rows, j, sk, d, tid);
        if constexpr (kVStages == 2)
            load_kv_tile<T, kHeadDimV, kBlockN, kThreads, HOOK, kPaged>(sV + stage0 * kVBytes, v, p.v_s.row,
                                                                        rows + kBlockN, j, sk, dv, tid);
    }
    cp_async_commit();
    cp_async_wait<1>();
    if (p.scale_log2 < 0.f)
        negate_tile<kHeadDim, kBlockM, kThreads>(smem, tid);
    __syncthreads(); /* also publishes sc */

    /* ldmatrix lane addressing: matrix lane / 8 takes its row lane % 8. Q rows are natural; K and V
     * rows follow key_row (kv_lane_offset), whose swizzle key the lane's address carries (tile_addr). */
    const int lr = lane % 8;
    const int mi = lane / 8;
    const uint32_t q_lane = sQ + (warp * kWarpRows + (mi & 1) * 8 + lr) * kRowBytes + (((mi >> 1) ^ lr) << kChunkShift);
    /* K and V lane offsets: two registers through the loop in the dense kernels; the HOOK kernels, short
     * of registers, pack them into one (kv_lane, unpacked per tile) */
    const uint32_t k_lane = kv_lane_offset<HOOK, kRowBytes>(lane, false);
    const uint32_t v_lane = kv_lane_offset<HOOK, kRowBytesV>(lane, true);
    const uint32_t kv_lane = k_lane | (v_lane << kHalfBits);

    uint32_t qf[kQInRegs ? kMT : 1][kQInRegs ? kQK : 1][4];
    if constexpr (kQInRegs) {
#pragma unroll
        for (int t = 0; t < kMT; t++)
#pragma unroll
            for (int kk = 0; kk < kQK; kk++)
                ldmatrix_x4(qf[t][kk], tile_addr<kRowBytes>(q_lane, t * kMmaM, kk));
    }

    float acc[kMT][kDT][4];   /* O accumulators: rows lane/4 (+8), cols 2*(lane%4) (+1) of each n8 tile */
    float m_run[kMT][2];      /* running max of the raw scores (q.k; HOOK: after the hook) of rows lane/4, +8 */
    float l_run[kMT][2];      /* this lane's part of the running row sum */
#pragma unroll
    for (int t = 0; t < kMT; t++) {
#pragma unroll
        for (int dt = 0; dt < kDT; dt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[t][dt][e] = 0.f;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            m_run[t][h] = -INFINITY;
            l_run[t][h] = 0.f;
        }
    }

    /* K (and V) buffer of tile j: the dense kernels, whose tiles are consecutive, use j & 1 (the prologue
     * loaded the first one there); the HOOK kernels, which skip tiles, toggle it */
    int stage = 0;
    while (j < n_end) {
        if constexpr (!HOOK)
            stage = j & 1;
        int j_next = j + 1;
        unsigned flags_next = FLASH_MASK_ANY_VISIBLE;
        if constexpr (HOOK)
            j_next = next_visible_tile<kBlockM, kBlockN>(p, batch, head, row0, qn, j_next, n_end, lane, &flags_next);
        if constexpr (kPaged) {
            /* tile j_next's page rows, into the buffer no load reads until after the barrier below */
            if (j_next < n_end) {
                flash_seq ks = {};
                ks.k_row0 = ph.k_row0;
                ks.k_batch = ph.k_batch;
                page_rows<kBlockN>(p, &ks, page_row_buf + (stage ^ 1) * kPageStage, j_next, sc.sk, tid);
            }
        }
        cp_async_wait<0>();
        __syncthreads(); /* K_j (and V_j) landed; every warp is done with the previous tile's buffers */
        if constexpr (kVStages == 1) {
            load_kv_tile<T, kHeadDimV, kBlockN, kThreads, HOOK, kPaged>(
                sV, (const T *)sc.v, p.v_s.row, page_row_buf + stage * kPageStage + kBlockN, j, sc.sk, dv, tid);
            cp_async_commit();
        }
        if (j_next < n_end) {
            const uint32_t next = (stage ^ 1) * kKVBytes;
            const int64_t *rows = page_row_buf + (stage ^ 1) * kPageStage;
            load_kv_tile<T, kHeadDim, kBlockN, kThreads, HOOK, kPaged>(sK + next, (const T *)sc.k, p.k_s.row, rows,
                                                                       j_next, sc.sk, d, tid);
            if constexpr (kVStages == 2)
                load_kv_tile<T, kHeadDimV, kBlockN, kThreads, HOOK, kPaged>(sV + (stage ^ 1) * kVBytes,
                                                                            (const T *)sc.v, p.v_s.row, rows + kBlockN,
                                                                            j_next, sc.sk, dv, tid);
        }
        cp_async_commit();
        uint32_t kv_t = kv_lane;
        if constexpr (HOOK)
            asm volatile("" : "+r"(kv_t)); /* unpack here, not before the loop */
        const uint32_t kb = sK + stage * kKVBytes + (HOOK ? kv_t & kLowHalf : k_lane);
        const uint32_t vb = sV + (kVStages == 2 ? stage * kVBytes : 0) + (HOOK ? kv_t >> kHalfBits : v_lane);

        /* S = Q K^T */
        float s[kMT][kNT][4];
#pragma unroll
        for (int t = 0; t < kMT; t++)
#pragma unroll
            for (int nt = 0; nt < kNT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    s[t][nt][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < kQK; kk++) {
            uint32_t a[kMT][4];
#pragma unroll
            for (int t = 0; t < kMT; t++) {
                if constexpr (kQInRegs) {
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        a[t][e] = qf[t][kk][e];
                } else {
                    ldmatrix_x4(a[t], tile_addr<kRowBytes>(q_lane, t * kMmaM, kk));
                }
            }
#pragma unroll
            for (int np = 0; np < kNT / 2; np++) {
                uint32_t b[4];
                ldmatrix_x4(b, tile_addr<kRowBytes, HOOK>(kb, key_row<HOOK>(2 * np, 0), kk));
#pragma unroll
                for (int t = 0; t < kMT; t++) {
                    mma_m16n8k16<T>(s[t][2 * np], a[t], b);
                    mma_m16n8k16<T>(s[t][2 * np + 1], a[t], b + 2);
                }
            }
        }

        /* score hook (HOOK), then the band / seqlen_k mask of tiles outside [full_first, full_end) */
        const bool masked = j < full_first || j >= full_end;
        int r_t = 0, c_t = 0; /* HOOK: the thread's first row and key of this tile (thread_origin) */
        if constexpr (HOOK) {
            thread_origin<kWarpRows, kBlockN, HOOK>(tid, row0, j, &r_t, &c_t);
            score_hook<T, kMT, kNT>(s, p, scale, flags, batch, head, sc.alibi_offset, r_t, c_t,
                                    (int64_t)(j + 1) * kBlockN <= sc.sk);
            if (masked) {
                /* the edges the tile crosses: keys below its last row's band, above its first row's, past sk */
                const int64_t k0 = (int64_t)j * kBlockN;
                const int lo = sc.diag_lo, hi = sc.diag_hi, sk = sc.sk;
                mask_band<kMT, kNT, HOOK>(s, lo, hi, sk, r_t, c_t, k0 < (int64_t)row0 + qn - 1 + lo,
                                          k0 + kBlockN - 1 > (int64_t)row0 + hi, k0 + kBlockN > sk);
            }
        } else if (masked) {
            const int col0 = j * kBlockN + 2 * (lane % kQuadLanes);
            mask_band_dense<kMT, kNT>(s, sc.diag_lo, sc.diag_hi, sc.sk, col0,
                                      col0 - (row0 + warp * kWarpRows + lane / kQuadLanes));
        }

        /* online softmax: P = exp2(S * scale - m * scale), rescale O and l by
         * exp2((m_old - m) * scale) */
#pragma unroll
        for (int t = 0; t < kMT; t++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float mx = m_run[t][h];
#pragma unroll
                for (int nt = 0; nt < kNT; nt++)
                    mx = fmaxf(mx, fmaxf(s[t][nt][2 * h], s[t][nt][2 * h + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 2));
                const float ms = mx == -INFINITY ? 0.f : mx * scale;
                const float alpha = exp2_approx(m_run[t][h] * scale - ms); /* 0 while m_old = -inf */
                m_run[t][h] = mx;
                float sum = 0.f;
#pragma unroll
                for (int nt = 0; nt < kNT; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const float pe = exp2_approx(fmaf(s[t][nt][2 * h + e], scale, -ms));
                        s[t][nt][2 * h + e] = pe;
                        sum += pe;
                    }
                l_run[t][h] = l_run[t][h] * alpha + sum;
#pragma unroll
                for (int dt = 0; dt < kDT; dt++) {
                    acc[t][dt][2 * h] *= alpha;
                    acc[t][dt][2 * h + 1] *= alpha;
                }
            }
        if constexpr (HOOK) {
            if (p.dropout_threshold != 0)
                apply_dropout<kMT, kNT>(s, p, (int64_t)batch * p.h + head, r_t, c_t);
        }

        if constexpr (kVStages == 1) {
            cp_async_wait<1>(); /* V_j landed; the next K may still be in flight */
            __syncthreads();
        }

        /* O += P V, P straight from the S accumulators */
#pragma unroll
        for (int kk = 0; kk < kPV; kk++) {
            uint32_t a[kMT][4];
#pragma unroll
            for (int t = 0; t < kMT; t++) {
                a[t][0] = pack2<T>(s[t][2 * kk][0], s[t][2 * kk][1]);
                a[t][1] = pack2<T>(s[t][2 * kk][2], s[t][2 * kk][3]);
                a[t][2] = pack2<T>(s[t][2 * kk + 1][0], s[t][2 * kk + 1][1]);
                a[t][3] = pack2<T>(s[t][2 * kk + 1][2], s[t][2 * kk + 1][3]);
            }
#pragma unroll
            for (int dp = 0; dp < kDT / 2; dp++) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, tile_addr<kRowBytesV, HOOK>(vb, key_row<HOOK>(2 * kk, 0), dp));
#pragma unroll
                for (int t = 0; t < kMT; t++) {
                    mma_m16n8k16<T>(acc[t][2 * dp], a[t], b);
                    mma_m16n8k16<T>(acc[t][2 * dp + 1], a[t], b + 2);
                }
            }
        }
        j = j_next;
        flags = flags_next;
        if constexpr (HOOK)
            stage ^= 1;
    }

    /* epilogue: O * factor into this warp's rows of sQ (only this warp ever read them), then to global.
     * m in natural units is m_run * scale * ln 2. */
    int sink_head = head;
    asm volatile("" : "+r"(sink_head)); /* load the sink here, not before the main loop (registers) */
    const float sink = p.sink != nullptr ? ((const float *)p.sink)[sink_head] : -INFINITY;
    float keep_scale = 1.f;
    if constexpr (HOOK) {
        if (p.dropout_threshold != 0)
            keep_scale = (float)p.dropout_scale;
    }
    __syncwarp();
#pragma unroll
    for (int t = 0; t < kMT; t++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float l = l_run[t][h];
            l += __shfl_xor_sync(FULL_MASK, l, 1);
            l += __shfl_xor_sync(FULL_MASK, l, 2);
            float factor, row_lse;
            if (p.sink == nullptr) {
                factor = l > 0.f ? 1.f / l : 0.f;
                row_lse = l > 0.f ? (m_run[t][h] * scale + log2f(l)) * kLn2 : -INFINITY;
            } else {
                flash_row_finish_f(m_run[t][h] * scale * kLn2, l, sink, &factor, &row_lse);
            }
            factor *= keep_scale;
            const int r = warp * kWarpRows + t * kMmaM + h * kHalfRows + lane / kQuadLanes;
            if (lane % kQuadLanes == 0 && row0 + r < sc.sq)
                sc.lse[row0 + r] = row_lse;
#pragma unroll
            for (int dt = 0; dt < kDT; dt++)
                *(uint32_t *)(smem + swz<kHeadDim>(r, dt) + (lane % kQuadLanes) * sizeof(uint32_t)) =
                    pack2<T>(acc[t][dt][2 * h] * factor, acc[t][dt][2 * h + 1] * factor);
        }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < kWarpRows * kChunksV / FLASH_WARP_SIZE; i++) {
        const int idx = i * FLASH_WARP_SIZE + lane;
        const int r = warp * kWarpRows + idx / kChunksV;
        const int chunk = idx % kChunksV;
        if (row0 + r < sc.sq && chunk * CHUNK < dv)
            *(uint4 *)((T *)sc.o + (int64_t)(row0 + r) * p.o_s.row + chunk * CHUNK) =
                *(const uint4 *)(smem + swz<kHeadDim>(r, chunk));
    }
}

/* Dynamic shared memory of tile config C (fwd_smem_bytes, + the page offsets' buffers of a paged kernel). */
template <typename C>
static constexpr size_t config_smem_bytes(bool paged)
{
    return fwd_smem_bytes(C::D, C::DV, C::BM, C::BN, fwd_max_smem(C::D)) + (paged ? fwd_page_bytes(C::BN) : 0);
}

template <typename T, bool HOOK, bool kPaged, typename C>
static cudaError_t launch_fwd(const flash_params *p, cudaStream_t stream)
{
    const size_t smem_bytes = config_smem_bytes<C>(kPaged);
    void (*kernel)(const flash_params) =
        flash_fwd_sm80_kernel<T, HOOK, C::D, C::DV, C::BM, C::BN, C::WARPS, C::Q_IN_REGS, kPaged>;
    if (smem_bytes > kDefaultSmemBytes) {
        const cudaError_t err =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes);
        if (err != cudaSuccess)
            return err;
    }
    const dim3 grid((unsigned)((p->sq + C::BM - 1) / C::BM), (unsigned)p->h, (unsigned)p->b);
    kernel<<<grid, C::WARPS * FLASH_WARP_SIZE, smem_bytes, stream>>>(*p);
    return cudaGetLastError();
}

/* Head dims above 256 (fwd80_hook_d512, DV < D): one launch per DV columns of v and o, each over the whole S (the
 * same lse twice). */
template <typename T>
static cudaError_t launch_fwd_halves(const flash_params *p, cudaStream_t stream)
{
    typedef fwd80_hook_d512 C;
    for (int64_t c0 = 0; c0 < p->d_v; c0 += C::DV) {
        flash_params h = *p;
        h.v = (const T *)p->v + c0;
        h.o = (T *)p->o + c0;
        h.d_v = p->d_v - c0 < C::DV ? p->d_v - c0 : C::DV;
        const cudaError_t err = launch_fwd<T, true, false, C>(&h, stream);
        if (err != cudaSuccess)
            return err;
    }
    return cudaSuccess;
}

template <typename T, bool kPaged>
static cudaError_t dispatch_head_dim(const flash_params *p, cudaStream_t stream)
{
    if (p->d > fwd80_hook_d256::D) {
        if constexpr (kPaged)
            return cudaErrorInvalidValue; /* no paged d512 kernel (flash_fwd_sm80 refuses it before) */
        else
            return launch_fwd_halves<T>(p, stream);
    }
    if (p->has_hook) {
        if (p->d <= 64)
            return launch_fwd<T, true, kPaged, fwd80_hook_d64>(p, stream);
        if (p->d <= 128)
            return launch_fwd<T, true, kPaged, fwd80_hook_d128>(p, stream);
        return launch_fwd<T, true, kPaged, fwd80_hook_d256>(p, stream);
    }
    if (p->d <= 64)
        return launch_fwd<T, false, kPaged, fwd80_dense_d64>(p, stream);
    if (p->d <= 128) {
        if constexpr (kPaged)
            return launch_fwd<T, true, true, fwd80_hook_d128>(p, stream); /* its tiles; no dense kernel of them */
        else
            return launch_fwd<T, false, false, fwd80_dense_d128>(p, stream);
    }
    return launch_fwd<T, false, kPaged, fwd80_dense_d256>(p, stream);
}

extern "C" size_t flash_fwd_sm80_smem(const flash_params *p)
{
    const bool paged = p->block_table != NULL;
    if (p->d > fwd80_hook_d256::D)
        return config_smem_bytes<fwd80_hook_d512>(false);
    if (p->has_hook) {
        if (p->d <= 64)
            return config_smem_bytes<fwd80_hook_d64>(paged);
        if (p->d <= 128)
            return config_smem_bytes<fwd80_hook_d128>(paged);
        return config_smem_bytes<fwd80_hook_d256>(paged);
    }
    if (p->d <= 64)
        return config_smem_bytes<fwd80_dense_d64>(paged);
    if (p->d <= 128)
        return paged ? config_smem_bytes<fwd80_hook_d128>(true) : config_smem_bytes<fwd80_dense_d128>(false);
    return config_smem_bytes<fwd80_dense_d256>(paged);
}

extern "C" cudaError_t flash_fwd_sm80(const flash_params *p, cudaStream_t stream)
{
    /* the dense kernels ignore the hook fields; the HOOK kernels read the mask through its block flags
     * (key j of a sequence is the mask's column j: no varlen, no k_leftpad, no block_table) */
    const bool hook_fields =
        p->softcap > 0.f || p->alibi_slopes != NULL || p->mask != NULL || p->dropout_threshold != 0;
    const bool mask_ok = p->mask == NULL ? p->mask_blocks == NULL
                                         : p->mask_blocks != NULL && p->cu_seqlens_q == NULL &&
                                               p->k_leftpad == NULL && p->block_table == NULL &&
                                               (p->mask_kind == FLASH_MASK_BOOL || p->mask_kind == FLASH_MASK_ADD);
    /* head dims above 256: fwd80_hook_d512, not paged, d_v == d (the binding pads the smaller) */
    const int64_t max_d = p->block_table != NULL ? FLASH_CUDA_MAX_HEAD_DIM : FLASH_CUDA_FWD_MAX_HEAD_DIM;
    if (p->d < 1 || p->d > max_d || (p->d > FLASH_CUDA_MAX_HEAD_DIM && p->d_v != p->d) || p->d % CHUNK != 0 ||
        p->sq > INT_MAX ||
        p->sk > INT_MAX || p->h > FLASH_MAX_GRID_YZ || p->b > FLASH_MAX_GRID_YZ || p->h_per_kv < 1 ||
        (hook_fields && !p->has_hook) || !mask_ok || !flash_block_table_ok(p))
        return cudaErrorInvalidValue;
    if (p->b == 0 || p->h == 0 || p->sq == 0)
        return cudaSuccess;
    const bool paged = p->block_table != NULL;
    if (p->dtype == FLASH_FP16)
        return paged ? dispatch_head_dim<__half, true>(p, stream) : dispatch_head_dim<__half, false>(p, stream);
    if (p->dtype == FLASH_BF16)
        return paged ? dispatch_head_dim<__nv_bfloat16, true>(p, stream)
                     : dispatch_head_dim<__nv_bfloat16, false>(p, stream);
    return cudaErrorInvalidValue;
}
