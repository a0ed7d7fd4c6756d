#!/usr/bin/env bash
# Issue 33's closing device run: scripts/gpu-check.sh (everything exact, MPS off), the deadline on the GPU in
# both forms, CUDA graphs, then aioccl-perf with MPS on (spin form). Steps go on after a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
ops="$PY -m aioccl.run --nproc-per-node"
perf="$PY -m aioccl.tools.perf all_reduce --device gpu --engine thread"
run() { echo "== $*"; timeout 150 "$@" 2>&1 | grep -E "GPU_OK|GRAPH|TIMEOUT|FAIL|failures [^0]|Error|exited|^ +[0-9]+ " | head -30 || echo "!! failed"; }
echo "#### gpu-check.sh (MPS off)"
timeout 330 bash scripts/gpu-check.sh 2 2>&1 | tail -60 || echo "!! gpu-check failed"
run $ops 2 tests/workers/gpu_timeout.py
echo "#### MPS on"
mkdir -p /tmp/mps/pipe /tmp/mps/log
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps/log
nvidia-cuda-mps-control -d && sleep 1
"$PY" -m aioccl.tools.info | grep -i "gpu"
run $ops 2 tests/workers/gpu_timeout.py
AIOCCL_GPU_SCRATCH=8192 run $ops 4 tests/workers/gpu_graph.py
for rep in 1 2 3; do run $perf --np 2 --sizes 8,1M,128M -n 50 -w 10; done
for rep in 1 2 3; do run $perf --np 4 --sizes 8 -n 50 -w 10; done
echo quit | nvidia-cuda-mps-control
