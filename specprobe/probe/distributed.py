"""torchrun: one process per rank, each scoring its shard of the prompts; the ranks'
parts (mergeable accumulator state + per-item scores) are exchanged with
`torch.distributed` and every rank rebuilds the one result (rank 0 writes it).

torchrun sets WORLD_SIZE, RANK and LOCAL_RANK (and the rendezvous address); with those
present and WORLD_SIZE > 1, `setup` joins the process group — NCCL when the run is on
CUDA, gloo on the CPU — and pins each rank to its own GPU.
"""

from __future__ import annotations

import os
from typing import Any


def from_env() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) when launched by torchrun with more than one rank."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", str(rank)))
    except ValueError:
        return None
    return (rank, world, local) if world > 1 else None


def active() -> bool:
    """A process group of more than one rank is up."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch builds without distributed
        return False
    return bool(dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)


def is_writer() -> bool:
    """Rank 0 (or no process group): the one process that writes results."""
    if not active():
        return True
    import torch.distributed as dist

    return dist.get_rank() == 0


def setup(device: str) -> tuple[int, int, str]:
    """Join the torchrun job's process group -> (rank, world size, this rank's device).
    device: the --device asked for; "auto"/"cuda" become this rank's own GPU."""
    import torch
    import torch.distributed as dist

    env = from_env()
    assert env is not None, "setup() is only called under torchrun"
    rank, world, local = env
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if cuda:
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    return rank, world, device


def gather_parts(part: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's part, on every rank (all_gather_object: picklable dicts)."""
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, part)
    return [p for p in out if p is not None]


def teardown() -> None:
    if active():
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
