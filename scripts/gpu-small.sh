#!/usr/bin/env bash
# The small all_reduce's one-block kernel (kernels/gpu_small.cu, AIOCCL_GPU_SMALL_BYTES) on a GPU (about 4
# minutes; nothing without one):
#
#   scripts/gpu-small.sh          # MPS started here if not running: the kernel runs in the spin form only
#
# 1. exact at 2, 3 and 4 ranks: tests/workers/gpu_ops.py (every op x dtype, counts 1, 7, 13 and 1500: the
#    small kernel between the piece kernel's ops, the mismatch caught), gpu_lane.py (the native lane launching
#    it), the deadline (gpu_timeout.py) and CUDA graphs (gpu_graph.py);
# 2. aioccl-perf all_reduce on GPU buffers, 8 B .. 4 KiB, op + stream sync, 2 and 4 ranks, three runs each
#    alternating AIOCCL_GPU_SMALL_BYTES=0 (the piece kernel) and 4088 (the small kernel), JSON in $OUT.
# Output under $OUT (or ./gpu-small-out). Each step has its own time limit; the first failure stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
OUTDIR="${OUT:-gpu-small-out}"
source scripts/gpu-setup.sh
RUN=("$PY" -m aioccl.run --nproc-per-node)

echo "== 1. exact with the small kernel on, 2, 3 and 4 ranks"
export AIOCCL_GPU_SMALL_BYTES=4088
for n in 2 3 4; do
  timeout 90 "${RUN[@]}" "$n" tests/workers/gpu_ops.py 1 7 13 1500 2>&1 | tee "$OUTDIR/gpu_ops_small_n$n.txt" |
    grep -E "GPU_OK|FAIL|failures"
  GPU_LANE_EXPECT=1 timeout 90 "${RUN[@]}" "$n" tests/workers/gpu_lane.py 10 2>&1 |
    tee "$OUTDIR/gpu_lane_small_n$n.txt" | grep -E "LANE_|FAIL|failures"
done
timeout 60 "${RUN[@]}" 2 tests/workers/gpu_timeout.py 2>&1 | grep -E "TIMEOUT_OK|Error"
AIOCCL_GPU_SCRATCH=8192 timeout 60 "${RUN[@]}" 2 tests/workers/gpu_graph.py 2>&1 | grep -E "GRAPH_|Error"

echo "== 2. 8 B .. 4 KiB, the piece kernel (0) against the small kernel (4088), three runs each"
for n in 2 4; do
  for run in 1 2 3; do
    for small in 0 4088; do
      AIOCCL_GPU_SMALL_BYTES=$small timeout 60 "$PY" -m aioccl.tools.perf all_reduce --device gpu --np "$n" \
        -b 8 -e 4K -f 8 -n 200 -w 20 --engine thread --json "$OUTDIR/perf_small${small}_n${n}_run$run.json" \
        2>&1 | tee "$OUTDIR/perf_small${small}_n${n}_run$run.txt" | tail -n 4
    done
  done
done
echo "gpu-small: all passed; results in $OUTDIR"
