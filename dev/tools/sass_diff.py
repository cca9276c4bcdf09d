"""Compares the SASS of two builds' CUDA objects, kernel by kernel and arch by arch, on a machine without a GPU:
the evidence that a change leaves a kernel's machine code as it was (issue 34: "SASS identical where a kernel body
is untouched").

Usage, from the repo root: python3 dev/tools/sass_diff.py OLD_DIR NEW_DIR [REGEX]
OLD_DIR / NEW_DIR hold the .o files of two builds with the same flags (e.g. copies of build/temp.*/csrc/cuda);
REGEX (re.search on the demangled name) restricts the kernels compared. Each kernel's SASS (cuobjdump -sass,
every instruction with its encoding) is compared whole; the output says per object which kernels are identical,
changed (with the instruction counts), only in OLD or only in NEW. Exit status 1 if any compared kernel changed.

python3 dev/tools/sass_diff.py --pooled OLD_DIR NEW_DIR: the same proof for code that moves between files (issue
34's layout moves; dev/tools/sass_same.sh builds the two folders and calls it). The objects of each folder are
pooled, and every function (kernels and non-inlined device functions) is compared by (arch, mangled name): the
instruction lines of its section of cuobjdump -sass (every instruction with both 64-bit words of its encoding,
the second holding the scheduling control bits), and its line of cuobjdump -res-usage (registers, stack, shared,
local, constant bank sizes). The set of __global__ instantiations (the host stubs nm lists, as
dev/tools/count_kernels.sh counts them) must be the same too. Prints the differences, then one summary line;
exit status 1 on any difference.
cuobjdump: $CUOBJDUMP, else the one on PATH, else dev/bin/sass's (dev/tools/sass_count.sh installs it).
"""
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys


def cuobjdump():
    for c in (os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump"), "dev/bin/sass/nvidia/cu13/bin/cuobjdump"):
        if c and os.path.isfile(c):
            return c
    sys.exit("no cuobjdump: set CUOBJDUMP, or run dev/tools/sass_count.sh once (it installs one in dev/bin/sass)")


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return [re.sub(r"\(anonymous namespace\)::", "", n) for n in out.splitlines()]


def kernels(obj, tool):
    """{(arch, mangled name): [instruction lines]} of one object."""
    text = subprocess.run([tool, "-sass", obj], capture_output=True, text=True, check=True).stdout
    funcs, arch, name = {}, "?", None
    for line in text.splitlines():
        m = re.match(r"\s*arch = (\S+)", line)
        if m:
            arch, name = m.group(1), None
            continue
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            name = m.group(1)
            funcs[(arch, name)] = []
            continue
        if name is not None and re.match(r"\s*/\*[0-9a-f]{4,}\*/", line):
            funcs[(arch, name)].append(line.strip())
    return funcs


ANON = re.compile(r"\d+_GLOBAL__N__[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]+")


def canonical(name):
    """A mangled name with nvcc's per-file anonymous namespace (_GLOBAL__N__<hash>_<file>_cu_<hash>, whose hashes
    depend on the file's path) written as the plain one, so that a kernel compares across trees and files."""
    return ANON.sub("12_GLOBAL__N_1", name)


def sections(objs, tool):
    """{(arch, mangled name): sha256 of the function's instruction lines in cuobjdump -sass} over the objects: each
    instruction's line (address, text, first encoding word) and the next (second word: the scheduling control bits);
    not the ELF's header lines (identifier, compressed, .headerflags), which cuobjdump prints per object."""
    funcs, arch, name, h = {}, "?", None, None
    for obj in objs:
        proc = subprocess.Popen([tool, "-sass", obj], stdout=subprocess.PIPE, text=True)
        for line in proc.stdout:
            m = re.match(r"\s*arch = (\S+)", line)
            if m or line.startswith("Fatbin"):
                name = None
                arch = m.group(1) if m else arch
                continue
            m = re.match(r"\s*Function : (\S+)", line)
            if m:
                name = canonical(m.group(1))
                h = funcs.setdefault((arch, name), hashlib.sha256())
                continue
            if name is not None and line.lstrip().startswith("/*"):  # the instruction lines, not the ELF's headers
                h.update(" ".join(line.split()).encode())  # cuobjdump pads the columns per dump
                h.update(b"\n")
        if proc.wait() != 0:
            sys.exit(f"{tool} -sass {obj} failed")
    return {k: v.hexdigest() for k, v in funcs.items()}


def resources(objs, tool):
    """{(arch, mangled name): the resource line of cuobjdump -res-usage} over the objects."""
    out, arch, name = {}, "?", None
    for obj in objs:
        text = subprocess.run([tool, "-res-usage", obj], capture_output=True, text=True, check=True).stdout
        for line in text.splitlines():
            m = re.match(r"\s*arch = (\S+)", line)
            if m:
                arch = m.group(1)
            m = re.match(r"\s*Function (\S+):", line)
            if m:
                name = canonical(m.group(1))
            elif name is not None and "REG:" in line:
                out[(arch, name)] = line.strip()
                name = None
    return out


def stubs(objs):
    """The __global__ instantiations of the objects: the mangled names of nvcc's host launch stubs."""
    names = set()
    for obj in objs:
        text = subprocess.run(["nm", obj], capture_output=True, text=True, check=True).stdout
        for line in text.splitlines():
            m = re.search(r" b _ZZL?\d+__device_stub__(\S+)E\d+__handle$", line)
            if m:
                names.add(canonical(m.group(1)))
    return names


def pooled(old_dir, new_dir):
    tool = cuobjdump()
    side = {}
    for d in (old_dir, new_dir):
        objs = sorted(glob.glob(os.path.join(d, "*.o")))
        if not objs:
            sys.exit(f"no .o files in {d}")
        side[d] = (sections(objs, tool), resources(objs, tool), stubs(objs))
    (old_s, old_r, old_k), (new_s, new_r, new_k) = side[old_dir], side[new_dir]
    keys = sorted(set(old_s) | set(new_s))
    names = dict(zip(keys, demangle([k[1] for k in keys])))
    differ = 0
    for k in keys:
        if old_s.get(k) != new_s.get(k):
            differ += 1
            what = "only old" if k not in new_s else "only new" if k not in old_s else "changed"
            print(f"  SASS {what:8}  {k[0]} {names[k]}")
    res_keys = sorted(set(old_r) | set(new_r))
    res_differ = [k for k in res_keys if old_r.get(k) != new_r.get(k)]
    for k in res_differ:
        print(f"  res-usage  {k[0]} {k[1]}: {old_r.get(k)} -> {new_r.get(k)}")
    for n in sorted(old_k ^ new_k):
        print(f"  __global__ only {'old' if n in old_k else 'new'}: {n}")
    same = sum(1 for k in keys if k in old_s and k in new_s and old_s[k] == new_s[k])
    print(f"sass_same: __global__ {len(old_k)} old / {len(new_k)} new ({len(old_k ^ new_k)} differ); "
          f"(arch, function) SASS {same} of {len(old_s)} identical ({len(new_s)} in new); "
          f"res-usage {len(res_keys) - len(res_differ)} of {len(res_keys)} identical")
    sys.exit(1 if differ or res_differ or old_k ^ new_k else 0)


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--pooled":
        pooled(sys.argv[2], sys.argv[3])
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    old_dir, new_dir = sys.argv[1], sys.argv[2]
    pattern = re.compile(sys.argv[3]) if len(sys.argv) > 3 else None
    tool = cuobjdump()
    changed_any = False
    objs = sorted({os.path.basename(p) for d in (old_dir, new_dir) for p in glob.glob(os.path.join(d, "*.o"))})
    for obj in objs:
        old = kernels(os.path.join(old_dir, obj), tool) if os.path.exists(os.path.join(old_dir, obj)) else {}
        new = kernels(os.path.join(new_dir, obj), tool) if os.path.exists(os.path.join(new_dir, obj)) else {}
        keys = sorted(set(old) | set(new))
        names = dict(zip(keys, demangle([k[1] for k in keys])))
        keys = [k for k in keys if pattern is None or pattern.search(names[k])]
        if not keys:
            continue
        same = [k for k in keys if k in old and k in new and old[k] == new[k]]
        print(f"{obj}: {len(same)} of {len(keys)} (kernel, arch) pairs identical")
        for k in keys:
            if k in old and k in new and old[k] != new[k]:
                changed_any = True
                print(f"  changed   {k[0]} {names[k]}: {len(old[k])} -> {len(new[k])} instructions")
            elif k not in new:
                print(f"  only old  {k[0]} {names[k]}: {len(old[k])} instructions")
            elif k not in old:
                print(f"  only new  {k[0]} {names[k]}: {len(new[k])} instructions")
    sys.exit(1 if changed_any else 0)


if __name__ == "__main__":
    main()
