"""The README's examples run as written. Each ```python block of README.md follows a marker line
    <!-- example: cpu -->                  run here
    <!-- example: cuda -->                 run where there is a GPU and a CUDA build
    <!-- example: skip (why) -->           not run (several processes, say)
optionally with `requires=name,name` (flashattn_ext attributes, or dotted torch.* paths; the block
is skipped while one is missing). A block runs in a fresh namespace after `import torch, flashattn_ext`
and torch.manual_seed(0), and has at most MAX_LINES lines of code (comments aside)."""
import pathlib
import re

import pytest
import torch

import flashattn_ext
from flashattn_ext.integrations import torch_registry

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
PREAMBLE = "import torch, flashattn_ext\n"
MAX_LINES = 5
KINDS = ("cpu", "cuda", "skip")
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
MARKER = re.compile(r"<!-- example: (\w+)(.*?)-->\n$")


def examples():
    """(line number, kind, required attributes, code) of every python block of the README."""
    text = README.read_text()
    found = []
    for match in BLOCK.finditer(text):
        before = text[:match.start()]
        line = before.count("\n") + 1
        marker = MARKER.search(before)
        assert marker is not None and marker.end() == len(before), f"README.md:{line}: python block without a marker"
        kind, rest = marker.group(1), marker.group(2)
        assert kind in KINDS, f"README.md:{line}: example kind {kind!r} is not one of {KINDS}"
        required = re.search(r"requires=(\S+)", rest)
        found.append((line, kind, required.group(1).split(",") if required else [], match.group(1)))
    return found


EXAMPLES = examples()


def available(name):
    """Whether flashattn_ext has attribute name, or, for "torch.a.b", whether this torch has it."""
    obj, path = (torch, name.split(".")[1:]) if name.startswith("torch.") else (flashattn_ext, [name])
    for attr in path:
        obj = getattr(obj, attr, None)
        if obj is None:
            return False
    return True


def test_examples_are_short():
    for line, _, _, code in EXAMPLES:
        lines = [s for s in code.splitlines() if s.strip() and not s.lstrip().startswith("#")]
        assert len(lines) <= MAX_LINES, f"README.md:{line}: {len(lines)} lines of code (at most {MAX_LINES})"


@pytest.mark.parametrize("line, kind, required, code", EXAMPLES, ids=[f"line{e[0]}" for e in EXAMPLES])
def test_example_runs(line, kind, required, code):
    if kind == "skip":
        pytest.skip("marked skip in the README")
    if kind == "cuda" and not (torch.cuda.is_available() and torch_registry.cuda_kernels_built()):
        pytest.skip("needs a CUDA device and a CUDA build")
    missing = [name for name in required if not available(name)]
    if missing:
        pytest.skip(f"{', '.join(missing)} not available here")
    torch.manual_seed(0)
    try:
        exec(compile(PREAMBLE + code, f"README.md:{line}", "exec"), {})
    except ModuleNotFoundError as error:
        if error.name is None or error.name.split(".")[0] in ("torch", "flashattn_ext"):
            raise
        pytest.skip(f"optional package {error.name} is not installed")
    finally:
        if torch_registry._registry() is not None:  # an example may have activated an implementation
            torch.nn.attention.restore_flash_attention_impl(_raise_warn=False)
