#!/bin/bash
# On the GPU machine, from main's root, after prep.sh here (ab/pre512, ab/t5, ab/sm86, ab/half). One call each, in order:
#   run_q.sh build d512 t5ab   builds main + the four trees at once (5 x MAX_JOBS=3), the d512 landing's A/B
#                              (paged_fp32_ab.py, main vs ab/pre512, 3 rounds), T5 v7's A/B on the sm90 path (t5_ab.py,
#                              ab/t5 vs main, 3 rounds)
#   run_q.sh t5ab80 sm86       T5 v7's A/B on the sm80 path; ab/sm86's checks (fh check with and without the sm86 limit, the test, memcheck) and A/B
#   run_q.sh t5suite           pytest -k cuda on ab/t5;  run_q.sh t5san: memcheck / racecheck on ab/t5
#   run_q.sh half              ab/half's fp32 fallback tests (i36_half_fp32.patch) and its bf16 d256 / d512 speed
#   run_q.sh host              benchmarks/bench_host.py --device cuda on main (host time per call)
#   run_q.sh sm86dec           main's decode kernel at sm86 / sm89's 99 KB (the test, test_kvcache -k cuda there)
#   run_q.sh dqb               issue 35's bulk dQ (ab/dqb): its bwd_harness test, then bh time1 rounds beside main
#   run_q.sh dqb2              the same in the HOOK d128 kernel too (ab/dqb2): its bh test, bh timev rounds
# Each step stops taking rounds past 520 s of the call, so what it has comes back.
set -u
R=$PWD
S=$R/dev/pending/scripts
left() { [ $SECONDS -lt 520 ]; }
rounds() { # name env script tree base
    local name=$1 env=$2 script=$3 tree=$4 base=$5
    for r in 1 2 3; do
        for t in $tree $base; do
            left || { echo "$name: stopped at round $r (time)"; break 2; }
            d=$R; [ $t != main ] && d=$R/ab/$t
            (cd $d && env $env PYTHONPATH=$d timeout 120 python3 $script > $OUT/${name}_${t}_$r.txt 2>&1) \
                || echo "$name $t round $r failed: $(tail -2 $OUT/${name}_${t}_$r.txt)"
        done
    done
    python3 $S/ab_cmp.py $OUT ${name}_$tree ${name}_$base | tee $OUT/${name}.md
}
for step in "$@"; do
    echo "== $step at ${SECONDS}s"
    case $step in
    build)
        for t in main pre512 t5 sm86 half; do
            d=$R; [ $t != main ] && d=$R/ab/$t
            [ -f $d/build/.done ] && continue
            ( cd $d && start=$SECONDS && MAX_JOBS=3 python3 setup.py build_ext --inplace > $OUT/build_$t.log 2>&1 \
                && touch build/.done; echo "build $t rc $? in $((SECONDS - start)) s" ) &
        done
        wait ;;
    d512) rounds d512 "" $S/paged_fp32_ab.py main pre512 ;;
    t5ab) rounds t5ab90 "" $S/t5_ab.py t5 main ;;
    t5ab80) rounds t5ab80 FLASHATTN_EXT_DISABLE_SM90=1 $S/t5_ab.py t5 main ;;
    sm86)
        cd ab/sm86
        export PYTHONPATH=$PWD
        B=/tmp/sm86_dev bash dev/device.sh build harness > $OUT/sm86_harness_build.log 2>&1
        for lim in 101376 ""; do
            FLASHATTN_EXT_DISABLE_SM90=1 FLASHATTN_EXT_SMEM_LIMIT=$lim timeout 150 /tmp/sm86_dev/fh check > $OUT/fh_check_$lim.log 2>&1
            echo "fh check (sm80 path, smem limit '${lim}') rc $?: $(tail -1 $OUT/fh_check_$lim.log)"
            grep -E "FAIL" $OUT/fh_check_$lim.log | head -5
        done
        timeout 150 python3 -m pytest tests/test_cuda.py -q -p no:cacheprovider -k shared_memory 2>&1 | tail -2
        cat > /tmp/sm86_call.py <<'PY'
import torch, flashattn_ext
for kw in ({}, {"causal": True, "softcap": 20.0}, {"dropout_p": 0.2}):
    q, k, v = (torch.randn(2, 200, 2, 256, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flashattn_ext.flash_attn_func(q, k, v, **kw)
torch.cuda.synchronize()
print("ok")
PY
        FLASHATTN_EXT_DISABLE_SM90=1 FLASHATTN_EXT_SMEM_LIMIT=101376 timeout 120 compute-sanitizer --tool memcheck python3 /tmp/sm86_call.py > $OUT/sm86_memcheck.log 2>&1
        echo "memcheck rc $?: $(tail -1 $OUT/sm86_memcheck.log)"
        unset PYTHONPATH
        cd $R
        rounds sm86ab FLASHATTN_EXT_DISABLE_SM90=1 $S/sm86_fwd_ab.py sm86 main
        (cd ab/sm86 && FLASHATTN_EXT_DISABLE_SM90=1 FLASHATTN_EXT_SMEM_LIMIT=101376 PYTHONPATH=$PWD timeout 100 \
            python3 $S/sm86_fwd_ab.py > $OUT/sm86_small.txt 2>&1); cat $OUT/sm86_small.txt ;;
    half) # the fp32 fallback of fp16 / bf16 calls (ab/half = main + i36_half_fp32.patch, branch half-fp32)
        cd ab/half
        PYTHONPATH=$PWD timeout 300 python3 -m pytest tests/test_headdim_v.py tests/test_cuda.py -q -n 8 -p no:cacheprovider \
            -k "cuda and (large_head_dims or varlen_dv or half_backward or shared_memory or last_cuda or head_dim_limit or paged_raises)" \
            > $OUT/half.log 2>&1; echo "half tests rc $?: $(tail -1 $OUT/half.log)"; grep -h "^FAILED" $OUT/half.log | head -20
        PYTHONPATH=$PWD timeout 100 python3 - <<'PY'
import torch, flashattn_ext
from triton.testing import do_bench
for d in (256, 512):
    q, k, v = (torch.randn(1, 4096, 8, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    out = flashattn_ext.flash_attn_func(q, k, v, causal=True)
    g = torch.randn_like(out)
    fwd = do_bench(lambda: flashattn_ext.flash_attn_func(q, k, v, causal=True))
    step = do_bench(lambda: torch.autograd.grad(flashattn_ext.flash_attn_func(q, k, v, causal=True), (q, k, v), g))
    fl = 4 * 4096 * 4096 * 8 * d / 2
    print(f"bf16 causal d{d} s4k: fwd {fwd:.3f} ms ({fl / fwd / 1e9:.0f} TFLOP/s), bwd {step - fwd:.3f} ms ({2.5 * fl / (step - fwd) / 1e9:.0f} TFLOP/s)")
PY
        cd $R ;;
    sm86dec) # main's decode on sm86 / sm89's shared memory (fwd_decode.cu decode_warps: 3 warps at d128, 2 at d256)
        PYTHONPATH=$R timeout 300 python3 -m pytest tests/test_cuda.py -q -p no:cacheprovider -k "sm86 or shared_memory" \
            2>&1 | tail -3
        FLASHATTN_EXT_DISABLE_SM90=1 FLASHATTN_EXT_SMEM_LIMIT=101376 PYTHONPATH=$R timeout 300 python3 -m pytest \
            tests/test_kvcache.py -q -n 8 -p no:cacheprovider -k cuda 2>&1 | tail -3 ;;
    host) # host time per call beside torch's SDPA (main), bf16 short training shapes
        PYTHONPATH=$R timeout 200 python3 benchmarks/bench_host.py --device cuda --out $OUT/host ;;
    dqb) # issue 35 rank 1, FlashAttention-3's bulk dQ at d128 (ab/dqb = main + i35_dq_bulk.patch, branch dq-bulk):
        # both trees' harnesses (dev/ab_sed.sh, 0 rounds: builds only), ab/dqb's bh test (every config; the d 65..128
        # dense ones run the changed kernel), then rounds of bh time1 beside main in turn until 560 s of the call
        W=/tmp/dqb/ab_sed
        TMPDIR=/tmp/dqb timeout 240 bash dev/ab_sed.sh 0 "" dqb=@ab/dqb > $OUT/dqb_build.log 2>&1
        echo "harness builds rc $? at ${SECONDS}s"; grep FAIL $OUT/dqb_build.log | head -5
        timeout 150 $W/dqb/bh test all > $OUT/dqb_test.log 2>&1
        echo "dqb bh test rc $?: $(grep -c ^PASS $OUT/dqb_test.log) PASS, $(grep -c ^FAIL $OUT/dqb_test.log) FAIL"
        grep ^FAIL $OUT/dqb_test.log | head -8
        C=("128 2048 0 0" "128 8192 0 0" "128 8192 1 0" "128 512 0 0" "96 8192 0 0" "128 2048 1 0" "64 8192 0 0")
        for r in 0 1 2 3 4 5; do
            for c in "${C[@]}"; do
                for n in $([ $((r % 2)) = 0 ] && echo "base dqb" || echo "dqb base"); do
                    [ $SECONDS -lt 560 ] || break 3
                    echo "== round $r $n: bh time1 $c"
                    timeout 30 $W/$n/bh time1 $c || echo "FAILED rc $?"
                done
            done
        done > $OUT/dqb_ab.log 2>&1
        tail -1 $OUT/dqb_ab.log
        python3 dev/ab_table.py $OUT/dqb_ab.log | tee $OUT/dqb_table.txt ;;
    dqb2) # the bulk dQ in the HOOK d128 kernel too (ab/dqb2 = main + i35_dq_bulk_hook.patch, branch dq-bulk2): its bh
        # test, then rounds of bh timev (the variants at s8k: softcap, ALiBi, masks, dropout at d128) beside main
        W=/tmp/dqb2/ab_sed
        TMPDIR=/tmp/dqb2 timeout 240 bash dev/ab_sed.sh 0 "" dqb2=@ab/dqb2 > $OUT/dqb2_build.log 2>&1
        echo "harness builds rc $? at ${SECONDS}s"; grep FAIL $OUT/dqb2_build.log | head -5
        timeout 150 $W/dqb2/bh test all > $OUT/dqb2_test.log 2>&1
        echo "dqb2 bh test rc $?: $(grep -c ^PASS $OUT/dqb2_test.log) PASS, $(grep -c ^FAIL $OUT/dqb2_test.log) FAIL"
        grep ^FAIL $OUT/dqb2_test.log | head -8
        for r in 0 1 2 3 4 5; do
            for n in $([ $((r % 2)) = 0 ] && echo "base dqb2" || echo "dqb2 base"); do
                [ $SECONDS -lt 500 ] || break 2
                echo "== round $r $n: bh timev"
                timeout 60 $W/$n/bh timev || echo "FAILED rc $?"
            done
        done > $OUT/dqb2_ab.log 2>&1
        tail -1 $OUT/dqb2_ab.log
        python3 dev/ab_table.py $OUT/dqb2_ab.log | tee $OUT/dqb2_table.txt ;;
    t5suite) bash $S/run_t5.sh suite ;;
    t5san) bash $S/run_t5.sh sanitize ;;
    *) echo "unknown step $step"; exit 2 ;;
    esac
done
echo "== done at ${SECONDS}s"
