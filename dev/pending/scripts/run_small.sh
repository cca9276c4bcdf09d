#!/bin/bash
# bwd_sm80 main kernel: the small tiles on the >=227 KB path too (-12 instantiations); A/B on the sm80 path of the H200
git show HEAD:csrc/cuda/tiles.h > /tmp/tiles_small.h && patch -s /tmp/tiles_small.h dev/pending/i34_bwd80_main_small_tiles.patch
export TMPDIR=/tmp/small_ab FLASHATTN_EXT_DISABLE_SM90=1
mkdir -p $TMPDIR
timeout 560 bash dev/ab_sed.sh 2 "bh time" small='csrc/cuda/tiles.h</tmp/tiles_small.h' > $OUT/small_ab.log 2>&1
echo "rc $?" >> $OUT/small_ab.log
python3 dev/ab_table.py $OUT/small_ab.log | tee $OUT/small_table.txt
