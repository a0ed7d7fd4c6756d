#!/usr/bin/env bash
# JAX and torch on the device path, and the deadline in the stream form.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
ops="$PY -m aioccl.run --nproc-per-node"
run() { echo "== $*"; timeout "${LIMIT:-100}" "$@" 2>&1 | grep -E "OK|TIMEOUT|FAIL|failures [^0]|Error|exited|c10d n=|\.py\", line" | head -24 || echo "!! failed"; }
AIOCCL_DEBUG=WARN LIMIT=60 run $ops 2 tests/workers/gpu_timeout.py
JAX_PLATFORMS=cuda run $ops 2 tests/workers/jax_process.py
run $PY -m torch.distributed.run --nproc-per-node 2 tests/workers/torch_c10d.py cuda
