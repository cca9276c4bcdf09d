// ops.h: what the two libtorch translation units (ops.cpp: schema + CPU, ops_cuda.cpp: CUDA) share:
// the input checks and the one function that fills flash_params from tensors.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "flash.h"

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

// Checks q, k, v (ranks, shapes, dtypes, devices, last stride) with messages naming the argument.
void check_qkv(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v);

// Checks the extra backward inputs (dout, out, lse) against q.
void check_bwd_inputs(const at::Tensor &dout, const at::Tensor &q, const at::Tensor &out, const at::Tensor &lse);

// dtype of lse / delta for inputs of dtype t: fp64 for fp64 inputs, fp32 otherwise.
at::ScalarType lse_dtype(at::ScalarType t);

// Zero-filled params with the forward tensors, sizes, scale and causal offset set.
flash_params make_params(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, const at::Tensor &out,
                         const at::Tensor &lse, double softmax_scale, bool causal, bool bottom_right,
                         bool deterministic);

// Adds the backward tensors to params made by make_params.
void set_bwd_params(flash_params *p, const at::Tensor &dout, const at::Tensor &dq, const at::Tensor &dk,
                    const at::Tensor &dv, const at::Tensor &delta);

// True when there is nothing to compute (an empty batch, no queries or no heads); a forward with
// seqlen_k == 0 has work to do: every row sees no key (out = 0, lse = -inf).
bool no_work(const at::Tensor &q);

// Result of a forward where no query sees any key: out = 0, lse = -inf.
std::tuple<at::Tensor, at::Tensor> fwd_without_keys(const at::Tensor &q, const at::Tensor &v);

}  // namespace flashattn_ext
