"""Staged checkpoint writes (in a thread or at once): the same files, in place before anyone
loads."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import threading

import pytest
import torch

from searchlab.experiment._checkpoint_writer import (
    CheckpointWriter,
    host_copy,
    wait_until_written,
)
from searchlab.experiment._protocol import WRITING_MARKER, is_being_written
from searchlab.experiment._retention import DeferredDeletions
from searchlab.pytorch._checkpoint import STATE_FILE, load_checkpoint, write_checkpoint_files


def _state(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.BatchNorm1d(64))
    return {
        "models_state_dict": [model.state_dict()],
        "optimizers_state_dict": [
            {"state": {0: {"momentum_buffer": torch.randn(64, generator=g)}}}
        ],
        "batches_trained": 12,
        "rng_state": {"python": (3, tuple(range(5)), None), "note": ["kept", {"a": 1}]},
        "callbacks": {"cb": {"seen": [1, 2]}},
    }


def _save(
    writer: CheckpointWriter, staging: pathlib.Path, final: pathlib.Path, state: dict
) -> None:
    """What the trainable does: stage in save_checkpoint, Tune copies the directory, start."""
    staging.mkdir()
    writer.stage(str(staging), state, {"batches_trained": state["batches_trained"]})
    final.mkdir(parents=True)
    for f in staging.iterdir():  # Tune's copy
        (final / f.name).write_bytes(f.read_bytes())
    writer.start(str(final))


def _same(a: object, b: object) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b) and a.dtype == b.dtype
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    else:
        assert a == b


@pytest.mark.parametrize("thread", [True, False], ids=["thread", "at-once"])
def test_a_staged_write_gives_the_files_a_direct_write_gives(
    tmp_path: pathlib.Path, thread: bool
) -> None:
    state = _state()
    direct = write_checkpoint_files(tmp_path / "direct", state, {"batches_trained": 12})
    writer = CheckpointWriter(thread=thread)
    final = tmp_path / "trial" / "checkpoint_000001"
    _save(writer, tmp_path / "staging", final, state)
    # Training goes on at once: the state changes in place while the write may still run.
    for t in state["models_state_dict"][0].values():
        t.add_(1)
    state["rng_state"]["note"].append("changed")
    writer.flush()
    assert not is_being_written(final) and (final / STATE_FILE).is_file()
    written, meta = load_checkpoint(final, trusted=True)
    expected, expected_meta = load_checkpoint(direct, trusted=True)
    _same(written, expected)
    # A module's state dict keeps its type and module versions (load_state_dict reads them).
    models = written["models_state_dict"][0]
    assert type(models) is type(expected["models_state_dict"][0])
    assert models._metadata == expected["models_state_dict"][0]._metadata
    assert meta == expected_meta
    writer.close()


@pytest.mark.parametrize(
    ("setting", "trains", "thread", "finish"),
    [
        ("auto", True, True, False),  # a one-process trial: beside its next window too
        ("auto", False, True, False),  # a data-parallel coordinator: beside the ranks
        ("idle", True, True, True),
        ("at_once", True, False, False),
        ("at_once", False, False, False),
        ("thread", True, True, False),
    ],
)
def test_each_setting_gives_the_writer_it_names(
    setting: str, trains: bool, thread: bool, finish: bool
) -> None:
    writer = CheckpointWriter.for_setting(setting, trains=trains)  # type: ignore[arg-type]
    assert (writer._thread, writer._finish_before_training) == (thread, finish)


@pytest.mark.parametrize("finish", [True, False], ids=["finished-first", "beside-training"])
def test_a_thread_write_is_finished_before_training_only_when_asked(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, finish: bool
) -> None:
    """``idle``: the write overlaps the worker's waits for Tune and is in place when the trial
    trains again. ``1`` and ``auto``: training may start beside it."""
    import searchlab.experiment._checkpoint_writer as module

    release = threading.Event()
    write = module._write_state

    def held_write(directory: pathlib.Path, state: dict) -> None:
        assert release.wait(30), "the test never let the write go"
        write(directory, state)

    monkeypatch.setattr(module, "_write_state", held_write)
    writer = CheckpointWriter(thread=True, finish_before_training=finish)
    final = tmp_path / "t" / "checkpoint_000000"
    _save(writer, tmp_path / "s", final, _state(1))
    assert is_being_written(final)  # the write is held: save returned without it
    if finish:
        threading.Timer(0.2, release.set).start()
        writer.before_training("trial-a")  # waits for the write, however long it takes
        assert release.is_set() and not is_being_written(final)
        assert (final / STATE_FILE).is_file()
    else:
        writer.before_training("trial-a")  # returns with the write still held
        assert is_being_written(final) and not (final / STATE_FILE).exists()
        release.set()
    writer.close()
    assert not is_being_written(final) and (final / STATE_FILE).is_file()


def _held_writes(monkeypatch: pytest.MonkeyPatch, fail: bool = False) -> threading.Event:
    """Hold every thread write until the returned event is set (then fail it if ``fail``)."""
    import searchlab.experiment._checkpoint_writer as module

    release = threading.Event()
    write = module._write_state

    def held_write(directory: pathlib.Path, state: dict) -> None:
        assert release.wait(30), "the test never let the write go"
        if fail:
            err = OSError(28, "No space left on device")
            module._mark_failed(directory / WRITING_MARKER, err)
            raise err
        write(directory, state)

    monkeypatch.setattr(module, "_write_state", held_write)
    return release


def test_training_on_beside_a_write_changes_nothing_it_writes(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default where the process trains: the trial trains on while its rung end's state
    is written. What it writes, and what the same worker resumes from, is the state at the
    save, however the live tensors change meanwhile."""
    release = _held_writes(monkeypatch)
    writer = CheckpointWriter.for_setting("auto", trains=True)
    final = tmp_path / "t" / "checkpoint_000000"
    live = _state(1)
    expected = _state(1)
    _save(writer, tmp_path / "s", final, live)
    writer.before_training("trial-a")  # returns at once: the write is still held
    assert is_being_written(final)
    for tensor in (
        *live["models_state_dict"][0].values(),
        live["optimizers_state_dict"][0]["state"][0]["momentum_buffer"],
    ):
        tensor.add_(1)  # the next window trains the live state in place
    threading.Timer(0.2, release.set).start()
    taken = writer.take(str(final))  # a resume on this worker waits for the write
    assert release.is_set() and taken is not None and not is_being_written(final)
    _same(taken, expected)
    _same(load_checkpoint(final, trusted=True)[0], expected)
    writer.close("trial-a")


@pytest.mark.parametrize("ending", ["b", "a"], ids=["another-trial", "its-own"])
def test_a_failed_write_at_the_actor_s_end_is_raised_only_to_its_own_trial(
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    ending: str,
) -> None:
    """Trial a's write is still going when the actor ends: Tune reused it for trial b, which
    ended before any save of its own, or a itself ends. a's failed write is a's error (its
    marker says so), logged at b's end, raised at a's."""
    release = _held_writes(monkeypatch, fail=True)
    writer = CheckpointWriter.for_setting("auto", trains=True)
    final = tmp_path / "a" / "checkpoint_000000"
    writer.stage(str(_mkdir(tmp_path / "s")), _state(1), {"batches_trained": 12}, owner="a")
    _copy_dir(tmp_path / "s", final)
    writer.start(str(final))
    writer.before_training(ending)  # the next step: the write is still held, nothing to say
    release.set()
    if ending == "a":
        with pytest.raises(OSError, match="No space left"):
            writer.close("a")
    else:
        with caplog.at_level("WARNING", logger="searchlab"):
            writer.close("b")
        assert "trial a's checkpoint" in caplog.text and "No space left" in caplog.text
    assert "failed" in json.loads((final / WRITING_MARKER).read_text())


def _mkdir(path: pathlib.Path) -> pathlib.Path:
    path.mkdir(parents=True)
    return path


def _copy_dir(source: pathlib.Path, target: pathlib.Path) -> None:
    target.mkdir(parents=True)
    for f in source.iterdir():  # Tune's copy
        (target / f.name).write_bytes(f.read_bytes())


@pytest.mark.parametrize("thread", [True, False], ids=["thread", "at-once"])
def test_the_same_worker_resumes_from_memory_once(tmp_path: pathlib.Path, thread: bool) -> None:
    writer = CheckpointWriter(thread=thread)
    final = tmp_path / "t" / "checkpoint_000000"
    state = _state(1)
    _save(writer, tmp_path / "s", final, state)
    taken = writer.take(str(final))
    assert taken is not None
    assert (final / STATE_FILE).is_file()  # the file is in place before memory is used
    _same(taken, load_checkpoint(final, trusted=True)[0])
    assert writer.take(str(final)) is None  # once: training may change it in place
    assert writer.take(str(tmp_path / "t" / "checkpoint_000009")) is None
    writer.close()


@pytest.mark.parametrize("setting", ["thread", "at_once"])
def test_a_writer_that_keeps_nothing_leaves_the_resume_to_the_file(
    tmp_path: pathlib.Path, setting: str
) -> None:
    """Standby's actors (``keep=False``): the state is written as ever, nothing stays in
    memory, and the same worker's resume reads the file."""
    writer = CheckpointWriter.for_setting(setting, trains=True, keep=False)  # type: ignore[arg-type]
    final = tmp_path / "t" / "checkpoint_000000"
    _save(writer, tmp_path / "s", final, _state(1))
    writer.flush()
    assert writer.take(str(final)) is None
    _same(load_checkpoint(final, trusted=True)[0], _state(1))
    # A state without tensors (0 bytes by the budget's count) is not kept either.
    empty = tmp_path / "t" / "checkpoint_000001"
    _save(writer, tmp_path / "s1", empty, {"batches_trained": 3})
    writer.flush()
    assert writer.take(str(empty)) is None
    writer.close()


def test_a_writer_that_keeps_nothing_still_raises_its_failed_write(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = _held_writes(monkeypatch, fail=True)
    writer = CheckpointWriter.for_setting("thread", trains=True, keep=False)
    final = tmp_path / "a" / "checkpoint_000000"
    writer.stage(str(_mkdir(tmp_path / "s")), _state(1), {"batches_trained": 12}, owner="a")
    _copy_dir(tmp_path / "s", final)
    writer.start(str(final))
    release.set()
    with pytest.raises(OSError, match="No space left"):
        writer.flush("a")
    assert "failed" in json.loads((final / WRITING_MARKER).read_text())
    writer.close("a")


def test_kept_states_stay_inside_their_memory_budget(tmp_path: pathlib.Path) -> None:
    one = (
        sum(t.numel() * t.element_size() for t in _state()["models_state_dict"][0].values())
        + 64 * 4
    )
    writer = CheckpointWriter(keep_bytes=2 * one)
    dirs = [tmp_path / "t" / f"checkpoint_00000{i}" for i in range(3)]
    for i, final in enumerate(dirs):
        _save(writer, tmp_path / f"s{i}", final, _state(i))
    writer.flush()
    assert writer.take(str(dirs[0])) is None  # the oldest went first
    assert writer.take(str(dirs[1])) is not None and writer.take(str(dirs[2])) is not None
    writer.close()
    # The default budget is bounded by the machine: dozens of workers may share a node.
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert 0 < CheckpointWriter()._keep_bytes == min(2**30, total // 50)


def test_a_failed_write_is_raised_by_the_next_call(tmp_path: pathlib.Path) -> None:
    writer = CheckpointWriter()
    staging = tmp_path / "s"
    staging.mkdir()
    writer.stage(str(staging), _state(), {"batches_trained": 12})
    writer.start(str(tmp_path / "gone"))  # Tune's copy is not there: the write fails
    with pytest.raises(FileNotFoundError):
        writer.flush()
    writer.close()


def test_a_failed_thread_write_is_raised_to_its_own_trial_only(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """On an actor Tune reused, trial b's first call finds trial a's failed write: b goes on
    and the failure is logged (a's marker makes a's resume fall back); a's own next call
    raises it, as a failed save would; a's state is not served from memory."""
    import searchlab.experiment._checkpoint_writer as module

    def full_disk(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(module, "write_checkpoint_state", full_disk)
    final = tmp_path / "a" / "checkpoint_000000"
    for caller, raises in (("b", False), ("a", True)):
        writer = CheckpointWriter()
        staging = tmp_path / f"s-{caller}"
        staging.mkdir()
        writer.stage(str(staging), _state(), {"batches_trained": 12}, owner="a")
        final.mkdir(parents=True, exist_ok=True)
        for f in staging.iterdir():  # Tune's copy
            (final / f.name).write_bytes(f.read_bytes())
        writer.start(str(final))
        writer._future.exception()  # the write has ended
        caplog.clear()
        if raises:
            with pytest.raises(OSError, match="No space left"):
                writer.check("a")
        else:
            writer.check("b")
            assert "trial a's checkpoint" in caplog.text and "No space left" in caplog.text
        writer.flush("a")  # reported once: nothing left to raise
        assert writer.take(str(final)) is None
        writer.close()


def test_a_write_at_once_is_complete_when_start_returns(tmp_path: pathlib.Path) -> None:
    writer = CheckpointWriter(thread=False)
    final = tmp_path / "t" / "checkpoint_000000"
    _save(writer, tmp_path / "s", final, _state(3))
    assert (final / STATE_FILE).is_file() and not is_being_written(final)
    assert writer._pool is None  # no thread was started
    _same(load_checkpoint(final, trusted=True)[0], _state(3))
    writer.close()


def test_a_failed_write_at_once_fails_its_own_save_and_keeps_nothing(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Written at once, a failure is raised by the save that made it (not by the next call,
    which on a reused actor belongs to another trial), its marker says so, nothing is kept."""
    import searchlab.experiment._checkpoint_writer as module

    def full_disk(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(module, "write_checkpoint_state", full_disk)
    writer = CheckpointWriter(thread=False)
    final = tmp_path / "t" / "checkpoint_000000"
    with pytest.raises(OSError, match="No space left"):
        _save(writer, tmp_path / "s", final, _state())
    assert "No space left" in json.loads((final / WRITING_MARKER).read_text())["failed"]
    assert wait_until_written(final, timeout_s=5.0) is False
    assert writer.take(str(final)) is None
    writer.check()
    writer.flush()  # nothing left to raise: the error went to the save
    writer.close()


def test_a_failed_write_says_so_in_its_marker_and_nobody_waits_for_it(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import searchlab.experiment._checkpoint_writer as module

    def full_disk(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(module, "write_checkpoint_state", full_disk)
    writer = CheckpointWriter()
    staging, final = tmp_path / "staging", tmp_path / "final"
    _save(writer, staging, final, _state())
    with pytest.raises(OSError, match="No space left"):
        writer.flush()
    marker = json.loads((final / WRITING_MARKER).read_text())
    assert marker["pid"] == os.getpid() and "No space left" in marker["failed"]
    # This process is alive, yet a reader gives up instead of waiting (an hour here) for it.
    answer: list[bool] = []
    reader = threading.Thread(
        target=lambda: answer.append(wait_until_written(final, timeout_s=3600)), daemon=True
    )
    reader.start()
    reader.join(timeout=60)
    assert answer == [False]
    writer.close()


def test_a_failed_save_leaves_no_state_for_a_later_save_to_write(tmp_path: pathlib.Path) -> None:
    from types import SimpleNamespace

    from searchlab.experiment._trainable import save_then_write

    writer = CheckpointWriter()
    staging = tmp_path / "staging"
    staging.mkdir()

    def failing_save() -> None:  # save_checkpoint staged, then Tune's copy failed
        writer.stage(str(staging), _state(1), {"batches_trained": 12})
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        save_then_write(writer, failing_save)
    assert not writer.staged
    # The next save writes its state itself (a synchronous save): nothing old is written over it.
    final = tmp_path / "final"
    final.mkdir()
    write_checkpoint_files(str(final), _state(2), {"batches_trained": 14}, durable=False)
    saved = SimpleNamespace(checkpoint=SimpleNamespace(path=str(final)))
    assert save_then_write(writer, lambda: saved) is saved
    writer.close()
    _same(load_checkpoint(final, trusted=True)[0], _state(2))


def test_a_pageable_copy_replaces_pinned_tensors_and_keeps_the_structure() -> None:
    """What a kept state becomes once written: each pinned tensor copied out (values,
    dtype and layout as they were), containers rebuilt with a module's ``_metadata``, and
    nothing else touched."""
    import collections

    from searchlab.experiment._checkpoint_writer import pageable_copy

    module = torch.nn.Linear(4, 3)
    state = {
        "model": module.state_dict(),
        "opt": {"state": {0: {"momentum_buffer": torch.randn(3, 4).t()}}, "groups": [{"lr": 1}]},
        "steps": [torch.arange(3), (torch.ones(2), "x")],
        "meta": {"seen": [1, 2]},
    }
    pinned = {id(state["model"]["weight"]), id(state["opt"]["state"][0]["momentum_buffer"])}
    copied = pageable_copy(state, is_pinned=lambda t: id(t) in pinned)
    _same(copied, state)
    assert isinstance(copied["model"], collections.OrderedDict)
    assert copied["model"]._metadata == state["model"]._metadata
    for get in (lambda s: s["model"]["weight"], lambda s: s["opt"]["state"][0]["momentum_buffer"]):
        assert get(copied).data_ptr() != get(state).data_ptr()  # copied out
        assert get(copied).stride() == get(state).stride()
    assert copied["model"]["bias"] is state["model"]["bias"]  # not pinned: shared
    assert copied["steps"][1][0] is state["steps"][1][0] and copied["steps"][1][1] == "x"
    # A CPU tensor of this machine is not pinned: the default check copies nothing.
    assert pageable_copy(state)["model"]["weight"] is state["model"]["weight"]


@pytest.mark.parametrize("thread", [True, False], ids=["thread", "at-once"])
def test_a_written_state_is_kept_out_of_its_pinned_buffers(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, thread: bool
) -> None:
    """A state copied into pinned buffers is kept, once written, as a pageable copy: the
    writer lets go of the buffers (they go back to torch's pinned cache for the next save),
    and the resume from memory gets the values the file holds."""
    import weakref

    import searchlab.experiment._checkpoint_writer as module

    staged: list[torch.Tensor] = []

    host_copy_of = module._pinned_host_copy

    def pinned_host_copy(obj: dict) -> tuple[dict, bool]:
        out, _ = host_copy_of(obj)
        staged.append(out["models_state_dict"][0]["0.weight"])
        return out, True  # as a CUDA state's host copy says

    monkeypatch.setattr(module, "_pinned_host_copy", pinned_host_copy)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: True)
    writer = CheckpointWriter(thread=thread)
    final = tmp_path / "t" / "checkpoint_000000"
    _save(writer, tmp_path / "s", final, _state(1))
    buffer = weakref.ref(staged.pop())
    writer.flush()
    assert buffer() is None  # nothing holds the staged (pinned) buffer any more
    taken = writer.take(str(final))
    assert taken is not None
    _same(taken, load_checkpoint(final, trusted=True)[0])
    writer.close()


@pytest.mark.parametrize("thread", [True, False], ids=["thread", "at-once"])
def test_a_pageable_copy_that_fails_keeps_nothing_and_the_write_stands(
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    thread: bool,
) -> None:
    """No host memory left for the kept copy: the checkpoint is still complete, no call
    raises, and the resume reads the file instead of memory."""
    import searchlab.experiment._checkpoint_writer as module

    def out_of_memory(obj: object, is_pinned: object = None) -> object:
        raise MemoryError("no host memory")

    host_copy_of = module._pinned_host_copy
    monkeypatch.setattr(module, "_pinned_host_copy", lambda obj: (host_copy_of(obj)[0], True))
    monkeypatch.setattr(module, "pageable_copy", out_of_memory)
    writer = CheckpointWriter(thread=thread)
    final = tmp_path / "t" / "checkpoint_000000"
    with caplog.at_level("WARNING", logger="searchlab"):
        _save(writer, tmp_path / "s", final, _state(1))
        writer.flush()
    assert "is not kept in memory (MemoryError" in caplog.text
    assert (final / STATE_FILE).is_file() and not is_being_written(final)
    assert writer.take(str(final)) is None  # the caller loads the file
    _same(load_checkpoint(final, trusted=True)[0], _state(1))
    writer.close()


def test_host_copy_leaves_nothing_shared_with_the_live_state() -> None:
    state = _state()
    copied = host_copy(state)
    state["models_state_dict"][0]["0.weight"].mul_(0)
    state["callbacks"]["cb"]["seen"].append(3)
    assert copied["models_state_dict"][0]["0.weight"].abs().sum() > 0
    assert copied["callbacks"]["cb"]["seen"] == [1, 2]


def test_a_reader_waits_for_a_live_writer_and_not_for_a_dead_one(tmp_path: pathlib.Path) -> None:
    live = tmp_path / "live"
    live.mkdir()
    import socket

    (live / WRITING_MARKER).write_text(
        json.dumps({"pid": os.getpid(), "host": socket.gethostname()})
    )

    def finish() -> None:
        (live / STATE_FILE).write_bytes(b"x")
        (live / WRITING_MARKER).unlink()

    timer = threading.Timer(0.3, finish)
    timer.start()
    assert wait_until_written(live, timeout_s=30) is True
    timer.join()

    dead = tmp_path / "dead"
    dead.mkdir()
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    (dead / WRITING_MARKER).write_text(
        json.dumps({"pid": int(gone.stdout), "host": socket.gethostname()})
    )
    assert wait_until_written(dead, timeout_s=30) is False  # at once: its writer is gone


def test_retention_keeps_older_checkpoints_while_the_latest_is_being_written(
    tmp_path: pathlib.Path,
) -> None:
    for name in ("checkpoint_000000", "checkpoint_000001"):
        (tmp_path / "t1" / name).mkdir(parents=True)
    (tmp_path / "t1" / "checkpoint_000001" / WRITING_MARKER).write_text("{}")
    later = DeferredDeletions(tmp_path)
    later.let_go("t1/checkpoint_000000", "t1", generation=1)
    latest = {"t1": "t1/checkpoint_000001"}
    assert later.delete_due(5, latest) == []
    assert (tmp_path / "t1" / "checkpoint_000000").is_dir()
    (tmp_path / "t1" / "checkpoint_000001" / WRITING_MARKER).unlink()  # written
    assert later.delete_due(5, latest) == ["t1/checkpoint_000000"]
    assert not (tmp_path / "t1" / "checkpoint_000000").exists()


def _dead_marker(directory: pathlib.Path) -> None:
    import socket

    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    marker = {"pid": int(gone.stdout), "host": socket.gethostname()}
    (directory / WRITING_MARKER).write_text(json.dumps(marker))


def test_a_checkpoint_its_dead_worker_never_finished_falls_back_to_the_one_before(
    tmp_path: pathlib.Path,
) -> None:
    from searchlab.experiment._trainable import existing_checkpoint

    trial = tmp_path / "trial"
    done = write_checkpoint_files(trial / "checkpoint_000000", _state(), {"batches_trained": 12})
    unfinished = trial / "checkpoint_000001"
    unfinished.mkdir()
    _dead_marker(unfinished)
    said: list[str] = []
    assert existing_checkpoint(str(unfinished), said.append).path == str(done)
    assert "was never completed" in said[0] and str(done) in said[0]

    _dead_marker(done)  # no complete checkpoint left: the trial starts over, and says so
    said.clear()
    assert existing_checkpoint(str(unfinished), said.append) is None
    assert "starts over" in said[0]


# -- in a search ----------------------------------------------------------------------------
RESUME_MODEL = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "resume_model"


def _search_config(name: str) -> dict:
    return {
        "name": name,
        "entrypoint": "resume_trial:ResumeTrial",
        "hyperparameters": {
            "global_batch_size": 4,
            "lr": {"type": "log", "base": 10, "minval": -3, "maxval": 0},
        },
        "searcher": {
            "name": "adaptive_asha",
            "metric": "validation_loss",
            "max_trials": 6,
            "max_length": {"batches": 16},
            "mode": "aggressive",
            "divisor": 2,
        },
        "scheduling_unit": 2,
        "resources": {"cpus_per_trial": 2},  # one trial at a time: the same order every run
        "max_restarts": 0,
        "reproducibility": {"experiment_seed": 7},
    }


@pytest.mark.ray
def test_a_search_with_staged_writes_ends_as_one_without(
    ray_session: object, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from driver_procs import search_outcome

    import searchlab

    outcomes, memory_loads, weights = {}, {}, {}
    # In a thread beside training (the default for a one-process trial), in a thread finished
    # before training, at once, and not staged at all.
    for mode in ("1", "idle", "at-once", "0"):
        monkeypatch.setenv("SEARCHLAB_BACKGROUND_CHECKPOINTS", mode)
        results = searchlab.run(
            _search_config(f"bg-{mode}"),
            model_dir=RESUME_MODEL,
            storage_path=tmp_path / mode,
            echo=lambda _: None,
        )
        exp = results.experiment_dir
        outcomes[mode] = search_outcome(exp)
        assert not list(exp.rglob(WRITING_MARKER)), "a checkpoint was left half written"
        for ckpt in exp.glob("*/checkpoint_*"):
            load_checkpoint(ckpt, trusted=True)  # every kept checkpoint loads
        # Each trial's last weights, by learning rate (trial ids differ between runs).
        last = {}
        for row in results.trials.itertuples():
            newest = max((exp / row.trial_id).glob("checkpoint_*"))
            last[round(row.lr, 9)] = load_checkpoint(newest, trusted=True)[0]["models_state_dict"]
        weights[mode] = last
        lines = [
            json.loads(line)
            for f in exp.glob("*/result.json")
            for line in f.read_text().splitlines()
        ]
        memory_loads[mode] = sum("searchlab_timing_resumed_from_memory" in r for r in lines)
        # Each save's seconds reach the results (at once: the state's write included).
        writes = [
            r["searchlab_timing_checkpoint_write_s"]
            for r in lines
            if "searchlab_timing_checkpoint_write_s" in r
        ]
        assert writes and all(w > 0 for w in writes), mode
    for staged in ("1", "idle", "at-once"):
        assert outcomes[staged] == outcomes["0"]
        assert weights[staged].keys() == weights["0"].keys()
        for lr, models in weights[staged].items():
            _same(models, weights["0"][lr])  # bit for bit
    # Promoted trials came back to the worker that paused them (one trial at a time).
    assert all(memory_loads[m] > 0 for m in ("1", "idle", "at-once")) and memory_loads["0"] == 0


@pytest.mark.ray
@pytest.mark.parametrize(
    "mode", ["1", "idle", "at-once"], ids=["thread", "thread-before-training", "at-once"]
)
def test_a_worker_killed_mid_write_is_retried_from_the_checkpoint_before(
    ray_session: object, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """The driver lives on; its worker died before the state was in place. In a thread, the
    driver had registered the checkpoint (whether or not the thread finishes before the trial
    trains again): the retry falls back to the trial's previous checkpoint (or starts over) and
    says so. At once, the save itself failed. Either way the search ends as an uninterrupted
    one."""
    from driver_procs import check_a_kill_mid_write_recovers

    monkeypatch.setenv("SEARCHLAB_BACKGROUND_CHECKPOINTS", mode)
    # The worker writes the state (the one-process trainable): the kill hits it alone.
    check_a_kill_mid_write_recovers(
        _search_config, RESUME_MODEL, tmp_path, nth_write=4, registered=mode != "at-once"
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", "auto"),
        ("auto", "auto"),
        (" AUTO ", "auto"),
        ("at-once", "at_once"),
        ("AT_ONCE", "at_once"),
        ("idle", "idle"),
        ("1", "thread"),
        ("on", "thread"),
        ("0", "off"),
    ],
)
def test_the_environment_variable_picks_where_states_are_written(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: str
) -> None:
    """Unset or ``auto``: in a thread, beside training too (``AUTO_CHECKPOINT_WRITES``);
    ``at-once``: before ``save`` returns; ``idle``: in a thread finished before training;
    ``1``: in a thread beside training; ``0``: not staged (written in ``save_checkpoint``)."""
    from searchlab.experiment._spec import checkpoint_writes

    monkeypatch.setenv("SEARCHLAB_BACKGROUND_CHECKPOINTS", value)
    assert checkpoint_writes() == expected


@pytest.mark.parametrize("name", ["SEARCHLAB_BACKGROUND_CHECKPOINTS", "SEARCHLAB_TRAIN_AHEAD"])
def test_a_switch_set_to_neither_on_nor_off_is_a_one_line_error_with_exit_code_2(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: pathlib.Path,
    name: str,
) -> None:
    """A typo no longer turns the switch off without a word: the run refuses to start."""
    from toy_experiment import refused_run

    monkeypatch.setenv(name, "ture")
    choices = (
        "auto, at-once, idle, 1 or 0" if name == "SEARCHLAB_BACKGROUND_CHECKPOINTS" else "1 or 0"
    )
    assert refused_run(tmp_path, capsys) == [
        f"searchlab: error: environment variable {name}='ture' is not on or off; set it to "
        f"{choices}, or unset it"
    ]
