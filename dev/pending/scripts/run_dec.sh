#!/bin/bash
# decode paged runtime v2 (one kernel per head dim and dtype, the main loop held twice): fh decode-bench and
# paged-bench beside main, 3 rounds interleaved, then fh check of the patched tree (paged and KV-cache cases)
export TMPDIR=/tmp/dec_ab
mkdir -p $TMPDIR
git show HEAD:csrc/cuda/fwd_decode.cu > /tmp/fwd_decode_v2.cu && patch -s /tmp/fwd_decode_v2.cu dev/pending/i34_decode_paged_runtime.patch
timeout 480 bash dev/ab_sed.sh 3 "fh decode-bench;fh paged-bench" dec='csrc/cuda/fwd_decode.cu</tmp/fwd_decode_v2.cu' > $OUT/dec_ab.log 2>&1
echo "rc $?" >> $OUT/dec_ab.log
timeout 100 $TMPDIR/ab_sed/dec/fh check > $OUT/dec_check.log 2>&1; echo "fh check rc $?: $(tail -1 $OUT/dec_check.log)"
grep -A12 "round 2 dec: fh decode" $OUT/dec_ab.log | head -14; grep -A12 "round 2 base: fh decode" $OUT/dec_ab.log | head -14
