"""The torchrun side of ``data_parallel.py``: plain PyTorch DDP, one process per GPU.

    python -m torch.distributed.run --standalone --nproc_per_node=2 benchmarks/_ddp_torchrun.py \\
        --data-root DIR --epoch-images E --out result.json [--seconds 50 | --batches N]

No searchlab and no Ray: only torch, torch.distributed and the synthetic CIFAR data of
``benchmarks/resnet_model/cifar_data.py`` (imported through ``_cifar``). Each rank trains the
same model as ``resnet_model/model_def.py`` (a layer that turns uint8 images into normalised
floats on the device, then ``torchvision.models.resnet18(num_classes=10)``, channels-last),
wrapped in ``DistributedDataParallel``, with SGD + momentum, under bf16 autocast, on
``CifarTensors`` sharded by ``torch.utils.data.distributed.DistributedSampler`` (shuffled,
seed 0) and loaded by a ``DataLoader`` with ``--num-workers`` workers, pinned memory,
``drop_last`` and non-blocking copies. ``data_parallel.py`` checks that :func:`make_model`
builds the same weights as ``model_def.make_model`` and passes the trial's optimizer settings.

The loop (every rank):

1. ``--warmup`` batches (cuDNN autotuning, loader start-up, NCCL buffers);
2. ``--calibration`` batches, timed on rank 0 between ``torch.cuda.synchronize()`` calls;
   unless ``--batches`` is given, rank 0 picks the timed length ``N`` from their rate so that
   it takes about ``--seconds`` (a multiple of ``--round-to``, at least two of them, at most
   ``--max-batches``) and broadcasts it;
3. ``N`` timed batches: rank 0 synchronises, reads the clock, trains, synchronises and reads it
   again. Nothing inside waits for the GPU: the losses stay on the device until the end. CUDA
   events every ``--round-to`` batches (recorded on the stream, never waited on) give the
   rate of each window, for comparison with searchlab's per-report windows.

Rank 0 writes ``--out`` (JSON): ``samples_per_s`` = N x global batch / timed seconds, the
window rates, the mean loss of the timed batches (averaged over ranks), and the ranks' devices.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import pathlib
import platform
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torchvision
from _cifar import CifarTensors  # this script's folder is on sys.path; _cifar adds resnet_model/
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

# The constants of resnet_model/model_def.py:CifarInput (which imports searchlab, so not here).
_MEAN = (0.4914, 0.4822, 0.4465)
_STD = (0.2470, 0.2435, 0.2616)


class CifarInput(nn.Module):
    """uint8 images to normalised floats on the device, as ``model_def.CifarInput``."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, channels_last: bool) -> None:
        super().__init__()
        self.channels_last = channels_last
        self.register_buffer("mean", torch.tensor(_MEAN).view(1, 3, 1, 1) * 255)
        self.register_buffer("std", torch.tensor(_STD).view(1, 3, 1, 1) * 255)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = (x.float() - self.mean) / self.std
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x


def make_model(channels_last: bool = True) -> nn.Module:
    """``CifarInput`` then ``torchvision.models.resnet18(num_classes=10)``, as model_def's."""
    model = nn.Sequential(CifarInput(channels_last), torchvision.models.resnet18(num_classes=10))
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


def batches(loader: DataLoader, sampler: DistributedSampler) -> Iterator[Any]:
    """The loader's batches, epoch after epoch (the benchmark sizes one epoch to cover all)."""
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def shard_batches(
    data_root: pathlib.Path,
    epoch_images: int,
    *,
    world: int,
    rank: int,
    batch: int,
    workers: int,
    cuda: bool,
    seed: int,
) -> Iterator[Any]:
    """This rank's batches: a shuffled shard of the training images (``DistributedSampler``),
    ``drop_last``, ``workers`` loader processes, pinned memory on GPU (also ``dp_loop.py``'s)."""
    data = CifarTensors.load(data_root, train=True, length=epoch_images)
    sampler: DistributedSampler[Any] = DistributedSampler(
        data, num_replicas=world, rank=rank, shuffle=True, seed=seed
    )
    loader = DataLoader(
        data,
        batch_size=batch,
        sampler=sampler,
        drop_last=True,
        num_workers=workers,
        pin_memory=cuda,
    )
    return batches(loader, sampler)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-root", type=pathlib.Path, required=True)
    p.add_argument("--epoch-images", type=int, required=True, help="images in one epoch")
    p.add_argument("--out", type=pathlib.Path, required=True, help="rank 0's JSON")
    p.add_argument("--per-gpu-batch", type=int, default=256)
    p.add_argument("--num-workers", type=int, default=4, help="DataLoader workers per rank")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--no-amp", action="store_true", help="fp32 instead of bf16 autocast")
    p.add_argument("--no-channels-last", action="store_true")
    p.add_argument("--warmup", type=int, default=100, help="untimed batches first")
    p.add_argument("--calibration", type=int, default=50, help="batches timed to pick N")
    p.add_argument("--seconds", type=float, default=50.0, help="aim of the timed part")
    p.add_argument("--batches", type=int, default=0, help="timed batches N (0: from --seconds)")
    p.add_argument("--round-to", type=int, default=100, help="N is a multiple of this")
    p.add_argument("--max-batches", type=int, default=10**9, help="largest N")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def pick_length(args: argparse.Namespace, calibration_rate: float) -> int:
    """The timed batches: ``--batches``, or about ``--seconds`` at the calibration rate."""
    r = args.round_to
    if args.batches:
        return args.batches
    n = math.ceil(args.seconds * calibration_rate / r) * r
    return max(2 * r, min(n, args.max_batches // r * r))


def main() -> None:
    args = parse_args()
    began = time.time()
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP broadcasts too)

    amp = not args.no_amp
    model = make_model(not args.no_channels_last).to(device)
    model = DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
    opt = torch.optim.SGD(
        model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay
    )
    stream = shard_batches(
        args.data_root,
        args.epoch_images,
        world=world,
        rank=rank,
        batch=args.per_gpu_batch,
        workers=args.num_workers,
        cuda=cuda,
        seed=args.seed,
    )
    model.train()
    ready = time.time()

    def step() -> torch.Tensor:
        x, y = next(stream)
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    for _ in range(args.warmup):
        step()
    sync(device)

    start = time.perf_counter()
    for _ in range(args.calibration):
        step()
    sync(device)
    calibration_s = time.perf_counter() - start
    calibration_rate = args.calibration / calibration_s if args.calibration else math.nan
    box = torch.tensor([pick_length(args, calibration_rate) if rank == 0 else 0], device=device)
    dist.broadcast(box, src=0)  # rank 0's choice, so every rank trains the same N
    n = int(box.item())

    # The timed part: nothing in it waits for the GPU.
    window = args.round_to
    events: list[Any] = []
    clocks: list[float] = []
    losses: list[torch.Tensor] = []

    def mark() -> None:
        if cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            events.append(ev)
        else:
            clocks.append(time.perf_counter())

    sync(device)
    start = time.perf_counter()
    timed_began_unix = time.time()
    mark()
    for i in range(n):
        losses.append(step())
        if (i + 1) % window == 0 or i + 1 == n:
            mark()
    sync(device)
    timed_s = time.perf_counter() - start
    timed_ended_unix = time.time()

    if cuda:
        gaps = [a.elapsed_time(b) / 1000 for a, b in itertools.pairwise(events)]
    else:
        gaps = [b - a for a, b in itertools.pairwise(clocks)]
    sizes = [min(window, n - i * window) for i in range(len(gaps))]
    global_batch = args.per_gpu_batch * world
    loss_mean = torch.stack(losses).float().mean()
    dist.all_reduce(loss_mean)
    loss = float(loss_mean) / world
    where = {
        "rank": rank,
        "device": str(device),
        "name": torch.cuda.get_device_name(device) if cuda else platform.processor() or "cpu",
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }
    ranks: list[Any] = [None] * world
    dist.all_gather_object(ranks, where)
    if rank == 0:
        result = {
            "samples_per_s": n * global_batch / timed_s,
            "timed_batches": n,
            "timed_s": timed_s,
            "timed_began_unix": timed_began_unix,
            "timed_ended_unix": timed_ended_unix,
            "window_batches": window,
            "window_samples_per_s": [b * global_batch / g for b, g in zip(sizes, gaps)],
            "calibration_samples_per_s": calibration_rate * global_batch,
            "loss_mean": loss,
            "world_size": world,
            "backend": dist.get_backend(),
            "device": device.type,
            "autocast": "bfloat16" if amp else None,
            "per_gpu_batch": args.per_gpu_batch,
            "global_batch": global_batch,
            "warmup_batches": args.warmup,
            "calibration_batches": args.calibration,
            "batches_trained": args.warmup + args.calibration + n,
            "epoch_images": args.epoch_images,
            "num_workers": args.num_workers,
            "setup_s": ready - began,
            "process_wall_s": time.time() - began,
            "ranks": ranks,
            "torch": torch.__version__,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
