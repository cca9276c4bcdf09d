#!/bin/bash
# Nsight Compute profile of the backward main kernel through the harness: tensor-pipe use, issue
# stalls, memory, for bf16 configs given as "D SEQLEN" pairs. Run from the repo root:
#   bash dev/ncu_run.sh [candidate_bwd_sm90.cu] ["64 8192" "128 8192" ...]   (logs under $OUT)
CAND=${1:-csrc/cuda/bwd_sm90.cu}; shift; B=/tmp/ncu; mkdir -p $B; O=${OUT:-$B}
F="-std=c++17 -O3 -lineinfo -gencode=arch=compute_90a,code=sm_90a -Icsrc -Icsrc/cuda -DFLASHATTN_EXT_SM90A"
S="dev/bwd_harness.cu csrc/cuda/launch.cu csrc/cuda/bwd_sm80.cu csrc/cuda/bwd_simple.cu csrc/cuda/fwd_sm80.cu
   csrc/cuda/fwd_sm90.cu csrc/cuda/fwd_decode.cu csrc/cuda/fwd_simple.cu" # the harness calls launch.cu
nvcc $F $S $CAND -o $B/h || exit 1
for cfg in "${@:-64 8192}"; do
    set -- $cfg
    n=d$1_s$2
    timeout 240 ncu -k regex:bwd_main -c 1 --section SpeedOfLight --section ComputeWorkloadAnalysis \
        --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section Occupancy \
        --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed_pipe_xu.sum,lts__t_sectors_op_red.sum,smsp__cycles_active.avg \
        $B/h time1 $1 $2 0 0 > $O/ncu_$n.txt 2>&1
    echo "== $n"; grep -E "Duration|gmma|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|No Eligible|Stall|Warp Cycles Per Issued|Active Warps Per Scheduler|Eligible Warps|xu.sum|op_red|L2 Cache Throughput|Registers Per" $O/ncu_$n.txt | head -40
done
