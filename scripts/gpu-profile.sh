#!/usr/bin/env bash
# Host-side cost of GPU ops (benchmarks/gpu_op_profile.py) with MPS off and on, in each synchronisation form.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 AIOCCL_DEBUG=INFO AIOCCL_DEBUG_SUBSYS=GPU
prof="$PY -m aioccl.run --nproc-per-node"
run() { echo "== $*"; timeout 120 "$@" 2>&1 | grep -E "PROFILE|synchronised|FAIL|Error|GPU_OK|ncalls|tottime|^ +[0-9]" | head -40 || echo "!! failed"; }
echo "#### MPS off"
run $prof 2 benchmarks/gpu_op_profile.py 8
AIOCCL_GPU_SYNC=spin PROFILE_STATS=0 run $prof 2 benchmarks/gpu_op_profile.py 8
echo "#### MPS on"
mkdir -p /tmp/mps/pipe /tmp/mps/log
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps/log
nvidia-cuda-mps-control -d && sleep 1
run $prof 2 benchmarks/gpu_op_profile.py 8
AIOCCL_GPU_SYNC=stream PROFILE_STATS=0 run $prof 2 benchmarks/gpu_op_profile.py 8
PROFILE_STATS=0 run $prof 2 benchmarks/gpu_op_profile.py 1048576
PROFILE_STATS=0 run $prof 4 benchmarks/gpu_op_profile.py 8
run $prof 2 tests/workers/gpu_ops.py 1 1500 100000
run $prof 4 tests/workers/gpu_ops.py 7
echo quit | nvidia-cuda-mps-control
