"""What the rest of the host does while a benchmark's ranks train: every process's CPU,
the CPUs' clock and the time the hypervisor took (steal), sampled from ``/proc``.

A 32x32 ResNet-18 data-parallel rank is one core of serial host work (``_rank_watch.py``), so
its rate follows how fast that core runs: how many other cores are busy (a package's turbo
clock falls as more of its cores work), what else shares the core's caches, and, on a virtual
machine, how much of it the hypervisor takes. ``HostWatch`` samples, every ``period_s``:
``/proc/stat`` (every CPU's busy, idle and steal time), each process's CPU time and name, and
each CPU's clock (``scaling_cur_freq``, else ``/proc/cpuinfo``; on many virtual machines both
read the nominal clock and say nothing). ``HostWatch.summary`` gives, over a window, the
host's busy cores by group (the ranks, their loader workers, this process, then other
processes by name) and the clock the CPUs ran at, weighted by how busy each was.
"""

from __future__ import annotations

import functools
import itertools
import os
import pathlib
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

PROC = pathlib.Path("/proc")
SYS_CPU = pathlib.Path("/sys/devices/system/cpu")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

# /proc/stat's CPU columns: user nice system idle iowait irq softirq steal (guest time is
# already in user and nice).
_IDLE_COLUMNS = (3, 4)
_STEAL_COLUMN = 7


@dataclass
class HostSample:
    """One look at the host: when, each CPU's (busy, idle, steal) seconds so far, each
    process's (name, parent, CPU seconds so far, start in seconds after boot), each CPU's
    clock in MHz, for the watched pids each thread's (CPU it last ran on, CPU seconds so
    far), when the machine booted (Unix time), and when the look ended (``read``: each
    reading was taken between ``when`` and ``read``; 0 where unknown)."""

    when: float
    cpus: dict[int, tuple[float, float, float]]
    processes: dict[int, tuple[str, int, float, float]]
    mhz: dict[int, float] = field(default_factory=dict)
    threads: dict[int, dict[int, tuple[int, float]]] = field(default_factory=dict)
    boot: float = 0.0
    read: float = 0.0


def cpu_times(proc: pathlib.Path = PROC) -> dict[int, tuple[float, float, float]]:
    """Each CPU's busy, idle and steal seconds since boot, from ``/proc/stat``."""
    out: dict[int, tuple[float, float, float]] = {}
    for line in (proc / "stat").read_text().splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        ticks = [int(x) for x in rest.split()[:8]]
        ticks += [0] * (8 - len(ticks))
        idle = sum(ticks[i] for i in _IDLE_COLUMNS)
        steal = ticks[_STEAL_COLUMN]
        busy = sum(ticks) - idle - steal
        out[int(name[3:])] = (busy / CLOCK_TICKS, idle / CLOCK_TICKS, steal / CLOCK_TICKS)
    return out


@functools.cache
def boot_time(proc: pathlib.Path = PROC) -> float:
    """When the machine booted, in Unix seconds (``btime`` of ``/proc/stat``; 0 if missing).
    Read once per ``proc`` folder: it does not change while the machine runs."""
    for line in (proc / "stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


def parse_stat(text: str) -> tuple[str, list[str]]:
    """A ``stat`` line's name (between the first ``(`` and the last ``)``: a name may hold
    spaces and parentheses) and its fields from the third on: ``fields[n - 3]`` is field n."""
    return text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()


def cpu_seconds(fields: list[str]) -> float:
    """utime + stime (fields 14 and 15) of ``parse_stat``'s fields, in seconds."""
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def task_stats(pid: int, proc: pathlib.Path = PROC) -> dict[int, tuple[str, list[str]]]:
    """Each thread of ``pid``: ``parse_stat`` of its ``stat`` (threads that end while being
    read are left out)."""
    out: dict[int, tuple[str, list[str]]] = {}
    try:
        tasks = list((proc / str(pid) / "task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            out[int(task.name)] = parse_stat((task / "stat").read_text())
        except (OSError, ValueError):
            continue
    return out


def process_times(proc: pathlib.Path = PROC) -> dict[int, tuple[str, int, float, float]]:
    """Every process's name (its ``comm``), parent, CPU seconds so far (all its threads,
    utime + stime) and start in seconds after boot (which tells a reused pid apart)."""
    out: dict[int, tuple[str, int, float, float]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            name, fields = parse_stat((entry / "stat").read_text())
            out[int(entry.name)] = (
                name,
                int(fields[1]),
                cpu_seconds(fields),
                int(fields[19]) / CLOCK_TICKS,
            )
        except (OSError, ValueError, IndexError):  # it ended, or a torn read
            continue
    return out


def cpu_mhz(
    cpus: Iterable[int], sys_cpu: pathlib.Path = SYS_CPU, proc: pathlib.Path = PROC
) -> dict[int, float]:
    """Each CPU's current clock in MHz: cpufreq's ``scaling_cur_freq`` (kHz), else the
    ``cpu MHz`` lines of ``/proc/cpuinfo``; empty where neither says."""
    out: dict[int, float] = {}
    for cpu in cpus:
        try:
            out[cpu] = int((sys_cpu / f"cpu{cpu}/cpufreq/scaling_cur_freq").read_text()) / 1e3
        except (OSError, ValueError):
            break
    else:
        return out
    out = {}
    try:
        text = (proc / "cpuinfo").read_text()
    except OSError:
        return out
    cpu = -1
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "processor":
            cpu = int(value)
        elif key == "cpu MHz" and cpu >= 0:
            out[cpu] = float(value)
    return out


def thread_places(pid: int, proc: pathlib.Path = PROC) -> dict[int, tuple[int, float]]:
    """Each thread of ``pid``: the CPU it last ran on (``stat``'s 39th field) and its CPU
    seconds so far."""
    out: dict[int, tuple[int, float]] = {}
    for tid, (_, fields) in task_stats(pid, proc).items():
        try:
            out[tid] = (int(fields[36]), cpu_seconds(fields))
        except (ValueError, IndexError):  # a torn read
            continue
    return out


def numa_nodes(sys_cpu: pathlib.Path = SYS_CPU) -> dict[int, int]:
    """Each CPU's NUMA node (the ``nodeN`` entry in its sysfs folder); empty where unknown."""
    out: dict[int, int] = {}
    for entry in sys_cpu.glob("cpu[0-9]*"):
        for node in entry.glob("node[0-9]*"):
            out[int(entry.name[3:])] = int(node.name[4:])
    return out


def sample(
    focus: Iterable[int] = (), proc: pathlib.Path = PROC, sys_cpu: pathlib.Path = SYS_CPU
) -> HostSample:
    when = time.time()
    cpus = cpu_times(proc)
    look = HostSample(
        when,
        cpus,
        process_times(proc),
        cpu_mhz(cpus, sys_cpu, proc),
        {pid: thread_places(pid, proc) for pid in focus},
        boot_time(proc),
    )
    look.read = time.time()
    return look


def placement(
    samples: list[HostSample], pid: int, nodes: dict[int, int], busy_share: float = 0.1
) -> dict[str, float]:
    """Where ``pid``'s busy threads ran over ``samples``: the share of their CPU time that
    each NUMA node (``node0``...; ``cpuN`` where nodes are unknown) took, each interval's
    CPU time put on the CPU its thread was on at the interval's end. Threads that used less
    than ``busy_share`` of a core in an interval are left out; a thread new in an interval
    counts from zero."""
    used: dict[str, float] = {}
    for before, after in itertools.pairwise(samples):
        seconds = after.when - before.when
        if pid not in before.threads:  # not watched yet: no start to count from
            continue
        old = before.threads[pid]
        for tid, (cpu, total) in after.threads.get(pid, {}).items():
            spent = total - old.get(tid, (cpu, 0.0))[1]  # a new thread counts from zero
            if seconds > 0 and spent >= busy_share * seconds:
                where = f"node{nodes[cpu]}" if cpu in nodes else f"cpu{cpu}"
                used[where] = used.get(where, 0.0) + spent
    whole = sum(used.values())
    return {k: round(v / whole, 3) for k, v in sorted(used.items())} if whole else {}


def _nearest(samples: list[HostSample], when: float) -> HostSample:
    return min(samples, key=lambda s: abs(s.when - when))


def _process_spans(
    samples: list[HostSample], first: HostSample, last: HostSample
) -> dict[tuple[int, float], tuple[str, float, float]]:
    """Each process seen from ``first`` to ``last`` (a pid and its start, so a reused pid is
    another process): its name and its CPU seconds at the window's start and end.

    It ends at its last sample in the window (a process that exited inside it counts up to
    then). It starts at ``first``'s reading; one that started inside the window starts at
    zero; one that was running but not read at ``first`` starts at its first reading.
    """
    spans: dict[tuple[int, float], tuple[str, float, float]] = {}
    for s in samples:
        if not first.when <= s.when <= last.when:
            continue
        for pid, (name, _, cpu, start) in s.processes.items():
            key = (pid, start)
            if key in spans:
                spans[key] = (name, spans[key][1], cpu)
            elif s is first or s.boot + start < first.when:
                spans[key] = (name, cpu, cpu)
            else:
                spans[key] = (name, 0.0, cpu)
    return spans


def summarise(
    samples: list[HostSample],
    began: float,
    ended: float,
    groups: dict[str, set[int]],
    top: int = 8,
) -> dict[str, Any]:
    """The host between the samples nearest ``began`` and ``ended`` (Unix times).

    ``groups`` names sets of pids (e.g. the ranks, their loader workers, this process);
    every other process counts under its name. Gives busy and steal cores (host-wide), each
    group's cores and the ``top`` busiest names, and the clock: the mean over CPUs and the
    mean weighted by each CPU's busy time (where the work ran), from the window's samples.
    """
    if len(samples) < 2:
        return {}
    first, last = _nearest(samples, began), _nearest(samples, ended)
    seconds = last.when - first.when
    if seconds <= 0:
        return {}
    busy_by_cpu = {
        cpu: (last.cpus[cpu][0] - b0) / seconds
        for cpu, (b0, _, _) in first.cpus.items()
        if cpu in last.cpus
    }
    steal = sum(
        last.cpus[cpu][2] - s0 for cpu, (_, _, s0) in first.cpus.items() if cpu in last.cpus
    )
    used: dict[str, float] = {}
    for (pid, _), (name, began_cpu, ended_cpu) in _process_spans(samples, first, last).items():
        # Kernel threads rename themselves by their work (``kworker/u8:3-events``): they
        # count by their kind.
        group = next((g for g, pids in groups.items() if pid in pids), name.split("/")[0])
        used[group] = used.get(group, 0.0) + max(ended_cpu - began_cpu, 0.0) / seconds
    inside = [s for s in samples if first.when <= s.when <= last.when and s.mhz]
    clock: dict[str, Any] = {}
    if inside:
        per_cpu: dict[int, list[float]] = {}
        for s in inside:
            for cpu, mhz in s.mhz.items():
                per_cpu.setdefault(cpu, []).append(mhz)
        means = {cpu: sum(v) / len(v) for cpu, v in per_cpu.items()}
        weight = sum(busy_by_cpu.get(cpu, 0.0) for cpu in means)
        clock = {
            "mhz_mean": sum(means.values()) / len(means),
            "mhz_busy_weighted": (
                sum(m * busy_by_cpu.get(cpu, 0.0) for cpu, m in means.items()) / weight
                if weight > 0
                else None
            ),
            "mhz_min": min(min(v) for v in per_cpu.values()),
            "mhz_max": max(max(v) for v in per_cpu.values()),
        }
    named = {g: round(used.get(g, 0.0), 3) for g in groups}
    others = sorted(((g, c) for g, c in used.items() if g not in groups), key=lambda x: -x[1])
    return {
        "seconds": seconds,
        "cpus": len(busy_by_cpu),
        "busy_cores": round(sum(busy_by_cpu.values()), 3),
        "steal_cores": round(steal / seconds, 3),
        "cpus_over_half_busy": sum(1 for b in busy_by_cpu.values() if b > 0.5),
        "groups": named,
        "top_others": [[g, round(c, 3)] for g, c in others[:top] if c > 0.005],
        **clock,
    }


class HostWatch:
    """Samples the host every ``period_s`` in a thread while running (``with HostWatch():``),
    and where the threads of the pids that ``focus()`` gives ran (the ranks, once known)."""

    def __init__(
        self,
        period_s: float = 1.0,
        focus: Callable[[], Iterable[int]] = tuple,
        sampler: Callable[[Iterable[int]], HostSample] = sample,
    ) -> None:
        self._period = period_s
        self._focus = focus
        self._sampler = sampler
        self._nodes = numa_nodes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="host-watch", daemon=True)
        self.samples: list[HostSample] = []
        self.errors: list[str] = []

    def __enter__(self) -> HostWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self, began: float, ended: float, ranks: Iterable[int] = ()) -> dict[str, Any]:
        """``summarise`` with three groups: this process, the ``ranks`` and their children
        (the loader workers) as any sample of the window saw them."""
        rank_pids = set(ranks)
        children = {
            pid
            for s in self.samples
            if began - self._period <= s.when <= ended + self._period
            for pid, (_, parent, _, _) in s.processes.items()
            if parent in rank_pids
        }
        groups = {"this process": {os.getpid()}, "ranks": rank_pids, "loader workers": children}
        out = summarise(self.samples, began, ended, groups)
        inside = [s for s in self.samples if began <= s.when <= ended]
        if out and self._nodes:
            out["rank_numa_nodes"] = {
                str(pid): placement(inside, pid, self._nodes) for pid in sorted(rank_pids)
            }
        return out

    def _run(self) -> None:
        while True:
            try:
                self.samples.append(self._sampler(self._focus()))
            except Exception as exc:  # a failed look is reported, not fatal
                if len(self.errors) < 5:
                    self.errors.append(repr(exc))
            if self._stop.wait(self._period):
                break
        try:  # one last look, so a window that ends at the exit is covered
            self.samples.append(self._sampler(self._focus()))
        except Exception as exc:
            if len(self.errors) < 5:
                self.errors.append(repr(exc))
