/* fwd_sm80.cu: FlashAttention-2 forward for fp16 / bf16 on tensor cores (mma.sync), sm80 and later.
 *
 * Algorithm. One CTA owns kBlockM query rows of one (batch, head); its warps split those rows (each
 * warp kBlockM / kNWarps rows = one or two m16 tiles), never the keys, so no cross-warp merge. K and V
 * tiles of kBlockN rows stream through shared memory with cp.async: K is double buffered (K_{j+1} is
 * in flight during all of tile j); V too when two V buffers fit the sm80 limit, else V_j loads during
 * S_j and the softmax (one more __syncthreads per tile). Per key tile, per warp:
 *   S = Q K^T        mma.sync m16n8k16, fp32 accumulators; Q fragments from registers (ldmatrix once)
 *                    or from shared memory per k step (configs short of registers); K by ldmatrix
 *                    (K rows are the n dimension of S).
 *   mask             only on tiles that need it: past seqlen_k, or crossing the causal diagonal
 *                    (query i sees key j iff j <= i + causal_offset); a run-time branch per tile.
 *   online softmax   fp32, base 2 with log2(e) folded into the scale: one FFMA + one EX2 per score;
 *                    row max over the 4 lanes of a quad by shuffle-xor; O and the row sum rescaled by
 *                    exp2(m_old - m_new); the row sum stays per lane until the end.
 *   O += P V         the S accumulators of two adjacent n8 tiles repack in registers (pack2) into one
 *                    k16 A fragment; V by ldmatrix.trans.
 * End: O / l and lse = (m + log2 l) ln 2, through this warp's own rows of the Q buffer to 16-byte
 * global stores. A row with no visible key has l = 0: it writes O = 0 and lse = -inf.
 * Key tiles past the last one visible to the CTA's last row are never loaded; query tiles run in
 * reverse order so the heaviest causal tiles are scheduled first.
 *
 * Shared memory: Q (kBlockM, kHeadDim) | K[2] (kBlockN, kHeadDim) | V[1 or 2] (kBlockN, kHeadDim),
 * 16-bit rows; the 16-byte chunk c of row r is stored at chunk c ^ (r % 8), so cp.async stores,
 * ldmatrix (plain and .trans) and the epilogue's row writes are free of bank conflicts. Head dims
 * below the config's kHeadDim are zero-filled on load and masked on store; rows past the end are
 * zero-filled. Every config fits the A100's 163 KB.
 *
 * A negative softmax scale negates Q in shared memory once and runs with |scale| (the max-subtraction
 * needs a positive factor); a zero scale runs with FLT_MIN (masked -inf scores stay -inf).
 *
 * Configs (FWD_CFG_*), chosen on the H200 with dev/fwd_bench.sh; bf16, 16k tokens, nheads = 2048 / d,
 * TFLOP/s = 4 B H Sq Sk D / t (halved for causal), non-causal | causal at seqlen 512 / 2k / 8k:
 *   d <= 64 : 128 x 64, 4 warps, Q in registers, 2 x V    267 313 326 | 180 271 309
 *   d <= 128: 128 x 48, 4 warps, Q from smem,    2 x V    295 356 377 | 199 293 335
 *   d <= 256: 128 x 64, 8 warps, Q from smem,    1 x V    267 313 327 | 183 256 294
 * (torch's FA2 backend on the same H200: ~307 d64, 339-353 d128, 324 d256.) All use 240-255
 * registers, no spills on sm_80 or sm_90a; 2 CTAs (8 warps) per SM at d <= 128, 1 CTA at d256.
 * Where the time goes: 2 warps per scheduler with no overlap inside a warp between its mma, softmax
 * and loads (registers allow no more); at d256 16-row warps re-read K, V and Q from shared memory.
 * Runners-up: d64 128x80 (+2% at 8k, -6% at 512), d128 128x64 (-3%, spills), d128 128x32 (-5%),
 * d256 128x48 (-4%), 64-row CTAs (-5 to -15%), 8-warp CTAs at d <= 128 (-2 to -10%).
 * Build: nvcc -std=c++17 -O3 -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90a,code=sm_90a
 */
#include <float.h>
#include <limits.h>
#include <stdint.h>

#include "launch.h"
#include "ptx.cuh"

/* Tile configs: head dim, block M, block N, warps, Q fragments kept in registers, minimum CTAs per SM
 * (register cap for __launch_bounds__). Overridable with -D for tuning (dev/fwd_bench.sh); the
 * defaults are the measured best. */
#ifndef FWD_CFG_D64
#define FWD_CFG_D64 64, 128, 64, 4, true, 1
#endif
#ifndef FWD_CFG_D128
#define FWD_CFG_D128 128, 128, 48, 4, false, 1
#endif
#ifndef FWD_CFG_D256
#define FWD_CFG_D256 256, 128, 64, 8, false, 1
#endif

static constexpr int kWarpSize = 32;
static constexpr unsigned kFullMask = 0xffffffffu;
static constexpr int kMmaM = 16;              /* m16n8k16 */
static constexpr int kMmaN = 8;
static constexpr int kMmaK = 16;
static constexpr int kChunkElems = 8;         /* one 16-byte chunk = 8 16-bit elements */
static constexpr int kChunkShift = 4;         /* log2(16 bytes) */
static constexpr int kSwizzleMask = 7;        /* 8 chunks of 16 bytes span all 32 banks */
static constexpr int kSwizzleSpanShift = 7;   /* log2(8 chunks x 16 bytes) */
static constexpr int kElemBytes = 2;          /* fp16 / bf16 */
static constexpr int kQuadLanes = 4;          /* lanes sharing one accumulator row */
static constexpr int kMaxHeadDim = 256;
static constexpr int kMaxGridYZ = 65535;
static constexpr size_t kDefaultSmemBytes = 48 * 1024;
static constexpr size_t kSm80MaxSmemBytes = 163 * 1024; /* A100 opt-in limit per CTA */
static constexpr uint32_t kSignBits2 = 0x80008000u; /* sign bits of two packed 16-bit floats */
static constexpr float kLn2 = 0.693147180559945309f;

/* Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile of kHeadDim-wide rows. */
template <int kHeadDim>
__device__ __forceinline__ uint32_t swz(int row, int chunk)
{
    return (uint32_t)(row * kHeadDim * kElemBytes) + ((uint32_t)(chunk ^ (row & kSwizzleMask)) << kChunkShift);
}

/* cp.async rows [row0, row0 + kRows) of one (batch, head) slice into a swizzled tile at `tile`.
 * base: (nrows, d) with row stride row_stride. Rows >= nrows and chunks past d are zero-filled. */
template <typename T, int kHeadDim, int kRows, int kThreads>
__device__ __forceinline__ void load_tile(uint32_t tile, const T *base, int64_t row_stride, int row0, int nrows,
                                          int d, int tid)
{
    constexpr int kChunks = kHeadDim / kChunkElems;
    constexpr int kRowStep = kThreads / kChunks;
    static_assert(kThreads % kChunks == 0 && kRows % kRowStep == 0, "tile does not split evenly over threads");
    asm volatile("" : "+r"(tid)); /* recompute this thread's row / chunk per call, never hoisted (registers) */
    const int chunk = tid % kChunks;
    const int row = tid / kChunks;
    const bool chunk_ok = chunk * kChunkElems < d;
    const T *src = base + (int64_t)(row0 + row) * row_stride + chunk * kChunkElems;
#pragma unroll
    for (int i = 0; i < kRows / kRowStep; i++) {
        const bool ok = chunk_ok && row0 + row + i * kRowStep < nrows;
        cp_async_16(tile + swz<kHeadDim>(row + i * kRowStep, chunk), ok ? (const void *)src : (const void *)base, ok);
        src += kRowStep * row_stride;
    }
}

/* Flip the sign of the chunks of a tile this thread loaded with load_tile (after its cp.async wait). */
template <int kHeadDim, int kRows, int kThreads>
__device__ __forceinline__ void negate_tile(unsigned char *tile, int tid)
{
    constexpr int kChunks = kHeadDim / kChunkElems;
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

/* ldmatrix address of chunk pair `pair` (chunks 2 pair, 2 pair + 1) given the lane's address of pair 0
 * in a swizzled tile whose rows start on 128-byte boundaries. */
__device__ __forceinline__ uint32_t chunk_pair(uint32_t lane_addr, int pair)
{
    constexpr int kPairsPerSwizzle = (kSwizzleMask + 1) / 2;
    return (lane_addr ^ ((uint32_t)(2 * (pair % kPairsPerSwizzle)) << kChunkShift)) +
           ((uint32_t)(pair / kPairsPerSwizzle) << kSwizzleSpanShift);
}

/* V buffers: two (V_{j+1} loads during tile j) unless that overflows the sm80 shared-memory limit;
 * then one, V_j loading during S_j and the softmax. */
__host__ __device__ constexpr int fwd_v_stages(int head_dim, int block_m, int block_n)
{
    return (size_t)(block_m + 4 * block_n) * head_dim * kElemBytes <= kSm80MaxSmemBytes ? 2 : 1;
}

/* Dynamic shared memory of one CTA: Q, two K buffers, V buffers. */
__host__ __device__ constexpr size_t fwd_smem_bytes(int head_dim, int block_m, int block_n)
{
    return (size_t)(block_m + (2 + fwd_v_stages(head_dim, block_m, block_n)) * block_n) * head_dim * kElemBytes;
}

/* Start of the (sk, d) slice of K or V for (batch, kv_head). Rebuilt at every tile load: the empty asm
 * hides the indices from loop-invariant hoisting, which would keep two 64-bit pointers live through
 * the main loop (they spill at kHeadDim 128 on sm80). */
template <typename T>
__device__ __forceinline__ const T *kv_slice(const void *base, flash_strides st, int batch, int kv_head)
{
    asm volatile("" : "+r"(batch), "+r"(kv_head));
    return (const T *)base + (int64_t)batch * st.batch + (int64_t)kv_head * st.head;
}

__device__ __forceinline__ int64_t clamp64(int64_t x, int64_t lo, int64_t hi)
{
    return x < lo ? lo : (x > hi ? hi : x);
}

template <typename T, int kHeadDim, int kBlockM, int kBlockN, int kNWarps, bool kQInRegs, int kMinBlocks>
__global__ void __launch_bounds__(kNWarps *kWarpSize, kMinBlocks) flash_fwd_sm80_kernel(const flash_params p)
{
    constexpr int kThreads = kNWarps * kWarpSize;
    constexpr int kWarpRows = kBlockM / kNWarps; /* query rows per warp */
    constexpr int kMT = kWarpRows / kMmaM;       /* m16 tiles per warp */
    constexpr int kNT = kBlockN / kMmaN;         /* n8 tiles of S */
    constexpr int kDT = kHeadDim / kMmaN;        /* n8 tiles of O */
    constexpr int kQK = kHeadDim / kMmaK;        /* k16 steps of S = Q K^T */
    constexpr int kPV = kBlockN / kMmaK;         /* k16 steps of O += P V */
    constexpr int kChunks = kHeadDim / kChunkElems;
    constexpr uint32_t kRowBytes = kHeadDim * sizeof(T);
    constexpr uint32_t kKVBytes = kBlockN * kRowBytes;
    constexpr int kVStages = fwd_v_stages(kHeadDim, kBlockM, kBlockN);
    static_assert(sizeof(T) == kElemBytes, "16-bit types only");
    static_assert(kWarpRows % kMmaM == 0 && kBlockN % kMmaK == 0, "tile shape");
    static_assert(kChunks % (kSwizzleMask + 1) == 0, "swizzle needs rows of at least 128 bytes");
    static_assert((kWarpRows * kChunks) % kWarpSize == 0, "epilogue split");
    static_assert(fwd_smem_bytes(kHeadDim, kBlockM, kBlockN) <= kSm80MaxSmemBytes, "tile exceeds sm80 shared memory");

    /* sQ (kBlockM, kHeadDim) | sK[2] (kBlockN, kHeadDim) | sV[kVStages] (kBlockN, kHeadDim), swizzled */
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t sQ = smem_u32(smem);
    const uint32_t sK = sQ + kBlockM * kRowBytes;
    const uint32_t sV = sK + 2 * kKVBytes;

    const int tid = threadIdx.x;
    const int warp = tid / kWarpSize;
    const int lane = tid % kWarpSize;
    const int m_block = gridDim.x - 1 - blockIdx.x;
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    const int kv_head = (int)(head / p.h_per_kv);
    const int sq = (int)p.sq;
    const int sk = (int)p.sk;
    const int d = (int)p.d;
    const int row0 = m_block * kBlockM;

    /* q, o: (sq, d) with row strides q_s.row, o_s.row; lse: (sq); k, v: see kv_slice */
    const T *q = (const T *)p.q + (int64_t)batch * p.q_s.batch + (int64_t)head * p.q_s.head;
    T *o = (T *)p.o + (int64_t)batch * p.o_s.batch + (int64_t)head * p.o_s.head;
    float *lse = (float *)p.lse + ((int64_t)batch * p.h + head) * p.sq;

    /* Key tiles [0, n_tiles) hold a key visible to some row of this CTA; [0, n_full) need no mask. */
    const int last_row = min(row0 + kBlockM, sq) - 1;
    int n_end = sk;
    int n_full = sk / kBlockN;
    if (p.causal) {
        n_end = (int)clamp64(last_row + p.causal_offset + 1, 0, sk);
        n_full = min(n_full, (int)(clamp64(row0 + p.causal_offset + 1, 0, sk) / kBlockN));
    }
    const int n_tiles = (n_end + kBlockN - 1) / kBlockN;
    const int diag_max = (int)clamp64(p.causal_offset, -sq, sk); /* causal: visible iff col - row <= diag_max */
    const float scale = fmaxf(fabsf(p.scale_log2), FLT_MIN);

    load_tile<T, kHeadDim, kBlockM, kThreads>(sQ, q, p.q_s.row, row0, sq, d, tid);
    cp_async_commit();
    if (n_tiles > 0) {
        load_tile<T, kHeadDim, kBlockN, kThreads>(sK, kv_slice<T>(p.k, p.k_s, batch, kv_head), p.k_s.row, 0, sk, d,
                                                  tid);
        if constexpr (kVStages == 2)
            load_tile<T, kHeadDim, kBlockN, kThreads>(sV, kv_slice<T>(p.v, p.v_s, batch, kv_head), p.v_s.row, 0, sk,
                                                      d, tid);
    }
    cp_async_commit();
    cp_async_wait<1>();
    if (p.scale_log2 < 0.f)
        negate_tile<kHeadDim, kBlockM, kThreads>(smem, tid);
    __syncthreads();

    /* ldmatrix lane addressing: matrix lane / 8 takes its row lane % 8, which is also the row's swizzle
     * key. Rows start on 128-byte boundaries (the dynamic smem base is 1024-aligned), so chunk 2 kk + c
     * of a row sits at row + ((c ^ key) << 4) XOR ((2 kk % 8) << 4), plus 128 bytes per 8 chunks:
     * chunk_pair() below, one LOP3 and an immediate offset per ldmatrix. */
    const int lr = lane % 8;
    const int mi = lane / 8;
    const uint32_t q_lane = sQ + (warp * kWarpRows + (mi & 1) * 8 + lr) * kRowBytes + (((mi >> 1) ^ lr) << kChunkShift);
    const uint32_t k_lane = ((mi >> 1) * 8 + lr) * kRowBytes + (((mi & 1) ^ lr) << kChunkShift);
    const uint32_t v_lane = ((mi & 1) * 8 + lr) * kRowBytes + (((mi >> 1) ^ lr) << kChunkShift);

    uint32_t qf[kQInRegs ? kMT : 1][kQInRegs ? kQK : 1][4];
    if constexpr (kQInRegs) {
#pragma unroll
        for (int t = 0; t < kMT; t++)
#pragma unroll
            for (int kk = 0; kk < kQK; kk++)
                ldmatrix_x4(qf[t][kk], chunk_pair(q_lane + t * kMmaM * kRowBytes, kk));
    }

    float acc[kMT][kDT][4];   /* O accumulators: rows lane/4 (+8), cols 2*(lane%4) (+1) of each n8 tile */
    float m_run[kMT][2];      /* running max of the raw scores of rows lane/4 and lane/4 + 8 */
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

    for (int j = 0; j < n_tiles; j++) {
        cp_async_wait<0>();
        __syncthreads(); /* K_j (and V_j) landed; every warp is done with tile j - 1's buffers */
        if constexpr (kVStages == 1) {
            load_tile<T, kHeadDim, kBlockN, kThreads>(sV, kv_slice<T>(p.v, p.v_s, batch, kv_head), p.v_s.row,
                                                      j * kBlockN, sk, d, tid);
            cp_async_commit();
        }
        if (j + 1 < n_tiles) {
            const uint32_t next = ((j + 1) & 1) * kKVBytes;
            load_tile<T, kHeadDim, kBlockN, kThreads>(sK + next, kv_slice<T>(p.k, p.k_s, batch, kv_head), p.k_s.row,
                                                      (j + 1) * kBlockN, sk, d, tid);
            if constexpr (kVStages == 2)
                load_tile<T, kHeadDim, kBlockN, kThreads>(sV + next, kv_slice<T>(p.v, p.v_s, batch, kv_head),
                                                          p.v_s.row, (j + 1) * kBlockN, sk, d, tid);
        }
        cp_async_commit();
        const uint32_t kb = sK + (j & 1) * kKVBytes + k_lane;
        const uint32_t vb = sV + (kVStages == 2 ? (j & 1) * kKVBytes : 0) + v_lane;

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
                    ldmatrix_x4(a[t], chunk_pair(q_lane + t * kMmaM * kRowBytes, kk));
                }
            }
#pragma unroll
            for (int np = 0; np < kNT / 2; np++) {
                uint32_t b[4];
                ldmatrix_x4(b, chunk_pair(kb + np * 2 * kMmaN * kRowBytes, kk));
#pragma unroll
                for (int t = 0; t < kMT; t++) {
                    mma_m16n8k16<T>(s[t][2 * np], a[t], b);
                    mma_m16n8k16<T>(s[t][2 * np + 1], a[t], b + 2);
                }
            }
        }

        /* mask keys past seqlen_k and past the causal diagonal (only tiles that cross either); written
         * with col - row so that no per-row limit stays live across the loop */
        if (j >= n_full) {
            const int col0 = j * kBlockN + 2 * (lane % kQuadLanes);
            const int diag0 = col0 - (row0 + warp * kWarpRows + lane / kQuadLanes);
#pragma unroll
            for (int t = 0; t < kMT; t++)
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int nt = 0; nt < kNT; nt++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            const int col = col0 + nt * kMmaN + e;
                            const int diag = diag0 + nt * kMmaN + e - t * kMmaM - h * 8;
                            if (col >= sk || (p.causal && diag > diag_max))
                                s[t][nt][2 * h + e] = -INFINITY;
                        }
        }

        /* online softmax: P = exp2(S * scale - m * scale), rescale O and l by exp2((m_old - m) * scale) */
#pragma unroll
        for (int t = 0; t < kMT; t++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float mx = m_run[t][h];
#pragma unroll
                for (int nt = 0; nt < kNT; nt++)
                    mx = fmaxf(mx, fmaxf(s[t][nt][2 * h], s[t][nt][2 * h + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 2));
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

        if constexpr (kVStages == 1) {
            cp_async_wait<1>(); /* V_j landed; K_{j+1} may still be in flight */
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
                ldmatrix_x4_trans(b, chunk_pair(vb + kk * kMmaK * kRowBytes, dp));
#pragma unroll
                for (int t = 0; t < kMT; t++) {
                    mma_m16n8k16<T>(acc[t][2 * dp], a[t], b);
                    mma_m16n8k16<T>(acc[t][2 * dp + 1], a[t], b + 2);
                }
            }
        }
    }

    /* epilogue: O / l into this warp's rows of sQ (only this warp ever read them), then to global */
    __syncwarp();
#pragma unroll
    for (int t = 0; t < kMT; t++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float l = l_run[t][h];
            l += __shfl_xor_sync(kFullMask, l, 1);
            l += __shfl_xor_sync(kFullMask, l, 2);
            const float inv = l > 0.f ? 1.f / l : 0.f;
            const int r = warp * kWarpRows + t * kMmaM + h * 8 + lane / kQuadLanes;
            if (lane % kQuadLanes == 0 && row0 + r < sq)
                lse[row0 + r] = l > 0.f ? (m_run[t][h] * scale + log2f(l)) * kLn2 : -INFINITY;
#pragma unroll
            for (int dt = 0; dt < kDT; dt++)
                *(uint32_t *)(smem + swz<kHeadDim>(r, dt) + (lane % kQuadLanes) * sizeof(uint32_t)) =
                    pack2<T>(acc[t][dt][2 * h] * inv, acc[t][dt][2 * h + 1] * inv);
        }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < kWarpRows * kChunks / kWarpSize; i++) {
        const int idx = i * kWarpSize + lane;
        const int r = warp * kWarpRows + idx / kChunks;
        const int chunk = idx % kChunks;
        if (row0 + r < sq && chunk * kChunkElems < d)
            *(uint4 *)(o + (int64_t)(row0 + r) * p.o_s.row + chunk * kChunkElems) =
                *(const uint4 *)(smem + swz<kHeadDim>(r, chunk));
    }
}

template <typename T, int kHeadDim, int kBlockM, int kBlockN, int kNWarps, bool kQInRegs, int kMinBlocks>
static cudaError_t launch_fwd(const flash_params *p, cudaStream_t stream)
{
    const size_t smem_bytes = fwd_smem_bytes(kHeadDim, kBlockM, kBlockN);
    void (*kernel)(const flash_params) =
        flash_fwd_sm80_kernel<T, kHeadDim, kBlockM, kBlockN, kNWarps, kQInRegs, kMinBlocks>;
    if (smem_bytes > kDefaultSmemBytes) {
        const cudaError_t err =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes);
        if (err != cudaSuccess)
            return err;
    }
    const dim3 grid((unsigned)((p->sq + kBlockM - 1) / kBlockM), (unsigned)p->h, (unsigned)p->b);
    kernel<<<grid, kNWarps * kWarpSize, smem_bytes, stream>>>(*p);
    return cudaGetLastError();
}

template <typename T>
static cudaError_t dispatch_head_dim(const flash_params *p, cudaStream_t stream)
{
    if (p->d <= 64)
        return launch_fwd<T, FWD_CFG_D64>(p, stream);
    if (p->d <= 128)
        return launch_fwd<T, FWD_CFG_D128>(p, stream);
    return launch_fwd<T, FWD_CFG_D256>(p, stream);
}

template <int kHeadDim, int kBlockM, int kBlockN, int kNWarps, bool kQInRegs, int kMinBlocks>
static constexpr size_t config_smem_bytes(void)
{
    return fwd_smem_bytes(kHeadDim, kBlockM, kBlockN);
}

extern "C" size_t flash_fwd_smem_needed(const flash_params *p)
{
    if (p->d <= 64)
        return config_smem_bytes<FWD_CFG_D64>();
    if (p->d <= 128)
        return config_smem_bytes<FWD_CFG_D128>();
    return config_smem_bytes<FWD_CFG_D256>();
}

extern "C" cudaError_t flash_fwd_sm80(const flash_params *p, cudaStream_t stream)
{
    if (p->d < 1 || p->d > kMaxHeadDim || p->d % kChunkElems != 0 || p->sq > INT_MAX || p->sk > INT_MAX ||
        p->h > kMaxGridYZ || p->b > kMaxGridYZ || p->h_per_kv < 1)
        return cudaErrorInvalidValue;
    if (p->b == 0 || p->h == 0 || p->sq == 0)
        return cudaSuccess;
    if (p->dtype == FLASH_FP16)
        return dispatch_head_dim<__half>(p, stream);
    if (p->dtype == FLASH_BF16)
        return dispatch_head_dim<__nv_bfloat16>(p, stream);
    return cudaErrorInvalidValue;
}
