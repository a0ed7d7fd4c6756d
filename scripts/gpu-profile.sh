#!/usr/bin/env bash
# Host-side cost of GPU ops (benchmarks/gpu_op_profile.py) and aioccl-perf all_reduce, MPS off and on.
#   scripts/gpu-profile.sh [REPS]   # REPS perf runs per setting (default 3), medians are taken from them
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
REPS="${1:-3}"
OUTDIR="${OUT:-gpu-profile-out}"
mkdir -p "$OUTDIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
prof="$PY -m aioccl.run --nproc-per-node"
perf="$PY -m aioccl.tools.perf all_reduce --device gpu --engine thread"
run() { echo "== $*"; timeout 120 "$@" 2>&1 | grep -E "GRAPH|Assertion|PROFILE|synchronised|FAIL|Error|GPU_OK|LANE_|HANDOFF|ncalls|tottime|^\[rank 0\] +[0-9]|^ +[0-9]+ " | head -40 || echo "!! failed"; }
for mps in off on; do
  echo "#### MPS $mps"
  if [ "$mps" = on ]; then
    mkdir -p /tmp/mps/pipe /tmp/mps/log
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps/log
    nvidia-cuda-mps-control -d && sleep 1
  fi
  AIOCCL_GPU_SCRATCH=8192 run $prof 2 tests/workers/gpu_graph.py
  AIOCCL_GPU_SCRATCH=8192 run $prof 3 tests/workers/gpu_graph.py
  AIOCCL_DEBUG=INFO AIOCCL_DEBUG_SUBSYS=GPU run $prof 2 benchmarks/gpu_op_profile.py 8
  run $prof 2 tests/workers/gpu_lane.py 3  # LANE_HOST: host time per op, native lane
  AIOCCL_NATIVE=0 run $prof 2 tests/workers/gpu_lane.py 1  # ... and the Python path
  run $prof 2 benchmarks/gpu_handoff.py 200  # what a hand-off costs with and without kernels around it
  for rep in $(seq "$REPS"); do
    run $perf --np 2 --sizes 8,1M,16M,128M -n 50 -w 10 --json "$OUTDIR/perf_np2_mps${mps}_$rep.json"
    run $perf --np 4 --sizes 8,1M -n 50 -w 10 --json "$OUTDIR/perf_np4_mps${mps}_$rep.json"
  done
done
echo quit | nvidia-cuda-mps-control
