"""pytest plugin that runs flash-attn's tests/test_flash_attn.py against flashattn_ext, unchanged.

Loaded by dev/run_fa_tests.sh (`pytest -p fa_compat_plugin`, with dev/fa_compat on sys.path so that
`import flash_attn` finds the stand-in package there). After pytest imports the test module, the
plugin replaces two of its helpers, the ones that decode flash-attn's S_dmask (unnormalized,
blockwise, padded to rounded lengths), with ones that read flashattn_ext's S_dmask (the normalized
probabilities, (batch, nheads, seqlen_q, seqlen_k), dropped entries negated). The test file itself is
never edited.

Environment:
  FA_DEVICE=cuda (default) | cpu   cpu: the tests' "cuda" tensors are made on the CPU, in their
        float16/bfloat16 dtypes (the stand-in flash_attn_func computes those in float32 on the CPU
        and rounds the results back, see flash_attn/flash_attn_interface.py); the CUDA capability
        queries of the test file answer (9, 0), an H100/H200, so that every gradient check runs as
        on the H200. (Running the cases in float32 instead does not work: each test bounds the
        error by twice that of an unfused torch computation in the input dtype, which in float32
        is often exactly 0.)
  FA_SAMPLE=N        run one case in N (chosen by a hash of its id: the same ones every time), but
                     at least about FA_MIN_CASES (default 30) of each test function (all of a
                     smaller one).
  FA_SHARD=I/N       run the I-th of N interleaved parts of the selection (0-based).
  FA_REPORT=PATH     write a JSON report for dev/fa_compat/fa_summary.py there.
Every test function runs, test_flash_attn_kvcache (flash_attn_with_kvcache) and the paged-KV cases of
test_flash_attn_varlen_causal (flash_attn_varlen_func with a block_table, forward only, see
flash_attn/flash_attn_interface.py) included; collecting the file's 509k cases takes about 80 s and 3 GB.
"""
import collections
import json
import os
import types
import zlib

import pytest
import torch

DEVICE = os.environ.get("FA_DEVICE", "cuda")
SAMPLE = int(os.environ.get("FA_SAMPLE", "1"))
MIN_CASES = int(os.environ.get("FA_MIN_CASES", "30"))
SHARD = os.environ.get("FA_SHARD", "0/1")
REPORT = os.environ.get("FA_REPORT")

CPU_CAPABILITY = (9, 0)  # what the test file's is_sm90 checks compare against


# ------------------------------------------------------------------------------------------------
# flashattn_ext's S_dmask, read in place of flash-attn's
# ------------------------------------------------------------------------------------------------

def convert_s_dmask(
    S, seqlen_q, seqlen_k, query_padding_mask, key_padding_mask, head_dim, is_dropout, causal=False,
    window_size=(-1, -1),
):
    """flashattn_ext's S_dmask holds +-0 outside the visible band, so it needs no band masking. Dense: of
    shape (..., seqlen_q, seqlen_k). Varlen: (batch, nheads, max_seqlen_q, max_seqlen_k), sequence s at its
    first rows and columns, which is the padded layout of the test's prefix padding masks once zero-padded
    to (seqlen_q, seqlen_k) (flash-attn pads its S_dmask to multiples of 128, the helper crops it). Padded
    query rows and key columns are zeroed as flash-attn's helper does. The sign (negative = dropped) is
    kept for the caller's `>= 0` keep test."""
    rows, cols = S.shape[-2:]
    if rows > seqlen_q or cols > seqlen_k:
        raise AssertionError(f"S_dmask has shape {tuple(S.shape)}, expected at most (..., {seqlen_q}, {seqlen_k})")
    S = torch.nn.functional.pad(S, (0, seqlen_k - cols, 0, seqlen_q - rows))
    if query_padding_mask is not None:
        S = S.masked_fill(~query_padding_mask[:, None, :, None], 0.0)
    if key_padding_mask is not None:
        S = S.masked_fill(~key_padding_mask[:, None, None, :], 0.0)
    return S


def normalize_s_dmask(
    attn_unnorm, q, k, v, query_padding_mask=None, key_padding_mask=None, attn_bias=None, is_dropout=False,
    causal=False, window_size=(-1, -1),
):
    """|S_dmask| of flashattn_ext already is the softmax P (before dropout): nothing to rescale."""
    if query_padding_mask is not None:
        attn_unnorm = attn_unnorm.masked_fill(~query_padding_mask[:, None, :, None], 0.0)
    return attn_unnorm


# ------------------------------------------------------------------------------------------------
# CPU mode
# ------------------------------------------------------------------------------------------------

TENSOR_FACTORIES = frozenset(
    "arange empty full linspace ones rand randint randn randperm tensor zeros".split()
)


def _on_cpu(device):
    return "cpu" if device is not None and torch.device(device).type == "cuda" else device


class CpuTorch(types.ModuleType):
    """The test module's `torch` in CPU mode: torch itself, except that its tensor factories make
    tensors asked for on "cuda" on the CPU."""

    def __init__(self):
        super().__init__("torch")

    def __getattr__(self, name):
        attr = getattr(torch, name)
        if name not in TENSOR_FACTORIES:
            return attr

        def factory(*args, **kwargs):
            if "device" in kwargs:
                kwargs["device"] = _on_cpu(kwargs["device"])
            return attr(*args, **kwargs)

        return factory


def _physical_memory():
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _pretend_cuda_queries():
    """The test file asks for the CUDA capability at import and for the memory size in its bodies."""
    torch.cuda.get_device_capability = lambda device=None: CPU_CAPABILITY
    torch.cuda.get_device_properties = lambda device=None: types.SimpleNamespace(total_memory=_physical_memory())


# ------------------------------------------------------------------------------------------------
# Hooks
# ------------------------------------------------------------------------------------------------

def _function(item):
    return getattr(item, "originalname", item.name.split("[")[0])


def _key(item):
    """'function|tags' for the report: the features this case exercises."""
    function = _function(item)
    p = item.callspec.params if hasattr(item, "callspec") else {}
    tags = []
    if p.get("dropout_p", 0.0) > 0.0:
        tags.append("dropout")
    if p.get("local"):
        tags.append("window")
    if p.get("softcap", 0.0) > 0.0:
        tags.append("softcap")
    if p.get("alibi"):
        tags.append("alibi")
    if p.get("causal") or function == "test_flash_attn_causal":
        tags.append("causal")
    if p.get("deterministic") or function == "test_flash_attn_deterministic":
        tags.append("deterministic")
    if p.get("mha_type") in ("mqa", "gqa"):
        tags.append(p["mha_type"])
    if p.get("kvpacked"):
        tags.append("kvpacked")
    if p.get("paged_kv_block_size") is not None:
        tags.append("paged")
    if p.get("new_kv"):
        tags.append("append")
    if p.get("rotary_fraction", 0.0) > 0.0:
        tags.append("rotary")
    if p.get("has_leftpad"):
        tags.append("leftpad")
    if p.get("has_batch_idx"):
        tags.append("batch_idx")
    return f"{function}|{','.join(tags)}"


class Recorder:
    def __init__(self):
        self.keys = {}
        self.census = collections.Counter()
        self.results = []

    def collected(self, items):
        for item in items:
            self.keys[item.nodeid] = _key(item)
            self.census[self.keys[item.nodeid]] += 1

    def record(self, report):
        done = report.when == "call" or (report.when == "setup" and not report.passed)
        if not done or report.nodeid not in self.keys:
            return
        message = ""
        if report.skipped:
            message = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            message = message.removeprefix("Skipped: ")
        elif report.failed:
            crash = getattr(report.longrepr, "reprcrash", None)
            message = crash.message if crash is not None else str(report.longrepr).splitlines()[-1]
        self.results.append(
            {"nodeid": report.nodeid, "key": self.keys[report.nodeid], "outcome": report.outcome,
             "message": message, "duration": report.duration}
        )

    def write(self, path):
        with open(path, "w") as f:
            json.dump({"census": self.census, "results": self.results}, f)


RECORDER = Recorder()


def pytest_configure(config):
    if DEVICE == "cpu":
        _pretend_cuda_queries()


def _patch_module(module):
    if hasattr(module, "convert_flash_attn_S_to_softmax"):
        module.convert_flash_attn_S_to_softmax = convert_s_dmask
    if hasattr(module, "normalize_flash_attn_S"):
        module.normalize_flash_attn_S = normalize_s_dmask
    if DEVICE == "cpu":
        module.torch = CpuTorch()


@pytest.hookimpl(tryfirst=True, specname="pytest_collection_modifyitems")
def pytest_fa_patch_and_count(session, config, items):
    """First, before -k/-m deselect anything: patch the test module, count every case."""
    for module in {item.module for item in items if hasattr(item, "module")}:
        _patch_module(module)
    RECORDER.collected(items)


@pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")
def pytest_fa_select(session, config, items):
    """Last, after -k/-m: FA_SAMPLE, FA_SHARD."""
    shard, shards = (int(x) for x in SHARD.split("/"))
    per_function = collections.Counter(_function(item) for item in items)
    selected, sampled, drop = [], [], []
    for item in items:
        cases = per_function[_function(item)]
        step = SAMPLE if cases >= SAMPLE * MIN_CASES else max(1, cases // MIN_CASES)
        if zlib.crc32(item.nodeid.encode()) % step != 0:
            drop.append(item)
        else:
            sampled.append(item)
    for i, item in enumerate(sampled):
        (selected if i % shards == shard else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = selected


def pytest_runtest_logreport(report):
    RECORDER.record(report)


def pytest_sessionfinish(session, exitstatus):
    if REPORT:
        RECORDER.write(REPORT)
