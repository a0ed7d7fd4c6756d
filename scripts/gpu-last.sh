#!/usr/bin/env bash
# JAX and torch on the device path, and the deadline in the stream form (the steps gpu-final.sh's run missed).
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
ops="$PY -m aioccl.run --nproc-per-node"
run() { echo "== $*"; timeout 150 "$@" 2>&1 | grep -E "OK|TIMEOUT|FAIL|failures [^0]|Error|exited|c10d n=|Traceback|line [0-9]" | head -30 || echo "!! failed"; }
run $ops 2 tests/workers/gpu_timeout.py
JAX_PLATFORMS=cuda run $ops 2 tests/workers/jax_process.py
JAX_PLATFORMS=cuda run $ops 2 tests/workers/jax_parity.py
run $PY -m torch.distributed.run --nproc-per-node 2 tests/workers/torch_c10d.py cuda
mkdir -p /tmp/mps/pipe /tmp/mps/log
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps/log
nvidia-cuda-mps-control -d && sleep 1
echo "#### MPS on"
JAX_PLATFORMS=cuda run $ops 2 tests/workers/jax_process.py
run $PY -m torch.distributed.run --nproc-per-node 2 tests/workers/torch_c10d.py cuda
echo quit | nvidia-cuda-mps-control
