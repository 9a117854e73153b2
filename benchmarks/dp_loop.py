"""searchlab's TrialLoop against a hand-written DDP loop of the same step, under torchrun, no Ray.

    PYTHONPATH=. python benchmarks/dp_loop.py [--gpus 2] [--rounds 3] [--batches 800]
    PYTHONPATH=. python benchmarks/dp_loop.py --smoke   # CPU, gloo, 2 processes, < 1 min

Each run is ``python -m torch.distributed.run --standalone --nproc_per_node=G
benchmarks/dp_loop.py --worker --side S ...``: G processes (one per GPU, nccl; ``--smoke``: 2
CPU processes, gloo, 2 images a batch), each training ResNet-18 (``model_def.make_model``,
channels-last, behind the uint8-to-float input layer) at ``--batch`` images per rank with SGD +
momentum (``model_def``'s defaults) under bf16 autocast (``--no-amp``: fp32), on synthetic
CIFAR-shaped data loaded with ``--workers`` workers per rank, pinned memory on GPU, ``drop_last``
and a shuffled shard per rank. One epoch covers the whole run, so no loader restarts inside it.
The sides, the same step on the same data:

- ``hand``: plain PyTorch as ``benchmarks/_ddp_torchrun.py``: ``DistributedDataParallel`` (with
  more than one rank, as ``wrap_model``), ``DistributedSampler``, non-blocking copies, forward
  and loss under autocast, then ``backward``, ``opt.step()``, ``opt.zero_grad(set_to_none)``;
- ``loop``: searchlab's ``TrialLoop`` (the loop of ``Trainer.fit`` and of the Ray trainable) on
  ``model_def.CifarResNetTrial``, the trial of ``data_parallel.py`` (``use_amp``, ``wrap_model``,
  ``context.backward``, ``step_optimizer``, searchlab's ``DataLoader``, the ``wall_time`` and
  ``report_gap_s`` reducers), driven in the main thread with ``scheduling_unit`` ``--every``: a
  training report (losses to the host, metrics gathered over ranks) every ``--every`` batches;
- ``handwide``: ``hand`` with ``backward`` and the optimizer step inside autocast too, as
  searchlab's loop places them.

Every rank trains ``--warmup`` batches untimed, then times ``--batches`` batches (multiples of
``--every``; for ``loop`` from the report that ends the warm-up to the one that ends the timed
batches). At both ends it waits for the GPU, then reads ``time.perf_counter`` (wall),
``time.process_time`` (process CPU: the rank's threads, not its loader workers) and
``getrusage`` (user and system CPU). ``--profile DIR``: rank 0 of each run profiles its timed
batches with cProfile into ``DIR/<side>-round<i>.prof`` (profiling inflates the CPU figures).

The sides run one after another, ``--rounds`` times (default 3; ``--smoke``: 2): ``hand``,
``loop``, ``handwide`` in rounds 1, 3, ...; the reverse order in rounds 2, 4, ..., so a drift
over the benchmark hits each side in every position. A run's wall ms per batch is its slowest
rank's (DDP keeps the ranks in step). ``loop_over_hand`` is the median over rounds of the pair
ratio hand ms / loop ms in the same round (searchlab's rate over the hand loop's; 1.0 is
parity), and ``handwide_over_hand`` the same for ``handwide``. Prints a row per run (wall ms
per batch, and CPU ms per batch of every rank and their mean) and the medians over rounds, and
writes ``benchmarks/results/dp_loop.json`` (``--smoke``: the temp directory): ``summary``,
``runs`` (every run with its ranks), ``config``, ``machine``.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pathlib
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from _cifar import ensure_fake_cifar  # also puts resnet_model/ on sys.path
from _common import add_common_args, print_table, result_path, torchrun_json, write_result
from _ddp_torchrun import shard_batches
from model_def import HPARAM_DEFAULTS, CifarResNetTrial, make_model, make_optimizer
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from searchlab.pytorch import DistributedContext, PyTorchTrialContext
from searchlab.pytorch._loop import LoopSettings, TrialLoop
from searchlab.pytorch._trainer import seed_everything

HERE = pathlib.Path(__file__).resolve().parent
SIDES = ("hand", "loop", "handwide")
SMOKE = {"batch": 2, "workers": 1, "warmup": 2, "batches": 6, "every": 2}


class Clock:
    """Wall, process CPU and rusage at the ends of the timed batches (after the GPU is done)."""

    def __init__(self) -> None:
        self.marks: list[tuple[float, float, float, float]] = []

    def mark(self) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self.marks.append(
            (time.perf_counter(), time.process_time(), usage.ru_utime, usage.ru_stime)
        )

    def per_batch_ms(self, batches: int) -> dict[str, float]:
        (w0, c0, u0, s0), (w1, c1, u1, s1) = self.marks
        ms = 1e3 / batches
        return {
            "wall_ms_per_batch": (w1 - w0) * ms,
            "cpu_ms_per_batch": (c1 - c0) * ms,
            "user_ms_per_batch": (u1 - u0) * ms,
            "sys_ms_per_batch": (s1 - s0) * ms,
        }


def timed(clock: Clock, profile: pathlib.Path | None, rank: int, body: Callable[[], None]) -> None:
    """``body`` between two clock marks; profiled on rank 0 where ``profile`` is given."""
    prof = cProfile.Profile() if profile and rank == 0 else None
    clock.mark()
    if prof:
        prof.enable()
    body()
    if prof:
        prof.disable()
    clock.mark()
    if prof and profile:
        prof.dump_stats(profile)


def run_hand(args: argparse.Namespace, rank: int, world: int, clock: Clock) -> None:
    """The ``hand``/``handwide`` side: ``_ddp_torchrun.py``'s loop."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = bool(HPARAM_DEFAULTS["cudnn_benchmark"])  # as the trial
    model: nn.Module = make_model().to(device)
    if world > 1:  # as context.wrap_model: DDP only with several ranks
        model = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    opt = make_optimizer(model, HPARAM_DEFAULTS)
    stream = shard_batches(
        args.data_root,
        args.epoch_images,
        world=world,
        rank=rank,
        batch=args.batch,
        workers=args.workers,
        cuda=cuda,
        seed=0,
    )
    model.train()
    amp, wide = not args.no_amp, args.side == "handwide"

    def step() -> None:
        x, y = next(stream)
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = nn.functional.cross_entropy(model(x), y)
            if wide:  # searchlab's structure: backward and the step inside autocast too
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
        if not wide:
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    def train() -> None:
        for _ in range(args.batches):
            step()

    for _ in range(args.warmup):
        step()
    timed(clock, args.profile, rank, train)


def run_loop(args: argparse.Namespace, rank: int, world: int, clock: Clock) -> None:
    """The ``loop`` side: ``TrialLoop.run`` in the main thread, a report every ``--every``."""
    seed_everything(rank)
    hparams = {
        "global_batch_size": args.batch * world,
        "amp": not args.no_amp,
        "num_workers": args.workers,
    }
    context = PyTorchTrialContext(
        hparams,
        exp_conf={"data": {"root": str(args.data_root), "epoch_images": args.epoch_images}},
        distributed=DistributedContext(rank=rank, size=world),
        trial_seed=0,
    )
    settings = LoopSettings(
        scheduling_unit=args.every, checkpoint_policy="none", searcher_metric="validation_loss"
    )
    loop = TrialLoop(CifarResNetTrial(context), context, settings)
    # Past the timed batches, so the final validation and report are never reached.
    loop.target = args.warmup + args.batches + args.every
    events = loop.run()

    def train() -> None:
        while next(events).batches < args.warmup + args.batches:
            pass

    while next(events).batches < args.warmup:
        pass
    timed(clock, args.profile, rank, train)


def worker(args: argparse.Namespace) -> NoReturn:
    """One rank of a torchrun run; rank 0 writes every rank's figures to ``--out``."""
    torch.set_num_threads(1)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        torch.backends.cudnn.benchmark = True
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    clock = Clock()
    (run_loop if args.side == "loop" else run_hand)(args, rank, world, clock)
    mine = {"rank": rank, "pid": os.getpid(), **clock.per_batch_ms(args.batches)}
    ranks: list[Any] = [None] * world
    dist.all_gather_object(ranks, mine)
    if rank == 0:
        run = {
            "side": args.side,
            "world_size": world,
            "backend": dist.get_backend(),
            "device": torch.cuda.get_device_name() if cuda else "cpu",
            "ranks": ranks,
        }
        args.out.write_text(json.dumps(run, indent=2) + "\n")
    dist.destroy_process_group()
    sys.stdout.flush()
    # The figures are written: skip the interpreter's teardown (the loop side leaves its
    # generator and loader workers mid-epoch), on both sides alike.
    os._exit(0)


def launch(
    args: argparse.Namespace, side: str, round_no: int, gpus: int, tmp: pathlib.Path
) -> dict[str, Any]:
    """One torchrun run of ``side``; its ranks' figures with the run's wall and CPU per batch."""
    out = tmp / f"{side}-round{round_no}.json"
    worker_args = [
        "--worker",
        f"--side={side}",
        f"--out={out}",
        f"--data-root={args.data_root}",
        f"--epoch-images={args.epoch_images}",
        f"--batch={args.batch}",
        f"--workers={args.workers}",
        f"--warmup={args.warmup}",
        f"--batches={args.batches}",
        f"--every={args.every}",
        *(["--no-amp"] if args.no_amp else []),
        *([f"--profile={args.profile / f'{side}-round{round_no}.prof'}"] if args.profile else []),
    ]
    path = os.pathsep.join(p for p in (str(HERE.parent), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    run = torchrun_json(
        pathlib.Path(__file__).resolve(),
        worker_args,
        gpus=gpus,
        out=out,
        env=env,
        cwd=HERE.parent,
        verbose=args.verbose,
        timeout=300 + args.warmup + args.batches,
    )
    ranks = run["ranks"]
    return {
        "round": round_no,
        **run,
        "wall_ms_per_batch": max(r["wall_ms_per_batch"] for r in ranks),
        "cpu_ms_per_batch": statistics.mean(r["cpu_ms_per_batch"] for r in ranks),
    }


def order(round_no: int) -> tuple[str, ...]:
    """``hand, loop, handwide`` in odd rounds (1, 3, ...), reversed in even ones."""
    return SIDES if round_no % 2 else SIDES[::-1]


def summarise(runs: list[dict[str, Any]], gpus: int) -> dict[str, Any]:
    """Medians over rounds of the paired wall-rate ratios, and of each side's figures."""
    by_round: dict[int, dict[str, dict[str, Any]]] = {}
    for run in runs:
        by_round.setdefault(run["round"], {})[run["side"]] = run
    pairs = {
        f"{side}_over_hand": [
            r["hand"]["wall_ms_per_batch"] / r[side]["wall_ms_per_batch"] for r in by_round.values()
        ]
        for side in ("loop", "handwide")
    }
    return {
        "loop_over_hand": statistics.median(pairs["loop_over_hand"]),
        "handwide_over_hand": statistics.median(pairs["handwide_over_hand"]),
        "pair_ratios": pairs,
        "wall_ms_per_batch": {
            s: statistics.median(r["wall_ms_per_batch"] for r in runs if r["side"] == s)
            for s in SIDES
        },
        "cpu_ms_per_batch": {
            s: statistics.median(r["cpu_ms_per_batch"] for r in runs if r["side"] == s)
            for s in SIDES
        },
        "rounds": len(by_round),
        "gpus": gpus,
    }


def select_gpus(args: argparse.Namespace) -> int:
    """Ranks per run (``--smoke``: 2 CPU processes); narrows CUDA_VISIBLE_DEVICES to them."""
    if args.quick:
        return 2
    count = torch.cuda.device_count()
    gpus = args.gpus or count
    if count < 1:
        raise SystemExit("dp_loop.py needs a GPU; use --smoke to check the script on CPU")
    if gpus > count:
        raise SystemExit(f"--gpus {gpus}, but only {count} GPU(s) are visible")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(count)]
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(ids[:gpus])
    return gpus


def run(args: argparse.Namespace) -> dict[str, Any]:
    gpus = select_gpus(args)
    n_train, n_test = (256, 32) if args.quick else (50_000, 512)
    args.data_root = ensure_fake_cifar(
        pathlib.Path(tempfile.gettempdir()) / f"searchlab-fake-cifar-{n_train}-{n_test}-0",
        n_train,
        n_test,
    )
    # One epoch holds every batch of a run (the n_train images repeat): no loader restarts.
    args.epoch_images = (args.warmup + args.batches + args.every + 1) * args.batch * gpus
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()  # not with --smoke: CUDA_VISIBLE_DEVICES is empty
    what = "GPU(s)" if cuda else "CPU processes"
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="searchlab-dp-loop-") as tmp:
        for i in range(1, args.rounds + 1):
            for side in order(i):
                print(f"round {i}/{args.rounds}: {side} on {gpus} {what} ...", flush=True)
                runs.append(launch(args, side, i, gpus, pathlib.Path(tmp)))
    return {
        "summary": summarise(runs, gpus),
        "runs": runs,
        "config": {
            "model": "resnet18",
            "device": "cuda" if cuda else "cpu",
            "autocast": None if args.no_amp else "bfloat16",
            "gpus": gpus,
            "per_rank_batch": args.batch,
            "global_batch": args.batch * gpus,
            "workers_per_rank": args.workers,
            "warmup_batches": args.warmup,
            "timed_batches": args.batches,
            "every": args.every,
            "epoch_images": args.epoch_images,
            "rounds": args.rounds,
            "order": "hand, loop, handwide in odd rounds; reversed in even rounds",
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "1"),
            "profiled": bool(args.profile),
            "smoke": args.quick,
        },
    }


def report(result: dict[str, Any]) -> None:
    gpus = result["config"]["gpus"]
    rows = [
        {
            "round": r["round"],
            "side": r["side"],
            "wall_ms": r["wall_ms_per_batch"],
            "cpu_ms_mean": r["cpu_ms_per_batch"],
            **{f"cpu_ms_r{x['rank']}": x["cpu_ms_per_batch"] for x in r["ranks"]},
        }
        for r in result["runs"]
    ]
    s = result["summary"]
    rows += [
        {
            "round": "median",
            "side": side,
            "wall_ms": s["wall_ms_per_batch"][side],
            "cpu_ms_mean": s["cpu_ms_per_batch"][side],
        }
        for side in SIDES
    ]
    columns = ["round", "side", "wall_ms", "cpu_ms_mean", *(f"cpu_ms_r{k}" for k in range(gpus))]
    print_table(rows, columns)
    print(
        f"loop/hand rate: {s['loop_over_hand']:.3f}, handwide/hand: {s['handwide_over_hand']:.3f}"
        f" (medians over {s['rounds']} rounds of the paired ratios); ms per timed batch: the "
        "slowest rank's wall, the process CPU of each rank and their mean"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(p)
    p.add_argument("--gpus", type=int, default=0, help="ranks per run (0: all visible GPUs)")
    p.add_argument("--rounds", type=int, default=None, help="runs of each side (3; --smoke: 2)")
    p.add_argument("--batch", type=int, default=256, help="images per rank and batch")
    p.add_argument("--workers", type=int, default=4, help="DataLoader workers per rank")
    p.add_argument("--warmup", type=int, default=100, help="untimed batches first")
    p.add_argument("--batches", type=int, default=800, help="timed batches")
    p.add_argument("--every", type=int, default=100, help="loop's scheduling_unit")
    p.add_argument("--no-amp", action="store_true", help="fp32 instead of bf16 autocast")
    p.add_argument("--profile", type=pathlib.Path, default=None, help="cProfile rank 0 (folder)")
    p.add_argument("--verbose", action="store_true", help="show the torchrun runs' output")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    p.add_argument("--data-root", type=pathlib.Path, help=argparse.SUPPRESS)
    p.add_argument("--epoch-images", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick and not args.worker:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before anything touches CUDA; runs inherit
        vars(args).update(SMOKE)
    if args.rounds is None:
        args.rounds = 2 if args.quick else 3
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.every < 1 or args.warmup < args.every or (args.warmup % args.every) > 0:
        p.error("--warmup must be a positive multiple of --every")
    if args.batches < args.every or args.batches % args.every:
        p.error("--batches must be a positive multiple of --every")
    return args


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args)
    result = run(args)
    report(result)
    write_result(result_path("dp_loop", args), **result)


if __name__ == "__main__":
    main()
