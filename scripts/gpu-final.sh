#!/usr/bin/env bash
# Exactness of both synchronisation forms at 2, 3 and 4 ranks, then the timings (scripts/gpu-profile.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
ops="$PY -m aioccl.run --nproc-per-node"
run() { echo "== $*"; timeout 150 "$@" 2>&1 | grep -E "GPU_OK|FAIL|failures [^0]|Error|exited" | head -20 || echo "!! failed"; }
run $ops 2 tests/workers/gpu_ops.py 1 7 1500 100000
AIOCCL_GPU_SCRATCH=65536 run $ops 3 tests/workers/gpu_ops.py 100000
AIOCCL_GPU_SYNC=spin run $ops 2 tests/workers/gpu_ops.py 7 1500
AIOCCL_GPU_SYNC=spin GPU_OPS_STREAM=1 run $ops 4 tests/workers/gpu_ops.py 7
bash scripts/gpu-profile.sh 3
