"""Adaptive search fed by a hyperparameter sampler: trial seeds and sampler feedback."""

from __future__ import annotations

import random
from typing import Any

from searchers._base import Decision, ExitReason, SearchMethod, TrialStart
from searchers._space import derive_seed, rng_state_from_json, rng_state_to_json
from searchers._tpe import Sampler

__all__ = ["SampledSearch"]


class SampledSearch:
    """Wraps a rung-based search: gives each trial a seed and tells the sampler every result.

    The sampler sees sign-normalised values (smaller is better) at every rung, so a model-based
    sampler (TPE) learns from early rungs as BOHB does.

    Example:
        >>> search = SampledSearch(AdaptiveSearch(plan, sampler.sample), sampler, seed=42)
    """

    def __init__(
        self, inner: Any, sampler: Sampler, *, seed: int, smaller_is_better: bool = True
    ) -> None:
        self.inner: SearchMethod = inner
        self.sampler = sampler
        self._sign = 1.0 if smaller_is_better else -1.0
        self._seeds = random.Random(derive_seed(seed, "trial_seed"))

    def start_trial(self, trial_id: str) -> TrialStart | None:
        start = self.inner.start_trial(trial_id)
        if start is None:
            return None
        extra = {**start.extra, "trial_seed": self._seeds.randrange(2**31)}
        return TrialStart(start.hparams, start.train_to, start.rung_ends, start.bracket, extra)

    def report(self, trial_id: str, length: int, value: float) -> Decision:
        self.sampler.observe(trial_id, length, self._sign * value)
        return self.inner.report(trial_id, length, value)

    def trial_exited(self, trial_id: str, reason: ExitReason) -> None:
        if reason is ExitReason.INVALID_HP:
            self.sampler.forget(trial_id)
        self.inner.trial_exited(trial_id, reason)

    def next_resume(self) -> tuple[str, int] | None:
        return self.inner.next_resume()

    def closed_trials(self) -> list[str]:
        return self.inner.closed_trials()

    def paused_trials(self) -> list[str]:
        return self.inner.paused_trials()

    @property
    def finished(self) -> bool:
        return self.inner.finished

    def rung_table(self) -> list[dict[str, Any]]:
        return self.inner.rung_table()  # type: ignore[attr-defined, no-any-return]

    def state_dict(self) -> dict[str, Any]:
        return {
            "inner": self.inner.state_dict(),
            "sampler": self.sampler.state_dict(),
            "seeds": rng_state_to_json(self._seeds),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state["inner"])
        self.sampler.load_state_dict(state["sampler"])
        self._seeds.setstate(rng_state_from_json(state["seeds"]))
