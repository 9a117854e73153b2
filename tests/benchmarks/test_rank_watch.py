"""``benchmarks/_rank_watch.py``: the core plan, which processes are ranks, their pinning and
the CPU sampling of their threads."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
from _host_watch import CLOCK_TICKS
from _rank_watch import (
    RankMatch,
    RankWatch,
    _processes,
    classify,
    core_plan,
    physical_cores,
    thread_shares,
    thread_times,
    window,
)
from cpu_bounds import cpu_bounds


def _topology(root: pathlib.Path, siblings: dict[int, str]) -> pathlib.Path:
    for cpu, listed in siblings.items():
        folder = root / f"cpu{cpu}" / "topology"
        folder.mkdir(parents=True)
        (folder / "core_cpus_list").write_text(f"{listed}\n")
    return root


def test_hardware_threads_of_one_core_group_together(tmp_path: pathlib.Path) -> None:
    # 4 cores with 2 threads each, numbered as Linux does: siblings n and n+4.
    sys_cpu = _topology(tmp_path, {cpu: f"{cpu % 4},{cpu % 4 + 4}" for cpu in range(8)})
    assert physical_cores(range(8), sys_cpu) == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_cpus_without_topology_are_cores_of_their_own(tmp_path: pathlib.Path) -> None:
    assert physical_cores([3, 1], tmp_path) == [[1], [3]]


def test_each_rank_gets_whole_cores_and_the_rest_go_to_the_loaders() -> None:
    cores = [[0, 4], [1, 5], [2, 6], [3, 7]]
    own, rest = core_plan(cores, ranks=2, per_rank=1)
    assert own == [{3, 7}, {2, 6}]  # from the last cores: CPU 0 keeps the kernel's work
    assert rest == {0, 1, 4, 5}
    own, rest = core_plan(cores, ranks=1, per_rank=2)
    assert own == [{2, 3, 6, 7}] and rest == {0, 1, 4, 5}


def test_a_plan_leaving_no_core_for_the_loaders_is_refused_naming_the_option() -> None:
    with pytest.raises(ValueError, match=r"--pin-ranks 2: .*need 5 cores.*has 4"):
        core_plan([[0], [1], [2], [3]], ranks=2, per_rank=2)


_MATCH = RankMatch(
    is_rank=lambda cmd: "x.py" in cmd and "distributed.run" not in cmd,
    is_launcher=lambda cmd: "distributed.run" in cmd,
)


def test_ranks_are_matching_processes_that_the_launcher_started() -> None:
    procs = {
        10: (1, "python -m torch.distributed.run x.py"),
        11: (10, "python x.py --rank"),
        12: (10, "python x.py --rank"),
        20: (11, "python x.py --rank"),  # rank 11's loader worker (forked: same command)
        21: (12, "python x.py --rank"),
        30: (1, "python profile.py x.py"),  # a profiler naming the script: not a rank
        31: (1, "python x.py --rank"),  # an orphaned loader worker of an ended run
        40: (1, "bash"),
    }
    assert classify(procs, _MATCH) == ([11, 12], [20, 21])


def test_the_watching_process_is_never_a_rank() -> None:
    # Call 6B's first pinned run pinned a sampler whose command line named the ranks' script.
    procs = {
        10: (1, "python -m torch.distributed.run x.py"),
        os.getpid(): (10, "python watch.py x.py"),
        11: (10, "python x.py"),
    }
    assert classify(procs, _MATCH) == ([11], [])


def test_thread_times_read_the_14th_and_15th_fields_past_a_name_with_parentheses(
    tmp_path: pathlib.Path,
) -> None:
    task = tmp_path / "7" / "task" / "8"
    task.mkdir(parents=True)
    fields = ["S", *[str(i) for i in range(4, 14)], "300", "200", *["0"] * 30]  # utime, stime
    (task / "stat").write_text(f"8 (odd ) (name) {' '.join(fields)}\n")
    (tmp_path / "7" / "task" / "9").mkdir()  # a thread that ended while being read
    assert thread_times(7, tmp_path) == {8: ("odd ) (name", 500 / CLOCK_TICKS)}


def test_thread_shares_count_the_window_between_the_nearest_samples() -> None:
    samples = [
        (99.0, {1: ("main", 5.0), 2: ("pin", 1.0), 4: ("short", 0.0)}),
        (100.1, {1: ("main", 5.1), 2: ("pin", 1.0), 4: ("short", 0.1)}),
        (105.0, {1: ("main", 8.0), 2: ("pin", 1.2), 3: ("late", 0.5), 4: ("short", 0.6)}),
        (110.1, {1: ("main", 11.06), 2: ("pin", 1.4), 3: ("late", 0.9)}),
        (120.0, {1: ("main", 99.0), 2: ("pin", 9.0)}),
    ]
    got = thread_shares(samples, began=100.0, ended=110.0)
    assert got["seconds"] == pytest.approx(10.0)
    # "late" started inside the window: all of its 0.9 s count; "short" ended inside it: it
    # counts to its last sample (0.6 - 0.1 s).
    assert got["threads"] == [
        ["main", pytest.approx(0.596)],
        ["late", pytest.approx(0.09)],
        ["short", pytest.approx(0.05)],
        ["pin", pytest.approx(0.04)],
    ]
    assert got["cpu_cores"] == pytest.approx(0.776)
    assert thread_shares(samples[:1], began=100.0, ended=110.0) == {}


def _threads_cpu(pid: int) -> float:
    """The CPU seconds of ``pid``'s threads so far, read as the watch reads them (a process's
    own count, rounded on its own, may differ from its threads' by a few clock ticks)."""
    total = 0.0
    for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
        stat = (task / "stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return total


# A "launcher" starts a "rank" that forks a sleeping "loader worker" (same command line)
# and then spins.
_LAUNCHER = """
import subprocess, sys
subprocess.run([sys.executable, "-c", sys.argv[1], sys.argv[2]])
"""
_RANK = """
import os, time
if os.fork() == 0:
    time.sleep(30)
else:
    end = time.time() + 30
    while time.time() < end:
        pass
"""


def _tagged(tag: str) -> RankMatch:
    return RankMatch(
        is_rank=lambda cmd: tag in cmd and "launch" not in cmd,
        is_launcher=lambda cmd: tag in cmd and "launch" in cmd,
    )


def _kill(tag: str) -> None:
    for pid, (_, cmd) in _processes().items():
        if tag in cmd:
            os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")
def test_the_watch_pins_a_rank_and_its_child_and_samples_the_ranks_cpu() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs")
    tag = f"rank-watch-test-{os.getpid()}"
    launcher = subprocess.Popen([sys.executable, "-c", _LAUNCHER, _RANK, tag, f"{tag}-launch"])
    try:
        plan = ([{cpus[0]}], set(cpus[1:]))
        with RankWatch(_tagged(tag), ranks=1, plan=plan, period_s=0.05) as watch:
            deadline = time.time() + 60
            while time.time() < deadline and not (
                watch.pinning and watch.pinning["ranks"] and watch.pinning["loader_workers"]
            ):
                time.sleep(0.05)
            (rank,) = [int(pid) for pid in watch.pinning["ranks"]] if watch.pinning else [0]
            readings: list[tuple[float, float, float]] = []

            def look() -> None:
                before = time.time()
                cpu = _threads_cpu(rank)
                readings.append((before, cpu, time.time()))

            look()
            began = time.time() + 0.3  # the window, with this test's readings all around it
            ended = began + 1.5
            while time.time() < ended + 0.2:
                time.sleep(0.02)
                look()
        look()  # after the watch's last look
        assert watch.errors == []
        assert watch.pinning == {"ranks": {str(rank): [cpus[0]]}, "loader_workers": 1}
        assert os.sched_getaffinity(rank) == {cpus[0]}
        (child,) = [pid for pid, (parent, _) in _processes().items() if parent == rank]
        assert os.sched_getaffinity(child) == set(cpus[1:])
        (shares,) = watch.threads(began, ended)
        assert shares["pid"] == rank
        ends = window(watch.samples[rank], began, ended)
        assert ends is not None
        first, last = ends
        seconds = last.when - first.when
        assert shares["seconds"] == seconds > 0
        # Within what the rank can have used between the watch's two readings of it, from this
        # test's readings around them: exact however loaded this machine is.
        least, most = cpu_bounds(readings, first, last)
        assert least / seconds > 0.05
        assert least / seconds - 0.001 <= shares["cpu_cores"] <= most / seconds + 0.001
    finally:
        _kill(tag)
        launcher.wait(timeout=10)


def test_without_a_plan_the_watch_only_samples_and_says_when_ranks_are_missing() -> None:
    tag = f"rank-watch-sample-{os.getpid()}"
    sleeper = "import time; time.sleep(30)"
    launcher = subprocess.Popen([sys.executable, "-c", _LAUNCHER, sleeper, tag, f"{tag}-launch"])
    try:
        with RankWatch(_tagged(tag), ranks=2, period_s=0.05) as watch:
            deadline = time.time() + 60
            while time.time() < deadline and sum(map(len, watch.samples.values())) < 3:
                time.sleep(0.05)
        (rank,) = watch.samples
        assert len(watch.samples[rank]) >= 3
        assert watch.pinning is None
        assert os.sched_getaffinity(rank) == os.sched_getaffinity(0)  # left where it was
        assert watch.errors == ["saw 1 rank processes, expected 2"]
    finally:
        _kill(tag)
        launcher.wait(timeout=10)
