"""One driver per experiment directory: an exclusive lock held while it runs.

``searchlab run`` and ``searchlab resume`` hold an ``flock`` on ``<experiment>/.searchlab.lock``
for as long as they drive the experiment; a second driver on the same directory (a resume
while the first run is alive) gets a one-line error naming the holder. The kernel drops the
lock when the holder dies, however it dies, so a crashed run never leaves the directory locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pathlib
import socket
import time
from collections.abc import Iterator

from searchlab.errors import ConfigError

__all__ = ["LOCK_FILE", "driver_alive", "experiment_lock"]

LOCK_FILE = ".searchlab.lock"


@contextlib.contextmanager
def experiment_lock(experiment_dir: pathlib.Path) -> Iterator[None]:
    """Hold the experiment directory's lock, or raise ``ConfigError`` naming its holder."""
    experiment_dir.mkdir(parents=True, exist_ok=True)
    path = experiment_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                f"{experiment_dir}: in use by another searchlab driver ({_holder(path)}); "
                "wait for it to end, or stop it first"
            ) from None
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _holder(path: pathlib.Path) -> str:
    try:
        info = json.loads(path.read_text())
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info["since"])))
        return f"pid {int(info['pid'])} on {info['host']}, since {since}"
    except (OSError, ValueError, KeyError, TypeError):
        return "pid unknown"


def driver_alive(experiment_dir: pathlib.Path) -> bool:
    """True while a searchlab driver holds the experiment directory's lock."""
    try:
        fd = os.open(experiment_dir / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False  # never run by a driver that locks, or not readable: none is known
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
