"""Watch each data-parallel rank's threads while it trains: their CPU time, and optionally
pin them to physical cores of their own, the same way on both sides of ``data_parallel.py``.

A 32x32 ResNet-18 rank is one serial chain of host work: its main thread and autograd's
thread take turns, ~1.0 core in all on either side (call 6A, ``benchmarks/README.md``). Its
rate follows how much CPU a batch takes and how fast the core it lands on runs.
``RankWatch`` samples every rank thread's CPU time (``/proc/<pid>/task/<tid>/stat``) every
``period_s``, so a run can say each thread's share of a core and the rank's CPU time per
batch over its timed window. A rank is a process whose command line matches and whose parent
is its side's launcher (torchrun, or Ray's raylet): nothing else that names the worker's
script, no orphaned loader worker, and never the watching process itself. With a plan
(``data_parallel.py --pin-ranks K``) it also gives rank r the CPUs of K physical cores of its
own (the last ones) and the ranks' loader workers every other CPU, so a comparison measures
the two loops and not where the scheduler put them.
Nothing here changes how searchlab runs for a user.
"""

from __future__ import annotations

import os
import pathlib
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from _host_watch import cpu_seconds, parse_stat, task_stats

SYS_CPU = pathlib.Path("/sys/devices/system/cpu")
PROC = pathlib.Path("/proc")
# A full scan of /proc once the ranks are known: often enough to see a late loader worker.
RESCAN_S = 2.0


class ThreadSample(NamedTuple):
    """One look at one process's threads: when it began, each thread's (name, CPU seconds so
    far), and when it ended (``read``: each thread was read between ``when`` and ``read``; 0
    where unknown). A plain ``(when, threads)`` pair reads the same."""

    when: float
    threads: dict[int, tuple[str, float]]
    read: float = 0.0


Samples = list[ThreadSample]


@dataclass(frozen=True)
class RankMatch:
    """How one side's ranks show in ``/proc``: their command line, and their parent's."""

    is_rank: Callable[[str], bool]
    is_launcher: Callable[[str], bool]


def physical_cores(cpus: Iterable[int], sys_cpu: pathlib.Path = SYS_CPU) -> list[list[int]]:
    """``cpus`` grouped by physical core (hardware threads of one core together), in order.

    A core is the set the kernel lists as one CPU's siblings (``core_cpus_list``, or
    ``thread_siblings_list`` on kernels before 5.7); a CPU without topology is a core alone.
    """
    groups: dict[str, list[int]] = {}
    for cpu in sorted(cpus):
        topology = sys_cpu / f"cpu{cpu}" / "topology"
        key = f"cpu{cpu}"
        for name in ("core_cpus_list", "thread_siblings_list"):
            try:
                key = (topology / name).read_text().strip()
                break
            except OSError:
                continue
        groups.setdefault(key, []).append(cpu)
    return sorted(groups.values())


def core_plan(cores: list[list[int]], ranks: int, per_rank: int) -> tuple[list[set[int]], set[int]]:
    """Each rank's CPUs (``per_rank`` whole physical cores, from the last ones: CPU 0 takes
    most of the kernel's housekeeping) and the CPUs left for the rest."""
    if per_rank < 1 or len(cores) < ranks * per_rank + 1:
        raise ValueError(
            f"--pin-ranks {per_rank}: {ranks} ranks x {per_rank} physical cores need "
            f"{ranks * per_rank + 1} cores (one left for the loaders); this machine has "
            f"{len(cores)}; pass a smaller K, or 0 to leave placement to the OS"
        )
    last = len(cores)
    own = [
        {cpu for core in cores[last - (r + 1) * per_rank : last - r * per_rank] for cpu in core}
        for r in range(ranks)
    ]
    rest = {cpu for core in cores[: last - ranks * per_rank] for cpu in core}
    return own, rest


def classify(procs: dict[int, tuple[int, str]], match: RankMatch) -> tuple[list[int], list[int]]:
    """Ranks (matching, with a launcher for a parent) and their children (loader workers)
    among ``procs`` (pid -> (parent pid, command line)), each in pid order."""
    me = os.getpid()  # this process's own command line may name the ranks' script

    def launched(pid: int) -> bool:
        parent = procs.get(procs[pid][0])
        return parent is not None and match.is_launcher(parent[1])

    ranks = sorted(
        pid for pid, (_, cmd) in procs.items() if pid != me and match.is_rank(cmd) and launched(pid)
    )
    children = sorted(pid for pid, (parent, _) in procs.items() if parent in ranks)
    return ranks, children


def _processes(proc: pathlib.Path = PROC) -> dict[int, tuple[int, str]]:
    found: dict[int, tuple[int, str]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            parent = int(parse_stat((entry / "stat").read_text())[1][1])
        except (OSError, ValueError, IndexError):
            continue
        found[int(entry.name)] = (parent, cmd)
    return found


def child_processes(pids: Iterable[int], proc: pathlib.Path = PROC) -> set[int]:
    """The child processes of ``pids`` (from each thread's ``children`` list)."""
    found: set[int] = set()
    for pid in pids:
        try:
            tasks = list((proc / str(pid) / "task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                found.update(int(c) for c in (task / "children").read_text().split())
            except (OSError, ValueError):
                continue
    return found


def thread_times(pid: int, proc: pathlib.Path = PROC) -> dict[int, tuple[str, float]]:
    """Each thread of ``pid``: its name and CPU seconds so far (utime + stime, the 14th and
    15th fields of its ``stat``; the name may hold spaces and parentheses)."""
    out: dict[int, tuple[str, float]] = {}
    for tid, (name, fields) in task_stats(pid, proc).items():
        try:
            out[tid] = (name, cpu_seconds(fields))
        except (ValueError, IndexError):  # a torn read
            continue
    return out


def window(samples: Samples, began: float, ended: float) -> tuple[ThreadSample, ...] | None:
    """The samples nearest ``began`` and ``ended`` among those within a second of them, which
    ``thread_shares`` counts between; None with fewer than two."""
    inside = [s for s in samples if began - 1.0 <= s[0] <= ended + 1.0]
    if len(inside) < 2:
        return None
    first = min(inside, key=lambda s: abs(s[0] - began))
    last = min(inside, key=lambda s: abs(s[0] - ended))
    return first, last


def thread_shares(samples: Samples, began: float, ended: float) -> dict[str, Any]:
    """CPU of one process's threads between the samples nearest ``began`` and ``ended``:
    each busy thread's share of a core (name, share; > 0.5% only), and the total.

    A thread that ended inside the window counts up to its last sample; one that started
    inside it counts from zero (all its CPU time is inside the window).
    """
    ends = window(samples, began, ended)
    if ends is None:
        return {}
    first, last = ends
    seconds = last[0] - first[0]
    if seconds <= 0:
        return {}
    latest: dict[int, tuple[str, float]] = {}
    for s in samples:
        if first[0] <= s[0] <= last[0]:
            latest.update(s[1])
    shares = [
        (name, (cpu - first[1].get(tid, (name, 0.0))[1]) / seconds)
        for tid, (name, cpu) in latest.items()
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


class RankWatch:
    """While running, every ``period_s``: samples the CPU time of each thread of one side's
    ``ranks`` rank processes, and with a ``plan`` pins them (in the order they appear) to
    their cores and their children (loader workers) to the rest.

    All of ``/proc`` is scanned until the ranks are found, then every ``RESCAN_S``; in
    between only the ranks' own entries are read, to keep the watch light in a process that
    also runs the search's driver.
    """

    def __init__(
        self,
        match: RankMatch,
        ranks: int,
        plan: tuple[list[set[int]], set[int]] | None = None,
        period_s: float = 0.25,
    ) -> None:
        if plan is not None and len(plan[0]) != ranks:
            raise ValueError(f"a plan for {len(plan[0])} ranks, but {ranks} ranks to watch")
        self._match = match
        self._ranks = ranks
        self._own, self._rest = plan if plan is not None else ([], set())
        self._period = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rank-watch", daemon=True)
        self._slot: dict[int, int] = {}  # rank pid -> the order it appeared in
        self.samples: dict[int, Samples] = {}
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
        if len(self._slot) != self._ranks:
            self._error(f"saw {len(self._slot)} rank processes, expected {self._ranks}")

    def pids(self) -> list[int]:
        """The rank processes seen so far, in the order they appeared (callable from any
        thread: the copy is made in one step)."""
        slots = dict(self._slot)
        return sorted(slots, key=slots.__getitem__)

    def threads(self, began: float, ended: float) -> list[dict[str, Any]]:
        """Each rank's ``thread_shares`` over ``began..ended`` (Unix times) with its pid, in
        the order the ranks appeared (not their rank numbers: Ray starts its actors in any
        order; the ``pt_autograd_N`` thread names the rank's device)."""
        return [
            {"pid": pid, **thread_shares(self.samples.get(pid, []), began, ended)}
            for pid in self.pids()
        ]

    def _error(self, message: str) -> None:
        if len(self.errors) < 5:
            self.errors.append(message)
        elif len(self.errors) == 5:
            self.errors.append("(later errors left out)")

    def _run(self) -> None:
        workers: set[int] = set()
        scanned = 0.0
        while not self._stop.is_set():
            try:
                if len(self._slot) < self._ranks or time.monotonic() - scanned > RESCAN_S:
                    scanned = time.monotonic()
                    ranks, children = classify(_processes(), self._match)
                    for pid in ranks:
                        if pid not in self._slot:
                            if len(self._slot) >= self._ranks:
                                self._error(f"a rank process beyond the {self._ranks} expected")
                                continue
                            self._slot[pid] = len(self._slot)
                else:
                    children = sorted(child_processes(self._slot))
                for pid, slot in self._slot.items():
                    if self.pinning is not None and _pin(pid, self._own[slot]):
                        self.pinning["ranks"][str(pid)] = sorted(self._own[slot])
                    when = time.time()
                    threads = thread_times(pid)
                    if threads:  # nothing: the process has ended
                        look = ThreadSample(when, threads, time.time())
                        self.samples.setdefault(pid, []).append(look)
                if self.pinning is not None:
                    workers.update(pid for pid in children if _pin(pid, self._rest))
                    self.pinning["loader_workers"] = len(workers)
            except Exception as exc:  # a failed pass is reported, not fatal
                self._error(repr(exc))
            self._stop.wait(self._period)
