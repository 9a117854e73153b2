"""Ends the Ray processes a driver started when the driver dies without shutting Ray down.

``searchlab run`` starts a local Ray (GCS, raylet, dashboard and runtime-env agents). After a
``kill -9`` of the driver the raylet and GCS follow it, but the agents outlive it for about a
minute, ignoring SIGTERM. The driver starts this script as a child process (run as a file, so
it imports neither searchlab nor Ray): it watches the driver's process tree, remembers every
descendant (pid and start time, so a reused pid is never touched), and when the driver is gone
sends SIGTERM, then SIGKILL, to those still alive. On a clean exit the driver shuts Ray down
first and then writes ``q`` to the pipe, and this script ends without touching anything. Only
processes whose command line is Ray's are ever ended.

Usage (by the driver only): ``python _reaper.py DRIVER_PID`` with stdin a pipe from the driver.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

CLEAN_EXIT = b"q"  # what the driver writes before it closes the pipe on a clean exit
POLL_S = 0.5
GRACE_S = 3.0
# What Ray's processes carry in their command lines (GCS, raylet, agents, workers).
_RAY_MARKS = (b"gcs_server", b"raylet", b"ray::", b"/ray/", b"dashboard", b"runtime_env")


def _stat(pid: str) -> tuple[int, str] | None:
    """(parent pid, start time) of a process, from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[1]), fields[19]
    except (OSError, IndexError, ValueError):
        return None


def _start_time(pid: int) -> str | None:
    stat = _stat(str(pid))
    return stat[1] if stat else None


def _is_ray(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read()
    except OSError:
        return False
    return any(mark in argv for mark in _RAY_MARKS)


def _descendants(root: int) -> dict[int, str]:
    """Ray's processes under ``root`` (any depth), with their start times."""
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(entry)) is not None:
            children.setdefault(stat[0], []).append((int(entry), stat[1]))
    found: dict[int, str] = {}
    todo = list(children.get(root, []))
    while todo:
        pid, started = todo.pop()
        if pid in found:
            continue
        if _is_ray(pid):
            found[pid] = started
        todo.extend(children.get(pid, []))
    return found


def _alive(pids: dict[int, str]) -> dict[int, str]:
    return {pid: t for pid, t in pids.items() if _start_time(pid) == t}


def _signal_all(pids: dict[int, str], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def watch(driver: int) -> None:
    me = os.getpid()
    seen: dict[int, str] = {}
    driver_started = _start_time(driver)
    while _start_time(driver) == driver_started and driver_started is not None:
        seen.update({p: t for p, t in _descendants(driver).items() if p != me})
        ready, _, _ = select.select([sys.stdin], [], [], POLL_S)
        if ready:
            if os.read(sys.stdin.fileno(), 1) == CLEAN_EXIT:
                return  # the driver shut Ray down itself
            break  # end of file: the driver died (a zombie keeps its /proc entry)
    left = _alive(seen)
    if not left:
        return
    _signal_all(left, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while (left := _alive(left)) and time.monotonic() < deadline:
        time.sleep(0.1)
    _signal_all(left, signal.SIGKILL)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the driver, not here
    watch(int(sys.argv[1]))
