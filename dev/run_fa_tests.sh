#!/usr/bin/env bash
# Runs flash-attn's own tests/test_flash_attn.py against flashattn_ext's functions through the
# adapter in dev/fa_compat/ (a stand-in `flash_attn` package and a pytest plugin; the test file is
# not edited). Fetch the test file first with dev/fetch_flash_attn_tests.sh (into the ignored
# dev/third_party/, which is what to carry to a machine without network access).
#
#   dev/run_fa_tests.sh [cuda|cpu] [pytest arguments, e.g. -k test_flash_attn_output -x]
#
#   cuda (default): as flash-attn runs them, on the GPU in float16/bfloat16.
#   cpu: the tests' tensors on the CPU, computed in float32 (see dev/fa_compat/fa_compat_plugin.py).
# Environment:
#   FA_SAMPLE=N      run one case in N (the same ones every time), but at least ~FA_MIN_CASES
#                    (default 30) of each test function; all 509k cases of the file are supported,
#                    the KV-cache ones (304k) included (collection alone takes ~80 s and 3 GB).
#   FA_JOBS=J        J pytest processes over interleaved parts of the selection (default 1); on a
#                    machine with several GPUs, process i uses GPU i mod (number of GPUs).
#   FA_BACKEND=eager the same tests against dev/fa_compat/eager_backend.py (plain torch) instead of
#                    flashattn_ext: checks the adapter itself.
#   FA_REPORT_DIR    where the logs and JSON reports go (default $OUT if set, else
#                    ${TMPDIR:-/tmp}/fa_compat_reports).
#   PYTHON           the interpreter (default .venv/bin/python if present, else python3).
# Prints a table per test function and per feature (fa_summary.py); exit status 1 if a case failed.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
mode=${1:-cuda}
[ $# -gt 0 ] && shift
case $mode in
    cuda|cpu) ;;
    *) echo "usage: $0 [cuda|cpu] [pytest arguments]" >&2; exit 2 ;;
esac
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$root/.venv/bin/python" ]; then PYTHON=$root/.venv/bin/python; else PYTHON=python3; fi
fi
FA_VERSION=${FA_VERSION:-2.8.3}
src=$root/dev/third_party/flash_attn-$FA_VERSION
test_file=$src/tests/test_flash_attn.py
if [ ! -f "$test_file" ]; then
    echo "$test_file is missing: run dev/fetch_flash_attn_tests.sh" >&2
    exit 2
fi
jobs=${FA_JOBS:-1}
reports=${FA_REPORT_DIR:-${OUT:-${TMPDIR:-/tmp}/fa_compat_reports}}
mkdir -p "$reports"
rm -f "$reports"/fa_report_*.json "$reports"/fa_shard_*.log

gpus=1
if [ "$mode" = cuda ] && command -v nvidia-smi > /dev/null; then
    gpus=$(nvidia-smi -L | grep -c '^GPU')
    [ "$gpus" -ge 1 ] || gpus=1
fi

export PYTHONPATH=$root/dev/fa_compat:$root/dev/third_party/site:$root${PYTHONPATH:+:$PYTHONPATH}
export FA_DEVICE=$mode FA_SRC=$src
cd "$root"
echo "flash-attn $FA_VERSION tests, $mode, FA_SAMPLE=${FA_SAMPLE:-1}, $jobs process(es) on $gpus GPU(s); logs in $reports"
pids=()
for ((i = 0; i < jobs; i++)); do
    gpu_env=()
    [ "$mode" = cuda ] && [ -z "${CUDA_VISIBLE_DEVICES:-}" ] && gpu_env=(CUDA_VISIBLE_DEVICES=$((i % gpus)))
    env "${gpu_env[@]}" FA_SHARD="$i/$jobs" FA_REPORT="$reports/fa_report_$i.json" \
        "$PYTHON" -m pytest -p fa_compat_plugin -c dev/fa_compat/pytest.ini --rootdir "$src" "$test_file" \
        -q "$@" > "$reports/fa_shard_$i.log" 2>&1 &
    pids+=($!)
done
for ((i = 0; i < jobs; i++)); do
    wait "${pids[$i]}"
    echo "process $i: $(tail -n 1 "$reports/fa_shard_$i.log")"
done
"$PYTHON" "$root/dev/fa_compat/fa_summary.py" "$reports"/fa_report_*.json
