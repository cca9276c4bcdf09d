#!/bin/bash
# hi/lo v2 (ab/hilo2, made by prep.sh) beside main: fh variants 128 and bh timev, 2 rounds interleaved
export TMPDIR=/tmp/hilo_ab
mkdir -p $TMPDIR
timeout 570 bash dev/ab_sed.sh 2 "fh variants 128;bh timev" hilo2=@ab/hilo2 > $OUT/hilo2_ab.log 2>&1
echo rc $? >> $OUT/hilo2_ab.log
python3 dev/ab_table.py $OUT/hilo2_ab.log > $OUT/hilo2_table.txt 2>&1
grep -A3 "variants" $OUT/hilo2_ab.log | head -5; tail -3 $OUT/hilo2_ab.log
