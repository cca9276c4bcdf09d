// ops.cpp: the op schema (declared once), the input checks, params filling, and the CPU backend.
//
// Layout of every tensor argument: q/out/dout (batch, seqlen_q, nheads, headdim), k/v
// (batch, seqlen_k, nheads_kv, headdim), any strides whose last one is 1; lse (batch, nheads, seqlen_q)
// in fp32 (fp64 for fp64 inputs). The CUDA backend lives in ops_cuda.cpp.
#include <Python.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "cpu/flash_cpu.h"
#include "ops.h"

namespace flashattn_ext {

namespace {

constexpr int64_t kRank = 4;  // (batch, seqlen, nheads, headdim)
constexpr double kLog2e = 1.4426950408889634;

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

void check_rank_and_last_stride(const at::Tensor &t, const char *name)
{
    TORCH_CHECK(t.defined(), "flashattn_ext: ", name, " is undefined");
    TORCH_CHECK(t.dim() == kRank, "flashattn_ext: ", name,
                " must have 4 dimensions (batch, seqlen, nheads, headdim), got ", num(t.dim()));
    TORCH_CHECK(t.size(3) <= 1 || t.stride(3) == 1, "flashattn_ext: ", name,
                " must have stride 1 in its last dimension (headdim), got stride ", num(t.stride(3)));
}

}  // namespace

void check_qkv(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v)
{
    check_rank_and_last_stride(q, "q");
    check_rank_and_last_stride(k, "k");
    check_rank_and_last_stride(v, "v");
    TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
                "flashattn_ext: q, k and v must have the same dtype, got q ", q.scalar_type(), ", k ",
                k.scalar_type(), ", v ", v.scalar_type());
    TORCH_CHECK(q.device() == k.device() && q.device() == v.device(),
                "flashattn_ext: q, k and v must be on the same device, got q on ", q.device().str(), ", k on ",
                k.device().str(), ", v on ", v.device().str());
    TORCH_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0),
                "flashattn_ext: batch size of q, k and v must match, got q ", num(q.size(0)), ", k ",
                num(k.size(0)), ", v ", num(v.size(0)));
    TORCH_CHECK(k.size(3) == q.size(3) && v.size(3) == q.size(3),
                "flashattn_ext: head dim (last dimension) of q, k and v must match, got q ", num(q.size(3)),
                ", k ", num(k.size(3)), ", v ", num(v.size(3)));
    TORCH_CHECK(k.size(1) == v.size(1), "flashattn_ext: seqlen of k (", num(k.size(1)), ") and v (", num(v.size(1)),
                ") must match");
    TORCH_CHECK(k.size(2) == v.size(2), "flashattn_ext: nheads of k (", num(k.size(2)), ") and v (", num(v.size(2)),
                ") must match");
    TORCH_CHECK(k.size(2) > 0 || q.size(2) == 0, "flashattn_ext: nheads of k and v must be positive");
    TORCH_CHECK(k.size(2) == 0 || q.size(2) % k.size(2) == 0, "flashattn_ext: nheads of q (", num(q.size(2)),
                ") must be a multiple of nheads of k and v (", num(k.size(2)), ")");
}

void check_bwd_inputs(const at::Tensor &dout, const at::Tensor &q, const at::Tensor &out, const at::Tensor &lse)
{
    TORCH_CHECK(dout.defined() && dout.sizes() == q.sizes(), "flashattn_ext: dout must have the shape of q ",
                shape(q.sizes()), ", got ", dout.defined() ? shape(dout.sizes()) : "undefined");
    TORCH_CHECK(out.defined() && out.sizes() == q.sizes(), "flashattn_ext: out must have the shape of q ",
                shape(q.sizes()), ", got ", out.defined() ? shape(out.sizes()) : "undefined");
    TORCH_CHECK(dout.scalar_type() == q.scalar_type() && out.scalar_type() == q.scalar_type(),
                "flashattn_ext: dout and out must have the dtype of q (", q.scalar_type(), "), got dout ",
                dout.scalar_type(), ", out ", out.scalar_type());
    TORCH_CHECK(dout.device() == q.device() && out.device() == q.device() && lse.device() == q.device(),
                "flashattn_ext: dout, out and lse must be on the device of q (", q.device().str(), ")");
    TORCH_CHECK(lse.dim() == 3 && lse.size(0) == q.size(0) && lse.size(1) == q.size(2) && lse.size(2) == q.size(1),
                "flashattn_ext: lse must have shape (batch, nheads, seqlen_q) = ",
                shape({q.size(0), q.size(2), q.size(1)}), ", got ", shape(lse.sizes()));
    TORCH_CHECK(lse.scalar_type() == lse_dtype(q.scalar_type()), "flashattn_ext: lse must have dtype ",
                lse_dtype(q.scalar_type()), " for ", q.scalar_type(), " inputs, got ", lse.scalar_type());
}

at::ScalarType lse_dtype(at::ScalarType t)
{
    return t == at::kDouble ? at::kDouble : at::kFloat;
}

flash_params make_params(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, const at::Tensor &out,
                         const at::Tensor &lse, double softmax_scale, bool causal, bool bottom_right,
                         bool deterministic)
{
    TORCH_INTERNAL_ASSERT(lse.is_contiguous());
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
    p.sk = k.size(1);
    p.h_kv = k.size(2);
    p.h_per_kv = p.h / p.h_kv;
    p.scale = softmax_scale;
    p.scale_log2 = static_cast<float>(softmax_scale * kLog2e);
    p.causal = causal ? 1 : 0;
    p.causal_offset = (causal && bottom_right) ? p.sk - p.sq : 0;
    p.deterministic = deterministic ? 1 : 0;
    p.dtype = to_flash_dtype(q.scalar_type());
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

bool no_work(const at::Tensor &q)
{
    return q.numel() == 0;
}

std::tuple<at::Tensor, at::Tensor> fwd_without_keys(const at::Tensor &q, const at::Tensor &v)
{
    at::Tensor out = at::zeros({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());
    at::Tensor lse = at::full({q.size(0), q.size(2), q.size(1)}, -std::numeric_limits<double>::infinity(),
                              q.options().dtype(lse_dtype(q.scalar_type())));
    return {out, lse};
}

namespace {

void check_cpu_dtype(const at::Tensor &q)
{
    TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble,
                "flashattn_ext: on CPU, q, k and v must be float32 or float64, got ", q.scalar_type());
}

void check_cpu_status(flash_cpu_status status, const char *what)
{
    TORCH_CHECK(status != FLASH_CPU_ERR_NOMEM, "flashattn_ext: out of memory for the CPU ", what, " workspace");
    TORCH_CHECK(status == FLASH_CPU_OK, "flashattn_ext: CPU ", what, " failed with status ", num(status));
}

std::tuple<at::Tensor, at::Tensor> fwd_cpu(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                                           double softmax_scale, bool causal, bool bottom_right, bool deterministic)
{
    check_qkv(q, k, v);
    check_cpu_dtype(q);
    if (no_work(q) || k.size(1) == 0)
        return fwd_without_keys(q, v);
    at::Tensor out = at::empty(q.sizes(), q.options());
    at::Tensor lse = at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(lse_dtype(q.scalar_type())));
    const flash_params p = make_params(q, k, v, out, lse, softmax_scale, causal, bottom_right, deterministic);
    check_cpu_status(flash_fwd_cpu(&p), "forward");
    return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_cpu(const at::Tensor &dout_in, const at::Tensor &q,
                                                       const at::Tensor &k, const at::Tensor &v,
                                                       const at::Tensor &out, const at::Tensor &lse_in,
                                                       double softmax_scale, bool causal, bool bottom_right,
                                                       bool deterministic)
{
    check_qkv(q, k, v);
    check_cpu_dtype(q);
    check_bwd_inputs(dout_in, q, out, lse_in);
    check_rank_and_last_stride(out, "out");
    if (no_work(q) || k.size(1) == 0)
        return {at::zeros(q.sizes(), q.options()), at::zeros(k.sizes(), k.options()), at::zeros(v.sizes(), v.options())};
    at::Tensor dq = at::empty(q.sizes(), q.options());
    at::Tensor dk = at::empty(k.sizes(), k.options());
    at::Tensor dv = at::empty(v.sizes(), v.options());
    const at::Tensor dout = dout_in.stride(3) == 1 ? dout_in : dout_in.contiguous();
    const at::Tensor lse = lse_in.contiguous();
    at::Tensor delta = at::empty(lse.sizes(), lse.options());
    flash_params p = make_params(q, k, v, out, lse, softmax_scale, causal, bottom_right, deterministic);
    set_bwd_params(&p, dout, dq, dk, dv, delta);
    check_cpu_status(flash_bwd_cpu(&p), "backward");
    return {dq, dk, dv};
}

}  // namespace

TORCH_LIBRARY(flashattn_ext, m)
{
    m.def("fwd(Tensor q, Tensor k, Tensor v, float softmax_scale, bool causal, bool bottom_right, "
          "bool deterministic) -> (Tensor out, Tensor lse)");
    m.def("bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, float softmax_scale, "
          "bool causal, bool bottom_right, bool deterministic) -> (Tensor dq, Tensor dk, Tensor dv)");
}

TORCH_LIBRARY_IMPL(flashattn_ext, CPU, m)
{
    m.impl("fwd", &fwd_cpu);
    m.impl("bwd", &bwd_cpu);
}

}  // namespace flashattn_ext

// `import flashattn_ext._C` loads this library, whose static initializers register the ops above.
extern "C" PyObject *PyInit__C(void)
{
    static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
    return PyModule_Create(&module_def);
}
