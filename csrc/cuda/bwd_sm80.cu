/* bwd_sm80.cu: FlashAttention-2 backward for fp16/bf16 on mma.sync m16n8k16 (fp32 accumulators), sm80 and
 * later. launch.cu calls its entry points (launch.h); on Hopper the main kernel is bwd_sm90.cu's and this
 * file's dQ kernel serves deterministic mode. rows.cu does the preprocess (delta = rowsum(dO o O), dq_accum
 * zeroed) and the postprocess (dq = scale dq_accum; GQA: dk / dv summed over the query heads in a fixed order).
 *
 * Algorithm (nothing of size sq x sk is stored). bwd_main_kernel, grid (key tiles, h, b): a CTA owns BC keys of
 * one query head, loads K and V once (cp.async) and walks the query tiles of BR rows that mask.h's band lets
 * see them (flash_query_tiles; tiles in [full_first, full_end) unmasked), Q / dO / lse / delta double-buffered:
 *   S^T = K Q^T, P^T = exp2(S^T scale log2e - lse log2e), dP^T = V dO^T, dS^T = P^T o (dP^T - delta);
 *   P^T and dS^T to smem once; dV += P^T dO, dK += dS^T Q; dQ_partial = dS K, red.add'ed to fp32 dq_accum.
 * dK is scaled at the end and written in the dtype (h == h_kv), or per query head in fp32 (GQA). Deterministic
 * mode: the main kernel skips dQ; bwd_dq_kernel, grid (query tiles, h, b), recomputes S, P, dP, dS over the key
 * tiles in order and writes dq itself (bitwise reproducible, S and dP computed twice).
 * Variants (HOOK = p->has_hook, a template parameter of both kernels): score.h's composition where P is
 * recomputed (softcap, ALiBi, attn_mask read in partial tiles only; empty tiles never loaded), then dropout
 * (each (row, 8 keys) Philox draw made by one lane, shared by __shfl_sync); dS goes to p->dbias (main kernel)
 * before the softcap derivative. Uniform conditions are hoisted (hook_tile); only partial mask tiles and dbias
 * take a per-element path. Varlen: each CTA takes its sequence from flash_seq_of, per-tile constants from smem
 * (bwd_seq_consts).
 *
 * Warps (main kernel, 8 in a WK x WQ grid): warp (wk, wq) computes S^T and dP^T of keys [KW wk, +KW) x queries
 * [QW wq, +QW) and owns dK, dV of those keys x columns [DW wq, +DW) in registers; the other warps' P^T and dS^T
 * come from smem. dQ: DQ_WM row groups x 8 / DQ_WM column groups. dQ kernel: warp w owns rows [16 w, +16).
 * No branches between the smem loads and the mma's: columns past d are zero in smem and computed like the others
 * (d 96 pays 25% for it), only the global writes are guarded.
 *
 * Tiles (tiles.h bwd80_tiles_*; D = d rounded up to 64 / 128 / 256 / 512; smem rows padded by 16 bytes):
 *   large (sm90's 227 KB): D64 BC 128 x BR 128, WK 4 (178 KB); D128 128 x 64, WK 4 (173 KB); D256 64 x 64, WK 2
 *     (217 KB); dQ kernel D64 / D128 BRQ 128 x BCQ 64, D256 64 x 32.
 *   small (A100's 163 KB; sm86 / sm89's 99 KB take d <= 128): D64 64 x 64, WK 2 (75 KB); D128 64 x 32, WK 4
 *     (80 KB); D256 64 x 32, WK 4 (142 KB).
 *   D512 (Hopper only; the HOOK kernel alone, no dQ kernel): 64 x 32, WK 4 (178 KB); the two CTAs of a key tile a
 *     thread-block cluster (CL), CTA c holding columns [256 c, +256) of K, V, Q, dO: each computes its partial S^T
 *     and dP^T, sends them to the other (st.async into its shared memory, completing its mbarrier: 16 KB each way
 *     per step, double-buffered; S^T's sent before dP^T is computed, dP^T's waited for), adds the other's (both get
 *     the same sums: fp32 addition commutes, so the same P^T and dS^T), then dK, dV and dQ of its columns; nothing
 *     is computed twice. The dbias sink in CTA 0.
 * The dense kernels do not spill (ptxas -v: sm_90a, and sm_80 with the small tiles); the HOOK kernels with the
 * large tiles spill 8-300 bytes, in the per-element path. One CTA of 8 warps per SM.
 * Requirements (flash_bwd_sm80_check): d % 8 == 0, d <= 512 (<= 256 deterministic), 16-byte aligned pointers, strides
 * multiples of 8.
 *
 * Speed (H200, FLASHATTN_EXT_DISABLE_SM90=1, bwd_harness time, bf16 16k tokens): d128 s8192 261 TFLOP/s
 * (causal 244), torch's FA2 296. D512 (H100, bench_headdims.py, bf16 16k tokens, s8192): 141 TFLOP/s (causal
 * 139), 0.38x our bwd_sm90 d256. Every shape, the variants and the history: benchmarks/results/h200/
 * history_bwd_sm80.md, benchmarks/results/h100/session_2026-12-07j.
 */
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include <type_traits>

#include "../constants.h"
#include "../mask.h"
#include "../score.h"
#include "bwd_common.cuh"
#include "cluster.cuh"
#include "common.cuh"
#include "frag.cuh"
#include "launch.h"
#include "tiles.h"


/* 16 bytes of padding per shared-memory row: 8 consecutive rows then start in 8 distinct 16-byte
 * bank groups, so ldmatrix (plain and .trans) and 4-byte fragment stores have no conflicts. */
#define SMEM_PAD 8

#define MAIN_WARPS 8       /* warps per CTA of the main kernel */

/* ------------------------------------------------------------------------------------------------ */
/* small helpers                                                                                    */

/* ldmatrix address patterns. For a 16x16 block at (row0, col0) of a row-major smem tile with row
 * stride `ld` elements: pattern A gives lane l the row (l%8) + 8*((l/8)%2), column 8*(l/16);
 * pattern B gives row (l%8) + 8*(l/16), column 8*((l/8)%2).
 *   x4 plain, pattern A  : A fragment of a [m][k] tile.
 *   x4 .trans, pattern A : B fragments of two n8 tiles from a [k][n] tile.
 *   x4 plain, pattern B  : B fragments of two n8 tiles from a [n][k] tile.
 *   x4 .trans, pattern B : A fragment from a [k][m] tile (the transpose of what is stored). */
template <typename T>
__device__ __forceinline__ uint32_t addr_pat_a(const T *s, int ld, int row0, int col0, int lane)
{
    return smem_u32(s + (row0 + (lane % 8) + 8 * ((lane / 8) % 2)) * ld + col0 + 8 * (lane / 16));
}

template <typename T>
__device__ __forceinline__ uint32_t addr_pat_b(const T *s, int ld, int row0, int col0, int lane)
{
    return smem_u32(s + (row0 + (lane % 8) + 8 * (lane / 16)) * ld + col0 + 8 * ((lane / 8) % 2));
}

/* Async copy of a ROWS x D tile (rows [0, rows_valid), columns [0, d) of global memory, row stride
 * `stride` elements) into smem [ROWS][D + SMEM_PAD]; everything outside is zero-filled. TPR threads
 * share a row, each taking every TPR-th 16-byte chunk, so a thread needs one base address per row
 * (the chunks are immediate offsets from it) and few registers stay live across the main loops. */
template <typename T, int ROWS, int D, int NT>
__device__ __forceinline__ void load_tile_async(T *s, const T *g, int64_t stride, int rows_valid, int d, int tid)
{
    constexpr int CPR = D / CHUNK;                   /* chunks per row */
    constexpr int TPR = NT >= ROWS ? NT / ROWS : 1;  /* threads per row */
    constexpr int RPP = NT / TPR;                    /* rows per pass */
    static_assert((NT % ROWS == 0 || ROWS % NT == 0) && CPR % TPR == 0, "tile copy layout");
    const int r0 = tid / TPR, c0 = (tid % TPR) * CHUNK;
#pragma unroll
    for (int rp = 0; rp < ROWS / RPP; ++rp) {
        const int r = r0 + rp * RPP;
        const bool row_ok = r < rows_valid;
        const T *src = g + (row_ok ? r * stride : 0);
        T *dst = s + r * (D + SMEM_PAD);
#pragma unroll
        for (int ci = 0; ci < CPR / TPR; ++ci) {
            const int c = c0 + ci * TPR * CHUNK;
            const bool valid = row_ok && c < d;
            cp_async_16(smem_u32(dst + c), valid ? src + c : g, valid);
        }
    }
}

/* One query tile's stage of the main kernel: Q and dO ([BR][D + SMEM_PAD], columns [0, d) of qg, dog), lse and
 * delta of rows [m0, m0 + BR), of which qv exist. */
template <typename T, int BR, int D, int NT>
__device__ __forceinline__ void load_q_stage(T *Qs, T *dOs, float *lse_s, float *delta_s, const flash_params &p,
                                             const T *qg, const T *dog, const float *lseg, const float *deltag, int m0,
                                             int qv, int d, int tid)
{
    load_tile_async<T, BR, D, NT>(Qs, qg + m0 * p.q_s.row, p.q_s.row, qv, d, tid);
    load_tile_async<T, BR, D, NT>(dOs, dog + m0 * p.do_s.row, p.do_s.row, qv, d, tid);
    load_vec_async<BR, NT>(lse_s, lseg + m0, qv, tid);
    load_vec_async<BR, NT>(delta_s, deltag + m0, qv, tid);
}

/* ------------------------------------------------------------------------------------------------ */
/* variant helpers (HOOK kernels only)                                                              */

/* attn_mask flags (mask.h) of query rows [q0, q0 + qn) x keys [k0, k0 + kn) (qn, kn >= 1), computed
 * by the whole warp: lane l takes rows [q0 + 16 l, +16), the warp ORs the lanes' flags. */
__device__ __forceinline__ unsigned warp_mask_tile_flags(const flash_params &p, int b, int hq, int q0, int qn, int k0,
                                                         int kn)
{
    if (p.mask_blocks == NULL)
        return FLASH_MASK_ANY_VISIBLE;
    unsigned f = 0;
    for (int r = (threadIdx.x % FLASH_WARP_SIZE) * FLASH_MASK_BLOCK; r < qn; r += FLASH_WARP_SIZE * FLASH_MASK_BLOCK)
        f |= flash_mask_tile_flags(&p, b, hq, q0 + r, min(FLASH_MASK_BLOCK, qn - r), k0, kn);
    return __reduce_or_sync(FULL_MASK, f);
}

/* The first tile t' in [t, end) whose attn_mask flags show a visible entry (end if none). Tiles of
 * `tile` positions along the queries (along_queries, the main kernel: the key tile is [other0,
 * +other_n)) or along the keys (the dQ kernel: the query tile is [other0, +other_n)); `len` is the
 * length of the tiled axis. Uniform over the CTA. */
__device__ __forceinline__ int next_visible_tile(const flash_params &p, int b, int hq, int t, int end, int tile, int len,
                                                 int other0, int other_n, bool along_queries)
{
    for (; t < end; ++t) {
        const int t0 = t * tile, tn = min(tile, len - t0);
        const unsigned f = along_queries ? warp_mask_tile_flags(p, b, hq, t0, tn, other0, other_n)
                                         : warp_mask_tile_flags(p, b, hq, other0, other_n, t0, tn);
        if (f & FLASH_MASK_ANY_VISIBLE)
            return t;
    }
    return end;
}

/* The call's constants of the score hook (score.h, natural units) in the forms the HOOK kernels use
 * per element, computed once by the launcher and passed as a second kernel parameter, so that they are
 * read from constant memory where used instead of occupying registers across the main loops. The
 * prepass leaves th (softcap) or q.k (no softcap) in s. */
typedef struct hook_consts {
    float tanh_in;       /* softcap: the tanh's argument per unit of q.k, flash_score_cap_in(scale); 0 without */
    float score_mul;     /* the score per unit of s: flash_score_cap_out(1) = softcap, or scale */
    float th_mul;        /* the tanh per unit of s: 1 with softcap, else 0 (flash_score_cap_grad(0) = 1) */
    float dropout_scale; /* (float)p->dropout_scale; 1 without dropout */
} hook_consts;

static hook_consts make_hook_consts(const flash_params *p)
{
    hook_consts hc;
    const flash_score_d sc = flash_score_base(p, 1.0);
    const int softcap = flash_score_capped(p);
    hc.tanh_in = softcap ? (float)flash_score_cap_in(&sc, p->scale) : 0.f;
    hc.score_mul = softcap ? (float)flash_score_cap_out(&sc, 1.0) : (float)p->scale;
    hc.th_mul = softcap ? 1.f : 0.f;
    hc.dropout_scale = p->dropout_threshold != 0 ? (float)p->dropout_scale : 1.f;
    return hc;
}

/* Keep bits of the 8 keys [8c, 8c + 8) of query row i of (b, hq) = bh: bit k for key 8c + k, whose draw is
 * word k % 4 of flash_dropout_bits call 2c + k / 4 (mask.h: 4 keys per call). */
__device__ __forceinline__ uint32_t dropout_keep_byte(const flash_params &p, int64_t bh, int64_t i, int64_t c)
{
    const uint32_t cut = flash_dropout_cut(&p); /* kept iff draw > cut */
    uint32_t byte = 0;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        uint32_t bits[FLASH_DROPOUT_KEYS_PER_CALL];
        flash_dropout_bits(&p, bh, i, 2 * c + half, bits);
#pragma unroll
        for (int k = 0; k < FLASH_DROPOUT_KEYS_PER_CALL; ++k)
            byte |= (uint32_t)(bits[k] > cut) << (FLASH_DROPOUT_KEYS_PER_CALL * half + k);
    }
    return byte;
}

/* The score and probability hooks (score.h, mask.h), folded for the HOOK kernels into passes over a
 * warp's fragments whose uniform conditions sit outside the per-element loops:
 *   1. softcap on: s = th = tanh_approx(flash_score_cap_in(scale q.k)) (the forward's tanh.approx).
 *   2. dropout on: dP *= dropout_scale.
 *   3. per element, branch-free: x = score_mul * s (flash_score_cap_out(th), or scale q.k), then
 *      flash_score_bias (slope 0 without ALiBi) on j - i' = d0 + (jl - il); P = exp2(x log2e - lse
 *      log2e), 0 outside the band; dS = P (keep dP - delta), times flash_score_cap_grad(th_mul s).
 *      Tiles whose attn_mask flags say partial, and the gradient sink, take the slow copy of step 3,
 *      which also applies the mask entry (flash_score_mask_add / _bool) and passes dS (before the
 *      softcap factor) to flash_score_grad. */
typedef struct hook_tile {
    flash_score_f sc; /* natural units, of the tile's (b, hq) and sequence */
    int64_t d0;       /* j - i' of the tile's first element (m0, n0) */
    bool slow;        /* the mask is read in this tile, or the gradient sink is on */
    bool read_mask;   /* the tile's flags say partial */
} hook_tile;

/* flags: the tile's attn_mask block flags; alibi_offset: the sequence's (flash_seq). */
__device__ __forceinline__ hook_tile make_hook_tile(const flash_params &p, int b, int hq, int m0, int n0, int alibi_offset,
                                                    unsigned flags, bool sink)
{
    hook_tile h;
    h.sc = flash_score_of(&p, alibi_offset, b, hq, 1.f);
    h.d0 = (int64_t)n0 - m0 - alibi_offset;
    h.read_mask = (flags & FLASH_MASK_ANY_MASKED) != 0;
    h.slow = h.read_mask || sink;
    return h;
}

/* Step 3 for one element (see above): s (th or q.k) becomes keep * P, dp (dropout_scale * dP) the
 * dS that feeds dK and dQ. vis: inside the band and the tile; (il, jl) local to the tile (m0, n0);
 * sink: pass this element's dS to flash_score_grad (SLOW only). */
template <typename T, bool SLOW>
__device__ __forceinline__ void hook_element(const flash_params &p, const hook_consts &hc, const hook_tile &h, float &s,
                                             float &dp, bool vis, bool kept, float l2, float dl, int b, int hq, int il,
                                             int jl, int m0, int n0, bool sink)
{
    float x = hc.score_mul * s;
    x = flash_score_bias(&h.sc, x, h.d0, jl - il);
    if (SLOW && h.read_mask && vis) {
        const int64_t off = flash_mask_offset(&p, b, hq, m0 + il, n0 + jl);
        if (p.mask_kind == FLASH_MASK_BOOL)
            x = flash_score_mask_bool(x, ((const uint8_t *)p.mask)[off]);
        else
            x = flash_score_mask_add(&h.sc, x, half_to_float(((const T *)p.mask)[off]));
    }
    const float pv = vis ? exp2_approx(fmaf(x, FLASH_LOG2E_F, -l2)) : 0.f;
    const float ds = pv * ((kept ? dp : 0.f) - dl);
    if (SLOW && sink)
        flash_score_grad(&p, b, hq, m0 + il, n0 + jl, ds);
    dp = ds * flash_score_cap_grad(hc.th_mul * s);
    s = kept ? pv : 0.f;
}

/* Steps 1 and 2 on n fragment values. */
__device__ __forceinline__ void hook_prepass(const flash_params &p, const hook_consts &hc, float *s, float *dp, int n)
{
    if (flash_score_capped(&p)) {
#pragma unroll
        for (int k = 0; k < n; ++k)
            s[k] = tanh_approx(s[k] * hc.tanh_in);
    }
    if (p.dropout_threshold != 0) {
#pragma unroll
        for (int k = 0; k < n; ++k)
            dp[k] *= hc.dropout_scale;
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* main kernel: dK, dV (and dQ partials) for one key tile                                           */

/* This thread's lane and warp, read from the special registers at every call (volatile: never merged
 * or hoisted), so that the lane- and warp-derived smem addresses are recomputed in each step of the
 * main loop instead of staying pinned in registers across it (that is what keeps the main kernel
 * free of spills at 255 registers). */
__device__ __forceinline__ int lane_now(void)
{
    int r;
    asm volatile("mov.u32 %0, %%laneid;\n" : "=r"(r));
    return r;
}

__device__ __forceinline__ int warp_now(void)
{
    int r;
    asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(r));
    return r / FLASH_WARP_SIZE;
}

/* The CTA's query head and batch (blockIdx.y, .z) read the same way, for the HOOK code inside the main
 * loops: the addresses derived from them (attn_mask flags and entries, ALiBi slopes, dbias) are then
 * recomputed where used instead of being hoisted out of the loop and spilled. */
__device__ __forceinline__ int head_now(void)
{
    int r;
    asm volatile("mov.u32 %0, %%ctaid.y;\n" : "=r"(r));
    return r;
}

__device__ __forceinline__ int batch_now(void)
{
    int r;
    asm volatile("mov.u32 %0, %%ctaid.z;\n" : "=r"(r));
    return r;
}

/* Store a 16 x 16 A fragment (layout of acc_to_a) at rows row0 + [0, 16), columns col0 + [0, 16) of a
 * row-major smem tile with row stride `ld` elements. */
template <typename T>
__device__ __forceinline__ void store_a_frag(T *s, int ld, int row0, int col0, const uint32_t a[4], int lane)
{
    uint32_t *row_lo = (uint32_t *)(s + (row0 + lane / 4) * ld + col0 + 2 * (lane % 4));
    uint32_t *row_hi = (uint32_t *)(s + (row0 + lane / 4 + 8) * ld + col0 + 2 * (lane % 4));
    row_lo[0] = a[0];
    row_hi[0] = a[1];
    row_lo[4] = a[2];
    row_hi[4] = a[3];
}

/* One k16 step of dV or dK: acc (keys [key0, +16 MT) x columns [col0, +DW)) += A B over the 16
 * queries from q0. A (keys x queries, P^T or dS^T) goes into a: this warp's own fragments own[.][kq]
 * when the queries are its own group, else read from the smem tile As [keys][SS]; B (queries x
 * columns, dO or Q) is read from the smem tile Bs [queries][SD], transposed by ldmatrix. The dV and
 * dK steps share the caller's a (with a fresh array per call ptxas schedules the d64 kernels
 * differently). */
template <typename T, int MT, int QK, int DW, int SS, int SD>
__device__ __forceinline__ void mma_kv_step(float acc[MT][DW / 8][4], uint32_t a[MT][4], const uint32_t own[MT][QK][4],
                                            bool use_own, const T *As, const T *Bs, int kq, int key0, int q0, int col0,
                                            int lane)
{
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        if (use_own) {
#pragma unroll
            for (int r = 0; r < 4; ++r)
                a[mt][r] = own[mt][kq][r];
        } else {
            ldmatrix_x4(a[mt], addr_pat_a(As, SS, key0 + mt * 16, q0, lane));
        }
    }
#pragma unroll
    for (int np = 0; np < DW / 16; ++np) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, addr_pat_a(Bs, SD, q0, col0 + np * 16, lane));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            mma_m16n8k16<T>(acc[mt][2 * np], a[mt], b);
            mma_m16n8k16<T>(acc[mt][2 * np + 1], a[mt], b + 2);
        }
    }
}

/* Dropout in the main kernel. The (query, 8-key block) pairs of a warp's S^T tile that the 8 lanes of
 * one lc hold are numbered P = (2 t + (e & 1)) * NB + 2 mt + (e >> 1) for fragment element (mt, t, e)
 * (NB = KW / 8 key blocks); lane lr of the group draws pairs [NPL lr, +NPL), two Philox calls each,
 * whose 8 keep bits go to byte u % 4 of word u / 4 of `mine` (u = pair - NPL lr). The element
 * (mt, t, e) is key 8 (block) + lr, so it takes bit lr of pair P from lane P / NPL of its group. */
template <int MT, int QW>
struct main_dropout {
    static constexpr int NB = MT * 2, NP = NB * QW / 4, NPL = NP / 8, NWD = (NPL + 3) / 4;
    static constexpr int NSRC = 2 * NB / NPL; /* source lanes of the pairs of one t */
    static_assert(NP % 8 == 0 && (2 * NB) % NPL == 0, "dropout pairs per lane");
};

template <int MT, int QW>
__device__ __forceinline__ void main_dropout_draw(const flash_params &p, uint32_t (&mine)[main_dropout<MT, QW>::NWD],
                                                  int b, int hq, int m0, int n0, int key0, int qry0, int lr, int lc)
{
    typedef main_dropout<MT, QW> DR;
    const int64_t bh = (int64_t)b * p.h + hq;
#pragma unroll
    for (int w = 0; w < DR::NWD; ++w)
        mine[w] = 0;
#pragma unroll
    for (int u = 0; u < DR::NPL; ++u) {
        const int pair = lr * DR::NPL + u, qi = pair / DR::NB, bi = pair % DR::NB;
        const int i = m0 + qry0 + (qi / 2) * 8 + 2 * lc + qi % 2;
        mine[u / 4] |= dropout_keep_byte(p, bh, i, (n0 + key0) / 8 + bi) << (8 * (u % 4));
    }
}

/* HOOK variant of the main kernel's P^T / dS^T step on the warp's S^T and dP^T fragments (s: the raw
 * q.k, dp: dP^T, not yet minus delta): s becomes keep*P^T (for dV, whose dropout_scale factor is
 * applied to the dV accumulators at the end), dp the dS^T that feeds dK and dQ. Fragment element
 * (mt, t, e): key jl = key0 + 16 mt + lr + mma_c_row(e), query ie = qry0 + 8 t + 2 lc + mma_c_col(e), local
 * to the tile (m0, n0). mine: main_dropout_draw's words. qvalid, kvalid: the sequence's query rows and
 * keys from m0, n0 (flash_seq); the attn_mask and dbias (dense batches only) are addressed with the
 * tensors' p.sq, p.sk. */
template <typename T, bool SLOW, int MT, int QW>
__device__ __forceinline__ void hook_p_ds_main_pass(const flash_params &p, const hook_consts &hc, const hook_tile &ht,
                                                    float (&s)[MT][QW / 8][4], float (&dp)[MT][QW / 8][4],
                                                    const uint32_t (&mine)[main_dropout<MT, QW>::NWD],
                                                    const float *lse_t, const float *delta_t, int b, int hq, int m0,
                                                    int n0, int key0, int qry0, int lr, int lc, bool need_mask, int lo,
                                                    int band, int qvalid, int kvalid, bool sinks)
{
    typedef main_dropout<MT, QW> DR;
    const bool dropout = p.dropout_threshold != 0;
#pragma unroll
    for (int t = 0; t < QW / 8; ++t) {
        uint32_t keep[DR::NSRC][DR::NWD]; /* the words of source lanes [NSRC t, +NSRC) of the group */
#pragma unroll
        for (int k = 0; k < DR::NSRC; ++k)
#pragma unroll
            for (int w = 0; w < DR::NWD; ++w)
                keep[k][w] = ~0u;
        if (dropout) {
#pragma unroll
            for (int k = 0; k < DR::NSRC; ++k)
#pragma unroll
                for (int w = 0; w < DR::NWD; ++w)
                    keep[k][w] = __shfl_sync(FULL_MASK, mine[w], (t * DR::NSRC + k) * 4 + lc);
        }
        const int il = qry0 + t * 8 + 2 * lc;
        const float2 lse2 = *(const float2 *)(lse_t + il), dl2 = *(const float2 *)(delta_t + il);
        const float l2[2] = {lse_to_log2(lse2.x), lse_to_log2(lse2.y)}, dl[2] = {dl2.x, dl2.y};
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int jl = key0 + mt * 16 + lr + mma_c_row(e), ie = il + mma_c_col(e);
                const bool vis = !need_mask || (jl < kvalid && ie < qvalid && flash_tile_band_in(jl - ie, lo, band));
                const int P = (2 * t + (e & 1)) * DR::NB + 2 * mt + (e >> 1), u = P % DR::NPL;
                const bool kept = (keep[P / DR::NPL - t * DR::NSRC][u / 4] >> (8 * (u % 4) + lr)) & 1u;
                const bool sink = SLOW && sinks && flash_score_has_grad(&p) && jl < kvalid && ie < qvalid;
                hook_element<T, SLOW>(p, hc, ht, s[mt][t][e], dp[mt][t][e], vis, kept, l2[e & 1], dl[e & 1], b, hq, ie,
                                      jl, m0, n0, sink);
            }
    }
}

template <typename T, int MT, int QW>
__device__ __forceinline__ void hook_p_ds_main(const flash_params &p, const hook_consts &hc, float (&s)[MT][QW / 8][4],
                                               float (&dp)[MT][QW / 8][4],
                                               const uint32_t (&mine)[main_dropout<MT, QW>::NWD], const float *lse_t,
                                               const float *delta_t, int b, int hq, int m0, int n0, int key0, int qry0,
                                               int lr, int lc, bool need_mask, int lo, int band, unsigned flags,
                                               int qvalid, int kvalid, int alibi_offset, bool sinks)
{
    /* sinks: this CTA passes dS to the gradient sink (of the NH column parts of a key tile, the first) */
    const hook_tile ht = make_hook_tile(p, b, hq, m0, n0, alibi_offset, flags, sinks && flash_score_has_grad(&p));
    hook_prepass(p, hc, &s[0][0][0], &dp[0][0][0], MT * QW / 2);
    if (ht.slow)
        hook_p_ds_main_pass<T, true, MT, QW>(p, hc, ht, s, dp, mine, lse_t, delta_t, b, hq, m0, n0, key0, qry0, lr, lc,
                                             need_mask, lo, band, qvalid, kvalid, sinks);
    else
        hook_p_ds_main_pass<T, false, MT, QW>(p, hc, ht, s, dp, mine, lse_t, delta_t, b, hq, m0, n0, key0, qry0, lr, lc,
                                              need_mask, lo, band, qvalid, kvalid, sinks);
}

/* One k16 step of S^T (or dP^T) on the warp's KW keys x QW queries: acc += A B^T over columns [16 kk, +16), A the
 * keys' rows of As (K or V), B the queries' rows of Bs (Q or dO), both [rows][SD] in shared memory. */
template <typename T, int MT, int QW, int SD>
__device__ __forceinline__ void mma_st_step(float (&acc)[MT][QW / 8][4], const T *As, const T *Bs, int kk, int key0,
                                            int qry0, int lane)
{
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
        ldmatrix_x4(a[mt], addr_pat_a(As, SD, key0 + mt * 16, kk * 16, lane));
#pragma unroll
    for (int np = 0; np < QW / 16; ++np) {
        uint32_t b[4];
        ldmatrix_x4(b, addr_pat_b(Bs, SD, qry0 + np * 16, kk * 16, lane));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            mma_m16n8k16<T>(acc[mt][2 * np], a[mt], b);
            mma_m16n8k16<T>(acc[mt][2 * np + 1], a[mt], b + 2);
        }
    }
}

/* One CTA per (key tile of BC keys, query head, batch); walks the query tiles of BR rows that the band
 * lets see the key tile. Warp (wk, wq) = (warp % WK, warp / WK) owns keys [KW*wk, +KW) x queries
 * [QW*wq, +QW) of S^T and dP^T, and keys [KW*wk, +KW) x columns [DW*wq, +DW) of dV and dK: the P^T
 * and dS^T operands of its own queries come from its registers, those of the other WQ-1 query groups
 * from shared memory. dQ: warp (warp % DQ_WM, warp / DQ_WM) owns rows [DQM*., +DQM) x columns
 * [DQN*., +DQN) of the tile, in chunks of DQC columns. Columns past d are zero in smem and computed
 * like the others (no branches between the loads and the mma's); only the global writes are guarded.
 * HOOK: the score / probability hook of mask.h (hook_p_ds_main), attn_mask-empty tiles skipped. */
template <typename T, int D, int DO, int BC, int BR, int WK, int DQ_WM, int DQC, int QST, bool CL, bool HOOK>
__global__ void __launch_bounds__(MAIN_WARPS *FLASH_WARP_SIZE, 1)
    bwd_main_kernel(const __grid_constant__ flash_params p, const hook_consts hc)
{
    constexpr int DL = CL ? DO : D; /* the columns of K, V, Q, dO in shared memory, contracted in S^T and dP^T */
    constexpr int NT = MAIN_WARPS * FLASH_WARP_SIZE, SD = DL + SMEM_PAD, SS = BR + SMEM_PAD;
    constexpr int NH = D / DO;                              /* column parts of dK, dV, dQ: CTAs per key tile */
    constexpr int WQ = MAIN_WARPS / WK;                     /* warps along the queries of S^T */
    constexpr int KW = BC / WK, QW = BR / WQ, DW = DO / WQ; /* warp tile edges */
    constexpr int MT = KW / 16, QK = QW / 16;               /* m16 key tiles, k16 query steps */
    constexpr int DQ_WN = MAIN_WARPS / DQ_WM, DQM = BR / DQ_WM, DQN = DO / DQ_WN;
    static_assert(D % DO == 0 && (QST == 1 || QST == 2), "column parts, Q / dO stages");
    static_assert(!CL || (NH == 2 && HOOK), "clusters: two parts, the HOOK kernel (dP^T accumulated onto 0)");
    constexpr int XV = MT * (QW / 8);         /* CL: float4 of S^T (and as many of dP^T) per thread and step */
    constexpr int XBYTES = 2 * XV * 16 * NT; /* CL: bytes a CTA receives per step */
    static_assert(MAIN_WARPS % WK == 0 && KW % 16 == 0 && QW % 16 == 0 && DW % 16 == 0, "S^T / dK, dV warp tiles");
    static_assert(MAIN_WARPS % DQ_WM == 0 && DQM % 16 == 0 && DQN % DQC == 0 && DQC % 16 == 0, "dQ warp tiles");

    extern __shared__ __align__(16) uint8_t smem[];
    T *Ks = (T *)smem;                       /* [BC][SD]     */
    T *Vs = Ks + BC * SD;                    /* [BC][SD]     */
    T *Qs = Vs + BC * SD;                    /* [QST][BR][SD] */
    T *dOs = Qs + QST * BR * SD;             /* [QST][BR][SD] */
    T *Ps = dOs + QST * BR * SD;             /* [BC][SS]      P^T of the current query tile  */
    T *dSs = Ps + BC * SS;                   /* [BC][SS]      dS^T of the current query tile */
    float *lse_s = (float *)(dSs + BC * SS); /* [QST][BR]     */
    float *delta_s = lse_s + QST * BR;       /* [QST][BR]     */
    bwd_seq_consts *sc = (bwd_seq_consts *)(delta_s + QST * BR); /* the sequence's, for the loop */
    const uint32_t sca = smem_u32(sc);
    /* CL: the peer's partial S^T, dP^T ([2 steps][2 XV][NT] float4) and an mbarrier per buffer */
    const uint32_t xrecv = (sca + (uint32_t)sizeof(bwd_seq_consts) + 15u) & ~15u, xbar = xrecv + 2 * XBYTES;

    const int tid = threadIdx.x;
    /* NH > 1: the NH CTAs of a key tile are neighbours in the grid; CTA part c0 / DO computes all of S^T and dP^T
     * (over the D columns of K, Q, V, dO) and the DO columns [c0, c0 + DO) of dV, dK and dQ */
    /* CL: the part is the CTA's rank in its cluster (blockIdx.x % 2 in a cluster of (2, 1, 1)); each holds and
     * contracts its own DO columns and adds the peer's partial S^T and dP^T: both then have the same sums (fp32
     * addition commutes), hence the same P^T and dS^T */
    const int n0 = (int)(blockIdx.x / NH) * BC, c0 = (CL ? (int)cl_rank() : (int)(blockIdx.x % NH)) * DO;
    const int hq = blockIdx.y, b = blockIdx.z;
    const flash_seq seq = flash_seq_uniform(p, b); /* the CTA's sequence: every row and key below is its own */
    if (n0 >= seq.sk)
        return; /* varlen: the grid spans the longest sequence (both CTAs of a cluster alike) */
#if __CUDA_ARCH__ < 900
    if constexpr (CL)
        __trap(); /* no clusters below sm_90 */
#endif
    const int cg = CL ? c0 : 0; /* the first global column in shared memory */
    if constexpr (CL) {
        if (tid == 0) {
            cl_bar_init(xbar);
            cl_bar_init(xbar + 8);
        }
        cl_sync(); /* both CTAs' mbarriers initialized before the first st.async */
    }
    const int64_t hk = hq / p.h_per_kv;
    const int sq = (int)seq.sq, d = (int)p.d, dl = d - cg; /* dl: columns from cg on */
    const float sl2 = p.scale_log2;
    const bool do_dq = !p.deterministic;

    const bwd_cta_slices<T> sl = bwd_cta_slices_of<T, BC, BR>(p, seq, b, hq, hk, n0);
    const T *kg = sl.kg, *vg = sl.vg, *qg = sl.qg, *dog = sl.dog;
    const float *lseg = sl.lseg, *deltag = sl.deltag;
    float *dqa = sl.dqa;
    const int kvalid = sl.kvalid, kn = sl.kn; /* kn: keys of the tile that exist */
    const flash_tile_range qt = sl.qt;
    const int m_end = (int)qt.end, full_first = (int)qt.full_first, full_end = (int)qt.full_end;
    if (tid == 0)
        bwd_seq_consts_set(sc, seq, n0); /* visible after the loop's first barrier */
    int m = (int)qt.first;
    if constexpr (HOOK)
        m = next_visible_tile(p, b, hq, m, m_end, BR, sq, n0, kn, true);

    load_tile_async<T, BC, DL, NT>(Ks, kg + cg, p.k_s.row, kvalid, dl, tid);
    load_tile_async<T, BC, DL, NT>(Vs, vg + cg, p.v_s.row, kvalid, dl, tid);
    if (m < m_end) {
        const int m0 = m * BR;
        load_q_stage<T, BR, DL, NT>(Qs, dOs, lse_s, delta_s, p, qg + cg, dog + cg, lseg, deltag, m0, sq - m0, dl,
                                    tid);
    }
    cp_async_commit();

    float acc_dv[MT][DW / 8][4], acc_dk[MT][DW / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int t = 0; t < DW / 8; ++t)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                acc_dv[mt][t][e] = 0.f;
                acc_dk[mt][t][e] = 0.f;
            }

    for (int st = 0, it = 0; m < m_end; st = QST == 2 ? st ^ 1 : 0, ++it) {
        const int m0 = m * BR;
        int m_next = m + 1;
        if constexpr (HOOK)
            m_next = next_visible_tile(p, batch_now(), head_now(), m_next, m_end, BR, (int)p.sq, n0, kn, true); /* mask: dense */
        const int lane = lane_now(), warp = warp_now();
        const int lr = lane / 4, lc = lane % 4; /* accumulator fragment: row lr (+8), columns 2*lc, +1 */
        const int wk = warp % WK, wq = warp / WK;
        const int key0 = wk * KW, qry0 = wq * QW, col0 = c0 - cg + wq * DW; /* the warp's first key, query, dK/dV
                                                                                column in shared memory */

        cp_async_wait<0>();
        __syncthreads(); /* stage st landed; stage st^1, P^T and dS^T no longer read by the previous step */
        if (QST == 2 && m_next < m_end) {
            const int m1 = m_next * BR, so = st ^ 1, qv = bwd_seq_sq(sca) - m1;
            load_q_stage<T, BR, DL, NT>(Qs + so * BR * SD, dOs + so * BR * SD, lse_s + so * BR, delta_s + so * BR, p,
                                        qg + cg, dog + cg, lseg, deltag, m1, qv, dl, tid);
            cp_async_commit();
        }
        const T *Qt = Qs + st * BR * SD, *dOt = dOs + st * BR * SD; /* [BR][SD] */
        const float *lse_t = lse_s + st * BR, *delta_t = delta_s + st * BR;
        uint32_t drop[main_dropout<MT, QW>::NWD] = {}; /* HOOK, dropout: drawn before the mma's take the registers */
        if constexpr (HOOK)
            if (p.dropout_threshold != 0)
                main_dropout_draw<MT, QW>(p, drop, batch_now(), head_now(), m0, n0, key0, qry0, lr, lc);

        /* S^T = K Q^T and dP^T - delta = V dO^T - delta (accumulated onto -delta; HOOK: onto 0) on the
         * warp's KW keys x QW queries */
        float s[MT][QW / 8][4], dp[MT][QW / 8][4];
#pragma unroll
        for (int t = 0; t < QW / 8; ++t) {
            const float2 dl = HOOK ? make_float2(0.f, 0.f) : *(const float2 *)(delta_t + qry0 + t * 8 + 2 * lc);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    s[mt][t][e] = 0.f;
                    dp[mt][t][e] = (e & 1) ? -dl.y : -dl.x;
                }
        }
        if constexpr (CL) { /* S^T first: its partial travels to the peer while dP^T's is computed */
            const int xb = it & 1;
            const uint32_t peer = (uint32_t)(c0 / DO) ^ 1u;
            const uint32_t to = cl_peer_addr(xrecv + (uint32_t)(xb * XBYTES + tid * 16), peer);
            const uint32_t to_bar = cl_peer_addr(xbar + 8u * xb, peer);
#pragma unroll 2
            for (int kk = 0; kk < DL / 16; ++kk)
                mma_st_step<T, MT, QW, SD>(s, Ks, Qt, kk, key0, qry0, lane);
#pragma unroll
            for (int v = 0; v < XV; ++v)
                cl_send(to + (uint32_t)(v * NT * 16), &s[v / (QW / 8)][v % (QW / 8)][0], to_bar);
#pragma unroll 2
            for (int kk = 0; kk < DL / 16; ++kk)
                mma_st_step<T, MT, QW, SD>(dp, Vs, dOt, kk, key0, qry0, lane);
#pragma unroll
            for (int v = 0; v < XV; ++v)
                cl_send(to + (uint32_t)((XV + v) * NT * 16), &dp[v / (QW / 8)][v % (QW / 8)][0], to_bar);
        } else {
#pragma unroll 2 /* more unrolling runs out of registers at D=64 */
            for (int kk = 0; kk < DL / 16; ++kk) {
                uint32_t a[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
                    ldmatrix_x4(a[mt], addr_pat_a(Ks, SD, key0 + mt * 16, kk * 16, lane));
#pragma unroll
                for (int np = 0; np < QW / 16; ++np) {
                    uint32_t bq[4];
                    ldmatrix_x4(bq, addr_pat_b(Qt, SD, qry0 + np * 16, kk * 16, lane));
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        mma_m16n8k16<T>(s[mt][2 * np], a[mt], bq);
                        mma_m16n8k16<T>(s[mt][2 * np + 1], a[mt], bq + 2);
                    }
                }
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
                    ldmatrix_x4(a[mt], addr_pat_a(Vs, SD, key0 + mt * 16, kk * 16, lane));
#pragma unroll
                for (int np = 0; np < QW / 16; ++np) {
                    uint32_t bo[4];
                    ldmatrix_x4(bo, addr_pat_b(dOt, SD, qry0 + np * 16, kk * 16, lane));
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        mma_m16n8k16<T>(dp[mt][2 * np], a[mt], bo);
                        mma_m16n8k16<T>(dp[mt][2 * np + 1], a[mt], bo + 2);
                    }
                }
            }
        }

        if constexpr (CL) { /* the peer's partial sums added (buffer it % 2, phase it / 2 % 2) */
            const int xb = it & 1;
            if (tid == 0)
                cl_expect(xbar + 8u * xb, XBYTES);
            cl_wait(xbar + 8u * xb, (it >> 1) & 1);
            const uint32_t from = xrecv + (uint32_t)(xb * XBYTES + tid * 16);
#pragma unroll
            for (int v = 0; v < XV; ++v) {
                const float4 xs = ld_shared_v4_f32(from + (uint32_t)(v * NT * 16));
                const float4 xd = ld_shared_v4_f32(from + (uint32_t)((XV + v) * NT * 16));
                float *ps = &s[v / (QW / 8)][v % (QW / 8)][0], *pd = &dp[v / (QW / 8)][v % (QW / 8)][0];
                ps[0] += xs.x, ps[1] += xs.y, ps[2] += xs.z, ps[3] += xs.w;
                pd[0] += xd.x, pd[1] += xd.y, pd[2] += xd.z, pd[3] += xd.w;
            }
        }

        /* P^T = exp2(S^T * scale*log2e - lse*log2e), dS^T = P^T o (dP^T - delta). Key jl (local) is
         * visible to query il (local) iff lo <= jl - il <= lo + band (mask.h's flash_tile_diag of the
         * band); keys past sk are masked too (their zero-filled K would give s = 0). Both go to smem
         * for the other warps of the key group (and dS^T for dQ), and stay in registers as A
         * fragments (k = queries) for this warp. */
        int hb, lb;
        bwd_seq_band(sca, hb, lb);
        const int lo = band_tile_lo(lb, m0), band = band_tile_hi(hb, m0) - lo, kvalid = bwd_seq_kvalid(sca);
        const bool need_mask = m < full_first || m >= full_end || kvalid < BC;
        if constexpr (HOOK) {
            const int bn = batch_now(), hn = head_now();
            const int qvalid = bwd_seq_sq(sca) - m0;
            const unsigned flags = warp_mask_tile_flags(p, bn, hn, m0, min(BR, qvalid), n0, kn);
            hook_p_ds_main<T, MT, QW>(p, hc, s, dp, drop, lse_t, delta_t, bn, hn, m0, n0, key0, qry0, lr, lc, need_mask, lo,
                                      band, flags, qvalid, kvalid, bwd_seq_alibi(sca), NH == 1 || c0 == 0);
        } else {
#pragma unroll
            for (int t = 0; t < QW / 8; ++t) {
                const int il = qry0 + t * 8 + 2 * lc;
                const float2 lse2 = *(const float2 *)(lse_t + il);
                const float l2[2] = {lse_to_log2(lse2.x), lse_to_log2(lse2.y)};
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        float pv = exp2_approx(fmaf(s[mt][t][e], sl2, -l2[e & 1]));
                        if (need_mask) {
                            const int jl = key0 + mt * 16 + lr + mma_c_row(e), ie = il + mma_c_col(e);
                            if (jl >= kvalid || !flash_tile_band_in(jl - ie, lo, band))
                                pv = 0.f;
                        }
                        s[mt][t][e] = pv;
                        dp[mt][t][e] *= pv;
                    }
            }
        }
        uint32_t pa[MT][QK][4], dsa[MT][QK][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int kq = 0; kq < QK; ++kq) {
                acc_to_a<T>(pa[mt][kq], s[mt][2 * kq], s[mt][2 * kq + 1]);
                acc_to_a<T>(dsa[mt][kq], dp[mt][2 * kq], dp[mt][2 * kq + 1]);
                store_a_frag(Ps, SS, key0 + mt * 16, qry0 + kq * 16, pa[mt][kq], lane);
                store_a_frag(dSs, SS, key0 + mt * 16, qry0 + kq * 16, dsa[mt][kq], lane);
            }
        __syncthreads(); /* P^T, dS^T of the whole tile visible */

        /* dV += P^T dO, dK += dS^T Q over the BR queries, query groups in the order wq, wq+1, ... */
#pragma unroll
        for (int j = 0; j < WQ; ++j) {
            const int g0 = ((wq + j) % WQ) * QW;
#pragma unroll
            for (int kq = 0; kq < QK; ++kq) {
                const int q0 = g0 + kq * 16;
                uint32_t a[MT][4];
                mma_kv_step<T, MT, QK, DW, SS, SD>(acc_dv, a, pa, j == 0, Ps, dOt, kq, key0, q0, col0, lane);
                mma_kv_step<T, MT, QK, DW, SS, SD>(acc_dk, a, dsa, j == 0, dSs, Qt, kq, key0, q0, col0, lane);
            }
        }
        if (QST == 1 && m_next < m_end) { /* one Q / dO stage: the next tile's loads run under the dQ step */
            __syncthreads(); /* Q, dO, lse and delta of this tile read */
            const int m1 = m_next * BR, qv = bwd_seq_sq(sca) - m1;
            load_q_stage<T, BR, DL, NT>(Qs, dOs, lse_s, delta_s, p, qg + cg, dog + cg, lseg, deltag, m1, qv, dl, tid);
            cp_async_commit();
        }

        if (do_dq) {
            /* dQ_partial (BR x D) = dS K, added to dq_accum */
            const int wm = warp % DQ_WM, wn = warp / DQ_WM, nq = bwd_seq_sq(sca); /* rows of the sequence */
#pragma unroll
            for (int ch = 0; ch < DQN / DQC; ++ch) {
                const int cb = c0 + wn * DQN + ch * DQC; /* first column of the chunk */
                float acc[DQM / 16][DQC / 8][4];
#pragma unroll
                for (int mt = 0; mt < DQM / 16; ++mt)
#pragma unroll
                    for (int t = 0; t < DQC / 8; ++t)
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            acc[mt][t][e] = 0.f;
#pragma unroll
                for (int kk = 0; kk < BC / 16; ++kk) {
                    uint32_t a[DQM / 16][4];
#pragma unroll
                    for (int mt = 0; mt < DQM / 16; ++mt)
                        ldmatrix_x4_trans(a[mt], addr_pat_b(dSs, SS, kk * 16, wm * DQM + mt * 16, lane));
#pragma unroll
                    for (int np = 0; np < DQC / 16; ++np) {
                        uint32_t bk[4];
                        ldmatrix_x4_trans(bk, addr_pat_a(Ks, SD, kk * 16, cb - cg + np * 16, lane));
#pragma unroll
                        for (int mt = 0; mt < DQM / 16; ++mt) {
                            mma_m16n8k16<T>(acc[mt][2 * np], a[mt], bk);
                            mma_m16n8k16<T>(acc[mt][2 * np + 1], a[mt], bk + 2);
                        }
                    }
                }
#pragma unroll
                for (int mt = 0; mt < DQM / 16; ++mt) {
                    const int row = m0 + wm * DQM + mt * 16 + lr;
#pragma unroll
                    for (int t = 0; t < DQC / 8; ++t) {
                        if (cb + t * 8 < d) /* warp-uniform: the shuffles inside need all lanes */
                            red_add_tile(dqa, d, row, row < nq, row + 8 < nq, cb + t * 8 + 2 * lc, acc[mt][t], lane);
                    }
                }
            }
        }
        m = m_next;
    }
    cp_async_wait<0>(); /* K/V still in flight when no query tile sees the key tile */
    if constexpr (CL)
        cl_sync(); /* neither CTA of the cluster leaves while the other may still write into its shared memory */

    const int warp = warp_now();
    const int key0 = (warp % WK) * KW, col0 = c0 + (warp / WK) * DW;
    const float dv_mul = HOOK ? hc.dropout_scale : 1.f;
    const flash_seq se = flash_seq_of(&p, b); /* seq again (loaded after the loop's barriers): none held across it */
    store_kv_grad<T, MT, DW>(p, se, acc_dv, dv_mul, p.dv, p.dv_s, p.dv_accum, b, hq, n0 + key0, col0);
    store_kv_grad<T, MT, DW>(p, se, acc_dk, (float)p.scale, p.dk, p.dk_s, p.dk_accum, b, hq, n0 + key0, col0);
}

/* ------------------------------------------------------------------------------------------------ */
/* deterministic dQ kernel                                                                          */

/* Dropout in the dQ kernel. The (row, 8-key block) pairs that the 4 lanes of one lr hold are numbered
 * P = (e >> 1) * NB + t for fragment element (t, e) (NB = BCQ / 8); lane lc of the group draws pairs
 * [NPL lc, +NPL), whose keep bits go to byte u of its word (u = pair - NPL lc). The element (t, e) is
 * key 8 t + 2 lc + (e & 1): bit 2 lc + (e & 1) of pair P, from lane P / NPL of its group. */
template <int BCQ>
struct dq_dropout {
    static constexpr int NB = BCQ / 8, NP = 2 * NB, NPL = NP / 4;
    static_assert(NP % 4 == 0 && NPL <= 4, "dropout pairs per lane: one word");
};

template <int BCQ>
__device__ __forceinline__ uint32_t dq_dropout_draw(const flash_params &p, int b, int hq, int m0, int n0, int warp, int lr,
                                                    int lc)
{
    typedef dq_dropout<BCQ> DR;
    const int64_t bh = (int64_t)b * p.h + hq;
    uint32_t mine = 0;
#pragma unroll
    for (int u = 0; u < DR::NPL; ++u) {
        const int pair = lc * DR::NPL + u;
        const int i = m0 + warp * 16 + lr + 8 * (pair / DR::NB);
        mine |= dropout_keep_byte(p, bh, i, n0 / 8 + pair % DR::NB) << (8 * u);
    }
    return mine;
}

/* HOOK variant of the dQ kernel's P / dS step on the warp's S and dP fragments (s: the raw q.k, dp:
 * dP, not yet minus delta): dp becomes the dS that feeds dQ. Fragment element (t, e): query row
 * il = 16 warp + lr + mma_c_row(e), key jl = 8 t + 2 lc + mma_c_col(e), local to the tile (m0, n0). mine:
 * dq_dropout_draw's word. dbias is not written here (the main kernel does). sq, sk: the sequence's. */
template <typename T, bool SLOW, int BCQ>
__device__ __forceinline__ void hook_p_ds_dq_pass(const flash_params &p, const hook_consts &hc, const hook_tile &ht,
                                                  float (&s)[BCQ / 8][4], float (&dp)[BCQ / 8][4], const uint32_t keep[4],
                                                  const float l2[2], const float dl[2], int b, int hq, int m0, int n0,
                                                  int warp, int lr, int lc, bool need_mask, int lo, int band, int sq,
                                                  int sk)
{
    typedef dq_dropout<BCQ> DR;
    const int kvalid = sk - n0;
#pragma unroll
    for (int t = 0; t < BCQ / 8; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int h8 = e >> 1, jl = t * 8 + 2 * lc + mma_c_col(e), il = warp * 16 + lr + mma_c_row(e);
            const bool vis = m0 + il < sq && (!need_mask || (jl < kvalid && flash_tile_band_in(jl - il, lo, band)));
            const int P = h8 * DR::NB + t;
            const bool kept = (keep[P / DR::NPL] >> (8 * (P % DR::NPL) + 2 * lc + (e & 1))) & 1u;
            hook_element<T, SLOW>(p, hc, ht, s[t][e], dp[t][e], vis, kept, l2[h8], dl[h8], b, hq, il, jl, m0, n0, false);
        }
}

template <typename T, int BCQ>
__device__ __forceinline__ void hook_p_ds_dq(const flash_params &p, const hook_consts &hc, float (&s)[BCQ / 8][4],
                                             float (&dp)[BCQ / 8][4], uint32_t mine, const float l2[2], const float dl[2],
                                             int b, int hq, int m0, int n0, int warp, int lr, int lc, bool need_mask,
                                             int lo, int band, unsigned flags, int sq, int sk, int alibi_offset)
{
    const hook_tile ht = make_hook_tile(p, b, hq, m0, n0, alibi_offset, flags, false);
    uint32_t keep[4] = {~0u, ~0u, ~0u, ~0u}; /* [source lane of the group] */
    if (p.dropout_threshold != 0) {
#pragma unroll
        for (int src = 0; src < 4; ++src)
            keep[src] = __shfl_sync(FULL_MASK, mine, lr * 4 + src);
    }
    hook_prepass(p, hc, &s[0][0], &dp[0][0], BCQ / 2);
    if (ht.slow)
        hook_p_ds_dq_pass<T, true, BCQ>(p, hc, ht, s, dp, keep, l2, dl, b, hq, m0, n0, warp, lr, lc, need_mask, lo, band,
                                        sq, sk);
    else
        hook_p_ds_dq_pass<T, false, BCQ>(p, hc, ht, s, dp, keep, l2, dl, b, hq, m0, n0, warp, lr, lc, need_mask, lo, band,
                                         sq, sk);
}

/* One CTA per (query tile of BRQ rows, query head, batch), BRQ/16 warps; walks the key tiles of BCQ
 * keys that flash_key_tiles gives, in order (HOOK: attn_mask-empty tiles skipped), K/V
 * double-buffered. HOOK = p.has_hook, read once: the kernel holds the walk twice (with and without the
 * variants) and runs one; one instantiation per tile config and dtype. */
template <typename T, int D, int BRQ, int BCQ>
__global__ void __launch_bounds__(BRQ / 16 * FLASH_WARP_SIZE, 1)
    bwd_dq_kernel(const __grid_constant__ flash_params p, const hook_consts hc)
{
    constexpr int NW = BRQ / 16, NT = NW * FLASH_WARP_SIZE, SD = D + SMEM_PAD;
    extern __shared__ __align__(16) uint8_t smem[];
    T *Qs = (T *)smem;              /* [BRQ][SD]     */
    T *dOs = Qs + BRQ * SD;         /* [BRQ][SD]     */
    T *Ks = dOs + BRQ * SD;         /* [2][BCQ][SD]  */
    T *Vs = Ks + 2 * BCQ * SD;      /* [2][BCQ][SD]  */

    const int tid = threadIdx.x, warp = tid / FLASH_WARP_SIZE, lane = tid % FLASH_WARP_SIZE;
    const int lr = lane / 4, lc = lane % 4;
    const int m0 = blockIdx.x * BRQ, hq = blockIdx.y, b = blockIdx.z;
    const flash_seq seq = flash_seq_uniform(p, b); /* the CTA's sequence: every row and key below is its own */
    if (m0 >= seq.sq)
        return; /* varlen: the grid spans the longest sequence */
    const int64_t hk = hq / p.h_per_kv;
    const int sq = (int)seq.sq, sk = (int)seq.sk, d = (int)p.d;
    const float sl2 = p.scale_log2;

    const int64_t qrow = seq.q_row0 + m0, lse0 = flash_lse_offset(&p, &seq, b, hq);
    const T *qg = (const T *)p.q + b * p.q_s.batch + hq * p.q_s.head + qrow * p.q_s.row;       /* (sq - m0, d) */
    const T *dog = (const T *)p.dout + b * p.do_s.batch + hq * p.do_s.head + qrow * p.do_s.row; /* (sq - m0, d) */
    const T *kg = (const T *)p.k + seq.k_batch * p.k_s.batch + hk * p.k_s.head + seq.k_row0 * p.k_s.row; /* (sk, d) */
    const T *vg = (const T *)p.v + seq.k_batch * p.v_s.batch + hk * p.v_s.head + seq.k_row0 * p.v_s.row; /* (sk, d) */

    /* this lane's two query rows: lr and lr + 8 of the warp's 16 */
    float l2[2], dl[2];
#pragma unroll
    for (int h8 = 0; h8 < 2; ++h8) {
        const int i = m0 + warp * 16 + lr + 8 * h8;
        l2[h8] = i < sq ? lse_to_log2(((const float *)p.lse)[lse0 + i]) : INFINITY;
        dl[h8] = i < sq ? ((const float *)p.delta)[lse0 + i] : 0.f;
    }

    const int qn = sq - m0 < BRQ ? sq - m0 : BRQ; /* rows of the tile that exist */
    const flash_tile_range kt = flash_key_tiles(&seq, m0, qn, BCQ);
    const int n_end = (int)kt.end, full_first = (int)kt.full_first, full_end = (int)kt.full_end;
    float acc[D / 8][4];
#pragma unroll
    for (int t = 0; t < D / 8; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            acc[t][e] = 0.f;

    auto walk = [&](auto hook_c) {
        constexpr bool HOOK = decltype(hook_c)::value;
        int n = (int)kt.first;
        if constexpr (HOOK)
            n = next_visible_tile(p, b, hq, n, n_end, BCQ, sk, m0, qn, false);

        load_tile_async<T, BRQ, D, NT>(Qs, qg, p.q_s.row, sq - m0, d, tid);
        load_tile_async<T, BRQ, D, NT>(dOs, dog, p.do_s.row, sq - m0, d, tid);
        if (n < n_end) {
            const int n0 = n * BCQ;
            load_tile_async<T, BCQ, D, NT>(Ks, kg + n0 * p.k_s.row, p.k_s.row, sk - n0, d, tid);
            load_tile_async<T, BCQ, D, NT>(Vs, vg + n0 * p.v_s.row, p.v_s.row, sk - n0, d, tid);
        }
        cp_async_commit();

        for (int st = 0; n < n_end; st ^= 1) {
            const int n0 = n * BCQ;
            int n_next = n + 1;
            if constexpr (HOOK)
                n_next = next_visible_tile(p, batch_now(), head_now(), n_next, n_end, BCQ, sk, m0, qn, false);
            if (n_next < n_end) {
                const int n1 = n_next * BCQ, so = st ^ 1;
                load_tile_async<T, BCQ, D, NT>(Ks + so * BCQ * SD, kg + n1 * p.k_s.row, p.k_s.row, sk - n1, d, tid);
                load_tile_async<T, BCQ, D, NT>(Vs + so * BCQ * SD, vg + n1 * p.v_s.row, p.v_s.row, sk - n1, d, tid);
                cp_async_commit();
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            __syncthreads();
            const T *Kt = Ks + st * BCQ * SD, *Vt = Vs + st * BCQ * SD; /* [BCQ][SD] */
            uint32_t drop = 0; /* HOOK, dropout: drawn before the mma's take the registers */
            if constexpr (HOOK)
                if (p.dropout_threshold != 0)
                    drop = dq_dropout_draw<BCQ>(p, batch_now(), head_now(), m0, n0, warp, lr, lc);

            /* S = Q_w K^T, dP = dO_w V^T: 16 queries x BCQ keys per warp */
            float s[BCQ / 8][4], dp[BCQ / 8][4];
#pragma unroll
            for (int t = 0; t < BCQ / 8; ++t)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    s[t][e] = 0.f;
                    dp[t][e] = 0.f;
                }
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                if (kk * 16 < d) {
                    uint32_t a[4];
                    ldmatrix_x4(a, addr_pat_a(Qs, SD, warp * 16, kk * 16, lane));
#pragma unroll
                    for (int np = 0; np < BCQ / 16; ++np) {
                        uint32_t bk[4];
                        ldmatrix_x4(bk, addr_pat_b(Kt, SD, np * 16, kk * 16, lane));
                        mma_m16n8k16<T>(s[2 * np], a, bk);
                        mma_m16n8k16<T>(s[2 * np + 1], a, bk + 2);
                    }
                    ldmatrix_x4(a, addr_pat_a(dOs, SD, warp * 16, kk * 16, lane));
#pragma unroll
                    for (int np = 0; np < BCQ / 16; ++np) {
                        uint32_t bv[4];
                        ldmatrix_x4(bv, addr_pat_b(Vt, SD, np * 16, kk * 16, lane));
                        mma_m16n8k16<T>(dp[2 * np], a, bv);
                        mma_m16n8k16<T>(dp[2 * np + 1], a, bv + 2);
                    }
                }
            }

            /* dS = P o (dP - delta); query il (local) sees key jl (local) iff lo <= jl - il <= lo + band */
            const int lo = flash_tile_diag(seq.diag_lo, m0, n0), band = flash_tile_diag(seq.diag_hi, m0, n0) - lo;
            const int kvalid = sk - n0;
            const bool need_mask = n < full_first || n >= full_end;
            if constexpr (HOOK) {
                const int bn = batch_now(), hn = head_now();
                const unsigned flags = warp_mask_tile_flags(p, bn, hn, m0, qn, n0, min(BCQ, kvalid));
                hook_p_ds_dq<T, BCQ>(p, hc, s, dp, drop, l2, dl, bn, hn, m0, n0, warp, lr, lc, need_mask, lo, band, flags, sq,
                                     sk, (int)seq.alibi_offset);
            } else {
#pragma unroll
                for (int t = 0; t < BCQ / 8; ++t)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        float pv = exp2_approx(fmaf(s[t][e], sl2, -l2[e >> 1]));
                        if (need_mask) {
                            const int jl = t * 8 + 2 * lc + mma_c_col(e), il = warp * 16 + lr + mma_c_row(e);
                            if (jl >= kvalid || !flash_tile_band_in(jl - il, lo, band))
                                pv = 0.f;
                        }
                        dp[t][e] = pv * (dp[t][e] - dl[e >> 1]);
                    }
            }

            /* dQ += dS K */
#pragma unroll
            for (int kk = 0; kk < BCQ / 16; ++kk) {
                uint32_t a[4];
                acc_to_a<T>(a, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
                for (int np = 0; np < D / 16; ++np) {
                    if (np * 16 < d) {
                        uint32_t bk[4];
                        ldmatrix_x4_trans(bk, addr_pat_a(Kt, SD, kk * 16, np * 16, lane));
                        mma_m16n8k16<T>(acc[2 * np], a, bk);
                        mma_m16n8k16<T>(acc[2 * np + 1], a, bk + 2);
                    }
                }
            }
            __syncthreads(); /* this K/V stage is free for the prefetch after next */
            n = n_next;
        }
    };
    if (p.has_hook)
        walk(std::true_type{});
    else
        walk(std::false_type{});
    cp_async_wait<0>();

    const float scale = (float)p.scale;
    const flash_seq se = flash_seq_of(&p, b); /* seq again (loaded after the loop's barriers): none held across it */
    T *dqg = (T *)p.dq + b * p.dq_s.batch + se.q_row0 * p.dq_s.row + hq * p.dq_s.head; /* (sq, d) */
#pragma unroll
    for (int t = 0; t < D / 8; ++t) {
        const int col = t * 8 + 2 * lc;
        if (t * 8 >= d)
            continue;
#pragma unroll
        for (int h8 = 0; h8 < 2; ++h8) {
            const int i = m0 + warp * 16 + lr + 8 * h8;
            if (i < se.sq) {
                T *out = dqg + (int64_t)i * p.dq_s.row + col;
                *(uint32_t *)out = pack2<T>(acc[t][2 * h8] * scale, acc[t][2 * h8 + 1] * scale);
            }
        }
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* launch                                                                                           */

static unsigned int blocks_for(int64_t items, int per_block)
{
    return (unsigned int)((items + per_block - 1) / per_block);
}

/* Dynamic shared memory (bytes, 16-bit elements) of the main kernel (K, V, QST Q and dO stages, P^T,
 * dS^T, QST lse and delta stages, the sequence's constants) and of the deterministic dQ kernel (Q, dO,
 * two K and V stages). */
static constexpr size_t main_smem_bytes(int D, int BC, int BR, int QST)
{
    return (size_t)(2 * BC * (D + SMEM_PAD) + 2 * QST * BR * (D + SMEM_PAD) + 2 * BC * (BR + SMEM_PAD)) * 2 +
           2 * QST * BR * sizeof(float) + sizeof(bwd_seq_consts);
}

/* ... of config C: with CL, K, V, Q, dO of DO columns, then (16-byte aligned) two steps of the peer's partial S^T
 * and dP^T (BC x BR fp32 each) and two mbarriers. */
template <typename C>
static constexpr size_t main_smem_of(void)
{
    return C::CL ? (main_smem_bytes(C::DO, C::BC, C::BR, C::QST) + 15) / 16 * 16 + 2 * 2 * C::BC * C::BR * 4 + 16
                 : main_smem_bytes(C::D, C::BC, C::BR, C::QST);
}

static constexpr size_t dq_smem_bytes(int D, int BRQ, int BCQ)
{
    return (size_t)(2 * BRQ * (D + SMEM_PAD) + 4 * BCQ * (D + SMEM_PAD)) * 2;
}

template <typename C>
static constexpr size_t tiles_smem_bytes(void)
{
    return main_smem_of<C>() > dq_smem_bytes(C::D, C::BRQ, C::BCQ) ? main_smem_of<C>()
                                                                   : dq_smem_bytes(C::D, C::BRQ, C::BCQ);
}

/* The cluster kernels (CL) run from this build's sm_90a code only: on Hopper (other GPUs would JIT the compute_80
 * PTX, whose CL kernels trap). */
static int device_runs_clusters(void)
{
    int dev = 0, major = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major == 9;
}

template <typename T, typename C>
static cudaError_t launch_main(const flash_params *p, cudaStream_t stream)
{
    if (C::CL && !device_runs_clusters())
        return cudaErrorNotSupported;
    const size_t smem = main_smem_of<C>();
    void (*kernel)(flash_params, hook_consts) =
        bwd_main_kernel<T, C::D, C::DO, C::BC, C::BR, C::WK, C::DQ_WM, C::DQC, C::QST, C::CL, true>;
    if constexpr (C::D <= FLASH_CUDA_MAX_HEAD_DIM) /* above: the HOOK kernel alone serves every call, as forward's */
        if (!p->has_hook)
            kernel = bwd_main_kernel<T, C::D, C::DO, C::BC, C::BR, C::WK, C::DQ_WM, C::DQC, C::QST, C::CL, false>;
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess)
        return err;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks_for(p->sk, C::BC) * (C::D / C::DO), (unsigned int)p->h, (unsigned int)p->b);
    cfg.blockDim = dim3(MAIN_WARPS * FLASH_WARP_SIZE);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr;
    if (C::CL) { /* the D / DO CTAs of a key tile one cluster */
        attr.id = cudaLaunchAttributeClusterDimension;
        attr.val.clusterDim.x = C::D / C::DO;
        attr.val.clusterDim.y = 1;
        attr.val.clusterDim.z = 1;
        cfg.attrs = &attr;
        cfg.numAttrs = 1;
    }
    return cudaLaunchKernelEx(&cfg, kernel, *p, make_hook_consts(p));
}

template <typename T, typename C>
static cudaError_t launch_dq(const flash_params *p, cudaStream_t stream)
{
    const size_t smem = dq_smem_bytes(C::D, C::BRQ, C::BCQ);
    auto kernel = bwd_dq_kernel<T, C::D, C::BRQ, C::BCQ>;
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess)
        return err;
    const dim3 grid(blocks_for(p->sq, C::BRQ), (unsigned int)p->h, (unsigned int)p->b);
    kernel<<<grid, C::BRQ / 16 * FLASH_WARP_SIZE, smem, stream>>>(*p, make_hook_consts(p));
    return cudaGetLastError();
}

/* The two tiled kernels of this file. */
typedef enum bwd_part { BWD_PART_MAIN, BWD_PART_DQ } bwd_part;

template <typename T, typename C>
static cudaError_t launch_part(const flash_params *p, bwd_part part, cudaStream_t stream)
{
    if constexpr (C::D > FLASH_CUDA_MAX_HEAD_DIM) /* no dQ kernel: deterministic mode stops at 256 (check) */
        return part == BWD_PART_MAIN ? launch_main<T, C>(p, stream) : cudaErrorInvalidValue;
    else
        return part == BWD_PART_MAIN ? launch_main<T, C>(p, stream) : launch_dq<T, C>(p, stream);
}

/* Tile configuration for head dim p->d and tiles t. */
template <typename T>
static cudaError_t launch_tiles(const flash_params *p, flash_tiles t, bwd_part part, cudaStream_t stream)
{
    const bool large = t == FLASH_TILES_LARGE;
    if (p->d <= 64)
        return large ? launch_part<T, bwd80_tiles_d64_large>(p, part, stream)
                     : launch_part<T, bwd80_tiles_d64_small>(p, part, stream);
    if (p->d <= 128)
        return large ? launch_part<T, bwd80_tiles_d128_large>(p, part, stream)
                     : launch_part<T, bwd80_tiles_d128_small>(p, part, stream);
    if (p->d > FLASH_CUDA_MAX_HEAD_DIM)
        return launch_part<T, bwd80_tiles_d512>(p, part, stream);
    return large ? launch_part<T, bwd80_tiles_d256_large>(p, part, stream)
                 : launch_part<T, bwd80_tiles_d256_small>(p, part, stream);
}

static cudaError_t launch_dtype(const flash_params *p, flash_tiles t, bwd_part part, cudaStream_t stream)
{
    if (p->dtype == FLASH_BF16)
        return launch_tiles<__nv_bfloat16>(p, t, part, stream);
    if (p->dtype == FLASH_FP16)
        return launch_tiles<__half>(p, t, part, stream);
    return cudaErrorInvalidValue;
}

extern "C" size_t flash_bwd_sm80_smem(const flash_params *p, flash_tiles t)
{
    const bool large = t == FLASH_TILES_LARGE;
    if (p->d <= 64)
        return large ? tiles_smem_bytes<bwd80_tiles_d64_large>() : tiles_smem_bytes<bwd80_tiles_d64_small>();
    if (p->d <= 128)
        return large ? tiles_smem_bytes<bwd80_tiles_d128_large>() : tiles_smem_bytes<bwd80_tiles_d128_small>();
    if (p->d > FLASH_CUDA_MAX_HEAD_DIM) /* SIZE_MAX: no d512 kernel on this GPU (launch.h) */
        return bwd80_tiles_d512::CL && !device_runs_clusters() ? SIZE_MAX : tiles_smem_bytes<bwd80_tiles_d512>();
    return large ? tiles_smem_bytes<bwd80_tiles_d256_large>() : tiles_smem_bytes<bwd80_tiles_d256_small>();
}

static int aligned16(const void *ptr)
{
    return ((uintptr_t)ptr % 16) == 0;
}

/* The strides of a (b, s, h, d) tensor that the kernels multiply by a non-zero index (a dimension of
 * size 1 is only ever indexed by 0, so its stride is never used) are multiples of CHUNK elements. */
static int strides_ok(const flash_strides *s, int64_t b, int64_t rows, int64_t heads)
{
    return (b <= 1 || s->batch % CHUNK == 0) && (rows <= 1 || s->row % CHUNK == 0) && (heads <= 1 || s->head % CHUNK == 0);
}

extern "C" cudaError_t flash_bwd_sm80_check(const flash_params *p)
{
    if ((p->dtype != FLASH_BF16 && p->dtype != FLASH_FP16) || p->d < 1 || p->d % CHUNK != 0 ||
        p->d > FLASH_CUDA_BWD_MAX_HEAD_DIM || (p->d > FLASH_CUDA_MAX_HEAD_DIM && p->deterministic) || p->h_kv < 1 ||
        p->h % p->h_kv != 0 || p->h_per_kv != p->h / p->h_kv || p->sq > INT_MAX || p->sk > INT_MAX ||
        p->h > FLASH_MAX_GRID_YZ || p->b > FLASH_MAX_GRID_YZ)
        return cudaErrorInvalidValue;
    /* the dense kernels know nothing of the variants; the HOOK kernels read the mask through its flags;
     * attn_mask and dbias exist for dense batches only; KV caches (k_batch_idx, k_leftpad, block_table)
     * for the forward only */
    const int variant = p->softcap != 0.f || p->alibi_slopes != NULL || p->mask != NULL || p->dbias != NULL ||
                        p->dropout_threshold != 0;
    const int varlen = p->cu_seqlens_q != NULL;
    if ((variant && !p->has_hook) || (p->mask == NULL) != (p->mask_blocks == NULL) ||
        (p->mask != NULL && p->mask_kind != FLASH_MASK_BOOL && p->mask_kind != FLASH_MASK_ADD) ||
        (varlen && (p->mask != NULL || p->dbias != NULL || p->cu_seqlens_k == NULL)) || p->k_batch_idx != NULL ||
        p->k_leftpad != NULL || p->block_table != NULL)
        return cudaErrorInvalidValue;
    const void *ptrs[] = {p->q, p->k, p->v, p->o, p->dout, p->dq, p->dk, p->dv};
    for (unsigned int i = 0; i < sizeof(ptrs) / sizeof(ptrs[0]); ++i)
        if (!aligned16(ptrs[i]))
            return cudaErrorInvalidValue;
    if (((!p->deterministic || p->dq_semaphore != NULL) && !aligned16(p->dq_accum)) ||
        (p->h != p->h_kv && (!aligned16(p->dk_accum) || !aligned16(p->dv_accum) || p->dk_accum == NULL ||
                             p->dv_accum == NULL)))
        return cudaErrorInvalidValue;
    const flash_strides *qside[] = {&p->q_s, &p->o_s, &p->do_s, &p->dq_s};
    const flash_strides *kside[] = {&p->k_s, &p->v_s, &p->dk_s, &p->dv_s};
    const int64_t qrows = varlen ? p->total_q : p->sq, krows = varlen ? p->total_k : p->sk; /* row indices used */
    for (unsigned int i = 0; i < sizeof(qside) / sizeof(qside[0]); ++i)
        if (!strides_ok(qside[i], p->b, qrows, p->h) || !strides_ok(kside[i], p->b, krows, p->h_kv))
            return cudaErrorInvalidValue;
    return cudaSuccess;
}

extern "C" cudaError_t flash_bwd_main_sm80(const flash_params *p, flash_tiles t, cudaStream_t stream)
{
    return launch_dtype(p, t, BWD_PART_MAIN, stream);
}

extern "C" cudaError_t flash_bwd_sm80_dq(const flash_params *p, flash_tiles t, cudaStream_t stream)
{
    return launch_dtype(p, t, BWD_PART_DQ, stream);
}

