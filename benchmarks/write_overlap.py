"""What a checkpoint write beside training costs the training loop: none, a thread, a process.

    PYTHONPATH=. python benchmarks/write_overlap.py [--blocks 6] [--batches 300] [--period 0.45]
    PYTHONPATH=. python benchmarks/write_overlap.py --smoke     # CPU, tiny CNN, a few seconds

At a rung end that a trial goes on from, searchlab writes the trial's state (ResNet-18 with
SGD momentum: 89 MB). Written before the next window (``SEARCHLAB_BACKGROUND_CHECKPOINTS=idle``,
the default until call 5E), the trial waited a median 0.11-0.18 s at each of 8-15 such rung
ends per run of ``vs_ray_asha.py``'s short workload on an H100, 1.1-2.2 s of a ~40 s search.
Writing it beside the next window instead only pays if the write does not slow the window by
more. This measures that, on the step of ``vs_ray_asha.py`` (``asha_model/asha_def.py``'s
``TrainStep``: ResNet-18, a resident batch of 256, bf16, channels-last; ``--smoke``: a tiny
CNN on CPU), in one process. The loop here is bare (no trainer around each batch), and a
single block's rate moves with the host by up to ~15%: read the medians.

``--device cpu`` with ``--model resnet18`` measures the same on a laptop's CPU, where the
write and the training share the cores.

- ``none``: the loop alone;
- ``thread``: a thread of this process writes the state (a host copy in pinned memory, as
  searchlab's ``CheckpointWriter`` holds it) as its writer thread does
  (``write_checkpoint_state``: ``torch.save`` to a temporary file, renamed; no ``fsync``),
  starting a write every ``--period`` seconds (as rung ends come in the short workload);
- ``process``: a spawned process, which loaded the same state once, writes it the same way on
  the same cadence: the same disk and memory traffic, but no share of this process's GIL.

The modes run in blocks of ``--batches`` batches, in rotating order (``--blocks`` blocks of
each), after a warm-up and one untimed write by each writer; a write still going at a block's
end is waited for and counted in that block, so none runs into the next. Each block of ``thread`` or ``process`` is read against the median of
the ``none`` blocks just before and after it (``ratio``), as the host's speed drifts. Prints a
table and writes ``benchmarks/results/write_overlap.json``: ``summary`` (each mode's median
ratio and rate, the writes per block and the median write time) and every block.
"""

from __future__ import annotations

import argparse
import itertools
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

from searchlab.experiment._checkpoint_writer import _nbytes, host_copy
from searchlab.pytorch._checkpoint import write_checkpoint_state

MODES = ("none", "thread", "process")


class Signals:
    """What the training side and a writer share (process-safe): ``go`` (write while set),
    ``started`` (set as a write starts), ``idle`` (set while the writer waits for ``go``),
    ``ready`` (set after its untimed first write), ``stop``, and the count and seconds of the
    writes."""

    def __init__(self, ctx: Any) -> None:
        self.go, self.started, self.idle, self.ready, self.stop = (ctx.Event() for _ in range(5))
        self.done, self.times = ctx.Value("i", 0), ctx.Value("d", 0.0)


def _write(directory: str, state: Any) -> None:
    # As searchlab's writer thread writes a rung end's state (no fsync: Tune syncs nothing).
    write_checkpoint_state(directory, state, durable=False)


def _write_loop(state: Any, directory: str, period: float, sig: Signals) -> None:
    """Start a write every ``period`` s while ``sig.go`` is set; count them; end at ``stop``.
    One untimed write first: the first write of a file is slower (its pages are new)."""
    _write(directory, state)
    sig.ready.set()
    while not sig.stop.is_set():
        if not sig.go.is_set():
            sig.idle.set()
            sig.go.wait(0.02)
            continue
        sig.started.set()
        began = time.perf_counter()
        _write(directory, state)
        took = time.perf_counter() - began
        with sig.done.get_lock():
            sig.done.value += 1
            sig.times.value += took
        time.sleep(max(period - took, 0.0))


def _process_main(path: str, directory: str, period: float, sig: Signals) -> None:
    _write_loop(torch.load(path, weights_only=True), directory, period, sig)


class Writer:
    """Writes ``state`` beside training, from a thread or a spawned process."""

    def __init__(self, mode: str, state: Any, workdir: pathlib.Path, period: float) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.sig = Signals(ctx)
        directory = workdir / mode
        directory.mkdir()
        if mode == "thread":
            args: tuple[Any, ...] = (state, str(directory), period, self.sig)
            self.worker: Any = threading.Thread(target=_write_loop, args=args)
        else:
            path = workdir / "state.pth"
            torch.save(state, path)
            args = (str(path), str(directory), period, self.sig)
            self.worker = ctx.Process(target=_process_main, args=args)
        self.worker.start()

    def begin(self) -> None:
        """Start writing; return once the first write has started (as a rung end's write
        starts with the window after it)."""
        self.sig.started.clear()
        self.sig.go.set()
        if not self.sig.started.wait(60):
            raise SystemExit("the writer did not start a write within 60 s")
        # Only now: until go was seen the loop kept setting idle, and end() must wait for
        # the write in flight.
        self.sig.idle.clear()

    def end(self) -> None:
        """Stop writing and wait for a write that runs past the block (counted in it)."""
        self.sig.go.clear()
        if not self.sig.idle.wait(600):
            raise SystemExit("the writer did not finish its write within 600 s")

    def counts(self) -> tuple[int, float]:
        with self.sig.done.get_lock():
            return self.sig.done.value, self.sig.times.value

    def close(self) -> None:
        self.sig.stop.set()
        self.worker.join()


def block_order(block: int) -> tuple[str, ...]:
    """The modes of block ``block``: rotated by one each block, so each mode takes each
    place (first after the last block's end, between the others, last) equally often."""
    shift = block % len(MODES)
    return MODES[shift:] + MODES[:shift]


def run(args: argparse.Namespace) -> dict[str, Any]:
    from asha_def import TrainStep, train_rate

    cuda = torch.cuda.is_available() and not args.quick and args.device != "cpu"
    device = torch.device("cuda" if cuda else "cpu")
    model = args.model or ("resnet18" if device.type == "cuda" and not args.quick else "tiny")
    step = TrainStep({"lr": 0.01, "model": model, "batch": args.batch}, device, seed=0)
    resident = itertools.repeat(None)  # the step trains its resident batch
    train_rate(step, resident, max(args.batches // 3, 2))  # warm-up: cuDNN's tuning, momentum
    state = host_copy(
        {
            "models_state_dict": [step.model.state_dict()],
            "optimizers_state_dict": [step.opt.state_dict()],
        }
    )
    state_mb = _nbytes(state) / 1e6
    blocks: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        writers = {m: Writer(m, state, pathlib.Path(tmp), args.period) for m in MODES[1:]}
        try:
            for each in writers.values():  # the process has imported torch, loaded, written
                if not each.sig.ready.wait(300):
                    raise SystemExit("a writer did not start within 300 s")
            train_rate(step, resident, max(args.batches // 3, 2))  # warm again after the start-up
            for b in range(args.blocks):
                for mode in block_order(b):
                    writer: Writer | None = writers.get(mode)
                    before = writer.counts() if writer else (0, 0.0)
                    if writer:
                        writer.begin()
                    rate = train_rate(step, resident, args.batches)
                    if writer:
                        writer.end()
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
