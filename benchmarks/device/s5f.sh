#!/bin/bash
# Session 5, a last short call (~1.5 min + start) for branch next/kv-addr (per-lane row addressing of quantized KV
# rows, unchecked full tiles): carry .carry/s5f (snapshot.sh of the branch + libbefore.so.gz = main's library) and
# .carry/site. The decode attention tests, then decode attention at 131072 keys before / after / before / after.
R=$(cd "$(dirname "$0")/../.." && pwd); K=$R/.carry/s5f; T=/tmp/c5f; L=/tmp/s5f; mkdir -p $L
mkdir -p $T && tar xzf $K/src.tgz -C $T && gunzip -c $K/libcmpkern.so.gz > $T/llamacmp/lib/libcmpkern.so
gunzip -c $K/libbefore.so.gz > /tmp/libbefore.so
cd $T
export PYTHONPATH=$R/.carry/site:$T PYTHONUNBUFFERED=1
T0=$(date +%s); st() { echo "$(( $(date +%s) - T0 ))s $*" >> $L/progress.log; }
st start $(cat $K/COMMIT)
timeout 70 python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_attention_cuda.py -k "decode or kv_type or tq3" \
    > $L/tests.log 2>&1; echo rc=$? >> $L/tests.log; st tests
for i in 1 2; do for lib in /tmp/libbefore.so $T/llamacmp/lib/libcmpkern.so; do
  LLAMACMP_LIB=$lib timeout 30 python3 benchmarks/bench_attention.py --decode-only --n-kv 131072 \
      > $L/attn_$(basename $lib .so)_$i.log 2>&1
done; done; st attn
tar czf $OUT/s5f.tgz -C /tmp s5f; cat $L/progress.log; tail -n 2 $L/tests.log; grep -h "time vs f16" $L/attn_*.log
