"""``core_context.searcher``: the lengths the searcher asks a trial for, one operation each.

Determined 0.37 scripts train to each operation's ``length``, validate, and call
``op.report_completed(metric)``; the next operation comes once the searcher promotes the trial.
Determined 0.38 deprecated this for ``time_metric`` validations; searchlab runs both.

Example:
    >>> for op in core_context.searcher.operations():
    ...     while batches < op.length:
    ...         train_one_batch(); batches += 1
    ...     op.report_completed(validate()["validation_loss"])
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from typing import Any

from searchlab._info import ClusterInfo
from searchlab.core._channel import Report
from searchlab.core._distributed import DistributedLike
from searchlab.core._session import TrialSession
from searchlab.core._train import plain_metrics

__all__ = ["SearcherContext", "SearcherMode", "SearcherOperation", "Unit"]


class Unit(enum.Enum):
    EPOCHS = "EPOCHS"
    RECORDS = "RECORDS"
    BATCHES = "BATCHES"


class SearcherMode(enum.Enum):
    WorkersAskChief = "WORKERS_ASK_CHIEF"
    ChiefOnly = "CHEIF_ONLY"  # Determined's spelling


class SearcherOperation:
    """Train to ``length`` (total, in the searcher's unit), then ``report_completed``."""

    def __init__(
        self, session: TrialSession | None, length: int, is_chief: bool, metric: str = ""
    ) -> None:
        self._session = session
        self._length = length
        self._is_chief = is_chief
        self._metric = metric
        self._completed = False

    @property
    def length(self) -> int:
        """The total training (batches, records or epochs) to reach before validating."""
        return self._length

    def report_progress(self, length: float) -> None:
        if not self._is_chief:
            raise RuntimeError("you must only call op.report_progress() from the chief worker")
        if self._completed and length != self._length:
            raise RuntimeError("you must not call op.report_progress() after op.report_completed()")

    def report_completed(self, searcher_metric: Any) -> None:
        """The searcher metric's value at ``length``: the trial's result at this rung."""
        if not self._is_chief:
            raise RuntimeError("you must only call op.report_completed() from the chief worker")
        if self._completed:
            raise RuntimeError("you may only call op.report_completed() once")
        self._completed = True
        if self._session is None:
            return
        metrics = plain_metrics({self._metric: searcher_metric})
        report = Report(
            group="validation",
            metrics=metrics,
            batches=self._session.last_batches,
            searcher_length=self._length,
        )
        action = self._session.request(report)
        self._session.handle_checkpoint_requests(action, "the Core API stores checkpoints itself")


class SearcherContext:
    """The searcher's operations for this trial (one per rung it has left)."""

    def __init__(
        self, session: TrialSession | None, distributed: DistributedLike, info: ClusterInfo | None
    ) -> None:
        self._session = session
        self._dist = distributed
        self._info = info

    def _lengths(self) -> list[int]:
        if self._info is None:
            return [1]  # run by hand: one operation of length 1, as Determined's dummy
        spec = self._info._session
        if spec.script_length:
            raise ValueError(
                "SearcherContext was not created because your experiment config does not have "
                "searcher.max_length (or time_metric + max_time) set; set your training length "
                "in your script instead of calling core_context.searcher"
            )
        return list(spec.rung_ends[spec.next_rung :])

    def operations(
        self, searcher_mode: SearcherMode = SearcherMode.WorkersAskChief, auto_ack: bool = True
    ) -> Iterator[SearcherOperation]:
        """Each operation after the previous one was completed and the searcher went on."""
        mode = SearcherMode(searcher_mode)
        chief = self._dist.rank == 0
        if not chief and mode is not SearcherMode.WorkersAskChief:
            raise RuntimeError(
                "you cannot call searcher.operations(searcher_mode=ChiefOnly) from a non-chief "
                "worker."
            )
        share = mode is SearcherMode.WorkersAskChief and self._dist.size > 1
        if not chief:
            while True:
                length = self._dist.broadcast(None)
                if length is None:
                    return
                yield SearcherOperation(None, int(length), False)
        metric = self._info._session.searcher_metric if self._info is not None else ""
        if self._session is not None:
            self._session.operations = True
        for length in self._lengths():
            if self._session is not None and self._session.preempted:
                break
            if share:
                self._dist.broadcast(length)
            op = SearcherOperation(self._session, length, True, metric)
            yield op
            if not op._completed:
                raise RuntimeError("you must call op.report_completed() on each operation")
        if share:
            self._dist.broadcast(None)

    def acknowledge_out_of_ops(self) -> None:
        """A no-op, as in Determined 0.38."""

    def get_configured_units(self) -> Unit | None:
        """The unit of the searcher's lengths (``max_length``'s or ``time_metric``'s)."""
        if self._info is None:
            return Unit.EPOCHS
        return Unit(self._info._session.length_unit.upper())
