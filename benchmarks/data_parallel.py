"""Data-parallel throughput: a multi-GPU searchlab trial vs torchrun DDP of the same loop.

    PYTHONPATH=. python benchmarks/data_parallel.py [--gpus 2] [--seconds 50] [--rounds 2]
    PYTHONPATH=. python benchmarks/data_parallel.py --smoke   # CPU, gloo, 2 processes, tiny

Both sides train ResNet-18 on synthetic CIFAR-shaped data (``benchmarks/resnet_model/``) on
``--gpus`` GPUs (default: all visible, at least 2; the first ones when fewer are asked for),
with ``--per-gpu-batch`` 256 per GPU (global batch 512 on 2 GPUs), SGD + momentum, bf16
autocast, channels-last, and a loader per GPU with ``--num-workers`` 4 workers, pinned memory,
``drop_last``, non-blocking copies and a shuffled shard of the data for each rank. One epoch
covers each run on both sides (the 50,000 images repeat), so no loader restarts inside it.

The two sides run alternately, ``--rounds`` R times each (default 2; ``--smoke``: 1). Each
round pairs one run of each side; torchrun runs first in odd rounds and searchlab first in even
ones (``--order alternate``; ``torchrun-first`` is the order of runs before 2026-11-27), so a
drift over the benchmark (in the 2x H100 run of 2026-11-26, torchrun's rate fell from 31.1k to
27.4k samples/s over three rounds) hits each side as often in first place as in second. On GPU,
``nvidia-smi`` is sampled every 250 ms, and each run's ``gpu_state`` gives the median SM clock,
utilisation and power and the hottest temperature over its timed window.

1. **torchrun**: ``python -m torch.distributed.run --standalone --nproc_per_node=G
   benchmarks/_ddp_torchrun.py`` (plain PyTorch: ``DistributedDataParallel``,
   ``DistributedSampler``, no searchlab or Ray). After ``--warmup`` batches and
   ``--calibration`` batches, rank 0 of the FIRST run picks the timed length N (a multiple of
   ``--report-every``) that takes about ``--seconds``; ``--batches N`` fixes N instead. Every
   later torchrun run gets ``--batches N`` (same warm-up and calibration batches before it),
   so all runs of both sides time the same N batches. Rank 0 times the N batches between two
   ``torch.cuda.synchronize()`` calls and writes a JSON.
2. **searchlab**: a real search, ``searchlab.run(config, model_dir=benchmarks/resnet_model)``
   with ``searcher: single``, ``resources.slots_per_trial: G`` (``cpus_per_trial``
   ``--cpus-per-worker``), ``scheduling_unit: --report-every`` and ``--report-every`` + N
   batches: ``CifarResNetTrial`` (``use_amp``, ``wrap_model`` = DDP, searchlab's
   ``DataLoader`` sharded by rank) on G Ray worker actors forming an nccl group. As in
   ``gpu_packing.py``, throughput comes from the training reports' ``wall_time`` (when each
   report's window ended, losses on the host, latest rank): the clock starts at the first
   report (batch ``--report-every``; the batches before it are the warm-up), and
   ``samples_per_s`` is the N batches from it to the last report times the global batch,
   over the time between the two reports. Tune's round trip at every report is inside that
   time, as it is in any search; Ray start-up, actor start-up, the final validation and the
   checkpoint are not.

Ray is started once, by this script (``ray.init`` with ``num_gpus`` = G, the GPUs that
``CUDA_VISIBLE_DEVICES`` was narrowed to), before the first torchrun run, so every run of a
side sees the same background; each ``searchlab.run`` finds Ray up, reuses it (the model
directory travels through Ray's object store) and leaves it running; the script shuts it
down at the end. Before each later torchrun run, the script waits until the last search's
actors have given back their Ray resources.

So both sides time the same N batches of the same work after a warm-up, R times each.
``searchlab_over_torchrun`` is the median over rounds of the pair ratio (searchlab's samples/s
over torchrun's in the same round); target >= 0.95. ``pooled_ratio`` is the ratio of all
samples over all timed seconds of each side. The window rates (each ``--report-every``
batches: searchlab between reports, torchrun by CUDA events) are kept to show the spread. On
GPU, NCCL's set-up log (``NCCL_DEBUG=INFO``, subsystem INIT, to files; not if ``NCCL_DEBUG`` is
set already) gives each run's ``nccl_transports``: Ray gives each worker only its own GPU,
torchrun ranks see all, and NCCL may connect them differently (``P2P/...`` or ``SHM/...``).
Before anything runs, the script checks that the torchrun worker's model builder gives the
same weights as ``model_def.make_model``. Prints a table (a row per round, then the medians)
and writes ``benchmarks/results/data_parallel_<G>gpu.json`` (``--smoke``: the temp directory):
``summary`` (medians over rounds, ``pair_ratios``, ``pooled_ratio``, ``rounds``), ``torchrun``
and ``searchlab`` (the first round's runs, with their window rates) and ``rounds_detail``
(every round's runs without the window lists, but with ``window_stats``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import pathlib
import sys
import tempfile
import time
from typing import Any

import torch
from _cifar import ensure_fake_cifar  # also puts resnet_model/ on sys.path
from _dp_report import detail, host_line, machine, print_table, summarise, window_stats
from _dp_sides import (
    RANK_MATCH,
    check_same_model,
    nccl_log_env,
    rank_threads,
    run_searchlab,
    run_torchrun,
    start_ray,
    wait_for_ray_resources,
)
from _host_watch import HostWatch
from _rank_watch import RankWatch, core_plan, physical_cores
from _scale_measure import GpuSampler, gpu_state, physical_gpus
from model_def import HPARAM_DEFAULTS

HERE = pathlib.Path(__file__).resolve().parent
RESULTS = HERE / "results"  # data_parallel_<G>gpu.json
# Beside _scale_measure's fields: is a side's GPU clocked down (heat, power cap) in its window?
SMI_EXTRA = ("clocks.sm", "temperature.gpu", "power.draw")
# The torchrun run's epoch must hold every batch it may train before N is known: N is capped
# at this rate times --seconds (far above what ResNet-18 at 256 per GPU reaches).
MAX_BATCHES_PER_S = 150


def select_gpus(args: argparse.Namespace) -> int:
    """GPUs (with --smoke: CPU processes) per side; narrows CUDA_VISIBLE_DEVICES to them."""
    if args.smoke:
        return 2
    count = torch.cuda.device_count()
    gpus = args.gpus or count
    if count < 2 or gpus < 2:
        raise SystemExit(
            f"data_parallel.py needs at least 2 GPUs (found {count}, --gpus {args.gpus}); "
            "use --smoke to check the script on CPU"
        )
    if gpus > count:
        raise SystemExit(f"--gpus {gpus}, but only {count} GPU(s) are visible")
    if gpus < count:  # both sides on the same, first GPUs (Ray counts what is visible)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = visible.split(",") if visible else [str(i) for i in range(count)]
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(ids[:gpus])
    return gpus


def pin_plan(args: argparse.Namespace, gpus: int) -> tuple[list[set[int]], set[int]] | None:
    """``--pin-ranks``' cores for each rank and for the rest; exits 2 where they do not fit."""
    if not args.pin_ranks:
        return None
    try:
        return core_plan(physical_cores(os.sched_getaffinity(0)), gpus, args.pin_ranks)
    except ValueError as exc:
        print(f"data_parallel.py: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def run_rounds(
    args: argparse.Namespace,
    gpus: int,
    root: pathlib.Path,
    epoch_images: int,
    tmp: pathlib.Path,
    began: float,
    plan: tuple[list[set[int]], set[int]] | None = None,
) -> list[dict[str, Any]]:
    """``--rounds`` pairs on one Ray: torchrun first in odd rounds, searchlab first in even ones
    (``--order alternate``, the default), so a drift over the run (a GPU warming up, a
    neighbour's load) hits each side as often in first place as in second."""
    nccl_dir = tmp / "nccl-searchlab"
    started = start_ray(gpus, nccl_log_env(nccl_dir))
    sampler = GpuSampler(physical_gpus(gpus), period_ms=250, extra=SMI_EXTRA)
    sampling = torch.cuda.is_available() and sampler.start()
    rounds: list[dict[str, Any]] = []
    n = args.batches  # 0 until the first torchrun run has picked it
    what = "GPUs" if not args.smoke else "CPU processes"
    searched = False  # a search has run: wait for its actors before the next torchrun
    try:
        for i in range(1, args.rounds + 1):
            tag = f"round {i}/{args.rounds}"
            first = "searchlab" if args.order == "alternate" and i % 2 == 0 else "torchrun"
            sides: dict[str, dict[str, Any]] = {}
            for name in (first, "searchlab" if first == "torchrun" else "torchrun"):
                side_began = time.time() - began
                # A search's actors give their GPUs back after it returns: wait for them
                # before any run that follows one (two searches run back to back too).
                settle = wait_for_ray_resources() if searched else 0.0
                watch = RankWatch(RANK_MATCH[name], gpus, plan)
                host = HostWatch(focus=watch.pids)
                if name == "torchrun":
                    print(f"{tag}: torchrun: DDP on {gpus} {what} ...", flush=True)
                    with host, watch:
                        side = run_torchrun(args, gpus, root, epoch_images, tmp, i, n)
                    if not n:
                        n = int(side["timed_batches"])
                    print(
                        f"{tag}: torchrun: {side['samples_per_s']:.0f} samples/s over {n} "
                        f"batches ({side['timed_s']:.1f} s; launch to exit "
                        f"{side['launch_wall_s']:.0f} s)",
                        flush=True,
                    )
                else:
                    total = args.report_every + n
                    print(f"{tag}: searchlab: {gpus}-worker trial, {total} batches ...")
                    with host, watch:
                        side = run_searchlab(args, gpus, root, epoch_images, n, tmp, i, nccl_dir)
                    searched = True
                    print(
                        f"{tag}: searchlab: {side['samples_per_s']:.0f} samples/s over "
                        f"{side['timed_batches']} batches ({side['timed_s']:.1f} s; search "
                        f"took {side['experiment_wall_s']:.0f} s); waits between a report and "
                        f"the next batch: median {side['report_gap_s']['median'] * 1e3:.1f} ms,"
                        f" {side['report_gap_s']['share_of_timed']:.1%} of the timed time",
                        flush=True,
                    )
                side["rank_threads"] = rank_threads(watch, side)
                if watch.errors:
                    side["rank_watch_errors"] = watch.errors
                cpu = [r for r in side["rank_threads"] if r.get("threads")]
                if cpu:
                    print(
                        f"{tag}: {name}: ranks' CPU over the timed window: "
                        + ", ".join(
                            f"{r['cpu_cores']:.2f} cores ({r['cpu_ms_per_batch']:.1f} ms a batch)"
                            for r in cpu
                        ),
                        flush=True,
                    )
                side["host"] = host.summary(
                    side["timed_began_unix"],
                    side["timed_ended_unix"],
                    [r["pid"] for r in side["rank_threads"]],
                )
                if host.errors:
                    side["host_watch_errors"] = host.errors
                print(f"{tag}: {name}: host over the timed window: {host_line(side['host'])}")
                if watch.pinning is not None:
                    side["pinning"] = watch.pinning
                if side["timed_batches"] != n:
                    raise RuntimeError(f"{name} timed {side['timed_batches']} batches, not {n}")
                side.update(began_s=side_began, ray_settle_s=settle)
                side["window_stats"] = window_stats(side["window_samples_per_s"])
                if sampling:
                    side["gpu_state"] = gpu_state(
                        sampler.samples, side["timed_began_unix"], side["timed_ended_unix"]
                    )
                sides[name] = side
            ratio = sides["searchlab"]["samples_per_s"] / sides["torchrun"]["samples_per_s"]
            print(f"{tag}: pair ratio {ratio:.3f} ({first} ran first)", flush=True)
            rounds.append({"round": i, "first": first, "pair_ratio": ratio, **sides})
    finally:
        if sampling:
            sampler.stop()
        if started:
            import ray

            ray.shutdown()
    return rounds


def run(args: argparse.Namespace) -> dict[str, Any]:
    began = time.time()
    gpus = select_gpus(args)
    plan = pin_plan(args, gpus)  # before anything slow: a plan that does not fit exits now
    check_same_model()
    data_dir = pathlib.Path(args.data_dir or tempfile.gettempdir())
    root = ensure_fake_cifar(
        data_dir / f"searchlab-fake-cifar-{args.n_train}-{args.n_test}-0",
        args.n_train,
        args.n_test,
    )
    r = args.report_every
    if args.batches:
        args.batches = math.ceil(args.batches / r) * r
        args.max_batches = args.batches
    else:
        args.max_batches = math.ceil(args.seconds * MAX_BATCHES_PER_S / r) * r
    # One epoch holds everything either side trains in one run (torchrun trains the most: its
    # warm-up and calibration, then at most max_batches), so neither restarts its loader
    # mid-run. Every run of both sides uses this same epoch.
    most = max(args.warmup + args.calibration, r) + args.max_batches + 1
    epoch_images = most * args.per_gpu_batch * gpus
    with tempfile.TemporaryDirectory(prefix="searchlab-data-parallel-") as tmp:
        rounds = run_rounds(args, gpus, root, epoch_images, pathlib.Path(tmp), began, plan)
    n = rounds[0]["torchrun"]["timed_batches"]
    global_batch = args.per_gpu_batch * gpus
    return {
        "summary": summarise(rounds, gpus, global_batch),
        "searchlab": rounds[0]["searchlab"],
        "torchrun": rounds[0]["torchrun"],
        "rounds_detail": [
            {**r, "torchrun": detail(r["torchrun"]), "searchlab": detail(r["searchlab"])}
            for r in rounds
        ],
        "machine": machine(gpus),
        "config": {
            "model": "torchvision resnet18(num_classes=10), channels_last",
            "device": "cuda" if torch.cuda.is_available() else "cpu",
            "autocast": None if args.no_amp else "bfloat16",
            "gpus": gpus,
            "per_gpu_batch": args.per_gpu_batch,
            "global_batch": global_batch,
            "optimizer": {k: HPARAM_DEFAULTS[k] for k in ("lr", "momentum", "weight_decay")},
            "num_workers": args.num_workers,
            "pin_memory": torch.cuda.is_available(),
            "report_every": r,
            "torchrun_warmup": args.warmup,
            "torchrun_calibration": args.calibration,
            "seconds": args.seconds,
            "rounds": args.rounds,
            "order": (
                "torchrun first in odd rounds, searchlab first in even rounds"
                if args.order == "alternate"
                else "torchrun first in every round"
            )
            + " (one Ray for all searches)",
            "timed_batches": n,
            "searchlab_batches": r + n,
            "cpus_per_worker": args.cpus_per_worker,
            "pin_ranks": (
                f"each rank's threads on {args.pin_ranks} physical core(s) of its own, its "
                "loader workers on the other cores, on both sides"
                if args.pin_ranks
                else None
            ),
            "epoch_images": epoch_images,
            "n_train": args.n_train,
            "n_test": args.n_test,
            "data": "synthetic CIFAR-10 files (throughput only)",
            "benchmark_wall_s": time.time() - began,
            "smoke": args.smoke,
        },
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpus", type=int, default=0, help="GPUs per side (0: all, >= 2)")
    parser.add_argument("--per-gpu-batch", type=int, default=256)
    parser.add_argument("--num-workers", type=int, default=4, help="DataLoader workers per GPU")
    parser.add_argument("--seconds", type=float, default=50.0, help="aim of each timed part")
    parser.add_argument("--batches", type=int, default=0, help="timed batches (0: --seconds)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="runs of each side (default 2; --smoke: 1)",
    )
    parser.add_argument(
        "--order",
        choices=("alternate", "torchrun-first"),
        default="alternate",
        help="which side runs first in a round: torchrun in odd rounds and searchlab in even "
        "ones (alternate), or torchrun always (the order of the runs before 2026-11-27)",
    )
    parser.add_argument(
        "--report-every", type=int, default=100, help="scheduling_unit; N is a multiple"
    )
    parser.add_argument("--warmup", type=int, default=100, help="torchrun's untimed batches")
    parser.add_argument("--calibration", type=int, default=50, help="torchrun's batches to pick N")
    parser.add_argument(
        "--cpus-per-worker", type=float, default=1.0, help="resources.cpus_per_trial"
    )
    parser.add_argument(
        "--pin-ranks",
        type=int,
        default=0,
        metavar="K",
        help="pin each rank's threads to K physical cores of its own and its loader workers to "
        "the other cores, on both sides alike (benchmarks/_rank_watch.py; 0: the OS places them)",
    )
    parser.add_argument("--no-amp", action="store_true", help="fp32 instead of bf16 autocast")
    parser.add_argument("--n-train", type=int, default=50_000, help="training images")
    parser.add_argument("--n-test", type=int, default=512, help="validation images")
    parser.add_argument("--data-dir", type=pathlib.Path, default=None)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--verbose", action="store_true", help="show both sides' output")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="CPU (gloo), 2 processes, tiny sizes: checks the script",
    )
    args = parser.parse_args(argv)
    if args.pin_ranks < 0:
        parser.error(f"--pin-ranks {args.pin_ranks}: give a number of cores >= 1, or 0 for none")
    if args.rounds is None:
        args.rounds = 1 if args.smoke else 2
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.smoke:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before anything touches CUDA; children inherit
        args.gpus, args.per_gpu_batch, args.num_workers = 2, 8, 1
        args.seconds, args.report_every, args.warmup, args.calibration = 3.0, 3, 3, 2
        args.cpus_per_worker, args.n_train, args.n_test = 0.5, 256, 32
    if args.out is None:
        smoke_dir = pathlib.Path(tempfile.gettempdir()) / "searchlab-bench-smoke"
        args.out = smoke_dir / "data_parallel.json" if args.smoke else None
    return args


def main() -> None:
    args = parse_args()
    result = run(args)
    print_table(result)
    result["date"] = datetime.datetime.now().isoformat(timespec="seconds")
    if args.out is None:  # the GPU count is known now
        args.out = RESULTS / f"data_parallel_{result['summary']['gpus']}gpu.json"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
