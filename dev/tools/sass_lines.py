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
"""
import re
import sys
from collections import Counter, defaultdict

from ncu_sass_mix import opclass, opcode  # noqa: E402 (this folder)

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


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    ins, labels = parse(open(sys.argv[1]).read().splitlines())
    which = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    loops = set()
    for addr, text, _ in ins:
        m = re.search(r"BRA `?\(?\.L_x_(\d+)", text)
        if m and m.group(1) in labels and labels[m.group(1)] < addr:
            loops.add((labels[m.group(1)], addr))
    loops = sorted(loops, key=lambda lh: lh[0] - lh[1])
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
