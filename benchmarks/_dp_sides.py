"""The two sides of ``data_parallel.py``: the torchrun run, the searchlab search, their Ray.

Also the model check before them, NCCL's set-up log (where it goes, which transports it names)
and how each side's rank processes show in ``/proc`` (``RANK_MATCH``, ``rank_threads``).
"""

from __future__ import annotations

import argparse
import collections
import os
import pathlib
import re
import statistics
import time
from typing import Any

import torch
from _cifar import MODEL_DIR  # also puts resnet_model/ on sys.path
from _common import environment, run_search, torchrun_json
from _rank_watch import RankMatch, RankWatch
from model_def import HPARAM_DEFAULTS

from searchlab._ray_env import ray_environment, ray_init_kwargs

HERE = pathlib.Path(__file__).resolve().parent
WORKER = HERE / "_ddp_torchrun.py"


def check_same_model() -> None:
    """The torchrun worker's model (no searchlab there) is model_def's, weight for weight."""
    from _ddp_torchrun import make_model as ddp_model
    from model_def import make_model as trial_model

    torch.manual_seed(0)
    ours = trial_model(True).state_dict()
    torch.manual_seed(0)
    theirs = ddp_model(True).state_dict()
    same = ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    if not same:
        raise RuntimeError(f"{WORKER.name}:make_model differs from model_def.make_model")


def nccl_log_env(folder: pathlib.Path) -> dict[str, str]:
    """Send NCCL's set-up log to files in ``folder`` (only on GPU, unless NCCL_DEBUG is set)."""
    if not torch.cuda.is_available() or "NCCL_DEBUG" in os.environ:
        return {}
    folder.mkdir(parents=True, exist_ok=True)
    return {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT",
        "NCCL_DEBUG_FILE": str(folder / "nccl.%h.%p.log"),
    }


def nccl_logs(folder: pathlib.Path) -> set[pathlib.Path]:
    return set(folder.glob("nccl.*.log"))


def nccl_transports(
    folder: pathlib.Path, skip: set[pathlib.Path] | None = None
) -> dict[str, int] | None:
    """How many NCCL channels of the ranks use each transport ("P2P/CUMEM", "SHM/...").

    ``skip``: logs of earlier runs in the same folder (each process writes its own file).
    """
    counts: collections.Counter[str] = collections.Counter()
    for log in sorted(nccl_logs(folder) - (skip or set())):
        for line in log.read_text(errors="replace").splitlines():
            found = re.search(r"Channel .* via (\S+)", line)
            if found:
                counts[found.group(1)] += 1
    return dict(counts) or None


def run_torchrun(
    args: argparse.Namespace,
    gpus: int,
    root: pathlib.Path,
    epoch_images: int,
    tmp: pathlib.Path,
    round_no: int,
    batches: int,
) -> dict[str, Any]:
    """One torchrun run; ``batches``: the timed N (0: rank 0 picks it from --seconds)."""
    out = tmp / f"torchrun-{round_no}.json"
    nccl_dir = tmp / f"nccl-torchrun-{round_no}"
    hp = HPARAM_DEFAULTS
    worker_args = [
        f"--data-root={root}",
        f"--epoch-images={epoch_images}",
        f"--out={out}",
        f"--per-gpu-batch={args.per_gpu_batch}",
        f"--num-workers={args.num_workers}",
        f"--lr={hp['lr']}",
        f"--momentum={hp['momentum']}",
        f"--weight-decay={hp['weight_decay']}",
        f"--warmup={args.warmup}",
        f"--calibration={args.calibration}",
        f"--seconds={args.seconds}",
        f"--batches={batches}",
        f"--round-to={args.report_every}",
        f"--max-batches={args.max_batches}",
        *(["--no-amp"] if args.no_amp else []),
    ]
    env = {**os.environ, **nccl_log_env(nccl_dir)}
    result = torchrun_json(
        WORKER,
        worker_args,
        gpus=gpus,
        out=out,
        env=env,
        cwd=HERE.parent,
        verbose=args.verbose,
        timeout=300 + 4 * args.seconds,
    )
    result["nccl_transports"] = nccl_transports(nccl_dir)
    return result


def searchlab_config(
    args: argparse.Namespace, gpus: int, root: pathlib.Path, epoch_images: int, total: int
) -> dict[str, Any]:
    return {
        "name": "data-parallel",
        "entrypoint": "model_def:CifarResNetTrial",
        "hyperparameters": {
            "global_batch_size": args.per_gpu_batch * gpus,
            "num_workers": args.num_workers,
            "amp": not args.no_amp,
        },
        "searcher": {
            "name": "single",
            "metric": "validation_loss",
            "max_length": {"batches": total},
        },
        "resources": {"slots_per_trial": gpus, "cpus_per_trial": args.cpus_per_worker},
        "scheduling_unit": args.report_every,
        "checkpoint_policy": "none",
        "max_restarts": 0,
        "reproducibility": {"experiment_seed": 0},
        "data": {
            "root": str(root),
            "n_train": args.n_train,
            "n_test": args.n_test,
            "epoch_images": epoch_images,
        },
    }


def start_ray(gpus: int, nccl_env: dict[str, str]) -> bool:
    """Start Ray here (once for every searchlab run), as ``searchlab._ray_env.connect_ray`` would.

    Ray gets ``num_gpus`` = ``gpus`` (0 without CUDA): the first of the GPUs that
    ``CUDA_VISIBLE_DEVICES`` shows, which ``select_gpus`` narrowed to ``--gpus``. Its worker
    processes inherit this process's environment at this moment, so ``nccl_env`` is set only
    around ``ray.init`` (the torchrun runs get their own). With ``RAY_ADDRESS`` set, joins that
    cluster instead (which counts its own resources). Returns False when Ray was up already.
    """
    ray_environment().__enter__()  # the benchmark's whole life is one run: never restored
    import ray

    if ray.is_initialized():
        return False
    address = os.environ.get("RAY_ADDRESS") or None
    kwargs = ray_init_kwargs()
    if address is None:
        kwargs["num_gpus"] = gpus if torch.cuda.is_available() else 0
    with environment(nccl_env):
        ray.init(address=address, **kwargs)
    return True


def wait_for_ray_resources(timeout_s: float = 60.0) -> float:
    """Wait until the last search's actors gave back their CPUs and GPUs; returns the wait."""
    import ray

    began = time.time()
    total = ray.cluster_resources()
    while time.time() - began < timeout_s:
        free = ray.available_resources()
        if all(free.get(k, 0.0) >= total[k] - 1e-6 for k in ("CPU", "GPU") if k in total):
            break
        time.sleep(0.5)
    return time.time() - began


def run_searchlab(
    args: argparse.Namespace,
    gpus: int,
    root: pathlib.Path,
    epoch_images: int,
    timed_batches: int,
    tmp: pathlib.Path,
    round_no: int,
    nccl_dir: pathlib.Path,
) -> dict[str, Any]:
    """One search on the Ray that ``start_ray`` started (searchlab.run leaves it running)."""
    total = args.report_every + timed_batches
    global_batch = args.per_gpu_batch * gpus
    earlier_logs = nccl_logs(nccl_dir)  # the workers of every search log into one folder
    results, wall = run_search(
        searchlab_config(args, gpus, root, epoch_images, total),
        model_dir=MODEL_DIR,
        storage_path=tmp / "search",
        name=f"data-parallel-{round_no}",
        trials=1,
        verbose=args.verbose,
    )
    training = results.metrics[results.metrics["group"] == "training"].sort_values("batches")
    times = training["wall_time"].to_numpy(dtype=float)
    done = training["batches"].to_numpy(dtype=float)
    expected = list(range(args.report_every, total + 1, args.report_every))
    if done.tolist() != expected or len(done) < 3:
        raise RuntimeError(f"training reports at batches {done.tolist()}, expected {expected}")
    # The clock starts at the first report: its window (batches 1..report_every) is warm-up.
    kept_losses = training["loss"].to_numpy(dtype=float)[1:]
    # Waits between a report and the next window's first batch, inside the timed windows.
    gaps = training["report_gap_s"].to_numpy(dtype=float)[1:]
    return {
        "report_gap_s": {
            "median": float(statistics.median(gaps)),
            "max": float(gaps.max()),
            "share_of_timed": float(gaps.sum() / (times[-1] - times[0])),
        },
        "samples_per_s": float((done[-1] - done[0]) * global_batch / (times[-1] - times[0])),
        "timed_batches": int(done[-1] - done[0]),
        "timed_s": float(times[-1] - times[0]),
        "timed_began_unix": float(times[0]),
        "timed_ended_unix": float(times[-1]),
        "window_batches": args.report_every,
        "window_samples_per_s": [
            float((b1 - b0) * global_batch / (t1 - t0))
            for t0, t1, b0, b1 in zip(times, times[1:], done, done[1:])
        ],
        "loss_mean": float(kept_losses.mean()),
        "world_size": gpus,
        "per_gpu_batch": args.per_gpu_batch,
        "global_batch": global_batch,
        "batches_trained": total,
        "reports": len(training),
        "epoch_images": epoch_images,
        "cpus_per_worker": args.cpus_per_worker,
        "experiment_wall_s": wall,
        "nccl_transports": nccl_transports(nccl_dir, skip=earlier_logs),
    }


# How each side's rank processes show in ``/proc`` (``RankWatch``): the torchrun workers,
# started by torchrun, and the Ray actors of a searchlab data-parallel trial, started by raylet.
RANK_MATCH = {
    "torchrun": RankMatch(
        is_rank=lambda cmd: str(WORKER) in cmd and "torch.distributed.run" not in cmd,
        is_launcher=lambda cmd: "torch.distributed.run" in cmd,
    ),
    "searchlab": RankMatch(
        is_rank=lambda cmd: cmd.startswith("ray::TrialWorker"),
        is_launcher=lambda cmd: "raylet" in cmd,
    ),
}


def rank_threads(watch: RankWatch, side: dict[str, Any]) -> list[dict[str, Any]]:
    """Each rank's threads' CPU over the side's timed window, and its CPU time per batch."""
    ranks = watch.threads(side["timed_began_unix"], side["timed_ended_unix"])
    per_batch = side["timed_s"] / side["timed_batches"]
    for rank in ranks:
        if "cpu_cores" in rank:
            rank["cpu_ms_per_batch"] = rank["cpu_cores"] * per_batch * 1e3
    return ranks
