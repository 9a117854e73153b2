"""Search methods that train every trial to the full length: single, grid and random.

Each trial starts with ``train_to == max_length`` and one rung at ``max_length``; results
before that are answered with CONTINUE, the one at ``max_length`` with STOP. Nothing is ever
paused, so ``next_resume`` and ``closed_trials`` are always empty.

InvalidHP: random search owes a replacement sample (it does not count toward ``max_trials``);
grid and single drop the point, because another try would give the same hyperparameters.
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING, Any

from searchers._base import Action, Decision, ExitReason, TrialStart
from searchers._space import (
    HyperparameterSpace,
    RandomSampler,
    Sampler,
    derive_seed,
    rng_state_from_json,
    rng_state_to_json,
)
from searchers._tpe import build_hparam_sampler
from searchlab.config import RandomConfig

if TYPE_CHECKING:
    from searchlab.config import ExperimentConfig

__all__ = ["GridSearch", "RandomSearch", "SingleSearch"]

_STATE_VERSION = 1


class _FullLengthSearch:
    """What single, grid and random share: trial seeds, active trials, CONTINUE/STOP, state."""

    kind = ""

    def __init__(
        self,
        max_length: int,
        seed: int,
        *,
        max_concurrent_trials: int = 0,
        smaller_is_better: bool = True,
    ) -> None:
        if max_length < 1:
            raise ValueError(
                f"The value of `max_length` is {max_length}, but must be `max_length >= 1`"
            )
        if max_concurrent_trials < 0:
            raise ValueError(
                f"The value of `max_concurrent_trials` is {max_concurrent_trials}, but must be >= 0"
            )
        self.max_length = max_length
        self.seed = seed
        self.max_concurrent_trials = max_concurrent_trials
        self.smaller_is_better = smaller_is_better
        self._seed_rng = random.Random(derive_seed(seed, "trial_seed"))
        self._active: set[str] = set()
        self._started = 0
        self._invalid = 0

    def _next_hparams(self, trial_id: str) -> dict[str, Any] | None:
        raise NotImplementedError

    def _on_invalid(self, trial_id: str) -> None:
        """A trial raised InvalidHP."""

    def _on_result(self, trial_id: str, length: int, value: float) -> None:
        """A validation result (sign-normalised: smaller is better)."""

    def start_trial(self, trial_id: str) -> TrialStart | None:
        """The next trial, or None when all were handed out or the concurrency cap is reached."""
        if trial_id in self._active:
            raise ValueError(f"trial {trial_id!r} is already running; trial ids must be new")
        if self.max_concurrent_trials and len(self._active) >= self.max_concurrent_trials:
            return None
        hparams = self._next_hparams(trial_id)
        if hparams is None:
            return None
        self._active.add(trial_id)
        self._started += 1
        trial_seed = self._seed_rng.randrange(2**31)
        return TrialStart(
            hparams=hparams,
            train_to=self.max_length,
            rung_ends=[self.max_length],
            extra={"trial_seed": trial_seed},
        )

    def report(self, trial_id: str, length: int, value: float) -> Decision:
        """CONTINUE to ``max_length`` before it, STOP at or after it."""
        signed = float(value) if self.smaller_is_better else -float(value)
        if not math.isnan(signed):
            self._on_result(trial_id, length, signed)
        if length >= self.max_length:
            self._active.discard(trial_id)
            return Decision(Action.STOP)
        return Decision(Action.CONTINUE, train_to=self.max_length)

    def trial_exited(self, trial_id: str, reason: ExitReason) -> None:
        """Forget the trial; InvalidHP is handled by the method (replaced or dropped)."""
        if trial_id not in self._active:
            return
        self._active.discard(trial_id)
        if ExitReason(reason) is ExitReason.INVALID_HP:
            self._invalid += 1
            self._on_invalid(trial_id)

    def next_resume(self) -> tuple[str, int] | None:
        """Never: these methods do not pause trials."""
        return None

    def closed_trials(self) -> list[str]:
        """Never any: these methods do not pause trials."""
        return []

    def paused_trials(self) -> list[str]:
        """Never any: these methods do not pause trials."""
        return []

    @property
    def active_trials(self) -> list[str]:
        """Trials started and not yet stopped or exited."""
        return sorted(self._active)

    @property
    def invalid_trials(self) -> int:
        """How many trials raised InvalidHP."""
        return self._invalid

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state: counters, active trials and the random streams."""
        return {
            "version": _STATE_VERSION,
            "kind": self.kind,
            "max_length": self.max_length,
            "seed": self.seed,
            "active": sorted(self._active),
            "started": self._started,
            "invalid": self._invalid,
            "seed_rng": rng_state_to_json(self._seed_rng),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`'s output.

        Raises:
            ValueError: If the state is from another kind of search.
        """
        if state.get("kind") != self.kind or state.get("version") != _STATE_VERSION:
            raise ValueError(
                f"cannot restore a {self.kind} search from state of kind {state.get('kind')!r} "
                f"version {state.get('version')!r}"
            )
        self._active = set(state["active"])
        self._started = int(state["started"])
        self._invalid = int(state["invalid"])
        self._seed_rng.setstate(rng_state_from_json(state["seed_rng"]))


class SingleSearch(_FullLengthSearch):
    """One trial; a hyperparameter with a range takes a random sample from the seed.

    Example:
        >>> search = SingleSearch(HyperparameterSpace({"lr": 0.1}), 100, seed=0)
        >>> start = search.start_trial("t0")
        >>> start.hparams, start.train_to
        ({'lr': 0.1}, 100)
        >>> search.start_trial("t1") is None, search.finished
        (True, True)
    """

    kind = "single"

    def __init__(
        self, space: HyperparameterSpace, max_length: int, *, seed: int, **kwargs: Any
    ) -> None:
        super().__init__(max_length, seed, **kwargs)
        self._hparams = space.sample(random.Random(derive_seed(seed, "hparams")))

    @classmethod
    def from_config(cls, cfg: ExperimentConfig) -> SingleSearch:
        """The search ``cfg`` describes (``max_length`` in its own unit)."""
        return cls(
            HyperparameterSpace.from_config(cfg),
            cfg.searcher.max_length.value,
            seed=cfg.reproducibility.experiment_seed,
            smaller_is_better=cfg.searcher.smaller_is_better,
        )

    def _next_hparams(self, trial_id: str) -> dict[str, Any] | None:
        return self._hparams if self._started == 0 else None

    @property
    def finished(self) -> bool:
        """True once the trial was handed out."""
        return self._started >= 1


class GridSearch(_FullLengthSearch):
    """Every point of the grid, in SPEC order (the first leaf varies slowest).

    A point is made when its trial starts, so a large grid starts at once in constant memory;
    callers cap the grid's size first (:func:`searchers.build_search_method` does).

    Example:
        >>> space = HyperparameterSpace({"layers": {"type": "int", "minval": 8, "maxval": 64, "count": 4}})
        >>> search = GridSearch(space, 100, seed=0)
        >>> [search.start_trial(f"t{i}").hparams["layers"] for i in range(4)]
        [8, 27, 45, 64]
    """

    kind = "grid"

    def __init__(
        self, space: HyperparameterSpace, max_length: int, *, seed: int = 0, **kwargs: Any
    ) -> None:
        super().__init__(max_length, seed, **kwargs)
        self._space = space
        self._size = space.grid_size()  # points are made one at a time, when a trial starts

    @classmethod
    def from_config(cls, cfg: ExperimentConfig) -> GridSearch:
        """The search ``cfg`` describes (``max_length`` in its own unit)."""
        return cls(
            HyperparameterSpace.from_config(cfg),
            cfg.searcher.max_length.value,
            seed=cfg.reproducibility.experiment_seed,
            max_concurrent_trials=cfg.searcher.max_concurrent_trials,
            smaller_is_better=cfg.searcher.smaller_is_better,
        )

    @property
    def num_points(self) -> int:
        """The size of the grid."""
        return self._size

    def _next_hparams(self, trial_id: str) -> dict[str, Any] | None:
        return self._space.grid_point(self._started) if self._started < self._size else None

    @property
    def finished(self) -> bool:
        """True once every grid point was handed out."""
        return self._started >= self._size

    def state_dict(self) -> dict[str, Any]:
        """As the base, plus the grid size (checked on restore)."""
        return {**super().state_dict(), "num_points": self._size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`; the grid must be the same size."""
        if state.get("num_points") != self._size:
            raise ValueError(
                f"the grid has {self._size} points, but the saved search had "
                f"{state.get('num_points')}; the hyperparameters changed"
            )
        super().load_state_dict(state)


class RandomSearch(_FullLengthSearch):
    """``max_trials`` samples; a trial that raises InvalidHP is replaced and does not count.

    ``finished`` waits for the running trials too, because one may still raise InvalidHP and be
    owed a replacement.

    Example:
        >>> space = HyperparameterSpace({"lr": {"type": "double", "minval": 0.0, "maxval": 1.0}})
        >>> search = RandomSearch(space, 100, max_trials=2, seed=7)
        >>> a = search.start_trial("t0"); b = search.start_trial("t1")
        >>> search.start_trial("t2") is None
        True
    """

    kind = "random"

    def __init__(
        self,
        space: HyperparameterSpace,
        max_length: int,
        max_trials: int,
        *,
        seed: int,
        sampler: Sampler | None = None,
        **kwargs: Any,
    ) -> None:
        if max_trials < 1:
            raise ValueError(
                f"The value of `max_trials` is {max_trials}, but must be `max_trials >= 1`"
            )
        super().__init__(max_length, seed, **kwargs)
        self.max_trials = max_trials
        self.sampler: Sampler = sampler or RandomSampler(space, derive_seed(seed, "hparams"))

    @classmethod
    def from_config(cls, cfg: ExperimentConfig) -> RandomSearch:
        """The search ``cfg`` describes, with the sampler ``searcher.sampler`` names."""
        searcher = cfg.searcher
        if not isinstance(searcher, RandomConfig):
            raise ValueError(
                f"RandomSearch needs a random searcher config, got {searcher.name.value}"
            )
        seed = cfg.reproducibility.experiment_seed
        return cls(
            HyperparameterSpace.from_config(cfg),
            searcher.max_length.value,
            searcher.max_trials,
            seed=seed,
            sampler=build_hparam_sampler(cfg, seed),
            max_concurrent_trials=searcher.max_concurrent_trials,
            smaller_is_better=searcher.smaller_is_better,
        )

    @property
    def remaining(self) -> int:
        """Trials still to hand out, replacements included."""
        return self.max_trials + self._invalid - self._started

    def _next_hparams(self, trial_id: str) -> dict[str, Any] | None:
        return self.sampler.sample(trial_id) if self.remaining > 0 else None

    def _on_invalid(self, trial_id: str) -> None:
        self.sampler.forget(trial_id)

    def _on_result(self, trial_id: str, length: int, value: float) -> None:
        self.sampler.observe(trial_id, length, value)

    @property
    def finished(self) -> bool:
        """True once all trials were handed out and none is still running."""
        return self.remaining <= 0 and not self._active

    def state_dict(self) -> dict[str, Any]:
        """As the base, plus ``max_trials`` and the sampler's state."""
        return {
            **super().state_dict(),
            "max_trials": self.max_trials,
            "sampler": self.sampler.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`, the sample stream included."""
        super().load_state_dict(state)
        self.sampler.load_state_dict(state["sampler"])
