"""``core_context.preempt``: whether the script should checkpoint and exit now."""

from __future__ import annotations

import enum

from searchlab.core._distributed import DistributedLike
from searchlab.core._session import TrialSession

__all__ = ["PreemptContext", "PreemptMode"]


class PreemptMode(enum.Enum):
    """Who asks: every worker in step with the chief (default), the chief only, or each worker
    for itself (here the same as the default: only the chief hears from the trial's actor)."""

    WorkersAskChief = "WORKERS_ASK_CHIEF"
    ChiefOnly = "CHIEF_ONLY"
    WorkersAskMaster = "WORKERS_ASK_MASTER"


class PreemptContext:
    """True once the searcher paused or stopped the trial: checkpoint, then exit.

    In a trial the answer comes with the reply to the last report, so check it after
    reporting (and after storing a checkpoint). Run by hand, it is always False.

    Example:
        >>> if core_context.preempt.should_preempt():
        ...     return  # a checkpoint was just stored; the next run resumes from it
    """

    def __init__(
        self,
        session: TrialSession | None,
        distributed: DistributedLike,
        mode: PreemptMode = PreemptMode.WorkersAskChief,
    ) -> None:
        self._session = session
        self._dist = distributed
        self._mode = PreemptMode(mode)

    def should_preempt(self, auto_ack: bool = True) -> bool:
        """Whether to exit now; with ``WorkersAskChief`` every worker must call it together."""
        mine = bool(self._session is not None and self._session.preempted)
        if self._mode is PreemptMode.ChiefOnly:
            if self._dist.rank != 0:
                raise RuntimeError(
                    "should_preempt() with PreemptMode.ChiefOnly may only be called by the chief "
                    f"(rank={self._dist.rank})"
                )
            return mine
        if self._dist.size > 1:
            return bool(self._dist.broadcast(mine))
        return mine

    def acknowledge_preemption_signal(self) -> None:
        """A no-op: searchlab needs no acknowledgement."""
