#!/bin/bash
# Device check of candidates for csrc/cuda/bwd_sm90.cu against the working tree's file, without torch:
# the harness's correctness suite (`test`) through each candidate, then TFLOP/s side by side.
# Every step has a timeout and line-buffered logs, so a hang still leaves a trace. A candidate's own
# directory comes first on the include path (a wgmma.cuh beside it replaces csrc/cuda's).
# Run from the repo root: bash dev/cand_run.sh cand1.cu [cand2.cu ...]   (logs under $OUT)
# ORIG_TEST=1 also runs the suite through the working tree's file, CAND_TEST=0 skips it for the
# candidates (timings only); SANITIZE=1 adds memcheck + racecheck on each binary the suite runs on.
B=/tmp/cand; mkdir -p $B; O=${OUT:-$B}
F="-std=c++17 -O3 -lineinfo -gencode=arch=compute_90a,code=sm_90a -Icsrc -Icsrc/cuda -DFLASHATTN_EXT_SM90A"
S="dev/bwd_harness.cu csrc/cuda/launch.cu csrc/cuda/bwd_sm80.cu csrc/cuda/bwd_simple.cu csrc/cuda/fwd_sm80.cu
   csrc/cuda/fwd_sm90.cu csrc/cuda/fwd_decode.cu csrc/cuda/fwd_simple.cu" # the harness calls launch.cu
t0=$(date +%s)
nvcc $F $S csrc/cuda/bwd_sm90.cu -o $B/c0 > $O/build_c0.log 2>&1 &
i=0; for c in "$@"; do i=$((i + 1)); nvcc -I$(dirname $c) $F $S $c -o $B/c$i > $O/build_c$i.log 2>&1 & done
wait
echo "build $(( $(date +%s) - t0 )) s; c0 = csrc/cuda/bwd_sm90.cu$(i=0; for c in "$@"; do i=$((i + 1)); echo -n ", c$i = $c"; done)"
n=$#; first=1; last=$n; [ -n "$ORIG_TEST" ] && first=0; [ "${CAND_TEST:-1}" = 0 ] && last=0
for i in $(seq $first $last); do
    [ -x $B/c$i ] || { echo "c$i build failed"; tail -20 $O/build_c$i.log; continue; }
    for D in 64 128; do echo "c$i one config: $(timeout 20 stdbuf -oL $B/c$i time1 $D 2048 0 0 2>&1 || echo 'TIMEOUT/FAIL (hang?)')"; done
    timeout 150 stdbuf -oL $B/c$i test > $O/test_c$i.log 2>&1
    echo "c$i test rc=$?: $(tail -1 $O/test_c$i.log)  ($(( $(date +%s) - t0 )) s)"; grep -v "^PASS" $O/test_c$i.log | head -10
    if [ -n "$SANITIZE" ]; then
        timeout 90 compute-sanitizer --tool memcheck $B/c$i small 2>&1 | tail -2
        timeout 120 compute-sanitizer --tool racecheck $B/c$i small 2>&1 | tail -2
    fi
done
for i in $(seq 0 $n); do [ -x $B/c$i ] && timeout 60 stdbuf -oL $B/c$i time > $O/time_c$i.log 2>&1; done
echo "TFLOP/s c0 -> c1 ... ($(( $(date +%s) - t0 )) s):"
python3 - $O $n <<'PY'
import re, sys
o, n = sys.argv[1], int(sys.argv[2])
cols = []
for i in range(n + 1):
    try: cols.append([l for l in open(f"{o}/time_c{i}.log") if "TFLOP" in l])
    except OSError: cols.append([])
for k, l in enumerate(cols[0]):
    m = re.search(r"d= *(\d+) seqlen= *(\d+).*causal=(\d) det=(\d)", l)
    v = [re.search(r"([0-9.]+) TFLOP", c[k]).group(1) if k < len(c) else "-" for c in cols]
    print(f"d={m.group(1):>3} s={m.group(2):>4} causal={m.group(3)} det={m.group(4)}: " + " -> ".join(v))
PY
