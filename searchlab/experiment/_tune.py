"""Building and running the ``ray.tune.Tuner`` of an experiment."""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from searchlab._bytecode import uncached_bytecode_hint
from searchlab._ray_env import connect_ray, ray_environment
from searchlab.config import ExperimentConfig
from searchlab.errors import ConfigError
from searchlab.experiment._compat import TUNE_ACTOR_ENV_DEFAULTS
from searchlab.experiment._ship import pack_model_dir
from searchlab.experiment._spec import ExperimentSpec

__all__ = ["RunOutcome", "run_tuner"]


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    fatal: Any  # a TrialReport: a user error every trial would hit stopped the experiment
    interrupted: bool  # Ctrl-C (or a full disk) paused the trials; `searchlab resume` goes on
    write_error: str | None = None  # a write that failed (a full disk) paused the run


def run_tuner(
    cfg: ExperimentConfig,
    spec: ExperimentSpec,
    exp_dir: pathlib.Path,
    *,
    address: str | None,
    echo: Callable[[str], None],
    ship: dict[str, Any],
    restore: bool = False,
    max_grid_trials: int | None = None,
    on_standby: Callable[[ExperimentSpec], None] | None = None,
) -> RunOutcome:
    """Run the experiment (or, with ``restore``, continue it) until it ends or is interrupted.

    With ``SEARCHLAB_STANDBY=auto`` (``spec.standby_auto``), standby is decided once Ray is
    up and ``on_standby`` gets the decided spec before any trial starts (to record it).
    """
    with ray_environment() as tune_messages:
        import ray

        from searchlab.experiment._resources import (
            auto_standby,
            standby_memory_note,
            trial_resources,
        )

        # The user's environment variables reach the workers through Ray's runtime
        # environment, which Ray gives none of the workers it started before the job;
        # without them, a Ray started here hands the first trials those workers.
        ship = {**ship, "env_vars": {**TUNE_ACTOR_ENV_DEFAULTS, **ship["env_vars"]}}
        connection = connect_ray(
            address, runtime_env=ship, prestart=not cfg.environment.environment_variables
        )
        started = connection.started
        reaper = _start_reaper() if started and not address else None
        try:
            if started and not address and (hint := uncached_bytecode_hint()):
                echo(f"note: {hint}")
            if not connection.working_dir:  # no job working_dir carries the model directory
                spec = dataclasses.replace(
                    spec, model_archive=ray.put(pack_model_dir(spec.model_dir))
                )
            nodes = ray.nodes()
            if spec.standby_auto:  # run() passes it undecided
                ready, note = auto_standby(cfg, nodes)
                spec = spec.with_standby(ready)
                if on_standby is not None:
                    on_standby(spec)  # a resume runs as these trials start: recorded first
                echo(f"note: {note}")
            resources = trial_resources(cfg, nodes, standby=spec.standby, resumed=restore)
            memory = standby_memory_note(nodes, spec.standby, resumed=restore)
            if not spec.standby_auto and memory:
                echo(f"note: {memory}")  # an explicit or resumed count runs as set
            parts = _build_parts(cfg, spec, exp_dir, echo, resources, restore, max_grid_trials)
            parts.control.worker_environ = connection.worker_environ
            with ray_environment({"TUNE_MAX_PENDING_TRIALS_PG": str(parts.fit)}):
                tuner = (
                    _restored_tuner(exp_dir, parts) if restore else _new_tuner(cfg, exp_dir, parts)
                )
                verb = "continues" if restore else "starts"
                echo(
                    f"experiment {spec.name} {verb}: {cfg.searcher.name.value} search, "
                    f"results in {exp_dir}"
                )
                with _interrupt_handler(parts.control, echo):
                    try:
                        tuner.fit()
                    except Exception as exc:
                        _raise_restore_failure(
                            parts.control, tune_messages.restore_failure, exp_dir
                        )
                        if parts.control.interrupted and _in_result_grid(exc):
                            # Tune ended and saved its state; only its ResultGrid (searchlab
                            # reads its own records) failed: a trial created just before
                            # Ctrl-C never got a directory. The run is paused, as asked.
                            pass
                        elif parts.recorder.write_error is None:
                            raise
                        # A full disk: Tune saved its state, then failed reading back the
                        # files it could not write; the run is paused, which is reported.
            _raise_restore_failure(parts.control, tune_messages.restore_failure, exp_dir)
            parts.recorder.print_table()
            return RunOutcome(
                fatal=parts.recorder.fatal,
                interrupted=parts.control.interrupted,
                write_error=parts.recorder.write_error,
            )
        finally:
            if started:
                ray.shutdown()
            if reaper is not None:
                _stop_reaper(reaper)
            if spec.standby_key is not None:
                from searchlab.experiment._standby import remove_baton_dir

                remove_baton_dir(spec.standby_key)


@dataclasses.dataclass(frozen=True)
class _TunerParts:
    searcher: Any
    scheduler: Any
    recorder: Any
    result_log: Any
    control: Any
    trainable: Any
    fit: int  # trials that fit in the cluster at once


def _build_parts(
    cfg: ExperimentConfig,
    spec: ExperimentSpec,
    exp_dir: pathlib.Path,
    echo: Callable[[str], None],
    resources: dict[str, float],
    restore: bool,
    max_grid_trials: int | None,
) -> _TunerParts:
    import ray

    from searchers import build_search_method
    from searchers._driver import SearchDriver
    from searchlab.experiment._adapters import GatedSearcher, RunControl, SearchScheduler
    from searchlab.experiment._loggers import ResultLog
    from searchlab.experiment._recorder import TrialRecorder
    from searchlab.experiment._snapshot import Snapshots

    method = build_search_method(cfg, max_grid_trials=max_grid_trials)
    driver = SearchDriver(method, smaller_is_better=spec.smaller_is_better)
    # Tune lets a custom searcher have one trial pending at a time, so an adaptive search
    # would start trials one by one and a fresh worker loses the race to a cached one:
    # allow as many pending trials as fit in the cluster at once.
    fit = _trials_that_fit(cfg, resources, ray.cluster_resources())
    standby_actors = fit if spec.standby_key is not None and resources["gpu"] > 0 else 0
    control = RunControl(restored=restore, concurrency=fit, standby_actors=standby_actors)
    snapshots = Snapshots(exp_dir, cfg.to_dict())
    searcher = GatedSearcher(driver, spec.metric, spec.smaller_is_better, control, snapshots)
    scheduler = SearchScheduler(
        searcher, spec.smaller_is_better, checkpoint_length=_checkpoint_length
    )
    recorder = TrialRecorder(
        spec,
        exp_dir,
        echo,
        rung_table=getattr(method, "rung_table", None),
        control=control,
        snapshots=snapshots,
        restored=restore,
    )
    result_log = ResultLog(exp_dir, recorder.write_failed)
    return _TunerParts(
        searcher, scheduler, recorder, result_log, control, _trainable(spec, resources), fit
    )


def _trainable(spec: ExperimentSpec, resources: dict[str, float]) -> Any:
    """One process per trial, or a placement group of workers for data-parallel trials."""
    from ray import tune

    from searchlab.config import is_command
    from searchlab.experiment._data_parallel import DataParallelTrainable, placement_group_factory
    from searchlab.experiment._trainable import SearchlabTrainable

    if is_command(spec.entrypoint):  # a script: its launcher starts one process per slot
        from searchlab.experiment._script_trainable import ScriptTrainable

        slots = spec.slots_per_trial
        script_resources = {"cpu": resources["cpu"] * slots, "gpu": resources["gpu"] * slots}
        return tune.with_resources(
            tune.with_parameters(ScriptTrainable, experiment=spec), script_resources
        )
    if spec.slots_per_trial > 1:
        pgf = placement_group_factory(spec.slots_per_trial, resources["cpu"], resources["gpu"])
        return tune.with_resources(
            tune.with_parameters(DataParallelTrainable, experiment=spec), pgf
        )
    return tune.with_resources(tune.with_parameters(SearchlabTrainable, experiment=spec), resources)


def _trial_dirname(trial: Any) -> str:
    return str(trial.trial_id)


def _checkpoint_length(trial: Any) -> int | None:
    """The longest rung length the trial's latest checkpoint completed (None: unknown)."""
    from searchlab.experiment._trainable import checkpoint_rung_length

    checkpoint = trial.checkpoint
    path = getattr(checkpoint, "path", None)
    return checkpoint_rung_length(path) if path else None


def _trials_that_fit(
    cfg: ExperimentConfig, resources: dict[str, float], cluster: dict[str, Any]
) -> int:
    workers = cfg.resources.slots_per_trial
    needs = {"CPU": resources["cpu"] * workers, "GPU": resources["gpu"] * workers}
    # A small margin: 1.0 // 0.2 is 4.0 in floating point, one trial short.
    fit = min(int(float(cluster.get(k, 0)) / v + 1e-9) for k, v in needs.items() if v > 0)
    concurrency = getattr(cfg.searcher, "max_concurrent_trials", 0) or fit
    return max(1, min(fit, concurrency))


def _in_result_grid(exc: BaseException) -> bool:
    """Was ``exc`` raised while Tune built the ``ResultGrid`` at the end of ``fit``?"""
    frames = traceback.extract_tb(exc.__traceback__)
    return any(pathlib.PurePath(f.filename).name == "result_grid.py" for f in frames)


def _new_tuner(cfg: ExperimentConfig, exp_dir: pathlib.Path, parts: _TunerParts) -> Any:
    from ray import tune

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
            callbacks=[parts.recorder, parts.result_log],
            failure_config=tune.FailureConfig(max_failures=cfg.max_restarts),
            log_to_file=True,
        ),
    )


def _restored_tuner(exp_dir: pathlib.Path, parts: _TunerParts) -> Any:
    """Tune's saved experiment (trials, their checkpoints, the searcher's state) with this
    driver's live objects: Tune restores the searcher's state into ``parts.searcher``."""
    from ray import tune

    from searchlab.experiment._compat import replace_restored_parts

    tuner = tune.Tuner.restore(
        str(exp_dir), trainable=parts.trainable, resume_unfinished=True, resume_errored=True
    )  # errored trials come back too: the search driver stops those that ended for good
    replace_restored_parts(
        tuner,
        search_alg=parts.searcher,
        scheduler=parts.scheduler,
        callbacks=[parts.recorder, parts.result_log],
    )
    return tuner


def _raise_restore_failure(control: Any, logged: str | None, exp_dir: pathlib.Path) -> None:
    """Tune logs a failed restore and starts the search over; searchlab refuses instead."""
    if not control.restore_failed:
        return
    reason = control.restore_error or logged or "the saved search state was not found"
    raise ConfigError(
        f"{exp_dir}: cannot resume: Ray Tune could not restore the experiment ({reason}); "
        f"nothing was changed. `searchlab resume {exp_dir} --force-restart` starts the search "
        "over in a new directory"
    )


def _start_reaper() -> subprocess.Popen[bytes] | None:
    """A watcher that ends this driver's Ray processes if the driver dies (``_reaper.py``)."""
    import os

    script = pathlib.Path(__file__).with_name("_reaper.py")
    try:
        return subprocess.Popen(
            [sys.executable, str(script), str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C in the terminal is the driver's to handle
        )
    except OSError:
        return None  # the run goes on; only the clean-up after a kill -9 is lost


def _stop_reaper(reaper: subprocess.Popen[bytes]) -> None:
    from searchlab.experiment._reaper import CLEAN_EXIT

    try:
        assert reaper.stdin is not None
        reaper.stdin.write(CLEAN_EXIT)
        reaper.stdin.close()
        reaper.wait(timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        reaper.kill()


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

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
