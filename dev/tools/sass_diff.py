"""Compares the SASS of two builds' CUDA objects, kernel by kernel and arch by arch, on a machine without a GPU:
the evidence that a change leaves a kernel's machine code as it was (issue 34: "SASS identical where a kernel body
is untouched").

Usage, from the repo root: python3 dev/tools/sass_diff.py OLD_DIR NEW_DIR [REGEX]
OLD_DIR / NEW_DIR hold the .o files of two builds with the same flags (e.g. copies of build/temp.*/csrc/cuda);
REGEX (re.search on the demangled name) restricts the kernels compared. Each kernel's SASS (cuobjdump -sass,
every instruction with its encoding) is compared whole; the output says per object which kernels are identical,
changed (with the instruction counts), only in OLD or only in NEW. Exit status 1 if any compared kernel changed.
cuobjdump: $CUOBJDUMP, else the one on PATH, else dev/bin/sass's (dev/tools/sass_count.sh installs it).
"""
import glob
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


def main():
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
