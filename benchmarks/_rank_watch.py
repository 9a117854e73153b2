"""Watch each data-parallel rank's threads while it trains: their CPU time, and optionally
pin them to physical cores of their own, the same way on both sides of ``data_parallel.py``.

A 32x32 ResNet-18 rank is one serial chain of host work: its main thread and autograd's
thread take turns, ~1.0 core in all on either side (call 6A, ``benchmarks/README.md``). Its
rate follows how much CPU a batch takes and how fast the core it lands on runs.
``RankWatch`` samples every rank thread's CPU time (``/proc/<pid>/task/<tid>/stat``) every
``period_s``, so a run can say each thread's share of a core and the rank's CPU time per
batch over its timed window. With a plan (``data_parallel.py --pin-ranks K``) it also gives
rank r the CPUs of K physical cores of its own (the last ones) and the ranks' loader workers
every other CPU, so a comparison measures the two loops and not where the scheduler put them.
Nothing here changes how searchlab runs for a user.
"""

from __future__ import annotations

import os
import pathlib
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

SYS_CPU = pathlib.Path("/sys/devices/system/cpu")
PROC = pathlib.Path("/proc")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def physical_cores(cpus: Iterable[int], sys_cpu: pathlib.Path = SYS_CPU) -> list[list[int]]:
    """``cpus`` grouped by physical core (hardware threads of one core together), in order."""
    groups: dict[tuple[int, int], list[int]] = {}
    for cpu in sorted(cpus):
        topology = sys_cpu / f"cpu{cpu}" / "topology"
        try:
            key = (
                int((topology / "physical_package_id").read_text()),
                int((topology / "core_id").read_text()),
            )
        except (OSError, ValueError):
            key = (-1, cpu)  # no topology: every CPU a core of its own
        groups.setdefault(key, []).append(cpu)
    return sorted(groups.values())


def core_plan(cores: list[list[int]], ranks: int, per_rank: int) -> tuple[list[set[int]], set[int]]:
    """Each rank's CPUs (``per_rank`` whole physical cores, from the last ones: CPU 0 takes
    most of the kernel's housekeeping) and the CPUs left for the rest."""
    if per_rank < 1 or len(cores) < ranks * per_rank + 1:
        raise ValueError(
            f"{ranks} ranks x {per_rank} physical cores need {ranks * per_rank + 1} cores "
            f"(one left for the loaders); this machine has {len(cores)}"
        )
    last = len(cores)
    own = [
        {cpu for core in cores[last - (r + 1) * per_rank : last - r * per_rank] for cpu in core}
        for r in range(ranks)
    ]
    rest = {cpu for core in cores[: last - ranks * per_rank] for cpu in core}
    return own, rest


def classify(
    procs: dict[int, tuple[int, str]], is_rank: Callable[[str], bool]
) -> tuple[list[int], list[int]]:
    """Ranks (matching, parent not matching) and their children (loader workers) among
    ``procs`` (pid -> (parent pid, command line)), each in pid order."""
    me = os.getpid()  # this process's own command line may name the ranks' script
    matching = {pid for pid, (_, cmd) in procs.items() if is_rank(cmd) and pid != me}
    ranks = sorted(pid for pid in matching if procs[pid][0] not in matching)
    children = sorted(pid for pid in matching if procs[pid][0] in ranks)
    return ranks, children


def _processes(proc: pathlib.Path = PROC) -> dict[int, tuple[int, str]]:
    found: dict[int, tuple[int, str]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (entry / "stat").read_text()
            parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError):
            continue
        found[int(entry.name)] = (parent, cmd)
    return found


def _pin(pid: int, cpus: set[int]) -> int:
    """Every current thread of ``pid`` onto ``cpus`` (later threads inherit it); threads set."""
    done = 0
    try:
        tids = [int(t.name) for t in (PROC / str(pid) / "task").iterdir()]
    except OSError:
        return 0
    for tid in tids:
        try:
            if os.sched_getaffinity(tid) != cpus:
                os.sched_setaffinity(tid, cpus)
            done += 1
        except OSError:  # the thread ended
            pass
    return done


def _thread_times(pid: int) -> dict[int, tuple[str, float]]:
    """Each thread of ``pid``: its name and CPU seconds so far (user + system)."""
    out: dict[int, tuple[str, float]] = {}
    try:
        tasks = list((PROC / str(pid) / "task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(task.name)] = (
            stat[stat.index("(") + 1 : stat.rindex(")")],
            (int(fields[11]) + int(fields[12])) / CLOCK_TICKS,
        )
    return out


def thread_shares(
    samples: list[tuple[float, dict[int, tuple[str, float]]]], began: float, ended: float
) -> dict[str, Any]:
    """CPU of one process's threads between the samples nearest ``began`` and ``ended``:
    each busy thread's share of a core (name, share; > 0.5% only), and the total."""
    inside = [s for s in samples if began - 1.0 <= s[0] <= ended + 1.0]
    if len(inside) < 2:
        return {}
    first = min(inside, key=lambda s: abs(s[0] - began))
    last = min(inside, key=lambda s: abs(s[0] - ended))
    seconds = last[0] - first[0]
    if seconds <= 0:
        return {}
    shares = [
        (name, (cpu - first[1][tid][1]) / seconds)
        for tid, (name, cpu) in last[1].items()
        if tid in first[1]
    ]
    return {
        "seconds": seconds,
        "cpu_cores": sum(share for _, share in shares),
        "threads": [
            [name, round(share, 4)]
            for name, share in sorted(shares, key=lambda x: -x[1])
            if share > 0.005
        ],
    }


class RankWatch:
    """While running, every ``period_s``: samples the CPU time of each thread of the processes
    ``is_rank`` matches, and with a ``plan`` pins them (in the order they appear) to their
    cores and their children (loader workers) to the rest."""

    def __init__(
        self,
        is_rank: Callable[[str], bool],
        plan: tuple[list[set[int]], set[int]] | None = None,
        period_s: float = 0.25,
    ) -> None:
        self._is_rank = is_rank
        self._own, self._rest = plan if plan is not None else ([], set())
        self._period = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rank-watch", daemon=True)
        self._slot: dict[int, int] = {}  # rank pid -> index into the plan
        self.samples: dict[int, list[tuple[float, dict[int, tuple[str, float]]]]] = {}
        self.pinning: dict[str, Any] | None = (
            {"ranks": {}, "loader_workers": 0} if plan is not None else None
        )
        self.errors: list[str] = []

    def __enter__(self) -> RankWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def threads(self, began: float, ended: float) -> list[dict[str, Any]]:
        """Each rank's ``thread_shares`` over ``began..ended`` (Unix times), in rank order."""
        return [
            thread_shares(self.samples[pid], began, ended)
            for pid in sorted(self.samples, key=lambda p: self._slot.get(p, p))
        ]

    def _run(self) -> None:
        workers: set[int] = set()
        while not self._stop.is_set():
            try:
                ranks, children = classify(_processes(), self._is_rank)
                now = time.time()
                for pid in ranks:
                    if pid not in self._slot:
                        self._slot[pid] = len(self._slot)
                    slot = self._slot[pid]
                    if self.pinning is not None and slot < len(self._own):
                        if _pin(pid, self._own[slot]):
                            self.pinning["ranks"][str(pid)] = sorted(self._own[slot])
                    self.samples.setdefault(pid, []).append((now, _thread_times(pid)))
                if self.pinning is not None:
                    workers.update(pid for pid in children if _pin(pid, self._rest))
                    self.pinning["loader_workers"] = len(workers)
            except Exception as exc:  # a failed pass is reported, not fatal
                if len(self.errors) < 5:
                    self.errors.append(repr(exc))
            self._stop.wait(self._period)
