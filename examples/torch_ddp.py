"""torch's DDP tutorial ("Getting Started with Distributed Data Parallel", the torchrun version) on CPU,
with backend="aioccl" as the only change (the tutorial says "gloo" for CPU, "nccl" for GPUs).

    torchrun --nproc-per-node 2 examples/torch_ddp.py

No `import aioccl` is needed: torch finds the backend through aioccl's entry point.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net2(self.relu(self.net1(x)))
        return out


def demo_basic() -> None:
    dist.init_process_group("aioccl")
    rank = dist.get_rank()
    print(f"Start running basic DDP example on rank {rank} (backend {dist.get_backend()}).")

    model = ToyModel()
    ddp_model = DDP(model)

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)

    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10))
    labels = torch.randn(20, 5)
    loss = loss_fn(outputs, labels)
    loss.backward()
    optimizer.step()
    print(f"rank {rank}: loss {loss.item():.4f}")
    dist.destroy_process_group()
    print(f"Finished running basic DDP example on rank {rank}.")


if __name__ == "__main__":
    demo_basic()
