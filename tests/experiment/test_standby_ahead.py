"""Standby's windows trained ahead (``SEARCHLAB_STANDBY_AHEAD``) wait for the GPU's turn.

With standby, a trial whose report is on its way to the driver trains its next window in a
thread that holds the GPU's baton like the step does. These tests give a ``TrialRunner`` a
baton for its turn and another baton on the same GPU for "the other actor" (another open file
of the lock, which flock excludes as it would another process), and check that the window
trained ahead waits while the other holds the GPU, that no window of the trial ever overlaps
the other's turns, and that the trial trains exactly as one that neither waits nor trains
ahead (reports, weights, a pause while a window waits for its turn).
"""

from __future__ import annotations

import contextlib
import math
import pathlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import runner_steps as steps
import torch

import searchlab.experiment._standby as standby
from searchlab.experiment._standby import GpuBaton

NODE = "a1b2c3"
Span = tuple[float, float]


@pytest.fixture(autouse=True)
def _private_tmp(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))


def _recorded(baton: GpuBaton, spans: list[Span]) -> Callable[[], Any]:
    """``baton.held``, noting when each turn began and ended."""

    @contextlib.contextmanager
    def turn() -> Iterator[None]:
        with baton.held():
            began = time.monotonic()
            try:
                yield
            finally:
                spans.append((began, time.monotonic()))

    return turn


def _overlap(ours: list[Span], theirs: list[Span]) -> list[tuple[Span, Span]]:
    return [(a, b) for a in ours for b in theirs if a[0] < b[1] and b[0] < a[1]]


def test_a_window_trained_ahead_waits_while_the_other_trial_has_the_gpu(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The window trained ahead asks for the GPU right after the step's window gave it back,
    # and first leaves another actor the courtesy to take it: long here, so that this test's
    # "other trial" takes it before the window trained ahead does, however loaded the machine.
    courtesy = standby.COURTESY_S
    monkeypatch.setattr(standby, "COURTESY_S", 1.0)
    expected = steps.train_to_end(steps.toy_runner(tmp_path, "plain", unit=1, train_ahead=False))
    mine, other = GpuBaton("k1", "0", NODE), GpuBaton("k1", "0", NODE)
    spans: list[Span] = []
    runner = steps.toy_runner(
        tmp_path, "ahead", unit=1, train_ahead=True, turn=_recorded(mine, spans)
    )
    with other.held():  # the other trial's window: this trial's first step waits for it
        first = threading.Thread(target=lambda: got.append(steps.plain(runner.step())))
        got: list[dict[str, Any]] = []
        first.start()
        first.join(timeout=0.5)
        assert first.is_alive() and not spans  # waiting for its turn, nothing trained
        released = time.monotonic()
    first.join(timeout=60)
    assert got == expected[:1] and len(spans) == 1 and spans[0][0] >= released
    # Its next window trains ahead in a thread; while the other trial holds the GPU, it
    # waits, and trains as soon as the GPU is free (no step asked for it meanwhile).
    ahead = runner._ahead
    assert ahead is not None
    # The other trial asks at once (no courtesy of its own left to wait), a second before
    # the thread training ahead may.
    other._released = -math.inf
    with other.held():
        time.sleep(0.3)
        assert runner.loop is not None and runner.loop.batches_trained == 1 and len(spans) == 1
        held_until = time.monotonic()
    ahead.result(timeout=60)  # trained with no step waiting for it
    assert runner.loop.batches_trained == 2 and len(spans) == 2 and spans[1][0] >= held_until
    monkeypatch.setattr(standby, "COURTESY_S", courtesy)  # the rest at the usual pace
    got += steps.train_to_end(runner)
    assert got == expected
    mine.close()
    other.close()


@pytest.mark.parametrize("pause_after", [None, 2, 4])
def test_taking_turns_with_another_trial_trains_exactly_as_alone(
    pause_after: int | None, tmp_path: pathlib.Path
) -> None:
    plain = steps.toy_runner(tmp_path, "plain", unit=1, train_ahead=False)
    expected = steps.train_to_end(plain)
    mine, other = GpuBaton("k1", "0", NODE), GpuBaton("k1", "0", NODE)
    spans: list[Span] = []
    theirs: list[Span] = []
    done = threading.Event()

    def other_trial() -> None:  # 5 ms windows, 1 ms apart, until this trial ends
        while not done.is_set():
            with other.held():
                began = time.monotonic()
                time.sleep(0.005)
                theirs.append((began, time.monotonic()))
            time.sleep(0.001)

    competitor = threading.Thread(target=other_trial)
    competitor.start()
    try:
        runner = steps.toy_runner(
            tmp_path, "first", unit=1, train_ahead=True, turn=_recorded(mine, spans)
        )
        if pause_after is None:
            got = steps.train_to_end(runner)
            weights = steps.weights(runner)
        else:
            got = [steps.plain(runner.step()) for _ in range(pause_after)]
            saved = runner.state()  # Tune's save while a window trains ahead, or waits to
            assert saved is not None
            runner.close()
            runner = steps.toy_runner(
                tmp_path, "second", unit=1, train_ahead=True, turn=_recorded(mine, spans)
            )
            runner.load(saved[0], checkpoint_uuid="checkpoint_000000")
            got += steps.train_to_end(runner)
            weights = steps.weights(runner)
    finally:
        done.set()
        competitor.join(timeout=60)
    assert got == expected  # no report lost, none repeated, same values
    assert all(torch.equal(a, b) for a, b in zip(steps.weights(plain), weights, strict=True))
    assert len(theirs) > 0 and not _overlap(spans, theirs)  # never on the GPU together
    # Every report's window trained in a turn of its own, those trained ahead included (a
    # window trained ahead before the pause is handed out after it, not trained again).
    assert len(spans) == len(expected)
    mine.close()
    other.close()


def test_a_released_trial_is_rebuilt_in_its_turn(tmp_path: pathlib.Path) -> None:
    # Without standby's preparation (SEARCHLAB_STANDBY_PREPARE=0), the step rebuilds a
    # released trial; with standby it does so holding the GPU, as it trains.
    expected = steps.train_to_end(steps.toy_runner(tmp_path, "plain", unit=1, train_ahead=False))
    baton = GpuBaton("k1", "0", NODE)
    parked_in_turn: list[bool] = []

    @contextlib.contextmanager
    def turn() -> Iterator[None]:
        with baton.held():
            parked_in_turn.append(runner.parked)
            yield

    runner = steps.toy_runner(tmp_path, "released", unit=1, train_ahead=False, turn=turn)
    got = [steps.plain(runner.step())]
    runner.state()
    runner.park()  # released between its turns, as an idle standby actor does
    assert runner.parked
    got += steps.train_to_end(runner)
    assert got == expected
    assert parked_in_turn[:2] == [False, True]  # the second turn found it still released
    assert not any(parked_in_turn[2:])
    baton.close()


def test_a_process_that_just_gave_the_gpu_back_lets_the_waiting_one_take_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A long courtesy, so that a loaded machine's late wake-up of the waiter still shows.
    monkeypatch.setattr(standby, "COURTESY_S", 0.5)
    mine, other = GpuBaton("k1", "0", NODE), GpuBaton("k1", "0", NODE)
    order: list[str] = []
    waiting = threading.Event()

    def wait_for_the_gpu() -> None:
        waiting.set()
        with other.held():
            order.append("other")
            time.sleep(0.05)

    with mine.held():
        waiter = threading.Thread(target=wait_for_the_gpu)
        waiter.start()
        waiting.wait(timeout=60)
        time.sleep(0.05)  # the waiter blocks in flock
    began = time.monotonic()
    with mine.held():  # asked again at once, as a window trained ahead is
        order.append("mine")
    waiter.join(timeout=60)
    assert order == ["other", "mine"]
    assert time.monotonic() - began >= 0.05  # it waited for the other's turn
    # Asked later than the courtesy after its release, a turn does not wait for it.
    time.sleep(0.5)
    began = time.monotonic()
    with mine.held():
        pass
    assert time.monotonic() - began < 0.5
    mine.close()
    other.close()
