"""Rungs as plain data, and the promotion rule of ASHA in small named steps.

Values in a rung are "smaller is better" (the search flips the sign of a larger-is-better
metric before they get here) and sorted best first. A trial that left the search early counts
as ``+inf``, the worst value there is.

The promotion rule (SPEC.md section 2, "Promotion"), for a result at a rung that is not the
last one: ``old = int(n / d)`` and ``new = int((n + 1) / d)`` trials of the rung's ``n``
results (before and after this one) "should have been promoted". The newcomer goes on at once
when it ranks in the top ``new`` (ties: after the results equal to it); otherwise, if ``new``
grew, the result at position ``old`` is promoted unless it already was.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Promotion",
    "PromotionRungs",
    "Rung",
    "RungEntry",
    "decode_value",
    "encode_value",
    "find_insert_index",
    "find_promotable",
    "mark_promoted",
    "promotion_quota",
]

WORST = math.inf


@dataclass
class RungEntry:
    """One result in a rung: the trial, its value (smaller is better), and whether it went on.

    Example:
        >>> RungEntry("trial-3", 0.25).promoted
        False
    """

    trial_id: str
    value: float
    promoted: bool = False


@dataclass
class Rung:
    """The results at one rung end, best first, and how many trials are on their way to it.

    ``outstanding`` counts trials training toward this rung, and promoted trials waiting to be
    resumed toward it: results that are still to come.

    Example:
        >>> rung = Rung(end=15)
        >>> rung.entries, rung.outstanding
        ([], 0)
    """

    end: int
    entries: list[RungEntry] = field(default_factory=list)
    outstanding: int = 0

    @property
    def num_promoted(self) -> int:
        """How many of the results went on to the next rung."""
        return sum(1 for entry in self.entries if entry.promoted)

    def to_dict(self) -> dict[str, Any]:
        """The rung as JSON-able data (``+inf`` values are encoded as strings)."""
        entries = [[e.trial_id, encode_value(e.value), e.promoted] for e in self.entries]
        return {"end": self.end, "outstanding": self.outstanding, "entries": entries}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Rung:
        """The rung that :meth:`to_dict` described."""
        entries = [RungEntry(str(t), decode_value(v), bool(p)) for t, v, p in data["entries"]]
        return cls(end=int(data["end"]), entries=entries, outstanding=int(data["outstanding"]))


@dataclass(frozen=True)
class Promotion:
    """A trial sent on to rung ``to_rung``; ``now`` when it is the trial that just reported."""

    trial_id: str
    to_rung: int
    now: bool


def encode_value(value: float) -> float | str:
    """A rung value as JSON-safe data: infinities become ``"inf"`` / ``"-inf"``."""
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def decode_value(data: float | str) -> float:
    """The value that :func:`encode_value` encoded."""
    return float(data)


def promotion_quota(num_results: int, divisor: float) -> tuple[int, int]:
    """How many results should have been promoted before and after one more result.

    No ``max(., 1)``: a rung promotes only once it holds at least ``divisor`` results.
    """
    return int(num_results / divisor), int((num_results + 1) / divisor)


def find_insert_index(rung: Rung, value: float, *, ahead_of_equals: bool = False) -> int:
    """Where ``value`` goes in the rung: after equal values (promotion) or ahead of them."""
    search = bisect.bisect_left if ahead_of_equals else bisect.bisect_right
    return search(rung.entries, value, key=_value_of)


def find_promotable(
    rung: Rung, old: int, new: int, can_resume: Callable[[str], bool]
) -> int | None:
    """Index of the result to promote now that the quota grew from ``old`` to ``new``, if any.

    That is the result at position ``old``, unless it went on already or its trial can no
    longer be resumed (it exited, or was closed).
    """
    if new == old:
        return None
    entry = rung.entries[old]
    if entry.promoted or not can_resume(entry.trial_id):
        return None
    return old


def mark_promoted(rung: Rung, index: int) -> str:
    """Mark the result at ``index`` promoted and return its trial."""
    entry = rung.entries[index]
    entry.promoted = True
    return entry.trial_id


class PromotionRungs:
    """The rungs of one bracket under the promotion rule.

    The caller tells it when a trial enters the bracket (:meth:`admit`) and each rung result
    (:meth:`record`); it answers with the promotion the result causes, if any.

    Example:
        >>> from searchers.adaptive import PromotionRungs
        >>> rungs = PromotionRungs([4, 16, 64], divisor=2)
        >>> for trial in ("a", "b"):
        ...     rungs.admit()
        >>> rungs.record("a", 0, 0.5, alive=True, can_resume=lambda t: True) is None
        True
        >>> rungs.record("b", 0, 0.7, alive=True, can_resume=lambda t: True)
        Promotion(trial_id='a', to_rung=1, now=False)
    """

    def __init__(self, ends: list[int], divisor: float) -> None:
        self.rungs = [Rung(end=end) for end in ends]
        self.divisor = divisor

    @property
    def last(self) -> int:
        """Index of the last rung."""
        return len(self.rungs) - 1

    def admit(self) -> None:
        """A new trial starts training toward rung 0."""
        self.rungs[0].outstanding += 1

    def record(
        self,
        trial_id: str,
        index: int,
        value: float,
        *,
        alive: bool,
        can_resume: Callable[[str], bool],
    ) -> Promotion | None:
        """Record the trial's result at rung ``index`` and return the promotion it causes.

        ``alive`` is False for a trial that exited (its result is ``+inf``): it cannot go on.
        """
        rung = self.rungs[index]
        rung.outstanding -= 1
        if index == self.last:
            rung.entries.insert(find_insert_index(rung, value), RungEntry(trial_id, value))
            return None
        old, new = promotion_quota(len(rung.entries), self.divisor)
        position = find_insert_index(rung, value)
        now = alive and position < new
        rung.entries.insert(position, RungEntry(trial_id, value, promoted=now))
        if now:
            return self._send_on(trial_id, index, now=True)
        candidate = find_promotable(rung, old, new, can_resume)
        if candidate is None:
            return None
        return self._send_on(mark_promoted(rung, candidate), index, now=False)

    def mark_worst(self, trial_id: str, index: int) -> None:
        """A paused trial at rung ``index`` exited: its result there becomes the worst."""
        rung = self.rungs[index]
        entry = _pop_entry(rung, trial_id)
        entry.value = WORST
        rung.entries.insert(find_insert_index(rung, WORST), entry)

    def remove(self, trial_id: str, index: int, *, outstanding: bool) -> None:
        """Forget the trial in rungs ``0..index`` (InvalidHP); ``outstanding`` if it had no
        result at rung ``index`` yet."""
        for rung in self.rungs[: index + 1]:
            if any(entry.trial_id == trial_id for entry in rung.entries):
                _pop_entry(rung, trial_id)
        if outstanding:
            self.rungs[index].outstanding -= 1

    def close_out(self, num_trials: int) -> list[str]:
        """Trials with unpromoted results in rungs that can take no more results.

        Only once rung 0 holds all ``num_trials`` results; then bottom-up, each rung with
        nothing outstanding, up to the first that still waits for a result. The last rung is
        left out: its trials are done anyway.
        """
        if len(self.rungs[0].entries) < num_trials:
            return []
        closed: list[str] = []
        for rung in self.rungs[:-1]:
            if rung.outstanding > 0:
                break
            closed.extend(entry.trial_id for entry in rung.entries if not entry.promoted)
        return closed

    def _send_on(self, trial_id: str, index: int, *, now: bool) -> Promotion:
        self.rungs[index + 1].outstanding += 1
        return Promotion(trial_id, index + 1, now)


def _value_of(entry: RungEntry) -> float:
    return entry.value


def _pop_entry(rung: Rung, trial_id: str) -> RungEntry:
    for i, entry in enumerate(rung.entries):
        if entry.trial_id == trial_id:
            return rung.entries.pop(i)
    raise AssertionError(f"trial {trial_id!r} has no result at rung end {rung.end}")
