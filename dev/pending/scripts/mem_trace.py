"""Issue 35's peak memory (451 MiB for ours against cuDNN's 386, bf16 B1 H32 S8k D128, one forward + backward:
benchmarks/bench_gpu.py's peak_memory_bytes): every allocation of 1 MiB or more during the call, with its size, the
peak and the Python / C++ frames that made it (torch.cuda.memory._record_memory_history), for ours and for SDPA's
default (cuDNN) on the same inputs. Usage (GPU): PYTHONPATH=. python3 dev/pending/scripts/mem_trace.py"""
import torch
import torch.nn.functional as F

import flashattn_ext

B, S, H, D = 1, 8192, 32, 128
MIB = 1 << 20


def call(impl, q, k, v, dout):
    if impl == "ours":
        out = flashattn_ext.flash_attn_func(q, k, v)
    else:
        out = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v))).transpose(1, 2)
    return torch.autograd.grad(out, (q, k, v), dout)


def main():
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn(B, S, H, D, generator=g, dtype=torch.bfloat16, device="cuda") for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_()
    for impl in ("ours", "sdpa"):
        call(impl, q, k, v, dout)  # warm-up (workspaces, autotuning)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        torch.cuda.memory._record_memory_history(max_entries=100000)
        grads = call(impl, q, k, v, dout)
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        print(f"== {impl}: peak extra {(torch.cuda.max_memory_allocated() - before) / MIB:.1f} MiB")
        for trace in snap["device_traces"]:
            for e in trace:
                if e["action"] in ("alloc", "free_completed") and e["size"] >= MIB:
                    frames = [f"{f['filename'].split('/')[-1]}:{f['line']} {f['name']}" for f in e.get("frames", [])
                              if "torch/" not in f["filename"] or "autograd" in f["filename"]][:4]
                    print(f"  {e['action']:15s} {e['size'] / MIB:8.1f} MiB  " + " | ".join(frames))
        del grads


if __name__ == "__main__":
    main()
