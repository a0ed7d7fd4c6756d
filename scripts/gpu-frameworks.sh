#!/usr/bin/env bash
# What JAX and torch users pay per op on one GPU, and that their results are exact (about 4 minutes):
#
#   scripts/gpu-frameworks.sh          # 2 processes sharing the GPU under MPS (started here if not running)
#
# 1. exact: torch CUDA tensors through backend "aioccl" (tests/workers/torch_c10d.py: every c10d op, against
#    Gloo where Gloo takes CUDA tensors);
# 2. jax_ext inside jit, through XLA's buffer callback and through aioccl's CUDA custom call
#    (AIOCCL_JAX_GPU_NATIVE=0, 1): every op exact (tests/workers/jax_process.py), then
#    benchmarks/gpu_frameworks.py jax, 8 B and 1 MiB: a jitted x + 1, a jitted call holding one op, a
#    fori_loop of 50 ops; per op in the loop; the same op through aioccl's own API;
# 3. torch: dist.all_reduce of 8 B on a CUDA tensor, 300 back to back then one synchronize, three runs
#    (benchmarks/gpu_frameworks.py torch), then layer by layer (benchmarks/gpu_torch_parts.py).
# Output under $OUT (or ./gpu-frameworks-out). Each step has its own time limit; the first failure stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
OUTDIR="${OUT:-gpu-frameworks-out}"
source scripts/gpu-setup.sh
TORCHRUN=("$PY" -m torch.distributed.run --nproc-per-node 2)

echo "== 1. torch CUDA tensors through c10d, exact"
timeout 120 "${TORCHRUN[@]}" tests/workers/torch_c10d.py cuda 2>&1 | tee "$OUTDIR/torch_c10d.txt" |
  grep -E "c10d n=|FAIL"
echo "== 2. jax_ext inside jit: XLA's buffer callback (AIOCCL_JAX_GPU_NATIVE=0), then the CUDA custom call"
for native in 0 1; do
  AIOCCL_JAX_GPU_NATIVE=$native JAX_PLATFORMS=cuda timeout 120 "$PY" -m aioccl.run --nproc-per-node 2 \
    tests/workers/jax_process.py 2>&1 | tee "$OUTDIR/jax_process_native$native.txt" | grep -E "JAXP"
  AIOCCL_JAX_GPU_NATIVE=$native JAX_PLATFORMS=cuda timeout 150 "$PY" -m aioccl.run --nproc-per-node 2 \
    benchmarks/gpu_frameworks.py jax --sizes 8,1M 2>&1 | tee "$OUTDIR/frameworks_jax_native$native.txt" |
    grep -vE "^W[0-9]|^I[0-9]"
done
echo "== 3. torch dist.all_reduce, 8 B on CUDA"
for run in 1 2 3; do
  timeout 60 "${TORCHRUN[@]}" benchmarks/gpu_frameworks.py torch 2>&1 | tee -a "$OUTDIR/frameworks_torch.txt" |
    grep -E "torch dist|Error"
done
timeout 90 "${TORCHRUN[@]}" benchmarks/gpu_torch_parts.py 2>&1 | tee "$OUTDIR/torch_parts.txt" |
  grep -E "us/call|lane ran"
echo "gpu-frameworks: done; results in $OUTDIR"
