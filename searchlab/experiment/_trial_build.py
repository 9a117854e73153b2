"""Building the user's trial for one Tune config: its class, context, seeds and loop settings."""

from __future__ import annotations

import pathlib
from typing import Any

from searchlab.experiment._idle import freeze_imported_objects
from searchlab.experiment._protocol import TrialConfig
from searchlab.experiment._spec import ExperimentSpec
from searchlab.pytorch import DistributedContext, PyTorchTrialContext, TrainUnit, load_trial_class
from searchlab.pytorch._loop import LoopSettings, TrialLoop
from searchlab.pytorch._trainer import seed_everything

__all__ = ["build_trial_loop"]


def build_trial_loop(
    spec: ExperimentSpec,
    hparams: dict[str, Any],
    plan: TrialConfig,
    trial_id: str,
    logdir: str | None,
    model_dir: str,
    distributed: DistributedContext | None,
    *,
    worker_process: bool,
) -> TrialLoop:
    """The user's trial built and wrapped in the loop that trains it.

    ``worker_process``: the process is a Ray worker of its own, whose imported objects may
    leave the garbage collector's scans once the trial's module is loaded.
    """
    trial_class = load_trial_class(spec.entrypoint, model_dir)
    if worker_process:
        freeze_imported_objects()  # a process of its own: its imports stay for good
    seed = plan.trial_seed
    dist = distributed or DistributedContext()
    seed_everything(seed + dist.rank)  # own RNG streams per worker; data order uses `seed`
    context = PyTorchTrialContext(
        hparams,
        exp_conf=spec.exp_conf,
        distributed=dist,
        trial_seed=seed,
        trial_id=trial_id,
        experiment_id=spec.name,
        aggregation_frequency=spec.aggregation_frequency,
        tensorboard_path=pathlib.Path(logdir or ".") / "tensorboard",
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


def _unit(length: dict[str, int] | None) -> TrainUnit | None:
    return TrainUnit.coerce(length) if length else None
