"""Static SASS of one kernel's loops, attributed to source lines, on a machine without a GPU.

Reads `nvdisasm -gi -c -fun INDEX CUBIN` output (a cubin compiled with -lineinfo; INDEX: the function's symbol
index, `readelf -sW CUBIN`), lists the loops (backward branches to a label, largest first) and, for one of them,
the instructions per innermost source line by class (ncu_sass_mix.py's classes, so that the executed-instruction
excess of run_q.sh mix can be placed in the source). Static counts: every path of the loop counts, also those most
iterations skip.

Usage, from the repo root (cuobjdump / nvdisasm: dev/tools/sass_count.sh installs them into dev/bin/sass):
  nvcc -std=c++17 -O3 --expt-relaxed-constexpr -lineinfo -arch=sm_90a -Icsrc -Icsrc/cuda -DFLASHATTN_EXT_SM90A \\
      -cubin csrc/cuda/bwd_sm90.cu -o /tmp/k.cubin
  readelf -sW /tmp/k.cubin | grep 'FUNC.*<mangled name>'          # the symbol index, first column
  dev/bin/sass/nvidia/cu13/bin/nvdisasm -gi -c -fun INDEX /tmp/k.cubin > /tmp/k.sass
  python3 dev/tools/sass_lines.py /tmp/k.sass [LOOP] [TOP]      # LOOP: which loop (0 = largest), TOP lines shown
Executed counts instead of static ones: `python3 dev/tools/sass_lines.py /tmp/k.sass --exec F.csv[.gz] [TOP]`, F the
same kernel's ncu source page (run_q.sh mixours); its rows are matched to the cubin's instructions by offset from the
function's first instruction, every opcode checked (the GPU machine's build must be the cubin's code), and the whole
function's warp-level instructions executed are attributed to source lines.
Where the warps wait: `python3 dev/tools/sass_lines.py /tmp/k.sass --stalls F.csv[.gz] [TOP]`: ncu's warp-stall
samples of the same page (SourceCounters), by reason over the function and the TOP instructions by samples, each
with its source line and its two largest reasons.
"""
import re
import sys
from collections import Counter, defaultdict

from ncu_sass_mix import opclass, opcode, source_page  # noqa: E402 (this folder)

SHOWN = ("uniform", "int", "branch", "sync", "move", "shared", "global")


def parse(lines):
    """(address, text, (file, line)) per instruction, the line the innermost of its -gi annotations; the
    addresses of the .L_x_N labels."""
    ins, labels, cur, in_notes, pending = [], {}, ("?", 0), False, []
    for line in lines:
        m = re.match(r'\s*//## File "([^"]+)", line (\d+)', line)
        if m:
            if not in_notes:  # the first annotation of a group is the innermost (inlined) one
                cur = (m.group(1).split("/")[-1], int(m.group(2)))
            in_notes = True
            continue
        in_notes = False
        m = re.match(r"\s*\.L_x_(\d+):", line)
        if m:
            pending.append(m.group(1))
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            addr = int(m.group(1), 16)
            for name in pending:
                labels[name] = addr
            pending = []
            ins.append((addr, m.group(2), cur))
    return ins, labels


def find_loops(ins, labels):
    """(start, end) address of every loop (a backward branch to a label), largest first."""
    loops = set()
    for addr, text, _ in ins:
        m = re.search(r"BRA `?\(?\.L_x_(\d+)", text)
        if m and m.group(1) in labels and labels[m.group(1)] < addr:
            loops.add((labels[m.group(1)], addr))
    return sorted(loops, key=lambda lh: lh[0] - lh[1])


def executed(ins, labels, path, top):
    """Per source line and class, the warp-level instructions executed (ncu source page `path`)."""
    by_addr, ix, num = matched(ins, path)
    per, total, count = defaultdict(Counter), Counter(), {}
    for addr, text, where in ins:
        n = count[addr] = num(by_addr[addr], "Instructions Executed")
        per[where][opclass(opcode(text))] += n
        total[opclass(opcode(text))] += n
    m = 1e6
    print(f"executed {sum(total.values()) / m:.1f} M warp instructions:",
          " ".join(f"{k} {v / m:.1f}" for k, v in total.most_common()))
    hot = max(find_loops(ins, labels), key=lambda lh: sum(n for a, n in count.items() if lh[0] <= a <= lh[1]),
              default=None)
    if hot and count[hot[0]] > 0:  # per pass of the hottest loop and warp (its first instruction's count)
        mix = Counter()
        for addr, text, _ in ins:
            if hot[0] <= addr <= hot[1]:
                mix[opclass(opcode(text))] += count[addr] / count[hot[0]]
        print(f"hottest loop {hot[0]:#x}-{hot[1]:#x}, {count[hot[0]]:.0f} passes (warp x iteration): "
              f"{sum(mix.values()):.0f} instructions per pass:", " ".join(f"{k} {v:.0f}" for k, v in mix.most_common()))
    rows = sorted(per.items(), key=lambda kv: -sum(kv[1][k] for k in ("uniform", "int", "branch")))
    print("  " + " " * 22 + "".join(f"{k:>8}" for k in SHOWN) + "   all  (M executed)")
    for (name, line), n in rows[:top]:
        print(f"  {name + ':' + str(line):22}" + "".join(f"{n[k] / m:8.2f}" for k in SHOWN) +
              f"{sum(n.values()) / m:7.2f}")


def matched(ins, path):
    """The ncu source page's rows by the cubin's instructions (offset from the first; opcodes checked)."""
    data, ix, num = source_page(path)
    base = int(data[0][ix["Address"]], 16)
    by_addr = {int(r[ix["Address"]], 16) - base: r for r in data}
    if len(by_addr) != len(ins):
        sys.exit(f"{len(by_addr)} ncu rows against {len(ins)} cubin instructions (another build?)")
    for addr, text, _ in ins:
        r = by_addr.get(addr)
        if r is None or opcode(r[ix["Source"]]) != opcode(text):
            sys.exit(f"the ncu page does not match the cubin at {addr:#x}: {text!r} (another build?)")
    return by_addr, ix, num


def stalls(ins, path, top):
    """ncu's warp-stall samples (all samples) by reason, and the instructions that hold the most."""
    by_addr, ix, num = matched(ins, path)
    reasons = [k for k in ix if k.startswith("stall_") and "Not Issued" not in k]
    total, per = Counter(), []
    for addr, text, where in ins:
        r = by_addr[addr]
        n = Counter({k[6:]: num(r, k) for k in reasons})
        total.update(n)
        per.append((num(r, "Warp Stall Sampling (All Samples)"), addr, text, where, n))
    t = sum(x[0] for x in per) or 1.0
    print(f"{t:.0f} samples:", " ".join(f"{k} {100 * v / t:.1f}%" for k, v in total.most_common(10)))
    for n, addr, text, (name, line), why in sorted(per, key=lambda x: -x[0])[:top]:
        print(f"  {addr:#7x} {100 * n / t:5.1f}%  {name + ':' + str(line):22} {' '.join(text.split())[:56]:56} " +
              " ".join(f"{k} {v:.0f}" for k, v in why.most_common(2)))


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    ins, labels = parse(open(sys.argv[1]).read().splitlines())
    if len(sys.argv) > 3 and sys.argv[2] == "--exec":
        executed(ins, labels, sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 40)
        return
    if len(sys.argv) > 3 and sys.argv[2] == "--stalls":
        stalls(ins, sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 30)
        return
    which = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    loops = find_loops(ins, labels)
    print(f"{len(ins)} instructions; loops (start, end, instructions):",
          ", ".join(f"{lo:#x}-{hi:#x} {(hi - lo) // 16 + 1}" for lo, hi in loops[:8]))
    if not loops:
        return
    lo, hi = loops[which]
    body = [(t, c) for a, t, c in ins if lo <= a <= hi]
    print(f"loop {which}: {len(body)} instructions,",
          " ".join(f"{k} {v}" for k, v in Counter(opclass(opcode(t)) for t, _ in body).most_common()))
    per = defaultdict(Counter)
    for text, where in body:
        per[where][opclass(opcode(text))] += 1
    rows = sorted(per.items(), key=lambda kv: -sum(kv[1][k] for k in ("uniform", "int", "branch")))
    print("  " + " " * 22 + "".join(f"{k:>8}" for k in SHOWN) + "   all")
    for (name, line), n in rows[:top]:
        print(f"  {name + ':' + str(line):22}" + "".join(f"{n[k]:8}" for k in SHOWN) + f"{sum(n.values()):6}")


if __name__ == "__main__":
    main()
