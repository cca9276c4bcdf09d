// ops.cpp: the op schema (declared once), the input checks, params filling, and the CPU backend.
//
// Layout of every tensor argument: q (batch, seqlen_q, nheads, headdim), k (batch, seqlen_k, nheads_kv,
// headdim), v (batch, seqlen_k, nheads_kv, headdim_v), out/dout (batch, seqlen_q, nheads, headdim_v), any
// strides whose last one is 1; headdim_v (v's own head dim, as DeepSeek's MLA: 192 / 128) is any size, equal to
// headdim or not. lse (batch, nheads, seqlen_q) in fp32 (fp64 for fp64 inputs). The varlen ops pack their
// sequences along the rows: q (total_q, nheads, headdim), k/v (total_k, nheads_kv, headdim / headdim_v),
// out/dout (total_q, nheads, headdim_v), lse (nheads, total_q), with int32
// cu_seqlens_q / cu_seqlens_k (batch + 1,) and seqused_k (batch,) on q's device. varlen_fwd also takes a
// paged cache (flash_attn_varlen_func's block_table; forward only): k/v (num_pages, page_size, nheads_kv,
// headdim) with block_table int32 (batch, max_pages), sequence s's keys its first cu_seqlens_k[s + 1] -
// cu_seqlens_k[s] rows through table row s. The CUDA backend lives in ops_cuda.cpp.
//
// kvcache_fwd (flash_attn_with_kvcache's attention; forward only, it reads the cache and writes
// nothing into it: the Python function appends new keys first and passes cache_seqlens + seqlen_new):
// q (batch, seqlen_q, nheads, headdim); k_cache / v_cache (batch_cache, seqlen_cache, nheads_kv,
// headdim / headdim_v), or paged with block_table int32 (batch, max_pages): (num_pages, page_size, nheads_kv,
// headdim), page_size a multiple of FLASH_PAGE_MULTIPLE. Sequence b's keys are cache rows
// [cache_leftpad[b], cache_seqlens[b]) (flash-attn's convention: cache_seqlens counts from the cache's
// row 0, the left padding included) of cache batch cache_batch_idx[b] (default b), or of pages
// block_table[b, row / page_size]; cache_seqlens None: every row (seqlen_cache, or max_pages *
// page_size). All int32 on q's device; contents are clamped by the kernels, never read on the host.
// causal / window are bottom-right aligned per sequence (on its key count), ALiBi as flash-attn with
// the sequence's keys counted from cache_leftpad. out (batch, seqlen_q, nheads, headdim_v), lse (batch,
// nheads, seqlen_q); a sequence without keys gets out 0, lse -inf (the sink with a sink).
//
// kv_append (flash_attn_with_kvcache's append, both caches in place; schema Tensor(a!) k_cache, Tensor(b!)
// v_cache): k (batch, seqlen_new, nheads_kv, headdim) and v (..., headdim_v) into the caches above at rows
// cache_seqlens[b] + i, those past the cache dropped; semantics in csrc/kv_append.h.
#include <Python.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/library.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <utility>
#include <vector>

#include "constants.h"
#include "cpu/amx.h"
#include "cpu/flash_cpu.h"
#include "mask.h"
#include "ops.h"
#ifdef FLASHATTN_EXT_CUDA
#include "cuda/launch.h"
#endif

namespace flashattn_ext {

namespace {

constexpr int64_t kRank = 4;  // (batch, seqlen, nheads, headdim)
constexpr int64_t kVarlenRank = 3;  // (total rows, nheads, headdim)

flash_dtype to_flash_dtype(at::ScalarType t)
{
    switch (t) {
    case at::kFloat: return FLASH_FP32;
    case at::kDouble: return FLASH_FP64;
    case at::kHalf: return FLASH_FP16;
    case at::kBFloat16: return FLASH_BF16;
    default: TORCH_CHECK(false, "flashattn_ext: unsupported dtype ", t);
    }
}

flash_strides strides_of(const at::Tensor &t)
{
    flash_strides s;
    s.batch = t.stride(0);
    s.row = t.stride(1);
    s.head = t.stride(2);
    return s;
}

void check_rank_and_last_stride(const at::Tensor &t, const char *name, int64_t rank = kRank)
{
    TORCH_CHECK(t.defined(), "flashattn_ext: ", name, " is undefined");
    TORCH_CHECK(t.dim() == rank, "flashattn_ext: ", name, " must have ", num(rank), " dimensions ",
                rank == kRank ? "(batch, seqlen, nheads, headdim)" : "(total rows, nheads, headdim)", ", got ",
                num(t.dim()));
    TORCH_CHECK(t.size(rank - 1) <= 1 || t.stride(rank - 1) == 1, "flashattn_ext: ", name,
                " must have stride 1 in its last dimension (headdim), got stride ", num(t.stride(rank - 1)));
}

// dtype, device and head checks shared by the dense, varlen and KV-cache q, k, v (hd: the head dim's
// index; kn, vn: the names of k and v in the messages). v's head dim is its own.
void check_qkv_common(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, int64_t hd, const char *kn = "k",
                      const char *vn = "v")
{
    TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(), "flashattn_ext: q, ", kn,
                " and ", vn, " must have the same dtype, got q ", q.scalar_type(), ", ", kn, " ", k.scalar_type(), ", ",
                vn, " ", v.scalar_type());
    TORCH_CHECK(q.device() == k.device() && q.device() == v.device(), "flashattn_ext: q, ", kn, " and ", vn,
                " must be on the same device, got q on ", q.device().str(), ", ", kn, " on ", k.device().str(), ", ",
                vn, " on ", v.device().str());
    TORCH_CHECK(k.size(hd) == q.size(hd), "flashattn_ext: head dim (last dimension) of q and ", kn,
                " must match, got q ", num(q.size(hd)), ", ", kn, " ", num(k.size(hd)), " (", vn,
                " may have its own)");
    const int64_t rows = hd - 2, heads = hd - 1;
    TORCH_CHECK(k.size(rows) == v.size(rows), "flashattn_ext: seqlen of ", kn, " (", num(k.size(rows)), ") and ", vn,
                " (", num(v.size(rows)), ") must match");
    TORCH_CHECK(k.size(heads) == v.size(heads), "flashattn_ext: nheads of ", kn, " (", num(k.size(heads)), ") and ", vn,
                " (", num(v.size(heads)), ") must match");
    TORCH_CHECK(k.size(heads) > 0 || q.size(heads) == 0, "flashattn_ext: nheads of ", kn, " and ", vn,
                " must be positive");
    TORCH_CHECK(k.size(heads) == 0 || q.size(heads) % k.size(heads) == 0, "flashattn_ext: nheads of q (",
                num(q.size(heads)), ") must be a multiple of nheads of ", kn, " and ", vn, " (", num(k.size(heads)),
                ")");
}

// An int32 index tensor of a varlen call: 1-D, contiguous, on q's device.
void check_index_tensor(const at::Tensor &t, const at::Tensor &q, const char *name)
{
    TORCH_CHECK(t.defined(), "flashattn_ext: ", name, " is undefined");
    TORCH_CHECK(t.scalar_type() == at::kInt, "flashattn_ext: ", name, " must be int32, got ", t.scalar_type());
    TORCH_CHECK(t.dim() == 1, "flashattn_ext: ", name, " must have 1 dimension, got ", num(t.dim()));
    TORCH_CHECK(t.is_contiguous(), "flashattn_ext: ", name, " must be contiguous");
    TORCH_CHECK(t.device() == q.device(), "flashattn_ext: ", name, " must be on the device of q (", q.device().str(),
                "), got ", t.device().str());
}

// k / v of a paged varlen call, (num_pages, page_size, nheads_kv, headdim), and its block_table (batch,
// max_pages) int32 on q's device.
// What every block_table must be: int32 on q's device, (batch, max_pages), over a cache k whose page size
// (dimension 1 of (num_pages, page_size, nheads_kv, headdim)) is a positive multiple of FLASH_PAGE_MULTIPLE.
void check_block_table(const at::Tensor &table, const at::Tensor &q, const at::Tensor &k, int64_t batch,
                       const char *k_name)
{
    TORCH_CHECK(table.scalar_type() == at::kInt, "flashattn_ext: block_table must be int32, got ", table.scalar_type());
    TORCH_CHECK(table.device() == q.device(), "flashattn_ext: block_table must be on the device of q (",
                q.device().str(), "), got ", table.device().str());
    TORCH_CHECK(table.dim() == 2 && table.size(0) == batch, "flashattn_ext: block_table must have shape (batch, "
                "max_pages_per_sequence) with batch = ", num(batch), ", got ", shape(table.sizes()));
    const int64_t page = k.size(1);
    TORCH_CHECK(page > 0 && page % FLASH_PAGE_MULTIPLE == 0, "flashattn_ext: the page size (dimension 1 of a paged ",
                k_name, " (num_pages, page_size, nheads_kv, headdim)) must be a positive multiple of ",
                num(FLASH_PAGE_MULTIPLE), ", got ", num(page));
}

void check_varlen_paged_kv(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, const at::Tensor &table,
                           int64_t batch)
{
    const at::Tensor *caches[] = {&k, &v};
    const char *names[] = {"k", "v"};
    for (int i = 0; i < 2; ++i) {
        TORCH_CHECK(caches[i]->defined(), "flashattn_ext: ", names[i], " is undefined");
        TORCH_CHECK(caches[i]->dim() == kRank, "flashattn_ext: with a block_table, ", names[i], " must have ",
                    num(kRank), " dimensions (num_pages, page_size, nheads_kv, headdim), got ", num(caches[i]->dim()));
        check_rank_and_last_stride(*caches[i], names[i]);
    }
    TORCH_CHECK(k.size(0) == v.size(0) && k.size(1) == v.size(1), "flashattn_ext: with a block_table, k and v "
                "must have the same number of pages and page size, got k ", shape(k.sizes()), ", v ",
                shape(v.sizes()));
    check_qkv_common(q.unsqueeze(0), k, v, kRank - 1);
    check_block_table(table, q, k, batch, "k");
    TORCH_CHECK(table.size(1) >= 1, "flashattn_ext: block_table must have max_pages >= 1 columns, got ",
                shape(table.sizes()));
    TORCH_CHECK(k.size(0) > 0, "flashattn_ext: a paged k needs at least one page for block_table to index");
}

// dout and out of a backward: q's shape with v's head dim (out_sizes).
void check_out_shapes(const at::Tensor &dout, const at::Tensor &q, const at::Tensor &v, const at::Tensor &out)
{
    const std::vector<int64_t> want = out_sizes(q, v);
    TORCH_CHECK(dout.defined() && dout.sizes() == at::IntArrayRef(want), "flashattn_ext: dout must have the shape of ",
                "q with the head dim of v ", shape(want), ", got ", dout.defined() ? shape(dout.sizes()) : "undefined");
    TORCH_CHECK(out.defined() && out.sizes() == at::IntArrayRef(want), "flashattn_ext: out must have the shape of ",
                "q with the head dim of v ", shape(want), ", got ", out.defined() ? shape(out.sizes()) : "undefined");
}

}  // namespace

std::vector<int64_t> out_sizes(const at::Tensor &q, const at::Tensor &v)
{
    std::vector<int64_t> sizes(q.sizes().begin(), q.sizes().end());
    sizes.back() = v.size(-1);
    return sizes;
}

void check_qkv(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v)
{
    check_rank_and_last_stride(q, "q");
    check_rank_and_last_stride(k, "k");
    check_rank_and_last_stride(v, "v");
    check_qkv_common(q, k, v, kRank - 1);
    TORCH_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0),
                "flashattn_ext: batch size of q, k and v must match, got q ", num(q.size(0)), ", k ",
                num(k.size(0)), ", v ", num(v.size(0)));
}

void check_varlen_qkv(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, const Varlen &vl)
{
    check_rank_and_last_stride(q, "q", kVarlenRank);
    if (!vl.block_table) {
        check_rank_and_last_stride(k, "k", kVarlenRank);
        check_rank_and_last_stride(v, "v", kVarlenRank);
        check_qkv_common(q, k, v, kVarlenRank - 1);
    }
    check_index_tensor(vl.cu_seqlens_q, q, "cu_seqlens_q");
    check_index_tensor(vl.cu_seqlens_k, q, "cu_seqlens_k");
    TORCH_CHECK(vl.cu_seqlens_q.size(0) >= 2, "flashattn_ext: cu_seqlens_q must have batch + 1 >= 2 entries, got ",
                num(vl.cu_seqlens_q.size(0)));
    TORCH_CHECK(vl.cu_seqlens_k.size(0) == vl.cu_seqlens_q.size(0),
                "flashattn_ext: cu_seqlens_k must have the length of cu_seqlens_q (", num(vl.cu_seqlens_q.size(0)),
                "), got ", num(vl.cu_seqlens_k.size(0)));
    if (vl.seqused_k) {
        check_index_tensor(*vl.seqused_k, q, "seqused_k");
        TORCH_CHECK(vl.seqused_k->size(0) == vl.batch(), "flashattn_ext: seqused_k must have shape (batch,) = (",
                    num(vl.batch()), ",), got ", shape(vl.seqused_k->sizes()));
    }
    TORCH_CHECK(vl.max_seqlen_q >= 0, "flashattn_ext: max_seqlen_q must be >= 0, got ", num(vl.max_seqlen_q));
    TORCH_CHECK(vl.max_seqlen_k >= 0, "flashattn_ext: max_seqlen_k must be >= 0, got ", num(vl.max_seqlen_k));
    if (vl.block_table)
        check_varlen_paged_kv(q, k, v, *vl.block_table, vl.batch());
}

// dout in q's dtype; out in q's dtype, or float32 for float16 / bfloat16 q where out32_ok (fwd's out32: the
// forward's out before its rounding, which gives the backward's delta = rowsum(dout * out) without that
// rounding's error; the CPU, and T5's rel_bias on CUDA: calls whose backward runs on float32 copies).
static void check_bwd_dtypes(const at::Tensor &dout, const at::Tensor &q, const at::Tensor &out, bool out32_ok)
{
    const bool half = q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16;
    const bool out32 = half && out32_ok && out.scalar_type() == at::kFloat;
    TORCH_CHECK(dout.scalar_type() == q.scalar_type() && (out.scalar_type() == q.scalar_type() || out32),
                "flashattn_ext: dout and out must have the dtype of q (", q.scalar_type(),
                "; out may be float32 for float16 / bfloat16 on the CPU or with rel_bias), got dout ",
                dout.scalar_type(), ", out ", out.scalar_type());
}

void check_varlen_bwd_inputs(const at::Tensor &dout, const at::Tensor &q, const at::Tensor &v, const at::Tensor &out,
                             const at::Tensor &lse, bool out32_ok)
{
    check_out_shapes(dout, q, v, out);
    check_rank_and_last_stride(out, "out", kVarlenRank);
    check_bwd_dtypes(dout, q, out, out32_ok);
    TORCH_CHECK(lse.defined(), "flashattn_ext: lse is undefined");
    TORCH_CHECK(dout.device() == q.device() && out.device() == q.device() && lse.device() == q.device(),
                "flashattn_ext: dout, out and lse must be on the device of q (", q.device().str(), ")");
    TORCH_CHECK(lse.dim() == 2 && lse.size(0) == q.size(1) && lse.size(1) == q.size(0),
                "flashattn_ext: lse must have shape (nheads, total_q) = ", shape({q.size(1), q.size(0)}), ", got ",
                shape(lse.sizes()));
    TORCH_CHECK(lse.scalar_type() == lse_dtype(q.scalar_type()), "flashattn_ext: lse must have dtype ",
                lse_dtype(q.scalar_type()), " for ", q.scalar_type(), " inputs, got ", lse.scalar_type());
}

void check_bwd_inputs(const at::Tensor &dout, const at::Tensor &q, const at::Tensor &v, const at::Tensor &out,
                      const at::Tensor &lse, bool out32_ok)
{
    check_out_shapes(dout, q, v, out);
    check_bwd_dtypes(dout, q, out, out32_ok);
    TORCH_CHECK(dout.device() == q.device() && out.device() == q.device() && lse.device() == q.device(),
                "flashattn_ext: dout, out and lse must be on the device of q (", q.device().str(), ")");
    TORCH_CHECK(lse.dim() == 3 && lse.size(0) == q.size(0) && lse.size(1) == q.size(2) && lse.size(2) == q.size(1),
                "flashattn_ext: lse must have shape (batch, nheads, seqlen_q) = ",
                shape({q.size(0), q.size(2), q.size(1)}), ", got ", shape(lse.sizes()));
    TORCH_CHECK(lse.scalar_type() == lse_dtype(q.scalar_type()), "flashattn_ext: lse must have dtype ",
                lse_dtype(q.scalar_type()), " for ", q.scalar_type(), " inputs, got ", lse.scalar_type());
}

CallKind fwd_call_kind(const Opt &cu_seqlens_q, const Opt &cu_seqlens_k, const Opt &seqused_k, int64_t max_seqlen_q,
                       int64_t max_seqlen_k, const Opt &block_table, const Opt &cache_seqlens,
                       const Opt &cache_batch_idx, const Opt &cache_leftpad, int64_t num_splits, bool bottom_right,
                       const Opt &attn_mask, double dropout_p, const Opt &rel_bias)
{
    const bool cache_args = cache_seqlens || cache_batch_idx || cache_leftpad || num_splits != 0;
    if (bwd_call_kind(cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, bottom_right, attn_mask,
                      false) == CallKind::Varlen) {
        TORCH_CHECK(!cache_args, "flashattn_ext: cache_seqlens, cache_batch_idx, cache_leftpad and num_splits are "
                                 "KV-cache arguments, not taken with cu_seqlens_q (a varlen call; its keys are "
                                 "limited by seqused_k)");
        return CallKind::Varlen;
    }
    if (!cache_args && !block_table)
        return CallKind::Dense;
    const char *call = " with a KV cache (cache_seqlens, cache_batch_idx, cache_leftpad, block_table or num_splits)";
    TORCH_CHECK(!attn_mask, "flashattn_ext: attn_mask is not supported", call);
    TORCH_CHECK(dropout_p == 0.0, "flashattn_ext: dropout_p must be 0", call);
    TORCH_CHECK(!rel_bias, "flashattn_ext: rel_bias is not supported", call);
    TORCH_CHECK(bottom_right, "flashattn_ext: bottom_right must be True", call,
                ": causal and windows are aligned to each sequence's last key");
    return CallKind::Cache;
}

CallKind bwd_call_kind(const Opt &cu_seqlens_q, const Opt &cu_seqlens_k, const Opt &seqused_k, int64_t max_seqlen_q,
                       int64_t max_seqlen_k, bool bottom_right, const Opt &attn_mask, bool mask_grad)
{
    TORCH_CHECK(cu_seqlens_q.has_value() == cu_seqlens_k.has_value(),
                "flashattn_ext: cu_seqlens_q and cu_seqlens_k go together (a varlen call), got only ",
                cu_seqlens_q ? "cu_seqlens_q" : "cu_seqlens_k");
    if (!cu_seqlens_q) {
        TORCH_CHECK(!seqused_k, "flashattn_ext: seqused_k needs cu_seqlens_q and cu_seqlens_k (a varlen call; a KV "
                                "cache takes cache_seqlens)");
        TORCH_CHECK(max_seqlen_q == 0 && max_seqlen_k == 0,
                    "flashattn_ext: max_seqlen_q and max_seqlen_k need cu_seqlens_q and cu_seqlens_k (a varlen call)");
        return CallKind::Dense;
    }
    const char *call = " with cu_seqlens_q (a varlen call)";
    TORCH_CHECK(!attn_mask && !mask_grad, "flashattn_ext: attn_mask is not supported", call);
    TORCH_CHECK(bottom_right, "flashattn_ext: bottom_right must be True", call,
                ": causal and windows are aligned to each sequence's last key");
    return CallKind::Varlen;
}

at::Tensor empty_lse_dtype(const at::Tensor &q)
{
    return at::empty({0}, q.options().dtype(lse_dtype(q.scalar_type())));
}

at::Tensor no_out32(const at::Tensor &q)
{
    return at::empty({0}, q.options().dtype(at::kFloat));
}

at::ScalarType lse_dtype(at::ScalarType t)
{
    return t == at::kDouble ? at::kDouble : at::kFloat;
}

void check_variants(const Variants &var, const at::Tensor &q, const at::Tensor &k)
{
    check_variants(var, q, q.size(0), q.size(1), q.size(2), k.size(1));
}

void check_variants(const Variants &var, const at::Tensor &q, int64_t b, int64_t sq, int64_t h, int64_t sk)
{
    TORCH_CHECK(var.window_left >= -1 && var.window_right >= -1,
                "flashattn_ext: window_size values must be >= -1 (-1: unbounded), got (", num(var.window_left), ", ",
                num(var.window_right), ")");
    TORCH_CHECK(std::isfinite(var.softcap) && var.softcap >= 0.0,
                "flashattn_ext: softcap must be finite and >= 0 (0: off), got ", std::to_string(var.softcap));
    check_dropout_p(var.dropout_p);
    if (var.alibi_slopes) {
        const at::Tensor &a = *var.alibi_slopes;
        TORCH_CHECK(a.scalar_type() == at::kFloat, "flashattn_ext: alibi_slopes must be float32, got ", a.scalar_type());
        TORCH_CHECK(a.device() == q.device(), "flashattn_ext: alibi_slopes must be on the device of q (",
                    q.device().str(), "), got ", a.device().str());
        const bool per_head = a.dim() == 1 && a.size(0) == h;
        const bool per_batch = a.dim() == 2 && a.size(0) == b && a.size(1) == h;
        TORCH_CHECK(per_head || per_batch, "flashattn_ext: alibi_slopes must have shape (nheads,) = (", num(h),
                    ",) or (batch, nheads) = ", shape({b, h}), ", got ", shape(a.sizes()));
    }
    TORCH_CHECK(var.rel_bias.has_value() == var.rel_buckets.has_value(),
                "flashattn_ext: rel_bias and rel_buckets go together");
    if (var.rel_bias) {
        const at::Tensor &t = *var.rel_bias, &bk = *var.rel_buckets;
        TORCH_CHECK(!var.alibi_slopes, "flashattn_ext: rel_bias and alibi_slopes are both position biases; pass one");
        TORCH_CHECK(t.scalar_type() == lse_dtype(q.scalar_type()), "flashattn_ext: rel_bias must have dtype ",
                    lse_dtype(q.scalar_type()), " for ", q.scalar_type(), " inputs, got ", t.scalar_type());
        TORCH_CHECK(t.device() == q.device() && bk.device() == q.device(),
                    "flashattn_ext: rel_bias and rel_buckets must be on the device of q (", q.device().str(), "), got ",
                    t.device().str(), " and ", bk.device().str());
        TORCH_CHECK(t.dim() == 2 && t.size(0) == h && t.size(1) >= 1,
                    "flashattn_ext: rel_bias must have shape (nheads, num_buckets) = (", num(h), ", n >= 1), got ",
                    shape(t.sizes()));
        TORCH_CHECK(bk.scalar_type() == at::kInt && bk.dim() == 1 && bk.size(0) % 2 == 1,
                    "flashattn_ext: rel_buckets must be int32 of odd length (2 R + 1,), got ", bk.scalar_type(), " ",
                    shape(bk.sizes()));
        if (!bk.is_cuda() && !bk.is_meta() && bk.numel() > 0) {
            const auto [lo, hi] = at::aminmax(bk);
            TORCH_CHECK(lo.item<int32_t>() >= 0 && hi.item<int32_t>() < t.size(1),
                        "flashattn_ext: rel_buckets must hold buckets in [0, num_buckets = ", num(t.size(1)), ")");
        }
    }
    if (var.sink) {
        const at::Tensor &t = *var.sink;
        TORCH_CHECK(t.scalar_type() == lse_dtype(q.scalar_type()), "flashattn_ext: sink must have dtype ",
                    lse_dtype(q.scalar_type()), " for ", q.scalar_type(), " inputs, got ", t.scalar_type());
        TORCH_CHECK(t.device() == q.device(), "flashattn_ext: sink must be on the device of q (", q.device().str(),
                    "), got ", t.device().str());
        TORCH_CHECK(t.dim() == 1 && t.size(0) == h, "flashattn_ext: sink must have shape (nheads,) = (", num(h),
                    ",), got ", shape(t.sizes()));
    }
    if (var.attn_mask) {
        const at::Tensor &m = *var.attn_mask;
        TORCH_CHECK(m.scalar_type() == at::kBool || m.scalar_type() == q.scalar_type(),
                    "flashattn_ext: attn_mask must be bool or have the dtype of q (", q.scalar_type(), "), got ",
                    m.scalar_type());
        TORCH_CHECK(m.device() == q.device(), "flashattn_ext: attn_mask must be on the device of q (",
                    q.device().str(), "), got ", m.device().str());
        TORCH_CHECK(m.dim() == 4 && m.size(0) == b && m.size(1) == h && m.size(2) == sq && m.size(3) == sk,
                    "flashattn_ext: attn_mask must have shape (batch, nheads, seqlen_q, seqlen_k) = ",
                    shape({b, h, sq, sk}), " (broadcast dimensions expanded, stride 0), got ", shape(m.sizes()));
    }
}

Variants variants_of(bool causal, bool bottom_right, int64_t window_left, int64_t window_right, double softcap,
                     const c10::optional<at::Tensor> &alibi_slopes, const c10::optional<at::Tensor> &sink,
                     const c10::optional<at::Tensor> &attn_mask, double dropout_p, bool deterministic)
{
    Variants var;
    var.causal = causal;
    var.bottom_right = bottom_right;
    var.window_left = window_left;
    var.window_right = window_right;
    var.softcap = softcap;
    var.alibi_slopes = alibi_slopes;
    var.sink = sink;
    var.attn_mask = attn_mask;
    var.dropout_p = dropout_p;
    var.deterministic = deterministic;
    return var;
}

Variants with_rel_bias(Variants var, const c10::optional<at::Tensor> &rel_bias,
                       const c10::optional<at::Tensor> &rel_buckets)
{
    var.rel_bias = rel_bias;
    var.rel_buckets = rel_buckets;
    return var;
}

void check_dropout_p(double dropout_p)
{
    TORCH_CHECK(dropout_p >= 0.0 && dropout_p <= 1.0, "flashattn_ext: dropout_p must be a real number in [0, 1], got ",
                std::to_string(dropout_p));
}

void set_dropout_params(flash_params *p, double dropout_p, const at::Tensor &rng_state)
{
    if (dropout_p <= 0.0)
        return;
    flash_dropout_set(p, dropout_p);
    p->philox_seed = static_cast<uint64_t>(rng_state.data_ptr<int64_t>()[0]);
    p->philox_offset = static_cast<uint64_t>(rng_state.data_ptr<int64_t>()[1]);
}

flash_params dropout_mask_params(const at::Tensor &q, const at::Tensor &rng_state, int64_t seqlen_k, double dropout_p)
{
    check_rng_state(rng_state);
    TORCH_CHECK(q.dim() == kRank, "flashattn_ext: q must have 4 dimensions (batch, seqlen, nheads, headdim), got ",
                num(q.dim()));
    TORCH_CHECK(seqlen_k >= 0, "flashattn_ext: seqlen_k must be >= 0, got ", num(seqlen_k));
    check_dropout_p(dropout_p);
    flash_params p;
    std::memset(&p, 0, sizeof(p));
    p.b = q.size(0);
    p.sq = q.size(1);
    p.h = q.size(2);
    p.sk = seqlen_k;
    set_dropout_params(&p, dropout_p, rng_state);
    return p;
}

void check_rng_state(const at::Tensor &rng_state)
{
    TORCH_CHECK(rng_state.defined() && rng_state.scalar_type() == at::kLong && rng_state.dim() == 1 &&
                    rng_state.size(0) == 2 && rng_state.device().is_cpu(),
                "flashattn_ext: rng_state must be an int64 CPU tensor of shape (2,) (seed, offset) as returned by fwd");
}

at::Tensor rng_state_from(uint64_t seed, uint64_t offset)
{
    at::Tensor t = at::empty({2}, at::TensorOptions().dtype(at::kLong).device(at::kCPU));
    t.data_ptr<int64_t>()[0] = static_cast<int64_t>(seed);
    t.data_ptr<int64_t>()[1] = static_cast<int64_t>(offset);
    return t;
}

namespace {

flash_strides4 strides4_of(const at::Tensor &t)
{
    flash_strides4 s;
    s.batch = t.size(0) > 1 ? t.stride(0) : 0;
    s.head = t.size(1) > 1 ? t.stride(1) : 0;
    s.row = t.size(2) > 1 ? t.stride(2) : 0;
    s.col = t.size(3) > 1 ? t.stride(3) : 0;
    return s;
}

// A paged cache (flash.h block_table): the table (a contiguous copy in keep when it is not contiguous
// already), its row stride and the page size, dimension 1 of k (num_pages, page_size, nheads_kv, headdim).
// k / v keep their page strides and make_params' k_batches counts the pages.
void set_block_table(flash_params *p, const at::Tensor &table, const at::Tensor &k, VariantTensors *keep)
{
    keep->block_table = table.contiguous();
    p->block_table = keep->block_table.data_ptr<int32_t>();
    p->block_table_stride = keep->block_table.size(1);
    p->page_size = k.size(1);
}

}  // namespace

void set_mask_blocks(flash_params *p, const at::Tensor &mask, const at::Tensor &flags, VariantTensors *keep)
{
    keep->mask_blocks = flags.expand({mask.size(0), mask.size(1), flash_cdiv64(mask.size(2), FLASH_MASK_BLOCK),
                                      flash_cdiv64(mask.size(3), FLASH_MASK_BLOCK)});
    p->mask_blocks = keep->mask_blocks.data_ptr<uint8_t>();
    p->mask_blocks_s = strides4_of(keep->mask_blocks);
}

namespace {

// The block flags of a CPU mask (flash_mask_flags_cpu: one pass in C) set in p, whose mask fields and sizes are
// set. An fp16 / bf16 additive mask's flags are read from its fp32 copy (mask_f32).
void set_cpu_mask_blocks(flash_params *p, const at::Tensor &mask, VariantTensors *keep)
{
    int64_t dims[4];
    flash_mask_flag_dims(p, dims);
    at::Tensor flags = at::empty({dims[0], dims[1], dims[2], dims[3]}, mask.options().dtype(at::kByte));
    flash_params read = *p;
    at::Tensor entries = mask;
    if (mask.scalar_type() == at::kHalf || mask.scalar_type() == at::kBFloat16) {
        entries = *mask_f32(mask);
        read.mask = entries.data_ptr();
        read.mask_s = strides4_of(entries);
    }
    // an additive mask's entry type (a bool mask's is not read)
    const int type = entries.scalar_type() == at::kBool ? FLASH_FP32 : to_flash_dtype(entries.scalar_type());
    TORCH_CHECK(flash_mask_flags_cpu(&read, type, flags.data_ptr<uint8_t>()) == FLASH_CPU_OK,
                "flashattn_ext: internal error: the block flags of an attn_mask of dtype ", mask.scalar_type());
    set_mask_blocks(p, mask, flags, keep);
}

}  // namespace

flash_params make_params(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, const at::Tensor &out,
                         const at::Tensor &lse, double softmax_scale, const Variants &var,
                         const at::Tensor &rng_state, VariantTensors *keep)
{
    TORCH_INTERNAL_ASSERT(lse.is_contiguous() && lse.dim() == 3);
    flash_params p;
    std::memset(&p, 0, sizeof(p));
    p.q = q.data_ptr();
    p.k = k.data_ptr();
    p.v = v.data_ptr();
    p.o = out.data_ptr();
    p.lse = lse.data_ptr();
    p.q_s = strides_of(q);
    p.k_s = strides_of(k);
    p.v_s = strides_of(v);
    p.o_s = strides_of(out);
    p.b = q.size(0);
    p.sq = q.size(1);
    p.h = q.size(2);
    p.d = q.size(3);
    p.d_v = v.size(3);
    p.sk = k.size(1);
    p.h_kv = k.size(2);
    p.h_per_kv = p.h / p.h_kv;
    p.k_batches = k.size(0);
    p.lse_head = lse.size(2);
    p.lse_batch = lse.size(1) * lse.size(2);
    p.scale = softmax_scale;
    p.scale_log2 = static_cast<float>(softmax_scale * FLASH_LOG2E);

    // Mask geometry (mask.h flash_seq_of makes each sequence's band of these): window sides, -1
    // unbounded; causal is a right side of 0.
    p.band_left = var.window_left;
    p.band_right = var.causal ? 0 : var.window_right;
    p.band_bottom_right = var.bottom_right ? 1 : 0;

    p.softcap = var.softcap;
    if (var.alibi_slopes) {
        keep->alibi_slopes = var.alibi_slopes->contiguous();
        p.alibi_slopes = keep->alibi_slopes.data_ptr<float>();
        p.alibi_batch_stride = keep->alibi_slopes.dim() == 2 ? p.h : 0;
    }
    if (var.attn_mask) {
        const at::Tensor &m = *var.attn_mask;
        p.mask = m.data_ptr();
        p.mask_kind = m.scalar_type() == at::kBool ? FLASH_MASK_BOOL : FLASH_MASK_ADD;
        p.mask_s = strides4_of(m);
    }
    if (var.sink)
        p.sink = var.sink->data_ptr();
    if (var.rel_bias) {
        keep->rel_bias = var.rel_bias->contiguous();
        keep->rel_buckets = var.rel_buckets->contiguous();
        p.rel_bias = keep->rel_bias.data_ptr();
        p.rel_buckets = keep->rel_buckets.data_ptr<int32_t>();
        p.rel_range = keep->rel_buckets.size(0) / 2;
        p.rel_nb = keep->rel_bias.size(1);
    }
    set_dropout_params(&p, var.dropout_p, rng_state);
    p.has_hook = has_score_hook(var) ? 1 : 0;
    p.deterministic = var.deterministic ? 1 : 0;
    p.dtype = to_flash_dtype(q.scalar_type());
    if (var.attn_mask && !var.attn_mask->is_cuda())  // a CUDA mask's: the binding's, on the device
        set_cpu_mask_blocks(&p, *var.attn_mask, keep);
    return p;
}

void set_bwd_params(flash_params *p, const at::Tensor &dout, const at::Tensor &dq, const at::Tensor &dk,
                    const at::Tensor &dv, const at::Tensor &delta)
{
    TORCH_INTERNAL_ASSERT(delta.is_contiguous());
    p->dout = dout.data_ptr();
    p->dq = dq.data_ptr();
    p->dk = dk.data_ptr();
    p->dv = dv.data_ptr();
    p->delta = delta.data_ptr();
    p->do_s = strides_of(dout);
    p->dq_s = strides_of(dq);
    p->dk_s = strides_of(dk);
    p->dv_s = strides_of(dv);
}

flash_params make_varlen_params(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, const at::Tensor &out,
                                const at::Tensor &lse, const Varlen &vl, double softmax_scale, const Variants &var,
                                const at::Tensor &rng_state, VariantTensors *keep)
{
    const bool paged = vl.block_table.has_value();
    flash_params p = make_params(q.unsqueeze(0), paged ? k : k.unsqueeze(0), paged ? v : v.unsqueeze(0),
                                 out.unsqueeze(0), lse.unsqueeze(0), softmax_scale, var, rng_state, keep);
    p.b = vl.batch();
    p.sq = vl.max_seqlen_q;
    p.sk = vl.max_seqlen_k;
    p.q_s.batch = p.o_s.batch = 0;
    p.lse_batch = 0;
    p.lse_head = q.size(0);
    p.total_q = q.size(0);
    p.cu_seqlens_q = vl.cu_seqlens_q.data_ptr<int32_t>();
    p.cu_seqlens_k = vl.cu_seqlens_k.data_ptr<int32_t>();
    p.seqused_k = vl.seqused_k ? vl.seqused_k->data_ptr<int32_t>() : nullptr;
    if (paged) {
        set_block_table(&p, *vl.block_table, k, keep);
    } else {
        p.k_s.batch = p.v_s.batch = 0;
        p.total_k = k.size(0);
    }
    return p;
}

void set_varlen_bwd_params(flash_params *p, const at::Tensor &dout, const at::Tensor &dq, const at::Tensor &dk,
                           const at::Tensor &dv, const at::Tensor &delta)
{
    set_bwd_params(p, dout.unsqueeze(0), dq.unsqueeze(0), dk.unsqueeze(0), dv.unsqueeze(0), delta.unsqueeze(0));
    p->do_s.batch = p->dq_s.batch = p->dk_s.batch = p->dv_s.batch = 0;
}

int64_t KvCache::seqlen_k(const at::Tensor &k_cache) const
{
    return block_table ? block_table->size(1) * k_cache.size(1) : k_cache.size(1);
}

KvCache kvcache_of(const c10::optional<at::Tensor> &cache_seqlens, const c10::optional<at::Tensor> &cache_batch_idx,
                   const c10::optional<at::Tensor> &cache_leftpad, const c10::optional<at::Tensor> &block_table)
{
    KvCache kv;
    kv.cache_seqlens = cache_seqlens;
    kv.cache_batch_idx = cache_batch_idx;
    kv.cache_leftpad = cache_leftpad;
    kv.block_table = block_table;
    return kv;
}

void check_kvcache_inputs(const at::Tensor &q, const at::Tensor &k_cache, const at::Tensor &v_cache,
                          const KvCache &kv)
{
    check_rank_and_last_stride(q, "q");
    check_rank_and_last_stride(k_cache, "k_cache");
    check_rank_and_last_stride(v_cache, "v_cache");
    check_qkv_common(q, k_cache, v_cache, kRank - 1, "k_cache", "v_cache");
    TORCH_CHECK(k_cache.size(0) == v_cache.size(0), "flashattn_ext: k_cache and v_cache must have the same ",
                kv.block_table ? "number of pages" : "batch size", ", got ", num(k_cache.size(0)), " and ",
                num(v_cache.size(0)));
    const int64_t batch = q.size(0);
    const char *per_batch[] = {"cache_seqlens", "cache_batch_idx", "cache_leftpad"};
    const c10::optional<at::Tensor> *index[] = {&kv.cache_seqlens, &kv.cache_batch_idx, &kv.cache_leftpad};
    for (int i = 0; i < 3; ++i) {
        if (!*index[i])
            continue;
        check_index_tensor(**index[i], q, per_batch[i]);
        TORCH_CHECK((*index[i])->size(0) == batch, "flashattn_ext: ", per_batch[i], " must have shape (batch,) = (",
                    num(batch), ",), got ", shape((*index[i])->sizes()));
    }
    if (kv.block_table) {
        const at::Tensor &t = *kv.block_table;
        TORCH_CHECK(!kv.cache_batch_idx, "flashattn_ext: cache_batch_idx cannot be combined with block_table (a paged "
                    "cache is addressed through its table alone, as in flash-attn)");
        check_block_table(t, q, k_cache, batch, "k_cache");
        TORCH_CHECK(k_cache.size(0) > 0 || t.numel() == 0, "flashattn_ext: a paged k_cache needs at least one page "
                    "for a non-empty block_table");
    } else if (kv.cache_batch_idx) {
        TORCH_CHECK(k_cache.size(0) > 0 || batch == 0 || k_cache.size(1) == 0,
                    "flashattn_ext: k_cache needs at least one batch entry for cache_batch_idx to index");
    } else {
        TORCH_CHECK(k_cache.size(0) == batch, "flashattn_ext: the batch size of k_cache (", num(k_cache.size(0)),
                    ") must be that of q (", num(batch), ") without cache_batch_idx");
    }
}

void check_num_splits(int64_t num_splits)
{
    TORCH_CHECK(num_splits >= 0 && num_splits <= INT_MAX, "flashattn_ext: num_splits must be 0 (chosen by the "
                "kernels) or a positive count, got ", num(num_splits));
}

flash_params make_kvcache_params(const at::Tensor &q, const at::Tensor &k_cache, const at::Tensor &v_cache,
                                 const at::Tensor &out, const at::Tensor &lse, const KvCache &kv,
                                 double softmax_scale, const Variants &var, VariantTensors *keep)
{
    flash_params p = make_params(q, k_cache, v_cache, out, lse, softmax_scale, var, at::Tensor(), keep);
    p.sk = kv.seqlen_k(k_cache);
    p.seqused_k = kv.cache_seqlens ? kv.cache_seqlens->data_ptr<int32_t>() : nullptr;
    p.k_batch_idx = kv.cache_batch_idx ? kv.cache_batch_idx->data_ptr<int32_t>() : nullptr;
    p.k_leftpad = kv.cache_leftpad ? kv.cache_leftpad->data_ptr<int32_t>() : nullptr;
    if (kv.block_table)
        set_block_table(&p, *kv.block_table, k_cache, keep);
    return p;
}

KvAppend kv_append_of(const at::Tensor &k_cache, const at::Tensor &v_cache, const at::Tensor &k, const at::Tensor &v,
                      const at::Tensor &cache_seqlens, const c10::optional<at::Tensor> &cache_batch_idx,
                      const c10::optional<at::Tensor> &block_table)
{
    check_rank_and_last_stride(k_cache, "k_cache");
    check_rank_and_last_stride(v_cache, "v_cache");
    const char *names[] = {"v_cache", "k", "v"};
    const at::Tensor *tensors[] = {&v_cache, &k, &v};
    for (int i = 0; i < 3; ++i) {
        TORCH_CHECK(tensors[i]->defined(), "flashattn_ext: ", names[i], " is undefined");
        TORCH_CHECK(tensors[i]->scalar_type() == k_cache.scalar_type(), "flashattn_ext: ", names[i],
                    " must have the dtype of k_cache (", k_cache.scalar_type(), "), got ", tensors[i]->scalar_type());
        TORCH_CHECK(tensors[i]->device() == k_cache.device(), "flashattn_ext: ", names[i],
                    " must be on the device of k_cache (", k_cache.device().str(), "), got ",
                    tensors[i]->device().str());
    }
    const at::ScalarType t = k_cache.scalar_type();
    TORCH_CHECK(t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16,
                "flashattn_ext: k_cache must be float16, bfloat16, float32 or float64, got ", t);
    const int64_t batch = k.dim() == kRank ? k.size(0) : 0, seqlen_new = k.dim() == kRank ? k.size(1) : 0;
    const int64_t nheads_kv = k_cache.size(2), d = k_cache.size(3), d_v = v_cache.size(3);
    TORCH_CHECK(v_cache.sizes().slice(0, 3) == k_cache.sizes().slice(0, 3), "flashattn_ext: v_cache must have the "
                "shape of k_cache ", shape(k_cache.sizes()), " but for its head dim (the last), got ",
                shape(v_cache.sizes()));
    TORCH_CHECK(k.dim() == kRank && k.size(2) == nheads_kv && k.size(3) == d, "flashattn_ext: k must have shape "
                "(batch, seqlen_new, nheads_kv, headdim) with the nheads_kv and headdim of k_cache (", num(nheads_kv),
                ", ", num(d), "), got ", shape(k.sizes()));
    TORCH_CHECK(v.dim() == kRank && v.size(0) == batch && v.size(1) == seqlen_new && v.size(2) == nheads_kv &&
                v.size(3) == d_v, "flashattn_ext: v must have shape (batch, seqlen_new, nheads_kv, headdim_v) = (",
                num(batch), ", ", num(seqlen_new), ", ", num(nheads_kv), ", ", num(d_v),
                ") (k's batch and seqlen_new, v_cache's nheads_kv and head dim), got ", shape(v.sizes()));
    const char *index_names[] = {"cache_seqlens", "cache_batch_idx", "block_table"};
    const at::Tensor *index[] = {&cache_seqlens, cache_batch_idx ? &*cache_batch_idx : nullptr,
                                 block_table ? &*block_table : nullptr};
    for (int i = 0; i < 3; ++i) {
        if (!index[i])
            continue;
        TORCH_CHECK(index[i]->defined(), "flashattn_ext: ", index_names[i], " is undefined");
        TORCH_CHECK(index[i]->scalar_type() == at::kInt, "flashattn_ext: ", index_names[i], " must be int32, got ",
                    index[i]->scalar_type());
        TORCH_CHECK(index[i]->device() == k_cache.device(), "flashattn_ext: ", index_names[i],
                    " must be on the device of k_cache (", k_cache.device().str(), "), got ",
                    index[i]->device().str());
        TORCH_CHECK(i == 2 || (index[i]->dim() == 1 && index[i]->size(0) == batch), "flashattn_ext: ",
                    index_names[i], " must have shape (batch,) = (", num(batch), ",), got ",
                    shape(index[i]->sizes()));
    }
    if (block_table) {
        TORCH_CHECK(!cache_batch_idx, "flashattn_ext: cache_batch_idx cannot be combined with block_table (a paged "
                    "cache is addressed through its table alone, as in flash-attn)");
        check_block_table(*block_table, k_cache, k_cache, batch, "k_cache");
    } else if (!cache_batch_idx) {
        TORCH_CHECK(k_cache.size(0) == batch, "flashattn_ext: the batch size of k_cache (", num(k_cache.size(0)),
                    ") must be that of k (", num(batch), ") without cache_batch_idx");
    }

    KvAppend a;
    a.k = k.size(3) <= 1 || k.stride(3) == 1 ? k : k.contiguous();
    a.v = v.size(3) <= 1 || v.stride(3) == 1 ? v : v.contiguous();
    a.cache_seqlens = cache_seqlens.contiguous();
    a.cache_batch_idx = cache_batch_idx ? cache_batch_idx->contiguous() : at::Tensor();
    flash_kv_append_params &p = a.p;
    std::memset(&p, 0, sizeof(p));
    p.k_cache = k_cache.data_ptr();
    p.v_cache = v_cache.data_ptr();
    p.k = a.k.data_ptr();
    p.v = a.v.data_ptr();
    p.k_cache_s = strides_of(k_cache);
    p.v_cache_s = strides_of(v_cache);
    p.k_s = strides_of(a.k);
    p.v_s = strides_of(a.v);
    p.cache_seqlens = a.cache_seqlens.data_ptr<int32_t>();
    p.cache_batch_idx = cache_batch_idx ? a.cache_batch_idx.data_ptr<int32_t>() : nullptr;
    if (block_table) {
        p.block_table = block_table->data_ptr<int32_t>();
        p.table_s0 = block_table->stride(0);
        p.table_s1 = block_table->stride(1);
        p.page_size = k_cache.size(1);
    }
    p.batch = batch;
    p.seqlen_new = seqlen_new;
    p.nheads_kv = nheads_kv;
    p.d = d;
    p.d_v = d_v;
    p.cache_batches = k_cache.size(0);
    p.seqlen_k = block_table ? block_table->size(1) * k_cache.size(1) : k_cache.size(1);
    p.elem_size = k_cache.element_size();
    a.no_work = batch == 0 || seqlen_new == 0 || nheads_kv == 0 || p.seqlen_k == 0 || p.cache_batches == 0;
    return a;
}

Varlen varlen_of(const at::Tensor &cu_seqlens_q, const at::Tensor &cu_seqlens_k,
                 const c10::optional<at::Tensor> &seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                 const c10::optional<at::Tensor> &block_table)
{
    Varlen vl;
    vl.cu_seqlens_q = cu_seqlens_q;
    vl.cu_seqlens_k = cu_seqlens_k;
    vl.seqused_k = seqused_k;
    vl.block_table = block_table;
    vl.max_seqlen_q = max_seqlen_q;
    vl.max_seqlen_k = max_seqlen_k;
    return vl;
}

std::tuple<at::Tensor, at::Tensor> varlen_fwd_outputs(const at::Tensor &q, const at::Tensor &v, at::ScalarType out_t)
{
    at::Tensor out = at::zeros(out_sizes(q, v), q.options().dtype(out_t));  // v: packed or paged
    at::Tensor lse = at::full({q.size(1), q.size(0)}, -std::numeric_limits<double>::infinity(),
                              q.options().dtype(lse_dtype(q.scalar_type())));
    return {out, lse};
}

bool varlen_fwd_no_work(const at::Tensor &q, const Varlen &vl, const Variants &var)
{
    return q.numel() == 0 || vl.max_seqlen_q == 0 || (vl.max_seqlen_k == 0 && !var.sink);
}

bool varlen_bwd_no_work(const at::Tensor &q, const at::Tensor &k, const Varlen &vl)
{
    return q.numel() == 0 || k.size(0) == 0 || vl.max_seqlen_q == 0 || vl.max_seqlen_k == 0;
}

bool no_work(const at::Tensor &q)
{
    return q.numel() == 0;
}

std::tuple<at::Tensor, at::Tensor> fwd_without_keys(const at::Tensor &q, const at::Tensor &v,
                                                    const c10::optional<at::Tensor> &sink)
{
    at::Tensor out = at::zeros(out_sizes(q, v), q.options());
    const auto opts = q.options().dtype(lse_dtype(q.scalar_type()));
    at::Tensor lse = sink ? sink->view({1, q.size(2), 1}).expand({q.size(0), q.size(2), q.size(1)}).contiguous()
                          : at::full({q.size(0), q.size(2), q.size(1)}, -std::numeric_limits<double>::infinity(), opts);
    return {out, lse};
}

bool has_score_hook(const Variants &var)
{
    return var.softcap > 0.0 || var.alibi_slopes || var.rel_bias || var.attn_mask || var.dropout_p > 0.0;
}

at::Tensor make_dmask(const at::Tensor &q, const at::Tensor &k, bool mask_grad)
{
    const auto opts = q.options().dtype(lse_dtype(q.scalar_type()));
    return mask_grad ? at::zeros({q.size(0), q.size(2), q.size(1), k.size(1)}, opts) : at::empty({0}, opts);
}

at::Tensor f32(const at::Tensor &t)
{
    return t.to(at::kFloat);
}

// A float attn_mask in fp32 without materialising its broadcast (stride 0) dimensions.
c10::optional<at::Tensor> mask_f32(const c10::optional<at::Tensor> &mask)
{
    if (!mask || mask->scalar_type() == at::kBool)
        return mask;
    at::Tensor m = *mask;
    for (int64_t d = 0; d < m.dim(); ++d)
        if (m.size(d) > 1 && m.stride(d) == 0)
            m = m.narrow(d, 0, 1);
    return f32(m).expand(mask->sizes());
}

namespace {

void check_cpu_dtype(const at::Tensor &q)
{
    const at::ScalarType t = q.scalar_type();
    TORCH_CHECK(t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16,
                "flashattn_ext: on CPU, q, k and v must be float16, bfloat16, float32 or float64, got ", t);
}

// fp16 / bf16 on the CPU: the kernels (flash_cpu.c) run in fp32. Each op checks its arguments in their own
// dtypes, then calls itself on fp32 copies (f32) and rounds out / dq / dk / dv back to the input dtype once;
// lse and dmask are fp32, as on CUDA. The forwards also return the fp32 out (out32), which fwd's autograd saves
// for the backward's delta = rowsum(dout * out): the rounded out would add its rounding error to every gradient
// (bf16 with an additive mask: dq 4% further from the float64 result than its rounding, where torch's CPU
// SDPA reaches the rounding). Given the rounded out, the backward uses it, as torch and flash-attn do.
bool is_half(const at::Tensor &q)
{
    return q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16;
}

// The dtype whose fp32 copies this thread's CPU call runs on (flash.h cpu_src_dtype, for the AMX products of
// flash_cpu.c): is_half's branches set it around their call on the copies; the calls of the kernels below pass it.
thread_local flash_dtype cpu_src_dtype = FLASH_FP32;

struct SourceDtype {
    flash_dtype prev;
    explicit SourceDtype(const at::Tensor &q) : prev(cpu_src_dtype) { cpu_src_dtype = to_flash_dtype(q.scalar_type()); }
    ~SourceDtype() { cpu_src_dtype = prev; }
};

flash_cpu_status run_fwd_cpu(flash_params p)
{
    p.cpu_src_dtype = cpu_src_dtype;
    return flash_fwd_cpu(&p);
}

flash_cpu_status run_bwd_cpu(flash_params p)
{
    p.cpu_src_dtype = cpu_src_dtype;
    return flash_bwd_cpu(&p);
}

void check_cpu_status(flash_cpu_status status, const char *what)
{
    TORCH_CHECK(status != FLASH_CPU_ERR_NOMEM, "flashattn_ext: out of memory for the CPU ", what, " workspace");
    TORCH_CHECK(status == FLASH_CPU_OK, "flashattn_ext: CPU ", what, " failed with status ", num(status));
}

// (seed, offset) for a CPU call: a 64-bit seed from torch's default CPU generator, offset 0.
at::Tensor draw_rng_state_cpu(double dropout_p)
{
    if (dropout_p <= 0.0)
        return rng_state_from(0, 0);
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    return rng_state_from(at::check_generator<at::CPUGeneratorImpl>(gen)->random64(), 0);
}

// fp16 / bf16 forwards without fp32 copies of their inputs. make(q, rng_state) gives the params of that q (the
// input or its fp32 copy) and k, v as they are, with fp32 out and lse (out's rows in no sequence zero where
// zero_rows: varlen). Few query rows without dropout (flash_cpu_decodes): the decode path on an fp32 copy of q,
// reading k / v as they are (flash.h cpu_kv_dtype; a copy of a whole cache per call would cost more than the
// attention). Else, on AMX with every key tile packed once per call (flash_cpu_fwd_reads_half): q, k and v as they
// are (cpu_q_dtype, cpu_kv_dtype), the dropout draw only then, and out rounded to q's dtype by the kernel beside the
// fp32 out (cpu_o_half). Either returns out in q's dtype, having set *rng_state; else an undefined tensor, having
// drawn and run nothing: the caller runs the fp32 kernels on copies.
template <typename Make>
at::Tensor run_half_fwd(const Make &make, const at::Tensor &q, at::ScalarType kv_t, double dropout_p,
                        const at::Tensor &out, bool zero_rows, at::Tensor *rng_state)
{
    const auto params = [&](const at::Tensor &qq) {
        flash_params p = make(qq, rng_state_from(0, 0));
        p.dtype = FLASH_FP32; // the kernels' type (out, lse); the inputs' is cpu_src_dtype
        p.cpu_src_dtype = cpu_src_dtype;
        p.cpu_kv_dtype = to_flash_dtype(kv_t);
        return p;
    };
    flash_params p = params(q);
    if (flash_cpu_decodes(&p)) { // shapes and dropout only
        const at::Tensor q32 = f32(q);
        const flash_params p32 = params(q32);
        check_cpu_status(flash_fwd_cpu(&p32), "decode forward");
        *rng_state = rng_state_from(0, 0);
        return out.to(q.scalar_type());
    }
    p.cpu_q_dtype = to_flash_dtype(q.scalar_type());
    if (!flash_cpu_fwd_reads_half(&p))
        return at::Tensor();
    *rng_state = draw_rng_state_cpu(dropout_p);
    set_dropout_params(&p, dropout_p, *rng_state);
    // out's strides: the kernel writes both at one element offset
    at::Tensor out_half = at::empty_strided(out.sizes(), out.strides(), out.options().dtype(q.scalar_type()));
    if (zero_rows)
        out_half.zero_();
    p.cpu_o_half = out_half.data_ptr();
    check_cpu_status(flash_fwd_cpu(&p), "forward");
    return out_half;
}

// The T5 table's gradient of a CPU backward (bwd's drel_bias): partial sums per (batch, head, key tile of
// the dK/dV pass; flash.h rel_bias_grad) that result() adds up to (nheads, num_buckets); empty when not asked.
struct RelBiasGrad {
    bool on;
    at::Tensor part;
    RelBiasGrad(const at::Tensor &q, int64_t batch, int64_t seqlen_k, const c10::optional<at::Tensor> &rel_bias,
                bool rel_bias_grad)
        : on(rel_bias_grad),
          part(at::zeros({on ? batch : 0, q.size(-2), (seqlen_k + FLASH_CPU_TILE_K - 1) / FLASH_CPU_TILE_K,
                          rel_bias ? rel_bias->size(1) : 0},
                         q.options().dtype(lse_dtype(q.scalar_type()))))
    {
    }
    void set(flash_params *p) const
    {
        if (!on)
            return;
        p->rel_bias_grad = part.data_ptr();
        p->rel_grad_tile = FLASH_CPU_TILE_K;
    }
    at::Tensor result() const { return on ? part.sum(at::IntArrayRef{0, 2}) : part.new_empty({0}); }
};

FwdOutputs dense_fwd_cpu(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, double softmax_scale,
                         bool causal, bool bottom_right, int64_t window_left, int64_t window_right, double softcap,
                         const Opt &alibi_slopes, const Opt &sink, const Opt &attn_mask, double dropout_p,
                         bool deterministic, const Opt &rel_bias, const Opt &rel_buckets)
{
    check_qkv(q, k, v);
    check_cpu_dtype(q);
    const Variants var = with_rel_bias(variants_of(causal, bottom_right, window_left, window_right, softcap,
                                                   alibi_slopes, sink, attn_mask, dropout_p, deterministic),
                                       rel_bias, rel_buckets);
    check_variants(var, q, k);
    if (is_half(q)) {
        const SourceDtype src(q);  // the AMX products of the fp32 kernels (flash_cpu.c)
        const c10::optional<at::Tensor> mask32 = mask_f32(attn_mask);
        if (!no_work(q) && k.size(1) > 0) {
            at::Tensor out = at::empty(out_sizes(q, v), q.options().dtype(at::kFloat));
            at::Tensor lse = at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(at::kFloat));
            Variants var32 = var;
            var32.attn_mask = mask32;
            VariantTensors keep;
            at::Tensor rng_state;
            const at::Tensor out_q = run_half_fwd([&](const at::Tensor &qq, const at::Tensor &rng) {
                return make_params(qq, k, v, out, lse, softmax_scale, var32, rng, &keep);
            }, q, k.scalar_type(), dropout_p, out, false, &rng_state);
            if (out_q.defined())
                return {out_q, lse, rng_state, out};
        }
        const at::Tensor q32 = f32(q);
        auto [out, lse, rng_state, _] = dense_fwd_cpu(q32, f32(k), f32(v), softmax_scale, causal, bottom_right,
                                                window_left, window_right, softcap, alibi_slopes, sink, mask32,
                                                dropout_p, deterministic, rel_bias, rel_buckets);
        return {out.to(q.scalar_type()), lse, rng_state, out};
    }
    at::Tensor rng_state = draw_rng_state_cpu(dropout_p);
    if (no_work(q) || k.size(1) == 0) {
        auto [out, lse] = fwd_without_keys(q, v, sink);
        return {out, lse, rng_state, no_out32(q)};
    }
    at::Tensor out = at::empty(out_sizes(q, v), q.options());
    at::Tensor lse = at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(lse_dtype(q.scalar_type())));
    VariantTensors keep;
    const flash_params p = make_params(q, k, v, out, lse, softmax_scale, var, rng_state, &keep);
    check_cpu_status(run_fwd_cpu(p), "forward");
    return {out, lse, rng_state, no_out32(q)};
}

BwdOutputs dense_bwd_cpu(
    const at::Tensor &dout_in, const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, const at::Tensor &out,
    const at::Tensor &lse_in, const at::Tensor &rng_state, double softmax_scale, bool causal, bool bottom_right,
    int64_t window_left, int64_t window_right, double softcap, const c10::optional<at::Tensor> &alibi_slopes,
    const c10::optional<at::Tensor> &sink, const c10::optional<at::Tensor> &attn_mask, double dropout_p,
    bool deterministic, bool mask_grad,
    const c10::optional<at::Tensor> &rel_bias, const c10::optional<at::Tensor> &rel_buckets, bool rel_bias_grad)
{
    check_qkv(q, k, v);
    check_cpu_dtype(q);
    check_bwd_inputs(dout_in, q, v, out, lse_in, true);
    check_rank_and_last_stride(out, "out");
    check_rng_state(rng_state);
    const Variants var = with_rel_bias(variants_of(causal, bottom_right, window_left, window_right, softcap,
                                                   alibi_slopes, sink, attn_mask, dropout_p, deterministic),
                                       rel_bias, rel_buckets);
    check_variants(var, q, k);
    TORCH_CHECK(!mask_grad || (attn_mask && attn_mask->scalar_type() != at::kBool),
                "flashattn_ext: mask_grad needs a floating attn_mask");
    TORCH_CHECK(!rel_bias_grad || rel_bias, "flashattn_ext: rel_bias_grad needs a rel_bias");
    if (is_half(q)) {
        const SourceDtype src(q);  // the AMX products of the fp32 kernels (flash_cpu.c)
        const at::Tensor q32 = f32(q), k32 = f32(k), v32 = f32(v);
        const c10::optional<at::Tensor> mask32 = mask_f32(attn_mask);
        const at::Tensor out32 = f32(out);  // fwd's out32, or the rounded out (see is_half)
        auto [dq, dk, dv, dmask, drel] = dense_bwd_cpu(f32(dout_in), q32, k32, v32, out32, lse_in, rng_state,
                                                       softmax_scale, causal, bottom_right, window_left, window_right,
                                                       softcap, alibi_slopes, sink, mask32, dropout_p, deterministic,
                                                       mask_grad, rel_bias, rel_buckets, rel_bias_grad);
        return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type()), dmask, drel};
    }
    at::Tensor dmask = make_dmask(q, k, mask_grad);
    RelBiasGrad rel(q, q.size(0), k.size(1), rel_bias, rel_bias_grad);
    if (no_work(q) || k.size(1) == 0)
        return {at::zeros(q.sizes(), q.options()), at::zeros(k.sizes(), k.options()), at::zeros(v.sizes(), v.options()),
                dmask, rel.result()};
    at::Tensor dq = at::empty(q.sizes(), q.options());
    at::Tensor dk = at::empty(k.sizes(), k.options());
    at::Tensor dv = at::empty(v.sizes(), v.options());
    const at::Tensor dout = dout_in.stride(3) == 1 ? dout_in : dout_in.contiguous();
    const at::Tensor lse = lse_in.contiguous();
    at::Tensor delta = at::empty(lse.sizes(), lse.options());
    VariantTensors keep;
    flash_params p = make_params(q, k, v, out, lse, softmax_scale, var, rng_state, &keep);
    set_bwd_params(&p, dout, dq, dk, dv, delta);
    if (mask_grad)
        p.dbias = dmask.data_ptr();
    rel.set(&p);
    check_cpu_status(run_bwd_cpu(p), "backward");
    return {dq, dk, dv, dmask, rel.result()};
}

FwdOutputs varlen_fwd_cpu(
    const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, const at::Tensor &cu_seqlens_q,
    const at::Tensor &cu_seqlens_k, const c10::optional<at::Tensor> &seqused_k, int64_t max_seqlen_q,
    int64_t max_seqlen_k, double softmax_scale, bool causal, int64_t window_left, int64_t window_right, double softcap,
    const c10::optional<at::Tensor> &alibi_slopes, const c10::optional<at::Tensor> &sink, double dropout_p,
    bool deterministic, const c10::optional<at::Tensor> &block_table,
    const c10::optional<at::Tensor> &rel_bias, const c10::optional<at::Tensor> &rel_buckets)
{
    const Varlen vl = varlen_of(cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, block_table);
    check_varlen_qkv(q, k, v, vl);
    check_cpu_dtype(q);
    const Variants var = with_rel_bias(variants_of(causal, true, window_left, window_right, softcap, alibi_slopes,
                                                   sink, c10::nullopt, dropout_p, deterministic),
                                       rel_bias, rel_buckets);
    check_variants(var, q, vl.batch(), max_seqlen_q, q.size(1), max_seqlen_k);
    if (is_half(q)) {
        const SourceDtype src(q);  // the AMX products of the fp32 kernels (flash_cpu.c)
        if (!varlen_fwd_no_work(q, vl, var)) {
            auto [out, lse] = varlen_fwd_outputs(q, v, at::kFloat);
            VariantTensors keep;
            at::Tensor rng_state;
            const at::Tensor out_q = run_half_fwd([&](const at::Tensor &qq, const at::Tensor &rng) {
                return make_varlen_params(qq, k, v, out, lse, vl, softmax_scale, var, rng, &keep);
            }, q, k.scalar_type(), dropout_p, out, true, &rng_state);
            if (out_q.defined())
                return {out_q, lse, rng_state, out};
        }
        const at::Tensor q32 = f32(q);
        auto [out, lse, rng_state, _] = varlen_fwd_cpu(q32, f32(k), f32(v), cu_seqlens_q, cu_seqlens_k,
                                                       seqused_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                                                       window_left, window_right, softcap, alibi_slopes, sink,
                                                       dropout_p, deterministic, block_table, rel_bias, rel_buckets);
        return {out.to(q.scalar_type()), lse, rng_state, out};
    }
    at::Tensor rng_state = draw_rng_state_cpu(dropout_p);
    auto [out, lse] = varlen_fwd_outputs(q, v);
    if (varlen_fwd_no_work(q, vl, var))
        return {out, lse, rng_state, no_out32(q)};
    VariantTensors keep;
    const flash_params p = make_varlen_params(q, k, v, out, lse, vl, softmax_scale, var, rng_state, &keep);
    check_cpu_status(run_fwd_cpu(p), "forward");
    return {out, lse, rng_state, no_out32(q)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> varlen_bwd_cpu(
    const at::Tensor &dout_in, const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, const at::Tensor &out,
    const at::Tensor &lse_in, const at::Tensor &rng_state, const at::Tensor &cu_seqlens_q,
    const at::Tensor &cu_seqlens_k, const c10::optional<at::Tensor> &seqused_k, int64_t max_seqlen_q,
    int64_t max_seqlen_k, double softmax_scale, bool causal, int64_t window_left, int64_t window_right, double softcap,
    const c10::optional<at::Tensor> &alibi_slopes, const c10::optional<at::Tensor> &sink, double dropout_p,
    bool deterministic,
    const c10::optional<at::Tensor> &rel_bias, const c10::optional<at::Tensor> &rel_buckets, bool rel_bias_grad)
{
    const Varlen vl = varlen_of(cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k);
    check_varlen_qkv(q, k, v, vl);
    check_cpu_dtype(q);
    check_varlen_bwd_inputs(dout_in, q, v, out, lse_in, true);
    check_rng_state(rng_state);
    const Variants var = with_rel_bias(variants_of(causal, true, window_left, window_right, softcap, alibi_slopes,
                                                   sink, c10::nullopt, dropout_p, deterministic),
                                       rel_bias, rel_buckets);
    check_variants(var, q, vl.batch(), max_seqlen_q, q.size(1), max_seqlen_k);
    TORCH_CHECK(!rel_bias_grad || rel_bias, "flashattn_ext: rel_bias_grad needs a rel_bias");
    if (is_half(q)) {
        const SourceDtype src(q);  // the AMX products of the fp32 kernels (flash_cpu.c)
        const at::Tensor q32 = f32(q), k32 = f32(k), v32 = f32(v);
        const at::Tensor out32 = f32(out);  // fwd's out32, or the rounded out (see is_half)
        auto [dq, dk, dv, drel] = varlen_bwd_cpu(f32(dout_in), q32, k32, v32, out32, lse_in, rng_state, cu_seqlens_q,
                                                 cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                                                 causal, window_left, window_right, softcap, alibi_slopes, sink,
                                                 dropout_p, deterministic, rel_bias, rel_buckets, rel_bias_grad);
        return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type()), drel};
    }
    at::Tensor dq = at::zeros(q.sizes(), q.options());
    at::Tensor dk = at::zeros(k.sizes(), k.options());
    at::Tensor dv = at::zeros(v.sizes(), v.options());
    RelBiasGrad rel(q, vl.batch(), max_seqlen_k, rel_bias, rel_bias_grad);
    if (varlen_bwd_no_work(q, k, vl))
        return {dq, dk, dv, rel.result()};
    const at::Tensor dout = dout_in.stride(2) == 1 ? dout_in : dout_in.contiguous();
    const at::Tensor lse = lse_in.contiguous();
    at::Tensor delta = at::empty(lse.sizes(), lse.options());
    VariantTensors keep;
    flash_params p = make_varlen_params(q, k, v, out, lse, vl, softmax_scale, var, rng_state, &keep);
    set_varlen_bwd_params(&p, dout, dq, dk, dv, delta);
    rel.set(&p);
    check_cpu_status(run_bwd_cpu(p), "backward");
    return {dq, dk, dv, rel.result()};
}

std::tuple<at::Tensor, at::Tensor> kvcache_fwd_cpu(
    const at::Tensor &q, const at::Tensor &k_cache, const at::Tensor &v_cache,
    const c10::optional<at::Tensor> &cache_seqlens, const c10::optional<at::Tensor> &cache_batch_idx,
    const c10::optional<at::Tensor> &cache_leftpad, const c10::optional<at::Tensor> &block_table,
    double softmax_scale, bool causal, int64_t window_left, int64_t window_right, double softcap,
    const c10::optional<at::Tensor> &alibi_slopes, const c10::optional<at::Tensor> &sink, int64_t num_splits)
{
    const KvCache kv = kvcache_of(cache_seqlens, cache_batch_idx, cache_leftpad, block_table);
    check_kvcache_inputs(q, k_cache, v_cache, kv);
    check_num_splits(num_splits);  // the CPU kernel does not split (the result does not depend on it)
    check_cpu_dtype(q);
    const Variants var = variants_of(causal, true, window_left, window_right, softcap, alibi_slopes, sink,
                                     c10::nullopt, 0.0, false);
    check_variants(var, q, q.size(0), q.size(1), q.size(2), kv.seqlen_k(k_cache));
    if (is_half(q)) {
        const SourceDtype src(q);  // the AMX products of the fp32 kernels (flash_cpu.c)
        if (!no_work(q) && kv.seqlen_k(k_cache) > 0) {
            at::Tensor out = at::empty(out_sizes(q, v_cache), q.options().dtype(at::kFloat));
            at::Tensor lse = at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(at::kFloat));
            VariantTensors keep;
            at::Tensor rng_state;
            const at::Tensor out_q = run_half_fwd([&](const at::Tensor &qq, const at::Tensor &) {
                return make_kvcache_params(qq, k_cache, v_cache, out, lse, kv, softmax_scale, var, &keep);
            }, q, k_cache.scalar_type(), 0.0, out, false, &rng_state);
            if (out_q.defined())
                return {out_q, lse};
        }
        const at::Tensor q32 = f32(q);
        auto [out, lse] = kvcache_fwd_cpu(q32, f32(k_cache), f32(v_cache), cache_seqlens, cache_batch_idx,
                                          cache_leftpad, block_table, softmax_scale, causal, window_left,
                                          window_right, softcap, alibi_slopes, sink, num_splits);
        return {out.to(q.scalar_type()), lse};
    }
    if (no_work(q) || kv.seqlen_k(k_cache) == 0)
        return fwd_without_keys(q, v_cache, sink);
    at::Tensor out = at::empty(out_sizes(q, v_cache), q.options());
    at::Tensor lse = at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(lse_dtype(q.scalar_type())));
    VariantTensors keep;
    const flash_params p = make_kvcache_params(q, k_cache, v_cache, out, lse, kv, softmax_scale, var, &keep);
    check_cpu_status(run_fwd_cpu(p), "forward");
    return {out, lse};
}

void kv_append_cpu(const at::Tensor &k_cache, const at::Tensor &v_cache, const at::Tensor &k, const at::Tensor &v,
                   const at::Tensor &cache_seqlens, const c10::optional<at::Tensor> &cache_batch_idx,
                   const c10::optional<at::Tensor> &block_table)
{
    const KvAppend a = kv_append_of(k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table);
    if (!a.no_work)
        flash_kv_append_cpu(&a.p);
}

at::Tensor dropout_mask_cpu(const at::Tensor &q, const at::Tensor &rng_state, int64_t seqlen_k, double dropout_p)
{
    const flash_params p = dropout_mask_params(q, rng_state, seqlen_k, dropout_p);
    at::Tensor keep = at::empty({p.b, p.h, p.sq, p.sk}, q.options().dtype(at::kBool));
    if (keep.numel() > 0)
        check_cpu_status(flash_dropout_mask_cpu(&p, reinterpret_cast<uint8_t *>(keep.data_ptr<bool>())),
                         "dropout mask");
    return keep;
}

}  // namespace

TORCH_LIBRARY(flashattn_ext, m)
{
    // The two attention ops (ops.h fwd_op / bwd_op): a dense batch by default; cu_seqlens_q and cu_seqlens_k
    // make a variable-length batch (with seqused_k, max_seqlen_*, and a paged k / v through block_table);
    // cache_seqlens, cache_batch_idx, cache_leftpad, num_splits or a block_table alone make a KV-cache call
    // (k and v the caches; no backward). max_seqlen_* are SymInts: under torch.compile they stay symbolic (one
    // graph for all values; the kernels take them as int64_t, the fake kernels never read them). out32: the
    // float32 out that out was rounded from (fp16 / bf16 on the CPU, and with rel_bias on CUDA; empty elsewhere),
    // saved by fwd's autograd for the backward's delta (ops.py _rounds_fp32).
    m.def("fwd(Tensor q, Tensor k, Tensor v, float softmax_scale, bool causal=False, bool bottom_right=True, "
          "int window_left=-1, int window_right=-1, float softcap=0.0, Tensor? alibi_slopes=None, "
          "Tensor? sink=None, Tensor? attn_mask=None, float dropout_p=0.0, bool deterministic=False, "
          "Tensor? rel_bias=None, Tensor? rel_buckets=None, Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, "
          "Tensor? seqused_k=None, SymInt max_seqlen_q=0, SymInt max_seqlen_k=0, Tensor? block_table=None, "
          "Tensor? cache_seqlens=None, Tensor? cache_batch_idx=None, Tensor? cache_leftpad=None, "
          "int num_splits=0) -> (Tensor out, Tensor lse, Tensor rng_state, Tensor out32)");
    m.def("bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor rng_state, "
          "float softmax_scale, bool causal=False, bool bottom_right=True, int window_left=-1, int window_right=-1, "
          "float softcap=0.0, Tensor? alibi_slopes=None, Tensor? sink=None, Tensor? attn_mask=None, "
          "float dropout_p=0.0, bool deterministic=False, bool mask_grad=False, Tensor? rel_bias=None, "
          "Tensor? rel_buckets=None, bool rel_bias_grad=False, Tensor? cu_seqlens_q=None, "
          "Tensor? cu_seqlens_k=None, Tensor? seqused_k=None, SymInt max_seqlen_q=0, SymInt max_seqlen_k=0) -> "
          "(Tensor dq, Tensor dk, Tensor dv, Tensor dmask, Tensor drel_bias)");
    m.def("dropout_mask(Tensor q, Tensor rng_state, int seqlen_k, float dropout_p) -> Tensor");
    m.def("kv_append(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k, Tensor v, Tensor cache_seqlens, "
          "Tensor? cache_batch_idx, Tensor? block_table) -> ()");
}

TORCH_LIBRARY_IMPL(flashattn_ext, CPU, m)
{
    m.impl("fwd", &fwd_op<&dense_fwd_cpu, &varlen_fwd_cpu, &kvcache_fwd_cpu>);
    m.impl("bwd", &bwd_op<&dense_bwd_cpu, &varlen_bwd_cpu>);
    m.impl("dropout_mask", &dropout_mask_cpu);
    m.impl("kv_append", &kv_append_cpu);
}

}  // namespace flashattn_ext

namespace {

// flashattn_ext._C.limits(): what the kernels of this build take, read by the Python side (_core.py,
// integrations/torch_registry.py) instead of restated there. page_multiple: FLASH_PAGE_MULTIPLE;
// max_grid_yz: the most batch entries, heads (and varlen sequences) a CUDA call takes; cuda_max_head_dim (fp16 /
// bf16), cuda_max_head_dim_fwd (the fp16 / bf16 forward without a paged KV cache), cuda_max_head_dim_simple (fp32 /
// fp64);
// dtypes: per device type, torch's names; cuda_min_capability: (major, minor) of the oldest GPU (mma.sync);
// cpu_amx: the backend of the fp16 / bf16 CPU calls' packed bf16 products (cpu/amx.h): "tiles" (AMX: fp16 / bf16,
// every pass), "dp" (AVX512-BF16 dot products: the bf16 forward) or None (FLASHATTN_EXT_CPU_AMX at import: "0"
// None, "dp" the dot products where the CPU has them); cpu_amx_dp: whether the CPU has the dot products; cuda_smem: the shared memory per block the fp16/bf16 forward (any variant, not paged) and
// backward need, as ascending steps ((largest head dim, bytes), ...) over head dims 1 .. cuda_max_head_dim, empty
// in a build without CUDA kernels.
PyObject *limits(PyObject *, PyObject *)
{
    std::vector<std::pair<int64_t, size_t>> steps;
#ifdef FLASHATTN_EXT_CUDA
    for (int64_t d = 1; d <= FLASH_CUDA_MAX_HEAD_DIM; ++d) {
        flash_params p{};
        p.d = d;
        size_t need = flash_bwd_smem_needed(&p);
        for (int hook = 0; hook <= 1; ++hook) {
            p.has_hook = hook;
            need = std::max(need, flash_fwd_smem_needed(&p));
        }
        if (steps.empty() || steps.back().second != need)
            steps.emplace_back(d, need);
        else
            steps.back().first = d;
    }
#endif
    PyObject *smem = PyTuple_New((Py_ssize_t)steps.size());
    for (size_t i = 0; smem != nullptr && i < steps.size(); ++i) {
        PyObject *step = Py_BuildValue("(Ln)", (long long)steps[i].first, (Py_ssize_t)steps[i].second);
        if (step == nullptr) {
            Py_DECREF(smem);
            return nullptr;
        }
        PyTuple_SetItem(smem, (Py_ssize_t)i, step);
    }
    const int amx = flash_amx_usable();
    const char *backend = amx == FLASH_AMX_TILES ? "tiles" : amx == FLASH_AMX_DP ? "dp" : nullptr;
    return Py_BuildValue("{s:i,s:i,s:i,s:i,s:i,s:{s:(ssss),s:(ssss)},s:(ii),s:N,s:z,s:O}", "page_multiple",
                         FLASH_PAGE_MULTIPLE, "max_grid_yz", FLASH_MAX_GRID_YZ, "cuda_max_head_dim",
                         FLASH_CUDA_MAX_HEAD_DIM, "cuda_max_head_dim_fwd", FLASH_CUDA_FWD_MAX_HEAD_DIM,
                         "cuda_max_head_dim_simple", FLASH_CUDA_SIMPLE_MAX_HEAD_DIM, "dtypes",
                         "cpu", "float16", "bfloat16", "float32", "float64", "cuda", "float16", "bfloat16", "float32",
                         "float64", "cuda_min_capability", 8, 0, "cuda_smem", smem, "cpu_amx", backend, "cpu_amx_dp",
                         (flash_amx_backends() & FLASH_AMX_DP) ? Py_True : Py_False);
}

// flashattn_ext._C.last_cuda_kernels(): (forward, backward), the kernel files that the process's last CUDA forward
// and backward launched (csrc/cuda/launch.h flash_last_kernels; None: none yet or a build without CUDA kernels).
PyObject *last_cuda_kernels(PyObject *, PyObject *)
{
    const char *fwd = nullptr, *bwd = nullptr;
#ifdef FLASHATTN_EXT_CUDA
    flash_last_kernels(&fwd, &bwd);
#endif
    return Py_BuildValue("(zz)", fwd, bwd);
}

PyMethodDef module_methods[] = {
    {"limits", limits, METH_NOARGS, "What the kernels of this build take (csrc/ops.cpp)."},
    {"last_cuda_kernels", last_cuda_kernels, METH_NOARGS,
     "The kernel files of the process's last CUDA forward and backward (csrc/ops.cpp)."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

// `import flashattn_ext._C` loads this library, whose static initializers register the ops above.
extern "C" PyObject *PyInit__C(void)
{
    static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, module_methods};
    return PyModule_Create(&module_def);
}
