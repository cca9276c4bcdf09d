#!/bin/bash
# After run_split2.sh (its binaries under /tmp/split2/ab_sed are gone on a fresh machine: rebuilt here for the
# trees named, default all three): bh test bf16 of each on the sm80 path, rows also on the sm90 path.
export TMPDIR=/tmp/split2c
mkdir -p $TMPDIR
names=${*:-small dq rows}
args=""
for n in $names; do args="$args $n=@ab/$n"; done
timeout 300 bash dev/ab_sed.sh 0 "" $args > $OUT/split2c_build.log 2>&1
W=$TMPDIR/ab_sed
for n in $names; do (FLASHATTN_EXT_DISABLE_SM90=1 timeout 90 $W/$n/bh test bf16 > $OUT/bh80_$n.log 2>&1; echo "$n bh test bf16 sm80 rc $?: $(tail -1 $OUT/bh80_$n.log)"); done
case " $names " in *" rows "*) (timeout 90 $W/rows/bh test bf16 > $OUT/bh90_rows.log 2>&1; echo "rows bh test bf16 sm90 rc $?: $(tail -1 $OUT/bh90_rows.log)") ;; esac
grep -h FAIL $OUT/bh*.log | head
