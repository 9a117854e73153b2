"""``benchmarks/_stack_probe.py`` and ``stack_report.py``: every thread's stack, sampled into a
folder, read back against a run's windows."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest
from _stack_probe import read_samples
from smoke_run import vs_ray_asha_smoke
from stack_report import report, thread_timelines

BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"

# A process whose named thread waits in ``slow_part`` while the main thread waits in
# ``main_part``, sampled for the whole time.
SAMPLED = """
import sys, threading, time
sys.path.insert(0, {benchmarks!r})
import _stack_probe

assert _stack_probe.start({folder!r}, period_s=0.02, seconds=5) is not None
assert _stack_probe.start({folder!r}) is None  # once per process

def slow_part(stop):
    stop.wait()

def main_part():
    time.sleep(0.6)

stop = threading.Event()
worker = threading.Thread(target=slow_part, args=(stop,), name="the-worker")
worker.start()
main_part()
stop.set()
worker.join()
time.sleep(1.2)  # the sampler flushes every second
"""


def test_every_thread_is_sampled_with_its_name_and_frames(tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "stacks"
    code = SAMPLED.format(benchmarks=str(BENCHMARKS), folder=str(folder))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    samples = list(read_samples(folder))
    assert samples and {pid for pid, _ in samples} == {int(p.stem) for p in folder.iterdir()}
    by_thread: dict[str, list[list[str]]] = {}
    for _, sample in samples:
        by_thread.setdefault(sample["thread"], []).append(sample["frames"])
    # Innermost frame first, as file:line function.
    assert any(
        f[0].startswith("threading.py:") and "slow_part" in " ".join(f)
        for f in by_thread["the-worker"]
    )
    assert any("main_part" in " ".join(f) for f in by_thread["MainThread"])
    assert "searchlab-bench-stacks" not in by_thread  # the sampler leaves itself out


def test_stop_ends_sampling_that_would_run_for_ever(tmp_path: pathlib.Path) -> None:
    import math
    import time

    import _stack_probe

    folder = tmp_path / "stacks"
    thread = _stack_probe.start(folder, period_s=0.01, seconds=math.inf)
    assert thread is not None
    try:
        deadline = time.monotonic() + 30
        while not list(read_samples(folder)) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        assert _stack_probe.stop()
    assert not thread.is_alive()
    assert list(read_samples(folder))  # it sampled until told to stop


def test_a_sampling_driver_still_sends_the_probe_to_rays_workers(tmp_path: pathlib.Path) -> None:
    # vs_ray_asha --stacks samples the driver, then has Ray pickle the workers' setup hook by
    # value, with the module's globals it reads: none may be a lock or a thread.
    import math

    import _stack_probe
    from ray import cloudpickle

    assert _stack_probe.start(tmp_path / "stacks", period_s=0.01, seconds=math.inf) is not None
    try:
        cloudpickle.register_pickle_by_value(_stack_probe)
        try:
            sent = cloudpickle.dumps(_stack_probe.start_from_environment)
        finally:
            cloudpickle.unregister_pickle_by_value(_stack_probe)
    finally:
        assert _stack_probe.stop()
    assert callable(cloudpickle.loads(sent))


def _sample(t: float, thread: str, *frames: str) -> dict:
    return {"t": t, "thread": thread, "frames": list(frames)}


def test_the_report_follows_trial_processes_inside_the_longest_windows(
    tmp_path: pathlib.Path,
) -> None:
    folder = tmp_path / "stacks"
    folder.mkdir()
    trial = [  # a trial process: forward, then three samples in the backward
        _sample(10.1, "MainThread", "conv.py:548 _conv_forward", "asha_def.py:287 train_batch"),
        *(
            _sample(t, "MainThread", "graph.py:869 _engine_run_backward", "asha_def.py:288 x")
            for t in (10.3, 10.5, 10.7)
        ),
        _sample(10.5, "loader", "queues.py:231 _feed"),
        _sample(12.0, "MainThread", "later.py:1 outside_the_window"),
    ]
    other = [_sample(10.4, "MainThread", "raylet.py:1 idle")]  # not a trial process
    for pid, samples in ((11, trial), (22, other)):
        (folder / f"{pid}.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    (folder / "33.jsonl").write_text('{"t": 10.2, "thr')  # a line a killed process cut short
    samples = list(read_samples(folder))
    assert len(samples) == len(trial) + len(other)

    found = thread_timelines(samples, 10.0, 11.0, frames=6)
    assert set(found) == {11}  # the trial's process only
    main = found[11]["MainThread"]
    # One entry per change of stack, outermost frame first; the sample after it is left out.
    assert [round(t, 1) for t, _ in main] == [10.1, 10.3]
    assert main[1][1] == "asha_def.py:288 x < graph.py:869 _engine_run_backward"
    assert found[11]["loader"] == [(10.5, "queues.py:231 _feed")]

    run = {
        "workload": "short",
        "data": "resident",
        "round": 0,
        "side": "searchlab",
        "windows": [
            {"trial_id": "t1", "gpu": 0.0, "batches": 40, "w_start": 10.0, "w_end": 11.0},
            {"trial_id": "t1", "gpu": 0.0, "batches": 80, "w_start": 11.5, "w_end": 11.9},
        ],
    }
    lines = report(str(folder), {"runs": [run]}, windows=1, frames=2)
    text = "\n".join(lines)
    assert "batches to 40: 1.00 s" in text and "batches to 80" not in text
    assert "process 11" in text and "process 22" not in text
    assert "+  0.30 s  asha_def.py:288 x < graph.py:869 _engine_run_backward" in text
    # A window with no trial process sampled in it says so.
    run["windows"][0].update(w_start=20.0, w_end=22.0)
    assert "(no samples of a trial process in it)" in "\n".join(
        report(str(folder), {"runs": [run]}, windows=1, frames=2)
    )


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(600)
def test_the_benchmark_samples_its_ray_workers(tmp_path: pathlib.Path) -> None:
    # Ray's worker_process_setup_hook starts the sampler in the trial actors, which run in
    # asha_model/ where _stack_probe cannot be imported (pickled by value).
    folder, out = tmp_path / "stacks", tmp_path / "run.json"
    done = vs_ray_asha_smoke(
        out,
        *("--sides", "searchlab", "--no-bracket", "--stacks", str(folder)),
        # Often enough that the trials' short windows are caught.
        env={"SEARCHLAB_BENCH_STACKS_PERIOD_S": "0.005"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    samples = list(read_samples(folder))
    driver = {pid for pid, s in samples if any("vs_ray_asha.py" in f for f in s["frames"])}
    trial_pids = {
        pid
        for pid, sample in samples
        if sample["thread"] == "MainThread"
        and any("asha_def.py" in f and "train_batch" in f for f in sample["frames"])
    }
    assert len(driver) == 1 and trial_pids and not trial_pids & driver
    # Every window: on this CPU a window lasts 10-25 ms, a few sampling periods, and on a
    # busy machine the one longest window may hold no sample at all (the synthetic test
    # above checks which windows are picked).
    result = json.loads(out.read_text())
    count = sum(len(run["windows"]) for run in result["runs"])
    text = "\n".join(report(str(folder), result, windows=count, frames=4))
    assert any(f"process {pid}" in text for pid in trial_pids)
    # A trial process's samples reach its end: each is written before the next is taken.
    last_window = max(w["w_end"] for run in result["runs"] for w in run["windows"])
    last_sample = max(s["t"] for pid, s in samples if pid in trial_pids)
    assert last_sample >= last_window - 0.1, (last_sample, last_window)
