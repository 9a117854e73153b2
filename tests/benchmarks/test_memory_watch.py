"""``benchmarks/_memory_watch.py``: the host's memory in use and each Ray worker's
proportional set size with its children's, from ``/proc``."""

from __future__ import annotations

import pathlib

from _memory_watch import GIB, MemoryWatch, host_used, ray_workers


def _process(proc: pathlib.Path, pid: int, parent: int, title: str, pss_kib: int) -> None:
    folder = proc / str(pid)
    folder.mkdir()
    (folder / "cmdline").write_bytes(title.encode() + b"\0--flag\0")
    # The command name in brackets may hold spaces and brackets: the parent follows the last ')'.
    (folder / "stat").write_text(f"{pid} (odd ) name) S {parent} 1 1 0\n")
    (folder / "smaps_rollup").write_text(
        f"00400000-7fff [rollup]\nRss:  {pss_kib * 2} kB\nPss:  {pss_kib} kB\n"
    )


def _fake_proc(tmp_path: pathlib.Path) -> pathlib.Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "meminfo").write_text(
        "MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    400 kB\n"
    )
    (proc / "self").mkdir()  # not a pid: skipped
    _process(proc, 10, 1, "/usr/bin/python3 driver.py", 5000)
    _process(proc, 20, 10, "ray::_SearchlabTrial.train", 3000)
    _process(proc, 21, 20, "/usr/bin/python3 -c loader", 700)  # its loader worker
    _process(proc, 22, 21, "/usr/bin/python3 -c grandchild", 300)
    _process(proc, 30, 10, "ray::IDLE", 1000)
    return proc


def test_host_used_is_total_less_available(tmp_path: pathlib.Path) -> None:
    assert host_used(_fake_proc(tmp_path)) == 600 * 1024


def test_ray_workers_sum_their_descendants_and_skip_other_processes(
    tmp_path: pathlib.Path,
) -> None:
    workers = ray_workers(_fake_proc(tmp_path))
    assert workers == {
        20: ("ray::_SearchlabTrial.train", 4000 * 1024),
        30: ("ray::IDLE", 1000 * 1024),
    }


def test_a_process_that_vanished_counts_nothing(tmp_path: pathlib.Path) -> None:
    proc = _fake_proc(tmp_path)
    (proc / "21" / "smaps_rollup").unlink()
    assert ray_workers(proc)[20] == ("ray::_SearchlabTrial.train", 3300 * 1024)


def test_summary_gives_peaks_and_the_host_rise(tmp_path: pathlib.Path) -> None:
    proc = _fake_proc(tmp_path)
    gpu = iter([1 * GIB, 3 * GIB, 2 * GIB])
    watch = MemoryWatch(period_s=60.0, gpu_used=lambda: next(gpu), proc=proc)
    with watch:
        # A third trial worker starts and the host's memory grows while the watch runs.
        _process(proc, 40, 10, "ray::_SearchlabTrial.train", 6000)
        (proc / "meminfo").write_text("MemTotal: 1000 kB\nMemAvailable: 100 kB\n")
        watch.samples.append(watch.sample())
    summary = watch.summary()
    assert summary["samples"] == 3
    assert summary["host_used_peak_gib"] * GIB == 900 * 1024
    assert summary["host_rise_peak_gib"] * GIB == 300 * 1024
    assert summary["workers_peak"] == 3
    assert summary["workers_pss_peak_gib"] * GIB == (4000 + 1000 + 6000) * 1024
    assert summary["trial_worker_pss_max_gib"] * GIB == 6000 * 1024  # not ray::IDLE's
    assert summary["gpu_used_peak_gib"] == 3


def test_an_empty_watch_has_no_summary() -> None:
    assert MemoryWatch().summary() == {}
