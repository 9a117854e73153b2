"""What a benchmark's Ray workers hold and do: the host's memory, each worker's, the GPUs',
and the CPU the other trial processes use while one trains.

``MemoryWatch`` samples in a thread while running (``with MemoryWatch() as watch:``), from
``/proc``. Every ``memory_every_s``, a full look: every process, grouped under the Ray
worker it runs in (a process titled ``ray::...`` under no other such process; its
descendants, a trial's data-loader workers among them, which fork with the same title, are
counted in it), the host's memory in use (``MemTotal`` less ``MemAvailable``), each busy
worker's proportional set size (``Pss`` of ``smaps_rollup``: a page shared by N processes
counts 1/N in each, so the sum does not count torch's and CUDA's shared libraries once per
process, as RSS would), and, where ``gpu_used`` is given, the GPUs' memory in use. Every
``period_s`` between, only the CPU seconds of the pids the last full look found. An idle
worker (``ray::IDLE``) is counted, not read: ``smaps_rollup`` walks a process's memory map
under its lock (~3 ms a worker on a 2-core laptop). ``summary`` says what a look cost.

``summary`` gives the memory peaks over the run and the host's rise over what it held when
the watch began. ``beside(windows)`` gives, for each training window long enough to
measure, the cores of the process that trained it (the busiest) and of every other Ray
worker: with standby (``SEARCHLAB_STANDBY``), two or three trial processes share each
GPU, and the ones waiting for their turn should use none.
"""

from __future__ import annotations

import bisect
import os
import pathlib
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

PROC = pathlib.Path("/proc")
GIB = 1024**3
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
IDLE = "ray::IDLE"


def host_used(proc: pathlib.Path = PROC) -> int:
    """Bytes of host memory in use: ``MemTotal`` less ``MemAvailable`` (``/proc/meminfo``)."""
    fields: dict[str, int] = {}
    for line in (proc / "meminfo").read_text().splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            fields[name] = int(parts[0]) * 1024
    return fields.get("MemTotal", 0) - fields.get("MemAvailable", 0)


def _pss(pid_dir: pathlib.Path) -> int:
    """A process's proportional set size in bytes (0 if unreadable or gone)."""
    try:
        for line in (pid_dir / "smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


@dataclass
class Worker:
    """One Ray worker process: its title, CPU seconds so far (its own and its reaped
    children's), proportional set size (where read) and the pids counted in it: itself and
    its descendants, a trial's data-loader workers among them (forked, they show the
    worker's ``ray::`` title too)."""

    title: str
    cpu: float = 0.0
    pss: int = 0
    pids: tuple[int, ...] = ()


def _cpu_seconds(stat: list[str]) -> float:
    """utime, stime, cutime and cstime (fields 14-17 of ``/proc/<pid>/stat``, 11-14 after
    the name): a child's time moves into its parent's once it ends and is reaped."""
    return sum(int(x) for x in stat[11:15]) / CLOCK_TICKS if len(stat) > 14 else 0.0


def _stat(pid_dir: pathlib.Path) -> list[str] | None:
    try:
        return (pid_dir / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def ray_workers(proc: pathlib.Path = PROC, *, memory: bool = True) -> dict[int, Worker]:
    """Each Ray worker process (title ``ray::...``, under no other such process) by pid, with
    its descendants' CPU seconds (and, with ``memory``, proportional set size; not read for
    ``ray::IDLE`` workers) added."""
    titles: dict[int, str] = {}
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        pid = int(pid_dir.name)
        try:
            cmdline = (pid_dir / "cmdline").read_bytes()
        except OSError:
            continue
        stat = _stat(pid_dir)
        if stat is None:
            continue
        title = cmdline.split(b"\0", 1)[0].decode(errors="replace").strip()
        if title.startswith("ray::"):
            titles[pid] = title
        parents[pid] = int(stat[1])
        cpu[pid] = _cpu_seconds(stat)

    def top(pid: int) -> int | None:
        """The outermost ``ray::`` process at or above ``pid`` (None: under none)."""
        found, seen = None, set()
        while pid and pid in parents and pid not in seen:
            seen.add(pid)
            if pid in titles:
                found = pid
            pid = parents[pid]
        return found

    groups: dict[int, list[int]] = {}
    for pid in parents:
        owner = top(pid)
        if owner is not None:
            groups.setdefault(owner, []).append(pid)
    out = {}
    for owner, pids in groups.items():
        worker = Worker(titles[owner], sum(cpu[p] for p in pids), pids=tuple(sorted(pids)))
        if memory and worker.title != IDLE:
            worker.pss = sum(_pss(proc / str(p)) for p in pids)
        out[owner] = worker
    return out


def title_of(pid_dir: pathlib.Path) -> str | None:
    """A process's title (its command line's first word), None if gone."""
    try:
        return (
            pid_dir.joinpath("cmdline")
            .read_bytes()
            .split(b"\0", 1)[0]
            .decode(errors="replace")
            .strip()
        )
    except OSError:
        return None


def cpu_of(workers: dict[int, Worker], proc: pathlib.Path = PROC) -> dict[int, float]:
    """Each worker's CPU seconds now, read from the pids a full look found in it (a child
    gone since counts nothing; its time is in its parent's once reaped). A worker whose own
    process is gone is left out: counted as 0, its whole life's CPU would read as a negative
    rate in every window up to the next full look (Ray ends idle workers it does not need;
    call 19A's auto run read -5 cores "beside" some windows)."""
    out = {}
    for owner, worker in workers.items():
        own = _stat(proc / str(owner))
        if own is None:
            continue
        stats = (_stat(proc / str(p)) for p in worker.pids if p != owner)
        out[owner] = _cpu_seconds(own) + sum(_cpu_seconds(st) for st in stats if st is not None)
    return out


@dataclass
class Sample:
    """One look: when, each worker's title and CPU seconds, and (every ``memory_every_s``)
    the host's and GPUs' memory in use and each busy worker's PSS (``memory`` empty
    otherwise)."""

    when: float
    titles: dict[int, str]
    cpu: dict[int, float]
    memory: dict[str, Any] = field(default_factory=dict)
    cost_s: float = 0.0  # how long the look took


class MemoryWatch:
    """Memory peaks and CPU beside each training window, over a ``with`` block."""

    def __init__(
        self,
        period_s: float = 0.05,
        memory_every_s: float = 1.0,
        gpu_used: Callable[[], int] | None = None,
        proc: pathlib.Path = PROC,
    ) -> None:
        self.period_s = period_s
        self.memory_every_s = memory_every_s
        self.gpu_used = gpu_used
        self.proc = proc
        self.samples: list[Sample] = []
        self._workers: dict[int, Worker] | None = None
        self._last_memory = -float("inf")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self, *, memory: bool | None = None) -> Sample:
        """Look once: the workers' CPU seconds, from the pids the last full look found; a
        full look (every process, each busy worker's PSS, the host's and GPUs' memory)
        where ``memory``, or (None) where it is time to."""
        began = time.perf_counter()
        when = time.time()
        if memory is None:
            memory = when - self._last_memory >= self.memory_every_s
        if memory or self._workers is None:
            self._workers = ray_workers(self.proc, memory=memory)
            cpu = {p: w.cpu for p, w in self._workers.items()}
            titles = {p: w.title for p, w in self._workers.items()}
        else:
            cpu = cpu_of(self._workers, self.proc)
            # Read again: an idle worker Ray hands a trial's actor takes its title then.
            titles = {p: title_of(self.proc / str(p)) or self._workers[p].title for p in cpu}
        row = Sample(when, titles, cpu)
        if memory:
            self._last_memory = when
            row.memory = {
                "host": host_used(self.proc),
                "pss": {p: w.pss for p, w in self._workers.items()},
            }
            if self.gpu_used is not None:
                row.memory["gpu"] = self.gpu_used()
        row.cost_s = time.perf_counter() - began
        return row

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self.samples.append(self.sample())

    def __enter__(self) -> MemoryWatch:
        self.samples.append(self.sample(memory=True))
        self._thread = threading.Thread(target=self._loop, name="memory-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.samples.append(self.sample(memory=True))

    def summary(self) -> dict[str, Any]:
        """Peaks in GiB: the host's memory in use and its rise over the first sample, the
        Ray workers' summed PSS (and the most workers alive at once), the largest busy
        worker's, and the GPUs' memory in use."""
        looks = [s for s in self.samples if s.memory]
        if not looks:
            return {}
        host = [s.memory["host"] for s in looks]
        out: dict[str, Any] = {
            "host_used_peak_gib": max(host) / GIB,
            "host_rise_peak_gib": (max(host) - host[0]) / GIB,
            "workers_pss_peak_gib": max(sum(s.memory["pss"].values()) for s in looks) / GIB,
            "workers_peak": max(len(s.titles) for s in self.samples),
            "trial_worker_pss_max_gib": max(
                (v for s in looks for v in s.memory["pss"].values()), default=0
            )
            / GIB,
            "samples": len(self.samples),
            "memory_samples": len(looks),
            # what a look cost the process that samples (the benchmark's driver)
            "look_ms_median": 1e3 * statistics.median(s.cost_s for s in self.samples),
            "full_look_ms_median": 1e3 * statistics.median(s.cost_s for s in looks),
        }
        if any("gpu" in s.memory for s in looks):
            out["gpu_used_peak_gib"] = max(s.memory.get("gpu", 0) for s in looks) / GIB
        return out

    def beside(self, windows: Sequence[dict[str, Any]], min_span: int = 3) -> dict[str, Any]:
        """For each window (``w_start``, ``w_end``: wall-clock seconds) that spans at least
        ``min_span`` sampling periods: the cores of its busiest worker (the one training it),
        of every other busy worker together (the trial processes waiting their turn) and of
        Ray's idle workers (``ray::IDLE``: Ray starts and ends them itself); medians, the
        others' mean and largest, how many windows were measured, and ``per_window``: each
        measured window's start with its trainer's, the others' and the idle workers' cores
        (to set against its rate)."""
        times = [s.when for s in self.samples]
        trainer, others, idle, per_window = [], [], [], []
        for w in windows:
            first = bisect.bisect_left(times, w["w_start"])
            last = bisect.bisect_right(times, w["w_end"]) - 1
            if last - first < min_span:
                continue
            a, b = self.samples[first], self.samples[last]
            span = b.when - a.when
            used = {p: (b.cpu[p] - a.cpu[p]) / span for p in b.cpu if p in a.cpu}
            # Idle at both ends: a worker that took a trial's actor during the window builds it.
            busy = {p: v for p, v in used.items() if (a.titles[p], b.titles.get(p)) != (IDLE, IDLE)}
            if not busy:
                continue
            busiest = max(busy, key=busy.__getitem__)
            trainer.append(busy[busiest])
            others.append(sum(v for p, v in busy.items() if p != busiest))
            idle.append(sum(v for p, v in used.items() if p not in busy))
            per_window.append([w["w_start"], *(round(x[-1], 3) for x in (trainer, others, idle))])
        if not others:
            return {"windows": 0}
        return {
            "windows": len(others),
            "trainer_cores_median": statistics.median(trainer),
            "others_cores_median": statistics.median(others),
            "others_cores_mean": statistics.mean(others),
            "others_cores_max": max(others),
            "idle_workers_cores_median": statistics.median(idle),
            "per_window": per_window,
        }


def gpu_memory_used(run: Callable[..., Any] = subprocess.run) -> Callable[[], int] | None:
    """Bytes in use on every GPU, every process's, read by ``nvidia-smi`` (NVML), as a
    callable; None where ``nvidia-smi`` is missing or fails. Not through torch: asking CUDA
    would give the benchmark's driver a CUDA context (~0.5 GiB) on every GPU, counted in the
    figure and in what standby's memory rules see free (calls 18A-18C carried one)."""
    command = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
    if shutil.which(command[0]) is None:
        return None

    def used() -> int:
        out = run(command, capture_output=True, text=True, timeout=10, check=True).stdout
        return sum(int(line) for line in out.split()) * 2**20  # MiB per GPU

    try:
        used()
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    return used
