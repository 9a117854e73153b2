"""What a checkpoint write beside training costs the training loop: none, a thread, a process.

    PYTHONPATH=. python benchmarks/write_overlap.py [--blocks 6] [--batches 300] [--period 0.45]
    PYTHONPATH=. python benchmarks/write_overlap.py --smoke     # CPU, tiny CNN, a few seconds

At a rung end that a trial goes on from, searchlab writes the trial's state (ResNet-18 with
SGD momentum: ~85 MB) before the next window (``SEARCHLAB_BACKGROUND_CHECKPOINTS=idle``, the
default): 0.11-0.14 s at each of 13-25 such rung ends per run of ``vs_ray_asha.py``'s short
workload on an H100, 1.8-2.8 s of a ~40 s search. Writing it beside the next window instead
only pays if the write does not slow the window by more. This measures that, on the step of
``vs_ray_asha.py`` (``asha_model/asha_def.py``'s ``TrainStep``: ResNet-18, a resident batch of
256, bf16, channels-last; ``--smoke``: a tiny CNN on CPU), in one process:

``--device cpu`` with ``--model resnet18`` measures the same on a laptop's CPU, where the
write and the training share the cores.

- ``none``: the loop alone;
- ``thread``: a thread of this process writes the state (a host copy in pinned memory, as
  searchlab's ``CheckpointWriter`` holds it) with searchlab's ``write_checkpoint_state``
  (``torch.save`` to a temporary file, ``fsync``, rename), starting a write every
  ``--period`` seconds (as rung ends come in the short workload);
- ``process``: a spawned process, which loaded the same state once, writes it the same way on
  the same cadence: the same disk and memory traffic, but no share of this process's GIL.

The modes run in blocks of ``--batches`` batches, in rotating order (``--blocks`` blocks of
each), after a warm-up. Each block of ``thread`` or ``process`` is read against the median of
the ``none`` blocks just before and after it (``ratio``), as the host's speed drifts. Prints a
table and writes ``benchmarks/results/write_overlap.json``: ``summary`` (each mode's median
ratio and rate, the writes per block and the median write time) and every block.
"""

from __future__ import annotations

import argparse
import multiprocessing
import pathlib
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "asha_model"))
from _common import add_common_args, machine_info, print_table, result_path, write_result

from searchlab.experiment._checkpoint_writer import host_copy
from searchlab.pytorch._checkpoint import write_checkpoint_state

MODES = ("none", "thread", "process")


def _write_loop(
    state: Any, directory: str, period: float, go: Any, stop: Any, done: Any, times: Any
) -> None:
    """Start a write every ``period`` s while ``go`` is set; count them; end at ``stop``."""
    while not stop.is_set():
        if not go.wait(0.05):
            continue
        began = time.perf_counter()
        write_checkpoint_state(directory, state)
        took = time.perf_counter() - began
        with done.get_lock():
            done.value += 1
            times.value += took
        time.sleep(max(period - took, 0.0))


def _process_main(
    path: str,
    ready: Any,
    directory: str,
    period: float,
    go: Any,
    stop: Any,
    done: Any,
    times: Any,
) -> None:
    state = torch.load(path, weights_only=True)
    ready.set()
    _write_loop(state, directory, period, go, stop, done, times)


class Writer:
    """Writes ``state`` beside training, from a thread or a spawned process."""

    def __init__(self, mode: str, state: Any, workdir: pathlib.Path, period: float) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.go, self.stop, self.ready = ctx.Event(), ctx.Event(), ctx.Event()
        self.done, self.times = ctx.Value("i", 0), ctx.Value("d", 0.0)
        directory = workdir / mode
        directory.mkdir()
        args = (str(directory), period, self.go, self.stop, self.done, self.times)
        if mode == "thread":
            self.worker: Any = threading.Thread(target=_write_loop, args=(state, *args))
            self.ready.set()
        else:
            path = workdir / "state.pth"
            torch.save(state, path)
            self.worker = ctx.Process(target=_process_main, args=(str(path), self.ready, *args))
        self.worker.start()

    def counts(self) -> tuple[int, float]:
        with self.done.get_lock():
            return self.done.value, self.times.value

    def close(self) -> None:
        self.stop.set()
        self.worker.join()


def _block(step: Any, device: torch.device, n: int) -> float:
    """Batches per second of ``n`` steps, between two synchronisations."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(n):
        loss = step.loss(*step.resident)
        step.opt.zero_grad(set_to_none=True)
        loss.backward()
        step.opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return n / (time.perf_counter() - began)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from asha_def import TrainStep

    cuda = torch.cuda.is_available() and not args.quick and args.device != "cpu"
    device = torch.device("cuda" if cuda else "cpu")
    model = args.model or ("resnet18" if device.type == "cuda" and not args.quick else "tiny")
    step = TrainStep({"lr": 0.01, "model": model, "batch": args.batch}, device, seed=0)
    _block(step, device, max(args.batches // 3, 2))  # warm-up: cuDNN's tuning, momentum
    state = host_copy(
        {
            "models_state_dict": [step.model.state_dict()],
            "optimizers_state_dict": [step.opt.state_dict()],
        }
    )
    state_mb = sum(t.numel() * t.element_size() for t in _tensors(state)) / 1e6
    blocks: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        writers = {m: Writer(m, state, pathlib.Path(tmp), args.period) for m in MODES[1:]}
        try:
            for each in writers.values():  # the process has imported torch and loaded
                if not each.ready.wait(300):
                    raise SystemExit("the writer process did not start within 300 s")
            _block(step, device, max(args.batches // 3, 2))  # warm again after the start-up
            for b in range(args.blocks):
                order = MODES[b % 3 :] + MODES[: b % 3]
                for mode in order:
                    writer: Writer | None = writers.get(mode)
                    before = writer.counts() if writer else (0, 0.0)
                    if writer:
                        writer.go.set()
                    rate = _block(step, device, args.batches)
                    if writer:
                        writer.go.clear()
                    after = writer.counts() if writer else (0, 0.0)
                    writes = after[0] - before[0]
                    blocks.append(
                        {
                            "block": b,
                            "mode": mode,
                            "batches_per_s": rate,
                            "writes": writes,
                            "write_s": (after[1] - before[1]) / writes if writes else None,
                        }
                    )
                    time.sleep(args.period)  # let a write begun in the block end outside the next
        finally:
            for each in writers.values():
                each.close()
    _bracket(blocks)
    summary: dict[str, Any] = {"state_mb": state_mb, "device": str(device), "model": model}
    for mode in MODES:
        mine = [b for b in blocks if b["mode"] == mode]
        summary[f"{mode}_batches_per_s"] = statistics.median(b["batches_per_s"] for b in mine)
        if mode != "none":
            ratios = [b["ratio"] for b in mine if b["ratio"] is not None]
            summary[f"{mode}_ratio"] = statistics.median(ratios) if ratios else None
            summary[f"{mode}_writes_per_block"] = statistics.median(b["writes"] for b in mine)
            times = [b["write_s"] for b in mine if b["write_s"] is not None]
            summary[f"{mode}_write_s"] = statistics.median(times) if times else None
    return {"summary": summary, "blocks": blocks}


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v)]
    return []


def _bracket(blocks: list[dict[str, Any]]) -> None:
    """Each writing block's rate over the median of the nearest ``none`` block on each side."""
    for i, block in enumerate(blocks):
        block["ratio"] = None
        if block["mode"] == "none":
            continue
        before = next((b for b in reversed(blocks[:i]) if b["mode"] == "none"), None)
        after = next((b for b in blocks[i + 1 :] if b["mode"] == "none"), None)
        near = [b["batches_per_s"] for b in (before, after) if b is not None]
        if near:
            block["ratio"] = block["batches_per_s"] / statistics.median(near)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--blocks", type=int, default=6, help="blocks of each mode")
    parser.add_argument("--batches", type=int, default=300, help="batches per block")
    parser.add_argument("--batch", type=int, default=256, help="images per batch")
    parser.add_argument("--period", type=float, default=0.45, help="seconds from write to write")
    parser.add_argument("--device", choices=("auto", "cpu"), default="auto")
    parser.add_argument(
        "--model",
        choices=("resnet18", "tiny"),
        default=None,
        help="default: resnet18 on CUDA, the tiny CNN on CPU and with --smoke",
    )
    parser.add_argument("--workdir", default=None, help="where the writes go (default: $TMPDIR)")
    args = parser.parse_args()
    if args.quick:
        args.blocks, args.batches, args.batch, args.period = 2, 20, 8, 0.05
        args.model = None
    result = run(args)
    print_table(result["blocks"], ["block", "mode", "batches_per_s", "writes", "write_s", "ratio"])
    s = result["summary"]
    print(
        f"{s['model']} on {s['device']}, {s['state_mb']:.0f} MB of state written every "
        f"{args.period} s: thread {s['thread_ratio']:.3f}, process {s['process_ratio']:.3f} "
        "of the loop alone (median of bracketed blocks)"
    )
    write_result(
        result_path("write_overlap", args),
        summary=s,
        blocks=result["blocks"],
        config=vars(args),
        machine=machine_info(("torch",)),
    )


if __name__ == "__main__":
    main()
