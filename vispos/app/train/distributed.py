"""Process-group setup for the training demos: one process by default, data-parallel under
``torchrun`` (``torch.distributed``, gloo on CPU, nccl on CUDA, chosen from the device).

``torchrun --nproc_per_node N -m vispos.app.train.task2d ...`` sets ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``; :func:`init_distributed` reads them
(``init_method="env://"``). Without them the run is a plain single process and nothing of
``torch.distributed`` is touched. On a cluster only torchrun's own rendezvous flags change
(``--nnodes``, ``--node_rank``, ``--rdzv_backend``, ``--rdzv_endpoint``); nothing here does.

References:
    PyTorch, ``torch.distributed`` and ``torchrun`` (Elastic Launch) documentation; DETR
    ``util/misc.py`` (``init_distributed_mode``, ``reduce_dict``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["DistContext", "init_distributed", "launched_by_torchrun"]


def launched_by_torchrun() -> bool:
    """True when the environment holds torchrun's ``RANK`` and ``WORLD_SIZE``."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


@dataclass(frozen=True)
class DistContext:
    """Where this process stands: ``rank`` of ``world_size``, its ``device`` and the ``backend``
    (None in a single process)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    backend: str | None = None

    @property
    def distributed(self) -> bool:
        return self.backend is not None

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that logs and writes files."""
        return self.rank == 0

    def all_reduce_sum(self, t: Tensor) -> Tensor:
        """The sum of ``t`` over processes, as a new tensor (``t`` itself in one process)."""
        if not self.distributed:
            return t
        out = t.detach().clone()
        dist.all_reduce(out)
        return out

    def all_reduce_mean(self, t: Tensor) -> Tensor:
        """The mean of ``t`` over processes (``t`` itself in one process)."""
        return t if not self.distributed else self.all_reduce_sum(t) / self.world_size

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every process's ``obj``, in rank order (``[obj]`` in one process)."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` in every process."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def shutdown(self) -> None:
        if self.distributed and dist.is_initialized():
            dist.destroy_process_group()


def init_distributed(device: str = "cpu") -> DistContext:
    """Joins torchrun's process group when launched by it, else returns a single-process context.

    Args:
        device (str): ``"cpu"`` or ``"cuda"`` (any ``torch.device`` string). Under torchrun on
            CUDA each process takes ``cuda:LOCAL_RANK``.

    Returns:
        DistContext: backend ``"nccl"`` for CUDA, ``"gloo"`` otherwise, None in one process.

    Raises:
        ValueError: CUDA was asked for but is not available.
    """
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r}: CUDA is not available")
    if not launched_by_torchrun():
        return DistContext(device=dev)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if dev.type == "cuda":
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, init_method="env://", rank=rank, world_size=world)
    return DistContext(rank, world, local_rank, dev, backend)
