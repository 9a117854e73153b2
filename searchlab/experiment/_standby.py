"""A trial ready beside the one training on each GPU: the hand-over leaves the GPU's path.

Between two trials on one GPU, the GPU waits while the next trial is built (the user's model
and optimizer, ~0.2 s for a ResNet-18), its loader starts and Tune passes the trial over
(~0.45 s in all on an H100 host, benchmarks/README.md). With ``SEARCHLAB_STANDBY=1`` on the
driver, each one-GPU trial asks Ray for half a GPU, so two trial actors share each GPU, and
a per-GPU lock (``GpuBaton``) lets one of them train at a time: a trial holds it for each
call that trains (``Trainable.step``: one report window, its validation included) and gives
it back when the window is done. The other actor builds its trial, restores a checkpoint or
waits for Tune while the holder trains, rebuilds a released trial and starts its loader's
workers before it waits (``TrialRunner.prepare``), and takes the GPU the moment the holder's
report leaves it. Both actors' models are on the GPU at once: each process keeps its CUDA context
(~0.5 GiB) and the memory its allocator caches, so a trial that needs more than half the
GPU's memory should not use it. ``SEARCHLAB_STANDBY=2`` (up to 7) holds that many trials
ready: each trial asks for a third of the GPU (a quarter for 3 ...), and the actors take
turns on the same lock, so the GPU also goes on while two of them are between trials or
wait for Tune at once. ``SEARCHLAB_STANDBY=auto`` picks the count once Ray is up
(``_resources.auto_standby``): 2 where the cluster and the config allow, fewer or none where
they do not.

A trial process's first batch trains before the process takes the GPU's turn, beside the
trial that holds it (``GpuBaton.claim_warm_up``). That batch is where cuDNN tries the model's
kernels (``cudnn.benchmark``) and CUDA's libraries set up: ~1.5-2.2 s for a ResNet-18 on an
H200, against ~10 ms for a later batch (benchmarks/README.md, calls 15B, 16A). In the turn,
the actors a search starts together would pay it one after the other while the GPU trains
nothing else; beside the holder, they pay it at once, and the holder trains on at its rate
(``benchmarks/first_batch_beside.py``: 1.02 of its rate just before; the kernels the newcomer
picked ran at 1.12 of those picked alone). ``SEARCHLAB_STANDBY_WARM_UP=0`` on the driver
trains it in the turn instead (the default until call 16B).

With ``SEARCHLAB_STANDBY_AHEAD=1``, a trial whose report is on its way to the driver trains
its next window ahead (``TrialRunner.step``) in a thread that waits for the baton like the
step does: when the other trial's window ends before the driver calls this one again, the
GPU goes on with this trial's next window instead of waiting for Tune's round trip. A window
trained ahead is the window the next call trains, so every trial trains exactly as without.

Memory is what sharing a GPU costs: every actor keeps its CUDA context, its trial's model
and optimizer, and the blocks its allocator cached for its last window (for a CNN, mostly the
activations of one batch). Three rules keep a trial that fits the GPU alone from failing
beside the others, each a step further than the last:

1. At the end of each window, still in the turn, a holder gives its cached blocks back when
   the GPU's free memory could not hold another window like its own
   (``MemoryGuard.after_window``), so the next holder finds the room it needs.
2. A trial that runs out of GPU memory all the same marks its GPU *tight*
   (``GpuBaton.out_of_memory``) before its error goes to Tune, which retries it from its
   last checkpoint (``max_restarts``). From then on every actor of the run on that GPU gives
   its cache back after each window and trains its first batch in the turn.
3. A trial that runs out of memory on a tight GPU marks it *crowded*: from then on an actor
   does everything that puts a trial on the GPU (build, restore, save, train) in the turn,
   and parks its trial in host memory at the turn's end (``TrialRunner.park_between_windows``,
   exact like any park), so the GPU holds one trial and the actors' CUDA contexts.

Where memory is plentiful no rule does anything; on a crowded GPU standby is slower than
no standby, but no trial that fits alone fails. A parked trial is rebuilt for its next turn,
so on a crowded GPU the trial's lifecycle callbacks (``on_trial_startup``/``_shutdown``)
and its loader's workers start and end at every turn; the numbers it trains are the same.
A level is the run's on that GPU: a resumed run starts again at the first rule.

The lock is ``flock`` on a file of the node (one per GPU and run, in a directory of the
temporary folder only this user can enter): the kernel hands it over at once and frees it
when its holder's process dies, so a killed worker never keeps the GPU. Processes forked
from a worker (its data loader's) close their copy of the lock at once: they would
otherwise keep a killed holder's lock until they end.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import math
import os
import pathlib
import shutil
import stat
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = [
    "COURTESY_S",
    "GpuBaton",
    "MemoryGuard",
    "baton_dir",
    "is_out_of_memory",
    "remove_baton_dir",
    "says_out_of_memory",
]

logger = logging.getLogger("searchlab")

# How long a process that just gave the GPU back waits before it asks again (``held``).
COURTESY_S = 0.002


def _dir_path(key: str) -> pathlib.Path:
    """Where a run's locks live on this node (not created here)."""
    if not key.isalnum():
        raise ValueError(f"standby key {key!r} is not alphanumeric")
    return pathlib.Path(tempfile.gettempdir()) / f"searchlab-{os.getuid()}-standby-{key}"


def baton_dir(key: str) -> pathlib.Path:
    """The directory of a run's locks on this node: this user's only (mode 0700), checked to
    be a real directory of this user, not a link another user left in the shared folder."""
    path = _dir_path(key)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(f"{path} is not a private directory of this user")
    return path


def remove_baton_dir(key: str) -> None:
    """Remove a run's lock directory on this node once its trials are over (the driver's
    node, where it was made; other nodes keep a small directory in their temporary folder)."""
    with contextlib.suppress(OSError, ValueError):
        path = _dir_path(key)
        info = path.lstat()
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
            shutil.rmtree(path)


# Every open baton of this process: a forked child closes their descriptors (see above).
_OPEN: weakref.WeakSet[GpuBaton] = weakref.WeakSet()


def _close_in_child() -> None:
    for baton in list(_OPEN):
        baton.close()


os.register_at_fork(after_in_child=_close_in_child)


class GpuBaton:
    """The right to train on one GPU, held by one trial actor of a run at a time."""

    def __init__(self, key: str, gpu: str, node: str) -> None:
        # Named by a digest: GPU ids may be UUIDs or MIG paths, with characters a file
        # name cannot hold.
        name = hashlib.sha256(f"{node}\0{gpu}".encode()).hexdigest()[:32]
        self.path = baton_dir(key) / f"{name}.lock"
        # The GPU's memory level for the run (see the module's doc), one file per level.
        self._level_paths = [self.path.with_suffix(".tight"), self.path.with_suffix(".crowded")]
        self._level = 0
        # Called in the turn, right before the GPU is given back, with whether the turn's work
        # raised (the trial actor's memory rules).
        self.before_release: Callable[[bool], None] | None = None
        self._fd: int | None = os.open(
            self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        # flock excludes open files, not the threads sharing one: the step's thread and the
        # thread training ahead also take turns on this. Reentrant: on a crowded GPU a call
        # that holds the turn may run a step, which takes it again.
        self._threads = threading.RLock()
        self._depth = 0
        self._released = -math.inf  # monotonic time this process last gave the GPU back
        self._warm_up_claimed = False
        self._claim = threading.Lock()
        _OPEN.add(self)

    @classmethod
    def for_worker(cls, key: str | None, gpu_ids: Sequence[object], node: str) -> GpuBaton | None:
        """The baton of the one GPU this worker was given, or None: standby off (``key``
        None) or not exactly one GPU (a CPU trial, where there is nothing to take turns on)."""
        if key is None or len(gpu_ids) != 1:
            return None
        return cls(key, str(gpu_ids[0]), node)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Wait for the GPU, train, give it back (also when training raised).

        Right after this process gave the GPU back, it first leaves the other actor, woken
        by that release, ``COURTESY_S`` to take it: the kernel does not queue flock's waiters,
        and a window trained ahead, asked for at once, would otherwise often win the GPU
        again and make the other trial wait a window more."""
        with self._threads:
            if self._fd is None:
                raise RuntimeError("the GPU baton was closed")
            if self._depth:  # this thread holds the turn already
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            wait = self._released + COURTESY_S - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            fcntl.flock(self._fd, fcntl.LOCK_EX)  # waits without the GIL
            self._depth, failed = 1, False
            try:
                yield
            except BaseException:
                failed = True
                raise
            finally:
                try:
                    if self.before_release is not None:
                        self.before_release(failed)
                except Exception:
                    if not failed:
                        raise
                    # The turn's own error (out of memory, say) is the one its caller sees.
                    logger.warning("freeing GPU memory after a failed turn failed", exc_info=True)
                finally:
                    self._depth = 0
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
                    self._released = time.monotonic()

    def claim_warm_up(self) -> bool:
        """True the first time this process asks, False after: the caller's next batch is the
        process's first on this GPU and trains before its turn (see the module's doc). False
        on a tight GPU: that batch would need a window's memory beside the holder's."""
        with self._claim:
            first, self._warm_up_claimed = not self._warm_up_claimed, True
        return first and not self.tight

    @property
    def level(self) -> int:
        """The GPU's memory level for the run, as any actor of it marked it: 0, 1 (tight: a
        trial ran out of memory here) or 2 (crowded: one did on a tight GPU)."""
        while self._level < len(self._level_paths) and self._level_paths[self._level].exists():
            self._level += 1
        return self._level

    @property
    def tight(self) -> bool:
        return self.level >= 1

    @property
    def crowded(self) -> bool:
        return self.level >= 2

    def out_of_memory(self, seen: int) -> int:
        """A trial ran out of memory in a call that began at level ``seen``: mark the next
        level for every actor of the run on this GPU (none past crowded). The new level."""
        for path in self._level_paths[: min(seen + 1, len(self._level_paths))]:
            with contextlib.suppress(FileExistsError):
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                os.close(os.open(path, flags, 0o600))
        return self.level

    def close(self) -> None:
        """Let go of the lock file (the file stays: another actor may hold or wait on it)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class MemoryGuard:
    """What a standby actor does about GPU memory at the end of each window it trains."""

    # Room kept for another window like this one's: its cached bytes, a quarter more, 256 MiB.
    MARGIN = 1.25
    SPARE_BYTES = 256 << 20

    def __init__(self, baton: GpuBaton) -> None:
        self.baton = baton
        self.gave_back = 0  # windows after which the cache went back (for tests)

    def after_window(self) -> None:
        """Give the allocator's cached blocks back, still in the turn, when the GPU is tight or
        its free memory could not hold another window like this process's last one: as many
        bytes as its allocator keeps cached now (blocks a window used and freed)."""
        import torch

        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return
        if self.baton.tight or not self.room_for_another_window(torch.cuda):
            torch.cuda.empty_cache()
            self.gave_back += 1

    @classmethod
    def room_for_another_window(cls, cuda: Any) -> bool:
        """``cuda``: ``torch.cuda`` (or a stand-in with its memory functions)."""
        free, _total = cuda.mem_get_info()
        cached = cuda.memory_reserved() - cuda.memory_allocated()
        return bool(free >= cached * cls.MARGIN + cls.SPARE_BYTES)


# What torch ("CUDA out of memory") and CUDA's libraries (as RuntimeError) say when a GPU
# allocation fails.
_ALLOCATION_FAILED = ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED")


def says_out_of_memory(text: str) -> bool:
    """Whether an error's text (a traceback, say) tells of a GPU allocation that failed."""
    return any(marker in text for marker in _ALLOCATION_FAILED)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` says the GPU ran out of memory (torch's own error or a library's)."""
    import torch

    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and says_out_of_memory(str(exc))
