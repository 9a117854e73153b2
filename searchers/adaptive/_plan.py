"""Bracket and rung arithmetic of adaptive ASHA (SPEC.md section 2, "brackets and rungs").

Everything here is a pure function of the searcher config: how many brackets, how many trials and
how much concurrency each gets, where each rung ends, and a preview of how many trials end their
training at each length.
"""

from __future__ import annotations

import enum
import itertools
import math
from dataclasses import dataclass
from typing import Any

from searchlab.errors import ConfigError

__all__ = [
    "AdaptivePlan",
    "BracketPlan",
    "Mode",
    "allocate_concurrency",
    "allocate_trials",
    "build_adaptive_plan",
    "build_async_halving_plan",
    "compute_rung_ends",
]


class Mode(str, enum.Enum):
    """Which brackets adaptive ASHA runs when ``bracket_rungs`` is not given.

    Example:
        >>> Mode("standard") is Mode.STANDARD
        True
    """

    AGGRESSIVE = "aggressive"
    STANDARD = "standard"
    CONSERVATIVE = "conservative"


@dataclass(frozen=True)
class BracketPlan:
    """One bracket: its rungs, its share of the trials and of the concurrency.

    ``rung_ends[k]`` is the total length (in the searcher's unit) a trial has trained when it
    reports at rung ``k``; the last one is ``max_length``.

    Example:
        >>> b = BracketPlan(num_rungs=2, num_trials=5, concurrency=5, rung_ends=[250, 1000])
        >>> b.initial_trials
        5
    """

    num_rungs: int
    num_trials: int
    concurrency: int
    rung_ends: list[int]

    @property
    def initial_trials(self) -> int:
        """How many trials the bracket starts before any result comes back."""
        return min(self.concurrency, self.num_trials)

    def to_dict(self) -> dict[str, Any]:
        """The bracket as JSON-able data (``rungs``, ``trials``, ``concurrency``, ``rung_ends``)."""
        return {
            "rungs": self.num_rungs,
            "trials": self.num_trials,
            "concurrency": self.concurrency,
            "rung_ends": list(self.rung_ends),
        }


@dataclass(frozen=True)
class AdaptivePlan:
    """The brackets of an adaptive (or single-bracket async halving) search.

    Brackets are sorted by number of rungs, most first; bracket ``i`` of the plan is bracket
    ``i`` of :class:`~searchers.adaptive.AdaptiveSearch`.

    Example:
        >>> from searchers.adaptive import build_adaptive_plan
        >>> plan = build_adaptive_plan(1000, 64)
        >>> [(b.num_rungs, b.num_trials, b.concurrency) for b in plan.brackets]
        [(4, 45, 6), (3, 14, 5), (2, 5, 5)]
        >>> plan.trials_per_length(stop_once=True)
        {15: 34, 62: 20, 250: 7, 1000: 3}
    """

    brackets: list[BracketPlan]
    divisor: float

    def trials_per_length(self, stop_once: bool = False) -> dict[int, int]:
        """How many trials end their training at each rung end (a preview, sorted by length).

        A rung reached by ``rt`` trials sends ``go`` of them on and ends the rest there:
        ``go = max(int(rt / d), 1)`` when stopping (``stop_once``; the SPEC's preview formula, as
        Determined 0.38 previewed its stopping-based ASHA) and ``go = int(rt / d)`` when promoting
        (a rung with fewer than ``d`` results promotes nobody). Both are what happens when results
        arrive best first; in promotion mode a newcomer that beats already promoted trials is
        promoted too, so the counts at longer lengths are a lower bound there. Lengths that no
        trial ends at are listed with 0, so that "no trial reaches max_length" is visible.
        """
        counts: dict[int, int] = {}
        for bracket in self.brackets:
            reaching = bracket.num_trials
            for k, end in enumerate(bracket.rung_ends):
                last = k == bracket.num_rungs - 1
                going_on = 0 if last else _going_on(reaching, self.divisor, stop_once)
                counts[end] = counts.get(end, 0) + reaching - going_on
                reaching = going_on
        return dict(sorted(counts.items()))

    def total_length(self, stop_once: bool = False) -> int:
        """Total units trained by all trials per :meth:`trials_per_length`.

        Resumed trials continue from their checkpoint, so a trial that ends at length ``u`` has
        trained ``u`` units in all.
        """
        return sum(length * count for length, count in self.trials_per_length(stop_once).items())

    def to_dict(self, stop_once: bool = False) -> dict[str, Any]:
        """The plan as JSON-able data: the brackets and the preview (keys are strings)."""
        per_length = self.trials_per_length(stop_once)
        return {
            "brackets": [bracket.to_dict() for bracket in self.brackets],
            "trials_per_length": {str(length): count for length, count in per_length.items()},
        }


def build_adaptive_plan(
    max_length: int,
    max_trials: int,
    *,
    mode: str | Mode = Mode.STANDARD,
    divisor: float = 4,
    max_rungs: int = 5,
    bracket_rungs: list[int] | None = None,
    max_concurrent_trials: int = 16,
) -> AdaptivePlan:
    """The brackets of ``adaptive_asha`` for a searcher config.

    Args:
        max_length: Length (in the searcher's unit) each trial trains to at most.
        max_trials: Trials in all brackets together (the first bracket absorbs rounding).
        mode: ``aggressive`` (one bracket), ``standard`` or ``conservative``.
        divisor: Fraction ``1/divisor`` of a rung goes on to the next; must be > 1.
        max_rungs: Upper limit on rungs per bracket (further limited by length and trials).
        bracket_rungs: Rungs of each bracket; overrides ``mode`` and ``max_rungs`` when non-empty.
        max_concurrent_trials: Trials running at once over all brackets; 0 = no limit.

    Raises:
        ConfigError: An argument is out of range, or the rungs of a bracket would end at the
            same length.
    """
    _check_int("max_length", max_length, minimum=1)
    _check_int("max_trials", max_trials, minimum=1)
    mode = _parse_mode(mode)
    div = _check_divisor(divisor)
    _check_int("max_rungs", max_rungs, minimum=1)
    _check_int("max_concurrent_trials", max_concurrent_trials, minimum=0)
    if bracket_rungs:
        for i, rungs in enumerate(bracket_rungs):
            _check_int(f"bracket_rungs[{i}]", rungs, minimum=1)
        rung_counts = list(bracket_rungs)
    else:
        rung_counts = _mode_rungs(mode, _max_rungs(max_length, max_trials, div, max_rungs))
    return _build_plan(
        max_length, max_trials, div, sorted(rung_counts, reverse=True), max_concurrent_trials
    )


def build_async_halving_plan(
    max_length: int,
    max_trials: int,
    *,
    num_rungs: int,
    divisor: float = 4,
    max_concurrent_trials: int = 16,
) -> AdaptivePlan:
    """The single bracket of ``async_halving``: ``num_rungs`` rungs, all ``max_trials`` trials.

    Example:
        >>> from searchers.adaptive import build_async_halving_plan
        >>> build_async_halving_plan(64, 16, num_rungs=3).brackets[0].rung_ends
        [4, 16, 64]

    Raises:
        ConfigError: An argument is out of range (see :func:`build_adaptive_plan`).
    """
    _check_int("max_length", max_length, minimum=1)
    _check_int("max_trials", max_trials, minimum=1)
    _check_int("num_rungs", num_rungs, minimum=1)
    div = _check_divisor(divisor)
    _check_int("max_concurrent_trials", max_concurrent_trials, minimum=0)
    return _build_plan(max_length, max_trials, div, [num_rungs], max_concurrent_trials)


def allocate_trials(max_trials: int, divisor: float, rung_counts: list[int]) -> list[int]:
    """Trials per bracket, weighted ``d**(r-1)/r`` as in Hyperband; bracket 0 gets the remainder."""
    weights = [divisor ** (rungs - 1) / rungs for rungs in rung_counts]
    total_weight = sum(weights)
    trials = [max(int(weight / total_weight * max_trials), 1) for weight in weights]
    trials[0] += max(max_trials - sum(trials), 0)
    return trials


def allocate_concurrency(max_concurrent: int, divisor: float, trials: list[int]) -> list[int]:
    """Concurrency per bracket: an even split of ``max_concurrent``, the remainder to the first."""
    count = len(trials)
    if max_concurrent == 0:
        return [max(trials[-1], int(divisor))] * count
    total = max(max_concurrent, count)
    return [total // count + (1 if i < total % count else 0) for i in range(count)]


def compute_rung_ends(num_rungs: int, divisor: float, max_length: int) -> list[int]:
    """Total length at each rung: ``max(int(L / d**(r-1-k)), 1)`` for rung ``k``."""
    return [max(int(max_length / divisor ** (num_rungs - 1 - k)), 1) for k in range(num_rungs)]


def _build_plan(
    max_length: int, max_trials: int, divisor: float, rung_counts: list[int], max_concurrent: int
) -> AdaptivePlan:
    trials = allocate_trials(max_trials, divisor, rung_counts)
    concurrency = allocate_concurrency(max_concurrent, divisor, trials)
    brackets = []
    for rungs, n_trials, n_concurrent in zip(rung_counts, trials, concurrency):
        ends = compute_rung_ends(rungs, divisor, max_length)
        _check_rung_ends(ends, max_length, divisor)
        brackets.append(BracketPlan(rungs, n_trials, n_concurrent, ends))
    return AdaptivePlan(brackets=brackets, divisor=divisor)


def _max_rungs(max_length: int, max_trials: int, divisor: float, max_rungs: int) -> int:
    # Float logs and truncation, as Determined computed them.
    by_length = int(math.log(max_length) / math.log(divisor)) + 1
    by_trials = int(math.log(max_trials) / math.log(divisor)) + 1
    return min(max_rungs, by_length, by_trials)


def _mode_rungs(mode: Mode, max_rungs: int) -> list[int]:
    if mode is Mode.AGGRESSIVE:
        return [max_rungs]
    if mode is Mode.STANDARD:
        return list(range((max_rungs - 1) // 2 + 1, max_rungs + 1))
    return list(range(1, max_rungs + 1))


def _going_on(reaching: int, divisor: float, stop_once: bool) -> int:
    going_on = int(reaching / divisor)
    return max(going_on, 1) if stop_once else going_on


def _check_int(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} is {value!r}, but must be an int >= {minimum}")


def _check_divisor(divisor: object) -> float:
    if isinstance(divisor, bool) or not isinstance(divisor, (int, float)):
        raise ConfigError(f"divisor is {divisor!r}, but must be a number > 1")
    if not math.isfinite(divisor) or divisor <= 1:
        raise ConfigError(f"divisor is {divisor!r}, but must be > 1")
    return float(divisor)


def _parse_mode(mode: str | Mode) -> Mode:
    try:
        return Mode(mode)
    except ValueError:
        names = ", ".join(m.value for m in Mode)
        raise ConfigError(f"mode is {mode!r}, but must be one of: {names}") from None


def _check_rung_ends(ends: list[int], max_length: int, divisor: float) -> None:
    if all(a < b for a, b in itertools.pairwise(ends)):
        return
    raise ConfigError(
        f"max_length is {max_length}, but a bracket with {len(ends)} rungs and divisor {divisor:g} "
        f"needs rung ends that strictly increase, and they would be {ends}: raise max_length or "
        "lower max_rungs / bracket_rungs / num_rungs"
    )
