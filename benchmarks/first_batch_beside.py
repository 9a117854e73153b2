"""A fresh process's first batch beside a process that trains, and the kernels it keeps.

    PYTHONPATH=. python benchmarks/first_batch_beside.py              # 1 GPU, ~3 min
    PYTHONPATH=. python benchmarks/first_batch_beside.py --smoke      # CPU, tiny CNN, ~1 min

With ``SEARCHLAB_STANDBY_WARM_UP=1`` a standby trial process trains its first batch (where
``cudnn.benchmark`` times cuDNN's candidate kernels and keeps the fastest for the process's
life) while another process holds the GPU and trains. In call 15D its first windows ended
3.3 s sooner, but the search's later windows ran at 89 against 113 batches/s. One cause
would be kernels picked from timings taken while another process ran: this tells whether
that happens, and what a first batch costs alone and beside a holder.

A holder process trains ``vs_ray_asha.py``'s ResNet-18 step without end; it pauses when the
driver asks. Each probe is a fresh process that builds the same step and then, by mode:

- ``alone``: pauses the holder, trains its first batch, then its steady rate alone;
- ``beside``: trains its first batch while the holder trains, then pauses the holder and
  measures its steady rate alone;
- ``alone_heuristic_first``: pauses the holder, trains its first batch with
  ``cudnn.benchmark`` off (what is left of a first batch without cuDNN's kernel trials),
  then one batch with it on, then its steady rate.

The compute cache is warmed by one probe first, outside the figures. Modes alternate in
order (ABC, CBA, ...) over ``--rounds``. Per probe: imports, build, first batch, steady
rate; for ``beside``, the holder's rate during the probe's first batch against its rate
just before. Prints a table and writes ``benchmarks/results/first_batch_beside.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "asha_model"))

MODES = ("alone", "beside", "alone_heuristic_first")
POLL_S = 0.002


def _hp(cuda: bool) -> dict[str, Any]:
    return {
        "lr": 0.1,
        "batch": 256 if cuda else 16,
        "data": "resident",
        "num_workers": 0,
        "model": "resnet18" if cuda else "tiny",
    }


def _step(quick: bool) -> tuple[Any, Any, Any]:
    import torch
    from asha_def import TrainStep

    cuda = torch.cuda.is_available() and not quick
    device = torch.device("cuda" if cuda else "cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    return TrainStep(_hp(cuda), device, seed=1), sync, torch


def _wait_for(path: pathlib.Path, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(POLL_S)


def holder(folder: pathlib.Path, quick: bool) -> None:
    """Train until ``stop`` appears; while ``pause`` exists, train nothing (``paused`` says
    so). Every 10 batches, append the time and count to ``holder.log``."""
    step, sync, _ = _step(quick)
    done = 0
    with open(folder / "holder.log", "a", buffering=1) as log:
        (folder / "ready").touch()
        while not (folder / "stop").exists():
            if (folder / "pause").exists():
                sync()
                (folder / "paused").touch()
                while (folder / "pause").exists() and not (folder / "stop").exists():
                    time.sleep(POLL_S)
                (folder / "paused").unlink(missing_ok=True)
                continue
            for _ in range(10):
                step.train_step(None)
            sync()
            done += 10
            log.write(f"{time.time()} {done}\n")


def _pause_holder(folder: pathlib.Path) -> None:
    (folder / "pause").touch()
    _wait_for(folder / "paused")


def _resume_holder(folder: pathlib.Path) -> None:
    (folder / "pause").unlink(missing_ok=True)


def probe(mode: str, folder: pathlib.Path, quick: bool, started: float, steady: int) -> dict:
    """One fresh process: build, first batch in ``mode``, then the steady rate alone."""
    import asha_def  # noqa: F401  (torch and torchvision: the imports a trial process pays)

    imported = time.time()
    step, sync, torch = _step(quick)
    sync()
    built = time.time()
    heuristic = mode == "alone_heuristic_first"
    if mode != "beside":
        _pause_holder(folder)
    torch.backends.cudnn.benchmark = not heuristic and torch.backends.cudnn.benchmark
    first_began = time.time()
    step.train_step(None)
    sync()
    first_end = time.time()
    row: dict[str, Any] = {"first_batch_began": first_began, "first_batch_end": first_end}
    if heuristic:
        torch.backends.cudnn.benchmark = step.amp
        began = time.perf_counter()
        step.train_step(None)
        sync()
        row["benchmark_batch_s"] = time.perf_counter() - began
    if mode == "beside":
        _pause_holder(folder)
    for _ in range(20):
        step.train_step(None)
    sync()
    steady_began = time.time()
    for _ in range(steady):
        step.train_step(None)
    sync()
    steady_end = time.time()
    _resume_holder(folder)
    return row | {
        "steady_began": steady_began,
        "steady_end": steady_end,
        "mode": mode,
        "imports_s": imported - started,
        "build_s": built - imported,
        "first_batch_s": first_end - first_began,
        "steady_batches_per_s": steady / (steady_end - steady_began),
        "cudnn_benchmark_at_end": bool(torch.backends.cudnn.benchmark),
    }


def _holder_rate(log: pathlib.Path, began: float, end: float) -> float | None:
    """The holder's batches per second between two times, from its log (None: too few)."""
    points = [tuple(map(float, line.split())) for line in log.read_text().splitlines()]
    inside = [(t, n) for t, n in points if began <= t <= end]
    if len(inside) < 2:
        return None
    (t0, n0), (t1, n1) = inside[0], inside[-1]
    return (n1 - n0) / (t1 - t0)


def _spawn(folder: pathlib.Path, quick: bool, *argv: str) -> subprocess.Popen:
    extra = ["--quick"] if quick else []
    return subprocess.Popen(
        [sys.executable, str(pathlib.Path(__file__).resolve()), *argv, str(folder), *extra],
        cwd=folder,
        stdout=subprocess.PIPE,
        text=True,
    )


def run_probe(mode: str, folder: pathlib.Path, quick: bool, steady: int) -> dict[str, Any]:
    proc = _spawn(
        folder, quick, "--probe", mode, "--started", str(time.time()), "--steady", str(steady)
    )
    out, _ = proc.communicate(timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"probe {mode} failed (exit {proc.returncode})")
    row = json.loads(out.strip().splitlines()[-1])
    log = folder / "holder.log"
    if mode == "beside":
        before = row["first_batch_began"] - max(2.0, row["first_batch_s"])
        row["holder_rate_before"] = _holder_rate(log, before, row["first_batch_began"])
        row["holder_rate_during"] = _holder_rate(
            log, row["first_batch_began"], row["first_batch_end"]
        )
    return row


def run_all(rounds: int, quick: bool, folder: pathlib.Path, steady: int) -> list[dict[str, Any]]:
    """The warm-up probe, then ``rounds`` of every mode beside one holder."""
    hold = _spawn(folder, quick, "--holder")
    try:
        _wait_for(folder / "ready", timeout_s=300)
        run_probe("alone", folder, quick, steady)  # fills the compute cache; not counted
        rows = []
        for index in range(rounds):
            order = MODES if index % 2 == 0 else tuple(reversed(MODES))
            for mode in order:
                rows.append({"round": index} | run_probe(mode, folder, quick, steady))
        return rows
    finally:
        (folder / "stop").touch()
        hold.wait(timeout=60)


def summary_of(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode, the medians; and the steady rate after a first batch beside the holder over
    the steady rate after one alone (below 1: the kernels picked beside it are slower)."""

    def median(mode: str, key: str) -> float | None:
        values = [r[key] for r in rows if r["mode"] == mode and r.get(key) is not None]
        return statistics.median(values) if values else None

    out: dict[str, Any] = {}
    for mode in MODES:
        for key in ("imports_s", "first_batch_s", "steady_batches_per_s", "benchmark_batch_s"):
            value = median(mode, key)
            if value is not None:
                out[f"{mode}_{key}"] = value
    alone, beside = (
        median("alone", "steady_batches_per_s"),
        median("beside", "steady_batches_per_s"),
    )
    out["steady_beside_over_alone"] = beside / alone if alone and beside else None
    before, during = median("beside", "holder_rate_before"), median("beside", "holder_rate_during")
    out["holder_during_over_before"] = during / before if before and during else None
    return out


def main() -> None:
    from _common import add_common_args, machine_info, print_table, result_path, write_result

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steady", type=int, default=300, help="batches timed for the rate")
    parser.add_argument("--holder", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--probe", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--started", type=float, help=argparse.SUPPRESS)
    parser.add_argument("folder", nargs="?", type=pathlib.Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.holder:
        holder(args.folder, args.quick)
        return
    if args.probe:
        print(json.dumps(probe(args.probe, args.folder, args.quick, args.started, args.steady)))
        return
    steady = 20 if args.quick else args.steady
    with tempfile.TemporaryDirectory(prefix="first-batch-beside-") as tmp:
        rows = run_all(args.rounds, args.quick, pathlib.Path(tmp), steady)
    columns = ["round", "mode", "imports_s", "build_s", "first_batch_s", "benchmark_batch_s"]
    columns += ["steady_batches_per_s", "holder_rate_before", "holder_rate_during"]
    print_table(rows, columns)
    summary = summary_of(rows)
    print(json.dumps(summary, indent=1))
    write_result(
        result_path("first_batch_beside", args),
        summary=summary,
        runs=rows,
        machine=machine_info(("torch",)),
        cuda_cache_path=os.environ.get("CUDA_CACHE_PATH"),
    )


if __name__ == "__main__":
    main()
