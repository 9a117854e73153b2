"""Named crash points, for the crash tests: ``kill -9`` at an exact moment of a search.

A crash test cannot hit "right after a trial finished" with a timer on a busy machine. The
places in searchlab where a crash is most dangerous call :func:`failpoint` with a name; it does
nothing unless the environment variable ``SEARCHLAB_FAILPOINTS`` names it, as
``name[:n][,name[:n]...]``: the n-th time (default the first) this process passes that point,
the experiment's driver is killed with SIGKILL (as the kernel's OOM killer or a lost node
would), and so is this process if it is a trial worker. The driver passes its pid and the
variable on to its trial workers. Nothing is read or done when the variable is unset.

``SEARCHLAB_FAILPOINTS_ONCE=<path>`` kills only in the first process to get there (it creates
``path``): a retried worker, a new process, passes the point again without dying.
``SEARCHLAB_FAILPOINTS_DELAY_S=<seconds>`` waits that long at the point before killing, so
that the rest of the search moves on first (a driver registers a checkpoint whose state a
background thread is still writing).
"""

from __future__ import annotations

import os
import signal
import time

__all__ = ["DRIVER_PID_VAR", "ENV_VAR", "failpoint", "worker_env"]

ENV_VAR = "SEARCHLAB_FAILPOINTS"
DRIVER_PID_VAR = "SEARCHLAB_FAILPOINTS_DRIVER_PID"
ONCE_VAR = "SEARCHLAB_FAILPOINTS_ONCE"
DELAY_VAR = "SEARCHLAB_FAILPOINTS_DELAY_S"
_passed: dict[str, int] = {}


def failpoint(name: str) -> None:
    """Kill the driver (and this process) here if ``SEARCHLAB_FAILPOINTS`` says so."""
    spec = os.environ.get(ENV_VAR)
    if not spec:
        return
    for item in spec.split(","):
        point, _, count = item.strip().partition(":")
        if point != name:
            continue
        _passed[name] = _passed.get(name, 0) + 1
        if _passed[name] == int(count or 1) and _first_to_fire():
            time.sleep(float(os.environ.get(DELAY_VAR) or 0))
            driver = int(os.environ.get(DRIVER_PID_VAR) or os.getpid())
            os.kill(driver, signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)


def _first_to_fire() -> bool:
    once = os.environ.get(ONCE_VAR)
    if not once:
        return True
    try:
        os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def worker_env() -> dict[str, str]:
    """What trial workers need to reach the driver's crash points (empty when none is set)."""
    spec = os.environ.get(ENV_VAR)
    return {ENV_VAR: spec, DRIVER_PID_VAR: str(os.getpid())} if spec else {}
