"""Standby's warm-up: a trial process's first batch trains before its GPU turn.

A process's first batch on a GPU is where cuDNN tries the model's kernels; with standby on
(and ``SEARCHLAB_STANDBY_WARM_UP`` not ``0``) it trains beside the trial that holds the GPU
(``GpuBaton.claim_warm_up``), and the rest of the window in the turn. These tests give a
``TrialRunner`` the baton's turn and warm-up claim, and hold another baton on the same GPU
for "the other actor" (another open file of the lock, which flock excludes as it would
another process). They check that exactly one batch trains while the other holds the GPU,
that every later batch of the process waits for the turn, a new trial's in the same process
included, and that the trial trains exactly as one that never waits.
"""

from __future__ import annotations

import contextlib
import pathlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import runner_steps as steps
import torch
from toy_experiment import TOY_MODEL_DIR, toy_config

from searchlab.config import load_experiment_config
from searchlab.experiment._spec import ExperimentSpec
from searchlab.experiment._standby import GpuBaton
from searchlab.experiment._trial_runner import TrialRunner

NODE = "a1b2c3"
UNIT = 3  # batches per report window: the first window has batches after its first


@pytest.fixture(autouse=True)
def _private_tmp(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))


def _trained(runner: TrialRunner) -> int:
    assert runner.loop is not None
    return runner.loop.batches_trained


def _wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


class _Turns:
    """``baton.held``, noting when each turn was asked for (``asking``) and began
    (monotonic times)."""

    def __init__(self, baton: GpuBaton) -> None:
        self.baton, self.began = baton, []
        self.asking = threading.Event()

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        self.asking.set()
        with self.baton.held():
            self.began.append(time.monotonic())
            yield


def _step_while(
    other: GpuBaton, runner: TrialRunner, turns: _Turns, got: list[dict[str, Any]]
) -> float:
    """Start ``runner.step()`` in a thread while ``other`` holds the GPU; give the GPU back
    once the step has trained what it may train before its turn, asked for the turn and is
    seen to wait there (0.3 s more). Return the time the GPU was given back, after the
    step's end."""
    before = _trained(runner)
    turns.asking.clear()
    step = threading.Thread(target=lambda: got.append(steps.plain(runner.step())))
    with other.held():
        step.start()
        assert turns.asking.wait(timeout=60), "the step never asked for its turn"
        trained = _trained(runner)
        time.sleep(0.3)
        assert step.is_alive() and _trained(runner) == trained  # waiting for its turn
        got.append({"trained_before_turn": trained - before})
        released = time.monotonic()
    step.join(timeout=60)
    assert not step.is_alive()
    return released


def test_the_process_first_batch_trains_before_its_turn_and_every_later_one_in_it(
    tmp_path: pathlib.Path,
) -> None:
    plain = steps.toy_runner(tmp_path, "plain", unit=UNIT)
    expected = steps.train_to_end(plain)
    mine, other = GpuBaton("k1", "0", NODE), GpuBaton("k1", "0", NODE)
    turns = _Turns(mine)
    runner = steps.toy_runner(tmp_path, "first", unit=UNIT, turn=turns, warm_up=mine.claim_warm_up)
    got: list[dict[str, Any]] = []
    # The first window: its first batch trains while the other trial holds the GPU, its
    # other batches wait for the turn and train in it.
    released = _step_while(other, runner, turns, got)
    assert got[0] == {"trained_before_turn": 1}
    assert got[1] == expected[0] and _trained(runner) == UNIT
    assert len(turns.began) == 1 and turns.began[0] >= released
    # The next window waits for the turn before its first batch.
    released = _step_while(other, runner, turns, got)
    assert got[2] == {"trained_before_turn": 0}
    assert got[3] == expected[1] and turns.began[1] >= released
    results = [got[1], got[3], *steps.train_to_end(runner)]
    assert results == expected  # the same reports, values and RNG draws as alone
    for a, b in zip(
        plain.loop.context.models[0].state_dict().values(),  # type: ignore[union-attr]
        runner.loop.context.models[0].state_dict().values(),  # type: ignore[union-attr]
        strict=True,
    ):
        assert torch.equal(a, b)
    runner.close()
    # The process's next trial (a reused actor) waits for its turn from its first batch.
    second = steps.toy_runner(tmp_path, "second", unit=UNIT, turn=turns, warm_up=mine.claim_warm_up)
    got = []
    _step_while(other, second, turns, got)
    assert got[0] == {"trained_before_turn": 0} and got[1] == expected[0]
    second.close()
    plain.close()
    mine.close()
    other.close()


def test_the_warm_up_is_claimed_once_per_process_and_gpu() -> None:
    mine, again = GpuBaton("k1", "0", NODE), GpuBaton("k1", "1", NODE)
    assert mine.claim_warm_up() is True
    assert [mine.claim_warm_up() for _ in range(3)] == [False, False, False]
    assert again.claim_warm_up() is True  # another GPU's baton: its own first batch
    mine.close()
    again.close()


def test_a_first_window_that_trains_no_batch_never_takes_the_turn(tmp_path: pathlib.Path) -> None:
    # A trial resumed between a window's training report and its validation validates
    # first: that window trains no batch, so it runs before the turn, and the warm-up is
    # spent (the next window waits for its turn).
    mine, other = GpuBaton("k1", "0", NODE), GpuBaton("k1", "0", NODE)
    turns = _Turns(mine)
    source = steps.toy_runner(tmp_path, "source", unit=UNIT)
    reports = [steps.plain(source.step()), steps.plain(source.step())]
    # The rung end's training report (batch 6) is out, its validation not yet run.
    assert [(r["group"], r["batches"]) for r in reports] == [("training", 3), ("training", 6)]
    saved = source.state()
    assert saved is not None
    expected = steps.plain(source.step())
    assert (expected["group"], expected["batches"]) == ("validation", 6)
    resumed = steps.toy_runner(
        tmp_path, "resumed", unit=UNIT, turn=turns, warm_up=mine.claim_warm_up
    )
    resumed.load(saved[0], checkpoint_uuid="checkpoint_000000")
    with other.held():
        got = steps.plain(resumed.step())  # did not wait: no batch, no turn
    assert got == expected and turns.began == []
    assert mine.claim_warm_up() is False
    for runner in (source, resumed):
        runner.close()
    mine.close()
    other.close()


@pytest.mark.parametrize(("variable", "claims"), [(None, True), ("0", False)])
def test_a_standby_trial_actor_gives_its_runner_the_warm_up_unless_turned_off(
    variable: str | None, claims: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The trainable's wiring, on a worker given one GPU (faked: a CPU test has none): the
    # runner takes the GPU's turn from the baton, and its warm-up claim unless the driver
    # set SEARCHLAB_STANDBY_WARM_UP=0.

    from searchlab.experiment import _trainable

    monkeypatch.setenv("SEARCHLAB_STANDBY", "1")
    if variable is not None:
        monkeypatch.setenv("SEARCHLAB_STANDBY_WARM_UP", variable)
    config = load_experiment_config(toy_config("wiring"), model_dir=str(TOY_MODEL_DIR))
    spec = ExperimentSpec.from_config(config, "wiring")
    built: list[dict[str, Any]] = []

    class Built:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            built.append(kwargs)
            self.timing: dict[str, float] = {}

    monkeypatch.setattr(_trainable, "TrialRunner", Built)
    trainable = steps.standby_actor(monkeypatch, spec, {"lr": 0.1}, node=NODE, logdir="unused")
    try:
        assert trainable._baton is not None
        (kwargs,) = built
        assert kwargs["turn"] == trainable._baton.held
        if claims:
            assert kwargs["warm_up"] == trainable._baton.claim_warm_up
            assert kwargs["warm_up"]() is True and kwargs["warm_up"]() is False
        else:
            assert kwargs["warm_up"] is None
    finally:
        trainable._baton.close()
