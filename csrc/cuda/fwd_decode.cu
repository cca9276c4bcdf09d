/* fwd_decode.cu: the forward for a few query rows per KV head (decode, speculative decode) over long key
 * sets, with split-KV (Flash-Decoding), for fp16 / bf16 on tensor cores (mma.sync), sm80 and later.
 *
 * Algorithm. The rows of a CTA are up to kRows (one m16 tile) of the seqlen_q x (h / h_kv) rows that
 * share one KV head (GQA packing: row x is query x / g of query head kv_head * g + x % g, g = h / h_kv),
 * so the cache is read once per KV head, not once per query head. The CTA's key tiles (mask.h
 * flash_key_tiles over its queries, in tiles of kWarpKeys keys) are cut into num_splits contiguous
 * slices, one per CTA of the grid's x dimension. Inside a CTA the warps split the keys, not the rows:
 * warp w of the CTA's nwarps takes the slice's tiles w, w + nwarps, ..., each through its own kStages-deep cp.async ring in
 * shared memory (no CTA barrier in the main loop, only __syncwarp), and keeps its own online softmax
 * (running max m, sum l, unnormalized O, natural-log units). Per tile, per warp:
 *   S = Q K^T        mma.sync m16n8k16 (2 n8 tiles), Q fragments from registers (d <= 128) or shared memory
 *   score hook       s = scale q.k, softcap (tanh.approx, as the other tensor-core kernels), ALiBi of the
 *                    row's own head, band / seqlen_k mask (flash_visible) on tiles outside the full range
 *   online softmax   P = exp2((s - m) log2 e), O and l rescaled on a new max
 *   O += P V         P repacked from the S accumulators, V by ldmatrix.trans
 * End: the warps' (m, l, O) merge through shared memory. One split: out = O / l with the sink
 * (flash_row_finish_f) and lse. Several: the normalized partial O and its lse go to o_accum /
 * lse_accum, and flash_fwd_combine_kernel merges the splits of each row (exactly: weights exp(lse_s -
 * lse)) and applies the sink; on sm90 it is a programmatic dependent launch, started while the decode grid
 * drains. Split count: flash_fwd_decode_splits, FA2's wave-efficiency rule over the SMs' CTA slots, each
 * split kMinRounds rounds of nwarps tiles at least.
 * Paged KV caches (p.block_table, read once per CTA: the kernel holds the main loop twice, contiguous and paged,
 * and runs one; a branch inside the loop cost the contiguous one-split path 15-26% on the H200): each lane looks
 * up the page of one key of the tile (mask.h flash_key_offset) and the lanes exchange the rows' offsets by
 * shuffle: one table read per key and tile.
 *
 * Tiles (DecodeCfg from tiles.h decode_tiles): kRows 16, kWarpKeys 16, kStages 4 / 3 / 2 at d 64 / 128 / 256;
 * 4 warps (shared memory 66 / 100 / 136 KB: 3 / 2 / 1 CTAs per SM), or 8 at d <= 128 when the unsplit grid is
 * small (decode_warps, at run time: one kernel per head dim takes both; 130 / 196 KB, 1 CTA per SM). Speed on the H200 (bf16 d128, TB/s of K+V read,
 * benchmarks/results/h200/decode_2026-12-01c): B8 H32 131k 4.47 (cuDNN 4.49), B1 H32/KV8 131k 3.64 with 4 warps
 * (cuDNN 3.86; 8 warps: 3% faster in the harness), 0.85-1.00x cuDNN over 4k-131k caches.
 * Varlen batches (flash_attn_varlen_func, paged or not) as dense ones: each CTA reads its sequence through
 * flash_seq_of; the grid spans max_seqlen_q and CTAs past a sequence's rows leave at once.
 * Not served here (launch.cu sends them to fwd_sm80): attn_mask, dropout, more than FLASH_DECODE_MAX_ROWS
 * rows per KV head.
 */
#include <float.h>
#include <limits.h>
#include <stdint.h>

#include <type_traits>

#include "../constants.h"
#include "../mask.h"
#include "../score.h"
#include "common.cuh"
#include "launch.h"
#include "tiles.h"

namespace {

constexpr int kMmaM = 16; /* m16n8k16 */
constexpr int kMmaN = 8;
constexpr int kMmaK = 16;
constexpr int kElemBytes = 2;   /* fp16 / bf16 */
constexpr int kChunkShift = 4;  /* log2(16 bytes) */
constexpr int kSwizzleMask = 7; /* 8 chunks of 16 bytes span all 32 banks */
constexpr int kQuadLanes = 4;   /* lanes sharing one accumulator row */
constexpr int kHalfRows = 8;    /* accumulator rows lane / 4 and lane / 4 + 8 */
constexpr int kWarpsMany = decode_warps_per_cta::WARPS; /* when the grid fills the SMs without splitting much */
constexpr int kWarpsFew = decode_warps_per_cta::WARPS_FEW; /* when it does not (decode_warps), head dims <= 128 */
constexpr int kWarpsLeast = 2; /* the fewest decode_warps gives where kWarpsMany's rings do not fit the device */
constexpr int kFewCtasPerSm = 4; /* "few": fewer than one unsplit CTA per kFewCtasPerSm SMs */
constexpr int kRows = kMmaM;     /* rows of a CTA */
constexpr int kWarpKeys = 16;    /* keys of one warp tile: 2 n8 tiles of S, one k16 step of P V */
constexpr int kMaxSplits = 128;            /* most key splits of one row block */
constexpr double kWaveEfficiency = 0.95;   /* the split heuristic's tolerance to the best wave efficiency */
constexpr int kMinRounds = 4;              /* the fewest rounds of nwarps key tiles per split */
constexpr size_t kDefaultSmemBytes = 48 * 1024;
constexpr int kMergePad = 4;     /* floats of padding per merge row (bank spread) */
constexpr int kCombineWarps = 4; /* rows per combine CTA, one warp each */
constexpr float kLog2e = FLASH_LOG2E_F;

/* A config: kHeadDim (compiled width; smaller head dims are zero-filled), the most warps per CTA (the warps of a
 * launch are its block size, chosen at run time by decode_warps: kWarpsFew only at d <= 128), cp.async ring depth
 * per warp (tiles.h), Q fragments in registers (d <= 128). */
template <int kHeadDim_>
struct DecodeCfg {
    static constexpr int kHeadDim = kHeadDim_, kMaxWarps = kHeadDim_ <= 128 ? kWarpsFew : kWarpsMany;
    static constexpr int kStages = decode_tiles<kHeadDim_>::STAGES;
    static constexpr bool kQInRegs = kHeadDim_ <= 128;
};

/* Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile of kRowBytes-wide rows: chunk c
 * of row r sits at c ^ (r % 8), so cp.async stores and ldmatrix (plain and .trans) are conflict-free. */
template <int kRowBytes>
__device__ __forceinline__ uint32_t swz(int row, int chunk)
{
    return (uint32_t)(row * kRowBytes) + ((uint32_t)(chunk ^ (row & kSwizzleMask)) << kChunkShift);
}

template <typename Cfg>
__host__ __device__ constexpr size_t decode_q_bytes()
{
    return (size_t)kRows * Cfg::kHeadDim * kElemBytes;
}

/* one warp's ring: kStages x (K tile, V tile) of kWarpKeys rows */
template <typename Cfg>
__host__ __device__ constexpr size_t decode_ring_bytes()
{
    return (size_t)Cfg::kStages * 2 * kWarpKeys * Cfg::kHeadDim * kElemBytes; /* K and V */
}

/* one warp's (m, l, O) at the end, over its ring */
template <typename Cfg>
__host__ __device__ constexpr size_t decode_merge_bytes()
{
    return (size_t)kRows * (Cfg::kHeadDim + kMergePad + 2) * sizeof(float);
}

template <typename Cfg>
__host__ __device__ constexpr size_t decode_smem_bytes(int warps)
{
    return decode_q_bytes<Cfg>() + warps * decode_ring_bytes<Cfg>();
}

/* Rows and grid of a decode launch (varlen: of the longest sequence, p->sq = max_seqlen_q). */
__host__ __device__ inline int64_t decode_packed_rows(const flash_params *p) { return p->sq * p->h_per_kv; }
__host__ __device__ inline int64_t decode_row_blocks(const flash_params *p)
{
    return flash_cdiv64(decode_packed_rows(p), kRows);
}

/* o[0, 8) += w src[0, 8) (src 16-byte aligned: two vector loads). */
__device__ __forceinline__ void axpy8(float (&o)[CHUNK], float w, const float *src)
{
    const float4 lo = *(const float4 *)src, hi = *(const float4 *)(src + 4);
    o[0] += w * lo.x, o[1] += w * lo.y, o[2] += w * lo.z, o[3] += w * lo.w;
    o[4] += w * hi.x, o[5] += w * hi.y, o[6] += w * hi.z, o[7] += w * hi.w;
}

/* dst[0, 8) = o[0, 8) * factor in T (dst 16-byte aligned: one vector store). */
template <typename T>
__device__ __forceinline__ void store8(T *dst, const float (&o)[CHUNK], float factor)
{
    uint32_t packed[CHUNK / 2];
#pragma unroll
    for (int c = 0; c < CHUNK / 2; c++)
        packed[c] = pack2<T>(o[2 * c] * factor, o[2 * c + 1] * factor);
    *(uint4 *)dst = make_uint4(packed[0], packed[1], packed[2], packed[3]);
}

/* o_accum / lse_accum index of (split, batch, hq, query i): (num_splits, b, h, sq) rows of d floats. */
__device__ __forceinline__ int64_t accum_row(const flash_params &p, int split, int64_t batch, int64_t hq, int64_t i)
{
    return (((int64_t)split * p.b + batch) * p.h + hq) * p.sq + i;
}

/* Issue warp tile t's K and V rows into ring stage `stage` (zero-fill past sk and past d). Contiguous: row
 * j at base + j row_stride; paged: each lane finds the offset of key t kWarpKeys + lane % kWarpKeys
 * (flash_key_offset) and the rows' offsets come by shuffle. */
template <typename T, typename Cfg, bool kPaged>
__device__ __forceinline__ void load_kv(const flash_params &p, const flash_seq &seq, uint32_t sk_tile, uint32_t sv_tile,
                                        const T *kbase, const T *vbase, int t, int sk, int d, int lane)
{
    constexpr int kChunks = Cfg::kHeadDim / CHUNK;
    constexpr int kRowBytes = Cfg::kHeadDim * kElemBytes;
    constexpr int kLaneRows = FLASH_WARP_SIZE / kChunks; /* rows per instruction */
    constexpr int kSteps = kWarpKeys / kLaneRows;
    static_assert(FLASH_WARP_SIZE % kChunks == 0 && kWarpKeys % kLaneRows == 0, "tile split over the lanes");
    const int chunk = lane % kChunks;
    const int row = lane / kChunks;
    const bool chunk_ok = chunk * CHUNK < d;
    const int j0 = t * kWarpKeys;
    int64_t koff_l = 0, voff_l = 0;
    if constexpr (kPaged) {
        const int key = j0 + lane % kWarpKeys;
        if (key < sk) {
            koff_l = flash_key_offset(&p, &seq, p.k_s.batch, p.k_s.row, key);
            voff_l = p.v_s.batch == p.k_s.batch && p.v_s.row == p.k_s.row
                         ? koff_l
                         : flash_key_offset(&p, &seq, p.v_s.batch, p.v_s.row, key);
        }
    }
#pragma unroll
    for (int s = 0; s < kSteps; s++) {
        const int r = row + s * kLaneRows;
        const bool ok = chunk_ok && j0 + r < sk;
        int64_t koff, voff;
        if constexpr (kPaged) {
            koff = __shfl_sync(FULL_MASK, koff_l, r);
            voff = __shfl_sync(FULL_MASK, voff_l, r);
        } else {
            koff = (int64_t)(j0 + r) * p.k_s.row;
            voff = (int64_t)(j0 + r) * p.v_s.row;
        }
        const T *ks = kbase + koff + chunk * CHUNK;
        const T *vs = vbase + voff + chunk * CHUNK;
        cp_async_16(sk_tile + swz<kRowBytes>(r, chunk), ok ? (const void *)ks : (const void *)kbase, ok);
        cp_async_16(sv_tile + swz<kRowBytes>(r, chunk), ok ? (const void *)vs : (const void *)vbase, ok);
    }
}

/* grid (num_splits, row_blocks * h_kv, b); 32 threads per warp, up to Cfg::kMaxWarps warps */
template <typename T, typename Cfg>
__global__ void __launch_bounds__(Cfg::kMaxWarps *FLASH_WARP_SIZE) flash_fwd_decode_kernel(const __grid_constant__ flash_params p)
{
    const bool paged = p.block_table != NULL; /* grid-uniform: chooses the main loop's instance below */
    constexpr int kHeadDim = Cfg::kHeadDim;
    const int nwarps = (int)blockDim.x / FLASH_WARP_SIZE, nthreads = (int)blockDim.x;
    constexpr int kStages = Cfg::kStages;
    constexpr int kRowBytes = kHeadDim * kElemBytes;
    constexpr int kTileBytes = kWarpKeys * kRowBytes;
    constexpr int kDT = kHeadDim / kMmaN;  /* n8 tiles of O */
    constexpr int kQK = kHeadDim / kMmaK;  /* k16 steps of S = Q K^T */
    constexpr int kChunks = kHeadDim / CHUNK;
    constexpr int kMergeRow = kHeadDim + kMergePad;
    static_assert(sizeof(T) == kElemBytes, "16-bit types only");
    static_assert(decode_merge_bytes<Cfg>() <= decode_ring_bytes<Cfg>(), "merge area exceeds the rings");
    static_assert(kChunks % (kSwizzleMask + 1) == 0, "swizzle needs rows of at least 128 bytes");

    /* sQ (kRows, kHeadDim) | ring of warp 0 | ... | ring of warp nwarps - 1; each ring kStages x (K, V) tiles of
     * (kWarpKeys, kHeadDim), swizzled. At the end the rings hold the merge area: per warp, O (kRows, kMergeRow)
     * floats, then m (kRows), l (kRows). */
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t sQ = smem_u32(smem);
    const int tid = threadIdx.x;
    const int warp = tid / FLASH_WARP_SIZE;
    const int lane = tid % FLASH_WARP_SIZE;
    const uint32_t ring = sQ + (uint32_t)decode_q_bytes<Cfg>() + (uint32_t)(warp * decode_ring_bytes<Cfg>());

    const int split = blockIdx.x;
    const int row_blocks = (int)decode_row_blocks(&p);
    const int rb = blockIdx.y % row_blocks;
    const int64_t kv_head = blockIdx.y / row_blocks;
    const int64_t batch = blockIdx.z;
    const int64_t g = p.h_per_kv;
    const flash_seq seq = flash_seq_of(&p, batch);
    const int sq = (int)seq.sq;
    const int sk = (int)seq.sk;
    const int d = (int)p.d;
    const int64_t x_end = (int64_t)sq * g; /* packed rows of this KV head */
    const int64_t x0 = (int64_t)rb * kRows;
    if (x0 >= x_end) /* a varlen grid spans the longest sequence: its rows past this one's end have no CTA work */
        return;
    const int64_t x_last = flash_min64(x0 + kRows, x_end) - 1;

    /* Q rows: packed row x -> query x / g, head kv_head g + x % g (rows past x_end zero-filled) */
    {
        for (int idx = tid; idx < kRows * kChunks; idx += nthreads) {
            const int rr = idx / kChunks, chunk = idx % kChunks;
            const int64_t x = x0 + rr;
            const bool ok = x < x_end && chunk * CHUNK < d;
            const int64_t xi = ok ? x : 0;
            const T *src = (const T *)p.q + batch * p.q_s.batch + (seq.q_row0 + xi / g) * p.q_s.row +
                           (kv_head * g + xi % g) * p.q_s.head + chunk * CHUNK;
            cp_async_16(sQ + swz<kRowBytes>(rr, chunk), ok ? (const void *)src : p.q, ok);
        }
        cp_async_commit();
    }

    /* this CTA's key tiles: the split's slice of the band of its queries, in whole rounds of nwarps tiles */
    const int64_t i_first = x0 / g, i_last = x_last / g;
    const flash_tile_range kt = flash_key_tiles(&seq, i_first, i_last - i_first + 1, kWarpKeys);
    const int64_t n_tiles = kt.end - kt.first;
    const int64_t per_split = flash_cdiv64(flash_cdiv64(n_tiles, p.num_splits > 1 ? p.num_splits : 1), nwarps) * nwarps;
    const int t_begin = (int)flash_min64(kt.first + split * per_split, kt.end);
    const int t_end = (int)flash_min64(t_begin + per_split, kt.end);
    const int full_first = (int)kt.full_first, full_end = (int)kt.full_end;

    const T *kbase = (const T *)p.k + kv_head * p.k_s.head;
    const T *vbase = (const T *)p.v + kv_head * p.v_s.head;
    if (!paged) {
        kbase += seq.k_batch * p.k_s.batch + seq.k_row0 * p.k_s.row;
        vbase += seq.k_batch * p.v_s.batch + seq.k_row0 * p.v_s.row;
    }

    /* prologue: this warp's first kStages - 1 tiles (one cp.async group each, empty past the slice) */
#pragma unroll
    for (int s = 0; s < kStages - 1; s++) {
        const int t = t_begin + warp + s * nwarps;
        if (t < t_end && paged)
            load_kv<T, Cfg, true>(p, seq, ring + s * 2 * kTileBytes, ring + (s * 2 + 1) * kTileBytes, kbase, vbase, t, sk,
                                  d, lane);
        else if (t < t_end)
            load_kv<T, Cfg, false>(p, seq, ring + s * 2 * kTileBytes, ring + (s * 2 + 1) * kTileBytes, kbase, vbase, t, sk,
                                   d, lane);
        cp_async_commit();
    }
    cp_async_wait<kStages - 1>(); /* Q landed (the oldest group) */
    __syncthreads();
    grid_dependency_trigger();

    /* the lane's two rows (lane / 4, + 8): query, and the score hook of its head (score.h, natural units) */
    int qi[2];
    flash_score_f hook[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int64_t x = flash_min64(x0 + lane / kQuadLanes + h * kHalfRows, x_end - 1);
        qi[h] = (int)(x / g);
        hook[h] = flash_score_of(&p, seq.alibi_offset, batch, kv_head * g + x % g, 1.f);
    }
    const float scale = (float)p.scale;
    const int diag_lo = (int)seq.diag_lo, diag_hi = (int)seq.diag_hi, alibi_offset = (int)seq.alibi_offset;

    const int lr = lane % 8, mi = lane / 8;
    uint32_t qf[Cfg::kQInRegs ? kQK : 1][4];
    if constexpr (Cfg::kQInRegs) {
#pragma unroll
        for (int kk = 0; kk < kQK; kk++)
            ldmatrix_x4(qf[kk], sQ + swz<kRowBytes>((mi & 1) * 8 + lr, 2 * kk + (mi >> 1)));
    }

    float acc[kDT][4];
#pragma unroll
    for (int dt = 0; dt < kDT; dt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            acc[dt][e] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY}; /* natural-log units */
    float l_run[2] = {0.f, 0.f};             /* this lane's part of the row sums */

    /* the main loop, compiled once per layout of the cache (kP: paged) and chosen once: a branch on p.block_table
     * inside the loop costs the contiguous path a third of its instructions */
    auto main_loop = [&](auto paged_c) {
        constexpr bool kP = decltype(paged_c)::value;
        int stage = 0;
        for (int t = t_begin + warp; t < t_end; t += nwarps) {
            {
                const int tn = t + (kStages - 1) * nwarps;
                const int sn = (stage + kStages - 1) % kStages;
                if (tn < t_end)
                    load_kv<T, Cfg, kP>(p, seq, ring + sn * 2 * kTileBytes, ring + (sn * 2 + 1) * kTileBytes, kbase, vbase,
                                        tn, sk, d, lane);
                cp_async_commit();
            }
            cp_async_wait<kStages - 1>();
            __syncwarp();
            const uint32_t sKt = ring + stage * 2 * kTileBytes;
            const uint32_t sVt = sKt + kTileBytes;

            /* S = Q K^T: matrix mi of the x4 is n8 tile mi / 2, chunk mi % 2 of the k16 step */
            float s[2][4];
    #pragma unroll
            for (int nt = 0; nt < 2; nt++)
    #pragma unroll
                for (int e = 0; e < 4; e++)
                    s[nt][e] = 0.f;
    #pragma unroll
            for (int kk = 0; kk < kQK; kk++) {
                uint32_t a[4], b[4];
                if constexpr (Cfg::kQInRegs) {
    #pragma unroll
                    for (int e = 0; e < 4; e++)
                        a[e] = qf[kk][e];
                } else {
                    ldmatrix_x4(a, sQ + swz<kRowBytes>((mi & 1) * 8 + lr, 2 * kk + (mi >> 1)));
                }
                ldmatrix_x4(b, sKt + swz<kRowBytes>((mi >> 1) * 8 + lr, 2 * kk + (mi & 1)));
                mma_m16n8k16<T>(s[0], a, b);
                mma_m16n8k16<T>(s[1], a, b + 2);
            }

            /* score hook and mask, natural-log units: value (nt, 2 h + e) is row lane / 4 + 8 h, key
             * t kWarpKeys + 8 nt + 2 (lane % 4) + e */
            const bool masked = t < full_first || t >= full_end;
            const int key0 = t * kWarpKeys + 2 * (lane % kQuadLanes);
    #pragma unroll
            for (int nt = 0; nt < 2; nt++)
    #pragma unroll
                for (int h = 0; h < 2; h++)
    #pragma unroll
                    for (int e = 0; e < 2; e++) {
                        float x = s[nt][2 * h + e] * scale;
                        const int j = key0 + nt * kMmaN + e;
                        if (flash_score_capped(&p))
                            x = flash_score_cap_out(&hook[h], tanh_approx(flash_score_cap_in(&hook[h], x)));
                        if (flash_score_biased(&p))
                            x = flash_score_bias(&hook[h], x, j - qi[h] - alibi_offset, 0);
                        if (masked && (j >= sk || j - qi[h] < diag_lo || j - qi[h] > diag_hi))
                            x = -INFINITY;
                        s[nt][2 * h + e] = x;
                    }

            /* online softmax */
    #pragma unroll
            for (int h = 0; h < 2; h++) {
                float mx = fmaxf(m_run[h], fmaxf(fmaxf(s[0][2 * h], s[0][2 * h + 1]), fmaxf(s[1][2 * h], s[1][2 * h + 1])));
                mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 2));
                const float ms = mx == -INFINITY ? 0.f : mx * kLog2e;
                const float alpha = exp2_approx(m_run[h] * kLog2e - ms); /* 0 while m_old = -inf */
                m_run[h] = mx;
                float sum = 0.f;
    #pragma unroll
                for (int nt = 0; nt < 2; nt++)
    #pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const float pe = exp2_approx(fmaf(s[nt][2 * h + e], kLog2e, -ms));
                        s[nt][2 * h + e] = pe;
                        sum += pe;
                    }
                l_run[h] = l_run[h] * alpha + sum;
    #pragma unroll
                for (int dt = 0; dt < kDT; dt++) {
                    acc[dt][2 * h] *= alpha;
                    acc[dt][2 * h + 1] *= alpha;
                }
            }

            /* O += P V: matrix mi of the x4.trans is key half mi % 2, chunk mi / 2 of the pair */
            uint32_t a[4];
            a[0] = pack2<T>(s[0][0], s[0][1]);
            a[1] = pack2<T>(s[0][2], s[0][3]);
            a[2] = pack2<T>(s[1][0], s[1][1]);
            a[3] = pack2<T>(s[1][2], s[1][3]);
    #pragma unroll
            for (int dp = 0; dp < kDT / 2; dp++) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, sVt + swz<kRowBytes>((mi & 1) * 8 + lr, 2 * dp + (mi >> 1)));
                mma_m16n8k16<T>(acc[2 * dp], a, b);
                mma_m16n8k16<T>(acc[2 * dp + 1], a, b + 2);
            }
            __syncwarp(); /* every lane is done with this stage before the next load refills it */
            stage = (stage + 1) % kStages;
        }
    };
    if (paged)
        main_loop(std::true_type{});
    else
        main_loop(std::false_type{});

    /* merge the warps: each writes its m, l (quad-reduced) and O to the merge area */
    cp_async_wait<0>();
    __syncthreads();
    float *merge = (float *)(smem + decode_q_bytes<Cfg>());
    float *mo = merge + warp * kRows * (kMergeRow + 2);
    float *mm = mo + kRows * kMergeRow;
    float *ml = mm + kRows;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float l = l_run[h];
        l += __shfl_xor_sync(FULL_MASK, l, 1);
        l += __shfl_xor_sync(FULL_MASK, l, 2);
        const int r = lane / kQuadLanes + h * kHalfRows;
        if (lane % kQuadLanes == 0) {
            mm[r] = m_run[h];
            ml[r] = l;
        }
#pragma unroll
        for (int dt = 0; dt < kDT; dt++)
            *(float2 *)(mo + r * kMergeRow + dt * kMmaN + 2 * (lane % kQuadLanes)) =
                make_float2(acc[dt][2 * h], acc[dt][2 * h + 1]);
    }
    __syncthreads();

    /* each thread: chunks of 8 columns of some rows; (M, L) of the row from the warps' (m, l) */
    const bool split_out = p.num_splits > 1;
    for (int idx = tid; idx < kRows * kChunks; idx += nthreads) {
        const int r = idx / kChunks;
        const int chunk = idx % kChunks;
        const int64_t x = x0 + r;
        if (x >= x_end || chunk * CHUNK >= d)
            continue;
        const int64_t i = x / g, hq = kv_head * g + x % g;
        float mw[Cfg::kMaxWarps], M = -INFINITY;
#pragma unroll
        for (int w = 0; w < Cfg::kMaxWarps; w++) {
            mw[w] = w < nwarps ? merge[w * kRows * (kMergeRow + 2) + kRows * kMergeRow + r] : -INFINITY;
            M = fmaxf(M, mw[w]);
        }
        float L = 0.f, o[CHUNK];
#pragma unroll
        for (int c = 0; c < CHUNK; c++)
            o[c] = 0.f;
#pragma unroll
        for (int w = 0; w < Cfg::kMaxWarps; w++) {
            if (w >= nwarps)
                break;
            const float *base = merge + w * kRows * (kMergeRow + 2);
            const float wt = mw[w] == -INFINITY ? 0.f : __expf(mw[w] - M);
            L += wt * base[kRows * kMergeRow + kRows + r];
            axpy8(o, wt, base + r * kMergeRow + chunk * CHUNK);
        }
        if (split_out) {
            /* the split's normalized partial and its lse (-inf and 0 when it saw no key) */
            const int64_t row = accum_row(p, split, batch, hq, i);
            const float inv = L > 0.f ? 1.f / L : 0.f;
            float *dst = p.o_accum + row * p.d + chunk * CHUNK;
            *(float4 *)dst = make_float4(o[0] * inv, o[1] * inv, o[2] * inv, o[3] * inv);
            *(float4 *)(dst + 4) = make_float4(o[4] * inv, o[5] * inv, o[6] * inv, o[7] * inv);
            if (chunk == 0)
                p.lse_accum[row] = L > 0.f ? M + __logf(L) : -INFINITY;
        } else {
            float factor, lse;
            flash_row_finish_f(M, L, p.sink != nullptr ? ((const float *)p.sink)[hq] : -INFINITY, &factor, &lse);
            store8((T *)p.o + batch * p.o_s.batch + (seq.q_row0 + i) * p.o_s.row + hq * p.o_s.head +
                       chunk * CHUNK,
                   o, factor);
            if (chunk == 0)
                ((float *)p.lse)[flash_lse_offset(&p, &seq, batch, hq) + i] = lse;
        }
    }
}

/* Merge the num_splits partials of each (batch, hq, query) row: lse = log sum_s exp(lse_s), out = sum_s
 * exp(lse_s - lse) o_s, then the sink (flash_row_finish_f with m = lse, l = 1). One warp per row, 8 columns
 * per lane. grid (cdiv(b h sq, kCombineWarps)). A memory-bound pass: one kernel for both dtypes, whose threads
 * take the body of p.dtype (a uniform branch). */
template <typename T>
__device__ __forceinline__ void combine_rows(const flash_params &p)
{
    const int lane = threadIdx.x % FLASH_WARP_SIZE;
    const int64_t row = (int64_t)blockIdx.x * kCombineWarps + threadIdx.x / FLASH_WARP_SIZE;
    grid_dependency_wait();
    if (row >= p.b * p.h * p.sq)
        return;
    const int64_t i = row % p.sq, hq = row / p.sq % p.h, batch = row / (p.sq * p.h);
    const flash_seq seq = flash_seq_of(&p, batch);
    if (i >= seq.sq) /* a varlen sequence shorter than max_seqlen_q: no such row */
        return;
    const int64_t split_stride = p.b * p.h * p.sq; /* rows per split of the accumulators */
    float M = -INFINITY;
    for (int s = lane; s < p.num_splits; s += FLASH_WARP_SIZE)
        M = fmaxf(M, p.lse_accum[s * split_stride + row]);
#pragma unroll
    for (int o = FLASH_WARP_SIZE / 2; o > 0; o /= 2)
        M = fmaxf(M, __shfl_xor_sync(FULL_MASK, M, o));
    float sum = 0.f;
    if (M != -INFINITY) {
        for (int s = lane; s < p.num_splits; s += FLASH_WARP_SIZE)
            sum += __expf(p.lse_accum[s * split_stride + row] - M);
#pragma unroll
        for (int o = FLASH_WARP_SIZE / 2; o > 0; o /= 2)
            sum += __shfl_xor_sync(FULL_MASK, sum, o);
    }
    const float lse = M == -INFINITY ? -INFINITY : M + __logf(sum);
    float factor, lse_out;
    flash_row_finish_f(lse, M == -INFINITY ? 0.f : 1.f, p.sink != nullptr ? ((const float *)p.sink)[hq] : -INFINITY,
                       &factor, &lse_out);
    if (lane == 0)
        ((float *)p.lse)[flash_lse_offset(&p, &seq, batch, hq) + i] = lse_out;
    T *dst = (T *)p.o + batch * p.o_s.batch + (seq.q_row0 + i) * p.o_s.row + hq * p.o_s.head;
    for (int c = lane * CHUNK; c < p.d; c += FLASH_WARP_SIZE * CHUNK) {
        float o[CHUNK];
#pragma unroll
        for (int e = 0; e < CHUNK; e++)
            o[e] = 0.f;
        for (int s = 0; s < p.num_splits && M != -INFINITY; s++) {
            const float w = __expf(p.lse_accum[s * split_stride + row] - lse);
            axpy8(o, w, p.o_accum + (s * split_stride + row) * p.d + c);
        }
        store8(dst + c, o, factor);
    }
}

__global__ void __launch_bounds__(kCombineWarps *FLASH_WARP_SIZE) flash_fwd_combine_kernel(const __grid_constant__ flash_params p)
{
    if (p.dtype == FLASH_FP16)
        combine_rows<__half>(p);
    else
        combine_rows<__nv_bfloat16>(p);
}

template <typename T, typename Cfg>
cudaError_t launch_decode(const flash_params *p, int warps, cudaStream_t stream)
{
    const size_t smem = decode_smem_bytes<Cfg>(warps);
    void (*kernel)(const flash_params) = flash_fwd_decode_kernel<T, Cfg>;
    if (smem > kDefaultSmemBytes) {
        const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (err != cudaSuccess)
            return err;
    }
    const int splits = p->num_splits > 1 ? p->num_splits : 1;
    const dim3 grid((unsigned)splits, (unsigned)(decode_row_blocks(p) * p->h_kv), (unsigned)p->b);
    kernel<<<grid, warps * FLASH_WARP_SIZE, smem, stream>>>(*p);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess || splits == 1)
        return err;
    const int64_t rows = p->b * p->h * p->sq;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)flash_cdiv64(rows, kCombineWarps));
    cfg.blockDim = dim3(kCombineWarps * FLASH_WARP_SIZE);
    cfg.stream = stream;
    cudaLaunchAttribute attr;
    flash_launch_pdl(&cfg, &attr, 1);
    return cudaLaunchKernelEx(&cfg, flash_fwd_combine_kernel, *p);
}

template <typename Cfg>
cudaError_t dispatch_type(const flash_params *p, int warps, cudaStream_t stream)
{
    if (p->dtype == FLASH_FP16)
        return launch_decode<__half, Cfg>(p, warps, stream);
    return launch_decode<__nv_bfloat16, Cfg>(p, warps, stream);
}

/* f(the config for head dim d) */
template <typename F>
auto by_config(int64_t d, F f)
{
    if (d <= 64)
        return f(DecodeCfg<64>());
    if (d <= 128)
        return f(DecodeCfg<128>());
    return f(DecodeCfg<256>());
}

/* Warps per CTA: kWarpsFew when the unsplit grid holds fewer than one CTA per kFewCtasPerSm SMs (so the split
 * count, not the CTA count, makes the parallelism) and its config fits the device's shared memory; else
 * kWarpsMany, or fewer where kWarpsMany's rings do not fit (down to kWarpsLeast: sm86 / sm89's 99 KB take 3 warps
 * at d128, 2 at d256; the kernel takes any warp count up to its kMaxWarps). Measured on the H200
 * (decode_2026-12-01c): 8 warps are 3-6% faster at B1 GQA, 4 warps ~1.5% faster at B8. */
int decode_warps(const flash_params *p, int num_sms)
{
    const int64_t ctas = p->b * p->h_kv * decode_row_blocks(p);
    const size_t have = flash_smem_available();
    if (p->d <= 128 && ctas * kFewCtasPerSm < num_sms &&
        have >= by_config(p->d, [](auto cfg) { return decode_smem_bytes<decltype(cfg)>(kWarpsFew); }))
        return kWarpsFew;
    int warps = kWarpsMany;
    while (warps > kWarpsLeast &&
           have < by_config(p->d, [warps](auto cfg) { return decode_smem_bytes<decltype(cfg)>(warps); }))
        warps--;
    return warps;
}

/* CTAs of the decode kernel at head dim d with `warps` warps that fit one SM at once (0 if the query fails). */
int decode_ctas_per_sm(int64_t d, int warps, flash_dtype dtype)
{
    return by_config(d, [warps, dtype](auto cfg) {
        using Cfg = decltype(cfg);
        int n = 0;
        void (*kernel)(const flash_params) = dtype == FLASH_FP16 ? flash_fwd_decode_kernel<__half, Cfg>
                                                                 : flash_fwd_decode_kernel<__nv_bfloat16, Cfg>;
        const size_t smem = decode_smem_bytes<Cfg>(warps);
        if (smem > kDefaultSmemBytes &&
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
            return 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, warps * FLASH_WARP_SIZE, smem) != cudaSuccess)
            return 0;
        return n;
    });
}

int num_sms_of_device(void)
{
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        return 1;
    return sms;
}

} // namespace

extern "C" size_t flash_fwd_decode_smem(const flash_params *p)
{
    return by_config(p->d, [](auto cfg) { return decode_smem_bytes<decltype(cfg)>(kWarpsLeast); });
}

extern "C" int flash_fwd_decode_ok(const flash_params *p)
{
    /* has_hook must be set with a hook field (flash.h), as fwd_sm80 demands, although this kernel reads the fields
     * themselves */
    const bool hook_ok = p->has_hook || (p->softcap <= 0.0 && p->alibi_slopes == NULL);
    return (p->dtype == FLASH_FP16 || p->dtype == FLASH_BF16) && hook_ok && p->mask == NULL &&
           p->dropout_threshold == 0 && p->d >= 1 && p->d <= FLASH_CUDA_MAX_HEAD_DIM && p->d % CHUNK == 0 &&
           p->h_per_kv >= 1 && p->h_kv >= 1 && p->h == p->h_kv * p->h_per_kv && p->b <= FLASH_MAX_GRID_YZ &&
           p->sq >= 1 && decode_packed_rows(p) <= FLASH_DECODE_MAX_ROWS &&
           decode_row_blocks(p) * p->h_kv <= FLASH_MAX_GRID_YZ && p->sk <= INT_MAX && flash_block_table_ok(p);
}

extern "C" int flash_fwd_decode_splits(const flash_params *p, int requested, int num_sms)
{
    const int warps = decode_warps(p, num_sms);
    const int64_t tiles = flash_cdiv64(p->sk, kWarpKeys);
    const int64_t max_splits = flash_max64(1, flash_min64(kMaxSplits, tiles / (kMinRounds * warps)));
    if (requested > 0)
        return (int)flash_min64(requested, flash_min64(kMaxSplits, flash_max64(1, flash_cdiv64(tiles, warps))));
    /* per (head dim config, dtype, warps); 0: not yet asked (a device of this process, as the warp count) */
    static int ctas_per_sm[3][2][kWarpsFew + 1];
    int &cached = ctas_per_sm[p->d <= 64 ? 0 : (p->d <= 128 ? 1 : 2)][p->dtype == FLASH_FP16 ? 0 : 1][warps];
    if (cached <= 0)
        cached = decode_ctas_per_sm(p->d, warps, p->dtype);
    const int64_t slots = (int64_t)num_sms * flash_max64(1, cached);
    const int64_t ctas = p->b * p->h_kv * decode_row_blocks(p);
    /* the split count whose last wave is fullest (FA2's rule): the smallest within kWaveEfficiency of the best */
    double eff[kMaxSplits + 1], best = 0.0;
    for (int64_t n = 1; n <= max_splits; n++) {
        const int64_t work = ctas * n;
        eff[n] = (double)work / (double)(flash_cdiv64(work, slots) * slots);
        best = eff[n] > best ? eff[n] : best;
    }
    for (int64_t n = 1; n <= max_splits; n++)
        if (eff[n] >= kWaveEfficiency * best)
            return (int)n;
    return 1;
}

extern "C" cudaError_t flash_fwd_decode(const flash_params *p, cudaStream_t stream)
{
    if (!flash_fwd_decode_ok(p) || p->num_splits > kMaxSplits ||
        (p->num_splits > 1 && (p->o_accum == NULL || p->lse_accum == NULL)))
        return cudaErrorInvalidValue;
    if (p->b == 0 || p->h == 0)
        return cudaSuccess;
    const int warps = decode_warps(p, num_sms_of_device());
    return by_config(p->d, [p, warps, stream](auto cfg) { return dispatch_type<decltype(cfg)>(p, warps, stream); });
}
