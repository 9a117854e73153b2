"""Running an experiment: config -> search method -> Ray Tune, with searchlab's own output."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from searchers import DEFAULT_MAX_GRID_TRIALS, build_search_method
from searchlab._failpoints import worker_env
from searchlab._lock import LOCK_FILE, experiment_lock
from searchlab._progress import default_echo
from searchlab.config import (
    ExperimentConfig,
    check_dir_name,
    experiment_dir_name,
    load_experiment_config,
)
from searchlab.errors import ConfigError, SearchlabError, TrialDefinitionError
from searchlab.experiment._ship import EXCLUDES
from searchlab.experiment._snapshot import atomic_write, config_digest, prepare_resume
from searchlab.experiment._spec import (
    MAX_STANDBY,
    STANDBY_AUTO,
    ExperimentSpec,
    check_environment,
    standby_switch,
)

__all__ = ["EXPERIMENT_FILE", "resume", "run"]

EXPERIMENT_FILE = "experiment.json"


def run(
    config: str | os.PathLike[str] | Mapping[str, Any],
    model_dir: str | os.PathLike[str] | None = None,
    storage_path: str | os.PathLike[str] | None = None,
    address: str | None = None,
    overrides: Sequence[str] | None = None,
    *,
    name: str | None = None,
    max_grid_trials: int | None = DEFAULT_MAX_GRID_TRIALS,
    echo: Callable[[str], None] | None = None,
) -> Any:
    """Run an experiment on Ray Tune and return its ``Results``.

    Args:
        config: a YAML path or a dict in Determined's experiment format.
        model_dir: the directory holding the entrypoint's module (default: the config's).
        storage_path: where the experiment directory goes (default ``./searchlab-results``).
        address: a Ray cluster to join (default: ``RAY_ADDRESS``, else Ray starts locally).
        overrides: ``key.path=value`` strings applied to the config.
        name: the experiment directory's name (default: the config's ``name``, made a safe
            directory name).
        max_grid_trials: the most trials a grid search may have (None: no limit); a bigger
            grid is refused before anything starts.
        echo: where progress lines go (default: print; in a Jupyter kernel, one display that
            is updated in place).

    Example:
        >>> results = searchlab.run("configs/grid.yaml", model_dir="examples/mnist")
        >>> results.best_trial()
    """
    echo = default_echo() if echo is None else echo
    cfg = load_experiment_config(
        dict(config) if isinstance(config, Mapping) else config,
        list(overrides or ()),
        model_dir=str(model_dir) if model_dir is not None else None,
    )
    _check_entrypoint(cfg)
    check_environment()  # a bad SEARCHLAB_* switch fails before anything is written
    build_search_method(cfg, max_grid_trials=max_grid_trials)  # a bad search fails here too
    dir_name = check_dir_name(name) if name is not None else experiment_dir_name(cfg.name)
    exp_dir = _experiment_dir(storage_path, dir_name, echo)
    spec = ExperimentSpec.from_config(cfg, exp_dir.name)
    from searchlab.experiment._tune import run_tuner

    with experiment_lock(exp_dir):
        _write_experiment_file(exp_dir, cfg, spec)
        try:
            outcome = run_tuner(
                cfg,
                spec,
                exp_dir,
                address=address,
                echo=echo,
                ship=_ship_env(cfg),
                max_grid_trials=max_grid_trials,
                on_standby=lambda decided: _write_experiment_file(exp_dir, cfg, decided),
            )
        except SearchlabError:
            _discard_if_unused(exp_dir)  # rejected before any trial: a rerun may reuse the name
            raise
    return _finish(cfg, exp_dir, outcome, echo)


def resume(
    experiment_dir: str | os.PathLike[str],
    address: str | None = None,
    *,
    force_restart: bool = False,
    echo: Callable[[str], None] | None = None,
) -> Any:
    """Continue an experiment whose driver died or was interrupted; returns its ``Results``.

    Finished trials stay finished; paused and running trials continue from their latest
    checkpoints; the searcher's rungs, promotions and random streams continue where they were.
    A state that cannot be trusted (damaged files, an edited config) is refused with a
    one-line error; ``force_restart=True`` then runs the experiment's config again in a new
    directory beside it, leaving this one as it is.

    Example:
        >>> results = searchlab.resume("searchlab-results/mnist_adaptive")
    """
    echo = default_echo() if echo is None else echo
    exp_dir = pathlib.Path(experiment_dir).resolve()
    meta = _read_experiment_file(exp_dir)
    cfg = load_experiment_config(meta["config"], model_dir=meta["model_dir"])
    if force_restart:
        echo(f"starting {exp_dir.name} over with the config in {exp_dir / EXPERIMENT_FILE}")
        return run(
            meta["config"],
            model_dir=meta["model_dir"],
            storage_path=exp_dir.parent,
            address=address,
            name=f"{exp_dir.name}-restart",
            max_grid_trials=None,
            echo=echo,
        )
    _check_entrypoint(cfg)
    check_environment()
    standby = resumed_standby(meta, echo, where=exp_dir / EXPERIMENT_FILE)
    spec = ExperimentSpec.from_config(cfg, exp_dir.name, standby=standby)
    from searchlab.experiment._tune import run_tuner

    with experiment_lock(exp_dir):
        for note in prepare_resume(exp_dir, cfg.to_dict()).notes:
            echo(note)
        outcome = run_tuner(
            cfg, spec, exp_dir, address=address, echo=echo, ship=_ship_env(cfg), restore=True
        )
    return _finish(cfg, exp_dir, outcome, echo)


def resumed_standby(
    meta: dict[str, Any], echo: Callable[[str], None], where: object = EXPERIMENT_FILE
) -> int:
    """How a resumed experiment runs standby (the trials each GPU holds ready, 0: off): as it
    started, whatever ``SEARCHLAB_STANDBY`` says now. Its trials keep the GPU share they
    asked for when they were created (Tune saves it with them), and half-GPU trials without
    the GPU lock would train two at a time on one GPU; the other way round, new trials would
    ask for half a GPU beside whole-GPU ones. Experiments from before the setting was recorded
    ran without; those from before its count was, with one trial ready (``true``)."""
    value = meta.get("standby", 0)
    if not isinstance(value, int) or not 0 <= value <= MAX_STANDBY:  # a bool is an int
        raise ConfigError(
            f"{where}: standby is {value!r}, not a count of trials ready per GPU (0 to "
            f"{MAX_STANDBY}); the file was changed by hand: set it to 0 or to the "
            "SEARCHLAB_STANDBY the experiment started with"
        )
    started = int(value)
    switch = standby_switch()
    if switch == STANDBY_AUTO:  # a new run says what auto decided; a resume, what it keeps
        kept = f"{started} trial(s) ready per GPU" if started else "standby off"
        echo(f"note: SEARCHLAB_STANDBY=auto: this experiment resumes as it started ({kept})")
    elif switch != started:
        echo(
            f"note: this experiment started with SEARCHLAB_STANDBY={started}; it resumes "
            f"so (its trials keep the GPU share they were given)"
        )
    return started


def _read_experiment_file(exp_dir: pathlib.Path) -> dict[str, Any]:
    """``experiment.json`` of a directory to resume, or a one-line error saying what is wrong."""
    meta_file = exp_dir / EXPERIMENT_FILE
    if not meta_file.is_file() or not (exp_dir / "tuner.pkl").is_file():
        raise ConfigError(
            f"{exp_dir}: not a searchlab experiment that can be resumed (no {EXPERIMENT_FILE} "
            "or Tune state); pass the directory `searchlab run` printed"
        )
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
        meta["config"], meta["model_dir"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        what = f"{exc.msg} at line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else exc
        raise ConfigError(
            f"{meta_file}: damaged ({what}); restore it from a backup (it holds the "
            "experiment's config), then resume"
        ) from None
    digest = meta.get("config_sha256")
    if digest is not None and digest != config_digest(meta["config"]):
        raise ConfigError(
            f"{meta_file}: config: was edited after the experiment started; undo the edit to "
            f"resume, or `searchlab resume {exp_dir} --force-restart` runs the edited config "
            "in a new directory"
        )
    return dict(meta)


def _finish(
    cfg: ExperimentConfig, exp_dir: pathlib.Path, outcome: Any, echo: Callable[[str], None]
) -> Any:
    from searchlab.results import load_results

    if outcome.fatal:
        raise TrialDefinitionError(_explain_fatal(cfg, outcome.fatal))
    results = load_results(exp_dir)
    echo(results.summary())
    if outcome.write_error:
        raise SearchlabError(
            f"{outcome.write_error}; every trial was paused at its checkpoint and nothing done "
            f"is lost: free space, then continue with: searchlab resume {exp_dir}"
        )
    if outcome.interrupted:
        echo(f"paused; continue with: searchlab resume {exp_dir}")
    return results


def _check_entrypoint(cfg: ExperimentConfig) -> None:
    from searchlab.config import command_problem, is_command
    from searchlab.pytorch import load_trial_class

    if is_command(cfg.entrypoint):  # a script: it runs in each trial's own process
        problem = command_problem(cfg.entrypoint, cfg.model_dir, cfg.resources.slots_per_trial)
        if problem:
            raise ConfigError(f"{cfg.source_name}: entrypoint: {problem}")
        return
    module = cfg.entrypoint.partition(":")[0].replace(".", "/")
    model_dir = pathlib.Path(cfg.model_dir)
    if not (model_dir / f"{module}.py").is_file() and not (model_dir / module).is_dir():
        raise ConfigError(
            f"{cfg.source_name}: entrypoint: {cfg.entrypoint!r}: no {module}.py in the model "
            f"directory {model_dir}; pass the directory holding it (searchlab run CONFIG MODEL_DIR)"
        )
    try:
        load_trial_class(cfg.entrypoint, str(model_dir))
    except TrialDefinitionError as exc:
        raise ConfigError(f"{cfg.source_name}: entrypoint: {exc}") from exc


def _experiment_dir(
    storage_path: str | os.PathLike[str] | None, name: str, echo: Callable[[str], None]
) -> pathlib.Path:
    root = pathlib.Path(storage_path or pathlib.Path.cwd() / "searchlab-results").resolve()
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".searchlab-write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            f"--storage-path {root}: cannot write there ({exc.strerror}); pick a writable directory"
        ) from exc
    path, n = root / name, 1
    while path.exists() and any(path.iterdir()):
        n += 1
        path = root / f"{name}-{n}"
    if n > 1:
        echo(f"{root / name} already holds an experiment; this one goes to {path}")
    return path


def _write_experiment_file(
    exp_dir: pathlib.Path, cfg: ExperimentConfig, spec: ExperimentSpec
) -> None:
    exp_dir.mkdir(parents=True, exist_ok=True)
    data = {
        "name": spec.name,
        "config": cfg.to_dict(),
        "config_file": cfg.source_name,
        "model_dir": spec.model_dir,
        "entrypoint": spec.entrypoint,
        "metric": spec.metric,
        "smaller_is_better": spec.smaller_is_better,
        "searcher": cfg.searcher.name.value
        if hasattr(cfg.searcher.name, "value")
        else str(cfg.searcher.name),
        "length_unit": spec.length_unit,
        "config_sha256": config_digest(cfg.to_dict()),
        "standby": spec.standby,
    }
    atomic_write(exp_dir / EXPERIMENT_FILE, json.dumps(data, indent=2, default=str))


def _discard_if_unused(exp_dir: pathlib.Path) -> None:
    """Remove an experiment directory that holds nothing but its experiment file and lock."""
    if exp_dir.is_dir() and {p.name for p in exp_dir.iterdir()} <= {EXPERIMENT_FILE, LOCK_FILE}:
        shutil.rmtree(exp_dir, ignore_errors=True)


def _ship_env(cfg: ExperimentConfig) -> dict[str, Any]:
    """The Ray runtime environment that ships the model directory to every worker."""
    env_vars = {
        "RAY_CHDIR_TO_TRIAL_DIR": "0",
        **worker_env(),
        **cfg.environment.environment_variables,
    }
    return {
        "working_dir": str(pathlib.Path(cfg.model_dir).resolve()),
        "excludes": EXCLUDES,
        "env_vars": env_vars,
    }


def _explain_fatal(cfg: ExperimentConfig, report: Any) -> str:
    """The fatal error's one line, led by the config field it is about when it names one."""
    if report.config_path:
        return f"{cfg.source_name}: {report.config_path}: {report.message}"
    return f"{cfg.entrypoint}: {report.message}"
