# Sourced by the one-call device scripts (dev/device_validate.sh, dev/fwd_probe.sh) from the repo root, with $B
# set: builds the extension in place for sm_90a beside every CUDA source and both torch-free harnesses as objects
# under $B, links $B/bh (bwd_harness) and $B/fh (fwd_harness), and exits when the extension failed to build.
# Defines F (the harnesses' nvcc flags), t0 and el (elapsed-time log lines); exports PYTHONPATH.
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
F="-std=c++17 -O3 -lineinfo -gencode=arch=compute_90a,code=sm_90a -Icsrc -Icsrc/cuda -DFLASHATTN_EXT_SM90A"
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
( FLASHATTN_EXT_CUDA_ARCHS=90a MAX_JOBS=10 python3 setup.py build_ext --inplace > $B/build_ext.log 2>&1; echo $? > $B/ext_rc ) &
for f in csrc/cuda/*.cu dev/bwd_harness.cu dev/fwd_harness.cu; do
    nvcc $F -c $f -o $B/$(basename $f .cu).o > $B/$(basename $f .cu).log 2>&1 || echo "FAIL $f" &
done
wait
K="$B/launch.o $B/bwd_sm80.o $B/bwd_sm90.o $B/bwd_simple.o $B/fwd_sm80.o $B/fwd_sm90.o $B/fwd_decode.o $B/fwd_simple.o"
nvcc $F $B/bwd_harness.o $K -o $B/bh & nvcc $F $B/fwd_harness.o $K -o $B/fh & wait
el "builds; ext rc $(cat $B/ext_rc)"; [ "$(cat $B/ext_rc)" = 0 ] || { tail -30 $B/build_ext.log; exit 1; }
