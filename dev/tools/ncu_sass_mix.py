"""Executed-instruction mix of kernels from ncu source pages (ncu -i REP --page source --csv --print-source sass >
F.csv), side by side: warp-level instructions executed per opcode and per class, and the stall samples per class.
Usage: python3 dev/tools/ncu_sass_mix.py NAME=F.csv [NAME=F.csv ...] [--top N]"""
import collections
import csv
import gzip
import sys

CLASSES = (  # first match wins: (class, opcode prefixes)
    ("tensor", ("HGMMA", "HMMA", "WARPGROUP")),
    ("exp", ("MUFU",)),
    ("fp", ("FFMA", "FMUL", "FADD", "FMNMX", "FSET", "FSEL", "FCHK", "F2F", "F2FP", "FSETP", "HADD2", "HMUL2", "HFMA2")),
    ("shared", ("LDS", "STS", "LDSM", "STSM", "ATOMS", "REDS")),
    ("global", ("LDG", "STG", "REDG", "RED", "ATOMG", "LDGSTS", "LDGDEPBAR", "UTMA", "UBLKCP", "UBLKRED", "UTMAPF",
                "ULDC", "LDC")),
    ("local", ("LDL", "STL")),
    ("sync", ("SYNCS", "BAR", "DEPBAR", "FENCE", "MEMBAR", "ACQBULK", "ARRIVES", "CCTL", "ERRBAR", "WARPSYNC")),
    ("branch", ("BRA", "BSSY", "BSYNC", "EXIT", "RET", "CALL", "YIELD", "NANOSLEEP", "BREAK", "JMP", "BRX", "ELECT")),
    ("uniform", ("U",)),
    ("move", ("MOV", "R2UR", "S2R", "S2UR", "CS2R", "SHFL", "PRMT", "SEL", "P2R", "R2P", "VOTE", "PLOP3", "NOP")),
    ("int", ("IMAD", "IADD", "LEA", "LOP", "SHF", "ISETP", "VIADD", "VIMNMX", "IMNMX", "IABS", "POPC", "FLO", "BREV",
             "I2F", "F2I", "IDP", "BMSK", "SGXT")),
)


def opcode(source):
    """The opcode of one SASS instruction's text ("@P0 IMAD.WIDE R2, ..." -> "IMAD"), None for an empty line."""
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else None


def opclass(op):
    return next((c for c, prefixes in CLASSES if op.startswith(prefixes)), "other")


def source_page(path):
    """The instruction rows of an ncu source page (CSV, or gzipped: .gz) and num(row, column): a column's number, 0
    where absent."""
    rows = list(csv.reader((gzip.open if path.endswith(".gz") else open)(path, "rt")))
    start = next(i for i, r in enumerate(rows) if "Source" in r and "Instructions Executed" in r)
    ix = {h: i for i, h in enumerate(rows[start])}

    def num(r, k):
        try:
            return float(r[ix[k]].replace(",", "")) if k in ix else 0.0
        except (ValueError, IndexError):
            return 0.0

    return [r for r in rows[start + 1:] if len(r) > ix["Source"]], ix, num


def load(path):
    data, ix, num = source_page(path)
    ops, samples = collections.Counter(), collections.Counter()
    for r in data:
        op = opcode(r[ix["Source"]])
        if op is None:
            continue
        ops[op] += num(r, "Instructions Executed")
        samples[opclass(op)] += num(r, "Warp Stall Sampling (All Samples)")
    return ops, samples


def main():
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 30
    kernels = [(a.split("=", 1)[0], *load(a.split("=", 1)[1])) for a in sys.argv[1:] if "=" in a]
    names = [n for n, _, _ in kernels]
    total = {n: sum(o.values()) for n, o, _ in kernels}
    print("executed warp instructions (M): " + ", ".join(f"{n} {total[n] / 1e6:.1f}" for n in names))
    print(f"\n{'class':10s}" + "".join(f"{n + ' M':>14s}{'%':>7s}" for n in names) + "  stall samples %")
    by_class = {n: collections.Counter() for n in names}
    for n, ops, _ in kernels:
        for op, c in ops.items():
            by_class[n][opclass(op)] += c
    classes = sorted({c for n in names for c in by_class[n]}, key=lambda c: -by_class[names[0]][c])
    for c in classes:
        line = f"{c:10s}" + "".join(f"{by_class[n][c] / 1e6:14.1f}{by_class[n][c] / total[n] * 100:7.1f}"
                                     for n in names)
        line += "  " + " ".join(f"{s[c] / max(1.0, sum(s.values())) * 100:5.1f}" for _, _, s in kernels)
        print(line)
    print(f"\n{'opcode':10s}" + "".join(f"{n + ' M':>14s}" for n in names))
    every = collections.Counter()
    for _, ops, _ in kernels:
        every.update(ops)
    for op, _ in every.most_common(top):
        print(f"{op:10s}" + "".join(f"{ops[op] / 1e6:14.1f}" for _, ops, _ in kernels))


if __name__ == "__main__":
    main()
