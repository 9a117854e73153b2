"""How much memory a benchmark's run holds: the host's, its Ray workers', the GPUs'.

``MemoryWatch`` samples, every ``period_s`` in a thread while running (``with
MemoryWatch() as watch:``), from ``/proc``: the host's memory in use (``MemTotal`` less
``MemAvailable``), and each Ray worker process's proportional set size (``Pss`` of
``smaps_rollup``: a page shared by N processes counts 1/N in each, so the sum does not count
torch's and CUDA's shared libraries once per process, as RSS would), with the worker's
title (``ray::<Actor>``, ``ray::IDLE``) and its data-loader children summed into it; and,
where ``gpu_used`` is given, the GPUs' memory in use. ``summary`` gives the peaks over
the run and the host's rise over what it held when the watch began.

Standby (``SEARCHLAB_STANDBY``) keeps two or three trial processes per GPU where one ran:
this is how much host memory that costs.
"""

from __future__ import annotations

import pathlib
import threading
import time
from collections.abc import Callable
from typing import Any

PROC = pathlib.Path("/proc")
GIB = 1024**3


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


def ray_workers(proc: pathlib.Path = PROC) -> dict[int, tuple[str, int]]:
    """Each Ray worker process (title ``ray::...``) by pid: its title and its proportional
    set size with its descendants' (a trial's data-loader workers) added."""
    titles: dict[int, str] = {}
    parents: dict[int, int] = {}
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        pid = int(pid_dir.name)
        try:
            cmdline = (pid_dir / "cmdline").read_bytes()
            stat = (pid_dir / "stat").read_text()
        except OSError:
            continue
        title = cmdline.split(b"\0", 1)[0].decode(errors="replace").strip()
        if title.startswith("ray::"):
            titles[pid] = title
        parents[pid] = int(stat.rsplit(")", 1)[1].split()[1])
    out = {pid: (title, _pss(proc / str(pid))) for pid, title in titles.items()}
    for pid, parent in parents.items():
        if pid in titles:
            continue
        owner = parent
        while owner and owner not in titles and owner in parents:
            owner = parents[owner]
        if owner in out:
            title, pss = out[owner]
            out[owner] = (title, pss + _pss(proc / str(pid)))
    return out


class MemoryWatch:
    """Peaks of the host's memory, its Ray workers' and the GPUs' over a ``with`` block."""

    def __init__(
        self,
        period_s: float = 0.25,
        gpu_used: Callable[[], int] | None = None,
        proc: pathlib.Path = PROC,
    ) -> None:
        self.period_s = period_s
        self.gpu_used = gpu_used
        self.proc = proc
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> dict[str, Any]:
        workers = ray_workers(self.proc)
        row: dict[str, Any] = {
            "when": time.time(),
            "host": host_used(self.proc),
            "workers": {pid: pss for pid, (_, pss) in workers.items()},
            "titles": {pid: title for pid, (title, _) in workers.items()},
        }
        if self.gpu_used is not None:
            row["gpu"] = self.gpu_used()
        return row

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self.samples.append(self.sample())

    def __enter__(self) -> MemoryWatch:
        self.samples.append(self.sample())
        self._thread = threading.Thread(target=self._loop, name="memory-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.samples.append(self.sample())

    def summary(self) -> dict[str, Any]:
        """Peaks in GiB: the host's memory in use and its rise over the first sample, the
        Ray workers' summed PSS (and the most workers alive at once), the largest single
        trial worker's (titles other than ``ray::IDLE``), and the GPUs' memory in use."""
        if not self.samples:
            return {}
        first = self.samples[0]
        trial = [
            pss
            for s in self.samples
            for pid, pss in s["workers"].items()
            if s["titles"].get(pid) != "ray::IDLE"
        ]
        out: dict[str, Any] = {
            "host_used_peak_gib": max(s["host"] for s in self.samples) / GIB,
            "host_rise_peak_gib": (max(s["host"] for s in self.samples) - first["host"]) / GIB,
            "workers_pss_peak_gib": max(sum(s["workers"].values()) for s in self.samples) / GIB,
            "workers_peak": max(len(s["workers"]) for s in self.samples),
            "trial_worker_pss_max_gib": max(trial, default=0) / GIB,
            "samples": len(self.samples),
        }
        if any("gpu" in s for s in self.samples):
            out["gpu_used_peak_gib"] = max(s.get("gpu", 0) for s in self.samples) / GIB
        return out


def cuda_used() -> Callable[[], int] | None:
    """Bytes in use on every visible GPU, every process's (``torch.cuda.mem_get_info``), as a
    callable; None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None

    def used() -> int:
        total = 0
        for index in range(torch.cuda.device_count()):
            free, whole = torch.cuda.mem_get_info(index)
            total += whole - free
        return total

    return used
