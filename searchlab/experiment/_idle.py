"""Giving back a paused trial's memory while its actor waits in Tune's cache.

With ``reuse_actors``, Tune pauses a trial by saving its checkpoint and keeping the actor for
the next trial; it calls nothing on the actor while it waits. Without help the actor would
keep the paused trial's model, optimizer, loader workers and the allocator's cached blocks on
the GPU until its next trial arrives, which, at the end of an ASHA search, can be never.

``IdleRelease`` runs a release function once an actor has been idle for ``after_s`` seconds
after the checkpoint of a trial at a rung end (where searches pause trials; the trainables
arm it only there). Tune's actor calls are the work: each one runs inside ``busy()``, which
cancels a pending release and waits for one in progress. A trial promoted at once goes on
within a driver round trip, and a cached actor given its next trial replaces the trial anyway,
so the release happens to trials that sit paused; should one be released and go on after all,
it is rebuilt from the kept state and trains on exactly.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
import threading
from collections.abc import Callable, Iterator

from searchlab.errors import ConfigError
from searchlab.experiment._compat import clear_cublas_workspaces, empty_host_cache

__all__ = [
    "DEFAULT_AFTER_S",
    "ENV_VAR",
    "IdleRelease",
    "free_accelerator_memory",
    "freeze_imported_objects",
    "idle_after_s",
]

logger = logging.getLogger("searchlab")

ENV_VAR = "SEARCHLAB_RELEASE_IDLE_AFTER_S"
DEFAULT_AFTER_S = 1.0


def idle_after_s() -> float | None:
    """The release delay from ``SEARCHLAB_RELEASE_IDLE_AFTER_S`` (``off``: never release)."""
    text = os.environ.get(ENV_VAR, "").strip().lower()
    if not text:
        return DEFAULT_AFTER_S
    if text in ("off", "none", "never", "inf"):
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ConfigError(
            f"environment variable {ENV_VAR}={text!r} is not a number of seconds; set it to "
            "e.g. 1.0, or to 'off'"
        )
    return max(value, 0.0)


_imports_frozen = False


def freeze_imported_objects() -> None:
    """Take every object alive now out of the cyclic garbage collector's scans (``gc.freeze``).

    Called once per worker process, after the trial's modules are imported and before any
    trial is built. torch, Ray and the user's imports leave some 400k long-lived objects, and
    each full collection walked all of them: 0.15-0.45 s with the interpreter stopped, every
    few checkpoints, in the middle of a training window (py-spy and ``gc.callbacks`` on the
    trial workers of ``benchmarks/vs_ray_asha.py``). Module-level objects never become garbage,
    so freezing them loses nothing; trials are built after it, so their objects (a model in a
    reference cycle, say) are still collected when the trial is replaced.
    """
    global _imports_frozen
    if not _imports_frozen:
        _imports_frozen = True
        gc.freeze()


def free_accelerator_memory(collect: bool = True) -> None:
    """Give the allocator's cached GPU blocks back (after collecting released objects).

    ``collect=False`` skips the garbage collection (tens of ms in a process that imported
    torch and Ray) where a new trial is about to be built and speed matters more. With
    ``collect`` (an idle trial's release), the pinned host blocks torch keeps for reuse go
    back too: checkpoint host copies (``_checkpoint_writer.host_copy``) are pinned, and
    torch's host allocator would otherwise keep their page-locked memory for the process's
    life. A state still being written keeps its buffers; written states are kept pageable.
    """
    if collect:
        gc.collect()
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        if collect:
            torch.cuda.synchronize()
            clear_cublas_workspaces()
            empty_host_cache()
        torch.cuda.empty_cache()


class IdleRelease:
    """Calls ``release`` once the owner stayed idle ``after_s`` seconds after ``arm()``."""

    def __init__(self, release: Callable[[], None], after_s: float | None) -> None:
        self._release = release
        self._after_s = after_s
        self._lock = threading.RLock()
        self._generation = 0
        self._timer: threading.Timer | None = None

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """Wrap every call that uses the trial: no release starts while it runs."""
        self._generation += 1  # before the lock: a timer waiting on it sees it is stale
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        with self._lock:
            yield

    def arm(self) -> None:
        """The trial was just checkpointed: release it if nothing else happens for a while."""
        if self._after_s is None:
            return
        generation = self._generation
        if self._after_s == 0:
            self._fire(generation)
            return
        timer = threading.Timer(self._after_s, self._fire, args=(generation,))
        timer.daemon = True
        self._timer = timer
        timer.start()

    def cancel(self) -> None:
        with self.busy():
            pass

    def _fire(self, generation: int) -> None:
        with self._lock:
            if generation != self._generation:
                return
            self._generation += 1  # once per arm()
            try:
                self._release()
            except Exception:  # the trial goes on from its checkpoint state either way
                logger.warning("releasing an idle trial's memory failed", exc_info=True)
