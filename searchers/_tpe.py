"""A BOHB-style TPE sampler on Optuna, and :func:`build_hparam_sampler`.

One in-memory Optuna study per training length: every result a trial reports at a length
becomes a finished trial of that length's study. A new sample comes from TPE on the study of
the longest length with at least ``n_startup`` results, else uniformly at random (as BOHB
does). Optuna is imported only when a TPE sampler is built.
"""

from __future__ import annotations

import contextlib
import copy
import math
import random
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from searchers._space import (
    HyperparameterSpace,
    RandomSampler,
    Sampler,
    derive_seed,
    rng_state_from_json,
    rng_state_to_json,
    sample_value,
    unflatten_hparams,
)
from searchlab.config import HParamSpec, HParamType, SamplerName
from searchlab.errors import ConfigError

if TYPE_CHECKING:
    import optuna

    from searchlab.config import ExperimentConfig

__all__ = ["TPESampler", "build_hparam_sampler"]


def _import_optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise ConfigError(
            "<config>: searcher.sampler: tpe needs optuna, which is not installed; "
            "pip install optuna or use sampler: random"
        ) from None
    return optuna


@contextlib.contextmanager
def _quiet(optuna: Any) -> Iterator[None]:
    """Optuna logs every study and trial at INFO; keep that out of experiment logs."""
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(level)


def _distribution(optuna: Any, spec: HParamSpec) -> Any:
    dists = optuna.distributions
    if spec.type is HParamType.INT:
        return dists.IntDistribution(int(spec.minval), int(spec.maxval))
    if spec.type is HParamType.DOUBLE:
        return dists.FloatDistribution(float(spec.minval), float(spec.maxval))
    if spec.type is HParamType.LOG:
        low, high = sorted((spec.base**spec.minval, spec.base**spec.maxval))
        return dists.FloatDistribution(low, high, log=True)
    # Choices as indices: Optuna only takes scalars, and vals may hold lists or maps.
    return dists.CategoricalDistribution(list(range(len(spec.vals))))


class TPESampler:
    """TPE on the results at the longest length that has enough of them (BOHB's model choice).

    Args:
        space: The hyperparameter space.
        seed: Seeds both the random start and every TPE suggestion.
        n_startup: Results a length needs before TPE is used there
            (default ``max(10, dimensions + 1)``).

    Example:
        >>> space = HyperparameterSpace({"lr": {"type": "double", "minval": 0.0, "maxval": 1.0}})
        >>> sampler = TPESampler(space, seed=0, n_startup=2)
        >>> for i in range(3):
        ...     hp = sampler.sample(f"t{i}")
        ...     sampler.observe(f"t{i}", 100, (hp["lr"] - 0.3) ** 2)
        >>> 0.0 <= sampler.sample("t3")["lr"] <= 1.0
        True
    """

    def __init__(
        self, space: HyperparameterSpace, seed: int, *, n_startup: int | None = None
    ) -> None:
        self._optuna = _import_optuna()
        self.space = space
        self.seed = seed
        self.n_startup = n_startup if n_startup is not None else max(10, space.dimensions + 1)
        if self.n_startup < 1:
            raise ValueError(
                f"The value of `n_startup` is {self.n_startup}, but must be `n_startup >= 1`"
            )
        self._searched = [spec for spec in space.specs if spec.type is not HParamType.CONST]
        self._distributions = {
            spec.name: _distribution(self._optuna, spec) for spec in self._searched
        }
        self._rng = random.Random(derive_seed(seed, "tpe-startup"))
        self._asks = 0
        self._pending: dict[str, dict[str, Any]] = {}
        self._observations: list[dict[str, Any]] = []
        self._studies: dict[int, optuna.Study] = {}

    # The Sampler protocol.

    def sample(self, trial_id: str) -> dict[str, Any]:
        """Nested hyperparameters for ``trial_id``: TPE where there are enough results, else random."""
        length = self.model_length()
        if length is None or not self._distributions:
            params = self._random_params()
        else:
            params = self._tpe_params(length)
        self._asks += 1
        self._pending[trial_id] = params
        return self._to_hparams(params)

    def observe(self, trial_id: str, length: int, value: float) -> None:
        """Add the trial's result at ``length`` (smaller is better); a repeat replaces it."""
        params = self._pending.get(trial_id)
        if params is None or not math.isfinite(value):
            return
        before = len(self._observations)
        self._observations = [
            o for o in self._observations if (o["trial_id"], o["length"]) != (trial_id, length)
        ]
        record = {
            "trial_id": trial_id,
            "length": int(length),
            "value": float(value),
            "params": params,
        }
        self._observations.append(record)
        if len(self._observations) <= before:
            self._rebuild_studies()
        else:
            self._add_to_study(record)

    def forget(self, trial_id: str) -> None:
        """Drop the trial's sample and results (it raised InvalidHP)."""
        self._pending.pop(trial_id, None)
        kept = [o for o in self._observations if o["trial_id"] != trial_id]
        if len(kept) != len(self._observations):
            self._observations = kept
            self._rebuild_studies()

    def state_dict(self) -> dict[str, Any]:
        """The observations and pending samples, enough to rebuild the studies."""
        return {
            "kind": "tpe",
            "n_startup": self.n_startup,
            "asks": self._asks,
            "rng": rng_state_to_json(self._rng),
            "pending": {tid: dict(params) for tid, params in self._pending.items()},
            "observations": [dict(o) for o in self._observations],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` and rebuild one study per length."""
        if state.get("kind") != "tpe":
            raise ValueError(
                f"cannot restore a TPE sampler from sampler state of kind {state.get('kind')!r}"
            )
        self._asks = int(state["asks"])
        self._rng.setstate(rng_state_from_json(state["rng"]))
        self._pending = {tid: dict(params) for tid, params in state["pending"].items()}
        self._observations = [dict(o) for o in state["observations"]]
        self._rebuild_studies()

    # Helpers.

    def observations_at(self, length: int) -> int:
        """How many results there are at ``length``."""
        return sum(o["length"] == length for o in self._observations)

    def model_length(self) -> int | None:
        """The longest length with at least ``n_startup`` results (where TPE is used), or None."""
        counts: dict[int, int] = {}
        for o in self._observations:
            counts[o["length"]] = counts.get(o["length"], 0) + 1
        ready = [length for length, n in counts.items() if n >= self.n_startup]
        return max(ready) if ready else None

    def _random_params(self) -> dict[str, Any]:
        params: dict[str, Any] = {}
        for spec in self._searched:
            if spec.type is HParamType.CATEGORICAL:
                params[spec.name] = self._rng.randrange(len(spec.vals))
            else:
                params[spec.name] = sample_value(spec, self._rng)
        return params

    def _tpe_params(self, length: int) -> dict[str, Any]:
        optuna = self._optuna
        study = self._studies[length]
        # A fresh seed per ask, so a rebuilt sampler continues the same sequence.
        study.sampler = optuna.samplers.TPESampler(
            seed=derive_seed(self.seed, f"tpe-ask-{self._asks}"),
            n_startup_trials=0,
            constant_liar=False,
        )
        with _quiet(optuna):
            trial = study.ask(fixed_distributions=self._distributions)
            params = dict(trial.params)
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        return params

    def _to_hparams(self, params: dict[str, Any]) -> dict[str, Any]:
        flat: dict[str, Any] = {}
        for spec in self.space.specs:
            if spec.type is HParamType.CONST:
                flat[spec.name] = copy.deepcopy(spec.val)
            elif spec.type is HParamType.CATEGORICAL:
                flat[spec.name] = copy.deepcopy(spec.vals[int(params[spec.name])])
            elif spec.type is HParamType.INT:
                flat[spec.name] = int(params[spec.name])
            else:
                flat[spec.name] = float(params[spec.name])
        return unflatten_hparams(flat)

    def _study(self, length: int) -> optuna.Study:
        if length not in self._studies:
            with _quiet(self._optuna):
                self._studies[length] = self._optuna.create_study(direction="minimize")
        return self._studies[length]

    def _add_to_study(self, record: dict[str, Any]) -> None:
        trial = self._optuna.trial.create_trial(
            params=record["params"], distributions=self._distributions, value=record["value"]
        )
        with _quiet(self._optuna):
            self._study(record["length"]).add_trial(trial)

    def _rebuild_studies(self) -> None:
        self._studies = {}
        for record in self._observations:
            self._add_to_study(record)


def build_hparam_sampler(cfg: ExperimentConfig, seed: int | None = None) -> Sampler:
    """The sampler ``searcher.sampler`` names (``random`` when the searcher has none).

    Args:
        cfg: The experiment config.
        seed: The experiment seed (``cfg.reproducibility.experiment_seed`` when None); the
            sampler's own seed is derived from it.

    Returns:
        A :class:`RandomSampler` or a :class:`TPESampler` over the config's space.
    """
    seed = cfg.reproducibility.experiment_seed if seed is None else seed
    space = HyperparameterSpace.from_config(cfg)
    kind = getattr(cfg.searcher, "sampler", SamplerName.RANDOM)
    if kind is SamplerName.TPE:
        return TPESampler(space, derive_seed(seed, "hparams"))
    return RandomSampler(space, derive_seed(seed, "hparams"))
