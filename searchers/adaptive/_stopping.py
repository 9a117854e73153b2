"""The stopping variant of ASHA (``stop_once: true``; SPEC.md section 2, "Stopping").

No trial ever pauses: at each rung end a trial either goes on or is stopped for good. A result
joins its rung ahead of the results equal to it; the trial goes on when it ranks in the top
``max(int(n / d), 1)`` of the rung's ``n`` results (this one included), so the first result of
a rung always goes on. At the last rung every trial stops.
"""

from __future__ import annotations

from searchers.adaptive._rungs import Rung, RungEntry, find_insert_index

__all__ = ["StoppingRungs", "continue_quota"]


def continue_quota(num_results: int, divisor: float) -> int:
    """How many of a rung's ``num_results`` results (the newest included) may go on."""
    return max(int(num_results / divisor), 1)


class StoppingRungs:
    """The rungs of one bracket under the stopping rule.

    ``RungEntry.promoted`` records whether the trial went on from that rung.

    Example:
        >>> from searchers.adaptive import StoppingRungs
        >>> rungs = StoppingRungs([4, 16, 64], divisor=2)
        >>> rungs.admit(); rungs.admit()
        >>> rungs.record("a", 0, 0.5, alive=True)  # first result of the rung: goes on
        True
        >>> rungs.record("b", 0, 0.7, alive=True)  # rank 1 of 2, quota max(int(2/2), 1) = 1
        False
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

    def record(self, trial_id: str, index: int, value: float, *, alive: bool) -> bool:
        """Record the trial's result at rung ``index``; True when it goes on to the next rung.

        ``alive`` is False for a trial that exited (its result is ``+inf``): it never goes on.
        """
        rung = self.rungs[index]
        rung.outstanding -= 1
        position = find_insert_index(rung, value, ahead_of_equals=True)
        quota = continue_quota(len(rung.entries) + 1, self.divisor)
        going_on = alive and index < self.last and position < quota
        rung.entries.insert(position, RungEntry(trial_id, value, promoted=going_on))
        if going_on:
            self.rungs[index + 1].outstanding += 1
        return going_on

    def remove(self, trial_id: str, index: int) -> None:
        """Forget the trial in rungs ``0..index`` (InvalidHP); it was on its way to ``index``."""
        for rung in self.rungs[: index + 1]:
            rung.entries = [entry for entry in rung.entries if entry.trial_id != trial_id]
        self.rungs[index].outstanding -= 1
