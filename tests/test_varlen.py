"""Variable-length batches: flash_attn_varlen_func (and its packed forms) against one float64 reference per
sequence (fa_testing.variant_reference of the sequence as a batch of one): out, lse, dq, dk, dv and d sink
over length mixes with empty and one-token sequences, seqlen_q != seqlen_k per sequence, GQA, rows and
keys in no sequence, seqused_k, every variant (causal, window, softcap, ALiBi (nheads,) and (batch,
nheads), sinks, dropout); the dense op at batch index s with the varlen call's rng_state; return_attn_probs;
the packed functions; gradcheck; torch.compile; opcheck; bad inputs. CPU in CI, the same tests on CUDA
(marked `cuda`, skipped without a GPU)."""
import dataclasses
import math

import pytest
import torch

import flashattn_ext
from fa_testing import varlen_fwd_op, varlen_bwd_op, opcheck_call, VARLEN_FWD_ARGS, VARLEN_BWD_ARGS
from flashattn_ext.reference import attention_varlen_ref, varlen_sequences
from fa_testing import (
    DTYPE_NAMES,
    HAS_CUDA,
    OUT_TOL,
    Cfg,
    Var,
    assert_close,
    assert_lse_close,
    check_variant_results,
    expected_lse_dtype,
    grad_tol,
    keep_probability,
    natural_grad_norms,
    no_host_sync,
    variant_reference,
)

DROPOUT_SEED = 4321
CUDA_MARKS = [pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")]
DEVICE_DTYPES = [("cpu", dt) for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64)] + [
    ("cuda", dt) for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64)]


def device_dtype_params(pairs=DEVICE_DTYPES):
    return [pytest.param(dev, dt, id=f"{dev}-{DTYPE_NAMES[dt]}", marks=CUDA_MARKS if dev == "cuda" else [])
            for dev, dt in pairs]


DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=CUDA_MARKS)]


@dataclasses.dataclass(frozen=True)
class Mix:
    """A variable-length batch: lens[s] = (seqlen_q, seqlen_k) of sequence s; extra_q / extra_k rows of q /
    k after the last sequence that belong to none; used: seqused_k (None: every key of each sequence);
    max_q / max_k: the max_seqlen arguments (None: the longest sequence). layout of q, k, v: "contig"
    (total, nheads, headdim), "slice" (a [..., 2:2 + headdim] slice: odd row strides and an offset) or
    "hsd" (made as (nheads, total, headdim), transposed)."""
    lens: tuple
    h: int
    hkv: int
    d: int
    causal: bool = False
    scale: float = None
    extra_q: int = 0
    extra_k: int = 0
    used: tuple = None
    layout: str = "contig"

    @property
    def b(self):
        return len(self.lens)

    @property
    def max_q(self):
        return max([0] + [sq for sq, _ in self.lens])  # a list: torch 2.11's dynamo refuses max(genexpr, default=)

    @property
    def max_k(self):
        return max([0] + [sk for _, sk in self.lens])

    @property
    def total_q(self):
        return sum(sq for sq, _ in self.lens) + self.extra_q

    @property
    def total_k(self):
        return sum(sk for _, sk in self.lens) + self.extra_k

    @property
    def id(self):
        s = "_".join(f"{sq}x{sk}" for sq, sk in self.lens) + f"-h{self.h}/{self.hkv}-d{self.d}"
        if self.causal:
            s += "-causal"
        if self.scale is not None:
            s += f"-scale{self.scale:g}"
        if self.extra_q or self.extra_k:
            s += f"-extra{self.extra_q}_{self.extra_k}"
        if self.used is not None:
            s += "-used" + "_".join(map(str, self.used))
        if self.layout != "contig":
            s += f"-{self.layout}"
        return s

    def cfg(self, s):
        """The Cfg of sequence s as a dense batch of one (for fa_testing.variant_reference)."""
        sq, sk = self.lens[s]
        if self.used is not None:
            sk = min(sk, self.used[s])
        return Cfg(1, sq, sk, self.h, self.hkv, self.d, causal=self.causal, scale=self.scale)


# Length mixes: empty and one-token sequences, sq > sk and sq < sk, more than one CPU query tile (128)
# and key tile (64), GQA 2 / 3 / 2, strided layouts, rows and keys in no sequence.
MIXES = [
    Mix(((5, 5), (0, 3), (1, 1), (17, 9), (3, 20), (4, 0)), 4, 2, 16),
    Mix(((1, 7), (33, 33), (7, 1), (130, 70)), 6, 2, 8, causal=True, layout="slice"),
    Mix(((40, 65), (0, 0), (2, 1), (65, 130)), 4, 2, 32, causal=True, scale=0.4, extra_q=3, extra_k=5,
        layout="hsd"),
]
USED_MIX = Mix(((9, 20), (5, 5), (1, 70), (30, 12)), 4, 1, 16, causal=True, used=(13, 0, 70, 5), extra_k=2)

FEATURES = {
    "window": Var(window=(11, 5)),
    "softcap": Var(softcap=1.0),
    "alibi": Var(alibi="bh"),
    "sink": Var(sink=True),
    "dropout": Var(dropout=0.17),
}
EVERYTHING = Var(window=(11, 5), softcap=1.0, alibi="bh", sink=True, dropout=0.17)
VARIANTS = [Var()] + list(FEATURES.values()) + [
    Var(window=(9, -1)), Var(window=(-1, 4)), Var(window=(0, 0)), Var(alibi="h"),
    Var(window=(6, 2), sink=True, softcap=2.0), EVERYTHING,
]


# ----------------------------------------------------------------------------------------------
# Inputs, reference and checks
# ----------------------------------------------------------------------------------------------

def cu_seqlens(lengths, device):
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=device)


def make_varlen_inputs(mix, dtype, device, requires_grad=True, seed=0):
    """q (total_q, h, d), k, v (total_k, hkv, d) in mix.layout (views of leaves that require grad), dout,
    cu_seqlens_q, cu_seqlens_k, seqused_k (or None)."""
    gen = torch.Generator().manual_seed(seed)

    def rnd(total, heads):
        if mix.layout == "contig":
            t = torch.randn(total, heads, mix.d, generator=gen, dtype=torch.float64)
        elif mix.layout == "slice":
            t = torch.randn(total, heads, mix.d + 5, generator=gen, dtype=torch.float64)
        else:
            t = torch.randn(heads, total, mix.d, generator=gen, dtype=torch.float64)
        t = t.to(dtype=dtype, device=device).requires_grad_(requires_grad)
        if mix.layout == "slice":
            return t[..., 2:2 + mix.d]
        return t.transpose(0, 1) if mix.layout == "hsd" else t

    q, k, v = rnd(mix.total_q, mix.h), rnd(mix.total_k, mix.hkv), rnd(mix.total_k, mix.hkv)
    dout = torch.randn(mix.total_q, mix.h, mix.d, generator=gen, dtype=torch.float64).to(dtype=dtype, device=device)
    cu_q = cu_seqlens([sq for sq, _ in mix.lens], device)
    cu_k = cu_seqlens([sk for _, sk in mix.lens], device)
    used = None if mix.used is None else torch.tensor(mix.used, dtype=torch.int32, device=device)
    return q, k, v, dout, cu_q, cu_k, used


def make_varlen_variant_tensors(mix, var, dtype, device, requires_grad=True, seed=1):
    """alibi_slopes ((h,) or (b, h) float32) and sink ((h,) in the lse dtype, requiring grad) for var."""
    gen = torch.Generator().manual_seed(seed)
    t = {"alibi_slopes": None, "sink": None, "attn_mask": None}
    if var.alibi:
        shape = (mix.h,) if var.alibi == "h" else (mix.b, mix.h)
        t["alibi_slopes"] = (0.05 + 0.55 * torch.rand(shape, generator=gen)).to(device)
    if var.sink:
        sink = -1.0 + 4.0 * torch.rand(mix.h, generator=gen, dtype=torch.float64)
        t["sink"] = sink.to(device=device, dtype=expected_lse_dtype(dtype)).requires_grad_(requires_grad)
    return t


def grad_inputs(q, k, v, t):
    return [q, k, v] + ([t["sink"]] if t["sink"] is not None and t["sink"].requires_grad else [])


def grad_names(t):
    return ["dq", "dk", "dv"] + (["dsink"] if t["sink"] is not None and t["sink"].requires_grad else [])


def run_varlen(q, k, v, cu_q, cu_k, used, mix, var, t, **kw):
    return flashattn_ext.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, mix.max_q, mix.max_k, dropout_p=var.dropout, softmax_scale=mix.scale,
        causal=mix.causal, window_size=var.window, softcap=var.softcap, alibi_slopes=t["alibi_slopes"],
        seqused_k=used, sink=t["sink"], **kw)


def op_fwd_args(q, k, v, cu_q, cu_k, used, mix, var, t, deterministic=False):
    scale = mix.scale if mix.scale is not None else 1.0 / math.sqrt(mix.d)
    return (q, k, v, cu_q, cu_k, used, mix.max_q, mix.max_k, scale, mix.causal, var.window[0], var.window[1],
            float(var.softcap), t["alibi_slopes"], t["sink"], float(var.dropout), deterministic)


def op_bwd_args(dout, q, k, v, out, lse, rng_state, cu_q, cu_k, used, mix, var, t):
    fwd = op_fwd_args(q, k, v, cu_q, cu_k, used, mix, var, t)
    return (dout, q, k, v, out, lse, rng_state) + fwd[3:]


def keep_masks(q, mix, rng_state, dropout_p):
    """(b, h, max_q, max_k) keep mask: sequence s's [s, :, :sq, :sk] is the dense dropout of batch index s."""
    shape_q = q.new_empty((mix.b, mix.max_q, mix.h, 1))
    return torch.ops.flashattn_ext.dropout_mask(shape_q, rng_state, mix.max_k, dropout_p)


def replay_rng_state(q, k, v, cu_q, cu_k, used, mix, var, t, seed):
    """The rng_state a public call made right after torch.manual_seed(seed) draws."""
    torch.manual_seed(seed)
    detached = {n: (x.detach() if x is not None else None) for n, x in t.items()}
    with torch.no_grad():
        _, _, rng_state, _ = varlen_fwd_op(
            *op_fwd_args(q.detach(), k.detach(), v.detach(), cu_q, cu_k, used, mix, var, detached))
    return rng_state


def varlen_reference(q, k, v, dout, mix, var, t, keep=None):
    """float64 CPU results of fa_testing.variant_reference applied to each sequence (a batch of one),
    assembled in the varlen layout: out (total_q, h, d), lse (h, total_q), dq, dk, dv, dsink, each gradient
    with its error scale (the "_rw" entries). Rows in no sequence: out 0, lse -inf, gradients 0."""
    lse_dtype = torch.float64
    res = {
        "out": torch.zeros(mix.total_q, mix.h, mix.d, dtype=torch.float64),
        "lse": torch.full((mix.h, mix.total_q), -math.inf, dtype=lse_dtype),
        "dq": torch.zeros(mix.total_q, mix.h, mix.d, dtype=torch.float64),
        "dk": torch.zeros(mix.total_k, mix.hkv, mix.d, dtype=torch.float64),
        "dv": torch.zeros(mix.total_k, mix.hkv, mix.d, dtype=torch.float64),
        "dq_rw": torch.zeros(mix.total_q, mix.h, dtype=torch.float64),
        "dk_rw": torch.zeros(mix.total_k, mix.hkv, dtype=torch.float64),
        "dv_rw": torch.zeros(mix.total_k, mix.hkv, dtype=torch.float64),
    }
    sink = t["sink"]
    if sink is not None:
        res["dsink"] = torch.zeros(mix.h, dtype=torch.float64)
        res["dsink_rw"] = torch.zeros(mix.h, dtype=torch.float64)
    q0 = k0 = 0
    for s, (sq, sk_all) in enumerate(mix.lens):
        cfg = mix.cfg(s)
        sk = cfg.sk
        rows, keys = slice(q0, q0 + sq), slice(k0, k0 + sk)
        q0, k0 = q0 + sq, k0 + sk_all
        if sq == 0:
            continue
        if sk == 0:  # no key: out 0, lse -inf or the sink, every gradient 0
            if sink is not None:
                res["lse"][:, rows] = sink.detach().cpu().double()[:, None]
            continue
        slopes = t["alibi_slopes"]
        if slopes is not None and slopes.dim() == 2:
            slopes = slopes[s:s + 1]
        tensors = {"alibi_slopes": slopes, "sink": sink, "attn_mask": None}
        seq_keep = None if keep is None else keep[s:s + 1, :, :sq, :sk]
        ref = variant_reference(q[None, rows], k[None, keys], v[None, keys], dout[None, rows], cfg, var, tensors,
                                keep=seq_keep)
        res["out"][rows] = ref["out"][0]
        res["lse"][:, rows] = ref["lse"][0]
        for name, where in (("dq", rows), ("dk", keys), ("dv", keys)):
            res[name][where] = ref[name][0]
            res[name + "_rw"][where] = ref[name + "_rw"][0]
        if sink is not None:
            res["dsink"] += ref["dsink"]
            res["dsink_rw"] = (res["dsink_rw"] ** 2 + ref["dsink_rw"] ** 2).sqrt()
    return res


def outside_rows(mix):
    """bool masks of the rows of q and of k / v that belong to no sequence (or lie past seqused_k)."""
    q_out = torch.ones(mix.total_q, dtype=torch.bool)
    k_out = torch.ones(mix.total_k, dtype=torch.bool)
    q0 = k0 = 0
    for s, (sq, sk) in enumerate(mix.lens):
        q_out[q0:q0 + sq] = False
        k_out[k0:k0 + mix.cfg(s).sk] = False
        q0, k0 = q0 + sq, k0 + sk
    return q_out, k_out


def check_outside(mix, got):
    """Rows of q in no sequence: out 0, lse -inf, dq 0; keys in none (or past seqused_k): dk = dv = 0."""
    q_out, k_out = outside_rows(mix)
    q_out_d = q_out.to(got["out"].device)
    k_out_d = k_out.to(got["out"].device)
    assert (got["out"][q_out_d] == 0).all(), "out is not 0 on rows in no sequence"
    if got.get("lse") is not None:
        assert (got["lse"][:, q_out_d] == -math.inf).all(), "lse is not -inf on rows in no sequence"
    if "dq" in got:
        assert (got["dq"][q_out_d] == 0).all(), "dq is not 0 on rows in no sequence"
        assert (got["dk"][k_out_d] == 0).all() and (got["dv"][k_out_d] == 0).all(), \
            "dk / dv are not 0 on keys in no sequence"


def run_and_check(mix, var, device, dtype, **kw):
    """One call (kw: more flash_attn_varlen_func arguments) checked against the per-sequence reference;
    returns the inputs and the results."""
    q, k, v, dout, cu_q, cu_k, used = make_varlen_inputs(mix, dtype, device)
    t = make_varlen_variant_tensors(mix, var, dtype, device)
    keep = None
    if var.dropout:
        rng_state = replay_rng_state(q, k, v, cu_q, cu_k, used, mix, var, t, DROPOUT_SEED)
        keep = keep_masks(q, mix, rng_state, var.dropout)
    torch.manual_seed(DROPOUT_SEED)
    out, lse = run_varlen(q, k, v, cu_q, cu_k, used, mix, var, t, return_lse=True, **kw)
    assert out.shape == q.shape and out.dtype == dtype and out.device.type == device
    assert lse.shape == (mix.h, mix.total_q) and lse.dtype == expected_lse_dtype(dtype)
    got = dict(zip(grad_names(t), torch.autograd.grad(out, grad_inputs(q, k, v, t), dout)))
    got.update(out=out, lse=lse)
    for name, x in got.items():
        assert not torch.isnan(x).any(), f"NaN in {name}"
    if "dsink" in got:
        assert got["dsink"].dtype == t["sink"].dtype and got["dsink"].shape == t["sink"].shape
    check_outside(mix, got)
    ref = varlen_reference(q, k, v, dout, mix, var, t, keep=keep)
    check_variant_results(got, ref, dtype)
    return (q, k, v, dout, cu_q, cu_k, used, t), got


def varlen_params(variants, mixes, pairs=DEVICE_DTYPES):
    out = []
    for dev, dt in pairs:
        for mix in mixes:
            for var in variants:
                out.append(pytest.param(mix, var, dev, dt, id=f"{dev}-{DTYPE_NAMES[dt]}-{mix.id}-{var.id}",
                                        marks=CUDA_MARKS if dev == "cuda" else []))
    return out


# ----------------------------------------------------------------------------------------------
# Every variant against the per-sequence reference
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mix, var, device, dtype", varlen_params(VARIANTS, MIXES))
def test_varlen_variant(mix, var, device, dtype):
    run_and_check(mix, var, device, dtype)


# Sequences of several query tiles (64 rows) and key tiles (128 keys) of the CUDA kernels, seqlen_q above and
# below seqlen_k, one token, none: the chains of ordered dQ additions of the Hopper backward in deterministic
# mode start, end and skip where the band and each sequence's lengths say.
DET_MIXES = [
    Mix(((300, 300), (1, 200), (129, 513), (513, 129), (0, 50), (64, 64)), 4, 2, 128, causal=True),
    Mix(((257, 700), (700, 257), (5, 5)), 2, 2, 64),
]


@pytest.mark.parametrize("mix, var, device, dtype",
                         varlen_params([Var(), Var(window=(100, 30)), Var(window=(-1, 0), sink=True)], DET_MIXES,
                                       pairs=[("cpu", torch.float32), ("cuda", torch.bfloat16),
                                              ("cuda", torch.float16)]))
def test_varlen_deterministic(mix, var, device, dtype):
    """deterministic=True: the per-sequence reference, and dq, dk, dv bitwise identical over runs."""
    (q, k, v, dout, cu_q, cu_k, used, t), first = run_and_check(mix, var, device, dtype, deterministic=True)
    for _ in range(3):
        torch.manual_seed(DROPOUT_SEED)
        out = run_varlen(q, k, v, cu_q, cu_k, used, mix, var, t, deterministic=True)
        grads = torch.autograd.grad(out, grad_inputs(q, k, v, t), dout)
        for name, g in zip(grad_names(t), grads):
            assert torch.equal(g, first[name]), f"{name} not bitwise reproducible with deterministic=True"


@pytest.mark.parametrize("var", [Var(), Var(window=(4, 3)), Var(sink=True, alibi="h"), Var(dropout=0.3)],
                         ids=lambda v: v.id)
@pytest.mark.parametrize("device, dtype", device_dtype_params())
def test_varlen_seqused_k(device, dtype, var):
    """seqused_k: sequence s attends to its first seqused_k[s] keys only (0: none); the other keys get
    dk = dv = 0."""
    run_and_check(USED_MIX, var, device, dtype)


@pytest.mark.parametrize("device, dtype", device_dtype_params())
def test_varlen_max_seqlen_above_the_longest(device, dtype):
    """max_seqlen larger than every sequence (the grid is larger than needed): same results."""
    mix = MIXES[0]
    q, k, v, dout, cu_q, cu_k, _ = make_varlen_inputs(mix, dtype, device)
    var = Var(window=(3, 2), sink=True)
    t = make_varlen_variant_tensors(mix, var, dtype, device)
    out, lse = flashattn_ext.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mix.max_q + 70, mix.max_k + 129,
                                                    window_size=var.window, sink=t["sink"], return_lse=True)
    got = dict(zip(grad_names(t), torch.autograd.grad(out, grad_inputs(q, k, v, t), dout)))
    got.update(out=out, lse=lse)
    check_variant_results(got, varlen_reference(q, k, v, dout, mix, var, t), dtype)


@pytest.mark.parametrize("device, dtype", device_dtype_params())
def test_varlen_no_tokens(device, dtype):
    """A batch whose sequences are all empty (total_q = total_k = 0): empty results and gradients."""
    q = torch.randn(0, 2, 8, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(0, 1, 8, device=device, dtype=dtype, requires_grad=True)
    cu = torch.zeros(4, dtype=torch.int32, device=device)
    out, lse = flashattn_ext.flash_attn_varlen_func(q, k, k, cu, cu, 0, 0, causal=True, return_lse=True)
    assert out.shape == (0, 2, 8) and lse.shape == (2, 0)
    dq, dk = torch.autograd.grad(out, (q, k), torch.randn_like(out))
    assert dq.shape == q.shape and dk.shape == k.shape


# ----------------------------------------------------------------------------------------------
# The dense op at batch index s, with the varlen call's rng_state
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("var", [Var(), Var(window=(5, 2), alibi="bh"),
                                 Var(dropout=0.25, sink=True), Var(dropout=0.4, softcap=2.0, window=(7, -1))],
                         ids=lambda v: v.id)
@pytest.mark.parametrize("device, dtype", device_dtype_params([("cpu", torch.float64), ("cuda", torch.float32)]))
def test_varlen_equals_dense_at_batch_index(device, dtype, var):
    """Sequence s of a varlen call equals the dense op on the sequence: out and lse of flash_attn_func
    (without dropout) or the dense bwd at batch index s with the varlen call's rng_state (with dropout,
    which then sees the same Philox stream: counter b * h + hq with b = s) for dq, dk, dv."""
    mix = MIXES[1]
    q, k, v, dout, cu_q, cu_k, used = make_varlen_inputs(mix, dtype, device)
    t = make_varlen_variant_tensors(mix, var, dtype, device)
    torch.manual_seed(DROPOUT_SEED)
    out, lse, rng_state, _ = varlen_fwd_op(*op_fwd_args(q, k, v, cu_q, cu_k, used, mix, var, t))
    dq, dk, dv, _ = varlen_bwd_op(
        *op_bwd_args(dout, q, k, v, out, lse, rng_state, cu_q, cu_k, used, mix, var, t))
    scale = mix.scale if mix.scale is not None else 1.0 / math.sqrt(mix.d)
    tol = OUT_TOL[dtype]
    q0 = k0 = 0
    for s, (sq, sk) in enumerate(mix.lens):
        rows, keys = slice(q0, q0 + sq), slice(k0, k0 + sk)
        q0, k0 = q0 + sq, k0 + sk
        if sq == 0 or sk == 0:
            continue
        slopes = t["alibi_slopes"]
        if slopes is not None and slopes.dim() == 2:  # sequence s at batch index s of a dense batch of s + 1
            slopes = slopes[:s + 1]

        def dense(x, where):  # (s + 1, n, heads, d): the sequence at every batch index
            return x[where][None].expand(s + 1, *x[where].shape).contiguous()

        args = (dense(q, rows), dense(k, keys), dense(v, keys), scale, mix.causal, True, var.window[0],
                var.window[1], float(var.softcap), slopes, t["sink"], None, float(var.dropout), False)
        if not var.dropout:
            d_out, d_lse, _, _ = torch.ops.flashattn_ext.fwd(*args)
            assert_close(f"out of sequence {s}", out[rows], d_out[s], tol)
            assert_lse_close(lse[:, rows], d_lse[s], tol)
        d_lse = lse[:, rows][None].expand(s + 1, mix.h, sq).contiguous()
        ddq, ddk, ddv, _, _ = torch.ops.flashattn_ext.bwd(dense(dout, rows), *args[:3], dense(out, rows), d_lse,
                                                         rng_state, *args[3:], False)
        naturals = natural_grad_norms(q[rows], k[keys], v[keys], dout[rows], scale)
        for name, a, b, nat in zip(("dq", "dk", "dv"), (dq[rows], dk[keys], dv[keys]), (ddq[s], ddk[s], ddv[s]),
                                   naturals):
            assert_close(f"{name} of sequence {s}", a, b, grad_tol(dtype), natural=nat)


# ----------------------------------------------------------------------------------------------
# return_attn_probs
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("var", [Var(dropout=0.2), Var(dropout=0.5, window=(6, 3), sink=True, alibi="bh"), Var()],
                         ids=lambda v: v.id)
@pytest.mark.parametrize("device, dtype", device_dtype_params())
def test_varlen_return_attn_probs(device, dtype, var):
    """S_dmask (b, h, max_seqlen_q, max_seqlen_k) in the lse dtype: in [s, :, :sq, :sk] the probabilities of
    sequence s, negated where dropout dropped them (the keep mask of the dense stream at batch index s),
    zeros elsewhere; the call's gradients match the reference built from that sign."""
    mix = MIXES[2]
    q, k, v, dout, cu_q, cu_k, used = make_varlen_inputs(mix, dtype, device)
    t = make_varlen_variant_tensors(mix, var, dtype, device)
    rng_state = replay_rng_state(q, k, v, cu_q, cu_k, used, mix, var, t, DROPOUT_SEED)
    torch.manual_seed(DROPOUT_SEED)
    out, lse, s_dmask = run_varlen(q, k, v, cu_q, cu_k, used, mix, var, t, return_attn_probs=True)
    assert s_dmask.shape == (mix.b, mix.h, mix.max_q, mix.max_k) and s_dmask.dtype == expected_lse_dtype(dtype)
    keep = ~torch.signbit(s_dmask)
    if var.dropout:
        want = keep_masks(q, mix, rng_state, var.dropout)
    else:
        want = torch.ones_like(keep)
    eye = torch.eye(mix.max_k, dtype=torch.float64)
    q0 = k0 = 0
    for s, (sq, sk) in enumerate(mix.lens):
        seq = s_dmask[s].detach().cpu()
        assert (seq[:, sq:] == 0).all() and (seq[:, :, sk:] == 0).all(), f"S_dmask of sequence {s} outside it"
        if sq and sk:
            assert torch.equal(keep[s, :, :sq, :sk], want[s, :, :sq, :sk]), f"dropout mask of sequence {s}"
            # P of the sequence: the reference's output for v = the identity over its keys
            cfg = mix.cfg(s)
            slopes = t["alibi_slopes"]
            slopes = slopes[s:s + 1] if slopes is not None and slopes.dim() == 2 else slopes
            ident = eye[:sk, :sk][None, :, None, :].expand(1, sk, mix.hkv, sk)
            p = variant_reference(q[None, q0:q0 + sq], k[None, k0:k0 + sk], ident, None, cfg,
                                  dataclasses.replace(var, dropout=0.0),
                                  {"alibi_slopes": slopes, "sink": t["sink"], "attn_mask": None})["out"]
            assert_close(f"|S_dmask| of sequence {s}", seq[:, :sq, :sk].abs(), p[0].transpose(0, 1), OUT_TOL[dtype])
        q0, k0 = q0 + sq, k0 + sk
    got = dict(zip(grad_names(t), torch.autograd.grad(out, grad_inputs(q, k, v, t), dout)))
    got.update(out=out, lse=lse)
    check_variant_results(got, varlen_reference(q, k, v, dout, mix, var, t, keep=keep), dtype)


# ----------------------------------------------------------------------------------------------
# Packed functions
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device, dtype", device_dtype_params())
def test_varlen_qkvpacked(device, dtype):
    """qkv (total, 3, h, d) with one cu_seqlens: out and the gradient of qkv (one tensor of its shape)
    against the reference of the unbound q, k, v."""
    mix = Mix(((7, 7), (0, 0), (1, 1), (40, 40)), 4, 4, 16, causal=True)
    var = Var(window=(9, 0), sink=True)
    gen = torch.Generator().manual_seed(3)
    qkv = torch.randn(mix.total_q, 3, mix.h, mix.d, generator=gen, dtype=torch.float64).to(dtype=dtype, device=device)
    qkv.requires_grad_()
    dout = torch.randn(mix.total_q, mix.h, mix.d, generator=gen, dtype=torch.float64).to(dtype=dtype, device=device)
    t = make_varlen_variant_tensors(mix, var, dtype, device)
    cu = cu_seqlens([sq for sq, _ in mix.lens], device)
    out, lse = flashattn_ext.flash_attn_varlen_qkvpacked_func(qkv, cu, mix.max_q, causal=True, window_size=var.window,
                                                              sink=t["sink"], return_lse=True)
    dqkv, dsink = torch.autograd.grad(out, (qkv, t["sink"]), dout)
    assert dqkv.shape == qkv.shape
    q, k, v = qkv.unbind(1)
    got = {"out": out, "lse": lse, "dq": dqkv[:, 0], "dk": dqkv[:, 1], "dv": dqkv[:, 2], "dsink": dsink}
    check_variant_results(got, varlen_reference(q, k, v, dout, mix, var, t), dtype)


@pytest.mark.parametrize("device, dtype", device_dtype_params())
def test_varlen_kvpacked(device, dtype):
    """q (total_q, h, d) with kv (total_k, 2, hkv, d), GQA, seqused_k: the gradient of kv is one tensor."""
    mix = USED_MIX
    var = Var(alibi="h", softcap=3.0)
    q, _, _, dout, cu_q, cu_k, used = make_varlen_inputs(mix, dtype, device)
    gen = torch.Generator().manual_seed(4)
    kv = torch.randn(mix.total_k, 2, mix.hkv, mix.d, generator=gen, dtype=torch.float64).to(dtype=dtype, device=device)
    kv.requires_grad_()
    t = make_varlen_variant_tensors(mix, var, dtype, device)
    out = flashattn_ext.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, mix.max_q, mix.max_k, 0.0, None, True,
                                                        softcap=var.softcap, alibi_slopes=t["alibi_slopes"],
                                                        seqused_k=used)
    dq, dkv = torch.autograd.grad(out, (q, kv), dout)
    assert dkv.shape == kv.shape
    k, v = kv.unbind(1)
    got = {"out": out, "dq": dq, "dk": dkv[:, 0], "dv": dkv[:, 1]}
    check_variant_results(got, varlen_reference(q, k, v, dout, mix, var, t), dtype)


@pytest.mark.parametrize("device, dtype", device_dtype_params())
def test_dense_packed(device, dtype):
    """flash_attn_qkvpacked_func / flash_attn_kvpacked_func: the same results as flash_attn_func on the
    unbound views, gradients in one tensor of the packed shape."""
    gen = torch.Generator().manual_seed(5)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype=dtype, device=device).requires_grad_()

    qkv = rnd(2, 37, 3, 4, 16)
    q = rnd(2, 21, 6, 16)
    kv = rnd(2, 37, 2, 2, 16)
    sink = torch.randn(4, generator=gen, dtype=torch.float64).to(device=device, dtype=expected_lse_dtype(dtype))
    for packed, inputs, unpacked, kw in (
        (flashattn_ext.flash_attn_qkvpacked_func, (qkv,), qkv.unbind(2), dict(causal=True, sink=sink)),
        (flashattn_ext.flash_attn_kvpacked_func, (q, kv), (q,) + kv.unbind(2), dict(window_size=(5, 3))),
    ):
        out, lse = packed(*inputs, return_lse=True, **kw)
        ref, ref_lse = flashattn_ext.flash_attn_func(*unpacked, return_lse=True, **kw)
        dout = torch.randn_like(out)
        grads = torch.autograd.grad(out, inputs, dout)
        ref_grads = torch.autograd.grad(ref, inputs, dout)
        assert_close("out", out, ref, OUT_TOL[dtype])
        assert_close("lse", lse, ref_lse, OUT_TOL[dtype])
        for g, rg, x in zip(grads, ref_grads, inputs):
            assert g.shape == x.shape
            assert_close("packed gradient", g, rg, grad_tol(dtype))


# ----------------------------------------------------------------------------------------------
# The reference module
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mix", MIXES + [USED_MIX], ids=lambda m: m.id)
def test_reference_module_varlen(mix):
    """flashattn_ext.reference.attention_varlen_ref (float64) with every variant at once against the
    per-sequence fa_testing reference: out, lse, dq, dk, dv, d sink."""
    var = EVERYTHING
    q, k, v, dout, cu_q, cu_k, used = make_varlen_inputs(mix, torch.float64, "cpu")
    t = make_varlen_variant_tensors(mix, var, torch.float64, "cpu")
    keep = torch.rand(mix.b, mix.h, mix.max_q, mix.max_k) < keep_probability(var.dropout)
    out, lse = attention_varlen_ref(q, k, v, cu_q, cu_k, mix.max_q, mix.max_k, mix.scale, mix.causal, var.window,
                                    var.softcap, t["alibi_slopes"], t["sink"], var.dropout, keep, used)
    got = dict(zip(grad_names(t), torch.autograd.grad(out, grad_inputs(q, k, v, t), dout)))
    got.update(out=out, lse=lse)
    check_outside(mix, got)
    check_variant_results(got, varlen_reference(q, k, v, dout, mix, var, t, keep=keep), torch.float64)


def test_varlen_sequences_clamps():
    """varlen_sequences reads cu_seqlens as the kernels do: starts clamped to the rows, lengths to the
    rows and to max_seqlen, seqused_k to the sequence's keys."""
    cu_q = torch.tensor([0, 4, 2, 9, 30], dtype=torch.int32)
    cu_k = torch.tensor([-3, 5, 5, 8, 8], dtype=torch.int32)
    used = torch.tensor([2, 7, -1, 0], dtype=torch.int32)
    got = varlen_sequences(cu_q, cu_k, used, max_seqlen_q=6, max_seqlen_k=4, total_q=12, total_k=8)
    assert got == [(0, 4, 0, 2), (4, 0, 5, 0), (2, 6, 5, 0), (9, 3, 8, 0)]


# ----------------------------------------------------------------------------------------------
# gradcheck, torch.compile, opcheck
# ----------------------------------------------------------------------------------------------

GRADCHECK_MIX = Mix(((2, 3), (0, 2), (3, 1), (1, 0)), 2, 1, 3, causal=True, extra_q=1, extra_k=1)
GRADCHECK_VARIANTS = [Var(), Var(window=(1, 0), softcap=0.8, alibi="bh", sink=True, dropout=0.3)]


@pytest.fixture
def one_thread():
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def varlen_fn(mix, var, t, cu_q, cu_k, used, seed=DROPOUT_SEED):
    """out as a function of (q, k, v[, sink]); with a seed, torch.manual_seed(seed) before every call."""
    def fn(q, k, v, *rest):
        tensors = dict(t, sink=rest[0] if rest else t["sink"])
        if seed is not None:
            torch.manual_seed(seed)
        return run_varlen(q, k, v, cu_q, cu_k, used, mix, var, tensors)
    return fn


@pytest.mark.parametrize("var", GRADCHECK_VARIANTS, ids=lambda v: v.id)
@pytest.mark.parametrize("device", DEVICES)
def test_varlen_gradcheck(device, var, one_thread):
    mix = GRADCHECK_MIX
    q, k, v, _, cu_q, cu_k, used = make_varlen_inputs(mix, torch.float64, device, requires_grad=False)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    t = make_varlen_variant_tensors(mix, var, torch.float64, device)
    assert torch.autograd.gradcheck(varlen_fn(mix, var, t, cu_q, cu_k, used), tuple(grad_inputs(*leaves, t)))


@pytest.mark.parametrize("var", [Var(), EVERYTHING], ids=lambda v: v.id)
@pytest.mark.parametrize("device, dtype", device_dtype_params([("cpu", torch.float32), ("cuda", torch.bfloat16)]))
def test_varlen_compile(device, dtype, var):
    """torch.compile(fullgraph=True, aot_eager) traces flash_attn_varlen_func (max_seqlen as Python ints)
    forward and backward; compiled matches eager (same dropout seed)."""
    mix = MIXES[0]
    q, k, v, dout, cu_q, cu_k, used = make_varlen_inputs(mix, dtype, device)
    t = make_varlen_variant_tensors(mix, var, dtype, device)
    inputs = grad_inputs(q, k, v, t)
    fn = varlen_fn(mix, var, t, cu_q, cu_k, used, seed=None)
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    compiled(*inputs)
    torch.manual_seed(DROPOUT_SEED)
    c_out = compiled(*inputs)
    c_grads = torch.autograd.grad(c_out, inputs, dout)
    torch.manual_seed(DROPOUT_SEED)
    e_out = fn(*inputs)
    e_grads = torch.autograd.grad(e_out, inputs, dout)
    assert_close("out (compiled vs eager)", c_out, e_out, OUT_TOL[dtype])
    for name, c, e in zip(grad_names(t), c_grads, e_grads):
        assert_close(f"{name} (compiled vs eager)", c, e, grad_tol(dtype))


@pytest.mark.parametrize("device, dtype", device_dtype_params([("cpu", torch.float32), ("cuda", torch.bfloat16)]))
def test_varlen_compile_dynamic(device, dtype):
    """dynamic=True: the fake kernels' shape checks hold for symbolic totals and max_seqlen; three batches
    of the same size through one compiled function."""
    var = Var(window=(7, 3), sink=True, softcap=2.0)

    def fn(q, k, v, cu_q, cu_k, max_q, max_k, sink):
        return flashattn_ext.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True,
                                                    window_size=var.window, softcap=var.softcap, sink=sink)

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager", dynamic=True)
    for lens in (((5, 9), (12, 3), (1, 1)), ((20, 20), (0, 4), (7, 2)), ((3, 30), (9, 9), (2, 0))):
        mix = Mix(lens, 4, 2, 16, causal=True)
        q, k, v, dout, cu_q, cu_k, _ = make_varlen_inputs(mix, dtype, device)
        t = make_varlen_variant_tensors(mix, var, dtype, device)
        out = compiled(q, k, v, cu_q, cu_k, mix.max_q, mix.max_k, t["sink"])
        inputs = grad_inputs(q, k, v, t)
        got = dict(zip(grad_names(t), torch.autograd.grad(out, inputs, dout)))
        got["out"] = out
        check_variant_results(got, varlen_reference(q, k, v, dout, mix, var, t), dtype)


OPCHECK_VARIANTS = [Var(), Var(window=(3, 1), softcap=1.5, alibi="bh", sink=True), Var(dropout=0.3, alibi="h")]
OPCHECK_MIXES = [Mix(((3, 5), (0, 2), (4, 1)), 4, 2, 8, causal=True, layout="slice"),
                 Mix(((6, 2), (1, 4)), 2, 2, 8, used=(1, 3), extra_q=1, extra_k=2)]


@pytest.mark.parametrize("mix", OPCHECK_MIXES, ids=lambda m: m.id)
@pytest.mark.parametrize("var", OPCHECK_VARIANTS, ids=lambda v: v.id)
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_varlen_fwd(device, var, mix):
    q, k, v, _, cu_q, cu_k, used = make_varlen_inputs(mix, torch.float64, device)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    t = make_varlen_variant_tensors(mix, var, torch.float64, device)
    opcheck_call(VARLEN_FWD_ARGS, op_fwd_args(*leaves, cu_q, cu_k, used, mix, var, t))


@pytest.mark.parametrize("mix", OPCHECK_MIXES, ids=lambda m: m.id)
@pytest.mark.parametrize("var", OPCHECK_VARIANTS, ids=lambda v: v.id)
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_varlen_bwd(device, var, mix):
    q, k, v, dout, cu_q, cu_k, used = make_varlen_inputs(mix, torch.float64, device, requires_grad=False)
    t = make_varlen_variant_tensors(mix, var, torch.float64, device, requires_grad=False)
    out, lse, rng_state, _ = varlen_fwd_op(*op_fwd_args(q, k, v, cu_q, cu_k, used, mix, var, t))
    args = op_bwd_args(dout, q, k, v, out, lse, rng_state, cu_q, cu_k, used, mix, var, t)
    opcheck_call(VARLEN_BWD_ARGS, args)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_varlen_no_host_sync():
    """The forward and backward of flash_attn_varlen_func (with sink, ALiBi, seqused_k, dropout) never
    synchronize with the device."""
    mix = USED_MIX
    var = Var(sink=True, alibi="bh", dropout=0.1, window=(8, 2))
    q, k, v, dout, cu_q, cu_k, used = make_varlen_inputs(mix, torch.bfloat16, "cuda")
    t = make_varlen_variant_tensors(mix, var, torch.bfloat16, "cuda")
    run_varlen(q, k, v, cu_q, cu_k, used, mix, var, t)  # warm-up (lazy initialization may synchronize)
    with no_host_sync():
        out = run_varlen(q, k, v, cu_q, cu_k, used, mix, var, t)
        torch.autograd.grad(out, grad_inputs(q, k, v, t), dout)


# ----------------------------------------------------------------------------------------------
# Bad inputs
# ----------------------------------------------------------------------------------------------

def bad_call(**changes):
    """flash_attn_varlen_func on a small valid batch with some arguments replaced."""
    q = torch.randn(7, 4, 8)
    k = torch.randn(9, 2, 8)
    args = dict(q=q, k=k, v=k, cu_seqlens_q=torch.tensor([0, 3, 7], dtype=torch.int32),
                cu_seqlens_k=torch.tensor([0, 4, 9], dtype=torch.int32), max_seqlen_q=4, max_seqlen_k=5)
    args.update(changes)
    return flashattn_ext.flash_attn_varlen_func(**args)


BAD_INPUTS = [
    ("cu_seqlens_q int64", dict(cu_seqlens_q=torch.tensor([0, 3, 7])), TypeError, ["cu_seqlens_q", "int32"]),
    ("cu_seqlens_k float", dict(cu_seqlens_k=torch.tensor([0.0, 4.0, 9.0])), TypeError, ["cu_seqlens_k", "int32"]),
    ("cu_seqlens_q 2-D", dict(cu_seqlens_q=torch.tensor([[0, 3, 7]], dtype=torch.int32)), ValueError,
     ["cu_seqlens_q", "1-D"]),
    ("cu_seqlens_k 0-D", dict(cu_seqlens_k=torch.tensor(0, dtype=torch.int32)), ValueError, ["cu_seqlens_k", "1-D"]),
    ("cu_seqlens lengths differ", dict(cu_seqlens_k=torch.tensor([0, 9], dtype=torch.int32)), ValueError,
     ["cu_seqlens_q", "cu_seqlens_k", "same length"]),
    ("batch 0", dict(cu_seqlens_q=torch.zeros(1, dtype=torch.int32), cu_seqlens_k=torch.zeros(1, dtype=torch.int32)),
     ValueError, ["cu_seqlens_q", ">= 2"]),
    ("cu_seqlens not a tensor", dict(cu_seqlens_q=[0, 3, 7]), TypeError, ["cu_seqlens_q"]),
    ("q 4-D", dict(q=torch.randn(1, 7, 4, 8)), ValueError, [r"\bq\b", "3 dimensions"]),
    ("k 2-D", dict(k=torch.randn(9, 8)), ValueError, [r"\bk\b", "3 dimensions"]),
    ("v not a tensor", dict(v=None), TypeError, [r"\bv\b"]),
    ("max_seqlen_q tensor", dict(max_seqlen_q=torch.tensor(4)), TypeError, ["max_seqlen_q", "int"]),
    ("max_seqlen_k float", dict(max_seqlen_k=5.0), TypeError, ["max_seqlen_k", "int"]),
    ("max_seqlen_k negative", dict(max_seqlen_k=-1), ValueError, ["max_seqlen_k"]),
    ("seqused_k int64", dict(seqused_k=torch.tensor([1, 2])), TypeError, ["seqused_k", "int32"]),
    ("seqused_k length", dict(seqused_k=torch.tensor([1, 2, 3], dtype=torch.int32)), ValueError,
     ["seqused_k", "batch"]),
    ("sink and s_aux", dict(sink=torch.zeros(4), s_aux=torch.zeros(4)), ValueError, ["sink", "s_aux"]),
    ("sink shape", dict(sink=torch.zeros(2)), ValueError, ["sink", "nheads"]),
    ("alibi shape", dict(alibi_slopes=torch.zeros(3, 4)), ValueError, ["alibi_slopes"]),
    ("alibi dtype", dict(alibi_slopes=torch.zeros(4, dtype=torch.float64)), TypeError, ["alibi_slopes", "float32"]),
    ("window", dict(window_size=(2,)), TypeError, ["window_size"]),
    ("dropout_p", dict(dropout_p=1.5), ValueError, ["dropout_p"]),
    ("softcap", dict(softcap=-1.0), ValueError, ["softcap"]),
]


def mentions(*words):
    return "".join(f"(?=[\\s\\S]*{w})" for w in words)


@pytest.mark.parametrize("changes, exc, words", [pytest.param(c, e, w, id=i) for i, c, e, w in BAD_INPUTS])
def test_varlen_bad_inputs(changes, exc, words):
    with pytest.raises(exc, match=mentions(*words)):
        bad_call(**changes)


def test_varlen_packed_bad_shapes():
    cu = torch.tensor([0, 3], dtype=torch.int32)
    with pytest.raises(ValueError, match=mentions("qkv", "3")):
        flashattn_ext.flash_attn_varlen_qkvpacked_func(torch.randn(3, 2, 4, 8), cu, 3)
    with pytest.raises(ValueError, match=mentions(r"\bkv\b", "2")):
        flashattn_ext.flash_attn_varlen_kvpacked_func(torch.randn(3, 4, 8), torch.randn(3, 4, 8), cu, cu, 3, 3)
    with pytest.raises(ValueError, match=mentions("qkv")):
        flashattn_ext.flash_attn_qkvpacked_func(torch.randn(1, 3, 2, 4, 8))
    with pytest.raises(ValueError, match=mentions(r"\bkv\b")):
        flashattn_ext.flash_attn_kvpacked_func(torch.randn(1, 3, 4, 8), torch.randn(1, 3, 4, 8))


OP_BAD_INPUTS = [
    ("q 4-D", dict(q=torch.randn(1, 7, 4, 8)), "q"),
    ("k heads", dict(k=torch.randn(9, 3, 8), v=torch.randn(9, 3, 8)), "nheads"),
    ("v total", dict(v=torch.randn(8, 2, 8)), "v"),
    ("cu_seqlens_q int64", dict(cu_seqlens_q=torch.tensor([0, 3, 7])), "cu_seqlens_q"),
    ("cu_seqlens_k 2-D", dict(cu_seqlens_k=torch.tensor([[0, 4, 9]], dtype=torch.int32)), "cu_seqlens_k"),
    ("cu_seqlens lengths", dict(cu_seqlens_k=torch.tensor([0, 9], dtype=torch.int32)), "cu_seqlens"),
    ("batch 0", dict(cu_seqlens_q=torch.zeros(1, dtype=torch.int32), cu_seqlens_k=torch.zeros(1, dtype=torch.int32)),
     "cu_seqlens_q"),
    ("seqused_k length", dict(seqused_k=torch.tensor([1], dtype=torch.int32)), "seqused_k"),
    ("seqused_k int64", dict(seqused_k=torch.tensor([1, 2])), "seqused_k"),
    ("max_seqlen_q negative", dict(max_seqlen_q=-1), "max_seqlen_q"),
    ("alibi shape", dict(alibi_slopes=torch.zeros(3, 4)), "alibi_slopes"),
    ("sink shape", dict(sink=torch.zeros(2)), "sink"),
    ("dropout_p", dict(dropout_p=1.5), "dropout_p"),
]


@pytest.mark.parametrize("changes, word", [pytest.param(c, w, id=i) for i, c, w in OP_BAD_INPUTS])
def test_varlen_op_bad_inputs(changes, word):
    """The op itself (no Python checks in front) rejects bad inputs with a RuntimeError naming them."""
    args = dict(q=torch.randn(7, 4, 8), k=torch.randn(9, 2, 8), v=torch.randn(9, 2, 8),
                cu_seqlens_q=torch.tensor([0, 3, 7], dtype=torch.int32),
                cu_seqlens_k=torch.tensor([0, 4, 9], dtype=torch.int32), seqused_k=None, max_seqlen_q=4,
                max_seqlen_k=5, softmax_scale=0.3, causal=False, window_left=-1, window_right=-1, softcap=0.0,
                alibi_slopes=None, sink=None, dropout_p=0.0, deterministic=False)
    args.update(changes)
    with pytest.raises(RuntimeError, match=word):
        varlen_fwd_op(*args.values())


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_varlen_bad_devices():
    q = torch.randn(7, 4, 8, device="cuda")
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    with pytest.raises(ValueError, match=mentions("cu_seqlens_q", "device")):
        flashattn_ext.flash_attn_varlen_func(q, q, q, cu, cu.cuda(), 4, 4)
    with pytest.raises(ValueError, match=mentions("cu_seqlens_k", "device")):
        flashattn_ext.flash_attn_varlen_func(q, q, q, cu.cuda(), cu, 4, 4)
    with pytest.raises(ValueError, match=mentions("seqused_k", "device")):
        flashattn_ext.flash_attn_varlen_func(q, q, q, cu.cuda(), cu.cuda(), 4, 4,
                                             seqused_k=torch.tensor([1, 2], dtype=torch.int32))
    with pytest.raises(RuntimeError, match="cu_seqlens_q"):
        varlen_fwd_op(q, q, q, cu, cu.cuda(), None, 4, 4, 0.3, False, -1, -1, 0.0, None, None,
                                           0.0, False)
