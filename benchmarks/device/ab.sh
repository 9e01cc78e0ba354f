#!/bin/bash
# A/B of kernel libraries on the device, in parts (each under the 10-minute limit; the next within 30 s of the last so
# the machine stays warm). Carry the folder CARRY (default .carry/ab) and .carry/site; CARRY holds snapshot.sh's
# src.tgz, libcmpkern.so.gz and COMMIT (the library under test), libbefore.so.gz (the one to compare against, e.g.
# main's), optionally more lib*.so.gz (variants), vocab.pkl.gz and, for part 2, sm70.tgz (`make ptx70`'s
# build/sm70/libcmpkern.so of the same commit; older ones also held libcudart.so.12). Logs go to $OUT.
#   bash benchmarks/device/ab.sh 1 [CARRY]   the CUDA test files; decode attention per layer at 32768 / 131072 keys,
#                                            every library, interleaved; issue 7 part c (whole token at 131072, f16
#                                            vs tq3), before and after, twice
#   bash benchmarks/device/ab.sh 2 [CARRY]   ncu of one tq3 decode-attention launch at 131072 keys; the suite on the
#                                            compute_70 PTX build
#   bash benchmarks/device/ab.sh 3 [CARRY]   decode attention per layer, every library; part c of all but before
#   bash benchmarks/device/ab.sh 4 [CARRY]   the other CUDA test files (sparse prefill, checkpoints, memory plan,
#                                            bench CLI, vision, split)
#   bash benchmarks/device/ab.sh 5 [CARRY]   issue 7 part c of the library under test alone, four times
R=$(cd "$(dirname "$0")/../.." && pwd); K=$R/${2:-.carry/ab}; T=/tmp/ab; L=/tmp/ab_$1; mkdir -p $L
if [ ! -e $T/llamacmp/lib/libcmpkern.so ]; then
  mkdir -p $T && tar xzf $K/src.tgz -C $T && gunzip -c $K/libcmpkern.so.gz > $T/llamacmp/lib/libcmpkern.so
  ln -sf $R/llamacmp/data/default.gguf $T/llamacmp/data/default.gguf
  gunzip -c $K/libbefore.so.gz > /tmp/libbefore.so
  mkdir -p /tmp/vocab && gunzip -c $K/vocab.pkl.gz > /tmp/vocab/qwen35_vocab_v1_8dde380a6405e935.pkl
fi
cd $T
export PYTHONPATH=$R/.carry/site:$T PYTHONUNBUFFERED=1 LLAMACMP_CACHE=/tmp/vocab
NEW=$T/llamacmp/lib/libcmpkern.so
T0=$(date +%s); st() { echo "$(( $(date +%s) - T0 ))s $*" >> $L/progress.log; }
st start $(cat $K/COMMIT) part $1
LIBS="/tmp/libbefore.so $NEW"   # and the variants: every other lib*.so.gz of the carry
for z in $K/lib*.so.gz; do
  n=$(basename $z .so.gz); [ $n = libcmpkern ] || [ $n = libbefore ] && continue
  gunzip -c $z > /tmp/$n.so; LIBS="$LIBS /tmp/$n.so"
done
# the 9B-shape Q8_0 file with the real vocabulary (~60 s), once per machine
make_m9b() {
  [ -e /tmp/m9bv.gguf ] || python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from bench_model import make_9b; \
make_9b('/tmp/m9bv.gguf', '/tmp/vocab')" > $L/m9b.log 2>&1
}
# decode attention per layer, every library, interleaved, twice
attn_all() {
  for i in 1 2; do for lib in $LIBS; do
    LLAMACMP_LIB=$lib timeout 60 python3 benchmarks/bench_attention.py --decode-only --n-kv 32768,131072 \
        > $L/attn_$(basename $lib .so)_$i.log 2>&1
  done; done; st attn
}
# issue 7 part c (whole token at 131072, f16 vs tq3) with library $1, its log named $2
part_c() {
  LLAMACMP_LIB=$1 timeout 80 python3 benchmarks/long_context.py --parts c --m9b /tmp/m9bv.gguf --n-gen 256 \
      > $L/partc_$2.log 2>&1
}
show() {
  for f in $L/attn_*.log; do [ -e $f ] && { echo "$(basename $f)"; grep -h "time vs f16" $f; }; done
  for f in $L/partc_*.log; do [ -e $f ] && { echo "$(basename $f)"; grep -h "^| " $f; }; done
}
case "$1" in
1)
  ( make_m9b; touch /tmp/m9b_ab.done ) &
  timeout 230 python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_attention_cuda.py tests/test_kernels_cuda.py \
      tests/test_decode_cuda.py tests/test_device_sampling.py tests/test_model_cuda.py > $L/tests.log 2>&1
  echo rc=$? >> $L/tests.log; st tests
  attn_all
  while [ ! -e /tmp/m9b_ab.done ]; do sleep 1; done; st m9b
  for i in 1 2; do for lib in /tmp/libbefore.so $NEW; do part_c $lib $(basename $lib .so)_$i; done; done; st partc
  tail -n 2 $L/tests.log; show ;;
2)
  cat > /tmp/ncu_tq3.py <<'PY'
import sys; sys.path.insert(0, "benchmarks")
import bench_attention as ba
from llamacmp.backends.cuda import CudaBackend
print(ba.bench_case(CudaBackend(), 131072, 1, "tq3", "tq3", 1))
PY
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  timeout 90 $NCU --clock-control none -k regex:attn_decode_kernel -s 2 -c 1 --set full -o $L/tq3 python3 /tmp/ncu_tq3.py \
      > $L/ncu.log 2>&1; timeout 40 $NCU -i $L/tq3.ncu-rep --page details > $L/ncu_details.txt 2>&1; rm -f $L/tq3.ncu-rep
  st ncu
  mkdir -p /tmp/sm70 && tar xzf $K/sm70.tgz -C /tmp/sm70
  LLAMACMP_LIB=/tmp/sm70/libcmpkern.so CUDA_CACHE_PATH=/tmp/cuda-jit CUDA_CACHE_MAXSIZE=4294967296 timeout 300 \
      python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_kernels_cuda.py tests/test_model_cuda.py \
      tests/test_decode_cuda.py tests/test_attention_cuda.py tests/test_device_sampling.py > $L/tests_sm70.log 2>&1
  echo rc=$? >> $L/tests_sm70.log; st tests-sm70
  tail -n 2 $L/tests_sm70.log; grep -E "Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|Executed Ipc A|DRAM Throughput" $L/ncu_details.txt | head -12 ;;
3)
  attn_all; make_m9b
  for lib in ${LIBS#/tmp/libbefore.so }; do part_c $lib $(basename $lib .so); done; st partc
  show ;;
4)
  timeout 420 python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_sparse_cuda.py tests/test_checkpoints_cuda.py \
      tests/test_memplan.py tests/test_bench_cli.py tests/test_vision_cuda.py tests/test_vision_model_cuda.py \
      tests/test_split_cuda.py > $L/tests_rest.log 2>&1
  echo rc=$? >> $L/tests_rest.log; st tests-rest; tail -n 3 $L/tests_rest.log ;;
5)
  make_m9b; st m9b
  for i in 1 2 3 4; do part_c $NEW $i; done; st partc
  show ;;
*)
  echo "usage: ab.sh PART [CARRY] (PART 1..5)"; exit 2 ;;
esac
tar czf $OUT/ab_$1.tgz -C /tmp ab_$1; cat $L/progress.log
