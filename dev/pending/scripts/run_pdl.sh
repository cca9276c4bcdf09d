#!/bin/bash
# PDL patch tree (= main + i35_bwd_pdl): pytest -k cuda (also main's new torch.func CUDA fuzz cases) + sm80 bh test all
cd ab/pdl
export B=/tmp/pdl
bash dev/device.sh build ext harness > $OUT/pdl_build.log 2>&1 || { tail -20 $OUT/pdl_build.log; exit 1; }
tail -2 $OUT/pdl_build.log
(FLASHATTN_EXT_DISABLE_SM90=1 timeout 400 /tmp/pdl/bh test all > $OUT/pdl_bh_sm80.log 2>&1; echo "bh sm80 rc $?: $(tail -1 $OUT/pdl_bh_sm80.log)") &
PYTHONPATH=$PWD PYTHONUNBUFFERED=1 timeout 420 python3 -m pytest tests -q -rf --maxfail=30 -n 12 -k cuda -p no:cacheprovider > $OUT/pdl_pytest.log 2>&1
echo "pytest rc $?: $(tail -1 $OUT/pdl_pytest.log)"
wait
PYTHONPATH=$PWD timeout 100 python3 dev/tools/host_probe.py > $OUT/host_probe.txt 2>&1; head -4 $OUT/host_probe.txt
grep -v "^PASS" $OUT/pdl_bh_sm80.log | head
grep -E "^FAILED|Error" $OUT/pdl_pytest.log | head -30
