"""Pipeline-parallel training with the 1F1B schedule: receives posted ahead, a clean stop when a stage fails.

One linear layer a rank. Stage s runs ``min(world - s - 1, m)`` forwards to fill the pipe, then alternates
one forward and one backward (1F1B: at most ``world - s`` activations held), then drains the backwards.
Activations flow up (tag FORWARD), gradients down (tag BACKWARD); each stage keeps ``--depth`` receives
posted ahead in each direction, into buffers it reuses once it has copied their item out, and never waits
for its own sends until the step ends (``isend`` returns at once). The last stage's loss is
0.5 * ||y||^2, so its gradient is y itself.

Weights and inputs are small integers (the network of examples/p2p_pipeline.py, imported from it): every rank
recomputes the whole network alone and checks its layer's gradient bit for bit, step by step.

If any stage fails (``--fail-rank R`` raises in stage R's compute at step 1, as a bug would), it aborts its
communicator; every other stage's next op then raises ``PeerLost`` naming it, and each stops cleanly,
saying so, instead of waiting at a deadline.

    aioccl-run --nproc-per-node 4 examples/pipeline_1f1b.py [--micro-batches 8] [--rows 8] [--width 64]
                                                           [--steps 2] [--depth 3] [--fail-rank R]
"""

import argparse
import asyncio
import sys

import numpy as np
from p2p_pipeline import microbatch, reference_grad, weights  # the same network, the same single-process check

import aioccl

FORWARD, BACKWARD = 0, 1  # tags: activations flow up, gradients down


class Inbox:
    """Receives from one neighbour on one tag, ``depth`` of them posted ahead into reused buffers."""

    def __init__(self, comm: aioccl.Communicator, src: int, tag: int, depth: int, m: int,
                 shape: tuple[int, int]) -> None:
        self.comm, self.src, self.tag, self.m = comm, src, tag, m
        self.bufs = [np.empty(shape) for _ in range(depth)]
        self.works: list[aioccl.Work[np.ndarray]] = []
        for i in range(min(depth, m)):
            self._post(i)

    def _post(self, i: int) -> None:
        self.works.append(self.comm.irecv(self.bufs[i % len(self.bufs)], self.src, tag=self.tag))

    async def take(self, i: int) -> np.ndarray:
        """Item ``i`` (copied out: its buffer takes item ``i + depth`` next, posted now)."""
        await self.works[i]
        item = self.bufs[i % len(self.bufs)].copy()
        if i + len(self.bufs) < self.m:
            self._post(i + len(self.bufs))
        return item


async def train_step(comm: aioccl.Communicator, step: int, args: argparse.Namespace) -> np.ndarray:
    """One 1F1B step of this stage; the gradient of its weights."""
    n, s, m = comm.world_size, comm.rank, args.micro_batches
    shape = (args.rows, args.width)
    w = weights(s, args.width)
    acts_in = Inbox(comm, s - 1, FORWARD, args.depth, m, shape) if s > 0 else None
    grads_in = Inbox(comm, s + 1, BACKWARD, args.depth, m, shape) if s < n - 1 else None
    held: dict[int, np.ndarray] = {}  # microbatch -> this stage's input, until its backward
    outputs: dict[int, np.ndarray] = {}  # the last stage: its outputs, which are their own gradients
    sends: list[aioccl.Work[None]] = []
    grad = np.zeros_like(w)

    async def forward(i: int) -> None:
        x = await acts_in.take(i) if acts_in is not None else microbatch(step, i, *shape)
        if s == args.fail_rank and step == 1 and i == 2:
            raise RuntimeError(f"stage {s} failed in its forward of microbatch {i} (--fail-rank)")
        held[i] = x
        y = x @ w.T
        if s < n - 1:
            sends.append(comm.isend(y, s + 1, tag=FORWARD))  # (y is not touched again: no wait for the send)
        else:
            outputs[i] = y

    async def backward(i: int) -> None:
        g = await grads_in.take(i) if grads_in is not None else outputs.pop(i)
        grad[...] += g.T @ held.pop(i)
        if s > 0:
            sends.append(comm.isend(g @ w, s - 1, tag=BACKWARD))

    warmup = min(n - s - 1, m)
    for i in range(warmup):
        await forward(i)
    for i in range(m - warmup):  # steady state: one forward, one backward
        await forward(i + warmup)
        await backward(i)
    for i in range(m - warmup, m):
        await backward(i)
    await asyncio.gather(*sends)
    return grad


async def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--micro-batches", type=int, default=8)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--depth", type=int, default=3, help="receives posted ahead, per direction")
    p.add_argument("--fail-rank", type=int, default=-1, help="this stage raises at step 1 (a bug, on purpose)")
    args = p.parse_args()
    comm = await aioccl.init(timeout=60)
    try:
        for step in range(args.steps):
            grad = await train_step(comm, step, args)
            want = reference_grad(comm.rank, comm.world_size, step, args.micro_batches, args.rows, args.width)
            assert np.array_equal(grad, want), f"stage {comm.rank}: step {step}: gradient differs"
        print(f"stage {comm.rank}/{comm.world_size}: {args.steps} steps of {args.micro_batches} microbatches, "
              "gradients equal to one process's", flush=True)
    except Exception as e:  # this stage failed, or learnt that another did: stop every stage now
        comm.abort()  # (the others' next op raises PeerLost naming this rank, at once)
        print(f"stage {comm.rank}: stopping: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 1
    await comm.close()
    return 0


sys.exit(asyncio.run(main()))
