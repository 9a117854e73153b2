"""Building and running the ``ray.tune.Tuner`` of an experiment."""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable
from typing import Any

from searchlab._ray_env import connect_ray, quiet_ray_environment
from searchlab.config import ExperimentConfig
from searchlab.experiment._ship import pack_model_dir
from searchlab.experiment._spec import ExperimentSpec

__all__ = ["run_tuner"]


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
) -> str | None:
    """Run the experiment to its end; returns a fatal trial-definition error, if one stopped it."""
    quiet_ray_environment()
    import ray
    from ray import tune

    from searchers import build_search_method
    from searchlab.experiment._adapters import GatedSearcher, SearchScheduler
    from searchlab.experiment._loggers import result_loggers
    from searchlab.experiment._recorder import TrialRecorder
    from searchlab.experiment._resources import trial_resources

    method = build_search_method(cfg)
    started = connect_ray(address, runtime_env=ship)
    if not started:  # Ray was up already: the job's working_dir cannot carry the model dir
        spec = dataclasses.replace(spec, model_archive=ray.put(pack_model_dir(spec.model_dir)))
    try:
        resources = trial_resources(cfg, ray.cluster_resources())
        searcher = GatedSearcher(method, spec.metric, spec.smaller_is_better)
        scheduler = SearchScheduler(searcher, spec.smaller_is_better)
        recorder = TrialRecorder(
            spec, exp_dir, echo, rung_table=getattr(method, "rung_table", None)
        )
        trainable = _trainable(spec, resources)
        concurrency = getattr(cfg.searcher, "max_concurrent_trials", 0) or None
        adaptive = hasattr(method, "rung_table")
        tuner = tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(
                search_alg=searcher,
                scheduler=scheduler,
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
                callbacks=[recorder, *result_loggers()],
                failure_config=tune.FailureConfig(max_failures=cfg.max_restarts),
                stop=_fatal_stopper(recorder),
                log_to_file=True,
            ),
        )
        echo(f"experiment {spec.name}: {cfg.searcher.name.value} search, results in {exp_dir}")
        tuner.fit()
        recorder.print_table()
        return recorder.fatal
    finally:
        if started:
            ray.shutdown()


def _fatal_stopper(recorder: Any) -> Any:
    from ray.tune.stopper import Stopper

    class FatalStopper(Stopper):
        """Stops the whole experiment once a trial hit an error every trial would hit."""

        def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
            return False

        def stop_all(self) -> bool:
            return recorder.fatal is not None

    return FatalStopper()
