"""The Ray Tune trainable: one Tune trial runs one ``PyTorchTrial`` through ``TrialLoop``.

Class API with actor reuse: Tune calls ``save_checkpoint`` exactly when it pauses a trial, so a
pause loses nothing, and a cached actor takes the next trial without a new process.
A trial trains to the end of each of its rungs (``rung_ends``), validates, reports the searcher
metric there, and then either goes on (Tune calls ``step`` again), is paused, or is stopped.
"""

from __future__ import annotations

import logging
import os
import pathlib
import traceback
from collections.abc import Iterator
from typing import Any

from ray import tune

from searchlab.errors import InvalidHP, SearchlabError
from searchlab.experiment._spec import HPARAMS_KEY, TRIAL_KEY, ExperimentSpec
from searchlab.pytorch import (
    LoopSettings,
    PyTorchTrialContext,
    Report,
    TrainUnit,
    TrialLoop,
    load_trial_class,
)
from searchlab.pytorch._checkpoint import load_checkpoint, write_checkpoint_files
from searchlab.pytorch._trainer import seed_everything

__all__ = ["FATAL_KEY", "INVALID_HP_KEY", "LENGTH_KEY", "SearchlabTrainable"]

logger = logging.getLogger("searchlab")

LENGTH_KEY = "searchlab_length"  # set on a rung-end validation: the length in searcher units
RUNG_KEY = "searchlab_rung"
INVALID_HP_KEY = "searchlab_invalid_hp"
FATAL_KEY = "searchlab_fatal"  # a user error every trial would hit: the experiment stops


class SearchlabTrainable(tune.Trainable):
    """Runs the experiment's trial class for one set of hyperparameters."""

    def setup(self, config: dict[str, Any], experiment: ExperimentSpec) -> None:  # type: ignore[override]
        self._spec = experiment
        self._build(config)

    def _build(self, config: dict[str, Any]) -> None:
        spec = self._spec
        os.environ.update(spec.environment_variables)
        info = config[TRIAL_KEY]
        self._rung_ends: list[int] = list(info["rung_ends"])
        self._events: Iterator[Report] | None = None
        self._invalid: str | None = None
        self._fatal: str | None = None
        self._loop: TrialLoop | None = None
        try:
            self._loop = self._make_loop(config[HPARAMS_KEY], info)
        except InvalidHP as exc:
            self._invalid = str(exc) or "InvalidHP"
        except SearchlabError as exc:
            self._fatal = str(exc)

    def _make_loop(self, hparams: dict[str, Any], info: dict[str, Any]) -> TrialLoop:
        spec = self._spec
        trial_class = load_trial_class(spec.entrypoint, _model_dir(spec))
        seed = int(info["trial_seed"])
        seed_everything(seed)
        context = PyTorchTrialContext(
            hparams,
            exp_conf=spec.exp_conf,
            trial_seed=seed,
            trial_id=self.trial_id,
            experiment_id=spec.name,
            aggregation_frequency=spec.aggregation_frequency,
            tensorboard_path=pathlib.Path(self.logdir or ".") / "tensorboard",
        )
        trial = trial_class(context)
        settings = LoopSettings(
            scheduling_unit=spec.scheduling_unit,
            validation_period=_unit(spec.validation_period),
            checkpoint_period=_unit(spec.checkpoint_period),
            checkpoint_policy=spec.checkpoint_policy,
            searcher_metric=spec.metric,
            smaller_is_better=spec.smaller_is_better,
            perform_initial_validation=spec.perform_initial_validation,
        )
        return TrialLoop(trial, context, settings)

    def _rung_batches(self) -> list[int]:
        assert self._loop is not None
        unit = self._spec.length_unit
        return [self._loop.to_batches(TrainUnit.from_spec(unit, end)) for end in self._rung_ends]

    def _next_segment(self) -> Iterator[Report] | None:
        """The reports up to the next rung end past the current position, or None when done."""
        assert self._loop is not None
        for target in self._rung_batches():
            if target > self._loop.batches_trained:
                self._loop.target = target
                return self._loop.run()
        return None

    def step(self) -> dict[str, Any]:
        if self._invalid is not None:
            return {"done": True, INVALID_HP_KEY: self._invalid, "group": "invalid_hp"}
        if self._fatal is not None:
            return {"done": True, FATAL_KEY: self._fatal, "group": "error"}
        try:
            report = self._next_report()
        except InvalidHP as exc:
            return {"done": True, INVALID_HP_KEY: str(exc) or "InvalidHP", "group": "invalid_hp"}
        except SearchlabError as exc:
            return {"done": True, FATAL_KEY: str(exc), "group": "error"}
        if report is None:
            return {"done": True, "group": "end", "batches": self._position()}
        return self._result(report)

    def _next_report(self) -> Report | None:
        while True:
            if self._events is None:
                self._events = self._next_segment()
                if self._events is None:
                    return None
            report = next(self._events, None)
            if report is not None:
                return report
            self._events = None

    def _position(self) -> int:
        return self._loop.batches_trained if self._loop is not None else 0

    def _result(self, report: Report) -> dict[str, Any]:
        result: dict[str, Any] = dict(report.metrics)
        result.update(
            group=report.group or "checkpoint", batches=report.batches, epochs=report.epochs
        )
        if report.checkpoint:
            result["should_checkpoint"] = True
        if report.group == "validation" and report.done:
            batch_ends = self._rung_batches()
            if report.batches in batch_ends:
                rung = batch_ends.index(report.batches)
                result[LENGTH_KEY] = self._rung_ends[rung]
                result[RUNG_KEY] = rung
                result["done"] = rung == len(batch_ends) - 1
        if report.stop_requested:
            result["done"] = True
        return result

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        if self._loop is None:
            return None
        write_checkpoint_files(checkpoint_dir, self._loop.state_dict(), self._loop.metadata())
        self._loop.checkpoint_written(checkpoint_dir)
        return None

    def load_checkpoint(self, checkpoint: Any) -> None:
        if self._loop is None:
            return
        state, _ = load_checkpoint(checkpoint)
        self._loop.load_state_dict(state, checkpoint_uuid=pathlib.Path(str(checkpoint)).name)
        self._events = None

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        self.cleanup()
        self._build(new_config)
        return True

    def cleanup(self) -> None:
        if self._loop is not None:
            try:
                self._loop.close()
            except Exception:
                logger.warning("trial shutdown hook failed:\n%s", traceback.format_exc())
            self._loop = None
            self._events = None


def _unit(length: dict[str, int] | None) -> TrainUnit | None:
    return TrainUnit.coerce(length) if length else None


def _model_dir(spec: ExperimentSpec) -> str:
    """The model directory on this worker: the shipped copy (cwd) or the driver's path."""
    shipped = pathlib.Path.cwd()
    if (shipped / spec.module_file).is_file():
        return str(shipped)
    return spec.model_dir
