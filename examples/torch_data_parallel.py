"""Data-parallel training of a small torch model with aioccl instead of torch.distributed.

    aioccl-run --nproc-per-node 2 examples/torch_data_parallel.py [--steps 50]

What ``DistributedDataParallel`` does, written out: rank 0's initial weights
are broadcast into every replica's parameters (in place, through DLPack);
each step every rank back-propagates its slice of the global batch, copies
the gradients into one flat bucket allocated once, sums the bucket with one
``await comm.all_reduce`` and copies it back before the optimizer step.
The loss is a sum over the slice divided by the *global* batch size, so the
summed gradient is the full-batch gradient. Rank 0 then trains the same
model in one process on the full batches and checks that the weights agree
(float64; only the order of the additions differs).
"""

from __future__ import annotations

import argparse
import asyncio

import torch

import aioccl


def model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)).double()


def batches(steps: int, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The same data on every rank: a noisy smooth function to regress."""
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(steps):
        x = torch.randn(batch, 8, generator=g, dtype=torch.float64)
        out.append((x, torch.sin(x.sum(1, keepdim=True)) + 0.1 * torch.randn(batch, 1, generator=g,
                                                                              dtype=torch.float64)))
    return out


def step(net: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
         global_batch: int) -> float:
    opt.zero_grad()
    loss = ((net(x) - y) ** 2).sum() / global_batch
    loss.backward()
    return float(loss.detach())


def grad_of(p: torch.Tensor) -> torch.Tensor:
    assert p.grad is not None, "backward() ran, so every parameter has a gradient"
    return p.grad


async def train(comm: aioccl.Communicator, steps: int, batch: int) -> torch.nn.Module:
    net = model(seed=comm.rank)  # different on purpose: the broadcast below makes the replicas equal
    params = list(net.parameters())
    for p in params:
        await comm.broadcast(p, root=0)  # a Parameter, in place (autograd does not see it)
    opt = torch.optim.SGD(params, lr=0.1)
    bucket = torch.empty(sum(p.numel() for p in params), dtype=torch.float64)  # allocated once
    lo, hi = comm.rank * batch // comm.world_size, (comm.rank + 1) * batch // comm.world_size
    for i, (x, y) in enumerate(batches(steps, batch)):
        local = step(net, opt, x[lo:hi], y[lo:hi], batch)
        torch.cat([grad_of(p).reshape(-1) for p in params], out=bucket)
        await comm.all_reduce(bucket)  # the full-batch gradient, in the bucket's own memory
        at = 0
        for p in params:
            grad_of(p).copy_(bucket[at:at + p.numel()].view_as(p))
            at += p.numel()
        opt.step()
        if comm.rank == 0 and i % max(1, steps // 5) == 0:
            print(f"step {i:3d}  loss of rank 0's slice {local:.5f}", flush=True)
    return net


def train_alone(steps: int, batch: int) -> torch.nn.Module:
    net = model(seed=0)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for x, y in batches(steps, batch):
        step(net, opt, x, y, batch)
        opt.step()
    return net


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=64)
    ns = ap.parse_args()
    async with await aioccl.init(timeout=60) as comm:
        net = await train(comm, ns.steps, ns.batch)
        # every replica holds the same weights, bit for bit
        flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
        ranks = await comm.all_gather(flat)
        assert all(torch.equal(ranks[0:flat.numel()], ranks[i * flat.numel():(i + 1) * flat.numel()])
                   for i in range(comm.world_size)), "replicas diverged"
        if comm.rank == 0:
            alone = torch.cat([p.detach().reshape(-1) for p in train_alone(ns.steps, ns.batch).parameters()])
            diff = float(((flat - alone).abs() / alone.abs().clamp_min(1e-3)).max())
            print(f"{comm.world_size} processes, {ns.steps} steps: replicas identical; largest relative "
                  f"difference to single-process training {diff:.1e}", flush=True)
            assert diff < 1e-9, f"data-parallel training differs from single-process training by {diff}"


if __name__ == "__main__":
    asyncio.run(main())
