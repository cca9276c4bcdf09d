/* simple.cu: attention forward and backward for fp32 / fp64 on CUDA cores, reference-grade: the path that lets
 * torch.autograd.gradcheck run on the GPU. Speed is not a goal; not measured.
 *
 * Forward (flash_fwd_simple_kernel).
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
 * T5's relative position bias (rel_bias): score.h's table form (FLASH_SCORE_TABLE, defined in this file
 * only), table[hq, bucket(j - i')] in T read per visible element.
 *
 * Backward: no atomics, bitwise deterministic, O(N) memory (delta, b*h*sq values of the input type; with T5's
 * table gradient, its partials below).
 *
 * Algorithm (scalar type T = float or double; lse, delta, an additive attn_mask and dbias are T too;
 * everything, the score hook included, is computed in T):
 *   1. bwd_simple_delta_kernel: one warp per (b, h, query row): delta_i = dO_i . O_i. With an additive
 *      attn_mask (p->dout_fix set, the kernel's FIX branch): dO' = dO into dout_fix, except in a row with
 *      |lse| >= FLASH_LSE_RENORM_MIN: dO / mass, mass = sum_j exp(s_j - lse) (+ the sink's), the sum of the P that
 *      the kernels below compute at that lse (simple_row_mass; flash_cpu.c renorm_rows). Such an lse is rounded
 *      at the scale of the row maximum (a row at finfo.min or -1e9, score.h "Huge additive entries": lse = m,
 *      log l lost), so P = exp(s - lse) is c P_true for one factor c = mass per row, and dO / c makes dV =
 *      P^T dO', dP' = dO' V^T, delta' = dO'_i . O_i and dS = P (dP' - delta') exact; delta_i = dO'_i . O_i;
 *      the kernels below then read dO' (run_bwd_simple) and the forward's lse.
 *   2. bwd_simple_dkv_kernel, grid (key rows / SIMPLE_WARPS, h_kv, b): one warp per key row j,
 *      lane l holding columns l, l+32, ... of k_j, v_j, dk_j, dv_j. It walks the group's query heads
 *      and, per head, the query tiles of SIMPLE_TILE rows that flash_query_tiles (mask.h) puts in the
 *      band of j, minus those whose attn_mask block flags have no visible entry; inside a tile, the
 *      visible rows i in order (band test skipped in full tiles, mask read only in partial ones):
 *        s = hook(scale q_i.k_j) (softcap, ALiBi or T5's table, attn_mask), P = exp(s - lse_i),
 *        dp = dO_i.v_j (warp butterfly sums, identical in all lanes), with dropout keep/scale z_ij:
 *        dv_j += z P dO_i; dS = P (z dp - delta_i) (the gradient of s: written to dbias[b, hq, i, j]
 *        when requested, by this warp's lane 0 only); dk_j += dS softcap'(s) q_i; finally dk_j *= scale.
 *      T5's table gradient (p.rel_bias_grad, rel_grad_tile = 1: flash_bwd_simple_rel_grad_tile): the warp of
 *        key j owns the partial row (b, hq, j) of rel_bias_grad for each query head hq of its group, and
 *        sums dS there per bucket (score.h flash_score_grad_table), in the order of i; consecutive rows of
 *        one bucket (j - i' runs through the buckets monotonically) are summed in registers first and
 *        added as one. The binding adds the partials over batch and keys (b*h*sk*num_buckets values of T).
 *   3. bwd_simple_dq_kernel, grid (query rows / SIMPLE_WARPS, h, b): one warp per query row i, the
 *      key tiles of SIMPLE_TILE keys from flash_key_tiles, likewise: dq_i += dS softcap'(s) k_j;
 *      finally dq_i *= scale.
 *   Any head dim 1..512 (FLASH_CUDA_SIMPLE_MAX_HEAD_DIM: 16 columns per lane at most). Rows with lse = -inf see
 *   no key and get 0.
 *   Sinks need nothing here (lse includes them). Dropout: one Philox call per element (mask.h).
 *   Varlen: every warp takes its sequence from flash_seq_of (mask.h); the grids span the longest
 *   sequence, and warps past their sequence's end return at once.
 */
#define FLASH_SCORE_TABLE 1 /* before score.h: the T5 table of step 2 (score.h) */

#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "../constants.h"
#include "../mask.h"
#include "../score.h"
#include "launch.h"

#define FULL_MASK 0xffffffffu
#define SIMPLE_CPL (FLASH_CUDA_SIMPLE_MAX_HEAD_DIM / FLASH_WARP_SIZE) /* head-dim elements (columns) per lane */
/* launch-bounds occupancy hint: lets ptxas go past 128 registers, which fp64 needs to avoid spills */
#define SIMPLE_MIN_BLOCKS 1

__device__ __forceinline__ float simple_exp(float x) { return expf(x); }
__device__ __forceinline__ double simple_exp(double x) { return exp(x); }
__device__ __forceinline__ float simple_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double simple_tanh(double x) { return tanh(x); }

/* ------------------------------------------------------------------------------------------------ */
/* forward                                                                                          */

static constexpr int kRows = 8;                                    /* query rows (= warps) per CTA */
static constexpr int kBlockN = 2 * FLASH_DROPOUT_KEYS_PER_CALL; /* keys per shared-memory tile: two Philox calls */

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

    T qr[SIMPLE_CPL];
    T acc[SIMPLE_CPL];
#pragma unroll
    for (int i = 0; i < SIMPLE_CPL; i++) {
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
            for (int i = 0; i < SIMPLE_CPL; i++) {
                const int c = lane + i * FLASH_WARP_SIZE;
                if (c < d)
                    dot += qr[i] * sk_tile[jj * d + c];
            }
            for (int off = FLASH_WARP_SIZE / 2; off > 0; off /= 2)
                dot += __shfl_xor_sync(FULL_MASK, dot, off);
            const int64_t j = j0 + jj;
            T sj = -INFINITY;
            if (full || (jj < kn && flash_visible(&seq, row, j))) {
                sj = dot * scale;
                if (flash_score_capped(&p))
                    sj = flash_score_cap_out(&sc, simple_tanh(flash_score_cap_in(&sc, sj)));
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
        const T alpha = simple_exp(m - m_new); /* 0 while m = -inf */
        l *= alpha;
#pragma unroll
        for (int i = 0; i < SIMPLE_CPL; i++)
            acc[i] *= alpha;
#pragma unroll
        for (int jj = 0; jj < kBlockN; jj++) {
            const T pj = simple_exp(s[jj] - m_new); /* 0 for masked keys */
            l += pj;
            T pd = pj;
            if (p.dropout_threshold)
                pd = bits[jj] > dropout_cut ? pj * dropout_scale : (T)0;
#pragma unroll
            for (int i = 0; i < SIMPLE_CPL; i++) {
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
    for (int i = 0; i < SIMPLE_CPL; i++) {
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
__global__ void __launch_bounds__(kRows *FLASH_WARP_SIZE, SIMPLE_MIN_BLOCKS)
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

/* ------------------------------------------------------------------------------------------------ */
/* backward                                                                                         */

#define SIMPLE_WARPS 4                                    /* warps (rows) per block */
#define SIMPLE_TILE FLASH_MASK_BLOCK                      /* rows / keys per band tile: one mask block */

/* Sum over the warp by butterfly: every lane ends with the same value, in a fixed order. */
template <typename T>
__device__ __forceinline__ T warp_sum(T v)
{
#pragma unroll
    for (int off = FLASH_WARP_SIZE / 2; off > 0; off /= 2)
        v += __shfl_xor_sync(FULL_MASK, v, off);
    return v;
}

/* x[c] = row[lane + 32c] for the columns below d, 0 beyond. */
template <typename T>
__device__ __forceinline__ void load_row(T x[SIMPLE_CPL], const T *row, int d, int lane)
{
#pragma unroll
    for (int c = 0; c < SIMPLE_CPL; ++c) {
        const int col = lane + FLASH_WARP_SIZE * c;
        x[c] = col < d ? row[col] : (T)0;
    }
}

template <typename T>
__device__ __forceinline__ void store_row(T *row, const T x[SIMPLE_CPL], T mul, int d, int lane)
{
#pragma unroll
    for (int c = 0; c < SIMPLE_CPL; ++c) {
        const int col = lane + FLASH_WARP_SIZE * c;
        if (col < d)
            row[col] = x[c] * mul;
    }
}

template <typename T>
__device__ __forceinline__ T dot_row(const T x[SIMPLE_CPL], const T y[SIMPLE_CPL])
{
    T s = 0;
#pragma unroll
    for (int c = 0; c < SIMPLE_CPL; ++c)
        s += x[c] * y[c];
    return warp_sum(s);
}

/* The score of one visible element (b, hq, i, j) of sequence seq for the CUDA-core kernels: the hook of
 * score.h applied to s = scale * q.k, the dot product qk given. *th receives the tanh of the softcap step,
 * from which its derivative is formed. -inf: the attn_mask hides the element (read only when read_mask,
 * i.e. in a tile flagged partial; dense batches only). */
template <typename T>
__device__ __forceinline__ T hooked_score(const flash_params &p, const typename flash_score_type<T>::type &sc, T qk,
                                          bool read_mask, int64_t b, int64_t hq, int64_t i, int64_t j, T *th)
{
    T s = qk * (T)p.scale;
    if (flash_score_capped(&p)) {
        *th = simple_tanh(flash_score_cap_in(&sc, s));
        s = flash_score_cap_out(&sc, *th);
    }
    return flash_score_element(&p, &sc, s, read_mask, b, hq, i, j);
}

/* flash_dropout_keep (mask.h) with the draw picked by an unrolled select, so that the Philox words
 * stay in registers (an indexed array would go to local memory). */
__device__ __forceinline__ bool simple_dropout_keep(const flash_params &p, int64_t bh, int64_t i, int64_t j)
{
    uint32_t bits[FLASH_DROPOUT_KEYS_PER_CALL];
    flash_dropout_bits(&p, bh, i, j / FLASH_DROPOUT_KEYS_PER_CALL, bits);
    const int64_t w = j % FLASH_DROPOUT_KEYS_PER_CALL;
    uint32_t draw = 0;
#pragma unroll
    for (int k = 0; k < FLASH_DROPOUT_KEYS_PER_CALL; ++k)
        draw = k == w ? bits[k] : draw;
    return draw > flash_dropout_cut(&p);
}

/* Everything one visible element contributes, given s = hooked_score(...), its softcap tanh th, the
 * row's lse and delta and dp = dO_i . v_j: *pd = the dropped P (dV's weight), the return value
 * dS * softcap'(th) (dK's and dQ's weight, before the final scale); *ds = dS. */
template <typename T>
__device__ __forceinline__ T element_grad(const flash_params &p, T s, T th, T lse, T delta, T dp, int64_t bh,
                                          int64_t i, int64_t j, T *pd, T *ds)
{
    const T pv = simple_exp(s - lse);
    T dpz = dp;
    *pd = pv;
    if (p.dropout_threshold) {
        const bool keep = simple_dropout_keep(p, bh, i, j);
        const T z = keep ? (T)p.dropout_scale : (T)0;
        dpz = dp * z;
        *pd = pv * z;
    }
    *ds = pv * (dpz - delta);
    return flash_score_capped(&p) ? *ds * flash_score_cap_grad(th) : *ds;
}

/* Each kernel serves fp32 and fp64 (not a speed path): its threads take the body of p.dtype (a uniform branch)
 * instead of an instantiation per dtype. */

/* sum_j exp(s_j - lse) over the keys query row i of (b, hq) sees, plus exp(sink - lse): the mass of the P that
 * simple_dkv_rows and simple_dq_rows compute for the row at this lse (their key loop and score, element by
 * element), 1 up to the rounding of lse. Every lane gets the sum. */
template <typename T>
__device__ __forceinline__ T simple_row_mass(const flash_params &p, const flash_seq &seq, int64_t b, int64_t hq,
                                          int64_t i, T lse, int lane)
{
    const int d = (int)p.d;
    const int64_t hk = hq / p.h_per_kv, kb = seq.k_batch, qr = seq.q_row0 + i;
    const typename flash_score_type<T>::type sc = flash_score_of(&p, seq.alibi_offset, b, hq, (T)1);
    T qv[SIMPLE_CPL];
    load_row(qv, (const T *)p.q + b * p.q_s.batch + qr * p.q_s.row + hq * p.q_s.head, d, lane);
    T mass = simple_exp((T)flash_sink(&p, hq) - lse); /* 0 without a sink */
    const flash_tile_range tiles = flash_key_tiles(&seq, i, 1, SIMPLE_TILE);
    for (int64_t nt = tiles.first; nt < tiles.end; ++nt) {
        const int64_t n0 = nt * SIMPLE_TILE, n1 = flash_min64(n0 + SIMPLE_TILE, seq.sk);
        const unsigned flags = flash_mask_tile_flags(&p, b, hq, i, 1, n0, n1 - n0);
        if (!(flags & FLASH_MASK_ANY_VISIBLE))
            continue;
        const bool full = nt >= tiles.full_first && nt < tiles.full_end;
        const bool read_mask = flags & FLASH_MASK_ANY_MASKED;
        for (int64_t j = n0; j < n1; ++j) {
            if (!full && !flash_visible(&seq, i, j))
                continue;
            T kv[SIMPLE_CPL];
            const int64_t kr = seq.k_row0 + j;
            load_row(kv, (const T *)p.k + kb * p.k_s.batch + kr * p.k_s.row + hk * p.k_s.head, d, lane);
            T th = 0;
            const T s = hooked_score<T>(p, sc, dot_row(qv, kv), read_mask, b, hq, i, j, &th);
            if (s != (T)-INFINITY)
                mass += simple_exp(s - lse);
        }
    }
    return mass;
}

/* delta (lse layout) = rowsum(dout * o); one warp per (b, h, query row i < sq). FIX: dout' (dout / mass where
 * simple_row_mass renormalizes) into dout_fix, delta = rowsum(dout' * o). */
template <typename T, bool FIX = false>
__device__ __forceinline__ void simple_delta_rows(const flash_params &p)
{
    const int lane = threadIdx.x % FLASH_WARP_SIZE;
    const int64_t idx = (int64_t)blockIdx.x * SIMPLE_WARPS + threadIdx.x / FLASH_WARP_SIZE; /* (b*h + hq)*sq + i */
    if (idx >= p.b * p.h * p.sq)
        return;
    const int64_t i = idx % p.sq, bh = idx / p.sq, hq = bh % p.h, b = bh / p.h;
    const flash_seq seq = flash_seq_of(&p, b);
    if (i >= seq.sq)
        return;
    const int d = (int)p.d;
    const int64_t r = seq.q_row0 + i;
    const T *o = (const T *)p.o + b * p.o_s.batch + r * p.o_s.row + hq * p.o_s.head;         /* (d) */
    const T *dout = (const T *)p.dout + b * p.do_s.batch + r * p.do_s.row + hq * p.do_s.head; /* (d) */
    T ov[SIMPLE_CPL], dv[SIMPLE_CPL];
    load_row(ov, o, d, lane);
    load_row(dv, dout, d, lane);
    if (FIX) {
        const T lse = ((const T *)p.lse)[flash_lse_offset(&p, &seq, b, hq) + i];
        T inv_l = 1; /* uniform over the warp */
        if (fabs((double)lse) >= FLASH_LSE_RENORM_MIN && fabs((double)lse) < (double)INFINITY) {
            const T mass = simple_row_mass<T>(p, seq, b, hq, i, lse, lane);
            if (mass > (T)0 && mass < (T)INFINITY)
                inv_l = (T)1 / mass;
        }
        const flash_strides fs = flash_dout_fix_strides(&p);
        store_row((T *)p.dout_fix + b * fs.batch + r * fs.row + hq * fs.head, dv, inv_l, d, lane);
#pragma unroll
        for (int c = 0; c < SIMPLE_CPL; ++c)
            dv[c] *= inv_l;
    }
    const T sum = dot_row(ov, dv);
    if (lane == 0)
        ((T *)p.delta)[flash_lse_offset(&p, &seq, b, hq) + i] = sum;
}

/* One kernel for both cases: an additive attn_mask (p.dout_fix set, FIX) is a branch uniform over the grid. */
__global__ void __launch_bounds__(SIMPLE_WARPS *FLASH_WARP_SIZE, SIMPLE_MIN_BLOCKS)
bwd_simple_delta_kernel(const flash_params p)
{
    if (p.dout_fix != NULL) {
        if (p.dtype == FLASH_FP64)
            simple_delta_rows<double, true>(p);
        else
            simple_delta_rows<float, true>(p);
    } else {
        if (p.dtype == FLASH_FP64)
            simple_delta_rows<double>(p);
        else
            simple_delta_rows<float>(p);
    }
}

/* dk, dv (rows of k): one warp per key row j < sk of sequence b, summing over the group's query heads;
 * dbias and T5's table gradient. */
template <typename T>
__device__ __forceinline__ void simple_dkv_rows(const flash_params &p)
{
    const int lane = threadIdx.x % FLASH_WARP_SIZE;
    const int64_t j = (int64_t)blockIdx.x * SIMPLE_WARPS + threadIdx.x / FLASH_WARP_SIZE;
    const int64_t hk = blockIdx.y, b = blockIdx.z;
    const flash_seq seq = flash_seq_of(&p, b);
    if (j >= seq.sk)
        return;
    const int d = (int)p.d;
    const int64_t kr = seq.k_row0 + j, kb = seq.k_batch;
    T kv[SIMPLE_CPL], vv[SIMPLE_CPL], dk[SIMPLE_CPL], dv[SIMPLE_CPL];
    load_row(kv, (const T *)p.k + kb * p.k_s.batch + kr * p.k_s.row + hk * p.k_s.head, d, lane);
    load_row(vv, (const T *)p.v + kb * p.v_s.batch + kr * p.v_s.row + hk * p.v_s.head, d, lane);
#pragma unroll
    for (int c = 0; c < SIMPLE_CPL; ++c) {
        dk[c] = 0;
        dv[c] = 0;
    }
    const flash_tile_range tiles = flash_query_tiles(&seq, j, 1, SIMPLE_TILE);
    for (int64_t g = 0; g < p.h_per_kv; ++g) {
        const int64_t hq = hk * p.h_per_kv + g, bh = b * p.h + hq, lse0 = flash_lse_offset(&p, &seq, b, hq);
        const T *lse = (const T *)p.lse + lse0;     /* (sq) */
        const T *delta = (const T *)p.delta + lse0; /* (sq) */
        const typename flash_score_type<T>::type sc = flash_score_of(&p, seq.alibi_offset, b, hq, (T)1);
        /* T5's table gradient: the run of dS of one bucket not yet added (run_i: its last row; -1: none) */
        T run = 0;
        int64_t run_i = -1, run_bucket = -1;
        for (int64_t mt = tiles.first; mt < tiles.end; ++mt) {
            const int64_t m0 = mt * SIMPLE_TILE, m1 = flash_min64(m0 + SIMPLE_TILE, seq.sq);
            const unsigned flags = flash_mask_tile_flags(&p, b, hq, m0, m1 - m0, j, 1);
            if (!(flags & FLASH_MASK_ANY_VISIBLE))
                continue;
            const bool full = mt >= tiles.full_first && mt < tiles.full_end;
            const bool read_mask = flags & FLASH_MASK_ANY_MASKED;
            for (int64_t i = m0; i < m1; ++i) {
                const T l = lse[i];
                if ((!full && !flash_visible(&seq, i, j)) || l == (T)-INFINITY)
                    continue;
                T qv[SIMPLE_CPL], dov[SIMPLE_CPL];
                const int64_t qr = seq.q_row0 + i;
                load_row(qv, (const T *)p.q + b * p.q_s.batch + qr * p.q_s.row + hq * p.q_s.head, d, lane);
                T th = 0;
                const T s = hooked_score<T>(p, sc, dot_row(qv, kv), read_mask, b, hq, i, j, &th);
                if (s == (T)-INFINITY)
                    continue; /* masked: P = 0, no gradient */
                load_row(dov, (const T *)p.dout + b * p.do_s.batch + qr * p.do_s.row + hq * p.do_s.head, d, lane);
                T pd, ds;
                const T dsc = element_grad(p, s, th, l, delta[i], dot_row(dov, vv), bh, i, j, &pd, &ds);
                if (p.dbias != NULL && lane == 0)
                    flash_score_grad(&p, b, hq, i, j, ds);
                if (p.rel_bias_grad != NULL) {
                    const int64_t bucket = flash_score_bucket(&sc, j - i - sc.alibi_offset);
                    if (bucket != run_bucket) {
                        if (run_i >= 0 && lane == 0)
                            flash_score_grad_table(&p, &sc, b, hq, run_i, j, run);
                        run = 0;
                        run_bucket = bucket;
                    }
                    run += ds;
                    run_i = i;
                }
#pragma unroll
                for (int c = 0; c < SIMPLE_CPL; ++c) {
                    dv[c] += pd * dov[c];
                    dk[c] += dsc * qv[c];
                }
            }
        }
        if (run_i >= 0 && lane == 0)
            flash_score_grad_table(&p, &sc, b, hq, run_i, j, run);
    }
    store_row((T *)p.dk + kb * p.dk_s.batch + kr * p.dk_s.row + hk * p.dk_s.head, dk, (T)p.scale, d, lane);
    store_row((T *)p.dv + kb * p.dv_s.batch + kr * p.dv_s.row + hk * p.dv_s.head, dv, (T)1, d, lane);
}

__global__ void __launch_bounds__(SIMPLE_WARPS *FLASH_WARP_SIZE, SIMPLE_MIN_BLOCKS)
bwd_simple_dkv_kernel(const flash_params p)
{
    if (p.dtype == FLASH_FP64)
        simple_dkv_rows<double>(p);
    else
        simple_dkv_rows<float>(p);
}

/* dq (rows of q): one warp per query row i < sq of sequence b. */
template <typename T>
__device__ __forceinline__ void simple_dq_rows(const flash_params &p)
{
    const int lane = threadIdx.x % FLASH_WARP_SIZE;
    const int64_t i = (int64_t)blockIdx.x * SIMPLE_WARPS + threadIdx.x / FLASH_WARP_SIZE;
    const int64_t hq = blockIdx.y, b = blockIdx.z, hk = hq / p.h_per_kv;
    const flash_seq seq = flash_seq_of(&p, b);
    if (i >= seq.sq)
        return;
    const int d = (int)p.d;
    const int64_t bh = b * p.h + hq, row = flash_lse_offset(&p, &seq, b, hq) + i, qr = seq.q_row0 + i;
    const int64_t kb = seq.k_batch;
    const T l = ((const T *)p.lse)[row], delta = ((const T *)p.delta)[row];
    const typename flash_score_type<T>::type sc = flash_score_of(&p, seq.alibi_offset, b, hq, (T)1);
    T qv[SIMPLE_CPL], dov[SIMPLE_CPL], dq[SIMPLE_CPL];
    load_row(qv, (const T *)p.q + b * p.q_s.batch + qr * p.q_s.row + hq * p.q_s.head, d, lane);
    load_row(dov, (const T *)p.dout + b * p.do_s.batch + qr * p.do_s.row + hq * p.do_s.head, d, lane);
#pragma unroll
    for (int c = 0; c < SIMPLE_CPL; ++c)
        dq[c] = 0;
    flash_tile_range tiles = flash_key_tiles(&seq, i, 1, SIMPLE_TILE);
    if (l == (T)-INFINITY)
        tiles.first = tiles.end = 0; /* the row sees no key */
    for (int64_t nt = tiles.first; nt < tiles.end; ++nt) {
        const int64_t n0 = nt * SIMPLE_TILE, n1 = flash_min64(n0 + SIMPLE_TILE, seq.sk);
        const unsigned flags = flash_mask_tile_flags(&p, b, hq, i, 1, n0, n1 - n0);
        if (!(flags & FLASH_MASK_ANY_VISIBLE))
            continue;
        const bool full = nt >= tiles.full_first && nt < tiles.full_end;
        const bool read_mask = flags & FLASH_MASK_ANY_MASKED;
        for (int64_t j = n0; j < n1; ++j) {
            if (!full && !flash_visible(&seq, i, j))
                continue;
            T kv[SIMPLE_CPL], vv[SIMPLE_CPL];
            const int64_t kr = seq.k_row0 + j;
            load_row(kv, (const T *)p.k + kb * p.k_s.batch + kr * p.k_s.row + hk * p.k_s.head, d, lane);
            T th = 0;
            const T s = hooked_score<T>(p, sc, dot_row(qv, kv), read_mask, b, hq, i, j, &th);
            if (s == (T)-INFINITY)
                continue; /* masked: P = 0, no gradient */
            load_row(vv, (const T *)p.v + kb * p.v_s.batch + kr * p.v_s.row + hk * p.v_s.head, d, lane);
            T pd, ds;
            const T dsc = element_grad(p, s, th, l, delta, dot_row(dov, vv), bh, i, j, &pd, &ds);
#pragma unroll
            for (int c = 0; c < SIMPLE_CPL; ++c)
                dq[c] += dsc * kv[c];
        }
    }
    store_row((T *)p.dq + b * p.dq_s.batch + qr * p.dq_s.row + hq * p.dq_s.head, dq, (T)p.scale, d, lane);
}

__global__ void __launch_bounds__(SIMPLE_WARPS *FLASH_WARP_SIZE, SIMPLE_MIN_BLOCKS)
bwd_simple_dq_kernel(const flash_params p)
{
    if (p.dtype == FLASH_FP64)
        simple_dq_rows<double>(p);
    else
        simple_dq_rows<float>(p);
}

static unsigned int simple_blocks(int64_t rows)
{
    return (unsigned int)((rows + SIMPLE_WARPS - 1) / SIMPLE_WARPS);
}

static cudaError_t run_bwd_simple(const flash_params *p, cudaStream_t stream)
{
    cudaError_t err;
    flash_params pv = *p;
    const dim3 block(SIMPLE_WARPS * FLASH_WARP_SIZE);
    bwd_simple_delta_kernel<<<simple_blocks(p->b * p->h * p->sq), block, 0, stream>>>(pv);
    if (p->dout_fix != NULL) { /* the kernels below read dO' */
        pv.dout = pv.dout_fix;
        pv.do_s = flash_dout_fix_strides(&pv);
    }
    if ((err = cudaGetLastError()) != cudaSuccess)
        return err;
    const dim3 dkv_grid(simple_blocks(p->sk), (unsigned int)p->h_kv, (unsigned int)p->b);
    bwd_simple_dkv_kernel<<<dkv_grid, block, 0, stream>>>(pv);
    if ((err = cudaGetLastError()) != cudaSuccess)
        return err;
    const dim3 dq_grid(simple_blocks(p->sq), (unsigned int)p->h, (unsigned int)p->b);
    bwd_simple_dq_kernel<<<dq_grid, block, 0, stream>>>(pv);
    return cudaGetLastError();
}

extern "C" int64_t flash_bwd_simple_rel_grad_tile(void)
{
    return 1; /* one key row per warp of bwd_simple_dkv_kernel */
}

extern "C" cudaError_t flash_bwd_simple(const flash_params *p, cudaStream_t stream)
{
    /* attn_mask and dbias: dense batches only; KV caches (k_batch_idx, k_leftpad, block_table): the
     * forward only; T5's table gradient: partials of flash_bwd_simple_rel_grad_tile keys */
    const int varlen = p->cu_seqlens_q != NULL;
    if (p->d < 1 || p->d > FLASH_CUDA_SIMPLE_MAX_HEAD_DIM || p->h_kv < 1 || p->h % p->h_kv != 0 ||
        (varlen && (p->mask != NULL || p->dbias != NULL || p->cu_seqlens_k == NULL)) || p->k_batch_idx != NULL ||
        p->k_leftpad != NULL || p->block_table != NULL ||
        (p->rel_bias != NULL && (p->rel_buckets == NULL || p->rel_range < 0 || p->rel_nb < 1)) ||
        (p->rel_bias_grad != NULL && (p->rel_bias == NULL || p->rel_grad_tile != flash_bwd_simple_rel_grad_tile())))
        return cudaErrorInvalidValue;
    if (p->b == 0 || p->h == 0 || p->sq == 0 || p->sk == 0)
        return cudaSuccess;
    if (p->dtype != FLASH_FP32 && p->dtype != FLASH_FP64)
        return cudaErrorInvalidValue;
    return run_bwd_simple(p, stream);
}
