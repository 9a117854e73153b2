"""The search driver without Ray: fake event streams, crashes at every event, Ctrl-C.

A small fake runner stands in for Ray Tune: it runs trials (one at a time, or several), trains
each to its next rung end, reports a value that depends only on the trial's hyperparameters
and length, and does what the driver answers (go on, pause with a checkpoint, stop). A crash
keeps what a saved state would hold: the driver's state, each trial's status, and each
trial's latest checkpoint, which may lag behind its last result (the checkpoint of a pause
is registered a step after the result that asked for it).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
from collections import Counter
from typing import Any

import pytest

from searchers import Action, ExitReason, Phase, RunnerStatus, SearchDriver
from searchers._driver import FINISHED
from searchers._simple import GridSearch
from searchers._space import HyperparameterSpace
from searchers.adaptive import AdaptiveSearch, build_adaptive_plan


class CountingSearch(AdaptiveSearch):
    """Adaptive ASHA that counts the results it is given, per (trial, length)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: Counter[tuple[str, int]] = Counter()

    def report(self, trial_id: str, length: int, value: float) -> Any:
        self.seen[(trial_id, length)] += 1
        return super().report(trial_id, length, value)


def _adaptive(max_trials: int = 8) -> CountingSearch:
    """Rung ends 2, 4, 8, 16 with 8 trials; each trial's lr follows from its id."""
    plan = build_adaptive_plan(16, max_trials, mode="aggressive", divisor=2)
    return CountingSearch(plan, lambda trial_id: {"lr": round(random.Random(trial_id).random(), 6)})


def _value(hparams: dict[str, Any], length: int) -> float:
    return round(abs(hparams["lr"] - 0.6) + 1.0 / length, 9)  # best lr is 0.6


@dataclasses.dataclass
class _Trial:
    status: RunnerStatus = RunnerStatus.PENDING
    trained: int = 0  # where its model is
    checkpoint: int = 0  # where its latest checkpoint is
    pending_checkpoint: int | None = None  # a pause's checkpoint, registered next step


class FakeRunner:
    """Runs the driver's trials: one training step per call of ``step``."""

    def __init__(self, driver: SearchDriver, slots: int = 1) -> None:
        self.driver, self.slots = driver, slots
        self.trials: dict[str, _Trial] = {}
        self.next_id = 0
        self.finished = False

    def view(self) -> dict[str, RunnerStatus]:
        return {tid: t.status for tid, t in self.trials.items()}

    def step(self) -> None:
        """Register due checkpoints, ask for trials, schedule, run one trial to its next rung."""
        for t in self.trials.values():
            if t.pending_checkpoint is not None:
                t.checkpoint, t.pending_checkpoint = t.pending_checkpoint, None
        self._suggest()
        choice = self.driver.choose(self.view())
        for tid in choice.stop:
            self.trials[tid].status = RunnerStatus.ENDED
            self.driver.on_exit(tid, ExitReason.COMPLETED)
        for tid in choice.pause:
            self.trials[tid].status = RunnerStatus.PAUSED
        if choice.run is not None:
            self.trials[choice.run].status = RunnerStatus.PENDING
        for tid in choice.checkpoint_pause:
            self._pause(tid)
        starting = [t for t in self.trials.values() if t.status is RunnerStatus.PENDING]
        running = sum(t.status is RunnerStatus.RUNNING for t in self.trials.values())
        for t in starting[: max(self.slots - running, 0)]:
            t.status, t.trained = RunnerStatus.RUNNING, t.checkpoint  # restored
        live = [tid for tid, t in self.trials.items() if t.status is RunnerStatus.RUNNING]
        if live:
            self._train(live[0])
        elif choice.drained or (self.driver.finished and not starting and not choice.run):
            self.finished = all(
                t.status in (RunnerStatus.ENDED, RunnerStatus.PAUSED) for t in self.trials.values()
            )

    def _suggest(self) -> None:
        pending = sum(t.status is RunnerStatus.PENDING for t in self.trials.values())
        while pending < self.slots:
            tid = f"t{self.next_id}"
            plan = self.driver.suggest(tid)
            if plan is None or plan == FINISHED:
                return
            self.next_id += 1
            self.trials[tid] = _Trial()
            pending += 1

    def _train(self, tid: str) -> None:
        t = self.trials[tid]
        plan = self.driver.plan(tid)
        assert plan is not None
        nxt = next((e for e in plan.rung_ends if e > t.trained), None)
        if nxt is None:
            t.status = RunnerStatus.ENDED
            self.driver.on_exit(tid, ExitReason.COMPLETED)
            return
        t.trained = nxt
        action = self.driver.on_result(tid, nxt, _value(plan.hparams, nxt))
        if nxt == plan.rung_ends[-1]:
            t.checkpoint = nxt
            t.status = RunnerStatus.ENDED
            self.driver.on_exit(tid, ExitReason.COMPLETED)
        elif action is Action.PAUSE:
            self._pause(tid)
        elif action is Action.STOP:
            t.status = RunnerStatus.ENDED
            self.driver.on_exit(tid, ExitReason.COMPLETED)

    def _pause(self, tid: str) -> None:
        t = self.trials[tid]
        t.status, t.pending_checkpoint = RunnerStatus.PAUSED, t.trained

    def run(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            if self.finished:
                return
            self.step()
        raise AssertionError("the search did not end")

    def crash(self) -> dict[str, Any]:
        """What a saved state holds; pending checkpoints are lost with the driver."""
        return {
            "driver": json.loads(json.dumps(self.driver.state_dict())),  # JSON-able
            "trials": {tid: (t.status, t.checkpoint) for tid, t in self.trials.items()},
            "next_id": self.next_id,
        }

    @classmethod
    def restore(cls, saved: dict[str, Any], driver: SearchDriver, slots: int = 1) -> FakeRunner:
        driver.load_state_dict(saved["driver"])
        runner = cls(driver, slots)
        runner.next_id = saved["next_id"]
        for tid, (status, checkpoint) in saved["trials"].items():
            back = RunnerStatus.ENDED if status is RunnerStatus.ENDED else RunnerStatus.PENDING
            runner.trials[tid] = _Trial(back, checkpoint, checkpoint)
        lengths = {tid: t.checkpoint for tid, t in runner.trials.items()}
        choice = driver.restore(runner.view(), lengths)
        for tid in choice.pause:
            runner.trials[tid].status = RunnerStatus.PAUSED
        for tid in choice.stop:
            runner.trials[tid].status = RunnerStatus.ENDED
        return runner


def _whole(slots: int = 1) -> tuple[FakeRunner, list[dict[str, Any]]]:
    driver = SearchDriver(_adaptive())
    runner = FakeRunner(driver, slots)
    states = []
    while not runner.finished:
        states.append(runner.crash())
        runner.step()
    return runner, states


def _outcome(runner: FakeRunner) -> tuple[Any, ...]:
    method = runner.driver.method
    hparams = {tid: runner.driver.plan(tid).hparams["lr"] for tid in runner.trials}  # type: ignore[union-attr]
    trained = sorted((hparams[tid], t.trained) for tid, t in runner.trials.items())
    return json.dumps(method.rung_table()), tuple(trained)


def test_an_uninterrupted_search_gives_every_result_to_the_method_once() -> None:
    runner, _ = _whole()
    method = runner.driver.method
    assert method.finished and runner.driver.finished
    assert set(method.seen.values()) == {1}
    rungs = method.rung_table()[0]["rungs"]
    assert rungs[0]["results"] == 8
    for lower, upper in itertools.pairwise(rungs):  # each promotion came back with a result
        assert upper["results"] == lower["promoted"] >= 1
    assert all(t.status is RunnerStatus.ENDED for t in runner.trials.values())


@pytest.mark.parametrize("slots", [1, 3])
def test_a_crash_at_any_event_then_restore_ends_as_the_uninterrupted_search(slots: int) -> None:
    whole, states = _whole(slots=slots)
    expected = _outcome(whole)
    for k, saved in enumerate(states):
        driver = SearchDriver(_adaptive())
        runner = FakeRunner.restore(saved, driver, slots)
        runner.run()
        assert _outcome(runner) == expected, f"crash before step {k}"
        # Replays after the restore never reached the search method a second time.
        assert set(driver.method.seen.values()) <= {1}, f"crash before step {k}"


def test_a_trial_behind_its_last_result_catches_up_and_is_paused_again() -> None:
    driver = SearchDriver(_adaptive())
    plan = driver.suggest("a")
    assert plan is not None and plan != FINISHED
    assert driver.on_result("a", 2, 0.5) is Action.PAUSE  # waits at rung 0 for a promotion
    saved = json.loads(json.dumps(driver.state_dict()))

    restored = SearchDriver(_adaptive())
    restored.load_state_dict(saved)
    # The crash came before the pause's checkpoint: the trial's checkpoint is at 0.
    choice = restored.restore({"a": RunnerStatus.PENDING}, {"a": 0})
    assert choice.pause == () and choice.stop == ()  # it runs, to catch up
    assert restored.on_result("a", 2, 0.5) is Action.PAUSE  # the same answer as before
    assert restored.method.seen == Counter()  # the replay did not reach the method


def test_a_restored_trial_at_its_rung_stays_paused_and_an_unknown_one_is_stopped() -> None:
    driver = SearchDriver(_adaptive())
    driver.suggest("a")
    driver.on_result("a", 2, 0.5)
    view = {"a": RunnerStatus.PENDING, "stranger": RunnerStatus.PENDING}
    choice = driver.restore(view, {"a": 2, "stranger": None})
    assert choice.pause == ("a",)
    assert choice.stop == ("stranger",)


def test_a_trial_the_runner_never_saved_is_replaced() -> None:
    driver = SearchDriver(_adaptive(max_trials=8))
    started = [t for t in (f"t{i}" for i in range(8)) if driver.suggest(t) not in (None, FINISHED)]
    assert len(started) == 8 and driver.suggest("t8") is None  # the bracket's 8 are out
    view = {t: RunnerStatus.PENDING for t in started[:7]}  # t7 came after the saved state
    driver.restore(view, dict.fromkeys(view, 0))
    assert driver.on_result("t7", 2, 0.1) is Action.STOP
    assert driver.suggest("t9") not in (None, FINISHED)  # its place goes to a new trial


def test_ctrl_c_pauses_running_trials_keeps_pending_ones_and_drains_once() -> None:
    driver = SearchDriver(_adaptive())
    for tid in ("a", "b"):
        driver.suggest(tid)
    driver.interrupt()
    assert driver.suggest("c") is None  # nothing new while draining
    view = {"a": RunnerStatus.RUNNING, "b": RunnerStatus.PENDING}
    choice = driver.choose(view)
    assert (choice.checkpoint_pause, choice.pause, choice.drained) == (("a",), ("b",), False)
    done = driver.choose({"a": RunnerStatus.PAUSED, "b": RunnerStatus.PAUSED})
    assert done.drained and done.run is None
    assert not driver.choose({"a": RunnerStatus.PAUSED}).drained  # said once


def test_a_trial_closed_while_it_pauses_is_stopped_once_paused() -> None:
    driver = SearchDriver(_adaptive(max_trials=2))  # one bracket, rung ends 8 and 16
    driver.suggest("a"), driver.suggest("b")
    assert driver.on_result("a", 8, 0.1) is Action.PAUSE
    # The bracket's last rung-0 result: 'a' is promoted and 'b', unpromoted, is closed out
    # as it pauses. It is stopped only once paused, with its checkpoint written.
    assert driver.on_result("b", 8, 0.9) is Action.PAUSE
    assert driver._trials["a"].phase is Phase.QUEUED
    assert driver._trials["b"].phase is Phase.DONE
    running = driver.choose({"a": RunnerStatus.PAUSED, "b": RunnerStatus.RUNNING})
    assert running.run == "a" and running.stop == ()
    paused = driver.choose({"a": RunnerStatus.RUNNING, "b": RunnerStatus.PAUSED})
    assert paused.stop == ("b",)


def test_promoted_trials_resume_before_new_ones_start() -> None:
    driver = SearchDriver(_adaptive())
    for tid in ("a", "b"):
        driver.suggest(tid)
    driver.on_result("a", 2, 0.1)
    driver.on_result("b", 2, 0.9)  # two results: 'a' is promoted
    assert driver.suggest("c") is None  # a promotion is due: no new trial
    choice = driver.choose({"a": RunnerStatus.PAUSED, "b": RunnerStatus.PAUSED})
    assert choice.run == "a"
    driver.choose({"a": RunnerStatus.RUNNING, "b": RunnerStatus.PAUSED})
    assert driver.suggest("c") not in (None, FINISHED)


def test_a_trial_promoted_while_its_pause_is_written_is_resumed_once_paused() -> None:
    """Ray Tune keeps a pausing trial RUNNING until its checkpoint is saved: a promotion
    that comes in between must wait for the pause, not take the trial for resumed."""
    driver = SearchDriver(_adaptive(max_trials=2))  # one bracket, rung ends 8 and 16
    driver.suggest("a"), driver.suggest("b")
    assert driver.on_result("a", 8, 0.1) is Action.PAUSE
    driver.on_result("b", 8, 0.9)  # 'a' is promoted while the runner still writes its pause
    assert driver.choose({"a": RunnerStatus.RUNNING, "b": RunnerStatus.RUNNING}).run is None
    assert driver._trials["a"].phase is Phase.QUEUED
    resumed = driver.choose({"a": RunnerStatus.PAUSED, "b": RunnerStatus.PAUSED})
    assert resumed.run == "a"
    assert driver._trials["a"].phase is Phase.RUNNING
    assert driver.on_result("a", 16, 0.05) is Action.STOP


def test_grid_search_through_the_driver_stops_at_the_full_length_and_after_replays() -> None:
    space = HyperparameterSpace({"lr": {"type": "categorical", "vals": [0.1, 0.2]}}, grid=True)
    driver = SearchDriver(GridSearch(space, 10, seed=0))
    assert driver.suggest("a") not in (None, FINISHED)
    assert driver.on_result("a", 10, 0.3) is Action.STOP
    assert driver.on_result("a", 10, 0.3) is Action.STOP  # a replay gets the same answer
    driver.on_exit("a", ExitReason.COMPLETED)
    driver.suggest("b")
    driver.on_exit("b", ExitReason.COMPLETED)
    assert driver.suggest("c") == FINISHED


def test_errored_and_invalid_trials_leave_the_search() -> None:
    driver = SearchDriver(_adaptive(max_trials=2))
    driver.suggest("a"), driver.suggest("b")
    driver.on_exit("a", ExitReason.INVALID_HP)
    assert driver.suggest("c") not in (None, FINISHED)  # replaced
    driver.on_exit("b", ExitReason.ERRORED)
    assert driver.on_result("b", 2, 0.1) is Action.STOP


def test_a_state_from_another_version_is_refused() -> None:
    driver = SearchDriver(_adaptive())
    state = driver.state_dict() | {"version": 1}
    with pytest.raises(Exception, match=r"search driver state has version 1"):
        SearchDriver(_adaptive()).load_state_dict(state)
