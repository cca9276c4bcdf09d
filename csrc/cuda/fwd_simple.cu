/* fwd_simple.cu: attention forward for fp32 / fp64 on CUDA cores (reference-grade, for gradcheck).
 *
 * Algorithm: one CTA of kRows warps owns kRows query rows of one (batch, head); warp w owns row w, each
 * lane holding head-dim elements lane, lane + 32, ... of q and of the output accumulator. The CTA visits
 * only the key tiles of kBlockN keys that flash_key_tiles (mask.h) puts in the band of its rows, minus
 * those whose attn_mask block flags have no visible entry; each tile is staged in shared memory by the
 * whole CTA. Per tile a warp forms its kBlockN scores (lane partial dot products, shuffle-xor sum),
 * applies the score hook (softcap, ALiBi or T5's table, attn_mask; the mask is read only in tiles flagged partial)
 * and the per-element band test (skipped in full tiles), then the online softmax in the data type:
 * m' = max(m, s), l = l exp(m - m') + sum_j exp(s_j - m'), a = a exp(m - m') + sum_j P_j v_j, where
 * P_j = exp(s_j - m') times the dropout keep / scale (two Philox calls per row and tile of kBlockN = 8 keys,
 * 4 keys per call); l sums the undropped values. End: (factor, lse) = flash_row_finish (with the head's
 * sink, if any), out = a * factor; a row with no visible key gets out = 0, lse = -inf (or the sink).
 * Everything, the hook included, is computed in the data type T (double hook functions for fp64).
 * O(seqlen) memory, any head dim 1..512 (FLASH_CUDA_SIMPLE_MAX_HEAD_DIM), strides, GQA (kv head = h / h_per_kv), tails.
 * Varlen batches (and seqused_k / k_leftpad / k_batch_idx): the CTA works on its sequence (flash_seq_of:
 * lengths, first rows, band), leaving at once when its rows start past its sq; no other row is touched.
 * K / V rows, paged (block_table) or not, are read at the offsets flash_key_offset gives for the tile's keys.
 * T5's relative position bias (rel_bias): score.h's table form (FLASH_SCORE_TABLE, defined here and in
 * bwd_simple.cu only), table[hq, bucket(j - i')] in T read per visible element.
 * Speed is not a goal; not measured.
 */
#define FLASH_SCORE_TABLE 1 /* before score.h: the T5 table of step 2 (score.h) */

#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "../constants.h"
#include "../mask.h"
#include "../score.h"
#include "launch.h"

static constexpr unsigned kSimpleFullMask = 0xffffffffu;
static constexpr int kRows = 8;                                    /* query rows (= warps) per CTA */
static constexpr int kBlockN = 2 * FLASH_DROPOUT_KEYS_PER_CALL; /* keys per shared-memory tile: two Philox calls */
static constexpr int kPerLane = FLASH_CUDA_SIMPLE_MAX_HEAD_DIM / FLASH_WARP_SIZE; /* head-dim elements per lane */
/* launch-bounds occupancy hint: lets ptxas go past 128 registers, which fp64 needs to avoid spills */
static constexpr int kMinCtasPerSm = 1;

__device__ __forceinline__ float exp_t(float x) { return expf(x); }
__device__ __forceinline__ double exp_t(double x) { return exp(x); }
__device__ __forceinline__ float tanh_t(float x) { return tanhf(x); }
__device__ __forceinline__ double tanh_t(double x) { return tanh(x); }
__device__ __forceinline__ void row_finish_t(float m, float l, float sink, float *factor, float *lse)
{
    flash_row_finish_f(m, l, sink, factor, lse);
}
__device__ __forceinline__ void row_finish_t(double m, double l, double sink, double *factor, double *lse)
{
    flash_row_finish_d(m, l, sink, factor, lse);
}

/* The kernel's body in the data type T; sk_tile, sv_tile: (kBlockN, d) tiles of K and V in shared memory (row r at
 * r * d), k_off, v_off: the tile's keys in k / v (flash_key_offset). */
template <typename T>
__device__ __forceinline__ void fwd_simple_rows(const flash_params &p, T *sk_tile, T *sv_tile, int64_t *k_off,
                                                int64_t *v_off)
{
    const int tid = threadIdx.x;
    const int warp = tid / FLASH_WARP_SIZE;
    const int lane = tid % FLASH_WARP_SIZE;
    const int64_t head = blockIdx.y;
    const int64_t batch = blockIdx.z;
    const int64_t bh = batch * p.h + head;
    const int64_t kv_head = head / p.h_per_kv;
    const int64_t row0 = (int64_t)blockIdx.x * kRows;
    const flash_seq seq = flash_seq_of(&p, batch); /* rows and keys below are the sequence's own */
    if (row0 >= seq.sq)
        return; /* a varlen grid spans the longest sequence */
    const int64_t sq = seq.sq;
    const int64_t sk = seq.sk;
    const int d = (int)p.d;
    const int64_t row = row0 + warp;
    const int qn = (int)flash_min64(kRows, sq - row0); /* rows of the CTA inside [0, sq) */
    const T scale = (T)p.scale;
    const typename flash_score_type<T>::type sc = flash_score_of(&p, seq.alibi_offset, batch, head, (T)1);
    const T dropout_scale = (T)p.dropout_scale;
    const uint32_t dropout_cut = flash_dropout_cut(&p); /* kept iff draw > cut */

    /* (sq, d) with row stride q_s.row / o_s.row; k, v: the kv head, key j at flash_key_offset; (sq) */
    const T *q = (const T *)p.q + batch * p.q_s.batch + head * p.q_s.head + seq.q_row0 * p.q_s.row;
    const T *k = (const T *)p.k + kv_head * p.k_s.head;
    const T *v = (const T *)p.v + kv_head * p.v_s.head;
    T *o = (T *)p.o + batch * p.o_s.batch + head * p.o_s.head + seq.q_row0 * p.o_s.row;
    T *lse = (T *)p.lse + flash_lse_offset(&p, &seq, batch, head);

    T qr[kPerLane];
    T acc[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; i++) {
        const int c = lane + i * FLASH_WARP_SIZE;
        qr[i] = (row < sq && c < d) ? q[row * p.q_s.row + c] : (T)0;
        acc[i] = (T)0;
    }
    T m = -INFINITY;
    T l = 0;

    const flash_tile_range tiles = flash_key_tiles(&seq, row0, qn, kBlockN);
    for (int64_t kt = tiles.first; kt < tiles.end; kt++) {
        const int64_t j0 = kt * kBlockN;
        const int kn = (int)flash_min64(kBlockN, sk - j0); /* keys of the tile inside [0, sk) */
        const unsigned flags = flash_mask_tile_flags(&p, batch, head, row0, qn, j0, kn);
        if (!(flags & FLASH_MASK_ANY_VISIBLE))
            continue; /* the attn_mask hides the whole tile (uniform over the CTA) */
        const bool full = kt >= tiles.full_first && kt < tiles.full_end;
        const bool read_mask = (flags & FLASH_MASK_ANY_MASKED) && row < sq;

        if (tid < kn) { /* the previous tile's loads, the last readers, are behind its second barrier */
            k_off[tid] = flash_key_offset(&p, &seq, p.k_s.batch, p.k_s.row, j0 + tid);
            v_off[tid] = flash_key_offset(&p, &seq, p.v_s.batch, p.v_s.row, j0 + tid);
        }
        __syncthreads(); /* previous tile consumed, key offsets written */
        for (int idx = tid; idx < kBlockN * d; idx += kRows * FLASH_WARP_SIZE) {
            const int r = idx / d;
            const int c = idx % d;
            const bool ok = r < kn;
            sk_tile[idx] = ok ? k[k_off[r] + c] : (T)0; /* idx = r * d + c */
            sv_tile[idx] = ok ? v[v_off[r] + c] : (T)0;
        }
        __syncthreads();

        T s[kBlockN];
        T m_new = m;
#pragma unroll
        for (int jj = 0; jj < kBlockN; jj++) {
            T dot = 0;
#pragma unroll
            for (int i = 0; i < kPerLane; i++) {
                const int c = lane + i * FLASH_WARP_SIZE;
                if (c < d)
                    dot += qr[i] * sk_tile[jj * d + c];
            }
            for (int off = FLASH_WARP_SIZE / 2; off > 0; off /= 2)
                dot += __shfl_xor_sync(kSimpleFullMask, dot, off);
            const int64_t j = j0 + jj;
            T sj = -INFINITY;
            if (full || (jj < kn && flash_visible(&seq, row, j))) {
                sj = dot * scale;
                if (flash_score_capped(&p))
                    sj = flash_score_cap_out(&sc, tanh_t(flash_score_cap_in(&sc, sj)));
                sj = flash_score_element(&p, &sc, sj, read_mask, batch, head, row, j);
            }
            s[jj] = sj;
            m_new = max(m_new, sj);
        }
        if (m_new == (T)-INFINITY)
            continue; /* nothing visible to this row yet */
        uint32_t bits[kBlockN] = {0, 0, 0, 0, 0, 0, 0, 0}; /* key j0 + jj: draw bits[jj] */
        if (p.dropout_threshold) {
            flash_dropout_bits(&p, bh, row, j0 / FLASH_DROPOUT_KEYS_PER_CALL, bits);
            flash_dropout_bits(&p, bh, row, j0 / FLASH_DROPOUT_KEYS_PER_CALL + 1, bits + FLASH_DROPOUT_KEYS_PER_CALL);
        }
        const T alpha = exp_t(m - m_new); /* 0 while m = -inf */
        l *= alpha;
#pragma unroll
        for (int i = 0; i < kPerLane; i++)
            acc[i] *= alpha;
#pragma unroll
        for (int jj = 0; jj < kBlockN; jj++) {
            const T pj = exp_t(s[jj] - m_new); /* 0 for masked keys */
            l += pj;
            T pd = pj;
            if (p.dropout_threshold)
                pd = bits[jj] > dropout_cut ? pj * dropout_scale : (T)0;
#pragma unroll
            for (int i = 0; i < kPerLane; i++) {
                const int c = lane + i * FLASH_WARP_SIZE;
                if (c < d)
                    acc[i] += pd * sv_tile[jj * d + c];
            }
        }
        m = m_new;
    }

    if (row >= sq)
        return;
    T factor, row_lse;
    row_finish_t(m, l, (T)flash_sink(&p, head), &factor, &row_lse);
#pragma unroll
    for (int i = 0; i < kPerLane; i++) {
        const int c = lane + i * FLASH_WARP_SIZE;
        if (c < d)
            o[row * p.o_s.row + c] = acc[i] * factor;
    }
    if (lane == 0)
        lse[row] = row_lse;
}

/* Dynamic shared memory of the K and V tiles: kBlockN rows of d elements each. */
static size_t tiles_bytes(const flash_params *p)
{
    return 2 * kBlockN * (size_t)p->d * (p->dtype == FLASH_FP64 ? sizeof(double) : sizeof(float));
}

/* One kernel for fp32 and fp64 (not a speed path): its threads take the body of p.dtype, a uniform branch. */
__global__ void __launch_bounds__(kRows *FLASH_WARP_SIZE, kMinCtasPerSm)
flash_fwd_simple_kernel(const flash_params p)
{
    extern __shared__ __align__(16) unsigned char tiles[]; /* tiles_bytes(&p) */
    __shared__ int64_t k_off[kBlockN], v_off[kBlockN];
    if (p.dtype == FLASH_FP64)
        fwd_simple_rows<double>(p, (double *)tiles, (double *)tiles + kBlockN * p.d, k_off, v_off);
    else
        fwd_simple_rows<float>(p, (float *)tiles, (float *)tiles + kBlockN * p.d, k_off, v_off);
}

extern "C" cudaError_t flash_fwd_simple(const flash_params *p, cudaStream_t stream)
{
    /* the attn_mask is dense-only: key j of a sequence is its column j (no varlen, no k_leftpad, no
     * block_table); a paged KV cache serves dense and varlen batches (flash_block_table_ok) */
    if (p->d < 1 || p->d > FLASH_CUDA_SIMPLE_MAX_HEAD_DIM || p->sq > INT_MAX || p->sk > INT_MAX ||
        p->h > FLASH_MAX_GRID_YZ || p->b > FLASH_MAX_GRID_YZ || p->h_per_kv < 1 || !flash_block_table_ok(p) ||
        (p->mask != NULL && (p->cu_seqlens_q != NULL || p->k_leftpad != NULL || p->block_table != NULL)) ||
        (p->rel_bias != NULL && (p->rel_buckets == NULL || p->rel_range < 0 || p->rel_nb < 1)))
        return cudaErrorInvalidValue;
    if (p->b == 0 || p->h == 0 || p->sq == 0)
        return cudaSuccess;
    if (p->dtype != FLASH_FP32 && p->dtype != FLASH_FP64)
        return cudaErrorInvalidValue;
    const dim3 grid((unsigned)((p->sq + kRows - 1) / kRows), (unsigned)p->h, (unsigned)p->b);
    const size_t smem = tiles_bytes(p); /* above 48 KB (fp64, d > 384) by the opt-in */
    if (smem > 48 * 1024) {
        const cudaError_t err =
            cudaFuncSetAttribute(flash_fwd_simple_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (err != cudaSuccess)
            return err;
    }
    flash_fwd_simple_kernel<<<grid, kRows * FLASH_WARP_SIZE, smem, stream>>>(*p);
    return cudaGetLastError();
}
