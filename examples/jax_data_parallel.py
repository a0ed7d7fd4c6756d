"""Data-parallel training of a small MLP, gradients averaged across processes by jax_ext.

    aioccl-run --nproc-per-node 2 examples/jax_data_parallel.py [--steps 50]

Every process holds the same parameters and a slice of each batch; the
gradients are summed with ``jax_ext.all_reduce`` inside the jitted step and
divided by the number of processes. Rank 0 then trains the same model in one
process on the full batches and prints both loss curves: they agree (up to
float rounding: a mean of slice means is summed in another order than one mean).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import jax_ext

Params = list[tuple[jax.Array, jax.Array]]


def init(key: jax.Array, sizes: tuple[int, ...]) -> Params:
    params = []
    for a, b in zip(sizes[:-1], sizes[1:], strict=True):
        key, sub = jax.random.split(key)
        params.append((jax.random.normal(sub, (a, b)) / np.sqrt(a), jnp.zeros(b)))
    return params


def loss_fn(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    for w, b in params[:-1]:
        x = jnp.tanh(x @ w + b)
    w, b = params[-1]
    return jnp.mean((x @ w + b - y) ** 2)


def batches(steps: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """The same data on every process: a noisy smooth function to regress."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps, batch, 8)).astype(np.float32)
    y = (np.sin(x[..., :2]).sum(-1, keepdims=True) + 0.05 * rng.normal(size=(steps, batch, 1))).astype(np.float32)
    return x, y


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.1)
    args = ap.parse_args()
    comm = jax_ext.default_comm()
    rank, n = comm.rank, comm.world_size
    if args.batch % n:
        raise SystemExit(f"--batch {args.batch} must divide among {n} processes")
    xs, ys = batches(args.steps, args.batch)
    part = slice(rank * args.batch // n, (rank + 1) * args.batch // n)

    @jax.jit
    def step(params: Params, x: jax.Array, y: jax.Array) -> tuple[Params, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        grads = jax.tree_util.tree_map(lambda g: jax_ext.all_reduce(g) / n, grads)  # average over processes
        loss = jax_ext.all_reduce(loss) / n
        return jax.tree_util.tree_map(lambda p, g: p - args.lr * g, params, grads), loss

    @jax.jit
    def reference_step(params: Params, x: jax.Array, y: jax.Array) -> tuple[Params, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        return jax.tree_util.tree_map(lambda p, g: p - args.lr * g, params, grads), loss

    params = ref = init(jax.random.PRNGKey(42), (8, 32, 32, 1))
    curve, ref_curve = [], []
    for i in range(args.steps):
        params, loss = step(params, xs[i, part], ys[i, part])
        curve.append(float(loss))
        if rank == 0:
            ref, ref_loss = reference_step(ref, xs[i], ys[i])
            ref_curve.append(float(ref_loss))
    if rank != 0:
        return
    diff = max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(curve, ref_curve, strict=True))
    for i in range(0, args.steps, max(1, args.steps // 10)):
        print(f"step {i:4d}  loss {curve[i]:.6f}  (one process, full batch: {ref_curve[i]:.6f})")
    print(f"{n} processes, {args.steps} steps: final loss {curve[-1]:.6f}, single-process {ref_curve[-1]:.6f}, "
          f"largest relative difference {diff:.2e}")
    if diff > 1e-4:
        raise SystemExit("data-parallel training diverged from single-process training")


if __name__ == "__main__":
    main()
