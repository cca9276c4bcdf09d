#!/usr/bin/env bash
# One call on the lent GPU machine: build the extension against its torch, run the GPU tests,
# the sanitizers and the benchmark, writing logs and JSON under $OUT (or ./gpu_out).
#   scripts/gpu_check.sh [steps...]   steps: build test sanitize bench quickbench variants (default: build test bench)
# Env: BENCH_BUDGET (seconds for the benchmark sweep, default 240), VARIANTS_BUDGET (seconds for the
# variant benchmark, default 240), PYTEST_ARGS.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUT"
steps=${*:-build test bench}
status=0

log() { echo "== $(date +%T) $*" | tee -a "$OUT/summary.txt"; }

for step in $steps; do
  case $step in
  build)
    log "build"
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())" >> "$OUT/gpu.txt"
    start=$(date +%s)
    FLASHATTN_EXT_CUDA_ARCHS=90a MAX_JOBS=16 python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 \
      || { log "BUILD FAILED"; tail -50 "$OUT/build.log"; exit 1; }
    log "build ok in $(( $(date +%s) - start )) s"
    ;;
  test)
    log "pytest"
    # 8 xdist workers: the suite run serially does not fit one device call.
    PYTHONUNBUFFERED=1 python3 -m pytest tests -q -rf --maxfail=30 -n 8 -p no:cacheprovider ${PYTEST_ARGS:-} \
      > "$OUT/pytest.log" 2>&1 || status=1
    tail -5 "$OUT/pytest.log" | tee -a "$OUT/summary.txt"
    ;;
  sanitize)
    log "compute-sanitizer"
    for tool in memcheck racecheck; do
      PYTHONUNBUFFERED=1 compute-sanitizer --tool $tool --print-limit 20 python3 scripts/sanitize_small.py \
        > "$OUT/sanitizer_$tool.log" 2>&1 || status=1
      tail -3 "$OUT/sanitizer_$tool.log" | tee -a "$OUT/summary.txt"
    done
    ;;
  bench)
    log "bench_gpu"
    PYTHONUNBUFFERED=1 python3 benchmarks/bench_gpu.py --out "$OUT" --time-budget "${BENCH_BUDGET:-240}" \
      > "$OUT/bench.log" 2>&1 || status=1
    tail -40 "$OUT/bench.log"
    ;;
  quickbench)
    log "bench_gpu --quick"
    PYTHONUNBUFFERED=1 python3 benchmarks/bench_gpu.py --quick --out "$OUT" --time-budget "${BENCH_BUDGET:-120}" \
      > "$OUT/bench.log" 2>&1 || status=1
    tail -40 "$OUT/bench.log"
    ;;
  variants)
    log "bench_variants"
    PYTHONUNBUFFERED=1 python3 benchmarks/bench_variants.py --out "$OUT" --time-budget "${VARIANTS_BUDGET:-240}" \
      > "$OUT/variants.log" 2>&1 || status=1
    tail -45 "$OUT/variants.log"
    ;;
  *)
    log "unknown step $step"; status=1 ;;
  esac
done
exit $status
