"""flashattn_ext._core, the op contract: each wrapper calls its op with the schema's arguments in the schema's
order, and no other module of the package calls the ops."""
import ast
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
    """The positional argument names of the torch.ops.flashattn_ext.<op> call in _core.<fn_name>."""
    tree = ast.parse((PACKAGE / "_core.py").read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == fn_name)
    calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and ast.unparse(n.func).startswith("torch.ops.")]
    assert len(calls) == 1 and not calls[0].keywords
    return ast.unparse(calls[0].func), [ast.unparse(a) for a in calls[0].args]


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
