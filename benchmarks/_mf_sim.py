"""An asynchronous runner with N simulated workers and a simulated clock (``search_efficiency``).

Like Syne Tune's simulator backend: each worker trains one trial at a time, one unit of
training takes one tick of the clock, and after every unit the trial reports its validation
error to the method, which answers continue, pause or stop. A free worker asks the method for
its next job (a new trial or the resume of a paused one). Events are processed in clock order
(ties: lowest worker first), so a run is deterministic.

The budget counts units trained by any worker. A resumed trial goes on from where it paused
(its checkpoint), so it repeats nothing; a trial that starts over counts again. The run ends
when the budget is spent (the units in flight are not counted), or when the method has nothing
left to run.
"""

from __future__ import annotations

import dataclasses
import enum
import heapq
from collections.abc import Callable, Mapping
from typing import Any, Protocol

__all__ = ["Job", "Method", "Outcome", "Report", "RunResult", "best_so_far", "simulate"]


class Outcome(str, enum.Enum):
    """A method's answer to a report."""

    CONTINUE = "continue"
    PAUSE = "pause"
    STOP = "stop"


@dataclasses.dataclass(frozen=True)
class Job:
    """What a free worker runs: a new trial (with its hyperparameters) or a paused one."""

    trial_id: str
    hparams: Mapping[str, Any] | None = None  # None: resume the paused trial


class Method(Protocol):
    """What the runner needs from a search method (adapters in ``_mf_methods``)."""

    def next_job(self) -> Job | None:
        """The job for a free worker, or None (nothing to run now)."""

    def report(self, trial_id: str, length: int, value: float) -> Outcome:
        """The trial trained ``length`` units in all; its validation error is ``value``."""

    def close(self) -> None:
        """The run is over (free resources)."""


@dataclasses.dataclass(frozen=True)
class Report:
    """One validation result, in the order the runner saw them."""

    spent: int  # units trained by all workers, this one included
    clock: int
    trial_id: str
    length: int
    value: float  # observed validation error
    true: float  # noise-free error (synthetic), else the observed one


@dataclasses.dataclass
class RunResult:
    """All reports of a run, and how it ended."""

    reports: list[Report]
    spent: int
    clock: int
    trials: int
    resumes: int
    restarts: int  # units trained again because a trial started over (never, here)
    ended: str  # "budget" or "finished"


@dataclasses.dataclass
class _Trial:
    curve: Any
    trained: int = 0


def simulate(
    method: Method,
    curve_for: Callable[[Mapping[str, Any]], Any],
    *,
    workers: int,
    max_length: int,
    budget: int,
) -> RunResult:
    """Run ``method`` with ``workers`` simulated workers until ``budget`` units are trained.

    ``curve_for(hparams)`` gives a trial's curve (``observe(t)`` and ``true(t)``).
    """
    trials: dict[str, _Trial] = {}
    free = list(range(workers))
    events: list[tuple[int, int, str]] = []  # (clock, worker, trial)
    reports: list[Report] = []
    spent = clock = resumes = 0
    ended = "finished"

    def fill() -> None:
        nonlocal resumes
        while free:
            job = method.next_job()
            if job is None:
                return
            if job.hparams is not None:
                trials[job.trial_id] = _Trial(curve_for(job.hparams))
            else:
                resumes += 1
            worker = free.pop(0)
            heapq.heappush(events, (clock + 1, worker, job.trial_id))

    fill()
    while events:
        clock, worker, trial_id = heapq.heappop(events)
        trial = trials[trial_id]
        trial.trained += 1
        spent += 1
        t = trial.trained
        value = float(trial.curve.observe(t))
        reports.append(Report(spent, clock, trial_id, t, value, float(trial.curve.true(t))))
        if spent >= budget:
            ended = "budget"
            break
        outcome = method.report(trial_id, t, value)
        if outcome is Outcome.CONTINUE and t < max_length:
            heapq.heappush(events, (clock + 1, worker, trial_id))
        else:
            if outcome is Outcome.STOP or t >= max_length:
                trial.curve = _Done(t)  # frees a trainer's model
            free.append(worker)
            free.sort()
        fill()  # a result may also have made work for a worker that was idle
    method.close()
    return RunResult(reports, spent, clock, len(trials), resumes, 0, ended)


class _Done:
    """A finished trial's curve: it is never asked again, so drop the trainer behind it."""

    def __init__(self, length: int) -> None:
        self.length = length

    def observe(self, t: int) -> float:  # pragma: no cover - the runner never asks
        raise AssertionError(f"a finished trial was asked for unit {t}")

    true = observe


def best_so_far(
    reports: list[Report], grid: list[int], *, use_true: bool, optimum: float = 0.0
) -> list[float]:
    """The incumbent's error at each budget in ``grid`` (inf before the first report).

    The incumbent is the result with the lowest observed error so far; its score is its
    noise-free error minus ``optimum`` (regret) with ``use_true``, else its observed error.
    """
    out: list[float] = []
    best_value, best_score = float("inf"), float("inf")
    i = 0
    for b in grid:
        while i < len(reports) and reports[i].spent <= b:
            r = reports[i]
            if r.value < best_value:
                best_value = r.value
                best_score = (r.true - optimum) if use_true else r.value
            i += 1
        out.append(best_score)
    return out
