// ops_cuda.cpp: the CUDA backend of the ops declared in ops.cpp. Checks what only the GPU kernels
// need, fills the params (ops.h), allocates outputs and workspaces through torch's caching
// allocator, and calls the plain-C launchers of csrc/cuda/launch.h on torch's current stream under
// the tensors' device guard. No host synchronization.
//
// fp16/bf16 kernels load 16-byte vectors: their inputs need a head dim that is a multiple of 8,
// strides that are multiples of 8 elements and 16-byte aligned data. The kernels also take one head dim
// for q, k and v (flash.h: d_v == d): v with a head dim of its own (headdim_v != headdim) is served by
// zero-padding the smaller of q / k and v to the larger (kernel_head_dims, the one place that decides it).
// Inputs that are not so are padded (head dim) or copied here, the only copies this backend makes (dense
// 4-D, varlen 3-D and KV-cache tensors alike: the head dim is the last dimension). Varlen outputs and the
// workspaces that kernels write only in part (rows of no sequence, keys past seqused_k) are zero-filled.
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <climits>
#include <mutex>
#include <vector>

#include "constants.h"
#include "cuda/launch.h"
#include "mask.h"
#include "ops.h"

namespace flashattn_ext {

namespace {

constexpr int64_t kMaxHeadDim = FLASH_CUDA_MAX_HEAD_DIM;              // fp16 / bf16
constexpr int64_t kMaxHeadDimSimple = FLASH_CUDA_SIMPLE_MAX_HEAD_DIM; // fp32 / fp64
constexpr int64_t kMaxHeadDimFwd = FLASH_CUDA_FWD_MAX_HEAD_DIM;       // fp16 / bf16 forward, not paged
constexpr int64_t kMaxHeadDimBwd = FLASH_CUDA_BWD_MAX_HEAD_DIM;       // fp16 / bf16 backward, not deterministic
// Philox offset advance per call: every call's draws are keyed by distinct (offset, ...) counters.
constexpr uint64_t kPhiloxOffsetStep = 4;
constexpr int64_t kVecElems = 8;      // 16-byte vector of fp16/bf16 elements
constexpr int64_t kVecBytes = 16;

bool is_half(const at::Tensor &t)
{
    return t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16;
}

// batch: the number of sequences; seqlen_q / seqlen_k: the (max) lengths the grid covers; vn: v's name; cache: a KV
// cache or a paged k / v (fp16 / bf16 head dims up to kMaxHeadDim there, elsewhere kMaxHeadDimFwd: the forward's
// tensor-core kernels, the backward's where they fit, else the fp32 kernels, half_on_fp32).
void check_cuda_sizes(const at::Tensor &q, const at::Tensor &v, int64_t batch, int64_t nheads, int64_t seqlen_q,
                      int64_t seqlen_k, const char *vn = "v", bool cache = false)
{
    const auto t = q.scalar_type();
    TORCH_CHECK(t == at::kHalf || t == at::kBFloat16 || t == at::kFloat || t == at::kDouble,
                "flashattn_ext: on CUDA, q, k and v must be float16, bfloat16, float32 or float64, got ", t);
    const int64_t top = is_half(q) ? (cache ? kMaxHeadDim : kMaxHeadDimFwd) : kMaxHeadDimSimple;
    const char *kind = !is_half(q) ? "float32 / float64"
                       : cache     ? "float16 / bfloat16 with a KV cache or a paged k / v"
                                   : "float16 / bfloat16";
    const std::string cache_note =
        is_half(q) && cache ? " (without one up to " + num(kMaxHeadDimFwd) + ")" : std::string();
    TORCH_CHECK(q.size(-1) <= top, "flashattn_ext: on CUDA, the head dim (last dimension) of q and k must be at most ",
                num(top), " for ", kind, cache_note, ", got ", num(q.size(-1)), " (the CPU takes any head dim)");
    TORCH_CHECK(v.size(-1) <= top, "flashattn_ext: on CUDA, the head dim (last dimension) of ", vn, " must be at most ",
                num(top), " for ", kind, cache_note, ", got ", num(v.size(-1)), " (the CPU takes any head dim)");
    TORCH_CHECK(batch <= FLASH_MAX_GRID_YZ, "flashattn_ext: on CUDA, the batch size must be at most ",
                num(FLASH_MAX_GRID_YZ), ", got ", num(batch));
    TORCH_CHECK(nheads <= FLASH_MAX_GRID_YZ, "flashattn_ext: on CUDA, nheads of q must be at most ",
                num(FLASH_MAX_GRID_YZ), ", got ", num(nheads));
    TORCH_CHECK(seqlen_q <= INT_MAX && seqlen_k <= INT_MAX,
                "flashattn_ext: on CUDA, seqlen of q and k must be at most ", num(INT_MAX));
}

void check_cuda_inputs(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v)
{
    check_cuda_sizes(q, v, q.size(0), q.size(2), q.size(1), k.size(1));
}

// All outer strides are checked, those of size-1 dimensions too (which the launchers ignore), so that a
// tensor passed as it is never has an odd stride anywhere.
bool vector_ready(const at::Tensor &t)
{
    if (reinterpret_cast<uintptr_t>(t.data_ptr()) % kVecBytes != 0)
        return false;
    for (int64_t i = 0; i < t.dim() - 1; ++i)
        if (t.stride(i) % kVecElems != 0)
            return false;
    return true;
}

// The head dims the kernels run at: qk for q, k, dq, dk (flash.h d), v for v, out, dout, dv (d_v). Today's kernels
// need them equal: both are the larger of q's and v's head dims (the smaller operand is zero-padded: zero
// columns of q and k leave the scores as they are, zero columns of v and dout give out and dv zero columns,
// sliced off, and leave dP = dout v^T as it is; softmax_scale comes from the caller), rounded up to the 16-byte
// vector for fp16/bf16. Kernels that take d_v != d natively would return the two dims apart here.
struct KernelHeadDims {
    int64_t qk, v;
};

KernelHeadDims kernel_head_dims(const at::Tensor &q, const at::Tensor &v)
{
    const int64_t d = std::max(q.size(-1), v.size(-1));
    const int64_t padded = is_half(q) ? (d + kVecElems - 1) / kVecElems * kVecElems : d;
    return {padded, padded};
}

// The kernels' precondition on params made from kernel_head_dims' tensors.
void check_kernel_head_dims(const flash_params &p)
{
    TORCH_INTERNAL_ASSERT(p.d_v == p.d, "flashattn_ext: the CUDA kernels need d_v == d (kernel_head_dims)");
}

// t (dense 4-D or varlen 3-D) as the kernels take it: head dim (the last dimension) zero-padded to
// d_kernel, vector-aligned for fp16/bf16.
at::Tensor kernel_ready(const at::Tensor &t, int64_t d_kernel)
{
    const int64_t hd = t.dim() - 1;
    if (t.size(hd) != d_kernel) {
        // Into a fresh contiguous buffer: constant_pad_nd keeps the input's suggested memory format, which
        // for a (B, H, S, D)-transposed input with head dim 1 is channels-last (row stride 1).
        std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
        sizes[hd] = d_kernel;
        at::Tensor padded = at::zeros(sizes, t.options());
        padded.narrow(hd, 0, t.size(hd)).copy_(t);
        return padded;
    }
    // A fresh allocation, not t.contiguous(): that returns t itself when t is contiguous but its data
    // pointer is misaligned (a storage offset) or a size-1 dimension has an odd stride.
    if ((is_half(t) && !vector_ready(t)) || (t.size(hd) > 1 && t.stride(hd) != 1))
        return t.clone(at::MemoryFormat::Contiguous);
    return t;
}

at::Tensor unpad(const at::Tensor &t, int64_t d)
{
    return t.size(-1) == d ? t : t.narrow(-1, 0, d).contiguous();
}

// The forward's workspaces (csrc/flash.h), alive until the call returns (stream-ordered frees).
struct FwdWorkspaces {
    at::Tensor o_accum, lse_accum, tile_counter;
};

// Split-KV (launch.h flash_fwd_splits): p->num_splits and, for more than one split, the fp32 workspaces of the
// partial results (requested: the user's num_splits, 0 = the heuristic); the dynamic tile scheduler's zeroed
// counter where the kernel that runs p takes one (launch.h flash_fwd_wants_tile_counter).
void set_fwd_workspaces(flash_params *p, int64_t requested, const at::Tensor &q, FwdWorkspaces *ws)
{
    p->num_splits = flash_fwd_splits(p, (int)requested);
    if (p->num_splits > 1) {
        const auto f32 = q.options().dtype(at::kFloat);
        ws->o_accum = at::empty({p->num_splits, p->b, p->h, p->sq, p->d_v}, f32);
        ws->lse_accum = at::empty({p->num_splits, p->b, p->h, p->sq}, f32);
        p->o_accum = ws->o_accum.data_ptr<float>();
        p->lse_accum = ws->lse_accum.data_ptr<float>();
    }
    if (flash_fwd_wants_tile_counter(p)) {
        ws->tile_counter = at::zeros({1}, q.options().dtype(at::kInt));
        p->tile_counter = ws->tile_counter.data_ptr<int32_t>();
    }
}

// The tensor-core kernels' tiles need `need` bytes of shared memory per block at this head dim.
void check_smem(size_t need, int64_t d, const char *what)
{
    const size_t have = flash_smem_available();
    TORCH_CHECK(have >= need, "flashattn_ext: the fp16/bf16 ", what, " at head dim ", num(d), " needs ",
                num((int64_t)(need / 1024)), " KB of shared memory per block; this GPU offers ",
                num((int64_t)(have / 1024)), " KB (A100: 163 KB, H100: 227 KB)");
}

// fp16 / bf16 calls that no tensor-core tile serves on this GPU run on the fp32 kernels (simple.cu), their inputs
// converted to float32 and their results rounded back: T5's rel_bias (score.h FLASH_SCORE_TABLE: the simple kernels
// only), the deterministic backward at head dims above kMaxHeadDim, and any call whose tiles need more shared memory
// per block than the GPU offers (sm86 / sm89 above head dim 128, off Hopper above 256) or that no kernel runs on it
// (flash_bwd_smem_needed SIZE_MAX). Exact as the fp32 path, slower, with float32 copies of the inputs; a warning once
// per process says so (the kernel report names the simple kernels). Never with a KV cache or a paged k / v (a float32
// copy of the whole cache per call): those keep their limits (check_cuda_sizes, check_smem).
// The call's sizes (batch, seqlen_q and seqlen_k: the longest in a varlen batch; nheads and nheads_kv) let the
// forward's need be that of the decode kernel where it serves the call (launch.cu flash_fwd_smem_needed).
bool half_on_fp32(const at::Tensor &q, const at::Tensor &v, const Variants &var, bool fwd, int64_t batch,
                  int64_t seqlen_q, int64_t seqlen_k, int64_t nheads, int64_t nheads_kv)
{
    if (!is_half(q))
        return false;
    if (var.rel_bias) { // its own warning (a call site of its own: once per process and direction)
        const char *msg = "flashattn_ext: T5's rel_bias with float16 / bfloat16 inputs has no tensor-core kernel on "
                          "CUDA: the call runs on the float32 CUDA-core kernels, exact but slower, with float32 copies "
                          "of its inputs";
        if (fwd) {
            TORCH_WARN_ONCE(msg);
        } else {
            TORCH_WARN_ONCE(msg);
        }
        return true;
    }
    const KernelHeadDims kd = kernel_head_dims(q, v);
    flash_params p{};
    p.d = kd.qk;
    p.d_v = kd.v;
    p.dtype = q.scalar_type() == at::kHalf ? FLASH_FP16 : FLASH_BF16;
    p.has_hook = has_score_hook(var) ? 1 : 0;
    p.b = batch;
    p.sq = seqlen_q;
    p.sk = seqlen_k;
    p.h = nheads;
    p.h_kv = nheads_kv;
    p.h_per_kv = nheads_kv > 0 ? nheads / nheads_kv : 0;
    static char marker;  // the decode kernel takes no attn_mask and no dropout: flags enough for flash_fwd_decode_ok
    p.mask = var.attn_mask ? &marker : nullptr;
    p.dropout_threshold = var.dropout_p > 0.0 ? 1 : 0;
    const size_t need = fwd ? flash_fwd_smem_needed(&p) : flash_bwd_smem_needed(&p);
    const size_t have = flash_smem_available();
    const int64_t top = fwd ? kMaxHeadDimFwd : var.deterministic ? kMaxHeadDim : kMaxHeadDimBwd;
    if (kd.qk <= top && need <= have)
        return false;
    const std::string why = kd.qk > top           ? "the deterministic backward's kernels stop at " + num(kMaxHeadDim)
                            : need == SIZE_MAX ? std::string("its kernel runs on Hopper's thread-block clusters")
                                               : "its tiles need " + num((int64_t)(need / 1024)) +
                                                     " KB of shared memory per block, the GPU offers " +
                                                     num((int64_t)(have / 1024)) + " KB";
    const std::string msg = std::string("flashattn_ext: the float16 / bfloat16 ") + (fwd ? "forward" : "backward") +
                            " at head dim " + num(std::max(q.size(-1), v.size(-1))) + " has no tensor-core kernel on this GPU (" + why +
                            "): it runs on the float32 CUDA-core kernels, exact but slower, with float32 copies of "
                            "its inputs";
    if (fwd) {
        TORCH_WARN_ONCE(msg);
    } else {
        TORCH_WARN_ONCE(msg);
    }
    return true;
}

void check_launch(cudaError_t err, const char *what)
{
    TORCH_CHECK(err == cudaSuccess, "flashattn_ext: CUDA ", what, " kernel failed: ", cudaGetErrorString(err));
}

// The attn_mask's block flags of params p made by make_params (which leaves a CUDA mask's to this): one pass
// over the mask on the device (rows.cu flash_mask_flags_cuda), held in keep.
void set_cuda_mask_blocks(flash_params *p, const Variants &var, VariantTensors *keep)
{
    if (!var.attn_mask)
        return;
    int64_t dims[4];
    flash_mask_flag_dims(p, dims);
    at::Tensor flags = at::empty({dims[0], dims[1], dims[2], dims[3]}, var.attn_mask->options().dtype(at::kByte));
    check_launch(flash_mask_flags_cuda(p, flags.data_ptr<uint8_t>(), c10::cuda::getCurrentCUDAStream()),
                 "attn_mask block flags");
    set_mask_blocks(p, *var.attn_mask, flags, keep);
}

// (seed, offset) from torch's default generator of the current CUDA device, read on the host under the
// generator's lock (no device synchronization; not capturable in a CUDA graph).
at::Tensor draw_rng_state_cuda(const at::Tensor &q, double dropout_p)
{
    if (dropout_p <= 0.0)
        return rng_state_from(0, 0);
    at::Generator gen = at::cuda::detail::getDefaultCUDAGenerator(q.device().index());
    std::lock_guard<std::mutex> lock(gen.mutex());
    const auto inputs = at::check_generator<at::CUDAGeneratorImpl>(gen)->philox_engine_inputs(kPhiloxOffsetStep);
    return rng_state_from(inputs.first, inputs.second);
}

// T5's relative position bias (rel_bias) on CUDA: the fp32 / fp64 kernels (launch.h), fp16 / bf16 inputs through
// half_on_fp32, but for a paged KV cache (no float32 copy of a cache: those calls keep the tensor-core kernels). The
// contents of rel_buckets are not read on the host (no synchronization): the kernels clamp them (score.h).
void check_cuda_rel_bias_paged(const at::Tensor &q, const Opt &rel_bias, const Opt &block_table)
{
    TORCH_CHECK(!rel_bias || !block_table || !is_half(q), "flashattn_ext: rel_bias (T5's relative position bias) "
                "with a paged KV cache (block_table) takes float32 and float64 inputs on CUDA, not float16 / "
                "bfloat16");
}

// bwd's drel_bias output without a rel_bias: empty, in the lse dtype.
at::Tensor no_rel_bias_grad(const at::Tensor &q)
{
    return at::empty({0}, q.options().dtype(lse_dtype(q.scalar_type())));
}

// bwd's drel_bias where no query sees a key: zeros of rel_bias's shape when asked for, else empty.
at::Tensor zero_rel_bias_grad(const at::Tensor &q, const Opt &rel_bias, bool rel_bias_grad)
{
    return rel_bias_grad ? at::zeros(rel_bias->sizes(), q.options().dtype(lse_dtype(q.scalar_type())))
                         : no_rel_bias_grad(q);
}

// The T5 table's gradient of a CUDA backward: the zero-filled partials that the kernels of p sum dS into (flash.h
// rel_bias_grad: (batch, nheads, key tiles of launch.h flash_bwd_rel_grad_tile keys, num_buckets) in the lse
// dtype), set in p; undefined when not asked. rel_bias_grad_sum makes bwd's drel_bias of them on the device.
at::Tensor set_rel_bias_grad(flash_params *p, const at::Tensor &q, bool rel_bias_grad)
{
    if (!rel_bias_grad)
        return at::Tensor();
    const int64_t tile = flash_bwd_rel_grad_tile(p);
    TORCH_CHECK(tile > 0, "flashattn_ext: the gradient of rel_bias is not supported on CUDA for this dtype");
    at::Tensor part = at::zeros({p->b, p->h, flash_cdiv64(p->sk, tile), p->rel_nb},
                                q.options().dtype(lse_dtype(q.scalar_type())));
    p->rel_bias_grad = part.data_ptr();
    p->rel_grad_tile = tile;
    return part;
}

// bwd's drel_bias (nheads, num_buckets): the partials of set_rel_bias_grad summed over batch and key tiles (a
// fixed-order device reduction, no host synchronization), or empty when not asked.
at::Tensor rel_bias_grad_sum(const at::Tensor &part, const at::Tensor &q)
{
    return part.defined() ? part.sum(at::IntArrayRef{0, 2}) : no_rel_bias_grad(q);
}

FwdOutputs dense_fwd_cuda(const at::Tensor &q_in, const at::Tensor &k_in, const at::Tensor &v_in,
                          double softmax_scale, bool causal, bool bottom_right, int64_t window_left,
                          int64_t window_right, double softcap, const Opt &alibi_slopes, const Opt &sink,
                          const Opt &attn_mask, double dropout_p, bool deterministic, const Opt &rel_bias,
                          const Opt &rel_buckets)
{
    check_qkv(q_in, k_in, v_in);
    check_cuda_inputs(q_in, k_in, v_in);
    const Variants var = with_rel_bias(variants_of(causal, bottom_right, window_left, window_right, softcap,
                                                   alibi_slopes, sink, attn_mask, dropout_p, deterministic),
                                       rel_bias, rel_buckets);
    check_variants(var, q_in, k_in);
    if (half_on_fp32(q_in, v_in, var, true, q_in.size(0), q_in.size(1), k_in.size(1), q_in.size(2), k_in.size(2))) {
        auto [out, lse, rng_state, out32] = dense_fwd_cuda(
            f32(q_in), f32(k_in), f32(v_in), softmax_scale, causal, bottom_right, window_left, window_right, softcap,
            alibi_slopes, sink, mask_f32(attn_mask), dropout_p, deterministic, rel_bias, rel_buckets);
        return {out.to(q_in.scalar_type()), lse, rng_state, rel_bias ? out : no_out32(q_in)}; // ops.py _rounds_fp32
    }
    const c10::cuda::CUDAGuard guard(q_in.device());
    at::Tensor rng_state = draw_rng_state_cuda(q_in, dropout_p);
    if (no_work(q_in) || k_in.size(1) == 0) {
        auto [out, lse] = fwd_without_keys(q_in, v_in, sink);
        return {out, lse, rng_state, no_out32(q_in)};
    }
    const int64_t d_v = v_in.size(3);
    const KernelHeadDims kd = kernel_head_dims(q_in, v_in);
    const at::Tensor q = kernel_ready(q_in, kd.qk);
    const at::Tensor k = kernel_ready(k_in, kd.qk);
    const at::Tensor v = kernel_ready(v_in, kd.v);
    at::Tensor out = at::empty(out_sizes(q, v), q.options());
    at::Tensor lse = at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(lse_dtype(q.scalar_type())));
    VariantTensors keep;
    flash_params p = make_params(q, k, v, out, lse, softmax_scale, var, rng_state, &keep);
    check_kernel_head_dims(p);
    set_cuda_mask_blocks(&p, var, &keep);
    if (is_half(q))
        check_smem(flash_fwd_smem_needed(&p), kd.qk, "forward");
    FwdWorkspaces ws;
    set_fwd_workspaces(&p, 0, q, &ws);
    check_launch(flash_fwd_cuda(&p, c10::cuda::getCurrentCUDAStream()), "forward");
    return {unpad(out, d_v), lse, rng_state, no_out32(q_in)};
}

// The int32 dQ semaphores of csrc/flash.h, set in p, where the backward of p takes them (deterministic mode on
// Hopper: launch.h flash_bwd_wants_dq_semaphore); an undefined tensor elsewhere. The preprocess zeroes them.
at::Tensor set_dq_semaphore(flash_params *p, const at::Tensor &q)
{
    if (!flash_bwd_wants_dq_semaphore(p))
        return at::Tensor();
    at::Tensor sem = at::empty({p->b, p->h, flash_dq_sem_tiles(p)}, q.options().dtype(at::kInt));
    p->dq_semaphore = sem.data_ptr<int32_t>();
    return sem;
}

BwdOutputs dense_bwd_cuda(
    const at::Tensor &dout_in, const at::Tensor &q_in, const at::Tensor &k_in, const at::Tensor &v_in,
    const at::Tensor &out_in, const at::Tensor &lse_in, const at::Tensor &rng_state, double softmax_scale, bool causal,
    bool bottom_right, int64_t window_left, int64_t window_right, double softcap,
    const c10::optional<at::Tensor> &alibi_slopes, const c10::optional<at::Tensor> &sink,
    const c10::optional<at::Tensor> &attn_mask, double dropout_p, bool deterministic, bool mask_grad,
    const c10::optional<at::Tensor> &rel_bias, const c10::optional<at::Tensor> &rel_buckets,
    bool rel_bias_grad)
{
    check_qkv(q_in, k_in, v_in);
    check_cuda_inputs(q_in, k_in, v_in);
    TORCH_CHECK(!rel_bias_grad || rel_bias, "flashattn_ext: rel_bias_grad needs a rel_bias");
    check_bwd_inputs(dout_in, q_in, v_in, out_in, lse_in, rel_bias.has_value());
    check_rng_state(rng_state);
    const Variants var = with_rel_bias(variants_of(causal, bottom_right, window_left, window_right, softcap,
                                                   alibi_slopes, sink, attn_mask, dropout_p, deterministic),
                                       rel_bias, rel_buckets);
    check_variants(var, q_in, k_in);
    TORCH_CHECK(!mask_grad || (attn_mask && attn_mask->scalar_type() != at::kBool),
                "flashattn_ext: mask_grad needs a floating attn_mask");
    if (half_on_fp32(q_in, v_in, var, false, q_in.size(0), q_in.size(1), k_in.size(1), q_in.size(2), k_in.size(2))) {
        auto [dq, dk, dv, dmask, drel] = dense_bwd_cuda(
            f32(dout_in), f32(q_in), f32(k_in), f32(v_in), f32(out_in), lse_in, rng_state, softmax_scale, causal,
            bottom_right, window_left, window_right, softcap, alibi_slopes, sink, mask_f32(attn_mask), dropout_p,
            deterministic, mask_grad, rel_bias, rel_buckets, rel_bias_grad);
        return {dq.to(q_in.scalar_type()), dk.to(k_in.scalar_type()), dv.to(v_in.scalar_type()), dmask, drel};
    }
    const c10::cuda::CUDAGuard guard(q_in.device());
    at::Tensor dmask = make_dmask(q_in, k_in, mask_grad);
    if (no_work(q_in) || k_in.size(1) == 0)
        return {at::zeros(q_in.sizes(), q_in.options()), at::zeros(k_in.sizes(), k_in.options()),
                at::zeros(v_in.sizes(), v_in.options()), dmask, zero_rel_bias_grad(q_in, rel_bias, rel_bias_grad)};
    const int64_t d = q_in.size(3), d_v = v_in.size(3);
    const KernelHeadDims kd = kernel_head_dims(q_in, v_in);
    const at::Tensor q = kernel_ready(q_in, kd.qk);
    const at::Tensor k = kernel_ready(k_in, kd.qk);
    const at::Tensor v = kernel_ready(v_in, kd.v);
    const at::Tensor out = kernel_ready(out_in, kd.v);
    const at::Tensor dout = kernel_ready(dout_in, kd.v);
    const at::Tensor lse = lse_in.contiguous();
    at::Tensor dq = at::empty(q.sizes(), q.options());
    at::Tensor dk = at::empty(k.sizes(), k.options());
    at::Tensor dv = at::empty(v.sizes(), v.options());
    at::Tensor delta = at::empty(lse.sizes(), lse.options());
    VariantTensors keep;
    flash_params p = make_params(q, k, v, out, lse, softmax_scale, var, rng_state, &keep);
    check_kernel_head_dims(p);
    set_cuda_mask_blocks(&p, var, &keep);
    set_bwd_params(&p, dout, dq, dk, dv, delta);
    if (mask_grad)
        p.dbias = dmask.data_ptr();
    const at::Tensor rel_part = set_rel_bias_grad(&p, q, rel_bias_grad);
    // An additive attn_mask: the preprocess's dO' and lse (flash.h dout_fix, score.h "Huge additive entries"),
    // known on the host without a look at the mask's values.
    at::Tensor dout_fix, lse_fix;
    if (p.mask != nullptr && p.mask_kind == FLASH_MASK_ADD) {
        dout_fix = at::empty(dout.sizes(), dout.options());
        lse_fix = at::empty(lse.sizes(), lse.options());
        const flash_strides fs = flash_dout_fix_strides(&p);
        TORCH_INTERNAL_ASSERT(dout_fix.size(1) == p.sq && dout_fix.size(2) == p.h && dout_fix.size(3) == p.d_v &&
                              dout_fix.stride(0) == fs.batch && dout_fix.stride(1) == fs.row &&
                              dout_fix.stride(2) == fs.head && dout_fix.stride(3) == 1);
        p.dout_fix = dout_fix.data_ptr();
        p.lse_fix = lse_fix.data_ptr();
    }

    // fp32 workspaces of the tensor-core backward (see csrc/flash.h; in deterministic mode on Hopper also the
    // int32 dQ semaphores, zeroed by the preprocess); freed when this call returns, after the kernels that
    // use them, through the stream-ordered caching allocator.
    at::Tensor dq_accum, dk_accum, dv_accum, dq_semaphore;
    if (is_half(q)) {
        check_smem(flash_bwd_smem_needed(&p), kd.qk, "backward");
        const auto f32 = q.options().dtype(at::kFloat);
        dq_accum = at::empty({flash_bwd_dq_accum_floats(&p)}, f32); // (b, h, sq, d) or launch.h's tiled layout
        p.dq_accum = dq_accum.data_ptr<float>();
        dq_semaphore = set_dq_semaphore(&p, q);
        if (p.h != p.h_kv) {
            dk_accum = at::empty({p.b, p.sk, p.h, p.d}, f32);
            dv_accum = at::empty({p.b, p.sk, p.h, p.d_v}, f32);
            p.dk_accum = dk_accum.data_ptr<float>();
            p.dv_accum = dv_accum.data_ptr<float>();
        }
    }
    check_launch(flash_bwd_cuda(&p, c10::cuda::getCurrentCUDAStream()), "backward");
    return {unpad(dq, d), unpad(dk, d), unpad(dv, d_v), dmask, rel_bias_grad_sum(rel_part, q_in)};
}

// A paged k / v (block_table) is padded or copied by kernel_ready like any k / v, as kvcache_fwd_cuda's cache.
FwdOutputs varlen_fwd_cuda(
    const at::Tensor &q_in, const at::Tensor &k_in, const at::Tensor &v_in, const at::Tensor &cu_seqlens_q,
    const at::Tensor &cu_seqlens_k, const c10::optional<at::Tensor> &seqused_k, int64_t max_seqlen_q,
    int64_t max_seqlen_k, double softmax_scale, bool causal, int64_t window_left, int64_t window_right, double softcap,
    const c10::optional<at::Tensor> &alibi_slopes, const c10::optional<at::Tensor> &sink, double dropout_p,
    bool deterministic, const c10::optional<at::Tensor> &block_table,
    const c10::optional<at::Tensor> &rel_bias, const c10::optional<at::Tensor> &rel_buckets)
{
    const Varlen vl = varlen_of(cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, block_table);
    check_varlen_qkv(q_in, k_in, v_in, vl);
    check_cuda_sizes(q_in, v_in, vl.batch(), q_in.size(1), max_seqlen_q, max_seqlen_k, "v", block_table.has_value());
    check_cuda_rel_bias_paged(q_in, rel_bias, block_table);
    const Variants var = with_rel_bias(variants_of(causal, true, window_left, window_right, softcap, alibi_slopes,
                                                   sink, c10::nullopt, dropout_p, deterministic),
                                       rel_bias, rel_buckets);
    check_variants(var, q_in, vl.batch(), max_seqlen_q, q_in.size(1), max_seqlen_k);
    if (!block_table &&
        half_on_fp32(q_in, v_in, var, true, vl.batch(), max_seqlen_q, max_seqlen_k, q_in.size(1), k_in.size(1))) {
        auto [out, lse, rng_state, out32] = varlen_fwd_cuda(
            f32(q_in), f32(k_in), f32(v_in), cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
            softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, sink, dropout_p, deterministic,
            block_table, rel_bias, rel_buckets);
        return {out.to(q_in.scalar_type()), lse, rng_state, rel_bias ? out : no_out32(q_in)}; // ops.py _rounds_fp32
    }
    const c10::cuda::CUDAGuard guard(q_in.device());
    at::Tensor rng_state = draw_rng_state_cuda(q_in, dropout_p);
    if (varlen_fwd_no_work(q_in, vl, var)) {
        auto [out, lse] = varlen_fwd_outputs(q_in, v_in);
        return {out, lse, rng_state, no_out32(q_in)};
    }
    const int64_t d_v = v_in.size(-1);
    const KernelHeadDims kd = kernel_head_dims(q_in, v_in);
    const at::Tensor q = kernel_ready(q_in, kd.qk);
    const at::Tensor k = kernel_ready(k_in, kd.qk);
    const at::Tensor v = kernel_ready(v_in, kd.v);
    auto [out, lse] = varlen_fwd_outputs(q, v);
    VariantTensors keep;
    flash_params p = make_varlen_params(q, k, v, out, lse, vl, softmax_scale, var, rng_state, &keep);
    check_kernel_head_dims(p);
    if (is_half(q))
        check_smem(flash_fwd_smem_needed(&p), kd.qk, "forward");
    FwdWorkspaces ws;
    set_fwd_workspaces(&p, 0, q, &ws);
    check_launch(flash_fwd_cuda(&p, c10::cuda::getCurrentCUDAStream()), "varlen forward");
    return {unpad(out, d_v), lse, rng_state, no_out32(q_in)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> varlen_bwd_cuda(
    const at::Tensor &dout_in, const at::Tensor &q_in, const at::Tensor &k_in, const at::Tensor &v_in,
    const at::Tensor &out_in, const at::Tensor &lse_in, const at::Tensor &rng_state, const at::Tensor &cu_seqlens_q,
    const at::Tensor &cu_seqlens_k, const c10::optional<at::Tensor> &seqused_k, int64_t max_seqlen_q,
    int64_t max_seqlen_k, double softmax_scale, bool causal, int64_t window_left, int64_t window_right, double softcap,
    const c10::optional<at::Tensor> &alibi_slopes, const c10::optional<at::Tensor> &sink, double dropout_p,
    bool deterministic, const c10::optional<at::Tensor> &rel_bias, const c10::optional<at::Tensor> &rel_buckets,
    bool rel_bias_grad)
{
    const Varlen vl = varlen_of(cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k);
    check_varlen_qkv(q_in, k_in, v_in, vl);
    check_cuda_sizes(q_in, v_in, vl.batch(), q_in.size(1), max_seqlen_q, max_seqlen_k);
    TORCH_CHECK(!rel_bias_grad || rel_bias, "flashattn_ext: rel_bias_grad needs a rel_bias");
    check_varlen_bwd_inputs(dout_in, q_in, v_in, out_in, lse_in, rel_bias.has_value());
    check_rng_state(rng_state);
    const Variants var = with_rel_bias(variants_of(causal, true, window_left, window_right, softcap, alibi_slopes,
                                                   sink, c10::nullopt, dropout_p, deterministic),
                                       rel_bias, rel_buckets);
    check_variants(var, q_in, vl.batch(), max_seqlen_q, q_in.size(1), max_seqlen_k);
    if (half_on_fp32(q_in, v_in, var, false, vl.batch(), max_seqlen_q, max_seqlen_k, q_in.size(1), k_in.size(1))) {
        auto [dq, dk, dv, drel] = varlen_bwd_cuda(
            f32(dout_in), f32(q_in), f32(k_in), f32(v_in), f32(out_in), lse_in, rng_state, cu_seqlens_q, cu_seqlens_k,
            seqused_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap,
            alibi_slopes, sink, dropout_p, deterministic, rel_bias, rel_buckets, rel_bias_grad);
        return {dq.to(q_in.scalar_type()), dk.to(k_in.scalar_type()), dv.to(v_in.scalar_type()), drel};
    }
    const c10::cuda::CUDAGuard guard(q_in.device());
    if (varlen_bwd_no_work(q_in, k_in, vl))
        return {at::zeros(q_in.sizes(), q_in.options()), at::zeros(k_in.sizes(), k_in.options()),
                at::zeros(v_in.sizes(), v_in.options()), zero_rel_bias_grad(q_in, rel_bias, rel_bias_grad)};
    const int64_t d = q_in.size(2), d_v = v_in.size(2);
    const KernelHeadDims kd = kernel_head_dims(q_in, v_in);
    const at::Tensor q = kernel_ready(q_in, kd.qk);
    const at::Tensor k = kernel_ready(k_in, kd.qk);
    const at::Tensor v = kernel_ready(v_in, kd.v);
    const at::Tensor out = kernel_ready(out_in, kd.v);
    const at::Tensor dout = kernel_ready(dout_in, kd.v);
    const at::Tensor lse = lse_in.contiguous();
    at::Tensor dq = at::zeros(q.sizes(), q.options());
    at::Tensor dk = at::zeros(k.sizes(), k.options());
    at::Tensor dv = at::zeros(v.sizes(), v.options());
    at::Tensor delta = at::empty(lse.sizes(), lse.options());
    VariantTensors keep;
    flash_params p = make_varlen_params(q, k, v, out, lse, vl, softmax_scale, var, rng_state, &keep);
    check_kernel_head_dims(p);
    set_varlen_bwd_params(&p, dout, dq, dk, dv, delta);
    const at::Tensor rel_part = set_rel_bias_grad(&p, q, rel_bias_grad);

    // fp32 workspaces of the tensor-core backward in the varlen layouts of csrc/flash.h: dq_accum
    // (nheads, total_q, d) or launch.h's tiled layout, dk_accum / dv_accum (total_k, nheads, d), zero-filled (rows
    // of no sequence and keys past seqused_k are never written by the kernels); the dQ semaphores as in the dense
    // case.
    at::Tensor dq_accum, dk_accum, dv_accum, dq_semaphore;
    if (is_half(q)) {
        check_smem(flash_bwd_smem_needed(&p), kd.qk, "backward");
        const auto f32 = q.options().dtype(at::kFloat);
        dq_accum = at::zeros({flash_bwd_dq_accum_floats(&p)}, f32);
        p.dq_accum = dq_accum.data_ptr<float>();
        dq_semaphore = set_dq_semaphore(&p, q);
        if (p.h != p.h_kv) {
            dk_accum = at::zeros({p.total_k, p.h, p.d}, f32);
            dv_accum = at::zeros({p.total_k, p.h, p.d_v}, f32);
            p.dk_accum = dk_accum.data_ptr<float>();
            p.dv_accum = dv_accum.data_ptr<float>();
        }
    }
    check_launch(flash_bwd_cuda(&p, c10::cuda::getCurrentCUDAStream()), "varlen backward");
    return {unpad(dq, d), unpad(dk, d), unpad(dv, d_v), rel_bias_grad_sum(rel_part, q_in)};
}

// The cache is padded or copied by kernel_ready like any k / v (fp16/bf16 with a head dim that is not a
// multiple of 8, or misaligned strides): the kernels then read the copy, which is all kvcache_fwd needs (it
// writes nothing into the cache).
std::tuple<at::Tensor, at::Tensor> kvcache_fwd_cuda(
    const at::Tensor &q_in, const at::Tensor &k_in, const at::Tensor &v_in,
    const c10::optional<at::Tensor> &cache_seqlens, const c10::optional<at::Tensor> &cache_batch_idx,
    const c10::optional<at::Tensor> &cache_leftpad, const c10::optional<at::Tensor> &block_table,
    double softmax_scale, bool causal, int64_t window_left, int64_t window_right, double softcap,
    const c10::optional<at::Tensor> &alibi_slopes, const c10::optional<at::Tensor> &sink, int64_t num_splits)
{
    const KvCache kv = kvcache_of(cache_seqlens, cache_batch_idx, cache_leftpad, block_table);
    check_kvcache_inputs(q_in, k_in, v_in, kv);
    check_num_splits(num_splits);
    const int64_t seqlen_k = kv.seqlen_k(k_in);
    check_cuda_sizes(q_in, v_in, q_in.size(0), q_in.size(2), q_in.size(1), seqlen_k, "v_cache", true);
    const Variants var = variants_of(causal, true, window_left, window_right, softcap, alibi_slopes, sink,
                                     c10::nullopt, 0.0, false);
    check_variants(var, q_in, q_in.size(0), q_in.size(1), q_in.size(2), seqlen_k);
    const c10::cuda::CUDAGuard guard(q_in.device());
    if (no_work(q_in) || seqlen_k == 0)
        return fwd_without_keys(q_in, v_in, sink);
    const int64_t d_v = v_in.size(3);
    const KernelHeadDims kd = kernel_head_dims(q_in, v_in);
    const at::Tensor q = kernel_ready(q_in, kd.qk);
    const at::Tensor k = kernel_ready(k_in, kd.qk);
    const at::Tensor v = kernel_ready(v_in, kd.v);
    at::Tensor out = at::empty(out_sizes(q, v), q.options());
    at::Tensor lse = at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(lse_dtype(q.scalar_type())));
    VariantTensors keep;
    flash_params p = make_kvcache_params(q, k, v, out, lse, kv, softmax_scale, var, &keep);
    check_kernel_head_dims(p);
    if (is_half(q))
        check_smem(flash_fwd_smem_needed(&p), kd.qk, "forward");
    FwdWorkspaces ws;
    set_fwd_workspaces(&p, num_splits, q, &ws);
    check_launch(flash_fwd_cuda(&p, c10::cuda::getCurrentCUDAStream()), "KV-cache forward");
    return {unpad(out, d_v), lse};
}

void kv_append_cuda(const at::Tensor &k_cache, const at::Tensor &v_cache, const at::Tensor &k, const at::Tensor &v,
                    const at::Tensor &cache_seqlens, const c10::optional<at::Tensor> &cache_batch_idx,
                    const c10::optional<at::Tensor> &block_table)
{
    const KvAppend a = kv_append_of(k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table);
    const c10::cuda::CUDAGuard guard(k_cache.device());
    if (!a.no_work)
        check_launch(flash_kv_append_cuda(&a.p, c10::cuda::getCurrentCUDAStream()), "KV-cache append");
}

at::Tensor dropout_mask_cuda(const at::Tensor &q, const at::Tensor &rng_state, int64_t seqlen_k, double dropout_p)
{
    const flash_params p = dropout_mask_params(q, rng_state, seqlen_k, dropout_p);
    const c10::cuda::CUDAGuard guard(q.device());
    at::Tensor keep = at::empty({p.b, p.h, p.sq, p.sk}, q.options().dtype(at::kBool));
    if (keep.numel() > 0)
        check_launch(flash_dropout_mask_cuda(&p, reinterpret_cast<uint8_t *>(keep.data_ptr<bool>()),
                                             c10::cuda::getCurrentCUDAStream()),
                     "dropout mask");
    return keep;
}

}  // namespace

TORCH_LIBRARY_IMPL(flashattn_ext, CUDA, m)
{
    m.impl("fwd", &fwd_op<&dense_fwd_cuda, &varlen_fwd_cuda, &kvcache_fwd_cuda>);
    m.impl("bwd", &bwd_op<&dense_bwd_cuda, &varlen_bwd_cuda>);
    m.impl("dropout_mask", &dropout_mask_cuda);
    m.impl("kv_append", &kv_append_cuda);
}

}  // namespace flashattn_ext
