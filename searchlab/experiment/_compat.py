"""Every use of a Ray Tune or torch name that is not public API, in one place.

Each function here is covered by a canary test (``tests/experiment/test_compat.py``) that fails
with a clear message when the installed Ray or torch changes what it relies on, so an upgrade
breaks a test here instead of an experiment. Nothing else in searchlab may reach into Ray's or
torch's private names (``git grep`` for ``\\._[a-z]`` attribute access on Ray objects should
find only this module).

Supported Ray range: the one pinned in ``pyproject.toml`` (``ray[tune]>=2.60,<2.61``).
"""

from __future__ import annotations

import os
import pathlib
import signal
from collections.abc import Mapping
from typing import Any

__all__ = [
    "TUNE_ACTOR_ENV_DEFAULTS",
    "TUNE_FLAT_DELIMITER",
    "TUNE_LOGGERS",
    "TUNE_MESSAGES_REPORTED_BY_SEARCHLAB",
    "TUNE_RESTORE_FAILED",
    "TUNE_SLOW_OPERATION",
    "TUNE_STATE_PATTERNS",
    "checkpoint_path_of",
    "clear_cublas_workspaces",
    "empty_host_cache",
    "end_run_resumably",
    "keep_idle_actors",
    "keep_only_this_session_staged",
    "keep_prestarted_workers",
    "keep_starting_actors",
    "replace_restored_parts",
    "set_trial_paused",
    "start_in_idle_workers",
    "tune_session_of",
    "with_checkpoint_path",
]

# The environment variables Tune sets for every trainable's actor whatever the driver's
# environment (``ray.tune.execution.class_cache.DEFAULT_ENV_VARS``), known here without
# importing Ray Tune, which a run imports only once Ray is starting.
TUNE_ACTOR_ENV_DEFAULTS = {"PL_DISABLE_FORK": "1"}

# Tune flattens a result's nested dicts with this before schedulers and searchers see it.
TUNE_FLAT_DELIMITER = "/"

# The loggers Tune's messages come from (a logger's filters see only its own records), and
# the start of the messages searchlab reports itself, in its own words.
TUNE_LOGGERS = (
    "ray.tune.execution.tune_controller",
    "ray.tune.execution.experiment_state",
    "ray.tune.tune",
    "ray.tune.analysis.experiment_analysis",
    "ray.tune.result_grid",
    "ray._private.worker",
    "ray.tune.utils.util",
)
TUNE_MESSAGES_REPORTED_BY_SEARCHLAB = (
    "Trial task failed for trial",
    "Failed to restore the run state",
    "Stop signal received",
    "Trials did not complete",
    "Experiment has been interrupted",
    "Failed to fetch metrics for",
    "Unhandled error (suppress with",
)
TUNE_RESTORE_FAILED = "Failed to restore the run state"
# ``warn_if_slow``'s warnings about Tune's own operations on a busy driver ("The
# `process_trial_result` operation took 0.6 s, which may be a performance bottleneck."): one
# per slow call, naming Tune internals a searchlab user neither calls nor can change.
TUNE_SLOW_OPERATION = "which may be a performance bottleneck"

# The files Tune's experiment checkpoint writes into the driver's staging directory and syncs
# to the experiment directory, one set per driver session (``<session>`` is a timestamp).
TUNE_STATE_PATTERNS = {
    "experiment_state": "experiment_state-{}.json",
    "search_gen_state": "search_gen_state-{}.json",
    "searcher_state": "searcher-state-{}.pkl",
}


def tune_session_of(path: pathlib.Path, kind: str) -> str | None:
    """The session string in a Tune state file name (``experiment_state-<session>.json``)."""
    prefix, _, suffix = TUNE_STATE_PATTERNS[kind].partition("{}")
    name = path.name
    if name.startswith(prefix) and name.endswith(suffix) and len(name) > len(prefix + suffix):
        return name[len(prefix) : len(name) - len(suffix)]
    return None


def keep_only_this_session_staged(searcher_state_path: pathlib.Path) -> None:
    """Delete from Tune's driver staging folder (where Tune is saving ``searcher_state_path``)
    the top-level files that are not this session's saved state.

    On a restore Tune copies every ``.json`` and ``.pkl`` at the top of the experiment
    directory into that folder (searchlab's ``trials.json``, ``searchlab_state.json``,
    ``experiment.json``, ``tuner.pkl``, earlier sessions' state), and each save copies the
    whole folder back, writing over the files in place: a resumed run's snapshot and records
    went back to their pre-resume contents every second, and a kill during such a copy could
    tear them. The experiment directory keeps its own copies (Tune's copy deletes nothing).
    """
    # Tune's searcher writes a temporary file first: ``.<uuid>-tmp-searcher-state-<s>.pkl``.
    name = searcher_state_path.name
    start = name.rfind(TUNE_STATE_PATTERNS["searcher_state"].partition("{}")[0])
    session = tune_session_of(pathlib.Path(name[max(start, 0) :]), "searcher_state")
    if session is None:
        return
    for path in searcher_state_path.parent.iterdir():
        if session not in path.name and path.is_file() and not path.is_symlink():
            path.unlink(missing_ok=True)


def set_trial_paused(tune_controller: Any, trial: Any) -> None:
    """Mark a PENDING trial PAUSED without running it (Tune has no public call for this).

    Used after a restore (Tune brings every unfinished trial back as PENDING and would start
    them all) and on Ctrl-C (trials not yet started stay unstarted).
    """
    from ray.tune.experiment import Trial

    tune_controller._set_trial_status(trial, Trial.PAUSED)


def keep_idle_actors(tune_controller: Any, resources: Any, count: int) -> bool:
    """Let Tune keep up to ``count`` more idle trial actors asking for ``resources`` (a
    trial's placement group factory) in its actor cache. Tune keeps one idle actor beyond
    those its staged trials need and stops the rest; the next trial then starts a new actor
    (seconds of imports), which loses to whichever cached actor frees first. False where
    Tune has no such cache (another Ray version): nothing changed."""
    controller = getattr(tune_controller, "_tune_controller", tune_controller)
    cache = getattr(controller, "_actor_cache", None)
    if cache is None or not callable(getattr(cache, "increase_max", None)):
        return False
    cache.increase_max(resources, count)
    return True


def keep_starting_actors(tune_controller: Any) -> bool:
    """Let a trial keep the new actor Tune launched for it while that actor starts.

    Tune gives a trial waiting for its new actor a cached one as soon as one is free (a
    paused trial's), and removes the new actor, even where its process is already
    importing and building: that start is lost, and the next trial that finds no cached
    actor starts another process. With standby, trials pause after every rung and a new
    process takes seconds to start, so one of a GPU's three actors was started and removed
    again and again, never training (a CPU search of 16 trials: 8 processes built a trial
    and never trained one; in GPU calls 18B, 18C and 19A one of three sat out a whole
    search, likely so), and one still starting when a search ends can hold its end up (two
    of those searches ended 5-7 s after their last window). Here a trial whose actor's
    process has been launched keeps it, and the cached actor stays free for another trial
    while Tune's cache keeps it. One whose actor still waits for resources takes the cached
    actor as before: the cached actor may hold the very resources it waits for.

    The controller's class becomes a subclass with that rule: an attribute of the instance
    would be saved with Tune's experiment state (its ``__getstate__`` keeps the instance's
    attributes) and break every resume. False where Tune lacks what this reads (another Ray
    version): nothing changed."""
    controller = getattr(tune_controller, "_tune_controller", tune_controller)
    manager = getattr(controller, "_actor_manager", None)
    if (
        not callable(getattr(controller, "_maybe_reuse_cached_actor", None))
        or not isinstance(getattr(manager, "_live_actors_to_ray_actors_resources", None), dict)
        or not isinstance(getattr(controller, "_trial_to_actor", None), dict)
        or not isinstance(getattr(controller, "_started_actors", None), set)
    ):
        return False
    if not isinstance(controller, _KeepingStartingActors):
        try:
            controller.__class__ = _keeping_starting_actors(type(controller))
        except TypeError:  # a class whose instances cannot change class (slots, C type)
            return False
    return True


class _KeepingStartingActors:
    """Marks a controller class made by ``_keeping_starting_actors``."""


_KEEPING: dict[type, type] = {}  # Tune's controller class -> the one made from it


def _keeping_starting_actors(base: type) -> type:
    """``base`` (Tune's controller class) with ``keep_starting_actors``'s rule, made once."""
    if base in _KEEPING:
        return _KEEPING[base]

    def _maybe_reuse_cached_actor(self: Any, trial: Any) -> bool:
        actor = self._trial_to_actor.get(trial)
        launched = self._actor_manager._live_actors_to_ray_actors_resources  # read each time
        if actor is not None and actor in launched and actor not in self._started_actors:
            return False  # its process is starting: it keeps it
        return bool(base._maybe_reuse_cached_actor(self, trial))  # type: ignore[attr-defined]

    made = type(
        base.__name__,
        (base, _KeepingStartingActors),
        {"_maybe_reuse_cached_actor": _maybe_reuse_cached_actor, "__module__": __name__},
    )
    return _KEEPING.setdefault(base, made)


def start_in_idle_workers(
    tune_controller: Any, trainable_cls: Any, worker_environ: Mapping[str, str]
) -> bool:
    """Let ``trainable_cls``'s actors start in the idle workers Ray started beforehand.

    Tune registers each trainable's actor class with a runtime environment of environment
    variables (its defaults and some of the driver's); Ray starts an actor with a runtime
    environment only in a worker started for that environment, never in one of its idle
    workers. Where every one of those variables has the same value in ``worker_environ``
    (the environment Ray's workers were started with), the class is registered without it.
    False, with nothing changed, where the values differ, the runtime environment holds
    anything else, or Tune has no such cache (another Ray version).
    """
    import ray

    controller = getattr(tune_controller, "_tune_controller", tune_controller)
    cache = getattr(controller, "_class_cache", None)
    registered = getattr(cache, "_cache", None)
    if cache is None or not isinstance(registered, dict):
        return False
    tunes = cache.get(trainable_cls)  # Tune's own registration, as it would make it
    runtime_env = dict(getattr(tunes, "_default_options", {}).get("runtime_env") or {})
    env_vars = runtime_env.pop("env_vars", None) or {}
    if runtime_env or any(worker_environ.get(k) != v for k, v in env_vars.items()):
        return False
    registered[trainable_cls] = ray.remote(trainable_cls)
    return True


def keep_prestarted_workers() -> dict[str, Any]:
    """``ray.init``'s ``_system_config`` for a Ray started here, so that it keeps the idle
    workers it starts (one per CPU) until trials take them.

    Ray's raylet kills idle workers beyond a soft limit that defaults to the CPUs still
    unreserved: as soon as Tune's placement groups reserve every CPU (a 2-core laptop running
    two trials), the workers it started are killed, and each trial waits for a new process.
    The limit set to the node's CPU count keeps them, and no more workers than before.
    Canary: ``tests/experiment/test_prestart.py`` (an unknown key stops Ray from starting).
    """
    from ray._private.utils import get_num_cpus

    return {"num_workers_soft_limit": max(1, int(get_num_cpus()))}


def end_run_resumably() -> None:
    """End ``Tuner.fit`` now, leaving every trial as it is in the saved experiment state.

    This is what Tune's own SIGUSR1 handler (installed by ``tune.run``) does; a Stopper would
    terminate the trials instead, and nothing public ends a run with trials kept PAUSED.
    """
    os.kill(os.getpid(), signal.SIGUSR1)


def replace_restored_parts(
    tuner: Any, *, search_alg: Any, scheduler: Any, callbacks: list[Any], stop: Any = None
) -> None:
    """Give a ``Tuner.restore``-d tuner this driver's live searcher, scheduler and callbacks.

    ``Tuner.restore`` unpickles the objects the experiment started with; Tune then restores
    the searcher's saved state into whatever searcher the tuner holds. Tune offers no public
    way to hand it new objects.
    """
    internal = tuner._local_tuner
    internal._tune_config.search_alg = _resumed_search(
        search_alg,
        internal._tune_config.max_concurrent_trials,
        internal._run_config.storage_path,
        internal._run_config.name,
        internal._run_config.storage_filesystem,
    )
    internal._tune_config.max_concurrent_trials = None  # applied above, as Tune would
    internal._tune_config.scheduler = scheduler
    internal._run_config.callbacks = callbacks
    internal._run_config.stop = stop
    internal._run_config.verbose = 0


def _resumed_search(
    searcher: Any,
    max_concurrent: int | None,
    storage_path: str,
    name: str,
    storage_filesystem: Any,
) -> Any:
    """Tune's search generator around ``searcher`` (behind a ``ConcurrencyLimiter`` for
    ``max_concurrent``, as ``tune.run`` would wrap it: the saved state's layout is the same),
    that creates new trials in the directory the experiment is resumed from.

    Tune restores the generator's ``Experiment`` pickled with the directory the search first
    ran in, and moves only the restored trials to the new one: the new trials of a copied or
    moved experiment would write their checkpoints into the original's directory.
    """
    from ray.train._internal.storage import get_fs_and_path
    from ray.tune.search import ConcurrencyLimiter, SearchGenerator

    class ResumedSearch(SearchGenerator):
        def set_state(self, state: dict[str, Any]) -> None:
            super().set_state(state)
            experiment: Any = self._experiment  # the restored one (Tune types it None)
            storage = experiment.storage  # also the spec's "storage": one object
            filesystem, fs_path = get_fs_and_path(storage_path, storage_filesystem)
            storage.storage_filesystem = filesystem
            storage.storage_fs_path = fs_path
            storage.experiment_dir_name = name

    if max_concurrent:
        searcher = ConcurrencyLimiter(searcher, max_concurrent=max_concurrent)
    return ResumedSearch(searcher)


def checkpoint_path_of(restore_arg: Any) -> str | None:
    """The local path of the checkpoint Tune asks ``Trainable.restore`` to load."""
    checkpoint = getattr(restore_arg, "checkpoint", restore_arg)
    path = getattr(checkpoint, "path", checkpoint)
    return str(path) if isinstance(path, str | os.PathLike) else None


def with_checkpoint_path(restore_arg: Any, path: str) -> Any:
    """``restore_arg`` (Tune's ``_TrainingResult`` or a Checkpoint) pointing at ``path``."""
    from ray import tune

    checkpoint = tune.Checkpoint.from_directory(path)
    if hasattr(restore_arg, "checkpoint") and hasattr(restore_arg, "metrics"):
        return type(restore_arg)(checkpoint=checkpoint, metrics=restore_arg.metrics)
    return checkpoint


def clear_cublas_workspaces() -> None:
    """Free cuBLAS workspaces, which ``torch.cuda.empty_cache`` keeps (torch private)."""
    import torch

    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if callable(clear):
        clear()


def empty_host_cache() -> bool:
    """Hand torch's cached, unused pinned host blocks back to the system; False where this
    torch offers no way to. ``torch.accelerator.empty_host_cache`` is recent (torch 2.11 lacks
    it); older releases have the private ``torch._C._host_emptyCache`` for CUDA."""
    import torch

    accelerator = getattr(torch, "accelerator", None)
    empty = getattr(accelerator, "empty_host_cache", None) or getattr(
        torch._C, "_host_emptyCache", None
    )
    if empty is None:
        return False
    empty()
    return True
