"""Writing a paused or promoted trial's checkpoint while the GPU goes on.

At each rung end a trial checkpoints: Ray Tune calls ``save_checkpoint`` into a staging
directory, copies the directory into the experiment and only then lets the trial go on (or the
next trial start). With a ResNet-18 that was ~0.12 s of ``torch.save`` and a second copy of
~90 MB per rung end, with the GPU idle. ``CheckpointWriter`` splits it:

1. in ``save_checkpoint`` (on the critical path): the state is copied to host memory
   (``host_copy``), and the staging directory gets ``metadata.json`` and the marker
   ``WRITING_MARKER`` (which process writes the state) but no state file;
2. once Tune has copied that small directory into the experiment, ``state-dict.pth`` is
   written into it (atomically: a temporary file renamed) and the marker removed: by a thread
   while the caller goes on, or at once, before ``save`` returns (``thread=False``).

The thread writes while the worker waits for Tune (after a pause: Tune's stop, the next
trial's reset and build, Tune's call to train) and, after a rung end the trial goes on from,
beside its next window (``SEARCHLAB_BACKGROUND_CHECKPOINTS``: unset or ``1``). ``torch.save``
gives up the GIL while it copies and writes a tensor's bytes: on two H100 hosts, with
ResNet-18's 89 MB written every 0.45 s of training, the loop kept 0.97-0.99 of its rate alone
(every 0.2 s, 0.93-0.96; with a process writing instead, 1.00-1.02:
``benchmarks/write_overlap.py``), about 0.015 s of training per write, where waiting for the
write cost a median 0.11-0.18 s at each such rung end. (A thread's write once slowed training
windows by a quarter; a profile then found the training thread as long in the pageable host
copy, since made pinned and asynchronous, as the writer in ``torch.save``.)
``idle`` finishes the write before the trial trains again (``finish_before_training``, called
by the trainable's ``step``), ``at-once`` before ``save`` returns. Either way the state goes
to the experiment only once (Tune copies just the small files) and stays in memory for the
worker's next resume of the trial, moved out of its pinned buffers once written
(``pageable_copy``): kept pinned, the states of a worker that held several trials' took
every save's buffers as fresh page-locked memory, and a save took 0.10 s against 0.01 s
(``checkpoint_write_s`` of ``benchmarks/vs_ray_asha.py``, 2x H200, calls 14A and 14B). The
data-parallel trial's coordinator trains nothing, so its thread writes while the ranks train.

A checkpoint is complete when it holds ``state-dict.pth`` and no marker. With the write beside
training, a rung end's checkpoint stays incomplete while the next window trains: a worker that
dies then (a crash, a ``kill -9``) leaves the trial to resume from its checkpoint before and
train from there again; a write that fails is raised by the trial's next step or save,
after the window's report (whose results the resume then replays). Until it is complete:

- the same worker resuming the trial takes the state from memory (``take``), no disk read;
- another worker waits for the writer (``wait_until_written``) and, if the writer died (a
  crash, a ``kill -9``), resumes from the trial's previous checkpoint instead, as for a
  missing one (``_trainable.existing_checkpoint``);
- retention keeps the trial's earlier checkpoints (``is_being_written``).

Only one write is in flight per worker: the next save first waits for it, and so does the
worker's end. A failed write is raised by the worker's next call, as a failed save was.
Used by the single-process trainable and by the data-parallel one (whose trainable holds
rank 0's state and writes it). Checkpoints that user callbacks read as they are written, the
last one of a trial, those outside a local directory, and every checkpoint of script trials
are written in ``save_checkpoint``, as before.
"""

from __future__ import annotations

import collections
import concurrent.futures
import copy
import functools
import json
import logging
import os
import pathlib
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from searchlab.experiment._protocol import WRITING_MARKER, is_being_written
from searchlab.experiment._spec import AUTO_CHECKPOINT_WRITES, CheckpointWrites
from searchlab.pytorch._checkpoint import (
    STATE_FILE,
    write_checkpoint_metadata,
    write_checkpoint_state,
)

__all__ = [
    "WRITING_MARKER",
    "CheckpointWriter",
    "host_copy",
    "is_being_written",
    "pageable_copy",
    "wait_until_written",
]

logger = logging.getLogger("searchlab")

WAIT_FOR_WRITER_S = 120.0  # longest wait for another live worker's write


def default_keep_bytes() -> int:
    """Host memory one worker may hold in kept states: 1 GiB, or 2% of the machine's memory
    if that is less (a node may run dozens of trial workers)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 2**30
    return min(2**30, total // 50)


def host_copy(obj: Any) -> Any:
    """``obj`` with every tensor copied to host memory and every container rebuilt, so that
    training on does not change it. A module's ``state_dict`` stays an ``OrderedDict`` with
    its ``_metadata`` (the module versions ``load_state_dict`` reads).

    CUDA tensors go into pinned buffers by asynchronous copies, with one synchronisation per
    device at the end: a copy per tensor into pageable memory waited for each of them."""
    return _pinned_host_copy(obj)[0]


def _pinned_host_copy(obj: Any) -> tuple[Any, bool]:
    """``host_copy(obj)``, and whether any of its tensors went into pinned buffers."""
    devices: set[torch.device] = set()
    out = _rebuilt(obj, lambda t: _tensor_to_host(t, devices), copy.deepcopy, copy.deepcopy)
    for device in devices:
        torch.cuda.synchronize(device)
    return out, bool(devices)


def pageable_copy(obj: Any, is_pinned: Callable[[torch.Tensor], bool] | None = None) -> Any:
    """``obj`` with each pinned tensor (``is_pinned``, default ``Tensor.is_pinned``) replaced
    by a pageable copy, containers rebuilt as ``host_copy`` does, everything else shared.

    A state kept for a resume from memory is moved out of its pinned buffers once written,
    so that they go back to torch's pinned cache for the next save. Kept pinned, up to
    ``keep_bytes`` of them, every save of a worker that held several trials' states had to
    page-lock fresh buffers (``cudaHostAlloc``) on the critical path."""
    pinned = is_pinned or torch.Tensor.is_pinned

    def pageable(tensor: torch.Tensor) -> torch.Tensor:
        return (
            torch.empty_like(tensor, pin_memory=False).copy_(tensor) if pinned(tensor) else tensor
        )

    return _rebuilt(obj, pageable, lambda leaf: leaf, lambda metadata: metadata)


def _tensor_to_host(obj: torch.Tensor, devices: set[torch.device]) -> torch.Tensor:
    """A host copy of ``obj``: CUDA tensors into a pinned buffer by an asynchronous copy
    (their device is added to ``devices``, to be synchronised), others cloned."""
    tensor = obj.detach()
    if tensor.device.type == "cpu":
        return tensor.clone()
    if tensor.device.type == "cuda" and tensor.layout == torch.strided:
        buffer = torch.empty_like(tensor, device="cpu", pin_memory=True)
        buffer.copy_(tensor, non_blocking=True)
        devices.add(tensor.device)
        return buffer
    return tensor.to("cpu")


def _rebuilt(
    obj: Any,
    tensor: Callable[[torch.Tensor], torch.Tensor],
    leaf: Callable[[Any], Any],
    metadata: Callable[[Any], Any],
) -> Any:
    """``obj`` with dicts (an ``OrderedDict`` stays one, with ``metadata`` of its
    ``_metadata``), lists and plain tuples rebuilt, ``tensor`` of each tensor and ``leaf`` of
    anything else (a named tuple or a callback's own object is a leaf)."""
    if isinstance(obj, torch.Tensor):
        return tensor(obj)
    if isinstance(obj, dict):
        items = ((k, _rebuilt(v, tensor, leaf, metadata)) for k, v in obj.items())
        out = (
            collections.OrderedDict(items)
            if isinstance(obj, collections.OrderedDict)
            else dict(items)
        )
        if getattr(obj, "_metadata", None) is not None:
            out._metadata = metadata(obj._metadata)  # type: ignore[attr-defined]
        return out
    if isinstance(obj, list):
        return [_rebuilt(v, tensor, leaf, metadata) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_rebuilt(v, tensor, leaf, metadata) for v in obj)
    return leaf(obj)


def wait_until_written(
    directory: str | os.PathLike[str], timeout_s: float = WAIT_FOR_WRITER_S
) -> bool:
    """Wait while another live process writes ``directory``'s state; True once it is complete.

    False at once when the writer is a process of this machine that is gone, or after
    ``timeout_s`` (a writer on another machine that never finished).
    """
    marker = pathlib.Path(directory) / WRITING_MARKER
    deadline = time.monotonic() + timeout_s
    while marker.exists():
        if not _writer_alive(marker) or time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return (pathlib.Path(directory) / STATE_FILE).is_file()


def _writer_alive(marker: pathlib.Path) -> bool:
    try:
        who = json.loads(marker.read_text())
    except (OSError, ValueError):
        return True  # removed or being written just now: look again
    if who.get("failed"):
        return False  # the write failed: it will never be completed
    if who.get("host") != socket.gethostname():
        return True  # cannot tell from here: wait for it
    try:
        os.kill(int(who["pid"]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, KeyError, ValueError, TypeError):
        return True
    return True


class CheckpointWriter:
    """One worker's staged checkpoint writes (see the module's docstring).

    The states it wrote stay in host memory (pageable), newest first, up to ``keep_bytes`` in all
    (default: ``default_keep_bytes()``), for ``take``: on one GPU the same worker runs every
    trial, so a promoted trial comes back to the worker that paused it. ``thread``: write in a
    thread while the caller goes on (else at once, in ``start``); ``finish_before_training``:
    ``before_training`` waits for that thread.
    """

    def __init__(
        self,
        keep_bytes: int | None = None,
        *,
        thread: bool = True,
        finish_before_training: bool = False,
    ) -> None:
        self._thread = thread
        self._finish_before_training = finish_before_training
        self._keep_bytes = default_keep_bytes() if keep_bytes is None else keep_bytes
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._future: concurrent.futures.Future[dict[str, Any] | None] | None = None
        self._future_of: tuple[str | None, str] = (None, "")  # its trial, its directory
        self._staged: dict[str, Any] | None = None  # saved, not yet handed to the thread
        self._staged_owner: str | None = None
        self._staged_pinned = False  # whether the staged state sits in pinned buffers
        # checkpoint dir -> (state written at once, or its thread's write whose result is the
        # state, bytes), oldest first. Kept states are pageable (``pageable_copy``).
        self._kept: collections.OrderedDict[
            str,
            tuple[
                dict[str, Any] | None,
                concurrent.futures.Future[dict[str, Any] | None] | None,
                int,
            ],
        ] = collections.OrderedDict()

    @classmethod
    def for_setting(
        cls, setting: CheckpointWrites, *, trains: bool, keep: bool = True
    ) -> CheckpointWriter:
        """The writer ``SEARCHLAB_BACKGROUND_CHECKPOINTS`` asks for, in a process that trains
        (a one-process trial) or only coordinates (a data-parallel trial's trainable), where
        ``auto`` writes in a thread beside the ranks' training. ``off`` stages nothing, so its
        writer is never handed a state. Without ``keep``, it keeps no state for ``take``."""
        if setting == "auto":
            setting = AUTO_CHECKPOINT_WRITES if trains else "thread"
        return cls(
            keep_bytes=None if keep else 0,
            thread=setting != "at_once",
            finish_before_training=trains and setting == "idle",
        )

    def stage(
        self,
        staging_dir: str,
        state: Mapping[str, Any],
        metadata: Mapping[str, Any],
        owned: bool = False,
        owner: str | None = None,
    ) -> None:
        """In ``save_checkpoint``: copy ``state`` to host memory and write the small files.

        ``owned``: ``state`` is already the caller's own host copy, which nothing else
        changes (the data-parallel trainable's, loaded from rank 0's bytes): kept as it is.
        ``owner``: the trial saving (see ``flush``)."""
        self.flush(owner)  # one write in flight at a time (raising the last one's error)
        snapshot, pinned = (dict(state), False) if owned else _pinned_host_copy(dict(state))
        directory = pathlib.Path(staging_dir)
        marker = {"pid": os.getpid(), "host": socket.gethostname()}
        (directory / WRITING_MARKER).write_text(json.dumps(marker))
        write_checkpoint_metadata(directory, metadata)
        self._staged, self._staged_owner, self._staged_pinned = snapshot, owner, pinned

    @property
    def staged(self) -> bool:
        return self._staged is not None

    def drop_staged(self) -> None:
        """Forget a staged state whose save failed, so no later save writes it."""
        self._staged = None

    def start(self, checkpoint_dir: str) -> None:
        """After Tune copied the staged directory to ``checkpoint_dir``: write the state there
        (in the thread, or at once, raising a failed write's error)."""
        snapshot, self._staged = self._staged, None
        if snapshot is None:
            return
        nbytes = _nbytes(snapshot)
        keep = self._keep_bytes > 0  # else written, and neither copied nor kept
        write = (
            functools.partial(_write_and_keep, pinned=self._staged_pinned) if keep else _write_state
        )
        kept: dict[str, Any] | None = None
        future: concurrent.futures.Future[dict[str, Any] | None] | None = None
        if self._thread:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="searchlab-checkpoint-write"
                )
            future = self._pool.submit(write, pathlib.Path(checkpoint_dir), snapshot)
            self._future, self._future_of = future, (self._staged_owner, checkpoint_dir)
        else:  # fails this save if it fails
            kept = write(pathlib.Path(checkpoint_dir), snapshot)
        del snapshot  # the thread's call holds it until written; then its buffers go back
        if not keep:
            return
        key = os.path.realpath(checkpoint_dir)
        self._kept[key] = (kept, future, nbytes)
        total = sum(n for _, _, n in self._kept.values())
        while self._kept and total > self._keep_bytes:
            total -= self._kept.popitem(last=False)[1][2]

    def take(self, checkpoint_dir: str) -> dict[str, Any] | None:
        """The state this worker wrote (or is writing) to ``checkpoint_dir``, from memory, once
        its file is in place; None if this worker does not hold it.

        Taken once: training on may change a loaded state's tensors in place."""
        kept = self._kept.pop(os.path.realpath(checkpoint_dir), None)
        if kept is None:
            return None
        state, write, _ = kept
        if write is None:
            return state
        if write.exception() is not None:  # waits for the write; no file
            return None  # the caller reads the directory, whose marker says it failed
        return write.result()

    def flush(self, owner: str | None = None) -> None:
        """Wait for the write in flight, raising its error. A write that another trial than
        ``owner`` made (an actor Tune reused) is logged instead: its marker says it failed,
        so that trial's resume falls back to its checkpoint before."""
        future, self._future = self._future, None
        if future is None or future.exception() is None:
            return
        wrote_for, directory = self._future_of
        if owner is not None and wrote_for is not None and owner != wrote_for:
            logger.warning(
                "trial %s's checkpoint %s was not written (%s); that trial resumes from its "
                "checkpoint before",
                wrote_for,
                directory,
                future.exception(),
            )
            return
        future.result()

    def check(self, owner: str | None = None) -> None:
        """Raise the error of a finished write, if it failed (see ``flush``)."""
        if self._future is not None and self._future.done():
            self.flush(owner)

    def before_training(self, owner: str | None = None) -> None:
        """As ``owner`` starts to train again: with ``finish_before_training``, wait for the
        write in flight, which then overlapped only the worker's waits for Tune (the pause,
        the next trial's reset and build, Tune's call to train), never training; else as
        ``check``."""
        if self._finish_before_training:
            self.flush(owner)
        else:
            self.check(owner)

    def close(self, owner: str | None = None) -> None:
        """Wait for the last write; forget every kept state. ``owner``: the trial ending here,
        as for ``flush`` (a write of an earlier trial on this actor that failed is logged)."""
        try:
            self.flush(owner)
        finally:
            self._kept.clear()
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None


def _nbytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(_nbytes(v) for v in obj)
    return 0


def _write_and_keep(
    directory: pathlib.Path, state: dict[str, Any], pinned: bool
) -> dict[str, Any] | None:
    """Write ``state`` into ``directory``; the state to keep for a resume from memory: a
    pageable copy if it sat in pinned buffers (``pageable_copy``), else itself. A copy that
    fails (no host memory left) keeps nothing: the write stands, and a resume reads the
    file."""
    _write_state(directory, state)
    if not pinned:
        return state
    try:
        return pageable_copy(state)
    except Exception as exc:  # MemoryError, or torch's RuntimeError for an allocation
        logger.warning(
            "the state written to %s is not kept in memory (%s: %s); its resume reads the file",
            directory,
            type(exc).__name__,
            exc,
        )
        return None


def _write_state(directory: pathlib.Path, state: dict[str, Any]) -> None:
    # Tune's copy of the directory is not synced either (``write_checkpoint_files``).
    try:
        write_checkpoint_state(
            directory, state, durable=False, crash_point="checkpoint-background-write"
        )
    except BaseException as exc:
        _mark_failed(directory / WRITING_MARKER, exc)
        raise
    (directory / WRITING_MARKER).unlink(missing_ok=True)


def _mark_failed(marker: pathlib.Path, exc: BaseException) -> None:
    """Say in the marker that its write failed: a reader then falls back at once, as for a
    dead writer, instead of waiting for a live process that will never finish it."""
    try:
        who = json.loads(marker.read_text())
        who["failed"] = f"{type(exc).__name__}: {exc}"
        marker.write_text(json.dumps(who))
    except (OSError, ValueError):
        pass  # no marker to update (its directory is gone): nothing waits on it
