"""``benchmarks/_memory_watch.py``: the host's memory in use, each Ray worker's proportional
set size and CPU seconds with its children's, from ``/proc``; the CPU other workers use
while one trains a window."""

from __future__ import annotations

import pathlib

import pytest
from _memory_watch import (
    CLOCK_TICKS,
    GIB,
    IDLE,
    MemoryWatch,
    Sample,
    Worker,
    cpu_of,
    gpu_memory_used,
    host_used,
    ray_workers,
)


def _process(
    proc: pathlib.Path,
    pid: int,
    parent: int,
    title: str,
    pss_kib: int,
    cpu_s: float = 0.0,
    reaped_s: float = 0.0,
) -> None:
    folder = proc / str(pid)
    folder.mkdir(exist_ok=True)
    (folder / "cmdline").write_bytes(title.encode() + b"\0--flag\0")
    # The name in brackets may hold spaces and brackets: the fields follow the last ')'.
    # utime, stime (its own CPU), cutime, cstime (its reaped children's): fields 14 to 17.
    ticks, reaped = round(cpu_s * CLOCK_TICKS), round(reaped_s * CLOCK_TICKS)
    fields = ["S", str(parent), "1", "1", "0", "-1", "0", "0", "0", "0", "0"]
    fields += [str(ticks - ticks // 2), str(ticks // 2), str(reaped), "0", "20"]
    (folder / "stat").write_text(f"{pid} (odd ) name) {' '.join(fields)}\n")
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
    _process(proc, 10, 1, "/usr/bin/python3 driver.py", 5000, cpu_s=9.0)
    _process(proc, 20, 10, "ray::_SearchlabTrial.train", 3000, cpu_s=4.0, reaped_s=0.25)
    # Its loader worker, forked: it shows the worker's title, and counts in the worker.
    _process(proc, 21, 20, "ray::_SearchlabTrial.train", 700, cpu_s=1.0)
    _process(proc, 22, 21, "/usr/bin/python3 -c grandchild", 300, cpu_s=0.5)
    _process(proc, 30, 10, "ray::IDLE", 1000, cpu_s=0.2)
    return proc


def test_host_used_is_total_less_available(tmp_path: pathlib.Path) -> None:
    assert host_used(_fake_proc(tmp_path)) == 600 * 1024


def test_ray_workers_sum_their_descendants_and_skip_other_processes(
    tmp_path: pathlib.Path,
) -> None:
    workers = ray_workers(_fake_proc(tmp_path))
    assert workers == {
        20: Worker(
            "ray::_SearchlabTrial.train",
            cpu=pytest.approx(5.75),  # 4 + 1 + 0.5, and 0.25 of a child that ended
            pss=4000 * 1024,
            pids=(20, 21, 22),
        ),
        30: Worker("ray::IDLE", cpu=pytest.approx(0.2), pss=0, pids=(30,)),  # memory not read
    }


def test_without_memory_only_the_cpu_is_read(tmp_path: pathlib.Path) -> None:
    workers = ray_workers(_fake_proc(tmp_path), memory=False)
    assert workers[20].pss == 0 and workers[20].cpu == pytest.approx(5.75)


def test_between_full_looks_the_cpu_comes_from_the_pids_found(tmp_path: pathlib.Path) -> None:
    proc = _fake_proc(tmp_path)
    workers = ray_workers(proc, memory=False)
    # The loader ends (its parent reaps it: its time moves into the parent's), the trial
    # trains on, and a process starts that the next full look will find.
    (proc / "21" / "stat").unlink()
    _process(proc, 20, 10, "ray::_SearchlabTrial.train", 3000, cpu_s=6.0, reaped_s=1.25)
    _process(proc, 40, 10, "ray::Other", 100, cpu_s=3.0)
    assert cpu_of(workers, proc) == {20: pytest.approx(7.75), 30: pytest.approx(0.2)}


def test_a_process_that_vanished_counts_nothing(tmp_path: pathlib.Path) -> None:
    proc = _fake_proc(tmp_path)
    (proc / "21" / "smaps_rollup").unlink()
    assert ray_workers(proc)[20].pss == 3300 * 1024


def test_summary_gives_peaks_and_the_host_rise(tmp_path: pathlib.Path) -> None:
    proc = _fake_proc(tmp_path)
    gpu = iter([1 * GIB, 3 * GIB, 2 * GIB])
    watch = MemoryWatch(period_s=60.0, gpu_used=lambda: next(gpu), proc=proc)
    with watch:
        # A second trial worker starts and the host's memory grows while the watch runs.
        _process(proc, 40, 10, "ray::_SearchlabTrial.train", 6000)
        (proc / "meminfo").write_text("MemTotal: 1000 kB\nMemAvailable: 100 kB\n")
        watch.samples.append(watch.sample(memory=False))  # CPU only: no memory figures
        watch.samples.append(watch.sample(memory=True))
    summary = watch.summary()
    assert summary["samples"] == 4 and summary["memory_samples"] == 3
    assert summary["host_used_peak_gib"] * GIB == 900 * 1024
    assert summary["host_rise_peak_gib"] * GIB == 300 * 1024
    assert summary["workers_peak"] == 3
    assert summary["workers_pss_peak_gib"] * GIB == (4000 + 6000) * 1024
    assert summary["trial_worker_pss_max_gib"] * GIB == 6000 * 1024
    assert summary["gpu_used_peak_gib"] == 3


def test_memory_is_read_once_per_memory_period(tmp_path: pathlib.Path) -> None:
    watch = MemoryWatch(memory_every_s=3600.0, proc=_fake_proc(tmp_path))
    assert watch.sample().memory  # the first look reads it
    assert not watch.sample().memory  # within the hour: CPU only


def _looks(cpu_by_time: list[tuple[float, dict[int, float]]]) -> list[Sample]:
    return [Sample(t, {p: "ray::x" for p in cpu}, cpu) for t, cpu in cpu_by_time]


def test_beside_gives_the_trainer_and_the_others_cores_per_window() -> None:
    watch = MemoryWatch()
    # pid 1 trains at 1 core throughout; pid 2 waits (no CPU) in the first window and
    # builds at half a core in the second; pid 3 appears in the second window only.
    watch.samples = _looks(
        [
            (0.0, {1: 0.0, 2: 0.0}),
            (1.0, {1: 1.0, 2: 0.0}),
            (2.0, {1: 2.0, 2: 0.0}),
            (3.0, {1: 3.0, 2: 0.5, 3: 0.0}),
            (4.0, {1: 4.0, 2: 1.0, 3: 0.25}),
            (5.0, {1: 5.0, 2: 1.5, 3: 0.5}),
        ]
    )
    windows = [
        {"w_start": 0.0, "w_end": 2.0},
        {"w_start": 3.0, "w_end": 5.0},
        {"w_start": 2.5, "w_end": 3.5},  # too short to measure: skipped
    ]
    got = watch.beside(windows, min_span=2)
    assert got == {
        "windows": 2,
        "trainer_cores_median": pytest.approx(1.0),
        "others_cores_median": pytest.approx(0.375),
        "others_cores_mean": pytest.approx(0.375),
        "others_cores_max": pytest.approx(0.75),
        "idle_workers_cores_median": 0.0,
        "per_window": [[0.0, 1.0, 0.0, 0.0], [3.0, 1.0, 0.75, 0.0]],
    }


def _after_a_full_look(tmp_path: pathlib.Path) -> tuple[pathlib.Path, MemoryWatch, Sample]:
    """A fake ``/proc``, a watch whose next looks read CPU only, and its first (full) look."""
    proc = _fake_proc(tmp_path)
    watch = MemoryWatch(memory_every_s=3600.0, proc=proc)
    return proc, watch, watch.sample()


def _trial_trains_on(proc: pathlib.Path, cpu_s: float) -> None:
    _process(proc, 20, 10, "ray::_SearchlabTrial.train", 3000, cpu_s=cpu_s, reaped_s=0.25)


def test_a_worker_gone_between_full_looks_is_left_out_not_read_as_negative(
    tmp_path: pathlib.Path,
) -> None:
    proc, watch, first = _after_a_full_look(tmp_path)
    # Ray ends its idle worker (0.2 s of CPU so far); the trial trains on.
    for name in ("stat", "cmdline", "smaps_rollup"):
        (proc / "30" / name).unlink()
    (proc / "30").rmdir()
    _trial_trains_on(proc, cpu_s=5.0)
    second = watch.sample()
    assert not second.memory and set(second.cpu) == {20}
    assert second.cpu[20] - first.cpu[20] == pytest.approx(1.0)


def test_a_worker_that_takes_a_trials_actor_between_full_looks_counts_as_busy(
    tmp_path: pathlib.Path,
) -> None:
    proc, watch, first = _after_a_full_look(tmp_path)
    assert first.titles[30] == IDLE
    # The trial trains on; Ray hands its idle worker a trial's actor, which builds (its
    # title changes at once).
    _trial_trains_on(proc, cpu_s=6.0)
    _process(proc, 30, 10, "ray::_SearchlabTrial.__init__", 1000, cpu_s=1.2)
    second = watch.sample()
    assert not second.memory and second.titles[30] == "ray::_SearchlabTrial.__init__"
    watch.samples = [first, second]
    span = second.when - first.when
    got = watch.beside([{"w_start": first.when, "w_end": second.when}], min_span=1)
    assert got["idle_workers_cores_median"] == 0.0
    assert got["trainer_cores_median"] == pytest.approx(2.0 / span)
    assert got["others_cores_median"] == pytest.approx(1.0 / span)  # its build, beside


def test_beside_counts_rays_idle_workers_apart_from_the_trial_processes() -> None:
    watch = MemoryWatch()
    titles = {1: "ray::Trial.train", 2: "ray::Trial.train", 3: IDLE}
    cpu = [{1: 0.0, 2: 0.0, 3: 0.0}, {1: 1.0, 2: 0.1, 3: 0.8}, {1: 2.0, 2: 0.2, 3: 1.6}]
    watch.samples = [Sample(float(t), titles, c) for t, c in enumerate(cpu)]
    got = watch.beside([{"w_start": 0.0, "w_end": 2.0}], min_span=2)
    assert got["trainer_cores_median"] == pytest.approx(1.0)
    assert got["others_cores_median"] == pytest.approx(0.1)  # the waiting trial process
    assert got["idle_workers_cores_median"] == pytest.approx(0.8)  # Ray's, not searchlab's


def test_an_empty_watch_has_no_summary_and_measures_no_window() -> None:
    watch = MemoryWatch()
    assert watch.summary() == {}
    assert watch.beside([{"w_start": 0.0, "w_end": 9.0}]) == {"windows": 0}


def test_gpu_memory_is_read_by_nvidia_smi_not_by_a_cuda_context(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import subprocess

    calls: list[list[str]] = []

    def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        calls.append(command)
        return subprocess.CompletedProcess(command, 0, stdout="1024\n512\n")  # MiB, 2 GPUs

    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    used = gpu_memory_used(run)
    assert used is not None and used() == 1536 * 2**20
    assert calls[0][0] == "nvidia-smi"

    def fails(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        raise subprocess.CalledProcessError(9, command)

    assert gpu_memory_used(fails) is None  # no driver: no figure, no error
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert gpu_memory_used(run) is None
