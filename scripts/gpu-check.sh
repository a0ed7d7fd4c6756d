#!/usr/bin/env bash
# Everything aioccl's GPU path promises, on a machine with a GPU (and nothing without one).
#
#   scripts/gpu-check.sh [NPROC]          # default 2 ranks sharing the GPU(s), as separate processes
#
# 1. the probe (what aioccl-info prints);
# 2. tests/workers/gpu_ops.py: every op x every dtype on cupy buffers, exact data, both paths
#    (CUDA IPC, and the staged path with AIOCCL_GPU_IPC=0), small scratch so ops run in many pieces;
#    2b. tests/workers/gpu_lane.py: the same calls repeated, run from the call to the launch by the native
#    GPU lane, exact, and its host time per op;
#    then the device path's deadline (gpu_timeout.py) and CUDA graphs (gpu_graph.py: refused without MPS);
# 3. JAX on GPU: tests/workers/jax_process.py with JAX_PLATFORMS=cuda; 3b. torch CUDA tensors through c10d;
# 4. aioccl-perf all_reduce on GPU buffers, 8 B .. 64 MiB, JSON in $OUT (or ./gpu-check-out);
# 5. where the nvidia-nccl wheel is present, the same sweep through cupy.cuda.nccl for comparison
#    (NCCL refuses two ranks on one GPU; with fewer GPUs than ranks it says so and is skipped);
# 6. benchmarks/gpu_frameworks.py: jax_ext inside jit and torch CUDA tensors through c10d, per op.
# Exits non-zero on the first failure. With MPS running (nvidia-cuda-mps-control -d), same-host ranks use the
# device path's spin form; without, its stream form (docs/gpu.md). scripts/gpu-profile.sh times both.
set -euo pipefail
cd "$(dirname "$0")/.."
NPROC="${1:-2}"
PY="${PYTHON:-python3}"
OUTDIR="${OUT:-gpu-check-out}"
mkdir -p "$OUTDIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # several processes share one GPU

echo "== 1. probe"
"$PY" -c "import aioccl, sys; s = aioccl.gpu.status(); print(s.reason); sys.exit(0 if s.available else 3)"

echo "== 2. every op x dtype on GPU buffers ($NPROC ranks)"
for ipc in 1 0; do
  AIOCCL_GPU_IPC=$ipc GPU_OPS_STREAM=1 "$PY" -m aioccl.run --nproc-per-node "$NPROC" tests/workers/gpu_ops.py 1 1500 \
    | grep -E "GPU_OK|FAIL"
  AIOCCL_GPU_IPC=$ipc "$PY" -m aioccl.run --nproc-per-node "$NPROC" tests/workers/gpu_ops.py 1 7 1500 100000 \
    | tee "$OUTDIR/gpu_ops_ipc$ipc.txt" | grep -E "GPU_OK|FAIL|failures"
  AIOCCL_GPU_IPC=$ipc AIOCCL_GPU_SCRATCH=65536 AIOCCL_GPU_STAGE_PIECE=65536 \
    "$PY" -m aioccl.run --nproc-per-node "$NPROC" tests/workers/gpu_ops.py 100000 | grep -E "GPU_OK|FAIL"
done

echo "== 2b. the native GPU lane: each op repeated on the same buffers, exact every time, run by the lane"
GPU_LANE_EXPECT=1 "$PY" -m aioccl.run --nproc-per-node "$NPROC" tests/workers/gpu_lane.py 10 \
  | tee "$OUTDIR/gpu_lane.txt" | grep -E "LANE_|FAIL|failures"

"$PY" -m aioccl.run --nproc-per-node "$NPROC" tests/workers/gpu_timeout.py | grep -E "TIMEOUT_OK|Error"
AIOCCL_GPU_SCRATCH=8192 "$PY" -m aioccl.run --nproc-per-node "$NPROC" tests/workers/gpu_graph.py | grep -E "GRAPH_|Error"

echo "== 3. JAX on GPU"
JAX_PLATFORMS=cuda "$PY" -m aioccl.run --nproc-per-node "$NPROC" tests/workers/jax_process.py | tail -n "$NPROC"
JAX_PLATFORMS=cuda JAXPAR_LOG="$OUTDIR/jax_parity_barrier.log" "$PY" -m aioccl.run --nproc-per-node "$NPROC" \
  tests/workers/jax_parity.py | tee "$OUTDIR/jax_parity.txt" | tail -n "$NPROC"

echo "== 3b. torch CUDA tensors through backend=aioccl, against Gloo"
if "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  "$PY" -m torch.distributed.run --nproc-per-node "$NPROC" tests/workers/torch_c10d.py cuda \
    | tee "$OUTDIR/torch_cuda_c10d.txt" | grep -E "c10d n=|FAIL"
else
  echo "(torch without CUDA: skipped)"
fi

echo "== 4. aioccl-perf on GPU buffers"
for ipc in 1 0; do
  AIOCCL_GPU_IPC=$ipc "$PY" -m aioccl.tools.perf all_reduce --device gpu --np "$NPROC" -b 8 -e 64M -f 4 \
    -n 20 -w 5 --engine thread --json "$OUTDIR/perf_all_reduce_gpu_ipc$ipc.json" | tee "$OUTDIR/perf_ipc$ipc.txt"
done

echo "== 5. NCCL through cupy.cuda.nccl, where available"
"$PY" scripts/nccl_sweep.py --np "$NPROC" --json "$OUTDIR/perf_all_reduce_nccl.json" || echo "(NCCL sweep skipped)"
echo "== 6. what JAX and torch users pay per op on the GPU (benchmarks/gpu_frameworks.py)"
JAX_PLATFORMS=cuda "$PY" -m aioccl.run --nproc-per-node "$NPROC" benchmarks/gpu_frameworks.py jax --sizes 8,1M \
  | tee "$OUTDIR/frameworks_jax.txt"
"$PY" -m torch.distributed.run --nproc-per-node "$NPROC" benchmarks/gpu_frameworks.py torch \
  | tee "$OUTDIR/frameworks_torch.txt"
echo "gpu-check: all passed; results in $OUTDIR"
