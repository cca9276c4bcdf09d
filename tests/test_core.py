"""flashattn_ext._core, the op contract: each wrapper calls its op with the schema's arguments in the schema's
order, and no other module of the package calls the ops."""
import ast
import math
import inspect
import pathlib
import re

import pytest
import torch

import flashattn_ext
from flashattn_ext import _core

PACKAGE = pathlib.Path(flashattn_ext.__file__).parent
OPS = ("fwd", "bwd", "dropout_mask", "kv_append")


def _op_call(fn_name):
    """The op that _core.<fn_name> calls and the positional argument names it passes: either one call
    torch.ops.flashattn_ext.<op>(a, b, ...), or the op's .default given to _dispatch beside `args = (a, b, ...)`."""
    tree = ast.parse((PACKAGE / "_core.py").read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == fn_name)
    calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and ast.unparse(n.func).startswith("torch.ops.")]
    if calls:
        assert len(calls) == 1 and not calls[0].keywords
        return ast.unparse(calls[0].func), [ast.unparse(a) for a in calls[0].args]
    runs = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and ast.unparse(n.func) == "_dispatch"]
    assigns = [n for n in ast.walk(fn) if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "args"]
    assert len(runs) == 1 and len(assigns) == 1 and ast.unparse(runs[0].args[3]) == "args"
    op = ast.unparse(runs[0].args[0])
    assert op.endswith(".default")
    return op[:-len(".default")], [ast.unparse(a) for a in assigns[0].value.elts]


@pytest.mark.parametrize("op", OPS)
def test_wrapper_follows_schema(op):
    schema = [a.name for a in getattr(torch.ops.flashattn_ext, op).default._schema.arguments]
    assert list(getattr(_core, f"{op.upper()}_ARGS")) == schema
    params = inspect.signature(getattr(_core, op)).parameters.values()
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params)
    assert sorted(p.name for p in params) == sorted(schema)
    assert _op_call(op) == (f"torch.ops.flashattn_ext.{op}", schema)


def test_only_core_calls_the_ops():
    call = re.compile(r"torch\.ops\.flashattn_ext\.\w+(\.default)?\(")
    callers = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                     if p.name != "_core.py" and call.search(p.read_text()))
    assert callers == []


def test_eager_graph_through_the_recorder():
    """Eager calls that record a graph take _core._FwdRecorder (no per-call filling of the schema's defaults by
    torch's register_autograd wrapper); its gradients are the registered formula's, bit for bit."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 5, 3, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    dout = torch.randn(2, 5, 3, 8, dtype=torch.float64)
    out, lse, _ = _core.fwd(q=q, k=k, v=v, softmax_scale=0.3, causal=True)
    assert "_FwdRecorder" in type(out.grad_fn).__name__
    ref_out, ref_lse = torch.ops.flashattn_ext.fwd.default(q, k, v, 0.3, True)[:2]  # the op's registered autograd
    assert "_FwdRecorder" not in type(ref_out.grad_fn).__name__
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    got = torch.autograd.grad((out * dout).sum() + lse.sum(), (q, k, v))
    ref = torch.autograd.grad((ref_out * dout).sum() + ref_lse.sum(), (q, k, v))
    assert all(torch.equal(a, b) for a, b in zip(got, ref))
    with torch.no_grad():
        assert _core.fwd(q=q, k=k, v=v, softmax_scale=0.3)[0].grad_fn is None


def _qkv(requires_grad=False, dtype=torch.float64):
    torch.manual_seed(1)
    return [torch.randn(2, 7, 4, 8, dtype=dtype, requires_grad=requires_grad) for _ in range(3)]


def test_calls_that_record_nothing_match_the_registered_autograd():
    """Without a graph to record, _core calls the ops straight below autograd (no Python wrapper per call): the
    same outputs, bit for bit, as the op through its registered autograd, and none of them has a grad_fn."""
    q, k, v = _qkv()
    ref = torch.ops.flashattn_ext.fwd.default(q, k, v, 0.3, True)[:3]
    for grad in (False, True):  # grad mode on, but nothing requires grad: nothing to record either
        with torch.set_grad_enabled(grad):
            got = _core.fwd(q=q, k=k, v=v, softmax_scale=0.3, causal=True)
        assert all(torch.equal(a, b) for a, b in zip(got, ref)) and all(t.grad_fn is None for t in got)
    dout = torch.randn_like(q)
    out, lse, rng = ref
    got = _core.bwd(dout=dout, q=q, k=k, v=v, out=out, lse=lse, rng_state=rng, softmax_scale=0.3, causal=True)
    want = torch.ops.flashattn_ext.bwd.default(dout, q, k, v, out, lse, rng, 0.3, True)
    assert all(torch.equal(a, b) for a, b in zip(got, want) if a.numel())


def _entry_points():
    """Each public function on (q, k, v) of (batch, seqlen, nheads, headdim)."""
    def varlen(q, k, v):
        cu = torch.tensor([0, 7, 14], dtype=torch.int32)
        return flashattn_ext.flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu, 7, 7)

    def sdpa(q, k, v):
        return flashattn_ext.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))

    return {"flash_attn_func": lambda q, k, v: flashattn_ext.flash_attn_func(q, k, v, causal=True),
            "varlen": varlen, "sdpa": sdpa}


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("entry", ["flash_attn_func", "varlen", "sdpa"])
def test_forward_mode_ad_raises(entry, grad):
    """Forward-mode AD has no formula here: dual inputs raise (before any kernel runs) instead of coming back
    with zero tangents, a silent wrong directional derivative; torch.func.jvp and jacfwd too."""
    import torch.autograd.forward_ad as fwAD
    f = _entry_points()[entry]
    q, k, v = _qkv(requires_grad=grad)
    with fwAD.dual_level():
        qd = fwAD.make_dual(q, torch.randn_like(q))
        with pytest.raises(NotImplementedError, match="forward-mode AD"):
            f(qd, k, v)
    with pytest.raises(NotImplementedError, match="forward-mode AD"):
        torch.func.jvp(lambda x: f(x, k, v), (q.detach(),), (torch.randn_like(q),))
    with pytest.raises(NotImplementedError, match="forward-mode AD"):
        torch.func.jacfwd(lambda x: f(x, k, v).sum())(q.detach())


def test_forward_mode_ad_through_the_backward_raises():
    """A dual cotangent (forward-over-reverse by hand) reaches the backward op: it raises too."""
    import torch.autograd.forward_ad as fwAD
    q, k, v = _qkv(requires_grad=True)
    out = flashattn_ext.flash_attn_func(q, k, v)
    with fwAD.dual_level():
        dout = fwAD.make_dual(torch.randn_like(out), torch.randn_like(out))
        with pytest.raises(NotImplementedError, match="forward-mode AD"):
            torch.autograd.grad(out, (q, k, v), dout)


def test_vmap_runs_per_sample():
    """torch.func.vmap has no batching rule here: torch's per-sample fallback runs the op on each sample, with
    the results of separate calls."""
    q, k, v = (torch.randn(3, *t.shape, dtype=t.dtype) for t in _qkv())
    got = torch.func.vmap(lambda a, b, c: flashattn_ext.flash_attn_func(a, b, c, causal=True))(q, k, v)
    want = torch.stack([flashattn_ext.flash_attn_func(a, b, c, causal=True) for a, b, c in zip(q, k, v)])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-15)


def _variant_calls():
    """(name, f(q, k, v) -> out, extra differentiable inputs) over the variants whose gradients torch.func sees."""
    torch.manual_seed(2)
    sink = torch.randn(4, dtype=torch.float64)
    mask = torch.randn(2, 4, 7, 7, dtype=torch.float64)
    slopes = torch.rand(4, dtype=torch.float32)
    cu = torch.tensor([0, 3, 7, 14], dtype=torch.int32)
    return {
        "causal": lambda q, k, v: flashattn_ext.flash_attn_func(q, k, v, causal=True),
        "gqa_softcap_window": lambda q, k, v: flashattn_ext.flash_attn_func(q, k[:, :, :2], v[:, :, :2], softcap=3.0,
                                                                            window_size=(2, 1)),
        "alibi": lambda q, k, v: flashattn_ext.flash_attn_func(q, k, v, alibi_slopes=slopes, causal=True),
        "sink": lambda q, k, v: flashattn_ext.flash_attn_func(q, k, v, sink=sink),
        "float_mask": lambda q, k, v: flashattn_ext.flash_attn_func(q, k, v, attn_mask=mask),
        "varlen": lambda q, k, v: flashattn_ext.flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1),
                                                                       v.flatten(0, 1), cu, cu, 7, 7, causal=True),
        "sdpa": lambda q, k, v: flashattn_ext.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                                           v.transpose(1, 2), is_causal=True),
    }


@pytest.mark.parametrize("name", list(_variant_calls()))
def test_torch_func_reverse_mode(name):
    """torch.func.grad / vjp / jacrev and vmap of grad (per-sample gradients) run on the kernels (a
    setup_context form of the ops' autograd, _core._Transformed) and give eager autograd's gradients."""
    f = _variant_calls()[name]
    q, k, v = _qkv()
    loss = lambda q, k, v: (f(q, k, v) ** 2).sum()  # noqa: E731
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(loss(*leaves), leaves)
    got = torch.func.grad(loss, argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-13)
    out, vjp = torch.func.vjp(lambda q: f(q, k, v), q)
    assert torch.equal(out, f(q, k, v))
    torch.testing.assert_close(vjp(2 * out)[0], want[0], rtol=0, atol=1e-13)
    if name == "causal":
        jac = torch.func.jacrev(lambda q: f(q, k, v).sum(dim=(1, 2, 3)))(q)  # (batch, *q.shape)
        torch.testing.assert_close(jac.sum(0), torch.autograd.grad(f(*leaves).sum(), leaves[0])[0], rtol=0,
                                   atol=1e-13)
        per_sample = torch.func.vmap(torch.func.grad(lambda q, k, v: loss(q[None], k[None], v[None])))(q, k, v)
        for i in range(q.shape[0]):
            one = [t[i:i + 1].clone().requires_grad_() for t in (q, k, v)]
            torch.testing.assert_close(per_sample[i], torch.autograd.grad(loss(*one), one[0])[0][0], rtol=0,
                                       atol=1e-13)


def test_torch_func_grad_matches_float64_math():
    """The same through an independent reference: softmax(q k^T / sqrt(d)) v in float64 torch ops."""
    q, k, v = _qkv()

    def ref(q, k, v):
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) / 8 ** 0.5
        causal = torch.ones(7, 7, dtype=torch.bool).tril()
        return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s.masked_fill(~causal, -math.inf), -1), v)

    for argnum in range(3):
        got = torch.func.grad(lambda *x: (flashattn_ext.flash_attn_func(*x, causal=True) ** 2).sum(), argnum)(q, k, v)
        want = torch.func.grad(lambda *x: (ref(*x) ** 2).sum(), argnum)(q, k, v)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-13)


def test_second_order_under_torch_func_raises():
    q, k, v = _qkv()
    f = lambda q: (flashattn_ext.flash_attn_func(q, k, v) ** 2).sum()  # noqa: E731
    with pytest.raises(NotImplementedError, match="second derivatives under torch.func"):
        torch.func.grad(lambda q: torch.func.grad(f)(q).sum())(q)
    with pytest.raises(NotImplementedError):
        torch.func.hessian(f)(q)
