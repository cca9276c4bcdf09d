"""The speed plot of a bench_gpu.py run: TFLOP/s against seqlen, drawn from its results.json.

One column per head dim, one row per pass and mask (forward and backward, each non-causal and causal),
one line per implementation (ours beside torch's SDPA backends), the GPU, torch and date of the data in
the title. Needs matplotlib only (no torch, no GPU), so a results.json from the device can be drawn
anywhere; bench_gpu.py calls plot() at the end of a run.

    python benchmarks/plot_results.py benchmarks/results/h200/sweep_2026-11-29   # reads results.json, writes tflops.png
    python benchmarks/plot_results.py run/results.json --out run.png
"""
import argparse
import json
import pathlib
import sys
import textwrap

ROWS = (("fwd", False), ("bwd", False), ("fwd", True), ("bwd", True))
PASS_TITLES = {"fwd": "forward", "bwd": "backward"}
# Label and colour of each implementation bench_gpu.py times (others get matplotlib's cycle).
IMPLS = {
    "ours": ("flashattn_ext (ours)", "tab:red"),
    "ours_det": ("ours, deterministic", "tab:orange"),
    "flash": ("torch flash (FA2)", "tab:blue"),
    "cudnn": ("torch cuDNN", "tab:green"),
    "efficient": ("torch efficient", "tab:gray"),
    "eager": ("eager", "tab:purple"),
}
PANEL_SIZE = (4.2, 3.0)  # inches per panel
TITLE_CHARS_PER_INCH = 12  # where the title wraps, at fontsize "medium"
LINE_HEIGHT, MARGIN, PANEL_TITLE_HEIGHT = 0.2, 0.08, 0.3  # inches, at fontsize "medium"
DPI = 110
CUDNN9 = 90000  # cuDNN 9 changed how its version number is formed


def caption(report):
    """Two lines: 'NVIDIA H200, torch 2.11.0+cu130, cuDNN 9.19, 2026-11-29' and the sweep's shapes."""
    env, sweep = report["environment"], report["sweep"]
    parts = [env.get("gpu") or "CPU (dry run)", f"torch {env['torch_version']}"]
    cudnn = env.get("cudnn_version")
    if cudnn:  # torch.backends.cudnn.version(): 91900 for 9.19.0 (cuDNN 9 on), 8902 for 8.9.2 (before)
        major, minor = (cudnn // 10000, cudnn // 100 % 100) if cudnn >= CUDNN9 else (cudnn // 1000, cudnn // 100 % 10)
        parts.append(f"cuDNN {major}.{minor}")
    parts.append(env["date"][:10])
    return [", ".join(parts), f"{sweep['dtype']}, {sweep['total_tokens']} tokens per call (batch = "
            f"{sweep['total_tokens']} / seqlen), hidden {sweep['hidden']} (nheads = hidden / head dim)"]


def plot(report, path):
    """Draws report (bench_gpu.py's results.json, loaded) to path. Returns False when matplotlib is
    missing (nothing drawn), True otherwise."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = report["points"]
    headdims = sorted({p["headdim"] for p in points})
    rows = [(name, causal) for name, causal in ROWS if name in report["sweep"]["passes"]]
    impls = report["sweep"]["impls"]
    fig, axes = plt.subplots(len(rows), len(headdims), squeeze=False, sharex=True,
                             figsize=(PANEL_SIZE[0] * len(headdims), PANEL_SIZE[1] * len(rows)))
    for (name, causal), row in zip(rows, axes):
        for headdim, ax in zip(headdims, row):
            panel = sorted((p for p in points if p["headdim"] == headdim and p["causal"] == causal),
                           key=lambda p: p["seqlen"])
            for impl in impls:
                xy = [(p["seqlen"], p["tflops"][impl][name]) for p in panel if p["tflops"][impl][name] is not None]
                if not xy:
                    continue
                label, color = IMPLS.get(impl, (impl, None))
                ax.plot(*zip(*xy), marker="o", markersize=3, label=label, color=color,
                        linewidth=2.2 if impl == "ours" else 1.4)
            seqlens = [p["seqlen"] for p in panel]
            ax.set_xscale("log", base=2)
            ax.set_xticks(seqlens, [f"{s // 1024}k" if s >= 1024 else str(s) for s in seqlens])
            ax.minorticks_off()
            ax.set_ylim(bottom=0)
            ax.set_title(f"{PASS_TITLES[name]}, head dim {headdim}{', causal' if causal else ''}", fontsize="medium")
            ax.grid(True, alpha=0.3)
            if headdim == headdims[0]:
                ax.set_ylabel("TFLOP/s")
            if (name, causal) == rows[-1]:
                ax.set_xlabel("seqlen")
    fig.tight_layout()  # the panels first; then room above them for the title and the legend
    legend = {}  # label -> line, over every panel (a backend may lack some)
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    height = fig.get_figheight()  # inches: the title and the legend keep their size whatever the grid
    title = "\n".join(textwrap.fill(line, int(TITLE_CHARS_PER_INCH * fig.get_figwidth())) for line in caption(report))
    title_height = LINE_HEIGHT * (title.count("\n") + 1)
    fig.suptitle(title, fontsize="medium", y=1 - MARGIN / height, va="top")
    ncol = max(1, min(len(legend), 2 * len(headdims)))
    fig.legend(list(legend.values()), list(legend), loc="upper center", ncol=ncol, frameon=False,
               bbox_to_anchor=(0.5, 1 - (MARGIN + title_height) / height))
    legend_height = LINE_HEIGHT * 1.4 * -(-len(legend) // ncol)
    fig.subplots_adjust(top=1 - (2 * MARGIN + title_height + legend_height + PANEL_TITLE_HEIGHT) / height)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", type=pathlib.Path,
                        help="bench_gpu.py's results.json, or the folder that holds it")
    parser.add_argument("--out", type=pathlib.Path, help="image to write (default: tflops.png beside results.json)")
    args = parser.parse_args()
    source = args.results / "results.json" if args.results.is_dir() else args.results
    out = args.out or source.with_name("tflops.png")
    if not plot(json.loads(source.read_text()), out):
        sys.exit("matplotlib is not installed: pip install matplotlib")
    print(f"wrote {out} from {source}")


if __name__ == "__main__":
    main()
