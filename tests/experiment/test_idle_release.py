"""A paused trial's actor gives the trial's memory back while it idles, and nothing changes.

``IdleRelease`` fires only when an actor stays idle after a checkpoint; ``TrialRunner.park``
keeps the trial's state in host memory and rebuilds the trial from it on the next call. The
search-level test forces a release after every checkpoint (``SEARCHLAB_RELEASE_IDLE_AFTER_S=0``)
of a trial that goes on training, and checks it trains exactly as without releases.
"""

from __future__ import annotations

import pathlib
import threading
import time
import types
from typing import Any

import pytest
import torch
from toy_experiment import TOY_MODEL_DIR, toy_config

import searchlab
from searchlab.config import load_experiment_config
from searchlab.errors import ConfigError
from searchlab.experiment import _idle
from searchlab.experiment._idle import ENV_VAR, IdleRelease, idle_after_s
from searchlab.experiment._protocol import TrialConfig
from searchlab.experiment._spec import ExperimentSpec
from searchlab.experiment._trial_runner import TrialRunner

# -- IdleRelease -----------------------------------------------------------------------------


def _counter() -> tuple[list[float], Any]:
    calls: list[float] = []
    return calls, lambda: calls.append(time.monotonic())


def test_release_runs_once_after_the_actor_idled_past_the_delay() -> None:
    calls, release = _counter()
    idle = IdleRelease(release, after_s=0.05)
    idle.arm()
    deadline = time.monotonic() + 30
    while not calls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(calls) == 1
    time.sleep(0.1)
    assert len(calls) == 1  # once per arm


class _Timer:
    """Stands in for ``threading.Timer`` in ``_idle``: it comes due when the test says, in a
    thread of its own (``due``), whether or not it was cancelled, as a real timer already due
    when cancelled does."""

    def __init__(
        self, interval: float, function: Any, args: Any = None, kwargs: Any = None
    ) -> None:
        self.due = threading.Thread(target=function, args=args or (), kwargs=kwargs)
        self.daemon = False
        self.started = self.cancelled = False

    def start(self) -> None:
        self.started = True

    def cancel(self) -> None:
        self.cancelled = True


def test_a_call_before_the_delay_cancels_the_release(monkeypatch: pytest.MonkeyPatch) -> None:
    timers: list[_Timer] = []

    def timer(*args: Any, **kwargs: Any) -> _Timer:
        timers.append(_Timer(*args, **kwargs))
        return timers[-1]

    # Only _idle's timers are stand-ins: its module sees a copy of threading with this Timer.
    fake = types.SimpleNamespace(**{**vars(threading), "Timer": timer})
    monkeypatch.setattr(_idle, "threading", fake)
    calls, release = _counter()
    idle = IdleRelease(release, after_s=0.2)
    idle.arm()
    (armed,) = timers
    assert armed.started and not armed.cancelled
    with idle.busy():
        assert armed.cancelled
        armed.due.start()  # the timer comes due while the call runs
    armed.due.join(30)
    assert not armed.due.is_alive()
    assert calls == []
    idle.arm()  # armed again and left idle: the same stand-in releases
    timers[1].due.start()
    timers[1].due.join(30)
    assert not timers[1].due.is_alive()
    assert len(calls) == 1


def test_a_release_in_progress_finishes_before_the_next_call_runs() -> None:
    order: list[str] = []
    started = threading.Event()

    def slow_release() -> None:
        started.set()
        time.sleep(0.2)
        order.append("released")

    idle = IdleRelease(slow_release, after_s=0.01)
    idle.arm()
    assert started.wait(30)
    with idle.busy():
        order.append("call")
    assert order == ["released", "call"]


def test_no_delay_releases_at_once_and_off_never() -> None:
    calls, release = _counter()
    IdleRelease(release, after_s=0).arm()
    assert len(calls) == 1
    IdleRelease(release, after_s=None).arm()
    time.sleep(0.05)
    assert len(calls) == 1


def test_the_delay_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert idle_after_s() == 1.0
    monkeypatch.setenv(ENV_VAR, "0.25")
    assert idle_after_s() == 0.25
    monkeypatch.setenv(ENV_VAR, "off")
    assert idle_after_s() is None
    monkeypatch.setenv(ENV_VAR, "soon")
    with pytest.raises(ConfigError, match=rf"{ENV_VAR}='soon' is not a number of seconds"):
        idle_after_s()


def test_a_bad_delay_is_a_one_line_error_with_exit_code_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    from toy_experiment import refused_run

    monkeypatch.setenv(ENV_VAR, "nan")
    assert refused_run(tmp_path, capsys) == [
        f"searchlab: error: environment variable {ENV_VAR}='nan' is not a number of seconds; "
        "set it to e.g. 1.0, or to 'off'"
    ]


# -- TrialRunner.park ------------------------------------------------------------------------


def _runner(tmp_path: pathlib.Path, name: str, **fields: Any) -> TrialRunner:
    hparams = {
        "global_batch_size": 16,
        "dropout": 0.3,
        "n_train": 64,
        "optimizer": {"lr": 0.1, "momentum": 0.9},
    }
    config = toy_config(
        "park", hyperparameters=hparams, searcher={"max_length": {"batches": 12}}, **fields
    )
    spec = ExperimentSpec.from_config(
        load_experiment_config(config, model_dir=str(TOY_MODEL_DIR)), "park"
    )
    trial_config = TrialConfig(hparams, rung_ends=[6, 12], trial_seed=7).to_tune()
    return TrialRunner(
        spec, trial_config, trial_id=name, logdir=str(tmp_path / name), model_dir=spec.model_dir
    )


def _train(runner: TrialRunner, park_every_report: bool) -> list[dict[str, Any]]:
    results = []
    while True:
        result = runner.step()
        results.append({k: v for k, v in result.items() if isinstance(v, float | int | str)})
        if result.get("done"):
            return results
        if park_every_report:
            runner.state()  # what a save does first
            runner.park()
            assert runner.loop is None and runner.parked


def test_a_parked_trial_trains_on_exactly_as_one_never_parked(tmp_path: pathlib.Path) -> None:
    whole = _runner(tmp_path, "whole")  # seeds the process RNG: build each, then train it
    expected = _train(whole, park_every_report=False)
    parked = _runner(tmp_path, "parked")
    got = _train(parked, park_every_report=True)
    assert len(expected) > 4
    assert got == expected  # losses (dropout draws from the RNG), validation, positions
    assert whole.loop is not None and parked.loop is not None
    for a, b in zip(
        whole.loop.context.models[0].state_dict().values(),
        parked.loop.context.models[0].state_dict().values(),
        strict=True,
    ):
        assert torch.equal(a, b)


def test_a_validation_run_after_a_release_keeps_its_periodic_checkpoint(
    tmp_path: pathlib.Path,
) -> None:
    periods = {
        "min_validation_period": {"batches": 4},
        "min_checkpoint_period": {"batches": 4},
        "checkpoint_policy": "none",
    }
    expected = _train(_runner(tmp_path, "whole", **periods), park_every_report=False)
    got = _train(_runner(tmp_path, "parked", **periods), park_every_report=True)
    validation_4 = [r for r in got if r["group"] == "validation" and r["batches"] == 4]
    assert validation_4 and validation_4[0].get("should_checkpoint") is True
    assert got == expected


def test_loading_a_checkpoint_into_a_parked_trial_replaces_the_kept_state(
    tmp_path: pathlib.Path,
) -> None:
    source = _runner(tmp_path, "source")
    source.step()
    saved = source.state()
    assert saved is not None
    state = saved[0]
    runner = _runner(tmp_path, "target")
    runner.step()
    runner.step()
    runner.park()
    runner.load(state, checkpoint_uuid="checkpoint_000000")
    assert not runner.parked and runner.loop is not None
    assert runner.loop.batches_trained == state["batches_trained"]


# -- in a search -----------------------------------------------------------------------------


def _search(tmp_path: pathlib.Path, name: str) -> tuple[searchlab.Results, list[str]]:
    """Two trials one at a time (seed 3 samples lr 0 first): the first cannot learn, so the
    second is promoted at its first rung end at once and goes on after its rung checkpoint."""
    hooks = tmp_path / f"{name}-hooks.log"
    config = toy_config(
        name,
        hyperparameters={
            "dropout": 0.3,
            "optimizer": {"lr": {"type": "categorical", "vals": [0.5, 0.0]}, "momentum": 0.9},
            "hook_log": str(hooks),
        },
        searcher={
            "name": "adaptive_asha",
            "max_trials": 2,
            "max_length": {"batches": 8},
            "divisor": 2,
            "max_rungs": 2,
            "mode": "aggressive",
            "max_concurrent_trials": 1,
        },
        scheduling_unit=2,
        checkpoint_policy="all",
        reproducibility={"experiment_seed": 3},
    )
    results = searchlab.run(
        config, model_dir=TOY_MODEL_DIR, storage_path=tmp_path / name, echo=lambda _: None
    )
    return results, hooks.read_text().splitlines()


def _by_trial(results: searchlab.Results) -> list[list[tuple[Any, ...]]]:
    """Each trial's reports in trial order, without the (random) trial ids."""
    columns = ["group", "batches", "loss", "validation_loss"]
    metrics = results.metrics.fillna(-1.0)
    return [
        [tuple(row) for row in metrics[metrics["trial_id"] == trial][columns].to_numpy()]
        for trial in results.trials.sort_values("optimizer.lr")["trial_id"]
    ]


@pytest.mark.ray
def test_a_trial_released_at_its_rung_and_promoted_at_once_trains_on_exactly(
    ray_session: Any, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VAR, "off")
    kept, kept_hooks = _search(tmp_path, "kept")
    monkeypatch.setenv(ENV_VAR, "0")  # release right after every rung-end checkpoint
    released, hooks = _search(tmp_path, "released")

    promoted = released.trials.set_index("optimizer.lr").loc[0.5, "trial_id"]
    assert released.trials.set_index("optimizer.lr")["batches"].to_dict() == {0.0: 4, 0.5: 8}
    # Kept: the promoted trial never reloads. Released: it gave its memory back at its rung
    # checkpoint and was rebuilt from the kept state when Tune let it go on.
    assert not [h for h in kept_hooks if "on_checkpoint_load_start" in h]
    assert f"{promoted} on_trial_shutdown 3" in hooks  # after batch index 3
    assert f"{promoted} on_checkpoint_load_start 4" in hooks
    assert _by_trial(released) == _by_trial(kept)
    assert len(_by_trial(kept)[1]) == 6  # training 2, 4, validation 4, training 6, 8, val. 8


@pytest.mark.ray
def test_a_rank_that_cannot_release_makes_every_rank_keep_its_trial(ray_session: Any) -> None:
    """DDP rebuilds collectively: ranks must be parked all together or not at all."""
    from searchlab.experiment._data_parallel import DataParallelTrainable

    @ray_session.remote(num_cpus=0)
    class Rank:
        def __init__(self, can_park: bool) -> None:
            self.can_park, self.parked = can_park, False

        def park(self) -> bool:
            self.parked = self.can_park
            return self.can_park

        def unpark(self) -> None:
            self.parked = False

        def is_parked(self) -> bool:
            return self.parked

    ranks = [Rank.remote(True), Rank.remote(False), Rank.remote(True)]
    DataParallelTrainable._release(types.SimpleNamespace(_workers=ranks))  # type: ignore[arg-type]
    assert ray_session.get([r.is_parked.remote() for r in ranks]) == [False, False, False]

    ranks = [Rank.remote(True), Rank.remote(True)]
    DataParallelTrainable._release(types.SimpleNamespace(_workers=ranks))  # type: ignore[arg-type]
    assert ray_session.get([r.is_parked.remote() for r in ranks]) == [True, True]
