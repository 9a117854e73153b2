"""Standby's memory rules: a trial that fits its GPU alone does not fail beside the others.

At each window's end, still in the GPU's turn, a holder gives its allocator's cache back when
the GPU's free memory could not hold another window like its own (``MemoryGuard``); a trial
that runs out of GPU memory all the same marks its GPU tight for every actor of the run on it
(``GpuBaton.mark_tight``): they give their cache back after every window and train their
first batch in the turn. A CPU test has no GPU: these fake torch's memory functions and the
worker's GPU, and check each rule's decision and wiring.
"""

from __future__ import annotations

import fcntl
import pathlib
from typing import Any

import pytest
import torch
from toy_experiment import TOY_MODEL_DIR, toy_config

from searchlab.config import load_experiment_config
from searchlab.experiment._spec import ExperimentSpec
from searchlab.experiment._standby import GpuBaton, MemoryGuard

NODE = "a1b2c3"
GIB = 1 << 30


@pytest.fixture(autouse=True)
def _private_tmp(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))


class FakeCuda:
    """``torch.cuda``'s memory functions for one GPU, in bytes."""

    def __init__(self, free: int, peak: int, allocated: int) -> None:
        self.free, self.peak, self.allocated = free, peak, allocated
        self.emptied = 0

    def mem_get_info(self) -> tuple[int, int]:
        return self.free, 80 * GIB

    def max_memory_reserved(self) -> int:
        return self.peak

    def memory_allocated(self) -> int:
        return self.allocated

    def empty_cache(self) -> None:
        self.emptied += 1


@pytest.mark.parametrize(
    ("free_gib", "room"),
    # A window grows by 10 GiB (peak 12, 2 kept between windows): room is 12.5 GiB + 256 MiB.
    [(60.0, True), (12.8, True), (12.7, False), (4.0, False)],
)
def test_room_for_another_window_is_its_growth_with_a_margin(free_gib: float, room: bool) -> None:
    cuda = FakeCuda(free=int(free_gib * GIB), peak=12 * GIB, allocated=2 * GIB)
    assert MemoryGuard.room_for_another_window(cuda) is room


def _guarded(monkeypatch: pytest.MonkeyPatch, cuda: FakeCuda | None) -> MemoryGuard:
    """A guard whose process sees ``cuda`` as its GPU (None: no GPU in use)."""
    for name in ("mem_get_info", "max_memory_reserved", "memory_allocated", "empty_cache"):
        monkeypatch.setattr(torch.cuda, name, getattr(cuda, name, lambda *a: 0))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda is not None)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: cuda is not None)
    return MemoryGuard(GpuBaton("k1", "0", NODE))


def test_a_window_keeps_its_cache_where_the_gpu_has_room(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = FakeCuda(free=60 * GIB, peak=12 * GIB, allocated=2 * GIB)
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
    cuda = FakeCuda(free=60 * GIB, peak=12 * GIB, allocated=2 * GIB)
    guard = _guarded(monkeypatch, cuda)
    other = GpuBaton("k1", "0", NODE)  # another actor of the run on the same GPU
    other.mark_tight()
    guard.after_window()
    guard.after_window()
    assert (cuda.emptied, guard.gave_back) == (2, 2)
    guard.baton.close()
    other.close()


def test_a_process_that_never_used_the_gpu_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    guard = _guarded(monkeypatch, None)
    guard.baton.mark_tight()
    guard.after_window()
    assert guard.gave_back == 0
    guard.baton.close()


def test_tight_is_the_gpus_for_the_run_and_stops_the_warm_up() -> None:
    first, second = GpuBaton("k1", "0", NODE), GpuBaton("k1", "0", NODE)
    others = [GpuBaton("k1", "1", NODE), GpuBaton("k2", "0", NODE), GpuBaton("k1", "0", "d4e5")]
    assert not first.tight and not second.tight
    first.mark_tight()
    first.mark_tight()  # twice: no error
    later = GpuBaton("k1", "0", NODE)  # an actor started after the mark
    assert second.tight and later.tight
    assert not any(other.tight for other in others)
    # The first batch of a process on a tight GPU trains in the turn; on the others, beside.
    assert later.claim_warm_up() is False and later.claim_warm_up() is False
    assert [other.claim_warm_up() for other in others] == [True, True, True]
    for baton in [first, second, later, *others]:
        baton.close()


def _free(baton: GpuBaton) -> bool:
    assert baton._fd is not None
    try:
        fcntl.flock(baton._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    fcntl.flock(baton._fd, fcntl.LOCK_UN)
    return True


def test_before_release_runs_in_the_turn_and_the_gpu_is_given_back_after_it() -> None:
    mine, other = GpuBaton("k1", "0", NODE), GpuBaton("k1", "0", NODE)
    seen: list[bool] = []
    mine.before_release = lambda: seen.append(_free(other))
    with mine.held():
        pass
    assert seen == [False] and _free(other)  # still held while it ran, free after

    # A window that raised (out of memory, say) still gives its memory, then the GPU, back;
    # the window's error is what the caller sees.
    with pytest.raises(ValueError, match="window"), mine.held():
        raise ValueError("window")
    assert seen == [False, False] and _free(other)

    def fails() -> None:
        raise OSError("release")

    mine.before_release = fails
    with pytest.raises(OSError, match="release"), mine.held():
        pass
    assert _free(other)
    mine.close()
    other.close()


class _Failing:
    """A ``TrialRunner`` stand-in whose step raises ``error``."""

    error: BaseException = RuntimeError()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.timing: dict[str, float] = {}

    def prepare(self) -> None:
        pass

    def step(self) -> dict[str, Any]:
        raise self.error


def _standby_trainable(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> Any:
    # A trial actor on a worker given one GPU (faked: a CPU test has none), with standby on.
    import ray

    from searchlab.experiment import _trainable

    monkeypatch.setenv("SEARCHLAB_STANDBY", "1")
    config = load_experiment_config(toy_config("memory"), model_dir=str(TOY_MODEL_DIR))
    spec = ExperimentSpec.from_config(config, "memory")
    monkeypatch.setattr(_Failing, "error", error)
    monkeypatch.setattr(_trainable, "TrialRunner", _Failing)
    monkeypatch.setattr(_trainable, "shipped_model_dir", lambda spec: str(TOY_MODEL_DIR))
    monkeypatch.setattr(ray, "get_gpu_ids", lambda: [0])
    monkeypatch.setattr(
        ray, "get_runtime_context", lambda: type("Context", (), {"get_node_id": lambda s: NODE})()
    )
    trainable = object.__new__(_trainable.SearchlabTrainable)
    trainable._trial_info, trainable._logdir = None, "unused"
    trainable.setup({"lr": 0.1}, experiment=spec)
    return trainable


def test_a_trial_out_of_gpu_memory_marks_its_gpu_tight_and_fails_for_tune_to_retry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trainable = _standby_trainable(monkeypatch, torch.cuda.OutOfMemoryError("CUDA out of memory"))
    baton = trainable._baton
    try:
        assert baton.before_release.__self__.baton is baton  # the guard runs in every turn
        assert not baton.tight
        with pytest.raises(torch.cuda.OutOfMemoryError):
            trainable.step()
        assert baton.tight
        neighbour = GpuBaton(trainable._spec.standby_key, "0", NODE)
        assert neighbour.tight  # what the GPU's other actors see
        neighbour.close()
    finally:
        baton.close()


def test_another_error_leaves_the_gpu_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    trainable = _standby_trainable(monkeypatch, RuntimeError("a bug in train_batch"))
    try:
        with pytest.raises(RuntimeError, match="train_batch"):
            trainable.step()
        assert not trainable._baton.tight
    finally:
        trainable._baton.close()
