"""Building and running the ``ray.tune.Tuner`` of an experiment."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ray.tune.stopper import Stopper

from searchlab._ray_env import connect_ray, quiet_ray_environment
from searchlab.config import ExperimentConfig
from searchlab.experiment._ship import pack_model_dir
from searchlab.experiment._spec import ExperimentSpec

__all__ = ["RunOutcome", "run_tuner"]


def _trainable(spec: ExperimentSpec, resources: dict[str, float]) -> Any:
    """One process per trial, or a placement group of workers for data-parallel trials."""
    from ray import tune

    from searchlab.experiment._data_parallel import DataParallelTrainable, placement_group_factory
    from searchlab.experiment._trainable import SearchlabTrainable

    if spec.slots_per_trial > 1:
        pgf = placement_group_factory(spec.slots_per_trial, resources["cpu"], resources["gpu"])
        return tune.with_resources(
            tune.with_parameters(DataParallelTrainable, experiment=spec), pgf
        )
    return tune.with_resources(tune.with_parameters(SearchlabTrainable, experiment=spec), resources)


def _trial_dirname(trial: Any) -> str:
    return str(trial.trial_id)


def run_tuner(
    cfg: ExperimentConfig,
    spec: ExperimentSpec,
    exp_dir: pathlib.Path,
    *,
    address: str | None,
    echo: Callable[[str], None],
    ship: dict[str, Any],
    restore: bool = False,
) -> RunOutcome:
    """Run the experiment (or, with ``restore``, continue it) until it ends or is interrupted."""
    quiet_ray_environment()
    import ray

    from searchers import build_search_method
    from searchlab.experiment._adapters import GatedSearcher, RunControl, SearchScheduler
    from searchlab.experiment._recorder import TrialRecorder
    from searchlab.experiment._resources import trial_resources

    method = build_search_method(cfg)
    started = connect_ray(address, runtime_env=ship)
    if not started:  # Ray was up already: the job's working_dir cannot carry the model dir
        spec = dataclasses.replace(spec, model_archive=ray.put(pack_model_dir(spec.model_dir)))
    try:
        resources = trial_resources(cfg, ray.cluster_resources())
        control = RunControl(restored=restore)
        searcher = GatedSearcher(method, spec.metric, spec.smaller_is_better, control)
        scheduler = SearchScheduler(searcher, spec.smaller_is_better)
        recorder = TrialRecorder(
            spec, exp_dir, echo, rung_table=getattr(method, "rung_table", None), restored=restore
        )
        parts = _TunerParts(searcher, scheduler, recorder, control, _trainable(spec, resources))
        # Tune lets a custom searcher have one trial pending at a time, so an adaptive search
        # would start trials one by one and a fresh worker loses the race to a cached one:
        # allow as many pending trials as fit in the cluster at once.
        os.environ["TUNE_MAX_PENDING_TRIALS_PG"] = str(
            _trials_that_fit(cfg, resources, ray.cluster_resources())
        )
        tuner = (
            _restored_tuner(exp_dir, parts) if restore else _new_tuner(cfg, spec, exp_dir, parts)
        )
        verb = "continues" if restore else "starts"
        echo(
            f"experiment {spec.name} {verb}: {cfg.searcher.name.value} search, results in {exp_dir}"
        )
        with _interrupt_handler(control, echo):
            tuner.fit()
        recorder.print_table()
        return RunOutcome(fatal=recorder.fatal, interrupted=control.interrupted)
    finally:
        if started:
            ray.shutdown()


def _trials_that_fit(
    cfg: ExperimentConfig, resources: dict[str, float], cluster: dict[str, Any]
) -> int:
    workers = cfg.resources.slots_per_trial
    needs = {"CPU": resources["cpu"] * workers, "GPU": resources["gpu"] * workers}
    fit = min(int(float(cluster.get(k, 0)) // v) for k, v in needs.items() if v > 0)
    concurrency = getattr(cfg.searcher, "max_concurrent_trials", 0) or fit
    return max(1, min(fit, concurrency))


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    fatal: str | None  # a user error every trial would hit stopped the experiment
    interrupted: bool  # Ctrl-C paused the trials; `searchlab resume` continues


@dataclasses.dataclass(frozen=True)
class _TunerParts:
    searcher: Any
    scheduler: Any
    recorder: Any
    control: Any
    trainable: Any


def _new_tuner(
    cfg: ExperimentConfig, spec: ExperimentSpec, exp_dir: pathlib.Path, parts: _TunerParts
) -> Any:
    from ray import tune

    from searchlab.experiment._loggers import result_loggers

    concurrency = getattr(cfg.searcher, "max_concurrent_trials", 0) or None
    adaptive = hasattr(parts.searcher.method, "rung_table")
    return tune.Tuner(
        parts.trainable,
        tune_config=tune.TuneConfig(
            search_alg=parts.searcher,
            scheduler=parts.scheduler,
            num_samples=-1,
            reuse_actors=True,
            max_concurrent_trials=None if adaptive else concurrency,
            trial_dirname_creator=_trial_dirname,
            trial_name_creator=_trial_dirname,
        ),
        run_config=tune.RunConfig(
            name=exp_dir.name,
            storage_path=str(exp_dir.parent),
            verbose=0,
            callbacks=[parts.recorder, *result_loggers()],
            failure_config=tune.FailureConfig(max_failures=cfg.max_restarts),
            stop=_ExperimentStopper(parts.recorder),
            log_to_file=True,
        ),
    )


def _restored_tuner(exp_dir: pathlib.Path, parts: _TunerParts) -> Any:
    """Tune's saved experiment (trials, their checkpoints, the searcher's state) with this
    driver's live objects: Tune restores the searcher's state into ``parts.searcher``."""
    from ray import tune

    from searchlab.experiment._loggers import result_loggers

    tuner = tune.Tuner.restore(
        str(exp_dir), trainable=parts.trainable, resume_unfinished=True, resume_errored=False
    )
    internal: Any = tuner._local_tuner  # Tune offers no public way to swap these on restore
    internal._tune_config.search_alg = parts.searcher
    internal._tune_config.scheduler = parts.scheduler
    internal._run_config.callbacks = [parts.recorder, *result_loggers()]
    internal._run_config.stop = _ExperimentStopper(parts.recorder)
    internal._run_config.verbose = 0
    return tuner


class _ExperimentStopper(Stopper):
    """Ends the run when a user error would hit every trial."""

    def __init__(self, recorder: Any) -> None:
        self._recorder = recorder

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False

    def stop_all(self) -> bool:
        return self._recorder.fatal is not None


@contextlib.contextmanager
def _interrupt_handler(control: Any, echo: Callable[[str], None]) -> Iterator[None]:
    """First Ctrl-C: pause every trial at a checkpoint and end; second: quit at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigint(signum: int, frame: Any) -> None:
        if control.interrupted:
            raise KeyboardInterrupt
        control.interrupted = True
        echo("interrupted: pausing every trial at a checkpoint (Ctrl-C again quits at once)")

    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
