"""Data-parallel throughput: a multi-GPU searchlab trial vs torchrun DDP of the same loop.

    PYTHONPATH=. python benchmarks/data_parallel.py [--gpus 2] [--seconds 50]
    PYTHONPATH=. python benchmarks/data_parallel.py --smoke   # CPU, gloo, 2 processes, tiny

Both sides train ResNet-18 on synthetic CIFAR-shaped data (``benchmarks/resnet_model/``) on
``--gpus`` GPUs (default: all visible, at least 2; the first ones when fewer are asked for),
with ``--per-gpu-batch`` 256 per GPU (global batch 512 on 2 GPUs), SGD + momentum, bf16
autocast, channels-last, and a loader per GPU with ``--num-workers`` 4 workers, pinned memory,
``drop_last``, non-blocking copies and a shuffled shard of the data for each rank. One epoch
covers the whole run on both sides (the 50,000 images repeat), so no loader restarts inside it.

1. **torchrun** first: ``python -m torch.distributed.run --standalone --nproc_per_node=G
   benchmarks/_ddp_torchrun.py`` (plain PyTorch: ``DistributedDataParallel``,
   ``DistributedSampler``, no searchlab or Ray). After ``--warmup`` batches and
   ``--calibration`` batches, rank 0 picks the timed length N (a multiple of
   ``--report-every``) that takes about ``--seconds``, then times N batches between two
   ``torch.cuda.synchronize()`` calls and writes a JSON. ``--batches N`` fixes N instead.
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

So both sides time the same N batches of the same work after a warm-up.
``searchlab_over_torchrun`` is searchlab's samples/s over torchrun's; target >= 0.95. The
window rates (each ``--report-every`` batches: searchlab between reports, torchrun by CUDA
events) are kept to show the spread. On GPU, NCCL's set-up log (``NCCL_DEBUG=INFO``, subsystem
INIT, to files; not if ``NCCL_DEBUG`` is set already) gives each side's ``nccl_transports``:
Ray gives each worker only its own GPU, torchrun ranks see all, and NCCL may connect them
differently (``P2P/...`` or ``SHM/...``). Before anything runs, the script checks that the
torchrun worker's model builder gives the same weights as ``model_def.make_model``. Prints a
table and writes ``benchmarks/results/data_parallel.json`` (``--smoke``: into the temp
directory).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch
from _cifar import MODEL_DIR, ensure_fake_cifar  # also puts resnet_model/ on sys.path
from model_def import HPARAM_DEFAULTS

import searchlab

HERE = pathlib.Path(__file__).resolve().parent
WORKER = HERE / "_ddp_torchrun.py"
RESULTS = HERE / "results" / "data_parallel.json"
TARGET = 0.95
# The torchrun run's epoch must hold every batch it may train before N is known: N is capped
# at this rate times --seconds (far above what ResNet-18 at 256 per GPU reaches).
MAX_BATCHES_PER_S = 150


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


def nccl_transports(folder: pathlib.Path) -> dict[str, int] | None:
    """How many NCCL channels of the ranks use each transport ("P2P/CUMEM", "SHM/...")."""
    counts: collections.Counter[str] = collections.Counter()
    for log in folder.glob("nccl.*.log"):
        for line in log.read_text(errors="replace").splitlines():
            found = re.search(r"Channel .* via (\S+)", line)
            if found:
                counts[found.group(1)] += 1
    return dict(counts) or None


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


def run_torchrun(
    args: argparse.Namespace, gpus: int, root: pathlib.Path, epoch_images: int, tmp: pathlib.Path
) -> dict[str, Any]:
    out = tmp / "torchrun.json"
    hp = HPARAM_DEFAULTS
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={gpus}",
        str(WORKER),
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
        f"--batches={args.batches}",
        f"--round-to={args.report_every}",
        f"--max-batches={args.max_batches}",
        *(["--no-amp"] if args.no_amp else []),
    ]
    # torchrun's own default for several processes per node, stated so it prints no warning.
    # The rest of the environment (NCCL settings included) reaches every rank as it is.
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    env.update(nccl_log_env(tmp / "nccl-torchrun"))
    began = time.time()
    proc = subprocess.run(
        cmd,
        env=env,
        cwd=HERE.parent,
        capture_output=not args.verbose,
        text=True,
        timeout=300 + 4 * args.seconds,
        check=False,
    )
    wall = time.time() - began
    if proc.returncode != 0 or not out.is_file():
        if proc.stdout or proc.stderr:
            print("\n".join(((proc.stdout or "") + (proc.stderr or "")).splitlines()[-60:]))
        raise RuntimeError(f"torchrun exited with {proc.returncode}: {' '.join(cmd)}")
    result = json.loads(out.read_text())
    result["launch_wall_s"] = wall
    result["nccl_transports"] = nccl_transports(tmp / "nccl-torchrun")
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


def run_searchlab(
    args: argparse.Namespace,
    gpus: int,
    root: pathlib.Path,
    epoch_images: int,
    timed_batches: int,
    tmp: pathlib.Path,
) -> dict[str, Any]:
    total = args.report_every + timed_batches
    global_batch = args.per_gpu_batch * gpus
    lines: list[str] = []
    echo = print if args.verbose else lines.append
    # Ray starts inside searchlab.run, so its workers inherit this process's environment.
    nccl_env = nccl_log_env(tmp / "nccl-searchlab")
    os.environ.update(nccl_env)
    began = time.time()
    try:
        results = searchlab.run(
            searchlab_config(args, gpus, root, epoch_images, total),
            model_dir=MODEL_DIR,
            storage_path=tmp / "search",
            name="data-parallel",
            echo=echo,
        )
    except Exception:
        print("\n".join(lines[-40:]))
        raise
    finally:
        for key in nccl_env:
            os.environ.pop(key, None)
    wall = time.time() - began
    states = results.trials["state"].tolist()
    if states != ["COMPLETED"]:
        print("\n".join(lines[-40:]))
        raise RuntimeError(f"expected one completed trial, got states {states}")
    training = results.metrics[results.metrics["group"] == "training"].sort_values("batches")
    times = training["wall_time"].to_numpy(dtype=float)
    done = training["batches"].to_numpy(dtype=float)
    expected = list(range(args.report_every, total + 1, args.report_every))
    if done.tolist() != expected or len(done) < 3:
        raise RuntimeError(f"training reports at batches {done.tolist()}, expected {expected}")
    # The clock starts at the first report: its window (batches 1..report_every) is warm-up.
    kept_losses = training["loss"].to_numpy(dtype=float)[1:]
    return {
        "samples_per_s": float((done[-1] - done[0]) * global_batch / (times[-1] - times[0])),
        "timed_batches": int(done[-1] - done[0]),
        "timed_s": float(times[-1] - times[0]),
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
        "nccl_transports": nccl_transports(tmp / "nccl-searchlab"),
    }


def machine(gpus: int) -> dict[str, Any]:
    import ray
    from trainer_parity import machine_info

    cuda = torch.cuda.is_available()
    info = {**machine_info(), "ray": ray.__version__, "processes_per_side": gpus}
    info.update(gpus_used=gpus if cuda else 0, gpu_names=[])
    if cuda:
        info["gpu_names"] = [torch.cuda.get_device_name(i) for i in range(gpus)]
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    info["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    return info


def window_stats(rates: list[float]) -> dict[str, float]:
    return {"median": statistics.median(rates), "min": min(rates), "max": max(rates)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    began = time.time()
    gpus = select_gpus(args)
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
    # One epoch holds everything either side trains (torchrun trains the most: its warm-up
    # and calibration, then at most max_batches), so neither restarts its loader mid-run.
    most = max(args.warmup + args.calibration, r) + args.max_batches + 1
    epoch_images = most * args.per_gpu_batch * gpus
    with tempfile.TemporaryDirectory(prefix="searchlab-data-parallel-") as tmp:
        print(f"torchrun: DDP on {gpus} {'GPUs' if not args.smoke else 'CPU processes'} ...")
        ddp = run_torchrun(args, gpus, root, epoch_images, pathlib.Path(tmp))
        n = int(ddp["timed_batches"])
        print(
            f"torchrun: {ddp['samples_per_s']:.0f} samples/s over {n} batches "
            f"({ddp['timed_s']:.1f} s; launch to exit {ddp['launch_wall_s']:.0f} s)",
            flush=True,
        )
        print(f"searchlab: {gpus}-worker trial, {r + n} batches ...", flush=True)
        ours = run_searchlab(args, gpus, root, epoch_images, n, pathlib.Path(tmp))
        print(
            f"searchlab: {ours['samples_per_s']:.0f} samples/s over {ours['timed_batches']} "
            f"batches ({ours['timed_s']:.1f} s; search took {ours['experiment_wall_s']:.0f} s)",
            flush=True,
        )
    ours["window_stats"] = window_stats(ours["window_samples_per_s"])
    ddp["window_stats"] = window_stats(ddp["window_samples_per_s"])
    ratio = ours["samples_per_s"] / ddp["samples_per_s"]
    return {
        "summary": {
            "searchlab_over_torchrun": ratio,
            "searchlab_samples_per_s": ours["samples_per_s"],
            "torchrun_samples_per_s": ddp["samples_per_s"],
            "window_median_ratio": ours["window_stats"]["median"] / ddp["window_stats"]["median"],
            "target": TARGET,
            "meets_target": ratio >= TARGET,
            "gpus": gpus,
            "global_batch": args.per_gpu_batch * gpus,
            "measure": "samples/s over the same N batches after warm-up (see docstring)",
        },
        "searchlab": ours,
        "torchrun": ddp,
        "machine": machine(gpus),
        "config": {
            "model": "torchvision resnet18(num_classes=10), channels_last",
            "device": "cuda" if torch.cuda.is_available() else "cpu",
            "autocast": None if args.no_amp else "bfloat16",
            "gpus": gpus,
            "per_gpu_batch": args.per_gpu_batch,
            "global_batch": args.per_gpu_batch * gpus,
            "optimizer": {k: HPARAM_DEFAULTS[k] for k in ("lr", "momentum", "weight_decay")},
            "num_workers": args.num_workers,
            "pin_memory": torch.cuda.is_available(),
            "report_every": r,
            "torchrun_warmup": args.warmup,
            "torchrun_calibration": args.calibration,
            "seconds": args.seconds,
            "timed_batches": n,
            "searchlab_batches": r + n,
            "cpus_per_worker": args.cpus_per_worker,
            "epoch_images": epoch_images,
            "n_train": args.n_train,
            "n_test": args.n_test,
            "data": "synthetic CIFAR-10 files (throughput only)",
            "benchmark_wall_s": time.time() - began,
            "smoke": args.smoke,
        },
    }


def print_table(result: dict[str, Any]) -> None:
    print(
        f"{'side':<9}  {'GPUs':>4}  {'batch':>5}  {'timed batches':>13}  {'timed s':>7}  "
        f"{'samples/s':>9}  {'window median':>13}  {'window min-max':>15}  {'loss':>6}"
    )
    for name in ("torchrun", "searchlab"):
        s = result[name]
        w = s["window_stats"]
        print(
            f"{name:<9}  {s['world_size']:>4}  {s['global_batch']:>5}  {s['timed_batches']:>13}  "
            f"{s['timed_s']:>7.1f}  {s['samples_per_s']:>9.0f}  {w['median']:>13.0f}  "
            f"{w['min']:>7.0f}-{w['max']:<7.0f}  {s['loss_mean']:>6.3f}"
        )
    s, m = result["summary"], result["machine"]
    verdict = "meets" if s["meets_target"] else "MISSES"
    print(
        f"searchlab / torchrun = {s['searchlab_over_torchrun']:.3f} (window medians: "
        f"{s['window_median_ratio']:.3f}): {verdict} the target >= {s['target']}"
    )
    if m["gpu"]:
        print(
            f"NCCL transports: torchrun {result['torchrun']['nccl_transports']}, "
            f"searchlab {result['searchlab']['nccl_transports']}"
        )
    gpu = f"{m['gpu']} x{m['gpus_used']}" if m["gpu"] else "no GPU: " + m["cpu_model"]
    print(f"{gpu}, torch {m['torch']}, CUDA {m['cuda']}, NCCL {m.get('nccl')}, ray {m['ray']}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpus", type=int, default=0, help="GPUs per side (0: all, >= 2)")
    parser.add_argument("--per-gpu-batch", type=int, default=256)
    parser.add_argument("--num-workers", type=int, default=4, help="DataLoader workers per GPU")
    parser.add_argument("--seconds", type=float, default=50.0, help="aim of each timed part")
    parser.add_argument("--batches", type=int, default=0, help="timed batches (0: --seconds)")
    parser.add_argument(
        "--report-every", type=int, default=100, help="scheduling_unit; N is a multiple"
    )
    parser.add_argument("--warmup", type=int, default=100, help="torchrun's untimed batches")
    parser.add_argument("--calibration", type=int, default=50, help="torchrun's batches to pick N")
    parser.add_argument(
        "--cpus-per-worker", type=float, default=1.0, help="resources.cpus_per_trial"
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
    if args.smoke:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before anything touches CUDA; children inherit
        args.gpus, args.per_gpu_batch, args.num_workers = 2, 8, 1
        args.seconds, args.report_every, args.warmup, args.calibration = 3.0, 3, 3, 2
        args.cpus_per_worker, args.n_train, args.n_test = 0.5, 256, 32
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
