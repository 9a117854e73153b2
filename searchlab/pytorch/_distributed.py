"""``DistributedContext``: where this worker sits among the trial's workers; the DDP wrapper."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from searchlab.pytorch._errors import TrialValueError

__all__ = ["DistributedContext", "wrap_data_parallel"]


class DistributedContext:
    """Rank and size of this worker, and object collectives over the trial's workers.

    With one worker every collective is the identity, so trial code can call them
    unconditionally.

    Example:
        >>> ctx = DistributedContext(rank=0, size=1)
        >>> ctx.allgather({"n": 3})
        [{'n': 3}]
    """

    def __init__(
        self,
        rank: int = 0,
        size: int = 1,
        local_rank: int | None = None,
        local_size: int | None = None,
        cross_rank: int = 0,
        cross_size: int = 1,
        chief_ip: str | None = None,
        **_determined_options: Any,
    ) -> None:
        # chief_ip, pub_port, pull_port, port_offset, force_tcp: Determined's own transport;
        # here the collectives run over torch.distributed, so they are accepted and unused.
        if not 0 <= rank < size:
            raise TrialValueError(f"rank is {rank}, but must be in [0, size={size})")
        self.rank = rank
        self.size = size
        self.local_rank = rank if local_rank is None else local_rank
        self.local_size = size if local_size is None else local_size
        self.cross_rank = cross_rank
        self.cross_size = cross_size

    @classmethod
    def from_torch_env(cls) -> DistributedContext:
        """Read torchrun's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ...).

        Missing ones default to one process, or to one machine for ``GROUP_RANK`` and
        ``GROUP_WORLD_SIZE``.
        """
        size = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
        local_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(size)))
        cross_rank = int(os.environ.get("GROUP_RANK", str(rank // max(local_size, 1))))
        cross_size = int(
            os.environ.get("GROUP_WORLD_SIZE", str(max(size // max(local_size, 1), 1)))
        )
        return cls(
            rank=rank,
            size=size,
            local_rank=local_rank,
            local_size=local_size,
            cross_rank=cross_rank,
            cross_size=cross_size,
        )

    @classmethod
    def from_torch_distributed(cls, chief_ip: str | None = None) -> DistributedContext:
        """Determined's name for :meth:`from_torch_env` (``chief_ip`` is not needed here)."""
        return cls.from_torch_env()

    def get_rank(self) -> int:
        return self.rank

    def get_size(self) -> int:
        return self.size

    def get_local_rank(self) -> int:
        return self.local_rank

    def get_local_size(self) -> int:
        return self.local_size

    def get_cross_rank(self) -> int:
        return self.cross_rank

    def get_cross_size(self) -> int:
        return self.cross_size

    def get_num_agents(self) -> int:
        """The number of machines the trial runs on (Determined's name for ``cross_size``)."""
        return self.cross_size

    @property
    def is_chief(self) -> bool:
        return self.rank == 0

    def _active(self) -> bool:
        return self.size > 1 and dist.is_available() and dist.is_initialized()

    def allgather(self, obj: Any) -> list[Any]:
        """Every worker's ``obj``, in rank order, on every worker."""
        if not self._active():
            return [obj]
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def gather(self, obj: Any) -> list[Any] | None:
        """Every worker's ``obj`` on rank 0 (None elsewhere)."""
        gathered = self.allgather(obj)
        return gathered if self.rank == 0 else None

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every worker."""
        if not self._active():
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self._active():
            dist.barrier()

    def close(self) -> None:
        """Nothing to close: the process group belongs to whoever started it."""

    # Machine-local collectives: every worker of the trial must call them (they run as one
    # global collective, keeping the workers of this machine), unlike Determined's, which
    # needed only this machine's workers.
    def allgather_local(self, obj: Any) -> list[Any]:
        """The ``obj`` of every worker on this machine, in local-rank order."""
        if self.local_size < 2:
            return [obj]
        gathered = self.allgather((self.cross_rank, self.local_rank, obj))
        mine = sorted((lr, o) for cr, lr, o in gathered if cr == self.cross_rank)
        return [o for _, o in mine]

    def gather_local(self, obj: Any) -> list[Any] | None:
        """The ``obj`` of every worker on this machine on its local rank 0 (None elsewhere)."""
        gathered = self.allgather_local(obj)
        return gathered if self.local_rank == 0 else None

    def broadcast_local(self, obj: Any = None) -> Any:
        """Local rank 0's ``obj`` on every worker of this machine."""
        return self.allgather_local(obj)[0]


class _DataParallelModel(DistributedDataParallel):
    """DDP that forwards attribute access to the wrapped module, as Determined's wrapper did.

    Example:
        >>> model = context.wrap_model(Net())  # a _DataParallelModel when slots_per_trial > 1
        >>> model.num_classes, model.embed(x)  # Net's own attributes and methods
    """

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "module":  # not set yet: DDP's __init__ is still running
                raise
            return getattr(self.module, name)


def wrap_data_parallel(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``model`` in DDP (with attribute forwarding) over the default process group."""
    ids = [device.index] if device.type == "cuda" else None
    return _DataParallelModel(model, device_ids=ids)
