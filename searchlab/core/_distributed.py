"""The Core API's distributed contexts: one process by default, torch.distributed otherwise."""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["DistributedLike", "DummyDistributedContext"]


class DistributedLike(Protocol):
    """What the Core API's contexts use of a distributed context."""

    rank: int
    size: int

    def broadcast(self, obj: Any) -> Any: ...

    def allgather(self, obj: Any) -> list[Any]: ...

    def barrier(self) -> None: ...


class DummyDistributedContext:
    """One process: rank 0 of 1; every collective returns this process's own value.

    Example:
        >>> DummyDistributedContext().allgather(3)
        [3]
    """

    def __init__(self) -> None:
        self.rank = self.local_rank = self.cross_rank = 0
        self.size = self.local_size = self.cross_size = 1

    def get_rank(self) -> int:
        return 0

    def get_size(self) -> int:
        return 1

    def get_local_rank(self) -> int:
        return 0

    def get_local_size(self) -> int:
        return 1

    def get_cross_rank(self) -> int:
        return 0

    def get_cross_size(self) -> int:
        return 1

    def get_num_agents(self) -> int:
        return 1

    @property
    def is_chief(self) -> bool:
        return True

    def allgather(self, obj: Any) -> list[Any]:
        return [obj]

    def gather(self, obj: Any) -> list[Any] | None:
        return [obj]

    def broadcast(self, obj: Any) -> Any:
        return obj

    def barrier(self) -> None:
        return None

    def allgather_local(self, obj: Any) -> list[Any]:
        return [obj]

    def gather_local(self, obj: Any) -> list[Any] | None:
        return [obj]

    def broadcast_local(self, obj: Any = None) -> Any:
        return obj

    def close(self) -> None:
        return None
