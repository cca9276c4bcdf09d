"""Usage: python3 dev/pending/scripts/merge_simple.py TREE. Merges csrc/cuda/fwd_simple.cu and bwd_simple.cu of
TREE into csrc/cuda/simple.cu (one preamble: includes, the full mask, columns per lane, the occupancy hint, exp /
tanh), deleting the two; kernel bodies unchanged. i34_simple_merge.patch is this plus the references by hand."""
import os, re, sys
root = sys.argv[1]
d = os.path.join(root, "csrc/cuda")
fwd = open(os.path.join(d, "fwd_simple.cu")).read()
bwd = open(os.path.join(d, "bwd_simple.cu")).read()

def split_header(text):
    end = text.index("*/\n") + 3
    return text[:end], text[end:]

def header_body(h, first_prefix):
    lines = h.splitlines()
    assert lines[0].startswith("/* " + first_prefix), lines[0]
    body = [l for l in lines[1:-1]]
    # drop the trailing "Speed is not a goal" sentence line(s)
    out = []
    for l in body:
        if "Speed is not a goal" in l:
            continue
        out.append(l)
    while out and out[0].strip() == "*":
        out.pop(0)
    while out and out[-1].strip() == "*":
        out.pop()
    return out, lines[0][len("/* " + first_prefix):]

fh, frest = split_header(fwd)
bh, brest = split_header(bwd)
fbody, ffirst = header_body(fh, "fwd_simple.cu: ")
bbody, bfirst = header_body(bh, "bwd_simple.cu: ")

def drop(rest, patterns):
    lines = rest.split("\n")
    out = []
    skip_next = False
    for l in lines:
        if any(re.search(p, l) for p in patterns):
            continue
        out.append(l)
    return "\n".join(out)

COMMON = [r"^#define FLASH_SCORE_TABLE 1", r"^#include ", r"launch-bounds occupancy hint"]
frest = drop(frest, COMMON + [r"^static constexpr unsigned kSimpleFullMask", r"^static constexpr int kPerLane",
                               r"^static constexpr int kMinCtasPerSm", r"^__device__ __forceinline__ \w+ (exp_t|tanh_t)\("])
brest = drop(brest, COMMON + [r"^#define FULL_MASK", r"^#define SIMPLE_CPL", r"^#define SIMPLE_MIN_BLOCKS",
                               r"^__device__ __forceinline__ \w+ (simple_exp|simple_tanh)\("])
for a, b in (("kSimpleFullMask", "FULL_MASK"), ("kPerLane", "SIMPLE_CPL"), ("kMinCtasPerSm", "SIMPLE_MIN_BLOCKS"),
             ("exp_t", "simple_exp"), ("tanh_t", "simple_tanh")):
    frest = re.sub(r"\b%s\b" % a, b, frest)
frest = re.sub(r"^\n+", "", frest).rstrip("\n") + "\n"
brest = re.sub(r"^\n+", "", brest).rstrip("\n") + "\n"
frest = re.sub(r"\n{3,}", "\n\n", frest)
brest = re.sub(r"\n{3,}", "\n\n", brest)

# the backward header's first paragraph is its opening sentence's continuation: replaced by one line
i = next(k for k, l in enumerate(bbody) if l.strip() == "*")
head = ["/* simple.cu: attention forward and backward for fp32 / fp64 on CUDA cores, reference-grade: the path that lets",
        " * torch.autograd.gradcheck run on the GPU. Speed is not a goal; not measured.",
        " *",
        " * Forward (flash_fwd_simple_kernel)."] + fbody + [
        " *",
        " * Backward: no atomics, bitwise deterministic, O(N) memory (delta, b*h*sq values of the input type; with T5's",
        " * table gradient, its partials below)."] + bbody[i:] + [" */"]
head = [l.replace("(FLASH_SCORE_TABLE, defined here and in\n", "") for l in head]
text_head = "\n".join(head).replace("score.h's table form (FLASH_SCORE_TABLE, defined here and in\n * bwd_simple.cu only)",
                                      "score.h's table form (FLASH_SCORE_TABLE, defined in this file\n * only)")
pre = """#define FLASH_SCORE_TABLE 1 /* before score.h: the T5 table of step 2 (score.h) */

#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "../constants.h"
#include "../mask.h"
#include "../score.h"
#include "launch.h"

#define FULL_MASK 0xffffffffu
#define SIMPLE_CPL (FLASH_CUDA_SIMPLE_MAX_HEAD_DIM / FLASH_WARP_SIZE) /* head-dim elements (columns) per lane */
/* launch-bounds occupancy hint: lets ptxas go past 128 registers, which fp64 needs to avoid spills */
#define SIMPLE_MIN_BLOCKS 1

__device__ __forceinline__ float simple_exp(float x) { return expf(x); }
__device__ __forceinline__ double simple_exp(double x) { return exp(x); }
__device__ __forceinline__ float simple_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double simple_tanh(double x) { return tanh(x); }

/* ------------------------------------------------------------------------------------------------ */
/* forward                                                                                          */

"""
mid = """
/* ------------------------------------------------------------------------------------------------ */
/* backward                                                                                         */

"""
open(os.path.join(d, "simple.cu"), "w").write(text_head + "\n" + pre + frest + mid + brest)
os.remove(os.path.join(d, "fwd_simple.cu"))
os.remove(os.path.join(d, "bwd_simple.cu"))
