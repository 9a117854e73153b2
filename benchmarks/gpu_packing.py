"""GPU packing: total samples/s of k ResNet-18 trials sharing one GPU, against one trial alone.

    PYTHONPATH=. python benchmarks/gpu_packing.py [--ks 1,2,4,8] [--batches 800]
    PYTHONPATH=. python benchmarks/gpu_packing.py --smoke   # k = 1, 2; tiny; CPU is fine

For each k this runs a real searchlab search, ``searchlab.run(config,
model_dir=benchmarks/resnet_model)``: a grid of k trials (a dummy ``replica`` hyperparameter)
with ``resources.gpus_per_trial: 1/k``, ``cpus_per_trial: 1`` and
``searcher.max_concurrent_trials: k``, so Ray packs all k on one GPU (on a machine with
several GPUs, ``CUDA_VISIBLE_DEVICES`` is narrowed to the first one unless already set).
Each trial trains ``--batches`` batches of 256 (bf16 autocast, channels-last, 4 loader
workers with pinned memory) on synthetic CIFAR-shaped data and reports every
``--report-every`` batches; each report carries ``wall_time``, the moment its window ended
with the losses on the host.

Throughput is measured from ``Results.metrics`` (the trials' ``result.json`` lines), not
from the search's wall time, which includes Ray's start, actor start-up and the final
validation and checkpoint. Per trial, the first report is dropped (cuDNN autotuning, loader
start); the rest gives the trial's position (batches) over time. The overlap window is from
the latest of those first kept reports to the earliest last report: all k trials train in
steady state throughout it. ``samples_per_s`` of k is the sum over trials of the samples each
trained inside the window (its position interpolated linearly at both ends) divided by the
window's length; ``speedup_at_k`` is that over the same figure for k = 1. ``span_samples_per_s``
(all kept samples over the first-to-last report span) is kept beside it: it also counts the
time when trials started at different moments. End to end, as a user sees it:
``end_to_end_samples_per_s`` is every sample of every trial over the search's wall time
(from the call to its result), ``end_to_end_speedup_at_k`` that over k = 1's, and
``end_to_end_over_window`` the share of the steady-state rate the whole call kept. Prints a table and writes
``benchmarks/results/gpu_packing.json`` (``--smoke``: into the temp directory).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import tempfile
from typing import Any

import numpy as np
import torch
from _cifar import MODEL_DIR, ensure_fake_cifar
from _common import run_search

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "gpu_packing.json"


def packing_config(k: int, args: argparse.Namespace, root: pathlib.Path, gpu: bool) -> dict:
    """The experiment config of k packed trials."""
    return {
        "name": f"packing-{k}",
        "entrypoint": "model_def:CifarResNetTrial",
        "hyperparameters": {
            "global_batch_size": args.batch_size,
            "num_workers": args.num_workers,
            "replica": {"type": "categorical", "vals": list(range(k))},
        },
        "searcher": {
            "name": "grid",
            "metric": "validation_loss",
            "max_length": {"batches": args.batches},
            "max_concurrent_trials": k,
        },
        "resources": {"gpus_per_trial": 1.0 / k if gpu else 0, "cpus_per_trial": 1},
        "scheduling_unit": args.report_every,
        "checkpoint_policy": "none",
        "max_restarts": 0,
        "reproducibility": {"experiment_seed": 0},
        "data": {"root": str(root), "n_train": args.n_train, "n_test": args.n_test},
    }


def trial_series(metrics: Any) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per trial: (wall_time, batches) of its training reports after the first."""
    training = metrics[metrics["group"] == "training"]
    series = {}
    for trial_id, rows in training.groupby("trial_id"):
        rows = rows.sort_values("batches")
        series[str(trial_id)] = (
            rows["wall_time"].to_numpy(dtype=float)[1:],
            rows["batches"].to_numpy(dtype=float)[1:],
        )
    return series


def throughput(series: dict[str, tuple[np.ndarray, np.ndarray]], batch_size: int) -> dict:
    """Samples/s of all trials together in their overlap window, and over their whole span."""
    if not series or any(len(t) < 2 for t, _ in series.values()):
        raise RuntimeError(
            "each trial needs at least 3 training reports; raise --batches or lower --report-every"
        )
    start = max(t[0] for t, _ in series.values())
    end = min(t[-1] for t, _ in series.values())
    span_start = min(t[0] for t, _ in series.values())
    span_end = max(t[-1] for t, _ in series.values())
    kept = sum(b[-1] - b[0] for _, b in series.values()) * batch_size
    per_trial = {
        tid: (b[-1] - b[0]) * batch_size / (t[-1] - t[0]) for tid, (t, b) in series.items()
    }
    out: dict[str, Any] = {
        "window_s": end - start,
        "samples_per_s": None,
        "span_s": span_end - span_start,
        "span_samples_per_s": kept / (span_end - span_start),
        "per_trial_samples_per_s": per_trial,
    }
    if end > start:
        trained = sum(np.interp(end, t, b) - np.interp(start, t, b) for t, b in series.values())
        out["samples_per_s"] = trained * batch_size / (end - start)
    return out


def run_k(k: int, args: argparse.Namespace, root: pathlib.Path, storage: pathlib.Path) -> dict:
    gpu = torch.cuda.is_available()
    results, wall = run_search(
        packing_config(k, args, root, gpu),
        model_dir=MODEL_DIR,
        storage_path=storage,
        name=f"packing-{k}",
        trials=k,
        verbose=args.verbose,
    )
    row = {"k": k, "gpus_per_trial": 1.0 / k if gpu else 0.0, "trials": k}
    row.update(throughput(trial_series(results.metrics), args.batch_size))
    row["experiment_wall_s"] = wall
    # End to end, as a user sees it: every sample of every trial over the call's wall time
    # (Ray's and the actors' start-up, cuDNN's tuning, validations and checkpoints included).
    row["end_to_end_samples_per_s"] = k * args.batches * args.batch_size / wall
    return row


def machine() -> dict[str, Any]:
    import ray
    from trainer_parity import machine_info

    return {**machine_info(), "ray": ray.__version__}


def run(args: argparse.Namespace) -> dict[str, Any]:
    if torch.cuda.is_available() and torch.cuda.device_count() > 1:
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0")  # pack on one GPU
    data_dir = pathlib.Path(args.data_dir or tempfile.gettempdir())
    root = ensure_fake_cifar(
        data_dir / f"searchlab-fake-cifar-{args.n_train}-{args.n_test}-0",
        args.n_train,
        args.n_test,
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="searchlab-packing-") as storage:
        for k in args.ks:
            row = run_k(k, args, root, pathlib.Path(storage))
            rows.append(row)
            print(
                f"k={k}: {row['samples_per_s'] or float('nan'):.0f} samples/s in a "
                f"{row['window_s']:.1f} s overlap window (search took {row['experiment_wall_s']:.0f} s)",
                flush=True,
            )
    alone = next((r["samples_per_s"] for r in rows if r["k"] == 1), None)
    alone_e2e = next((r["end_to_end_samples_per_s"] for r in rows if r["k"] == 1), None)
    for r in rows:
        r["speedup"] = r["samples_per_s"] / alone if alone and r["samples_per_s"] else None
        r["end_to_end_speedup"] = r["end_to_end_samples_per_s"] / alone_e2e if alone_e2e else None
        # How much of the steady-state rate the whole call kept (start-up and ends included).
        r["end_to_end_over_window"] = (
            r["end_to_end_samples_per_s"] / r["samples_per_s"] if r["samples_per_s"] else None
        )
    by_k = {r["k"]: r["speedup"] for r in rows}
    e2e_by_k = {r["k"]: r["end_to_end_speedup"] for r in rows}
    return {
        "summary": {
            "speedup_at_2": by_k.get(2),
            "speedup_at_4": by_k.get(4),
            "speedup_at_8": by_k.get(8),
            "samples_per_s_alone": alone,
            "end_to_end_speedup_at_2": e2e_by_k.get(2),
            "end_to_end_speedup_at_4": e2e_by_k.get(4),
            "end_to_end_speedup_at_8": e2e_by_k.get(8),
            "end_to_end_samples_per_s_alone": alone_e2e,
            "measure": "sum of trials' samples/s in the window where all k train (see docstring); "
            "end_to_end_*: all samples over the search's wall time",
        },
        "per_k": rows,
        "machine": machine(),
        "config": {
            "model": "torchvision resnet18(num_classes=10), channels_last, bf16 autocast",
            "ks": args.ks,
            "batch_size": args.batch_size,
            "batches_per_trial": args.batches,
            "report_every": args.report_every,
            "num_workers": args.num_workers,
            "cpus_per_trial": 1,
            "n_train": args.n_train,
            "data": "synthetic CIFAR-10 files (throughput only)",
            "smoke": args.smoke,
        },
    }


def print_table(result: dict[str, Any]) -> None:
    print(
        f"{'k':>2}  {'GPU/trial':>9}  {'samples/s':>10}  {'speedup':>7}  {'per trial':>10}  "
        f"{'window s':>8}  {'span samples/s':>14}  {'end-to-end/s':>12}  {'e2e speedup':>11}  "
        f"{'wall s':>6}"
    )
    for r in result["per_k"]:
        per = r["per_trial_samples_per_s"].values()
        print(
            f"{r['k']:>2}  {r['gpus_per_trial']:>9.3f}  {r['samples_per_s'] or float('nan'):>10.0f}  "
            f"{r['speedup'] or float('nan'):>7.2f}  {sum(per) / len(per):>10.0f}  "
            f"{r['window_s']:>8.1f}  {r['span_samples_per_s']:>14.0f}  "
            f"{r['end_to_end_samples_per_s']:>12.0f}  "
            f"{r['end_to_end_speedup'] or float('nan'):>11.2f}  {r['experiment_wall_s']:>6.1f}"
        )
    m = result["machine"]
    print(
        f"{m['gpu'] or 'no GPU: ' + m['cpu_model']}, torch {m['torch']}, CUDA {m['cuda']}, "
        f"ray {m['ray']}"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ks", default="1,2,4,8", help="trial counts, comma-separated")
    parser.add_argument("--batches", type=int, default=800, help="batches each trial trains")
    parser.add_argument("--report-every", type=int, default=40, help="scheduling_unit (batches)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--num-workers", type=int, default=4, help="DataLoader workers per trial")
    parser.add_argument("--n-train", type=int, default=50_000, help="training images")
    parser.add_argument("--n-test", type=int, default=512, help="validation images")
    parser.add_argument("--data-dir", type=pathlib.Path, default=None)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--verbose", action="store_true", help="show searchlab's progress lines")
    parser.add_argument(
        "--smoke", action="store_true", help="k = 1, 2 at tiny sizes to check the script"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.ks, args.batches, args.report_every, args.batch_size = "1,2", 12, 3, 16
        args.num_workers, args.n_train, args.n_test = 1, 256, 32
    args.ks = [int(k) for k in str(args.ks).split(",")]
    if args.out is None:
        smoke_dir = pathlib.Path(tempfile.gettempdir()) / "searchlab-bench-smoke"
        args.out = smoke_dir / RESULTS.name if args.smoke else RESULTS
    return args


def main() -> None:
    args = parse_args()
    result = run(args)
    print_table(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
