#!/bin/bash
# On the GPU machine, from main's root, after prep.sh here (the ab/ trees of the queue). One call each, in order:
#   run_q.sh build d512        (BUILD_TREES="main t5v14": only those; BUILD_JOBS each, default 3) builds main + the trees at once;
#                              d512: the d512 landing's A/B (paged_fp32_ab.py, main vs ab/pre512, 3 rounds)
#   run_q.sh sm86              ab/sm86's checks (fh check with and without the sm86 limit, the test, memcheck) and A/B
#   run_q.sh t5suite           pytest -k cuda on ab/$T5_TREE (default t5v14);  run_q.sh t5san: memcheck / racecheck there
#   run_q.sh host              benchmarks/bench_host.py --device cuda on main (host time per call)
#   run_q.sh simpletests       main's CUDA tests of the fp32 / fp64 kernels, simple.cu (after `BUILD_TREES=main run_q.sh build`)
#   run_q.sh simpleab          paged_fp32_ab.py in main and ab/presimple (7a04002, before the simple.cu merge), 3 rounds
#   run_q.sh memtrace          issue 35's peak memory: the >= 1 MiB allocations of one forward + backward, ours and cuDNN's
#   run_q.sh sm86test          ab/sm86's shared-memory tests alone, with their assertion lines
#   run_q.sh sm86dec           main's decode kernel at sm86 / sm89's 99 KB (the test, test_kvcache -k cuda there)
#   run_q.sh mainval           main's CPU-verified landings of 2026-12-07 on the GPU (after `build`)
#   run_q.sh regtest           main's registry test (its shared-memory probe past the decode kernel's rows), after `build`
#   run_q.sh mix               cuDNN's backward main kernel and ours, d128 s8k (causal and not): the executed
#                              instruction mix by opcode and class (ncu source counters, dev/tools/ncu_sass_mix.py);
#                              both SASS pages come back gzipped (mix_*.csv.gz, 4 files + 2 tables: the device tool
#                              returns 8 files at most, so the ncu logs stay in /tmp)
#   run_q.sh mixours           ours alone (main's build, or ab/$MIX_TREE's), bf16 d128 s8k causal and not: the
#                              executed instructions per source line (sass_lines.py --exec); 5 files back
#   run_q.sh bwdncu            after bwdab: ncu of the backward main kernel in main and in each ab/ tree of $BWD_AB (d128 s8k causal)
#   run_q.sh bwdab             the ab/ trees of $BWD_AB (backward patches): bh test all, bh time1 beside main
#   run_q.sh bwdabv            after bwdab on the same machine: bh timev (the variants' rows) of the same trees
#   run_q.sh d512test          main's (or ab/$D512_TREE's) CUDA tests (test_headdim_v, test_sanitize, test_fuzz);
#                              d512san: memcheck, racecheck (d > 256 configs); d512bench: bench_headdims.py (BENCH_S s)
#   run_q.sh detsan            main: racecheck over test_sanitize.py --det, pytest -k 'cuda and determin' (stat_ahead)
#   run_q.sh fwdab             the ab/ trees of $FWD_AB (default p512) beside main: fh check bf16, fh bench 256 in rounds
#   run_q.sh dsmem             dev/dsmem_probe.cu: ns per step of a partial-score exchange between the 2 CTAs of a cluster
#   run_q.sh t5test            ab/$T5_TREE's (default t5v14) test_rel_bias -k cuda on both paths
#   run_q.sh t5v14ab / t5v14abh  ab/t5v14 (main + i34_t5_stack) beside main, t5_ab.py rounds (abh: the HOOK rows only, 6 rounds)
#   run_q.sh t5ncu             ab/$T5NCU_TREE's (default t5v14) backward main kernel with ALiBi, then with T5's table (ncu, same inputs)
# Each step stops taking rounds past 520 s of the call, so what it has comes back.
set -u
R=$PWD
S=$R/dev/pending/scripts
left() { [ $SECONDS -lt 520 ]; }
sm86_tests() { # in ab/sm86: its shared-memory tests, with the assertion's lines
    timeout 150 python3 -m pytest tests/test_cuda.py -q -p no:cacheprovider -k "shared_memory or sm86" 2>&1 \
        | grep -E "passed|failed|^E " | cut -c1-400 | head -12
}
rotated() { # round r's order of base and the trees of $V (bwdab, bwdabv): each round starts one later
    local t=(base $V) k
    k=$(($1 % ${#t[@]}))
    echo "${t[@]:k}" "${t[@]:0:k}"
}
rounds() { # name env script tree base
    local name=$1 env=$2 script=$3 tree=$4 base=$5
    for r in $(seq 1 ${ROUNDS:-3}); do
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
    cd $R # a step may cd into its tree
    echo "== $step at ${SECONDS}s"
    case $step in
    build)
        for t in ${BUILD_TREES:-main pre512 t5 sm86}; do
            d=$R; [ $t != main ] && d=$R/ab/$t
            [ -f $d/build/.done ] && continue
            ( cd $d && start=$SECONDS && MAX_JOBS=${BUILD_JOBS:-3} python3 setup.py build_ext --inplace > /tmp/build_$t.log 2>&1 \
                && touch build/.done; rc=$?; echo "build $t rc $rc in $((SECONDS - start)) s"
                [ $rc = 0 ] || grep -E "error|Error" /tmp/build_$t.log | head -8 ) & # logs in /tmp: 8 files come back
        done
        wait ;;
    d512) rounds d512 "" $S/paged_fp32_ab.py main pre512 ;;
    simpleab) rounds simpleab "" $S/paged_fp32_ab.py main presimple ;; # the simple.cu merge (c65d077): its fp32 rows beside 7a04002 (BUILD_TREES="main presimple" build first)
    t5v14ab) rounds t5v14ab90 T5_AB_SKIP_T5_IN=main $S/t5_ab.py t5v14 main ;; # the T5 stack as it would land beside main: the other HOOK variants' cost (issue 34: within 1%), T5 beside ALiBi in the tree
    t5v14abh) ROUNDS=${ROUNDS:-6} rounds t5v14abh90 "T5_AB_SKIP_T5_IN=main T5_AB_ONLY_HOOK=1" $S/t5_ab.py t5v14 main ;; # the HOOK rows only, 6 rounds, beside main (2026-12-07g: the others are the same machine code)
    d512test) # the fp16 / bf16 backward at d 257..512 (bwd_sm80.cu D512, landed 2026-12-07j) in main or ab/$D512_TREE: its CUDA tests
        [ -n "${D512_TREE:-}" ] && cd ab/$D512_TREE
        PYTHONPATH=$PWD timeout 240 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_headdim_v.py tests/test_sanitize.py \
            -k "cuda or sanitizer" > $OUT/d512test.log 2>&1
        echo "test_headdim_v -k cuda + test_sanitize rc $?: $(tail -1 $OUT/d512test.log)"; grep -h "^FAILED" $OUT/d512test.log | head -8
        PYTHONPATH=$PWD timeout 150 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_fuzz.py -k cuda > /tmp/d512fuzz.log 2>&1
        echo "test_fuzz -k cuda rc $?: $(tail -1 /tmp/d512fuzz.log)"; grep -h "^FAILED" /tmp/d512fuzz.log | head -5 ;;
    detsan) # main (stat_ahead, ae19dc8): racecheck over test_sanitize.py's deterministic configs, the CUDA tests of
        # deterministic mode (bitwise reproducibility and the reference)
        PYTHONPATH=$R PYTHONUNBUFFERED=1 timeout 300 compute-sanitizer --tool racecheck --print-limit 20 python3 \
            tests/test_sanitize.py --det > /tmp/detsan.log 2>&1
        echo "racecheck --det rc $?: $(tail -1 /tmp/detsan.log)"; grep -m3 -E "Race|hazard|ERROR" /tmp/detsan.log
        PYTHONPATH=$R timeout 240 python3 -m pytest -q -n 12 -p no:cacheprovider tests -k "cuda and determin" \
            > $OUT/detsan_pytest.log 2>&1
        echo "pytest -k 'cuda and determin' rc $?: $(tail -1 $OUT/detsan_pytest.log)"
        grep -h "^FAILED" $OUT/detsan_pytest.log | head -5 ;;
    d512san) # main or ab/$D512_TREE: memcheck over test_sanitize.py's configs, racecheck over its d > 256 ones (--large)
        [ -n "${D512_TREE:-}" ] && cd ab/$D512_TREE
        for run in "memcheck" "racecheck --large"; do
            set -- $run
            PYTHONPATH=$PWD PYTHONUNBUFFERED=1 timeout 200 compute-sanitizer --tool $1 --print-limit 20 python3 \
                tests/test_sanitize.py ${2:-} > /tmp/d512_$1.log 2>&1
            echo "$run rc $?: $(tail -1 /tmp/d512_$1.log)"; grep -m3 -E "Invalid|Race|hazard|ERROR" /tmp/d512_$1.log
        done ;;
    fwdab) # the forward patches of $FWD_AB (ab/ tree names, default "p512"; e.g. "ndv p512") beside main in the torch-free
        # forward harness: fh check bf16 on each, then fh bench 256 in rotated rounds (p512: the dense d256 kernel carries
        # the pair's body; ndv: the d256 kernels' short S / one P V half; their other fwd_sm90 kernels are main's SASS)
        V=${FWD_AB:-p512}
        TMPDIR=/tmp/fwdab timeout 420 bash dev/ab_sed.sh ${ROUNDS:-4} "fh check bf16;fh bench 256" \
            $(for v in $V; do echo "$v=@ab/$v"; done) > $OUT/fwdab.log 2>&1
        echo "ab_sed rc $?: $(grep -c FAIL $OUT/fwdab.log) FAIL lines"; grep -m5 FAIL $OUT/fwdab.log
        python3 dev/ab_table.py $OUT/fwdab.log | tee $OUT/fwdab_table.txt ;;
    d512bench) # main or ab/$D512_TREE: issue 36's benchmark (bench_headdims.py: 512 beside 256, (192, 128) beside (160, 160))
        (cd $R/${D512_TREE:+ab/$D512_TREE} && PYTHONPATH=$PWD timeout 400 python3 benchmarks/bench_headdims.py --time-budget ${BENCH_S:-300} \
            --out $OUT/headdims) ;;
    dsmem) # issue 36's d512 design: the cost of one partial-score exchange between the 2 CTAs of a cluster (dev/dsmem_probe.cu)
        ( nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc/cuda dev/dsmem_probe.cu -o /tmp/dsmem_probe) \
            && timeout 120 /tmp/dsmem_probe ;;
    t5test) # ab/$T5_TREE's (default t5v14) T5 tests on CUDA, the sm90 path then the sm80 path
        t=${T5_TREE:-t5v14}
        for dis in 0 1; do
            (cd ab/$t && FLASHATTN_EXT_DISABLE_SM90=$dis PYTHONPATH=$PWD timeout 200 python3 -m pytest -q -n 8 \
                -p no:cacheprovider tests/test_rel_bias.py -k cuda > $OUT/${t}test_$dis.log 2>&1)
            echo "$t test_rel_bias -k cuda (DISABLE_SM90=$dis) rc $?: $(tail -1 $OUT/${t}test_$dis.log)"
            grep -h "^FAILED" $OUT/${t}test_$dis.log | head -5
        done ;;
    sm86)
        cd ab/sm86
        export PYTHONPATH=$PWD
        B=/tmp/sm86_dev bash dev/device.sh build harness > $OUT/sm86_harness_build.log 2>&1
        for lim in 101376 ""; do
            FLASHATTN_EXT_DISABLE_SM90=1 FLASHATTN_EXT_SMEM_LIMIT=$lim timeout 150 /tmp/sm86_dev/fh check > $OUT/fh_check_$lim.log 2>&1
            echo "fh check (sm80 path, smem limit '${lim}') rc $?: $(tail -1 $OUT/fh_check_$lim.log)"
            grep -E "FAIL" $OUT/fh_check_$lim.log | head -5
        done
        sm86_tests
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
    sm86test) (cd ab/sm86 && PYTHONPATH=$PWD sm86_tests) ;;
    sm86dec) # main's decode on sm86 / sm89's shared memory (fwd_decode.cu decode_warps: 3 warps at d128, 2 at d256)
        PYTHONPATH=$R timeout 300 python3 -m pytest tests/test_cuda.py -q -p no:cacheprovider -k "sm86 or shared_memory" \
            2>&1 | tail -3
        FLASHATTN_EXT_DISABLE_SM90=1 FLASHATTN_EXT_SMEM_LIMIT=101376 PYTHONPATH=$R timeout 300 python3 -m pytest \
            tests/test_kvcache.py -q -n 8 -p no:cacheprovider -k cuda 2>&1 | tail -3 ;;
    host) # host time per call beside torch's SDPA (main), bf16 short training shapes
        PYTHONPATH=$R timeout 200 python3 benchmarks/bench_host.py --device cuda --out $OUT/host ;;
    regtest)
        PYTHONPATH=$R timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_registry.py -k cuda 2>&1 | tail -3 ;;
    mix)
        for cfg in "128 8192 0" "128 8192 1"; do
            set -- $cfg
            n=d$1_s$2_c$3
            for who in cudnn:flash_bprop ours:bwd_main_sm90; do
                tag=${who%%:*}
                PYTHONPATH=$R timeout 150 ncu -k regex:${who#*:} -c 1 --section SourceCounters --section WarpStateStats \
                    -f -o /tmp/mix_${tag}_$n python3 dev/tools/bwd_pair.py $1 $2 $3 > /tmp/mix_${tag}_$n.log 2>&1 \
                    || { echo "ncu $tag $n failed:"; tail -3 /tmp/mix_${tag}_$n.log; }
                ncu -i /tmp/mix_${tag}_$n.ncu-rep --page source --csv --print-source sass > /tmp/mix_${tag}_$n.csv 2>&1
                gzip -c /tmp/mix_${tag}_$n.csv > $OUT/mix_${tag}_$n.csv.gz
            done
            python3 dev/tools/ncu_sass_mix.py cudnn=/tmp/mix_cudnn_$n.csv ours=/tmp/mix_ours_$n.csv --top 40 | tee $OUT/mix_$n.txt
            left || break
        done ;;
    mixours) # our backward main kernel (bf16 d128 s8k, causal then not, in ab/$MIX_TREE, default main's tree): the executed instructions per source line and class (ncu source page joined to the
        # build's own cubin by dev/tools/sass_lines.py --exec); the pages and the SASS come back gzipped
        t=${MIX_TREE:+ab/$MIX_TREE}; t=${t:-.}
        K=_Z20bwd_main_sm90_kernelI13__nv_bfloat16Li128ELi64ELb0ELb0ELb0EEv12flash_params10bwd90_maps
        PATH=$PATH:$(dirname "$(command -v nvcc)"):/usr/local/cuda/bin
        rm -rf /tmp/cub && mkdir /tmp/cub && (cd /tmp/cub && cuobjdump -xelf all $R/$t/flashattn_ext/_C.abi3.so > /dev/null)
        f=$(for c in /tmp/cub/*sm_90a*.cubin; do readelf -sW $c | grep -q " $K$" && echo $c; done | head -1)
        idx=$(readelf -sW $f | awk -v k=$K '$NF == k {sub(":", "", $1); print $1}')
        nvdisasm -gi -c -fun $idx $f > /tmp/ours.sass && gzip -c /tmp/ours.sass > $OUT/ours_d128.sass.gz
        echo "cubin $f function $idx: $(wc -l < /tmp/ours.sass) lines"
        for c in 1 0; do
            (cd ab/$t && PYTHONPATH=$PWD timeout 150 ncu -k regex:bwd_main_sm90 -c 1 --section SourceCounters \
                -f -o /tmp/mo_$c python3 dev/tools/bwd_pair.py 128 8192 $c > /tmp/mo_$c.log 2>&1) \
                || { echo "ncu causal=$c failed:"; tail -3 /tmp/mo_$c.log; }
            ncu -i /tmp/mo_$c.ncu-rep --page source --csv --print-source sass > /tmp/mo_$c.csv 2>&1
            gzip -c /tmp/mo_$c.csv > $OUT/mixours_c$c.csv.gz
            python3 dev/tools/sass_lines.py /tmp/ours.sass --exec /tmp/mo_$c.csv 60 > $OUT/mixours_c$c.txt; head -30 $OUT/mixours_c$c.txt
            python3 dev/tools/sass_lines.py /tmp/ours.sass --stalls /tmp/mo_$c.csv 30 | head -12
            left || break
        done ;;
    bwdab) # the backward patches of $BWD_AB (ab/ tree names, required; e.g. 2026-12-07g: dqalt dqalt1 kvst) beside main
        # in the torch-free harness, built at once: bh test all on each, then bh time1 in interleaved rounds (rotated
        # order), s512-s8k
        V=${BWD_AB:?BWD_AB: the ab/ trees to time}
        W=/tmp/bwdab/ab_sed
        TMPDIR=/tmp/bwdab timeout 300 bash dev/ab_sed.sh 0 "" $(for v in $V; do echo "$v=@ab/$v"; done) > /tmp/bwdab_build.log 2>&1
        echo "harness builds rc $? at ${SECONDS}s"; grep FAIL /tmp/bwdab_build.log | head -5
        for v in base $V; do # in parallel (correctness only; base = main)
            (timeout 150 $W/$v/bh test all > /tmp/${v}_test.log 2>&1; echo "rc $?" >> /tmp/${v}_test.log) &
        done
        wait
        for v in base $V; do
            echo "$v bh test $(tail -1 /tmp/${v}_test.log): $(grep -c ^PASS /tmp/${v}_test.log) PASS, $(grep -c ^FAIL /tmp/${v}_test.log) FAIL at ${SECONDS}s"
            grep ^FAIL /tmp/${v}_test.log | head -5
        done
        C=("128 2048 0 0" "128 8192 1 0" "128 512 1 0" "128 8192 0 0" "128 2048 1 0" "128 1024 1 0" "128 8192 1 1" "256 8192 0 0")
        [ -n "${BWD_ROWS:-}" ] && IFS=';' read -ra C <<<"$BWD_ROWS" # e.g. d256t: "256 2048 0 0;256 8192 0 0;256 2048 1 0;..." 
        for r in 0 1 2 3 4 5; do
            for c in "${C[@]}"; do
                for n in $(rotated $r); do
                    [ $SECONDS -lt 560 ] || break 3
                    echo "== round $r $n: bh time1 $c"
                    timeout 30 $W/$n/bh time1 $c || echo "FAILED rc $?"
                done
            done
        done > $OUT/bwdab.log 2>&1
        python3 dev/ab_table.py $OUT/bwdab.log | tee $OUT/bwdab_table.txt ;;
    bwdabv) # after bwdab on the same (warm) machine, its harnesses: bh timev (14 variant rows: the HOOK kernels, d64 and
        # d256 softcap / ALiBi, dropout, deterministic) of base and each of $BWD_AB in rotated rounds
        V=${BWD_AB:?BWD_AB: the ab/ trees to time}
        W=/tmp/bwdab/ab_sed
        for v in base $V; do [ -x $W/$v/bh ] || { echo "bwdabv: $W/$v/bh missing (run bwdab first, same machine)"; continue 2; }; done
        for r in 0 1 2 3 4 5; do
            for n in $(rotated $r); do
                [ $SECONDS -lt 540 ] || break 2
                echo "== round $r $n: bh timev"
                timeout 120 $W/$n/bh timev || echo "FAILED rc $?"
            done
        done > $OUT/bwdabv.log 2>&1
        python3 dev/ab_table.py $OUT/bwdabv.log | tee $OUT/bwdabv_table.txt ;;
    bwdncu) # after bwdab on the same (warm) machine, else its build first: ncu of the backward main kernel, bf16 d128 s8k
        # causal, in main and each of $BWD_AB (required): shared-memory wavefronts, pipe use, issue stalls
        V=${BWD_AB:?BWD_AB: the ab/ trees to profile}
        W=/tmp/bwdab/ab_sed
        built=1
        for v in base $V; do [ -x $W/$v/bh ] || built=0; done
        if [ $built = 0 ]; then
            TMPDIR=/tmp/bwdab timeout 300 bash dev/ab_sed.sh 0 "" $(for v in $V; do echo "$v=@ab/$v"; done) > /tmp/bwdab_build.log 2>&1
            echo "harness builds rc $? at ${SECONDS}s"
        fi
        for v in base $V; do
            timeout 120 ncu -k regex:bwd_main_sm90 -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis_Tables \
                --section WarpStateStats --section ComputeWorkloadAnalysis --section InstructionStats \
                $W/$v/bh time1 128 8192 1 0 > $OUT/bwdncu_$v.txt 2>&1 || echo "ncu $v rc $?"
            echo "== $v"; grep -E "Duration|Executed Instructions  |Issue Slots Busy|Shared .*Wavefronts|Bank Conflicts|No Eligible|Stall (Long|Short|Barrier|Math|MIO|Wait)|Warp Cycles Per Issued" $OUT/bwdncu_$v.txt | head -16
            left || break
        done ;;
    mainval) # main's CPU-verified landings of 2026-12-07 (T5 fp16 / bf16 through the fp32 kernels, the registry
        # test's rule, the SDPA shortcut, _core._dispatch), on main's own build (`build` first, or dev/device.sh build ext)
        PYTHONPATH=$R timeout 400 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_rel_bias.py \
            tests/test_registry.py tests/test_core.py tests/test_attention.py tests/test_cuda.py \
            -k "cuda or registry or shared_memory or sdpa_plain or recorder" > $OUT/mainval.log 2>&1
        echo "mainval rc $?: $(tail -1 $OUT/mainval.log)"; grep -h "^FAILED" $OUT/mainval.log | head -10
        PYTHONPATH=$R timeout 120 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_fuzz.py -k "rel_bias and cuda" \
            2>&1 | tail -1 ;;
    t5ncu) # where T5's backward loses to ALiBi's in ab/$T5NCU_TREE (default t5v14; after `build`): both main kernels in one process per shape,
        # the sections of dev/device.sh ncu pair, then the T5 kernel's hottest SASS lines (source page)
        for cfg in "128 8192 0" "64 8192 1"; do
            set -- $cfg
            n=d$1_s$2_c$3
            (cd ab/${T5NCU_TREE:-t5v14} && PYTHONPATH=$PWD timeout 200 ncu -k regex:bwd_main_sm90 -c 2 --section SpeedOfLight \
                --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
                --section MemoryWorkloadAnalysis --section InstructionStats --section LaunchStats \
                --metrics smsp__inst_executed.sum,smsp__sass_inst_executed_op_local_ld.sum,smsp__sass_inst_executed_op_local_st.sum \
                python3 $S/t5_ncu.py $1 $2 $3 > $OUT/t5ncu_$n.txt 2>&1)
            echo "== $n (ALiBi first, then T5)"
            grep -E "^  [a-z_]+.*\(|Duration|inst_executed|local_|shared_|Executed Instructions  |Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Eligible Warps|Stall|Registers Per" $OUT/t5ncu_$n.txt | head -50
            left || break
        done
        (cd ab/${T5NCU_TREE:-t5v14} && PYTHONPATH=$PWD timeout 150 ncu -k regex:bwd_main_sm90 --launch-skip 1 -c 1 --set full \
            --import-source yes -o /tmp/t5rep python3 $S/t5_ncu.py 128 8192 0 > $OUT/t5ncu_full.log 2>&1 && \
            ncu -i /tmp/t5rep.ncu-rep --page source --csv --print-source sass > /tmp/t5sass.csv 2>&1 && \
            python3 dev/tools/ncu_sass_hot.py /tmp/t5sass.csv 60 > $OUT/t5ncu_hot.txt 2>&1)
        echo "t5 hot lines: $(wc -l < $OUT/t5ncu_hot.txt 2>/dev/null)" ;;
    simpletests) # main's fp32 / fp64 kernels (simple.cu, merged 2026-12-07h) on CUDA (after `BUILD_TREES=main run_q.sh build`)
        (PYTHONPATH=$PWD timeout 250 python3 -m pytest tests -q -n 12 -p no:cacheprovider \
            -k "cuda and (float32 or float64 or fp32 or fp64 or rel_bias or headdim or registry or gradcheck)" \
            > $OUT/simple_tests.log 2>&1)
        echo "simple.cu tests rc $?: $(tail -1 $OUT/simple_tests.log)"; grep -h "^FAILED" $OUT/simple_tests.log | head -10 ;;
    memtrace) # issue 35's peak memory: every allocation of >= 1 MiB in one forward + backward, ours and cuDNN's, in the
        # built tree $MEM_TREE (default main's)
        (cd ${MEM_TREE:-.} && PYTHONPATH=$PWD timeout 200 python3 $S/mem_trace.py 2>&1 | tee $OUT/memtrace.txt \
            | head -60) ;;
    t5suite) bash $S/run_t5.sh suite ;;
    t5san) bash $S/run_t5.sh sanitize ;;
    *) echo "unknown step $step"; exit 2 ;;
    esac
done
echo "== done at ${SECONDS}s"
