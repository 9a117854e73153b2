"""``benchmarks/_host_watch.py``: the host's busy cores by group, the clock, and where a
rank's threads ran, from ``/proc`` and ``/sys``."""

from __future__ import annotations

import hashlib
import os
import pathlib
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from _host_watch import (
    CLOCK_TICKS,
    HostSample,
    HostWatch,
    _nearest,
    boot_time,
    cpu_mhz,
    cpu_times,
    numa_nodes,
    placement,
    process_times,
    summarise,
    thread_places,
)
from cpu_bounds import cpu_bounds


def _ticks(seconds: float) -> int:
    return round(seconds * CLOCK_TICKS)


def test_cpu_times_split_busy_idle_and_stolen_time(tmp_path: pathlib.Path) -> None:
    t = _ticks
    (tmp_path / "stat").write_text(
        "cpu  9 9 9 9 9 9 9 9 0 0\n"  # the sum over CPUs: not a CPU
        # user nice system idle iowait irq softirq steal guest guest_nice
        f"cpu0 {t(1)} {t(2)} {t(3)} {t(40)} {t(5)} {t(6)} {t(7)} {t(8)} {t(1)} 0\n"
        f"cpu1 {t(10)} 0 0 {t(20)}\n"  # an old kernel's shorter line
        "intr 1 2 3\n"
    )
    assert cpu_times(tmp_path) == {
        0: pytest.approx((19.0, 45.0, 8.0)),  # busy: user+nice+system+irq+softirq
        1: pytest.approx((10.0, 20.0, 0.0)),
    }


def _stat(
    pid: int, name: str, parent: int, utime: int, stime: int, processor: int = 0, start: int = 0
) -> str:
    # After "pid (name)": state, ppid, fields 5-13, utime (14), stime (15), fields 16-21,
    # starttime (22), fields 23-38, processor (39).
    fields = ["S", str(parent), *["0"] * 9, str(utime), str(stime), *["0"] * 6, str(start)]
    fields += [*["0"] * 16, str(processor)]
    return f"{pid} ({name}) {' '.join(fields)} 0 0\n"


def test_process_times_read_name_parent_and_cpu_past_odd_names(tmp_path: pathlib.Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "stat").write_text(
        _stat(42, "ray::Trial) (x", 7, _ticks(2), _ticks(1), start=_ticks(50))
    )
    (tmp_path / "43").mkdir()  # ended while being read: no stat
    (tmp_path / "self").mkdir()
    (tmp_path / "stat").write_text("cpu0 1 0 0 1\nbtime 1700000000\n")
    assert process_times(tmp_path) == {
        42: ("ray::Trial) (x", 7, pytest.approx(3.0), pytest.approx(50.0))
    }
    assert boot_time(tmp_path) == 1700000000.0


def test_thread_places_read_the_cpu_each_thread_last_ran_on(tmp_path: pathlib.Path) -> None:
    task = tmp_path / "5" / "task"
    (task / "6").mkdir(parents=True)
    (task / "6" / "stat").write_text(_stat(6, "pt_autograd_0", 1, _ticks(4), 0, processor=13))
    (task / "7").mkdir()  # a thread that ended
    assert thread_places(5, tmp_path) == {6: (13, pytest.approx(4.0))}
    assert thread_places(99, tmp_path) == {}


def test_the_clock_comes_from_cpufreq_else_cpuinfo(tmp_path: pathlib.Path) -> None:
    sys_cpu, proc = tmp_path / "sys", tmp_path / "proc"
    proc.mkdir()
    (proc / "cpuinfo").write_text(
        "processor\t: 0\ncpu MHz\t\t: 2100.000\n\nprocessor\t: 1\ncpu MHz\t\t: 2300.500\n"
    )
    assert cpu_mhz([0, 1], sys_cpu, proc) == {0: 2100.0, 1: 2300.5}
    for cpu, khz in ((0, 3_400_000), (1, 1_200_000)):
        (sys_cpu / f"cpu{cpu}" / "cpufreq").mkdir(parents=True)
        (sys_cpu / f"cpu{cpu}" / "cpufreq" / "scaling_cur_freq").write_text(f"{khz}\n")
    assert cpu_mhz([0, 1], sys_cpu, proc) == {0: 3400.0, 1: 1200.0}
    (proc / "cpuinfo").unlink()
    assert cpu_mhz([2], sys_cpu, proc) == {}


def test_numa_nodes_come_from_each_cpus_node_entry(tmp_path: pathlib.Path) -> None:
    for cpu, node in ((0, 0), (1, 1), (2, 1)):
        (tmp_path / f"cpu{cpu}" / f"node{node}").mkdir(parents=True)
    (tmp_path / "cpu3").mkdir()  # no node entry
    (tmp_path / "cpufreq").mkdir()
    assert numa_nodes(tmp_path) == {0: 0, 1: 1, 2: 1}


def _sample(
    when: float,
    cpus: dict[int, tuple[float, float, float]],
    processes: dict[int, tuple[Any, ...]],
    mhz: dict[int, float] | None = None,
) -> HostSample:
    # (name, parent, CPU seconds[, start]): without a start, the process began at 10 s.
    full = {pid: (*p, 10.0) if len(p) == 3 else p for pid, p in processes.items()}
    return HostSample(when, cpus, full, mhz or {}, boot=0.0)


def test_the_window_counts_groups_names_and_the_clock_where_the_work_ran() -> None:
    samples = [
        _sample(90.0, {0: (0, 0, 0), 1: (0, 0, 0)}, {}),
        _sample(
            100.2,
            {0: (10.0, 5.0, 1.0), 1: (3.0, 9.0, 0.0)},
            {
                11: ("ray::TrialWorke", 1, 50.0),  # a rank
                12: ("ray::TrialWorke", 11, 5.0),  # its loader worker
                13: ("raylet", 1, 7.0),
                14: ("kworker/u8:3-events", 2, 1.0),
                16: ("pt_data_worker", 1, 3.0),  # ends inside the window
                17: ("old", 1, 8.0),  # ends, and its pid is reused by "new"
                os.getpid(): ("python3", 1, 2.0),
                # 18 ("sshd") was running, but its stat could not be read here
            },
            {0: 3000.0, 1: 2000.0},
        ),
        _sample(
            105.0,
            {0: (15.0, 5.0, 1.2), 1: (3.5, 13.0, 0.0)},
            {16: ("pt_data_worker", 1, 3.6), 18: ("sshd", 1, 50.0)},
        ),
        _sample(
            110.1,
            {0: (19.9, 5.1, 1.5), 1: (4.0, 17.9, 0.0)},
            {
                11: ("ray::TrialWorke", 1, 59.9),
                12: ("ray::TrialWorke", 11, 6.0),
                13: ("raylet", 1, 7.1),
                14: ("kworker/u8:3-flush", 2, 1.5),  # renamed by its work: same thread
                15: ("ray::IDLE", 1, 0.99, 103.0),  # started inside the window
                17: ("new", 1, 0.3, 106.0),
                18: ("sshd", 1, 50.2),
                os.getpid(): ("python3", 1, 2.5),
            },
            {0: 3200.0, 1: 2000.0},
        ),
        _sample(130.0, {0: (99, 0, 0), 1: (99, 0, 0)}, {11: ("ray::TrialWorke", 1, 500.0)}),
    ]
    groups = {"this process": {os.getpid()}, "ranks": {11}, "loader workers": {12}}
    got = summarise(samples, began=100.0, ended=110.0, groups=groups)
    assert got["seconds"] == pytest.approx(9.9)
    assert got["cpus"] == 2
    assert got["busy_cores"] == pytest.approx(10.9 / 9.9, abs=1e-3)
    assert got["steal_cores"] == pytest.approx(0.5 / 9.9, abs=1e-3)
    assert got["cpus_over_half_busy"] == 1
    assert got["groups"] == {
        "this process": pytest.approx(0.5 / 9.9, abs=1e-3),
        "ranks": pytest.approx(1.0, abs=1e-3),
        "loader workers": pytest.approx(1.0 / 9.9, abs=1e-3),
    }
    assert got["top_others"] == [
        ["ray::IDLE", pytest.approx(0.1, abs=1e-3)],
        ["pt_data_worker", pytest.approx(0.6 / 9.9, abs=1e-3)],  # to its last sample
        ["kworker", pytest.approx(0.5 / 9.9, abs=1e-3)],
        ["new", pytest.approx(0.3 / 9.9, abs=1e-3)],  # the reused pid's own time only
        ["sshd", pytest.approx(0.2 / 9.9, abs=1e-3)],  # from its first reading
        ["raylet", pytest.approx(0.1 / 9.9, abs=1e-3)],
    ]
    # CPU 0 did 9.9 of the 10.9 busy seconds, at 3100 MHz on average; CPU 1 ran at 2000.
    assert got["mhz_mean"] == pytest.approx(2550.0)
    assert got["mhz_busy_weighted"] == pytest.approx((3100 * 9.9 + 2000 * 1.0) / 10.9)
    assert (got["mhz_min"], got["mhz_max"]) == (2000.0, 3200.0)
    assert summarise(samples[:1], 100.0, 110.0, groups) == {}


def test_placement_puts_busy_threads_time_on_the_node_they_ran_on() -> None:
    def at(when: float, threads: dict[int, tuple[int, float]]) -> HostSample:
        return HostSample(when, {}, {}, {}, {7: threads})

    samples = [
        at(0.0, {1: (0, 0.0), 2: (0, 0.0), 3: (2, 0.0)}),
        at(1.0, {1: (0, 0.6), 2: (3, 0.3), 3: (2, 0.01)}),  # thread 3 idles: left out
        at(2.0, {1: (2, 1.2), 2: (3, 0.7), 4: (1, 0.2)}),  # thread 4 is new: from zero
    ]
    nodes = {0: 0, 1: 0, 2: 1, 3: 1}
    # node0: 0.6 (thread 1) + 0.2 (thread 4); node1: 0.3 + 0.6 (thread 1) + 0.4
    assert placement(samples, 7, nodes) == {"node0": 0.381, "node1": 0.619}
    assert placement(samples, 7, {}) == {"cpu0": 0.286, "cpu1": 0.095, "cpu2": 0.286, "cpu3": 0.333}
    assert placement(samples, 8, nodes) == {}
    # A pid watched only from the second sample on: its first interval has no start.
    late = [HostSample(0.0, {}, {}, {}, {}), *samples[1:]]
    assert placement(late, 7, nodes) == {"node0": 0.167, "node1": 0.833}


def _process_cpu(pid: int) -> float:
    stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


# A "rank" that forks a "loader worker"; both spin.
_RANK = """
import os, time
child = os.fork()
end = time.time() + 20
while time.time() < end:
    pass
if child == 0:
    os._exit(0)
"""


def _children(pid: int) -> list[int]:
    found = []
    for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


@pytest.mark.skipif(not pathlib.Path("/proc/stat").exists(), reason="needs Linux /proc")
def test_the_watch_counts_a_rank_its_child_and_this_process_apart() -> None:
    rank = subprocess.Popen([sys.executable, "-c", _RANK])
    stop = threading.Event()
    data = os.urandom(1 << 20)

    def spin() -> None:  # busy in this process, hashing without the GIL
        while not stop.is_set():
            hashlib.sha256(data).digest()

    spinner = threading.Thread(target=spin)
    try:
        with HostWatch(period_s=0.1, focus=lambda: [rank.pid]) as watch:
            deadline = time.time() + 10
            while not _children(rank.pid) and time.time() < deadline:
                time.sleep(0.05)
            (child,) = _children(rank.pid)
            pids = (rank.pid, child, os.getpid())
            readings: list[list[tuple[float, float, float]]] = [[] for _ in pids]

            def look() -> None:
                for pid, mine in zip(pids, readings):
                    before = time.time()
                    cpu = _process_cpu(pid)
                    mine.append((before, cpu, time.time()))

            spinner.start()
            look()
            time.sleep(0.3)
            began = time.time()
            while time.time() < began + 1.5:
                look()
                time.sleep(0.02)
            ended = time.time()
            time.sleep(0.2)
        look()  # after the watch's last look
        assert watch.errors == []
        got = watch.summary(began, ended, [rank.pid])
        first, last = _nearest(watch.samples, began), _nearest(watch.samples, ended)
        seconds = last.when - first.when
        assert got["seconds"] == seconds > 1.0
        # Each group within what its process can have used between the watch's two readings
        # of it, from this test's readings around them: exact however loaded this machine
        # is, and apart (the rank's child counted with the rank would double the rank's).
        spent = []
        for group, mine in zip(("ranks", "loader workers", "this process"), readings):
            least, most = cpu_bounds(mine, first, last)
            assert least / seconds > 0.05, group
            assert least / seconds - 0.001 <= got["groups"][group] <= most / seconds + 0.001, group
            spent.append(least)
        assert got["busy_cores"] >= sum(spent) / seconds * 0.9
        assert 0 < got["cpus"] == len(cpu_times())
        if numa_nodes():  # the spinning thread ran on this machine's nodes
            (shares,) = got["rank_numa_nodes"].values()
            assert sum(shares.values()) == pytest.approx(1.0, abs=0.01)
    finally:
        stop.set()
        if spinner.is_alive():
            spinner.join()
        rank.kill()
        rank.wait(timeout=10)
