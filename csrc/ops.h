// ops.h: what the two libtorch translation units (ops.cpp: schema + CPU, ops_cuda.cpp: CUDA) share:
// the input checks and the one function that fills flash_params from tensors (dense batches; the
// varlen and KV-cache ops build theirs through it too).
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "flash.h"
#include "kv_append.h"

namespace flashattn_ext {

// Integers and shapes for error messages, formatted without iostreams: an extension built with a
// newer g++ than the libstdc++ loaded at run time can crash in ostream's numeric formatting (seen
// on the lent H200 machine), while std::to_string is header-only.
inline std::string num(int64_t x)
{
    return std::to_string(x);
}

inline std::string shape(at::IntArrayRef sizes)
{
    std::string s = "(";
    for (size_t i = 0; i < sizes.size(); ++i)
        s += (i ? ", " : "") + std::to_string(sizes[i]);
    return s + ")";
}

// The shape of out (and dout) for q and v: q's sizes with v's head dim (its last dimension), which may differ
// from that of q and k.
std::vector<int64_t> out_sizes(const at::Tensor &q, const at::Tensor &v);

// Checks q, k, v (ranks, shapes, dtypes, devices, last stride) with messages naming the argument; v's head dim
// is its own.
void check_qkv(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v);

// Checks the extra backward inputs (dout, out of shape out_sizes(q, v); lse) against q and v; out32_ok: out may
// be the forward's out32 (float32) for fp16 / bf16 q (calls whose forward returns one).
void check_bwd_inputs(const at::Tensor &dout, const at::Tensor &q, const at::Tensor &v, const at::Tensor &out,
                      const at::Tensor &lse, bool out32_ok);

// The out32 output of a forward (fwd, varlen_fwd) whose out is not rounded from fp32: an empty fp32 tensor
// (every call but fp16 / bf16 ones on the CPU, or with T5's rel_bias on CUDA, whose forwards run on float32 copies
// and return their fp32 out for the backward's delta).
at::Tensor no_out32(const at::Tensor &q);

// dtype of lse / delta for inputs of dtype t: fp64 for fp64 inputs, fp32 otherwise.
at::ScalarType lse_dtype(at::ScalarType t);

// The attention variants of one call, as the ops receive them (schema in ops.cpp).
struct Variants {
    bool causal = false;
    bool bottom_right = true;
    int64_t window_left = -1;  // -1: unbounded
    int64_t window_right = -1;
    double softcap = 0.0;
    c10::optional<at::Tensor> alibi_slopes;  // (h,) or (b, h) fp32
    c10::optional<at::Tensor> sink;          // (h,) in the lse dtype
    c10::optional<at::Tensor> attn_mask;     // (b, h, sq, sk), bool or the dtype of q, any strides
    double dropout_p = 0.0;
    bool deterministic = false;
    c10::optional<at::Tensor> rel_bias;     // (h, num_buckets) in the lse dtype: T5's table (fp16/bf16 CUDA: fp32 kernels)
    c10::optional<at::Tensor> rel_buckets;  // int32 (2 R + 1,): the bucket of relative position -R .. R
};

Variants variants_of(bool causal, bool bottom_right, int64_t window_left, int64_t window_right, double softcap,
                     const c10::optional<at::Tensor> &alibi_slopes, const c10::optional<at::Tensor> &sink,
                     const c10::optional<at::Tensor> &attn_mask, double dropout_p, bool deterministic);

// var with T5's relative position bias (both or neither given; checked by check_variants).
Variants with_rel_bias(Variants var, const c10::optional<at::Tensor> &rel_bias,
                       const c10::optional<at::Tensor> &rel_buckets);

// Raises unless dropout_p is in [0, 1] (NaN fails the comparisons).
void check_dropout_p(double dropout_p);

// Dropout fields of p from dropout_p and rng_state (mask.h flash_dropout_set: a 32-bit threshold
// round(p 2^32), the scale 1 / (1 - p) of p as given).
void set_dropout_params(flash_params *p, double dropout_p, const at::Tensor &rng_state);

// Checked params (sizes and dropout only) of the dropout_mask op for q (batch, seqlen_q, nheads, headdim).
flash_params dropout_mask_params(const at::Tensor &q, const at::Tensor &rng_state, int64_t seqlen_k, double dropout_p);

// Checks the variant arguments against q (batch, seqlen_q, nheads, headdim) and k, with messages naming
// the argument.
void check_variants(const Variants &var, const at::Tensor &q, const at::Tensor &k);

// The same checks against explicit sizes (varlen: batch = number of sequences; never an attn_mask).
void check_variants(const Variants &var, const at::Tensor &q, int64_t batch, int64_t seqlen_q, int64_t nheads,
                    int64_t seqlen_k);

// The tensors that params made by make_params point to beyond the call's inputs (kept alive by the
// caller until the kernels are done): contiguous alibi slopes, the mask's block flags and (KV cache, paged
// varlen) a contiguous block_table.
struct VariantTensors {
    at::Tensor alibi_slopes, mask_blocks, block_table, rel_bias, rel_buckets;
};

// Points p's mask_blocks at flags, the attn_mask's block flags (mask.h flash_mask_flag_dims, contiguous),
// expanded to the mask's sizes and held in keep. make_params does this for a CPU mask; for a CUDA mask the
// CUDA ops do, after computing the flags on the device (the kernels refuse a mask without its flags).
void set_mask_blocks(flash_params *p, const at::Tensor &mask, const at::Tensor &flags, VariantTensors *keep);

// Zero-filled params with the forward tensors, sizes, scale, mask geometry and variants set (a CPU
// attn_mask's block flags too). The dropout seed and offset are taken from rng_state (int64 (2,) on the
// CPU); the binding draws them.
flash_params make_params(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, const at::Tensor &out,
                         const at::Tensor &lse, double softmax_scale, const Variants &var,
                         const at::Tensor &rng_state, VariantTensors *keep);

// rng_state of a call: int64 (2,) on the CPU holding (seed, offset); each backend draws them from
// torch's default generator of its device when dropout_p > 0 (zeros otherwise).
at::Tensor rng_state_from(uint64_t seed, uint64_t offset);

// Checks an rng_state argument (int64 (2,) on the CPU).
void check_rng_state(const at::Tensor &rng_state);

// Adds the backward tensors to params made by make_params.
void set_bwd_params(flash_params *p, const at::Tensor &dout, const at::Tensor &dq, const at::Tensor &dk,
                    const at::Tensor &dv, const at::Tensor &delta);

// A variable-length batch as the varlen ops receive it (schema in ops.cpp): q (total_q, nheads, headdim),
// k / v (total_k, nheads_kv, headdim / headdim_v); sequence s owns rows [cu_seqlens_q[s], cu_seqlens_q[s + 1]) of q
// and [cu_seqlens_k[s], cu_seqlens_k[s + 1]) of k, v, of which it uses the first seqused_k[s] keys. With
// a block_table (varlen_fwd only) k / v are a paged cache (num_pages, page_size, nheads_kv, headdim) and
// sequence s's keys are its first cu_seqlens_k[s + 1] - cu_seqlens_k[s] rows through table row s (row r:
// row r % page_size of page block_table[s, r / page_size]), again limited by seqused_k[s].
struct Varlen {
    at::Tensor cu_seqlens_q, cu_seqlens_k;   // int32 (batch + 1,) on q's device
    c10::optional<at::Tensor> seqused_k;     // int32 (batch,) on q's device
    c10::optional<at::Tensor> block_table;   // int32 (batch, max_pages) on q's device, or None: packed k / v
    int64_t max_seqlen_q = 0, max_seqlen_k = 0;
    int64_t batch() const { return cu_seqlens_q.size(0) - 1; }
};

Varlen varlen_of(const at::Tensor &cu_seqlens_q, const at::Tensor &cu_seqlens_k,
                 const c10::optional<at::Tensor> &seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                 const c10::optional<at::Tensor> &block_table = c10::nullopt);

// Checks q, k, v of a varlen call (ranks, shapes, dtypes, devices, last stride), the index tensors and the
// block_table (int32 (batch, max_pages >= 1), page size a positive multiple of FLASH_PAGE_MULTIPLE, at least
// one page), with messages naming the argument; reads no tensor contents (no device synchronization).
void check_varlen_qkv(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, const Varlen &vl);

// Checks the extra varlen backward inputs (dout, out of shape out_sizes(q, v); lse (nheads, total_q)) against
// q and v.
void check_varlen_bwd_inputs(const at::Tensor &dout, const at::Tensor &q, const at::Tensor &v, const at::Tensor &out,
                             const at::Tensor &lse, bool out32_ok);

// Params of a varlen call, made by make_params on views with a leading batch of 1 and then turned into
// the packed batch of flash.h: b = number of sequences, batch strides 0, sq / sk the max lengths, the
// index pointers, total_q / total_k, lse (nheads, total_q). out is (total_q, nheads, headdim_v). With a
// block_table: k / v as they are (batch strides = page strides), k_batches = pages, the table (a
// contiguous copy in keep when it is not contiguous already), its stride and the page size.
flash_params make_varlen_params(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, const at::Tensor &out,
                                const at::Tensor &lse, const Varlen &vl, double softmax_scale, const Variants &var,
                                const at::Tensor &rng_state, VariantTensors *keep);

// Adds the backward tensors (packed, 3-D) to params made by make_varlen_params; delta is (nheads, total_q).
void set_varlen_bwd_params(flash_params *p, const at::Tensor &dout, const at::Tensor &dq, const at::Tensor &dk,
                           const at::Tensor &dv, const at::Tensor &delta);

// Outputs of a varlen forward before the kernels run: out (total_q, nheads, headdim_v) zero (rows of no
// sequence keep it) in out_t (q's dtype, or float32 where the CPU runs fp16 / bf16 inputs), lse (nheads, total_q)
// -inf.
std::tuple<at::Tensor, at::Tensor> varlen_fwd_outputs(const at::Tensor &q, const at::Tensor &v, at::ScalarType out_t);
inline std::tuple<at::Tensor, at::Tensor> varlen_fwd_outputs(const at::Tensor &q, const at::Tensor &v)
{
    return varlen_fwd_outputs(q, v, q.scalar_type());
}

// True when a varlen forward has nothing to compute beyond varlen_fwd_outputs: no query rows, heads or
// head dim, no sequence rows (max_seqlen_q 0), or no keys anywhere and no sink.
bool varlen_fwd_no_work(const at::Tensor &q, const Varlen &vl, const Variants &var);

// True when every gradient of a varlen backward is zero (no rows, heads, head dim or keys).
bool varlen_bwd_no_work(const at::Tensor &q, const at::Tensor &k, const Varlen &vl);

// A KV-cache call as kvcache_fwd receives it (schema in ops.cpp): q (batch, seqlen_q, nheads, headdim);
// k_cache / v_cache (batch_cache, seqlen_cache, nheads_kv, headdim / headdim_v), or paged with a block_table
// (num_pages, page_size, nheads_kv, headdim). Sequence b's keys are cache rows [cache_leftpad[b],
// cache_seqlens[b]) (counted from the cache's row 0, left padding included) of cache batch
// cache_batch_idx[b], or of its pages block_table[b, row / page_size]. Contents are never read on the
// host; the kernels clamp them (mask.h flash_seq_of, flash_key_offset).
struct KvCache {
    c10::optional<at::Tensor> cache_seqlens;    // int32 (batch,) or None: every row of the cache
    c10::optional<at::Tensor> cache_batch_idx;  // int32 (batch,) or None: batch b reads cache batch b
    c10::optional<at::Tensor> cache_leftpad;    // int32 (batch,) or None: from row 0
    c10::optional<at::Tensor> block_table;      // int32 (batch, max_pages) or None: a dense cache
    // Rows of the cache a sequence can reach: seqlen_cache, or max_pages * page_size when paged.
    int64_t seqlen_k(const at::Tensor &k_cache) const;
};

KvCache kvcache_of(const c10::optional<at::Tensor> &cache_seqlens, const c10::optional<at::Tensor> &cache_batch_idx,
                   const c10::optional<at::Tensor> &cache_leftpad, const c10::optional<at::Tensor> &block_table);

// Checks q, k_cache, v_cache and the index tensors of a KV-cache call (ranks, shapes, dtypes, devices, last
// stride, page size a multiple of FLASH_PAGE_MULTIPLE, no cache_batch_idx with a block_table) with messages
// naming the argument; reads no tensor contents (no device synchronization).
void check_kvcache_inputs(const at::Tensor &q, const at::Tensor &k_cache, const at::Tensor &v_cache,
                          const KvCache &kv);

// num_splits of a KV-cache call (flash_attn_with_kvcache): 0 (chosen by the kernels) or a positive count.
void check_num_splits(int64_t num_splits);

// Params of a KV-cache call: make_params on (q, k_cache, v_cache), then sk = kv.seqlen_k, seqused_k =
// cache_seqlens, k_batch_idx, k_leftpad, k_batches (cache batches or pages) and the block_table (a
// contiguous copy in keep when it is not contiguous already). out (batch, seqlen_q, nheads, headdim_v), lse
// (batch, nheads, seqlen_q).
flash_params make_kvcache_params(const at::Tensor &q, const at::Tensor &k_cache, const at::Tensor &v_cache,
                                 const at::Tensor &out, const at::Tensor &lse, const KvCache &kv,
                                 double softmax_scale, const Variants &var, VariantTensors *keep);

// An append of kv_append (schema in ops.cpp): its params (kv_append.h) and the tensors they point to beyond the
// caches: k / v (contiguous copies when their last stride is not 1), cache_seqlens / cache_batch_idx (contiguous).
struct KvAppend {
    flash_kv_append_params p;
    at::Tensor k, v, cache_seqlens, cache_batch_idx;
    bool no_work;  // nothing to write: no new rows or heads, or no cache rows, batches or pages
};

// Checks the arguments of kv_append (ranks, shapes, dtypes, devices, the caches' last stride, the block_table
// and page size as kvcache_fwd's) with messages naming the argument and fills its KvAppend; reads no tensor
// contents (no device synchronization).
KvAppend kv_append_of(const at::Tensor &k_cache, const at::Tensor &v_cache, const at::Tensor &k, const at::Tensor &v,
                      const at::Tensor &cache_seqlens, const c10::optional<at::Tensor> &cache_batch_idx,
                      const c10::optional<at::Tensor> &block_table);

// True when there is nothing to compute (an empty batch, no queries or no heads); a forward with
// seqlen_k == 0 has work to do: every row sees no key (out = 0, lse = -inf).
bool no_work(const at::Tensor &q);

// Result of a forward where no query sees any key: out = 0, lse = -inf (the sink with sinks).
std::tuple<at::Tensor, at::Tensor> fwd_without_keys(const at::Tensor &q, const at::Tensor &v,
                                                    const c10::optional<at::Tensor> &sink);

// Whether var has a score hook (softcap, ALiBi, T5's table, an attn_mask, dropout): flash.h has_hook, the kernels'
// HOOK variants.
bool has_score_hook(const Variants &var);

// dmask output of bwd: (b, h, sq, sk) in the lse dtype when mask_grad, else an empty (0,) tensor.
at::Tensor make_dmask(const at::Tensor &q, const at::Tensor &k, bool mask_grad);

// t in float32; a float attn_mask in float32 without materialising its broadcast (stride 0) dimensions (a bool
// mask as it is): the float32 calls that compute fp16 / bf16 inputs (the CPU; CUDA where no tensor-core tile fits).
at::Tensor f32(const at::Tensor &t);
c10::optional<at::Tensor> mask_f32(const c10::optional<at::Tensor> &mask);

// ---- The two attention ops (schemas in ops.cpp): one forward, one backward, whose optional arguments select
// the call: a dense batch; a variable-length batch (cu_seqlens_q and cu_seqlens_k; seqused_k, max_seqlen_*, and
// a paged k / v with block_table); a KV cache (any of cache_seqlens, cache_batch_idx, cache_leftpad, num_splits,
// or a block_table without cu_seqlens). Each backend implements the three calls (CPU: ops.cpp, CUDA:
// ops_cuda.cpp) and registers fwd_op / bwd_op over them, so that the routing and its argument checks are one.

using Opt = c10::optional<at::Tensor>;
using FwdOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;  // out, lse, rng_state, out32
using BwdOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;  // dq dk dv dmask drel

enum class CallKind { Dense, Varlen, Cache };

// The call of a fwd, from its optional arguments; checks that they go together (messages naming them).
CallKind fwd_call_kind(const Opt &cu_seqlens_q, const Opt &cu_seqlens_k, const Opt &seqused_k, int64_t max_seqlen_q,
                       int64_t max_seqlen_k, const Opt &block_table, const Opt &cache_seqlens,
                       const Opt &cache_batch_idx, const Opt &cache_leftpad, int64_t num_splits, bool bottom_right,
                       const Opt &attn_mask, double dropout_p, const Opt &rel_bias);

// The call of a bwd (dense or varlen; a KV cache has no backward), checked as fwd_call_kind.
CallKind bwd_call_kind(const Opt &cu_seqlens_q, const Opt &cu_seqlens_k, const Opt &seqused_k, int64_t max_seqlen_q,
                       int64_t max_seqlen_k, bool bottom_right, const Opt &attn_mask, bool mask_grad);

// An empty output tensor of q's device in the lse dtype (bwd's dmask without mask_grad).
at::Tensor empty_lse_dtype(const at::Tensor &q);

template <auto Dense, auto Varlen, auto Cache>
FwdOutputs fwd_op(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, double softmax_scale, bool causal,
                  bool bottom_right, int64_t window_left, int64_t window_right, double softcap,
                  const Opt &alibi_slopes, const Opt &sink, const Opt &attn_mask, double dropout_p, bool deterministic,
                  const Opt &rel_bias, const Opt &rel_buckets, const Opt &cu_seqlens_q, const Opt &cu_seqlens_k,
                  const Opt &seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k, const Opt &block_table,
                  const Opt &cache_seqlens, const Opt &cache_batch_idx, const Opt &cache_leftpad, int64_t num_splits)
{
    switch (fwd_call_kind(cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, block_table,
                          cache_seqlens, cache_batch_idx, cache_leftpad, num_splits, bottom_right, attn_mask,
                          dropout_p, rel_bias)) {
    case CallKind::Varlen:
        return Varlen(q, k, v, *cu_seqlens_q, *cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                      causal, window_left, window_right, softcap, alibi_slopes, sink, dropout_p, deterministic,
                      block_table, rel_bias, rel_buckets);
    case CallKind::Cache: {
        auto [out, lse] = Cache(q, k, v, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, softmax_scale,
                                causal, window_left, window_right, softcap, alibi_slopes, sink, num_splits);
        return {out, lse, rng_state_from(0, 0), no_out32(q)};
    }
    case CallKind::Dense:
        break;
    }
    return Dense(q, k, v, softmax_scale, causal, bottom_right, window_left, window_right, softcap, alibi_slopes, sink,
                 attn_mask, dropout_p, deterministic, rel_bias, rel_buckets);
}

template <auto Dense, auto Varlen>
BwdOutputs bwd_op(const at::Tensor &dout, const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                  const at::Tensor &out, const at::Tensor &lse, const at::Tensor &rng_state, double softmax_scale,
                  bool causal, bool bottom_right, int64_t window_left, int64_t window_right, double softcap,
                  const Opt &alibi_slopes, const Opt &sink, const Opt &attn_mask, double dropout_p, bool deterministic,
                  bool mask_grad, const Opt &rel_bias, const Opt &rel_buckets, bool rel_bias_grad,
                  const Opt &cu_seqlens_q, const Opt &cu_seqlens_k, const Opt &seqused_k, int64_t max_seqlen_q,
                  int64_t max_seqlen_k)
{
    if (bwd_call_kind(cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, bottom_right, attn_mask,
                      mask_grad) == CallKind::Varlen) {
        auto [dq, dk, dv, drel] = Varlen(dout, q, k, v, out, lse, rng_state, *cu_seqlens_q, *cu_seqlens_k, seqused_k,
                                         max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right,
                                         softcap, alibi_slopes, sink, dropout_p, deterministic, rel_bias, rel_buckets,
                                         rel_bias_grad);
        return {dq, dk, dv, empty_lse_dtype(q), drel};
    }
    return Dense(dout, q, k, v, out, lse, rng_state, softmax_scale, causal, bottom_right, window_left, window_right,
                 softcap, alibi_slopes, sink, attn_mask, dropout_p, deterministic, mask_grad, rel_bias, rel_buckets,
                 rel_bias_grad);
}

}  // namespace flashattn_ext
