"""Canaries: each Ray Tune or torch internal searchlab relies on, checked against the installed one.

A failure here means an upgrade changed something ``searchlab/experiment/_compat.py`` uses;
the message says what, so the fix is made there before any experiment breaks.
"""

from __future__ import annotations

import inspect
import logging
import os
import pathlib
import re
import signal
import subprocess
import time
import types
from typing import Any

import pytest
import ray
from ray import tune
from ray.tune.execution.tune_controller import TuneController
from ray.tune.experiment import Trial

from searchlab.experiment import _compat

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_supported_ray_range_is_the_installed_one() -> None:
    pinned = re.search(r'"ray\[tune\]>=([\d.]+),<([\d.]+)"', (ROOT / "pyproject.toml").read_text())
    assert pinned, "pyproject.toml must pin ray[tune] to a tested range"
    low, high = (tuple(int(x) for x in v.split(".")) for v in pinned.groups())
    installed = tuple(int(x) for x in ray.__version__.split(".")[:2])
    assert low[:2] <= installed < high[:2], (
        f"Ray {ray.__version__} is outside the tested range {pinned.group(0)}: run these "
        "canaries on it and widen the pin in pyproject.toml"
    )


def test_tune_controller_can_set_a_trial_status() -> None:
    assert hasattr(TuneController, "_set_trial_status"), (
        "TuneController._set_trial_status is gone: searchlab re-pauses restored trials with it "
        "(_compat.set_trial_paused)"
    )
    params = list(inspect.signature(TuneController._set_trial_status).parameters)
    assert params[:3] == ["self", "trial", "status"], params


def test_tune_ends_a_run_resumably_on_sigusr1() -> None:
    import ray.tune.tune as tune_module

    source = inspect.getsource(tune_module._setup_signal_catching)
    assert "SIGUSR1" in source and "experiment_interrupted_event.set()" in source, (
        "Tune no longer ends a run on SIGUSR1: _compat.end_run_resumably must change"
    )


def test_a_restored_tuner_exposes_its_config_objects() -> None:
    from ray.tune.impl.tuner_internal import TunerInternal

    source = inspect.getsource(TunerInternal)
    for name in ("_tune_config", "_run_config"):
        assert f"self.{name}" in source, (
            f"TunerInternal.{name} is gone (_compat.replace_restored_parts)"
        )
    assert "_local_tuner" in inspect.getsource(tune.Tuner), "Tuner._local_tuner is gone"
    config, run = tune.TuneConfig(), tune.RunConfig()
    for obj, attrs in (
        (config, ("search_alg", "scheduler")),
        (run, ("callbacks", "stop", "verbose")),
    ):
        for attr in attrs:
            assert hasattr(obj, attr), f"{type(obj).__name__}.{attr} is gone"


def test_trainable_restore_takes_the_checkpoint_tune_names(tmp_path: pathlib.Path) -> None:
    from ray.train._internal.session import _TrainingResult

    checkpoint = tune.Checkpoint.from_directory(str(tmp_path))
    arg = _TrainingResult(checkpoint=checkpoint, metrics={"training_iteration": 3})
    assert _compat.checkpoint_path_of(arg) == str(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    moved = _compat.with_checkpoint_path(arg, str(other))
    assert type(moved) is _TrainingResult and moved.metrics == {"training_iteration": 3}
    assert _compat.checkpoint_path_of(moved) == str(other)
    assert "checkpoint_path" in inspect.signature(tune.Trainable.restore).parameters


def test_tune_state_file_names_are_the_ones_searchlab_snapshots() -> None:
    assert TuneController.CKPT_FILE_TMPL == _compat.TUNE_STATE_PATTERNS["experiment_state"]
    from ray.tune.search import Searcher, SearchGenerator

    assert SearchGenerator.CKPT_FILE_TMPL == _compat.TUNE_STATE_PATTERNS["search_gen_state"]
    assert Searcher.CKPT_FILE_TMPL == _compat.TUNE_STATE_PATTERNS["searcher_state"]
    assert (
        _compat.tune_session_of(
            pathlib.Path("experiment_state-2026-01-02_03-04-05.json"), "experiment_state"
        )
        == "2026-01-02_03-04-05"
    )


def test_tune_saves_the_searcher_before_asking_callbacks_for_their_state() -> None:
    # searchlab snapshots Tune's files when Tune asks the callbacks for their state, which
    # must come after the experiment state and the searcher state are written.
    source = inspect.getsource(TuneController.save_to_dir)
    exp, search, callbacks = (
        source.index(s)
        for s in ("json.dump(runner_state", "_search_alg.save_to_dir", "_callbacks.save_to_dir")
    )
    assert exp < search < callbacks, "Tune's save order changed (searchlab._snapshot)"


def test_tune_statuses_are_the_ones_the_adapters_map() -> None:
    assert {Trial.PENDING, Trial.RUNNING, Trial.PAUSED, Trial.TERMINATED, Trial.ERROR} == {
        "PENDING",
        "RUNNING",
        "PAUSED",
        "TERMINATED",
        "ERROR",
    }
    assert hasattr(Trial, "checkpoint") and hasattr(Trial, "error_file")


def test_torch_can_free_cublas_workspaces() -> None:
    import torch

    assert hasattr(torch._C, "_cuda_clearCublasWorkspaces"), (
        "torch._C._cuda_clearCublasWorkspaces is gone: idle trials keep cuBLAS workspaces "
        "(_compat.clear_cublas_workspaces)"
    )
    _compat.clear_cublas_workspaces()  # a no-op without CUDA, never an error


def test_torch_can_empty_its_pinned_host_cache() -> None:
    """Idle trials give back the pinned blocks their checkpoint host copies left cached."""
    assert _compat.empty_host_cache(), (
        "torch offers neither torch.accelerator.empty_host_cache nor torch._C._host_emptyCache: "
        "idle trials keep their pinned host blocks (_compat.empty_host_cache)"
    )  # a no-op without CUDA, never an error


def test_only_the_compat_module_reaches_into_ray_or_torch_privates() -> None:
    found = subprocess.run(
        [
            "git",
            "grep",
            "-n",
            "-E",
            r"(tune_controller|_local_tuner|torch\._C\b|_set_trial_status|\._tune_config|"
            r"\._run_config|_TrainingResult|SIGUSR1)",
            "--",
            "searchlab",
            "searchers",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    outside = [line for line in found if not line.startswith("searchlab/experiment/_compat.py")]
    # Parameter names that merely say "tune_controller" (Tune's hook signatures) are fine.
    outside = [x for x in outside if not re.search(r"tune_controller(: Any|\)|\.|,)", x)]
    assert outside == [], "Ray/torch internals used outside _compat.py:\n" + "\n".join(outside)


def test_end_run_resumably_sends_tunes_stop_signal(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append((pid, sig)))
    _compat.end_run_resumably()
    assert sent == [(os.getpid(), signal.SIGUSR1)]


def test_the_tune_messages_searchlab_rewords_still_exist() -> None:
    import ray as ray_package

    root = pathlib.Path(ray_package.__file__).parent
    sources = "".join(
        (root / rel).read_text()
        for rel in (
            "tune/tune.py",
            "tune/execution/tune_controller.py",
            "tune/analysis/experiment_analysis.py",
            "_private/worker.py",
        )
    )
    for message in _compat.TUNE_MESSAGES_REPORTED_BY_SEARCHLAB:
        assert message in sources, f"Tune no longer logs {message!r} (_compat, _ray_env)"
    import importlib

    for name in _compat.TUNE_LOGGERS:
        importlib.import_module(name)


def test_tune_flattens_results_with_the_delimiter_searchlab_reads() -> None:
    from ray.tune.utils import flatten_dict

    from searchlab.experiment._protocol import TrialReport

    result = TrialReport(length=40, rung=0, timing={"build_s": 1.5}).attach({"loss": 0.1})
    flat = flatten_dict(result)
    assert f"searchlab{_compat.TUNE_FLAT_DELIMITER}length" in flat
    assert TrialReport.of(flat) == TrialReport.of(result)
    assert TrialReport.of(flat).timing == {"build_s": 1.5}


def test_tune_keeps_as_many_idle_actors_as_standby_asks() -> None:
    from ray.tune.utils.object_cache import _ObjectCache

    from searchlab.experiment._compat import keep_idle_actors

    def idle_kept(extra: int) -> list[str]:
        controller = types.SimpleNamespace(_actor_cache=_ObjectCache(may_keep_one=True))
        wrapped = types.SimpleNamespace(_tune_controller=controller)  # what schedulers get
        if extra:
            assert keep_idle_actors(wrapped, "1 GPU/2", extra)
        cache = controller._actor_cache
        # Two paused trials' actors, no trial waiting for one: an actor not cached is stopped.
        cached = {actor for actor in ("a", "b") if cache.cache_object("1 GPU/2", actor)}
        evicted = list(cache.flush_cached_objects())  # what Tune does after each step
        return sorted(cached - set(evicted))

    # The controller keeps its actors in such a cache, under ``_actor_cache``.
    assert "self._actor_cache = _ObjectCache(" in inspect.getsource(TuneController.__init__)
    assert len(idle_kept(0)) == 1  # Tune's own rule: one idle actor, the other is stopped
    assert idle_kept(2) == ["a", "b"]
    assert not keep_idle_actors(types.SimpleNamespace(), "1 GPU/2", 2)  # no such cache


def test_a_trial_keeps_the_actor_that_is_starting_for_it() -> None:
    from searchlab.experiment._compat import keep_starting_actors

    class Controller:  # Tune's rule: the cached actor, and the new one removed
        def __init__(self) -> None:
            self.reused: list[str] = []
            launched = {"starting": 1, "up": 2}  # actors whose processes Ray launched
            self._actor_manager = types.SimpleNamespace(
                _live_actors_to_ray_actors_resources=launched
            )
            self._trial_to_actor = {"a": "starting", "b": "waits-for-resources", "c": "up"}
            self._started_actors = {"up"}

        def _maybe_reuse_cached_actor(self, trial: str) -> bool:
            self.reused.append(trial)
            return True

    controller = Controller()
    wrapped = types.SimpleNamespace(_tune_controller=controller)  # what schedulers get
    assert keep_starting_actors(wrapped) and keep_starting_actors(wrapped)
    assert type(controller).__mro__[1] is Controller  # made once, not stacked
    assert controller._maybe_reuse_cached_actor("a") is False  # its process is starting
    # Tune's own rule for the rest: an actor still waiting for resources (the cached one
    # may hold them), one already up, a trial without an actor.
    assert [controller._maybe_reuse_cached_actor(t) for t in ("b", "c", "new")] == [True] * 3
    assert controller.reused == ["b", "c", "new"]
    # The manager's dict is read at each call: Ray's cleanup() replaces it.
    controller._actor_manager._live_actors_to_ray_actors_resources = {}
    assert controller._maybe_reuse_cached_actor("a") is True
    assert not keep_starting_actors(types.SimpleNamespace())  # another Ray: nothing changed


def test_keeping_starting_actors_leaves_tunes_saved_state_alone() -> None:
    # Tune saves its controller's instance attributes with the experiment (``__getstate__``);
    # a function put there was pickled with the controller it closed over, and the restore
    # failed. The rule lives in the class instead.
    from searchlab.experiment._compat import keep_starting_actors

    controller = TuneController.__new__(TuneController)
    state = {
        "_actor_manager": types.SimpleNamespace(_live_actors_to_ray_actors_resources={}),
        "_trial_to_actor": {},
        "_started_actors": set(),
    }
    controller.__dict__.update(state)
    assert keep_starting_actors(controller)
    assert isinstance(controller, TuneController) and type(controller) is not TuneController
    assert controller.__dict__.keys() == state.keys()
    assert "self.__dict__.copy()" in inspect.getsource(TuneController.__getstate__)
    # What it reads is Tune's: the method that removes a scheduled actor for a cached one,
    # the actors whose start resolved, and the actor manager's launched actors.
    source = inspect.getsource(TuneController._maybe_reuse_cached_actor)
    assert "self._remove_actor(tracked_actor=original_actor)" in source
    assert "self._started_actors.add(tracked_actor)" in inspect.getsource(
        TuneController._actor_started
    )
    for name in ("_trial_to_actor", "_started_actors", "_actor_manager"):
        assert f"self.{name}" in inspect.getsource(TuneController.__init__), name
    from ray.air.execution._internal.actor_manager import RayActorManager

    launches = inspect.getsource(RayActorManager._try_start_actors)
    assert "self._live_actors_to_ray_actors_resources[tracked_actor] = (" in launches


def test_searchlab_knows_the_environment_tune_gives_every_trial_actor() -> None:
    from ray.tune.execution import class_cache

    assert class_cache.DEFAULT_ENV_VARS == _compat.TUNE_ACTOR_ENV_DEFAULTS


class _Trainable(tune.Trainable):
    def step(self) -> dict[str, float]:
        return {"x": 1.0}


def test_trial_actors_may_start_in_idle_workers_only_with_the_same_environment() -> None:
    from ray.tune.execution.class_cache import _ActorClassCache

    def registered(environ: dict[str, str]) -> tuple[bool, object]:
        controller = types.SimpleNamespace(_class_cache=_ActorClassCache())
        wrapped = types.SimpleNamespace(_tune_controller=controller)  # what schedulers get
        changed = _compat.start_in_idle_workers(wrapped, _Trainable, environ)
        actor_cls = controller._class_cache.get(_Trainable)  # what Tune starts the actor with
        return changed, actor_cls._default_options.get("runtime_env")

    # The controller registers each trainable's actor class in such a cache.
    assert "self._class_cache = _ActorClassCache()" in inspect.getsource(TuneController.__init__)
    # Tune's own registration carries the variables in a runtime environment ...
    tunes = _ActorClassCache().get(_Trainable)._default_options["runtime_env"]
    assert tunes["env_vars"]["PL_DISABLE_FORK"] == "1"
    # ... dropped where the workers inherited every one of them, with the same values,
    assert registered({**os.environ, **tunes["env_vars"]}) == (True, None)
    # and kept where one differs or is missing.
    assert registered({**os.environ, **tunes["env_vars"], "PL_DISABLE_FORK": "0"}) == (
        False,
        tunes,
    )
    assert registered({}) == (False, tunes)
    assert not _compat.start_in_idle_workers(types.SimpleNamespace(), _Trainable, {})


def test_tunes_slow_operation_warnings_are_dropped_during_a_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ray.tune.utils import util

    from searchlab._ray_env import ray_environment

    monkeypatch.setattr(util, "START_OF_TIME", 0.0)  # Tune warns only after its first minute
    logger = logging.getLogger(util.__name__)
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.WARNING)

    def slow(name: str) -> None:
        with util.warn_if_slow(name, threshold=0.01):
            time.sleep(0.03)

    try:
        slow("before")
        with ray_environment():
            slow("process_trial_result")
        slow("after")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert [m.split("`")[1] for m in seen] == ["before", "after"]
    assert all(_compat.TUNE_SLOW_OPERATION in m for m in seen)


def test_a_resumed_search_creates_its_new_trials_where_it_is_resumed(
    tmp_path: pathlib.Path,
) -> None:
    """Tune saves the search generator's Experiment with the directory the search first ran
    in; resumed elsewhere (a copy, a moved directory), new trials must land there."""
    import pickle

    import cloudpickle
    from ray.tune.experiment import Experiment
    from ray.tune.search import ConcurrencyLimiter, Searcher, SearchGenerator

    class Counting(Searcher):
        def __init__(self) -> None:
            super().__init__(metric="loss", mode="min")
            self.count = 0

        def suggest(self, trial_id: str) -> dict[str, Any]:
            self.count += 1
            return {"x": self.count}

        def on_trial_complete(self, trial_id: str, result: Any = None, error: bool = False):
            pass

    def trainable(config: dict[str, Any]) -> None:
        pass

    first = SearchGenerator(Counting())
    first.add_configurations(
        [Experiment("exp", run=trainable, num_samples=5, storage_path=str(tmp_path / "first"))]
    )
    assert first.next_trial().storage.experiment_fs_path == str(tmp_path / "first" / "exp")
    saved = pickle.loads(cloudpickle.dumps(first.get_state()))  # as Tune's saved file holds it

    moved = tmp_path / "moved"
    resumed = _compat._resumed_search(Counting(), 3, str(moved), "exp", None)
    assert isinstance(resumed, SearchGenerator)
    assert isinstance(resumed.searcher, ConcurrencyLimiter)
    assert resumed.searcher.max_concurrent == 3
    resumed.set_state(saved)
    trial = resumed.next_trial()
    assert trial.storage.experiment_fs_path == str(moved / "exp")
    assert trial.storage.storage_fs_path == str(moved)
    assert not isinstance(
        _compat._resumed_search(Counting(), None, "/x", "e", None).searcher, ConcurrencyLimiter
    )


def test_only_this_sessions_files_stay_in_tunes_staging_folder(tmp_path: pathlib.Path) -> None:
    names = [
        "experiment_state-s1.json",
        "search_gen_state-s1.json",
        "searcher-state-s1.pkl",
        "searchlab_state.json",
        "trials.json",
        "experiment.json",
        "tuner.pkl",
        "experiment_state-s2.json",
    ]
    for name in names:
        (tmp_path / name).write_text("x")
    (tmp_path / "a1b2c3d4").mkdir()  # a trial's staging folder
    (tmp_path / "a1b2c3d4" / "trials.json").write_text("x")
    # Tune's searcher writes a temporary file first, named after the final one.
    _compat.keep_only_this_session_staged(tmp_path / ".9f1e-tmp-searcher-state-s2.pkl")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a1b2c3d4", "experiment_state-s2.json"]
    assert (tmp_path / "a1b2c3d4" / "trials.json").is_file()
    _compat.keep_only_this_session_staged(tmp_path / "something-else.pkl")  # no session: as is
    assert (tmp_path / "experiment_state-s2.json").is_file()
