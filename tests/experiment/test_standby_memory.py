"""Standby's memory rules: a trial that fits its GPU alone does not fail beside the others.

At each window's end, still in the GPU's turn, a holder gives its allocator's cache back when
the GPU's free memory could not hold another window like its own (``MemoryGuard``). A trial
that runs out of GPU memory all the same marks its GPU tight for every actor of the run on it
(``GpuBaton.out_of_memory``): they give their cache back after every window and train their
first batch in the turn. One that runs out on a tight GPU marks it crowded: every call that
puts a trial on the GPU runs in the turn, at whose end the trial is parked in host memory.
A CPU test has no GPU: these fake torch's memory functions and the worker's GPU, and check
each rule's decision, its wiring, and that a trial parked after every window trains exactly
as one never parked.
"""

from __future__ import annotations

import json
import pathlib
import threading
from typing import Any

import pytest
import runner_steps as steps
import torch
from toy_experiment import TOY_MODEL_DIR, toy_config

from searchlab.config import load_experiment_config
from searchlab.experiment._spec import ExperimentSpec
from searchlab.experiment._standby import GpuBaton, MemoryGuard, is_out_of_memory
from searchlab.experiment._trial_runner import TrialRunner

NODE = "a1b2c3"
GIB = 1 << 30


@pytest.fixture(autouse=True)
def _private_tmp(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))


class FakeCuda:
    """``torch.cuda``'s memory functions for one GPU, in bytes."""

    def __init__(self, free: int, reserved: int, allocated: int) -> None:
        self.free, self.reserved, self.allocated = free, reserved, allocated
        self.emptied = 0

    def mem_get_info(self) -> tuple[int, int]:
        return self.free, 80 * GIB

    def memory_reserved(self) -> int:
        return self.reserved

    def memory_allocated(self) -> int:
        return self.allocated

    def empty_cache(self) -> None:
        self.emptied += 1


@pytest.mark.parametrize(
    ("free_gib", "room"),
    # 10 GiB cached after a window (12 reserved, 2 allocated): room is 12.5 GiB + 256 MiB.
    [(60.0, True), (12.8, True), (12.7, False), (4.0, False)],
)
def test_room_for_another_window_is_its_growth_with_a_margin(free_gib: float, room: bool) -> None:
    cuda = FakeCuda(free=int(free_gib * GIB), reserved=12 * GIB, allocated=2 * GIB)
    assert MemoryGuard.room_for_another_window(cuda) is room


def _guarded(monkeypatch: pytest.MonkeyPatch, cuda: FakeCuda | None) -> MemoryGuard:
    """A guard whose process sees ``cuda`` as its GPU (None: no GPU in use)."""
    for name in ("mem_get_info", "memory_reserved", "memory_allocated", "empty_cache"):
        monkeypatch.setattr(torch.cuda, name, getattr(cuda, name, lambda *a: 0))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda is not None)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: cuda is not None)
    return MemoryGuard(GpuBaton("k1", "0", NODE))


def test_a_window_keeps_its_cache_where_the_gpu_has_room(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = FakeCuda(free=60 * GIB, reserved=12 * GIB, allocated=2 * GIB)
    guard = _guarded(monkeypatch, cuda)
    guard.after_window()
    assert (cuda.emptied, guard.gave_back) == (0, 0)
    # The same process on a GPU the others have filled gives its cache back.
    cuda.free = 4 * GIB
    guard.after_window()
    assert (cuda.emptied, guard.gave_back) == (1, 1)
    guard.baton.close()


def test_on_a_tight_gpu_every_window_gives_its_cache_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cuda = FakeCuda(free=60 * GIB, reserved=12 * GIB, allocated=2 * GIB)
    guard = _guarded(monkeypatch, cuda)
    other = GpuBaton("k1", "0", NODE)  # another actor of the run on the same GPU
    assert other.out_of_memory(0) == 1
    guard.after_window()
    guard.after_window()
    assert (cuda.emptied, guard.gave_back) == (2, 2)
    guard.baton.close()
    other.close()


def test_a_process_that_never_used_the_gpu_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    guard = _guarded(monkeypatch, None)
    guard.baton.out_of_memory(0)
    guard.after_window()
    assert guard.gave_back == 0
    guard.baton.close()


def test_tight_is_the_gpus_for_the_run_and_stops_the_warm_up() -> None:
    first, second = GpuBaton("k1", "0", NODE), GpuBaton("k1", "0", NODE)
    others = [GpuBaton("k1", "1", NODE), GpuBaton("k2", "0", NODE), GpuBaton("k1", "0", "d4e5")]
    assert not first.tight and not second.tight and second.level == 0
    assert first.out_of_memory(0) == 1
    # Another trial that ran out in a call begun before the mark does not go further.
    assert second.out_of_memory(0) == 1
    later = GpuBaton("k1", "0", NODE)  # an actor started after the mark
    assert second.tight and later.tight and not later.crowded
    assert not any(other.tight for other in others)
    # The first batch of a process on a tight GPU trains in the turn; on the others, beside.
    assert later.claim_warm_up() is False and later.claim_warm_up() is False
    assert [other.claim_warm_up() for other in others] == [True, True, True]
    # One that ran out on the tight GPU makes it crowded, and no level goes past that.
    assert later.out_of_memory(1) == 2 and first.crowded and second.level == 2
    assert first.out_of_memory(2) == 2
    assert not any(other.tight for other in others)
    for baton in [first, second, later, *others]:
        baton.close()


def test_before_release_runs_in_the_turn_and_the_gpu_is_given_back_after_it() -> None:
    mine, other = GpuBaton("k1", "0", NODE), GpuBaton("k1", "0", NODE)
    seen: list[tuple[bool, bool]] = []
    mine.before_release = lambda failed: seen.append((steps.gpu_is_free(other), failed))
    with mine.held():
        pass
    assert seen == [(False, False)] and steps.gpu_is_free(
        other
    )  # still held while it ran, free after

    # A window that raised (out of memory, say) still gives its memory, then the GPU, back;
    # the window's error is what the caller sees.
    with pytest.raises(ValueError, match="window"), mine.held():
        raise ValueError("window")
    assert seen[1:] == [(False, True)] and steps.gpu_is_free(other)

    def fails(failed: bool) -> None:
        raise OSError("release")

    mine.before_release = fails
    with pytest.raises(OSError, match="release"), mine.held():
        pass
    assert steps.gpu_is_free(other)
    # After a window that raised, its own error goes on, not the release's.
    with pytest.raises(ValueError, match="window"), mine.held():
        raise ValueError("window")
    assert steps.gpu_is_free(other)
    mine.close()
    other.close()


def test_a_turn_taken_again_by_its_holder_is_one_turn() -> None:
    # On a crowded GPU a call that holds the turn (a save, a build) may run a step, which
    # takes it again.
    mine, other = GpuBaton("k1", "0", NODE), GpuBaton("k1", "0", NODE)
    released: list[bool] = []
    mine.before_release = lambda failed: released.append(steps.gpu_is_free(other))
    with mine.held():
        with mine.held():
            assert not steps.gpu_is_free(other)
        assert not steps.gpu_is_free(other) and released == []  # the inner end gave nothing back
    assert released == [False] and steps.gpu_is_free(other)
    mine.close()
    other.close()


@pytest.mark.parametrize("train_ahead", [False, True])
def test_a_trial_parked_at_the_end_of_every_turn_trains_exactly_as_alone(
    tmp_path: pathlib.Path, train_ahead: bool
) -> None:
    plain = steps.toy_runner(tmp_path, "plain", unit=2)
    expected = steps.train_to_end(plain)
    baton = GpuBaton("k1", "0", NODE)
    baton.out_of_memory(1)  # crowded
    runner = steps.toy_runner(tmp_path, "crowded", unit=2, train_ahead=train_ahead, turn=baton.held)
    baton.before_release = lambda failed: runner.park_between_windows()  # as the actor does
    got = []
    while True:
        result = runner.step()
        got.append(steps.plain(result))
        assert runner.parked and runner._ahead is None  # nothing left on the GPU
        if result.get("done"):
            break
    assert got == expected  # the same reports, values and RNG draws
    runner.unpark()
    for a, b in zip(steps.weights(plain), steps.weights(runner), strict=True):
        assert torch.equal(a, b)
    plain.close()
    runner.close()
    baton.close()


class _Runner:
    """A ``TrialRunner`` stand-in noting each call and whether the actor held the GPU's turn
    in it (``other`` could not take the lock); its step raises ``error`` when set."""

    other: GpuBaton
    error: BaseException | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.timing: dict[str, float] = {}
        self.calls = [("build", self.held())]

    def held(self) -> bool:
        return not steps.gpu_is_free(self.other)

    def prepare(self) -> None:
        self.calls.append(("prepare", self.held()))

    def step(self) -> dict[str, Any]:
        self.calls.append(("step", self.held()))
        if self.error is not None:
            raise self.error
        return {"done": False}

    def park_between_windows(self) -> None:
        self.calls.append(("park", self.held()))

    def settle(self) -> None:
        self.calls.append(("settle", self.held()))


def _standby_trainable(
    monkeypatch: pytest.MonkeyPatch, level: int, error: BaseException | None = None
) -> Any:
    # A trial actor on a worker given one GPU (faked: a CPU test has none), with standby on,
    # its GPU at memory ``level``; ``_Runner.other`` is another actor's baton on that GPU.

    from searchlab.experiment import _trainable

    monkeypatch.setenv("SEARCHLAB_STANDBY", "1")
    config = load_experiment_config(toy_config("memory"), model_dir=str(TOY_MODEL_DIR))
    spec = ExperimentSpec.from_config(config, "memory")
    assert spec.standby_key is not None
    other = GpuBaton(spec.standby_key, "0", NODE)
    if level:
        other.out_of_memory(level - 1)
    monkeypatch.setattr(_Runner, "other", other, raising=False)
    monkeypatch.setattr(_Runner, "error", error)
    monkeypatch.setattr(_trainable, "TrialRunner", _Runner)
    return steps.standby_actor(monkeypatch, spec, {"lr": 0.1}, node=NODE, logdir="unused")


def _close(trainable: Any) -> None:
    trainable._baton.close()
    _Runner.other.close()


@pytest.mark.parametrize("level", [0, 1])
def test_below_crowded_an_actor_builds_and_prepares_beside_the_holder(
    monkeypatch: pytest.MonkeyPatch, level: int
) -> None:
    trainable = _standby_trainable(monkeypatch, level)
    try:
        trainable.step()
        # The step's own turn is the runner's (``turn``); the stand-in takes none.
        assert trainable._runner.calls == [("build", False), ("prepare", False), ("step", False)]
        with trainable._gpu_work():
            assert not trainable._runner.held()  # a save or a restore: beside the holder
    finally:
        _close(trainable)


def test_on_a_crowded_gpu_an_actor_puts_its_trial_there_only_in_its_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trainable = _standby_trainable(monkeypatch, level=2)
    try:
        runner = trainable._runner
        # Built in the turn and parked at its end; no loader started beside the holder.
        assert runner.calls == [("build", True), ("park", True)]
        # A window trained ahead, if any, is waited for before the turn (it takes it itself).
        trainable.step()
        assert runner.calls[2:] == [("settle", False), ("step", True), ("park", True)]
        with trainable._gpu_work():  # a save, a restore, the next trial's build
            assert runner.held()
        assert runner.calls[5:] == [("settle", False), ("park", True)] and not runner.held()
    finally:
        _close(trainable)


def test_running_out_of_gpu_memory_marks_the_next_level_before_tune_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trainable = _standby_trainable(
        monkeypatch, level=0, error=torch.cuda.OutOfMemoryError("CUDA out of memory")
    )
    baton = trainable._baton
    try:
        assert baton.before_release == trainable._before_release  # the rules run every turn
        for level in (1, 2, 2):
            with pytest.raises(torch.cuda.OutOfMemoryError):
                trainable.step()
            assert baton.level == level and _Runner.other.level == level  # seen by all
    finally:
        _close(trainable)


@pytest.mark.parametrize(
    ("error", "counts"),
    [
        (torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
        (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"), True),
        (RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), True),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), False),
        (MemoryError(), False),  # the host's memory: not the GPU's to fix
    ],
)
def test_what_counts_as_the_gpu_out_of_memory(error: BaseException, counts: bool) -> None:
    assert is_out_of_memory(error) is counts


def test_another_error_leaves_the_gpu_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    trainable = _standby_trainable(monkeypatch, level=0, error=RuntimeError("in train_batch"))
    try:
        with pytest.raises(RuntimeError, match="train_batch"):
            trainable.step()
        assert trainable._baton.level == 0
    finally:
        _close(trainable)


def _crowd_while_ahead(runner: TrialRunner, other: GpuBaton) -> None:
    """Hold the GPU as another actor whose trial ran out of memory on the tight GPU, while
    ``runner``'s window trained ahead waits for its turn; give the GPU back crowded."""
    assert runner._ahead is not None and not runner._ahead.done()  # waiting for its turn
    with other.held():
        other.out_of_memory(1)


@pytest.fixture
def long_courtesy(monkeypatch: pytest.MonkeyPatch) -> None:
    # A process that just gave the GPU back waits a second before it asks again: the thread
    # training ahead waits, the test's "other actor" (a fresh baton) takes the GPU first.
    from searchlab.experiment import _standby

    monkeypatch.setattr(_standby, "COURTESY_S", 1.0)


def test_a_gpu_crowded_while_a_window_trains_ahead_parks_after_it_exactly(
    tmp_path: pathlib.Path, long_courtesy: None
) -> None:
    # The window trained ahead ends its turn on a crowded GPU: its thread does not park the
    # trial (a save waiting for it would find no trial); the next turn's end does.
    plain = steps.toy_runner(tmp_path, "plain", unit=2)
    expected = steps.train_to_end(plain)
    mine, other = GpuBaton("k1", "0", NODE), GpuBaton("k1", "0", NODE)
    runner = steps.toy_runner(tmp_path, "ahead", unit=2, train_ahead=True, turn=mine.held)
    mine.before_release = lambda failed: mine.crowded and runner.park_between_windows()
    got = [steps.plain(runner.step())]
    _crowd_while_ahead(runner, other)
    saved = runner.state()  # a save: waits for the window trained ahead
    assert saved is not None and not runner.parked
    while not got[-1].get("done"):
        got.append(steps.plain(runner.step()))
        assert runner.parked or len(got) == 2  # the window taken from ahead took no turn
    assert got == expected
    runner.unpark()
    for a, b in zip(steps.weights(plain), steps.weights(runner), strict=True):
        assert torch.equal(a, b)
    for each in (plain, runner):
        each.close()
    mine.close()
    other.close()


@pytest.mark.timeout(120)
def test_an_actor_whose_gpu_is_crowded_while_it_trains_ahead_goes_on_exactly(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, long_courtesy: None
) -> None:
    # The trial actor with the real runner: its next call on the crowded GPU waits for the
    # window trained ahead before it takes the turn the window needs. Here the thread training
    # ahead is held back until the call has begun: taking the turn first, the call would wait
    # for a window that waits for the call's turn, for ever.
    import dataclasses

    from searchlab.experiment import _trial_build
    from searchlab.experiment._protocol import TrialConfig

    plain = steps.toy_runner(tmp_path, "plain", unit=2)
    expected = steps.train_to_end(plain)
    monkeypatch.setenv("SEARCHLAB_STANDBY", "1")
    monkeypatch.setenv("SEARCHLAB_STANDBY_AHEAD", "1")
    config = toy_config(
        "memory",
        hyperparameters=steps.HPARAMS,
        searcher={"max_length": {"batches": 12}},
        scheduling_unit=2,
    )
    spec = ExperimentSpec.from_config(
        load_experiment_config(config, model_dir=str(TOY_MODEL_DIR)), "memory"
    )
    assert spec.standby_key is not None and spec.train_ahead
    spec = dataclasses.replace(spec, model_dir=str(TOY_MODEL_DIR))
    monkeypatch.setattr(_trial_build, "freeze_imported_objects", lambda: None)
    trial = TrialConfig(steps.HPARAMS, rung_ends=[6, 12], trial_seed=7).to_tune()
    trainable = steps.standby_actor(
        monkeypatch, spec, trial, node=NODE, logdir=str(tmp_path / "actor")
    )
    other = GpuBaton(spec.standby_key, "0", NODE)
    gate = threading.Event()

    def held_back() -> bool:  # asked before a window takes its turn
        if threading.current_thread().name.startswith("searchlab-train-ahead"):
            gate.wait(timeout=30)
        return False  # no warm-up batch beside the holder

    trainable._runner._warm_up = held_back
    try:
        got = [steps.plain(trainable.step())]
        assert trainable._runner._ahead is not None  # held back before its turn
        other.out_of_memory(1)  # crowded
        threading.Timer(0.5, gate.set).start()
        while not got[-1].get("done"):
            got.append(steps.plain(trainable.step()))
            assert trainable._runner.parked  # every call on the crowded GPU parks at its end
        assert got == expected
    finally:
        trainable.cleanup()
        other.close()
        plain.close()


# A trial that "holds GPU memory" from its build until the garbage collector frees it: a file
# per live trial object, named by its process (a killed process frees its memory). A batch
# trained while more trials than ``capacity`` are held raises torch's out-of-memory error.
# The search's first batch waits (at most a minute) until every actor holds a trial: the
# trials are too quick to overlap otherwise.
CROWDING_TRIAL = """
import os, pathlib, time, uuid, weakref
import torch
from asha_trial import AshaTrial


def _held(folder):
    count = 0
    for marker in pathlib.Path(folder).iterdir():
        try:
            os.kill(int(marker.name.split("-")[0]), 0)
        except ProcessLookupError:
            continue
        count += 1
    return count


class CrowdingTrial(AshaTrial):
    def __init__(self, context):
        super().__init__(context)
        memory = context.get_hparams()["memory"]
        marker = pathlib.Path(memory["folder"]) / f"{os.getpid()}-{uuid.uuid4().hex}"
        marker.touch()
        weakref.finalize(self, marker.unlink, missing_ok=True)

    def train_batch(self, batch, epoch_idx, batch_idx):
        memory = self.context.get_hparams()["memory"]
        try:
            os.close(os.open(memory["folder"] + ".waited", os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            pass
        else:
            deadline = time.monotonic() + 60
            while _held(memory["folder"]) < memory["actors"] and time.monotonic() < deadline:
                time.sleep(0.05)
        held = _held(memory["folder"])
        if held > memory["capacity"]:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory (simulated: {held} trials)")
        return super().train_batch(batch, epoch_idx, batch_idx)
"""

CROWDED_SEARCH = """
import json, os, pathlib, sys
import ray
import searchlab
from searchlab._ray_env import ray_init_kwargs
from searchlab.experiment._compat import keep_prestarted_workers

out, standby = pathlib.Path(sys.argv[1]), int(os.environ["SEARCHLAB_STANDBY"])
(out / "memory").mkdir()
ray.init(
    num_cpus=1 + standby, num_gpus=1, _system_config=keep_prestarted_workers(),
    **ray_init_kwargs(),
)
config = {
    "name": "crowded",
    "entrypoint": "crowding_trial:CrowdingTrial",
    "hyperparameters": {
        "global_batch_size": 4,
        "lr": {"type": "categorical", "vals": [0.001, 0.01, 0.1, 0.3, 0.5, 1.0]},
        "memory": {"folder": str(out / "memory"), "capacity": 1, "actors": 1 + standby},
    },
    "searcher": {
        "name": "adaptive_asha", "metric": "validation_loss", "max_trials": 6,
        "max_length": {"batches": 16}, "mode": "aggressive", "divisor": 2, "max_rungs": 3,
    },
    "scheduling_unit": 2,
    "max_restarts": 20,  # timing decides how many actors run out before the GPU is crowded
    "reproducibility": {"experiment_seed": 3},
}
lines = []
results = searchlab.run(
    config, model_dir=sys.argv[2], storage_path=str(out / "runs"), echo=lines.append
)
metrics = results.metrics
first = metrics[(metrics["group"] == "validation") & (metrics["batches"] == 4)]
json.dump(
    {
        "states": sorted(results.trials["state"]),
        "restarts": int(results.trials["restarts"].sum()),
        "rung0": sorted(float(v) for v in first["validation_loss"]),
        "lines": lines,
    },
    open(out / "result.json", "w"),
)
"""


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(2 * 600 + 60)
def test_a_search_whose_trials_do_not_fit_three_to_a_gpu_completes_exactly(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through Tune's own retries, on a Ray node that declares one GPU (the trials train on
    the CPU): three actors, room for one trial. Out of memory at level 0, then on the tight
    GPU, the GPU ends up crowded; every trial completes, and each trains what it trains
    alone (the first rung's validations are those of a run without standby)."""
    monkeypatch.setattr("tempfile.tempdir", None)  # the workers' temporary folder
    script = tmp_path / "search.py"
    script.write_text(CROWDED_SEARCH)
    model = steps.asha_model_dir(tmp_path, crowding_trial=CROWDING_TRIAL)
    outcome = {}
    for standby in ("2", "0"):
        out = tmp_path / f"standby-{standby}"
        out.mkdir()
        steps.run_search_script(script, out, model, standby=standby)
        outcome[standby] = json.loads((out / "result.json").read_text())
    crowded, alone = outcome["2"], outcome["0"]
    assert crowded["states"] == alone["states"] == ["COMPLETED"] * 6
    # One actor on the GPU, which frees a trial as it closes it: never two trials held.
    assert alone["restarts"] == 0
    retries = [line for line in crowded["lines"] if "failed; retry" in line]
    # Out of memory at least twice: once at level 0 (the GPU marked tight), once on the tight
    # GPU (marked crowded); each retry's line says what the GPU does now.
    assert len(retries) >= 2 and crowded["restarts"] == len(retries), crowded["lines"]
    assert all("CUDA out of memory (simulated" in line for line in retries)
    assert all(
        line.endswith("parks trials between turns if that is not enough)") for line in retries
    )
    assert crowded["rung0"] == alone["rung0"] and len(alone["rung0"]) == 6
