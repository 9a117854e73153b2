"""Where each thread of a benchmark's processes is, sampled every ``period_s`` seconds.

A probe for questions a timer cannot answer, such as call 13D's: why did the first window of
the first searchlab search of a call take 6-9 s against Ray's 2.4 s? (Its main thread sat
in the first ``loss.backward()``, and two processes on two GPUs left it together.) py-spy
needs ptrace and a wheel the GPU machine lacks; this needs neither. ``start`` runs a daemon
thread that reads ``sys._current_frames()`` and appends one JSON line per thread and sample
to ``<folder>/<pid>.jsonl``: ``{"t": time.time(), "thread": name, "frames": [...]}``, the
innermost ``depth`` frames as ``file:line function``. ``vs_ray_asha.py --stacks FOLDER``
starts it in the benchmark's process and, through Ray's ``worker_process_setup_hook``, in
every Ray worker of both sides; ``stack_report.py`` reads the folder back against the run's
windows.

The thread holds the GIL only while it copies the frames (tens of microseconds per thread);
at 10 samples a second that is far below what the windows' own timing resolves.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

__all__ = [
    "FOLDER_VAR",
    "PERIOD_VAR",
    "THREAD_NAME",
    "read_samples",
    "start",
    "start_from_environment",
    "stop",
]

# The folder a Ray worker's setup hook samples into (set in the runtime environment).
FOLDER_VAR = "SEARCHLAB_BENCH_STACKS"
# Seconds between two samples there (default 0.1).
PERIOD_VAR = "SEARCHLAB_BENCH_STACKS_PERIOD_S"
_started: set[int] = set()  # the pids sampling already (a hook may run twice)
# Set by ``stop``. A plain list, not an Event: ``vs_ray_asha --stacks`` sends ``start`` to
# Ray's workers by value, with the globals it reads, and a lock cannot be pickled.
_stopping = [False]
THREAD_NAME = "searchlab-bench-stacks"


def start(
    folder: str | os.PathLike[str],
    *,
    period_s: float = 0.1,
    seconds: float = 120.0,
    depth: int = 14,
) -> threading.Thread | None:
    """Sample this process's threads into ``folder`` for ``seconds`` (None if it already does).
    Each sample is on disk before the next is taken, so a killed process loses at most one."""
    pid = os.getpid()
    if pid in _started:
        return None
    _started.add(pid)
    path = pathlib.Path(folder) / f"{pid}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    me = threading.current_thread  # the sampler leaves itself out

    def run() -> None:
        end = time.monotonic() + seconds
        # Written and flushed after every sample: a Ray worker ends by exiting or being
        # killed, and a buffer would lose its last windows, the ones a report often asks for.
        with path.open("a") as out:
            while time.monotonic() < end:
                time.sleep(period_s)
                if _stopping[0]:
                    break
                names = {t.ident: t.name for t in threading.enumerate()}
                now = time.time()
                own = me().ident
                lines = []
                for ident, frame in sys._current_frames().items():
                    if ident == own:
                        continue
                    stack = []
                    f: Any = frame
                    while f is not None and len(stack) < depth:
                        code = f.f_code
                        stack.append(
                            f"{pathlib.Path(code.co_filename).name}:{f.f_lineno} {code.co_name}"
                        )
                        f = f.f_back
                    thread = names.get(ident, str(ident))
                    lines.append(
                        json.dumps({"t": round(now, 4), "thread": thread, "frames": stack})
                    )
                out.write("".join(x + "\n" for x in lines))
                out.flush()

    thread = threading.Thread(target=run, name=THREAD_NAME, daemon=True)
    thread.start()
    return thread


def stop() -> bool:
    """End this process's sampling (the driver's, before Ray shuts down: a sampler still
    reading the frames of Ray's threads then made the driver exit with an error). True when
    it ended; then this process may sample again."""
    _stopping[0] = True
    samplers = [t for t in threading.enumerate() if t.name == THREAD_NAME]
    for thread in samplers:
        thread.join(timeout=5.0)
    if any(t.is_alive() for t in samplers):
        return False
    _started.discard(os.getpid())
    _stopping[0] = False
    return True


def start_from_environment() -> None:
    """Ray's ``worker_process_setup_hook``: sample this worker into ``$SEARCHLAB_BENCH_STACKS``
    (nothing when it is unset), every ``$SEARCHLAB_BENCH_STACKS_PERIOD_S`` seconds."""
    folder = os.environ.get(FOLDER_VAR)
    if folder:
        # For the worker's whole life: a reused trial actor may train for minutes.
        start(folder, period_s=float(os.environ.get(PERIOD_VAR) or 0.1), seconds=math.inf)


def read_samples(folder: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Every sample of ``folder``: (pid, sample), file by file. A line cut short by a killed
    process is skipped."""
    for path in sorted(pathlib.Path(folder).glob("*.jsonl")):
        pid = int(path.stem)
        for line in path.read_text().splitlines():
            try:
                yield pid, json.loads(line)
            except ValueError:
                continue
