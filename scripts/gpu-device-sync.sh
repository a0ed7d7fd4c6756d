#!/usr/bin/env bash
# Issue 33's device run: the device-synchronised CUDA-IPC path, exact and timed, with MPS off and on.
#
#   scripts/gpu-device-sync.sh        # on a machine with a GPU; output (log, perf JSON) in $OUT or ./gpu-sync-out
#
# Each step has its own time limit and a failure does not stop the later steps (one device run, all the facts).
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
OUTDIR="${OUT:-gpu-sync-out}"
mkdir -p "$OUTDIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false
run() { echo "== $*"; timeout "${LIMIT:-150}" "$@" 2>&1 | grep -E "GPU_OK|FAIL|failures|synchronised|Error|error|rank.*exited|^ *[0-9]+ |^#" \
  | grep -v "^# *$" | head -60 || echo "!! step failed or timed out"; }
ops="$PY -m aioccl.run --nproc-per-node"  # unquoted below: timeout runs commands, not functions
perf="$PY -m aioccl.tools.perf all_reduce --device gpu --engine thread"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c "import cupy; print('cupy', cupy.__version__)"

echo "#### MPS off"
run $ops 2 tests/workers/gpu_ops.py 1 7 1500 100000
AIOCCL_GPU_SCRATCH=65536 run $ops 2 tests/workers/gpu_ops.py 100000
GPU_OPS_STREAM=1 run $ops 2 tests/workers/gpu_ops.py 1 1500
AIOCCL_GPU_SYNC=spin run $ops 2 tests/workers/gpu_ops.py 7
for rep in 1 2 3; do run $perf --np 2 -b 8 -e 128M -f 8 -n 30 -w 5 --json "$OUTDIR/perf_np2_off_$rep.json"; done
run $perf --np 4 --sizes 8,1M -n 30 -w 5
AIOCCL_GPU_IPC=0 run $perf --np 2 --sizes 8,1M,128M -n 10 -w 3

echo "#### MPS on"
mkdir -p /tmp/mps/pipe /tmp/mps/log
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps/log
nvidia-cuda-mps-control -d && sleep 1
run $ops 2 tests/workers/gpu_ops.py 1 7 1500 100000
run $ops 3 tests/workers/gpu_ops.py 1 1500
run $ops 4 tests/workers/gpu_ops.py 1 1500
for rep in 1 2 3; do run $perf --np 2 -b 8 -e 128M -f 8 -n 30 -w 5 --json "$OUTDIR/perf_np2_mps_$rep.json"; done
for rep in 1 2 3; do run $perf --np 4 --sizes 8,1M -n 30 -w 5; done
echo quit | nvidia-cuda-mps-control
echo "gpu-device-sync: done"
