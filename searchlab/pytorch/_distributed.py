"""``DistributedContext``: where this worker sits among the trial's workers."""

from __future__ import annotations

import os
from typing import Any

import torch.distributed as dist

__all__ = ["DistributedContext"]


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
    ) -> None:
        if not 0 <= rank < size:
            raise ValueError(f"rank is {rank}, but must be in [0, size={size})")
        self.rank = rank
        self.size = size
        self.local_rank = rank if local_rank is None else local_rank
        self.local_size = size if local_size is None else local_size
        self.cross_rank = cross_rank
        self.cross_size = cross_size

    @classmethod
    def from_torch_env(cls) -> DistributedContext:
        """Read ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` as set by torchrun or searchlab's workers."""
        size = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
        local_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(size)))
        return cls(rank=rank, size=size, local_rank=local_rank, local_size=local_size)

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
