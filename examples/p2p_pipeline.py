"""Pipeline-parallel training steps: one layer per rank, microbatches forward and backward over isend/irecv.

A network of ``world_size`` linear layers is split one layer a rank. Each step, stage 0 feeds microbatches
forward; every stage computes its layer as a microbatch arrives, forwards the activation with a non-blocking
send, and keeps ``--depth`` receives posted ahead. The last stage turns each output into the gradient of
its loss (0.5 * ||y||^2, so dL/dy = y), and the gradients flow back the same way (all forwards, then all
backwards, as GPipe schedules them). A buffer is reused only once its send is done.

Weights and inputs are small integers, so every rank can recompute the whole network alone and check its
own layer's gradient exactly, step by step.

    aioccl-run --nproc-per-node 4 examples/p2p_pipeline.py [--micro-batches 16] [--rows 8] [--width 64]
                                                          [--steps 2] [--depth 4] [--torch]
"""

import argparse
import asyncio
import time
from typing import Any

import numpy as np

import aioccl

FORWARD, BACKWARD = 0, 1  # tags: activations flow up, gradients down


def weights(layer: int, width: int) -> np.ndarray:
    return (np.random.default_rng(layer).integers(-1, 2, (width, width))).astype(np.float64)


def microbatch(step: int, i: int, rows: int, width: int) -> np.ndarray:
    return (np.random.default_rng(1000 * step + i).integers(-2, 3, (rows, width))).astype(np.float64)


def reference_grad(layer: int, n: int, step: int, m: int, rows: int, width: int) -> np.ndarray:
    """The gradient of ``layer``'s weights over one step, by one process alone."""
    ws = [weights(j, width) for j in range(n)]
    grad = np.zeros((width, width))
    for i in range(m):
        acts = [microbatch(step, i, rows, width)]
        for w in ws:
            acts.append(acts[-1] @ w.T)
        g = acts[-1]
        for j in reversed(range(n)):
            if j == layer:
                grad += g.T @ acts[j]
            g = g @ ws[j]
    return grad


class Stream:
    """One direction of one stage: ``depth`` buffers, receives posted ahead, sends drained before reuse."""

    def __init__(self, comm: aioccl.Communicator, src: int | None, dst: int | None, tag: int, depth: int,
                 shape: tuple[int, int], new: Any) -> None:
        self.comm, self.src, self.dst, self.tag, self.depth = comm, src, dst, tag, depth
        self.bufs = [new(shape) for _ in range(depth)]
        self.recvs: list[Any] = [None] * depth
        self.sends: list[Any] = [None] * depth

    async def buffer(self, i: int) -> Any:
        """Buffer i % depth, once the send that last used it is done."""
        k = i % self.depth
        if self.sends[k] is not None:
            await self.sends[k]
            self.sends[k] = None
        return self.bufs[k]

    async def post(self, i: int) -> None:
        """Post the receive of item ``i`` into its buffer."""
        assert self.src is not None, "a stream with nobody upstream receives nothing"
        self.recvs[i % self.depth] = self.comm.irecv(await self.buffer(i), self.src, tag=self.tag)

    async def receive(self, i: int, m: int) -> Any:
        """Item ``i``, and the receive of item ``i + depth - 1`` posted into the buffer item ``i - 1`` used
        (a buffer is free once the item it held has been consumed and, if forwarded, sent on)."""
        x = await self.recvs[i % self.depth]
        if i >= 1 and i - 1 + self.depth < m:
            await self.post(i - 1 + self.depth)
        return x

    def send(self, i: int, x: Any) -> None:
        assert self.dst is not None, "a stream with nobody downstream sends nothing"
        self.sends[i % self.depth] = self.comm.isend(x, self.dst, tag=self.tag)

    async def flush(self) -> None:
        for w in self.sends:
            if w is not None:
                await w
        self.sends = [None] * self.depth


async def train_step(comm: aioccl.Communicator, w: Any, step: int, a: argparse.Namespace, xp: Any) -> Any:
    r, n, m = comm.rank, comm.world_size, a.micro_batches
    shape, new = (a.rows, a.width), xp["empty"]
    up = Stream(comm, r - 1 if r > 0 else None, r + 1 if r + 1 < n else None, FORWARD, a.depth, shape, new)
    down = Stream(comm, r + 1 if r + 1 < n else None, r - 1 if r > 0 else None, BACKWARD, a.depth, shape, new)
    for s in (up, down):
        if s.src is not None:
            for i in range(min(a.depth, m)):
                await s.post(i)
    inputs, grad = [], xp["zeros"]((a.width, a.width))
    for i in range(m):  # forward
        x = xp["asarray"](microbatch(step, i, a.rows, a.width)) if r == 0 else await up.receive(i, m)
        inputs.append(xp["copy"](x))  # stashed for the backward pass; x's buffer goes back into rotation
        y = x @ w.T
        if up.dst is not None:
            out = await up.buffer(i)
            out[...] = y
            up.send(i, out)
        else:
            inputs[-1] = (inputs[-1], y)  # the last stage keeps its output: dL/dy = y
    await up.flush()
    for i in range(m):  # backward
        if r + 1 == n:
            x, g = inputs[i]
        else:
            x, g = inputs[i], await down.receive(i, m)
        grad += g.T @ x
        if down.dst is not None:
            out = await down.buffer(i)
            out[...] = g @ w
            down.send(i, out)
    await down.flush()
    return grad


def backend(use_torch: bool) -> dict[str, Any]:
    if use_torch:
        import torch

        return {"empty": lambda s: torch.empty(s, dtype=torch.float64), "zeros": lambda s: torch.zeros(
            s, dtype=torch.float64), "asarray": torch.from_numpy, "copy": torch.clone, "numpy": lambda t: t.numpy()}
    return {"empty": np.empty, "zeros": np.zeros, "asarray": np.asarray, "copy": np.copy, "numpy": np.asarray}


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--micro-batches", type=int, default=16)
    p.add_argument("--rows", type=int, default=8, help="rows per microbatch")
    p.add_argument("--width", type=int, default=64, help="every layer is width x width")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--depth", type=int, default=4, help="receives posted ahead per direction, >= 2")
    p.add_argument("--torch", action="store_true", help="torch CPU tensors instead of numpy arrays")
    a = p.parse_args()
    if a.depth < 2:
        raise SystemExit("--depth must be at least 2")
    xp = backend(a.torch)
    comm = await aioccl.init()
    r, n = comm.rank, comm.world_size
    w = xp["asarray"](weights(r, a.width))
    await comm.barrier()
    t0 = time.perf_counter()
    for step in range(a.steps):
        grad = await train_step(comm, w, step, a, xp)
        want = reference_grad(r, n, step, a.micro_batches, a.rows, a.width)
        assert np.array_equal(xp["numpy"](grad), want), f"rank {r}: step {step}'s gradient is wrong"
    await comm.barrier()
    dt = time.perf_counter() - t0
    if r == n - 1:
        print(f"{a.steps} steps of {a.micro_batches} micro-batches through {n} stages, forward and backward, "
              f"in {dt * 1e3:.1f} ms; every stage's gradient checked")
    await comm.close()


if __name__ == "__main__":  # (examples/pipeline_1f1b.py imports the network and its check)
    asyncio.run(main())
