"""Soak test: a 200-trial adaptive ASHA search of a tiny model on CPU, watching the driver.

    PYTHONPATH=. python benchmarks/soak.py [--trials 200] [--max-length 16]

Runs ``searchlab run`` in a subprocess, with its own ``RAY_TMPDIR`` so that the Ray processes
it starts can be found in ``/proc/*/cmdline``. The search is ``adaptive_asha`` in ``standard``
mode (divisor 4; with ``max_length`` 16 batches: two brackets, rungs at 1, 4 and 16 batches)
over the toy model of the test suite (``tests/fixtures/toy_model``: an MLP 8-h-2 with h drawn
from 2..32, batches of 16), one trial per CPU, with Tune's actor reuse (searchlab's setting).

While the driver runs, its ``VmRSS`` (``/proc/<pid>/status``) is sampled every 0.5 s. The search
time runs from the first trial's start (its line in the driver's output) to the driver's exit;
``driver_rss_start_mib`` is the peak RSS in the first 10% of it and ``driver_rss_end_mib`` the
peak in the last 10%, so the start is measured once trials run, not while Ray boots (the peak
of each tenth is kept too: the last tenth comes after most trials ended and released their
loggers). The driver's open file descriptors and threads are sampled alongside. After the
driver exits the script counts the processes whose command line holds its ``RAY_TMPDIR``
(searchlab started that Ray, so it must leave none behind), right away and 2 s later.

Prints a table and writes ``benchmarks/results/soak.json``; its ``summary`` holds ``wall_s``,
``trials``, ``driver_rss_start_mib``, ``driver_rss_end_mib``, ``rss_growth_ratio`` and
``ray_processes_after_exit``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib.metadata
import json
import os
import pathlib
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import yaml

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
MODEL_DIR = ROOT / "tests" / "fixtures" / "toy_model"
RESULTS = HERE / "results" / "soak.json"
SAMPLE_EVERY_S = 0.5
NAME = "soak"


def soak_config(trials: int, max_length: int) -> dict[str, Any]:
    return {
        "name": NAME,
        "entrypoint": "toy_model_def:ToyModelTrial",
        "hyperparameters": {
            "global_batch_size": 16,
            "hidden": {"type": "int", "minval": 2, "maxval": 32},
            "optimizer": {"lr": {"type": "log", "base": 10, "minval": -3, "maxval": 0}},
        },
        "searcher": {
            "name": "adaptive_asha",
            "metric": "validation_loss",
            "max_trials": trials,
            "max_length": {"batches": max_length},
            "mode": "standard",
            "divisor": 4,
        },
        "scheduling_unit": 4,
        "max_restarts": 0,
        "reproducibility": {"experiment_seed": 0},
    }


def ray_pids(ray_tmp: str) -> list[int]:
    """Processes whose command line names ``ray_tmp`` (the Ray of one driver)."""
    pids = []
    for proc in pathlib.Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if ray_tmp.encode() in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def proc_status(pid: int, field: str) -> int | None:
    """An integer field of ``/proc/<pid>/status`` (``VmRSS`` in KiB, ``Threads``)."""
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def run_driver(config: pathlib.Path, storage: pathlib.Path, log: pathlib.Path) -> dict[str, Any]:
    """Run ``searchlab run`` to the end, sampling its RSS; returns the raw measurements."""
    ray_tmp = tempfile.mkdtemp(prefix="sls-", dir="/tmp")  # short: Ray's socket paths
    env = {**os.environ, "RAY_TMPDIR": ray_tmp, "PYTHONUNBUFFERED": "1", "RAY_ADDRESS": ""}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "searchlab.cli", "run", str(config), str(MODEL_DIR)]
    cmd += ["--storage-path", str(storage)]
    samples: list[tuple[float, int]] = []
    fds: list[tuple[float, int]] = []
    threads: list[tuple[float, int]] = []
    first_trial_s: float | None = None
    t0 = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        with log.open("rb") as reader:
            while proc.poll() is None:
                now = time.monotonic() - t0
                rss = proc_status(proc.pid, "VmRSS")
                if rss is not None:
                    samples.append((now, rss))
                if (n := open_fds(proc.pid)) is not None:
                    fds.append((now, n))
                if (n := proc_status(proc.pid, "Threads")) is not None:
                    threads.append((now, n))
                if first_trial_s is None and b"started at batch" in reader.read():
                    first_trial_s = now
                time.sleep(SAMPLE_EVERY_S)
        wall_s = time.monotonic() - t0
        at_exit = ray_pids(ray_tmp)
        time.sleep(2.0)
        after_2s = ray_pids(ray_tmp)
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in ray_pids(ray_tmp):  # leave the machine clean whatever happened
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    return {
        "returncode": proc.returncode,
        "wall_s": wall_s,
        "first_trial_s": first_trial_s,
        "samples": samples,
        "fds": fds,
        "threads": threads,
        "ray_processes_at_exit": len(at_exit),
        "ray_processes_2s_after_exit": len(after_2s),
    }


def window_peak_mib(samples: list[tuple[float, int]], start: float, end: float) -> float:
    inside = [rss for t, rss in samples if start <= t <= end]
    return max(inside) / 1024 if inside else float("nan")


def summarise(raw: dict[str, Any], exp_dir: pathlib.Path) -> dict[str, Any]:
    results = json.loads((exp_dir / "trials.json").read_text())["trials"]
    states = collections.Counter(r["state"] for r in results)
    samples = raw["samples"]
    begin = raw["first_trial_s"] if raw["first_trial_s"] is not None else samples[0][0]
    end = samples[-1][0]
    span = end - begin
    tenth = 0.1 * span
    start_mib = window_peak_mib(samples, begin, begin + tenth)
    end_mib = window_peak_mib(samples, end - tenth, end)
    deciles = [
        round(window_peak_mib(samples, begin + i * tenth, begin + (i + 1) * tenth), 1)
        for i in range(10)
    ]
    return {
        "wall_s": round(raw["wall_s"], 1),
        "search_s": round(raw["wall_s"] - begin, 1),
        "trials": len(results),
        "trial_states": dict(states),
        "batches_trained": sum(int(r["batches"]) for r in results),
        "trials_per_s": round(len(results) / (raw["wall_s"] - begin), 3),
        "driver_rss_start_mib": round(start_mib, 1),
        "driver_rss_end_mib": round(end_mib, 1),
        "rss_growth_ratio": round(end_mib / start_mib, 3),
        "driver_rss_peak_mib": round(max(rss for _, rss in samples) / 1024, 1),
        "driver_rss_decile_peaks_mib": deciles,
        "driver_open_fds_start": max(
            (n for t, n in raw["fds"] if begin <= t <= begin + tenth), default=None
        ),
        "driver_open_fds_peak": max((n for _, n in raw["fds"]), default=None),
        "driver_threads_start": max(
            (n for t, n in raw["threads"] if begin <= t <= begin + tenth), default=None
        ),
        "driver_threads_peak": max((n for _, n in raw["threads"]), default=None),
        "ray_processes_after_exit": raw["ray_processes_at_exit"],
        "ray_processes_2s_after_exit": raw["ray_processes_2s_after_exit"],
        "driver_returncode": raw["returncode"],
    }


def machine() -> dict[str, Any]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cpu_model": cpu,
        "cpu_count": os.cpu_count(),  # searchlab run starts Ray with all of them
        "python": platform.python_version(),
        "torch": importlib.metadata.version("torch"),
        "ray": importlib.metadata.version("ray"),
        "platform": platform.platform(),
    }


def print_table(summary: dict[str, Any]) -> None:
    rows = [
        ("trials", f"{summary['trials']} ({summary['trial_states']})"),
        ("wall time", f"{summary['wall_s']:.1f} s (search {summary['search_s']:.1f} s)"),
        ("trials per second", f"{summary['trials_per_s']:.3f}"),
        ("batches trained", str(summary["batches_trained"])),
        ("driver RSS, first 10% (peak)", f"{summary['driver_rss_start_mib']:.1f} MiB"),
        ("driver RSS, last 10% (peak)", f"{summary['driver_rss_end_mib']:.1f} MiB"),
        ("RSS growth end/start", f"{summary['rss_growth_ratio']:.3f}"),
        ("driver RSS peak per tenth", ", ".join(map(str, summary["driver_rss_decile_peaks_mib"]))),
        (
            "driver open files, first 10% / peak",
            f"{summary['driver_open_fds_start']} / {summary['driver_open_fds_peak']}",
        ),
        (
            "driver threads, first 10% / peak",
            f"{summary['driver_threads_start']} / {summary['driver_threads_peak']}",
        ),
        ("Ray processes after exit", str(summary["ray_processes_after_exit"])),
        ("Ray processes 2 s after exit", str(summary["ray_processes_2s_after_exit"])),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200, help="searcher.max_trials")
    parser.add_argument("--max-length", type=int, default=16, help="max_length in batches")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS, help="the JSON to write")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="searchlab-soak-") as tmp:
        work = pathlib.Path(tmp)
        config = work / "soak.yaml"
        config.write_text(yaml.safe_dump(soak_config(args.trials, args.max_length)))
        log = work / "driver.log"
        raw = run_driver(config, work / "results", log)
        if raw["returncode"] != 0:
            print(log.read_text()[-5000:], file=sys.stderr)
            print(f"the driver exited with {raw['returncode']}", file=sys.stderr)
            return 1
        summary = summarise(raw, work / "results" / NAME)
    data = {
        "benchmark": "soak",
        "config": soak_config(args.trials, args.max_length),
        "summary": summary,
        "rss_samples_mib": [[round(t, 1), round(rss / 1024, 1)] for t, rss in raw["samples"]],
        "open_fd_samples": [[round(t, 1), n] for t, n in raw["fds"]],
        "thread_samples": [[round(t, 1), n] for t, n in raw["threads"]],
        "machine": machine(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1))
    print_table(summary)
    print(f"\nmachine: {data['machine']['cpu_model']} x{data['machine']['cpu_count']}")
    print(f"wrote {args.out}")
    ok = summary["ray_processes_after_exit"] == 0 and summary["trials"] == args.trials
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
