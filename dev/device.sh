#!/bin/bash
# device.sh: the one entry point on the GPU machine. Run from the repo root, one subcommand per call; logs and
# results under $OUT, binaries under $B (default /tmp/flashattn_dev; kept, so a later call on the same machine
# reuses them). Everything builds for sm_90a (the H200).
#
#   bash dev/device.sh info                   $OUT/gpu.txt: the GPU, driver, clocks, torch / CUDA / cuDNN versions
#   bash dev/device.sh build [ext] [harness]  the extension in place, and (side by side) every csrc/cuda object and
#                                             the torch-free harnesses $B/bh (bwd_harness.cu), $B/fh (fwd_harness.cu),
#                                             $B/wc (wgmma_check.cu); default both
#   bash dev/device.sh validate [ncu] [fwdbench]
#                                             one device call that validates a tree: build, `pytest tests -k cuda`
#                                             beside bwd_harness `test` and fwd_harness `check`, compute-sanitizer
#                                             memcheck and racecheck (--det) over tests/test_sanitize.py; optional:
#                                             ncu of the d128 backward (s8192 main kernel: full set, stall reasons per
#                                             SASS line; s512 / s8192: each backward kernel's duration), fwdbench
#                                             (fwd_harness bench and variants 128). At most 8 files under $OUT.
#   bash dev/device.sh test [PYTEST_ARGS...]  the whole suite (-n 8; the extension built before)
#   bash dev/device.sh sanitize               memcheck and racecheck over every config of tests/test_sanitize.py
#   bash dev/device.sh harness [build] [test] [sanitize] [time] [varlen]
#                                             the backward harness (default all but varlen, in this order): the wgmma
#                                             layout check, `test` through the sm90 main kernel, the sm80 one
#                                             (FLASHATTN_EXT_DISABLE_SM90=1) and its A100 tiles
#                                             (FLASHATTN_EXT_SMEM_LIMIT=163 KB); sanitizers on `small` (both kernels);
#                                             TFLOP/s sm80 -> sm90, per variant, dense against varlen; varlen: only
#                                             the varlen configs through the three paths and their timing
#   bash dev/device.sh bench [full|quick|variants|fwd|fwd-probe|fwd-sweep|fwd-check]
#                                             benchmarks/bench_gpu.py (full, default; quick: --quick; budget
#                                             BENCH_BUDGET), bench_variants.py (VARIANTS_BUDGET); fwd: fwd_harness
#                                             bench, static then HARNESS_DYNAMIC=1, twice each; fwd-probe:
#                                             dev/tools/fwd_probe.py (ours and cuDNN alternating); fwd-sweep:
#                                             bench_gpu.py --only fwd (SWEEP_BUDGET); fwd-check: fwd_harness check
#                                             with HARNESS_DYNAMIC=1
#   bash dev/device.sh ncu bwd [CAND.cu] ["D SEQLEN" ...]
#                                             Nsight Compute of the backward main kernel (bf16; default "64 8192";
#                                             CAND.cu replaces csrc/cuda/bwd_sm90.cu): tensor pipe, stalls, memory
#   bash dev/device.sh ncu pair ["D SEQLEN CAUSAL" ...]
#                                             cuDNN's backward main kernel beside ours (dev/tools/bwd_pair.py: one
#                                             process, the same bf16 inputs; default "128 8192 0"): the same sections
#                                             and metrics as ncu bwd, for issue 35's "why (ncu)"
#   bash dev/device.sh ncu fwd                the causal s2048 d128 forward: full set and its hot SASS lines
#   bash dev/device.sh ab KERNEL "MODES" [NAME=[PATCH] ...]
#                                             the forward harness built once per variant of one forward kernel file
#                                             (fwd_sm90, fwd_decode, fwd_sm80): NAME=PATCH builds KERNEL.cu from a
#                                             copy of csrc with PATCH (`git diff` output, e.g. of csrc/cuda/tiles.h)
#                                             applied, NAME= the tree as it is (default base=); each harness mode of
#                                             MODES runs on every variant, but `check`, on the first one. Env:
#                                             MODE_ARG (an argument of every mode but check), SM80=1 (the modes first
#                                             with FLASHATTN_EXT_DISABLE_SM90=1). dev/tools/fwd_ab.py interleaves
#                                             the variants' bench runs afterwards.
#   bash dev/device.sh tree DIR... [-- PYTEST_ARGS...]
#                                             other trees (a branch: `git archive BRANCH | tar -x -C ab/NAME` here;
#                                             ab/ travels as an untracked folder): each built in place (sm_90a, side
#                                             by side, TREE_JOBS jobs each, default 16 / the trees), then pytest in
#                                             each in turn (default args: tests -k cuda); logs $OUT/NAME_build.log,
#                                             $OUT/NAME_pytest.log
#   bash dev/device.sh ptx                    issue 36's PTX-only proof: the extension built with
#                                             FLASHATTN_EXT_CUDA_ARCHS=compute_80 (no SASS at all: the driver JITs the
#                                             sm80 kernels for the H200, as it would for sm_100 / sm_120), the first
#                                             call's time in two fresh processes (JIT, then the driver's cache), and
#                                             pytest tests/test_cuda.py tests/test_variants.py -k cuda on it
set -uo pipefail
O=${OUT:-/tmp/flashattn_out}
B=${B:-/tmp/flashattn_dev}
mkdir -p "$O" "$B"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
F="-std=c++17 -O3 -lineinfo -gencode=arch=compute_90a,code=sm_90a -Icsrc -Icsrc/cuda -DFLASHATTN_EXT_SM90A"
A100_SMEM=$((163 * 1024))
t0=$(date +%s)
el() { echo "[$(($(date +%s) - t0)) s] $*"; }

# The extension (in place, sm_90a) and, side by side, every CUDA object and the harnesses; exits when the
# extension was asked for and failed.
build() {
    local what=${*:-ext harness} objs=() f o
    if [[ " $what " == *" ext "* ]]; then
        (FLASHATTN_EXT_CUDA_ARCHS=90a MAX_JOBS=10 python3 setup.py build_ext --inplace >"$B/build_ext.log" 2>&1
         echo $? >"$B/ext_rc") &
    fi
    if [[ " $what " == *" harness "* ]]; then
        nvcc $F dev/wgmma_check.cu -o "$B/wc" >"$B/wgmma_check.log" 2>&1 || echo "FAIL dev/wgmma_check.cu" &
        for f in csrc/cuda/*.cu dev/bwd_harness.cu dev/fwd_harness.cu; do
            nvcc $F -c "$f" -o "$B/$(basename "$f" .cu).o" >"$B/$(basename "$f" .cu).log" 2>&1 || echo "FAIL $f" &
        done
        wait
        for f in csrc/cuda/*.cu; do objs+=("$B/$(basename "$f" .cu).o"); done
        nvcc $F "$B/bwd_harness.o" "${objs[@]}" -o "$B/bh" & nvcc $F "$B/fwd_harness.o" "${objs[@]}" -o "$B/fh" &
    fi
    wait
    if [[ " $what " == *" ext "* ]]; then
        el "builds; ext rc $(cat "$B/ext_rc")"
        [ "$(cat "$B/ext_rc")" = 0 ] || { tail -30 "$B/build_ext.log"; exit 1; }
    else
        el "builds"
    fi
}

sanitizer() {  # SECONDS TOOL LOG [ARGS of tests/test_sanitize.py]
    local limit=$1 tool=$2 log=$3
    shift 3
    PYTHONUNBUFFERED=1 timeout "$limit" compute-sanitizer --tool "$tool" --print-limit 20 python3 tests/test_sanitize.py "$@" \
        >"$log" 2>&1
    el "$tool rc $?: $(tail -1 "$log")"
}

validate() {
    build
    (timeout 300 "$B/bh" test >"$B/bh_test.log" 2>&1; echo "bwd_harness test rc $?: $(tail -1 "$B/bh_test.log")"
     timeout 200 "$B/fh" check >"$B/fh_check.log" 2>&1; echo "fwd_harness check rc $?: $(tail -1 "$B/fh_check.log")") &
    PYTHONUNBUFFERED=1 timeout 330 python3 -m pytest tests -q -rf --maxfail=20 -n 12 -k cuda -p no:cacheprovider \
        >"$O/pytest.log" 2>&1
    el "pytest rc $?: $(tail -1 "$O/pytest.log")"
    wait
    cat "$B/bh_test.log" "$B/fh_check.log" | grep -v "^PASS" >"$O/harness_fail_lines.log"
    sanitizer 150 memcheck "$O/sanitizer_memcheck.log"
    sanitizer 150 racecheck "$O/sanitizer_racecheck.log" --det
    local step s c
    for step in "$@"; do case $step in
    ncu)
        timeout 150 ncu -k regex:bwd_main -c 1 --set full --import-source yes -o "$B/rep128" "$B/bh" time1 128 8192 0 0 \
            >"$B/ncu.log" 2>&1
        ncu -i "$B/rep128.ncu-rep" --print-details all >"$O/ncu_d128_s8k.txt" 2>&1
        ncu -i "$B/rep128.ncu-rep" --page source --csv --print-source sass >"$O/ncu_d128_s8k_sass.csv" 2>&1
        for s in 512 8192; do for c in 0 1; do
            echo "== d128 s$s causal $c"
            timeout 60 ncu -k regex:bwd_ -c 3 --metrics gpu__time_duration.sum "$B/bh" time1 128 $s $c 0 2>&1 \
                | grep -E "bwd_|duration"
        done; done >"$O/ncu_durations.txt"
        el "ncu done" ;;
    fwdbench)
        { "$B/fh" bench; "$B/fh" variants 128; } >"$O/fwd_harness_bench.log" 2>&1
        el "fwd harness bench / variants done" ;;
    *) echo "validate: unknown step $step"; exit 2 ;;
    esac; done
    el "done"
}

harness() {
    local step log env path name
    for step in ${*:-build test sanitize time}; do case $step in
    build) build harness ;;
    test)
        timeout 20 "$B/wc"
        for path in "sm90:" "sm80:FLASHATTN_EXT_DISABLE_SM90=1"; do
            name=${path%%:*}; log=$O/test_$name.log
            env ${path#*:} timeout 400 "$B/bh" test >"$log" 2>&1
            echo "test $name main kernel: $(tail -1 "$log") ($(grep -c '^PASS.*varlen' "$log") varlen passed)"
            grep -v "^PASS" "$log" | head -10
        done
        FLASHATTN_EXT_DISABLE_SM90=1 FLASHATTN_EXT_SMEM_LIMIT=$A100_SMEM timeout 400 "$B/bh" test bf16 \
            >"$O/test_a100_tiles.log" 2>&1
        echo "test sm80, A100 tiles (bf16): $(tail -1 "$O/test_a100_tiles.log")"
        grep -v "^PASS" "$O/test_a100_tiles.log" | head -10
        el "tests done" ;;
    sanitize)
        for env in "" "FLASHATTN_EXT_DISABLE_SM90=1"; do
            echo "memcheck ${env:-sm90}: $(env $env timeout 120 compute-sanitizer --tool memcheck "$B/bh" small 2>&1 | tail -1)"
            echo "racecheck ${env:-sm90}: $(env $env timeout 200 compute-sanitizer --tool racecheck "$B/bh" small 2>&1 | tail -1)"
        done ;;
    time)
        FLASHATTN_EXT_DISABLE_SM90=1 timeout 90 "$B/bh" time >"$O/time_sm80.log" 2>&1
        timeout 90 "$B/bh" time >"$O/time_sm90.log" 2>&1
        el "time; TFLOP/s sm80 main -> sm90 main:"
        paste "$O/time_sm80.log" "$O/time_sm90.log" | sed -E 's/bf16 (d= *[0-9]+) seqlen= *([0-9]+) b= *[0-9]+ h= *[0-9]+ (causal=[01] det=[01]) *: +[0-9.]+ ms +([0-9.]+) TFLOP\/s \(visible [0-9.]+\)/\1 s=\2 \3 \4/g; s/\t.* ([0-9.]+)$/ -> \1/'
        FLASHATTN_EXT_DISABLE_SM90=1 FLASHATTN_EXT_SMEM_LIMIT=$A100_SMEM timeout 90 "$B/bh" time >"$O/time_a100_tiles.log" 2>&1
        echo "sm80 kernel with the A100 tiles (on the H200):"; cat "$O/time_a100_tiles.log"
        echo "variants, sm90 main kernel:"; timeout 120 "$B/bh" timev 2>&1 | tee "$O/timev_sm90.log"
        echo "variants, sm80 main kernel:"; FLASHATTN_EXT_DISABLE_SM90=1 timeout 120 "$B/bh" timev 2>&1 | tee "$O/timev_sm80.log"
        echo "dense vs varlen, sm90 main kernel:"; timeout 120 "$B/bh" timevl 2>&1 | tee "$O/timevl_sm90.log" ;;
    varlen)
        for path in "sm90:" "sm80:FLASHATTN_EXT_DISABLE_SM90=1" \
                    "a100_tiles:FLASHATTN_EXT_DISABLE_SM90=1 FLASHATTN_EXT_SMEM_LIMIT=$A100_SMEM"; do
            name=${path%%:*}; log=$O/test_varlen_$name.log
            env ${path#*:} timeout 300 "$B/bh" test all varlen >"$log" 2>&1
            echo "varlen, $name main kernel: $(tail -1 "$log")"; grep -v "^PASS" "$log" | head -10
        done
        echo "dense vs varlen, sm90 main kernel:"; timeout 120 "$B/bh" timevl 2>&1 | tee "$O/timevl_sm90.log"
        el "varlen done" ;;
    *) echo "harness: unknown step $step"; exit 2 ;;
    esac; done
}

bench() {
    local r
    case ${1:-full} in
    full | quick)
        local quick=(); [ "${1:-full}" = quick ] && quick=(--quick)
        PYTHONUNBUFFERED=1 python3 benchmarks/bench_gpu.py "${quick[@]}" --out "$O" --time-budget "${BENCH_BUDGET:-240}" \
            >"$O/bench.log" 2>&1
        local rc=$?; tail -40 "$O/bench.log"; return $rc ;;
    variants)
        PYTHONUNBUFFERED=1 python3 benchmarks/bench_variants.py --out "$O" --time-budget "${VARIANTS_BUDGET:-240}" \
            >"$O/variants.log" 2>&1
        local rc=$?; tail -45 "$O/variants.log"; return $rc ;;
    fwd)
        [ -x "$B/fh" ] || build harness
        for r in 1 2; do
            echo "== static, run $r"; "$B/fh" bench
            echo "== HARNESS_DYNAMIC=1, run $r"; HARNESS_DYNAMIC=1 "$B/fh" bench
        done >"$O/harness_bench.log" 2>&1
        el "harness bench done" ;;
    fwd-check)
        [ -x "$B/fh" ] || build harness
        HARNESS_DYNAMIC=1 timeout 200 "$B/fh" check >"$B/check_dyn.log" 2>&1
        el "check (dynamic) rc $?: $(tail -1 "$B/check_dyn.log")"
        grep -v "^PASS" "$B/check_dyn.log" | tail -20 ;;
    fwd-probe)
        timeout 200 python3 dev/tools/fwd_probe.py --json "$O/fwd_probe.json" >"$O/fwd_probe.log" 2>&1; el "probe rc $?" ;;
    fwd-sweep)
        timeout 260 python3 benchmarks/bench_gpu.py --only fwd --time-budget "${SWEEP_BUDGET:-200}" --out "$B/sweep" \
            >"$O/sweep.log" 2>&1
        el "sweep rc $?"; cp "$B/sweep/results.json" "$O/sweep_results.json"; cp "$B/sweep/results.md" "$O/sweep_results.md" ;;
    *) echo "bench: unknown kind $1"; exit 2 ;;
    esac
}

# the backward main kernel's ncu sections and metrics (ncu bwd, ncu pair)
NCU_BWD_SECTIONS=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats
    --section SchedulerStats --section MemoryWorkloadAnalysis --section Occupancy)
NCU_BWD_METRICS=sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_sectors_op_red.sum

ncu_bwd() {
    local cand=csrc/cuda/bwd_sm90.cu cfg n src=()
    if [[ ${1:-} == *.cu ]]; then cand=$1; shift; fi
    for f in csrc/cuda/*.cu; do [ "$f" = csrc/cuda/bwd_sm90.cu ] || src+=("$f"); done
    nvcc $F dev/bwd_harness.cu "${src[@]}" "$cand" -o "$B/h_ncu" || exit 1
    for cfg in "${@:-64 8192}"; do
        set -- $cfg
        n=d$1_s$2
        timeout 240 ncu -k regex:bwd_main -c 1 "${NCU_BWD_SECTIONS[@]}" \
            --metrics $NCU_BWD_METRICS,smsp__inst_executed_pipe_xu.sum,smsp__cycles_active.avg \
            "$B/h_ncu" time1 "$1" "$2" 0 0 >"$O/ncu_$n.txt" 2>&1
        echo "== $n"; grep -E "Duration|gmma|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|No Eligible|Stall|Warp Cycles Per Issued|Active Warps Per Scheduler|Eligible Warps|xu.sum|op_red|L2 Cache Throughput|Registers Per" "$O/ncu_$n.txt" | head -40
    done
}

ncu_pair() { # cuDNN's backward main kernel (SDPA, cudnn backend) beside ours, one process and shape each, bf16
    local cfg n
    [ -f flashattn_ext/_C*.so ] || build ext
    for cfg in "${@:-128 8192 0}"; do
        set -- $cfg
        n=d$1_s$2_c$3
        timeout 240 ncu -k regex:"flash_bprop|bwd_main_sm90" -c 2 "${NCU_BWD_SECTIONS[@]}" --section LaunchStats \
            --section InstructionStats --metrics $NCU_BWD_METRICS,smsp__inst_executed.sum \
            python3 dev/tools/bwd_pair.py "$1" "$2" "$3" >"$O/ncu_pair_$n.txt" 2>&1
        echo "== $n (cuDNN first, then ours)"
        grep -E "^  [a-z_]+.*\(|Duration|gmma|inst_executed.sum|Executed Instructions  |Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Eligible Warps|op_red|L2 Cache Throughput|Registers Per|Grid Size|Shared Memory Config" \
            "$O/ncu_pair_$n.txt" | head -60
    done
}

ncu_fwd() {
    [ -x "$B/fh" ] || build harness
    # the causal s2048 d128 forward: bench's non-causal s2048 runs first (3 warm-up + 20 timed launches)
    HARNESS_SEQ=2048 timeout 150 ncu -k regex:flash_fwd_sm90 --launch-skip 23 -c 1 --set full --import-source yes \
        -o "$B/fwd128c" "$B/fh" bench 128 >"$B/ncu.log" 2>&1
    ncu -i "$B/fwd128c.ncu-rep" --print-details all >"$O/ncu_fwd128_causal_s2k.txt" 2>&1
    ncu -i "$B/fwd128c.ncu-rep" --page source --csv --print-source sass >"$B/sass.csv" 2>&1
    python3 dev/tools/ncu_sass_hot.py "$B/sass.csv" 45 >"$O/ncu_fwd128_causal_s2k_hot.txt" 2>&1
    el "ncu done"
}

ab() {
    local kernel=$1 modes=$2 bin=${TMPDIR:-/tmp}/fwd_variants objs=() f o v name patch src first="" mode
    shift 2
    mkdir -p "$bin"
    for f in csrc/cuda/*.cu dev/fwd_harness.cu; do
        [ "$f" = "csrc/cuda/$kernel.cu" ] && continue
        o="$bin/$(basename "$f" .cu).o"
        objs+=("$o")
        nvcc $F -c "$f" -o "$o" >"$o.log" 2>&1 || { echo "build $f failed"; grep -m5 error "$o.log"; } &
    done
    local variants=("${@:-base=}")
    for v in "${variants[@]}"; do
        name=${v%%=*} patch=${v#*=} src=csrc
        if [ -n "$patch" ]; then
            src=$bin/tree_$name/csrc
            rm -rf "$bin/tree_$name" && mkdir -p "$bin/tree_$name" && cp -r csrc "$src"
            patch -s -p1 -d "$bin/tree_$name" <"$patch" || { echo "patch $patch failed"; continue; }
        fi
        nvcc $F -Xptxas -v -c "$src/cuda/$kernel.cu" -o "$bin/k_$name.o" >"$bin/k_$name.log" 2>&1 \
            || { echo "build $name failed"; grep -m5 error "$bin/k_$name.log"; } &
    done
    wait
    for v in "${variants[@]}"; do
        name=${v%%=*}
        nvcc $F "${objs[@]}" "$bin/k_$name.o" -o "$bin/h_$name" || continue
        echo "== $v: registers / spills"
        grep -E "registers|spill" "$bin/k_$name.log" | sort | uniq -c
        [ -z "$first" ] && first=$name
    done
    [ -z "$first" ] && exit 1
    for mode in $modes; do
        if [ "$mode" = check ]; then
            echo "== check ($first)"
            timeout 300 "$bin/h_$first" check >"$bin/check.log" 2>&1 && echo "check passed" || echo "CHECK FAILED"
            grep -E "FAIL|passed|failed" "$bin/check.log" | tail -15
            continue
        fi
        if [ "${SM80:-0}" != 0 ]; then
            echo "== $mode, FLASHATTN_EXT_DISABLE_SM90=1 ($first)"
            FLASHATTN_EXT_DISABLE_SM90=1 timeout 120 "$bin/h_$first" "$mode" ${MODE_ARG:-}
        fi
        for v in "${variants[@]}"; do
            name=${v%%=*}
            [ -x "$bin/h_$name" ] || continue
            echo "== $mode: $v"
            timeout 120 "$bin/h_$name" "$mode" ${MODE_ARG:-} || echo "$mode FAILED (rc $?)"
        done
    done
}

# Other trees: built in place side by side, then pytest in each (args after --, default tests -k cuda).
tree() {
    local dirs=() d n args=(tests -k cuda)
    while [ $# -gt 0 ] && [ "$1" != -- ]; do dirs+=("$1"); shift; done
    [ "${1:-}" = -- ] && shift && [ $# -gt 0 ] && args=("$@")
    for d in "${dirs[@]}"; do
        n=$(basename "$d")
        (cd "$d" && FLASHATTN_EXT_CUDA_ARCHS=90a MAX_JOBS=${TREE_JOBS:-$((16 / ${#dirs[@]}))} \
            python3 setup.py build_ext --inplace >"$O/${n}_build.log" 2>&1; echo $? >"$B/${n}_rc") &
    done
    wait
    for d in "${dirs[@]}"; do
        n=$(basename "$d")
        if [ "$(cat "$B/${n}_rc")" != 0 ]; then
            el "$n: build failed"; grep -m8 -E "error|Error" "$O/${n}_build.log"; continue
        fi
        (cd "$d" && PYTHONPATH=$PWD PYTHONUNBUFFERED=1 timeout 400 python3 -m pytest -q -rf --maxfail=20 -n 12 \
            -p no:cacheprovider "${args[@]}" >"$O/${n}_pytest.log" 2>&1)
        el "$n pytest rc $?: $(tail -1 "$O/${n}_pytest.log")"
        grep -m10 "^FAILED" "$O/${n}_pytest.log" || true
    done
}

cmd=${1:-}
shift || true
case $cmd in
info)
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >"$O/gpu.txt" 2>&1
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())" \
        >>"$O/gpu.txt" ;;
build) build "$@" ;;
validate) validate "$@" ;;
test)
    PYTHONUNBUFFERED=1 python3 -m pytest tests -q -rf --maxfail=30 -n 8 -p no:cacheprovider "$@" >"$O/pytest.log" 2>&1
    rc=$?; tail -5 "$O/pytest.log"; exit $rc ;;
sanitize)
    sanitizer 590 memcheck "$O/sanitizer_memcheck.log"
    sanitizer 590 racecheck "$O/sanitizer_racecheck.log" ;;
harness) harness "$@" ;;
tree) tree "$@" ;;
bench) bench "$@" ;;
ncu)
    case ${1:-} in
    bwd) shift; ncu_bwd "$@" ;;
    pair) shift; ncu_pair "$@" ;;
    fwd) ncu_fwd ;;
    *) echo "ncu: bwd, pair or fwd"; exit 2 ;;
    esac ;;
ptx)
    FLASHATTN_EXT_CUDA_ARCHS=compute_80 MAX_JOBS=16 python3 setup.py build_ext --inplace >"$O/ptx_build.log" 2>&1 ||
        { tail -20 "$O/ptx_build.log"; exit 1; }
    el "built (compute_80 PTX only)"
    cuobjdump --list-elf flashattn_ext/_C*.so >"$O/ptx_elf.txt" 2>&1; echo "SASS images in the .so: $(grep -c sm_ "$O/ptx_elf.txt")"
    export CUDA_CACHE_PATH=$B/ptx_jit_cache && rm -rf "$CUDA_CACHE_PATH"
    for run in jit cached; do
        python3 - <<'PY' 2>&1 | sed "s/^/$run: /"
import time, torch, flashattn_ext
q = torch.randn(1, 128, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
t0 = time.perf_counter(); out = flashattn_ext.flash_attn_func(q, q, q, causal=True); torch.cuda.synchronize()
t1 = time.perf_counter(); out.sum().backward(); torch.cuda.synchronize(); t2 = time.perf_counter()
ref = torch.nn.functional.scaled_dot_product_attention(*(q.detach().transpose(1, 2).float(),) * 3, is_causal=True)
print(f"first forward {t1 - t0:.2f} s, first backward {t2 - t1:.2f} s, max |out - sdpa fp32| "
      f"{(out.float().transpose(1, 2) - ref).abs().max().item():.2e}")
PY
    done
    PYTHONUNBUFFERED=1 timeout 400 python3 -m pytest tests/test_cuda.py tests/test_variants.py -q -rf -k cuda -n 8 \
        -p no:cacheprovider >"$O/ptx_pytest.log" 2>&1
    el "pytest rc $?: $(tail -1 "$O/ptx_pytest.log")" ;;
ab) [ $# -ge 2 ] || { echo "ab: KERNEL \"MODES\" [NAME=[PATCH] ...]"; exit 2; }; ab "$@" ;;
*) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2 ;;
esac
