"""The worker's part of a trial hand-over, piece by piece, in one process on one GPU.

    PYTHONPATH=. python benchmarks/handover_parts.py [--repeats 5]   # 1 GPU, ~30 s
    PYTHONPATH=. python benchmarks/handover_parts.py --quick        # CPU, tiny CNN

In ``vs_ray_asha.py`` a hand-over (one trial's last batch to the next trial's first) takes
~0.5 s on both sides and a rung end a trial goes on from ~0.1 s on searchlab's side. This
times, with ``asha_model/asha_def.py:TrainStep`` (ResNet-18, batch 256 resident on the GPU,
bf16, SGD with momentum; ``--quick``: a tiny CNN on CPU), the pieces a searchlab worker runs
there, each after a warm-up and ``--repeats`` times (medians):

- ``capture_s``: the model's and optimizer's ``state_dict()`` (references, no copies);
- ``host_copy_s``: searchlab's ``host_copy`` of that state (each tensor to pageable host
  memory, what a background checkpoint write snapshots); ``host_copy_pinned_s``: the same
  into pinned buffers with non-blocking copies and one synchronisation, the alternative;
- ``save_s``: ``torch.save`` of the host copy into a file (the background thread's work);
- ``load_s``: ``torch.load`` of that file to host memory (a resume from disk);
- ``close_s``: dropping the trained step, with the allocator's cache given back
  (``empty_cache_close_s``, what ``reset_config`` does) or kept (``keep_cache_close_s``);
- ``rebuild_first_batch_*_s``: building the next step and training its first batch
  (synchronised), after each kind of close;
- with a loader of CIFAR-shaped images (``TrainStep``'s settings: 4 workers, pinned memory,
  persistent workers), once through torch's ``DataLoader`` (``torch_loader_*``) and once
  through searchlab's (``searchlab_loader_*``: the seeded, resumable stream a trial trains
  on), each on a freshly built step: ``first_batch_s``, from making the loader's iterator
  (its workers' fork) to the first batch in pinned host memory; ``first_step_s``, that
  batch's training step (the optimizer's first, as in a new trial); ``batch_s``, a
  later batch's wait (median of 20, each after a training step); ``close_s``, dropping the
  iterator (its workers' shutdown), what every new or resumed trial pays at its start and end.

Writes ``benchmarks/results/handover_parts.json`` and prints the medians.
"""

from __future__ import annotations

import argparse
import functools
import io
import pathlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "asha_model"))

from _common import add_common_args, machine_info, print_table, result_path, write_result
from asha_def import TrainStep

from searchlab.experiment._checkpoint_writer import host_copy


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(device: torch.device, fn: Callable[[], Any]) -> tuple[float, Any]:
    _sync(device)
    began = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - began, out


def _train(step: TrainStep, batches: int) -> None:
    for _ in range(batches):
        step.train_step(None)  # a resident batch: the step reads it on the device


def pinned_copy(obj: Any) -> Any:
    """``obj`` with device tensors copied into pinned host buffers, one synchronisation."""

    def walk(o: Any) -> Any:
        if isinstance(o, torch.Tensor):
            if o.device.type == "cpu":
                return o.detach().clone()
            buf = torch.empty(o.shape, dtype=o.dtype, pin_memory=True)
            return buf.copy_(o.detach(), non_blocking=True)
        if isinstance(o, dict):
            return {k: walk(v) for k, v in o.items()}
        if isinstance(o, list | tuple):
            return type(o)(walk(v) for v in o)
        return o

    out = walk(obj)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return out


def loader_parts(step: TrainStep, kind: str) -> dict[str, float]:
    """Start, first batch, steady batch and close of ``step``'s loader (torch's or searchlab's)."""
    kwargs, dataset = step.loader_kwargs(), step.dataset()
    if kind == "torch":

        def start() -> Iterator[Any]:
            return iter(torch.utils.data.DataLoader(dataset, **kwargs))

    else:
        from searchlab.pytorch import DataLoader

        epochs = DataLoader(dataset, **kwargs).build(seed=0)

        def start() -> Iterator[Any]:
            return epochs.stream(0, 0)

    device = step.device
    out: dict[str, float] = {}
    _sync(device)
    began = time.perf_counter()
    batches = start()
    batch = next(batches)
    out["first_batch_s"] = time.perf_counter() - began
    out["first_step_s"], _ = _timed(device, functools.partial(step.train_step, batch))
    waits = []
    for _ in range(20):
        began = time.perf_counter()
        batch = next(batches)
        waits.append(time.perf_counter() - began)
        step.train_step(batch)
    out["batch_s"] = statistics.median(waits)
    _sync(device)
    began = time.perf_counter()
    close = getattr(batches, "close", None)
    if callable(close):
        close()
    del batches, batch  # the iterator's last reference: its workers end here
    out["close_s"] = time.perf_counter() - began
    return {f"{kind}_loader_{k}": v for k, v in out.items()}


def one_round(hp: dict[str, Any], device: torch.device, batches: int, tmp: pathlib.Path) -> dict:
    step = TrainStep(hp, device, seed=0)
    _train(step, batches)
    out: dict[str, float] = {}
    out["capture_s"], state = _timed(
        device, lambda: {"model": step.model.state_dict(), "opt": step.opt.state_dict()}
    )
    out["host_copy_s"], copied = _timed(device, lambda: host_copy(state))
    if device.type == "cuda":
        out["host_copy_pinned_s"], _ = _timed(device, lambda: pinned_copy(state))
    path = tmp / "state.pth"

    def save() -> None:
        with open(path, "wb") as f:
            torch.save(copied, f)

    out["save_s"], _ = _timed(device, save)
    out["state_mb"] = path.stat().st_size / 2**20
    out["load_s"], _ = _timed(
        device, lambda: torch.load(io.BytesIO(path.read_bytes()), map_location="cpu")
    )
    state = copied = None  # the trial's memory goes with it

    for kind, empty in (("empty_cache", True), ("keep_cache", False)):

        def close(empty: bool = empty) -> None:
            nonlocal step
            del step
            if empty and device.type == "cuda":
                torch.cuda.empty_cache()

        out[f"{kind}_close_s"], _ = _timed(device, close)

        def rebuild() -> TrainStep:
            new = TrainStep({**hp, "lr": 0.02}, device, seed=1)
            _train(new, 1)
            return new

        out[f"rebuild_first_batch_{kind}_s"], step = _timed(device, rebuild)
        _train(step, batches)
    for kind in ("torch", "searchlab"):  # each on a fresh step, as a new trial starts
        out.update(loader_parts(TrainStep({**hp, "data": "loader"}, device, seed=2), kind))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batches", type=int, default=20, help="trained before each capture")
    args = parser.parse_args()
    quick = args.quick or not torch.cuda.is_available()
    device = torch.device("cpu" if quick else "cuda")
    hp = {
        "model": "tiny" if quick else "resnet18",
        "batch": 32 if quick else 256,
        "lr": 0.01,
        "data": "resident",
    }
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats + 1):  # the first round warms up (cuDNN, allocator)
            got = one_round(hp, device, 2 if quick else args.batches, pathlib.Path(tmp))
            if i:
                rounds.append(got)
    summary = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    summary["card"] = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print_table([{"part": k, "median": v} for k, v in summary.items() if k != "card"])
    write_result(
        result_path("handover_parts", args),
        summary,
        rounds=rounds,
        config={"hp": hp, "repeats": args.repeats, "quick": quick},
        machine=machine_info(),
    )


if __name__ == "__main__":
    main()
