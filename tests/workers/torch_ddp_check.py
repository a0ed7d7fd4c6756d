"""Under torchrun: DDP (or FSDP2's fully_shard) over backend "aioccl" trains a small MLP to the same parameters
as one process training on the whole batch.

Usage: torchrun --nproc-per-node N torch_ddp_check.py [ddp | fsdp2] [STEPS]
Prints "[rank r] MODE n=N: parameters equal to one process after S steps (max diff D)".
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch import nn

BATCH_PER_RANK, FEATURES, HIDDEN = 4, 6, 16


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1)).double()


def batch(step: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(BATCH_PER_RANK * n, FEATURES, generator=g, dtype=torch.float64)
    return x, x.sum(dim=1, keepdim=True).sin()


def train(net: nn.Module, steps: int, n: int, shard: int | None) -> None:
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for step in range(steps):
        x, y = batch(step, n)
        if shard is not None:
            part = slice(shard * BATCH_PER_RANK, (shard + 1) * BATCH_PER_RANK)
            x, y = x[part], y[part]
        opt.zero_grad()
        nn.functional.mse_loss(net(x), y).backward()
        opt.step()


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "ddp"
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    dist.init_process_group(backend="aioccl")
    r, n = dist.get_rank(), dist.get_world_size()
    reference = model()
    train(reference, steps, n, None)
    net = model()
    if mode == "ddp":
        wrapped: nn.Module = nn.parallel.DistributedDataParallel(net)
        train(wrapped, steps, n, r)
        params = [p.detach() for p in net.parameters()]
    else:
        from torch.distributed.fsdp import fully_shard

        fully_shard(net)
        train(net, steps, n, r)
        params = [p.full_tensor().detach() for p in net.parameters()]  # DTensor shards, gathered
    diff = max((a - b).abs().max().item() for a, b in zip(params, reference.parameters(), strict=True))
    ok = diff <= 1e-12
    print(f"[rank {r}] {mode} n={n}: parameters {'equal to' if ok else 'DIFFER from'} one process after "
          f"{steps} steps (max diff {diff:.3g})", flush=True)
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
