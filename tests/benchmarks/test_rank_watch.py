"""``benchmarks/_rank_watch.py``: the core plan, the pinning and the CPU sampling of ranks."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
from _rank_watch import RankWatch, _processes, classify, core_plan, physical_cores, thread_shares


def _topology(root: pathlib.Path, cpus: dict[int, tuple[int, int]]) -> pathlib.Path:
    for cpu, (package, core) in cpus.items():
        folder = root / f"cpu{cpu}" / "topology"
        folder.mkdir(parents=True)
        (folder / "physical_package_id").write_text(f"{package}\n")
        (folder / "core_id").write_text(f"{core}\n")
    return root


def test_hardware_threads_of_one_core_group_together(tmp_path: pathlib.Path) -> None:
    # 4 cores with 2 threads each, numbered as Linux does: siblings n and n+4.
    sys_cpu = _topology(tmp_path, {cpu: (0, cpu % 4) for cpu in range(8)})
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


def test_a_plan_leaving_no_core_for_the_loaders_is_refused() -> None:
    with pytest.raises(ValueError, match="need 5 cores"):
        core_plan([[0], [1], [2], [3]], ranks=2, per_rank=2)


def test_ranks_are_the_matching_processes_whose_parent_does_not_match() -> None:
    procs = {
        10: (1, "python -m torch.distributed.run x.py"),
        11: (10, "python x.py --rank"),
        12: (10, "python x.py --rank"),
        20: (11, "python x.py --rank"),  # rank 11's loader worker (forked: same command)
        21: (12, "python x.py --rank"),
        30: (1, "bash"),
    }
    ranks, workers = classify(procs, lambda cmd: "x.py" in cmd and "distributed.run" not in cmd)
    assert ranks == [11, 12]
    assert workers == [20, 21]


def test_the_watching_process_is_never_a_rank() -> None:
    # Call 6B's first pinned run pinned a sampler whose command line named the ranks' script.
    procs = {os.getpid(): (1, "python watch.py x.py"), 11: (10, "python x.py")}
    assert classify(procs, lambda cmd: "x.py" in cmd) == ([11], [])


def test_thread_shares_are_cpu_seconds_over_the_window_between_the_nearest_samples() -> None:
    samples = [
        (99.0, {1: ("main", 5.0), 2: ("pin", 1.0)}),
        (100.1, {1: ("main", 5.1), 2: ("pin", 1.0)}),
        (105.0, {1: ("main", 8.0), 2: ("pin", 1.2), 3: ("late", 0.5)}),
        (110.1, {1: ("main", 11.06), 2: ("pin", 1.4), 3: ("late", 0.9)}),
        (120.0, {1: ("main", 99.0), 2: ("pin", 9.0)}),
    ]
    got = thread_shares(samples, began=100.0, ended=110.0)
    assert got["seconds"] == pytest.approx(10.0)
    # "late" started inside the window: it has no first sample and is left out.
    assert got["threads"] == [["main", pytest.approx(0.596)], ["pin", pytest.approx(0.04)]]
    assert got["cpu_cores"] == pytest.approx(0.636)
    assert thread_shares(samples[:1], began=100.0, ended=110.0) == {}


_SPIN = "import os, sys, time\nif os.fork() == 0:\n    time.sleep(30)\nelse:\n    end = time.time() + 30\n    while time.time() < end:\n        pass"


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")
def test_the_watch_pins_a_rank_and_its_child_and_samples_the_rank_threads() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs")
    tag = f"rank-watch-test-{os.getpid()}"
    # A "rank" that spins after forking a sleeping "loader worker" (same command line).
    rank = subprocess.Popen([sys.executable, "-c", _SPIN, tag])
    try:
        plan = ([{cpus[0]}], set(cpus[1:]))
        began = time.time()
        with RankWatch(lambda cmd: tag in cmd, plan, period_s=0.05) as watch:
            deadline = time.time() + 10
            while time.time() < deadline and not (
                watch.pinning and watch.pinning["ranks"] and watch.pinning["loader_workers"]
            ):
                time.sleep(0.05)
            time.sleep(1.0)
        ended = time.time()
        assert watch.errors == []
        assert watch.pinning == {"ranks": {str(rank.pid): [cpus[0]]}, "loader_workers": 1}
        assert os.sched_getaffinity(rank.pid) == {cpus[0]}
        (child,) = [pid for pid, (parent, _) in _processes().items() if parent == rank.pid]
        assert os.sched_getaffinity(child) == set(cpus[1:])
        (shares,) = watch.threads(began, ended)
        assert shares["cpu_cores"] > 0.3  # the spinning main thread, on its own CPU
        assert shares["threads"][0][1] > 0.3
    finally:
        for pid, (_, cmd) in _processes().items():
            if tag in cmd:
                os.kill(pid, signal.SIGKILL)
        rank.wait(timeout=10)


def test_without_a_plan_the_watch_only_samples() -> None:
    tag = f"rank-watch-sample-{os.getpid()}"
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", tag])
    try:
        before = os.sched_getaffinity(rank.pid)
        with RankWatch(lambda cmd: tag in cmd, period_s=0.05) as watch:
            deadline = time.time() + 10
            while time.time() < deadline and len(watch.samples.get(rank.pid, [])) < 3:
                time.sleep(0.05)
        assert watch.pinning is None and watch.errors == []
        assert len(watch.samples[rank.pid]) >= 3
        assert os.sched_getaffinity(rank.pid) == before
    finally:
        rank.kill()
        rank.wait(timeout=10)
