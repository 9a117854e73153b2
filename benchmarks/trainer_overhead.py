"""Trainer overhead: the same MLP through searchlab's ``Trainer`` and a hand-written loop.

    PYTHONPATH=. python benchmarks/trainer_overhead.py [--rounds 41] [--batches 32] [--threads N]

Both sides train the same model (same initial weights, SGD with momentum, cross-entropy) on the
same random CPU data in the same order (searchlab's ``EpochShuffleSampler``), in this
process, in alternating rounds of ``--batches`` batches. The Trainer runs one ``fit`` with its
defaults (TensorBoard logging on) and ``scheduling_unit`` set to the round length; at each
training report a callback ends the trainer's round and runs the hand-written round right away,
so each pair of rounds runs back to back. Each side's round ends the same way: the mean loss of
the round as a Python float. Validation and the final checkpoint come after the timed rounds.
After the last round both models must be bit-identical, which shows both sides did the same work.

Prints a table of samples/s per round and writes ``benchmarks/results/trainer_overhead.json``.
``summary.trainer_over_handwritten`` is the median over rounds of (trainer samples/s) /
(hand-written samples/s) of the same pair: pairing rounds that ran back to back cancels most of
the drift of a shared machine. The ratio of the two sides' median samples/s and of their
fastest rounds are kept beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import tempfile
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from searchlab import pytorch
from searchlab.pytorch.samplers import EpochShuffleSampler

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "trainer_overhead.json"
SEED = 0


def make_data(n: int, features: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(
        torch.randn(n, features, generator=g), torch.randint(0, 10, (n,), generator=g)
    )


def make_model(features: int, width: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(features, width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, 10),
    )


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


class BenchTrial(pytorch.PyTorchTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        hp = context.get_hparams()
        self.features, self.n_train = int(hp["features"]), int(hp["n_train"])
        self.model = context.wrap_model(make_model(self.features, int(hp["width"])))
        self.opt = context.wrap_optimizer(make_optimizer(self.model))

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(
            make_data(self.n_train, self.features, seed=1),
            batch_size=self.context.get_per_slot_batch_size(),
            shuffle=True,
        )

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        bs = self.context.get_per_slot_batch_size()
        return pytorch.DataLoader(make_data(bs, self.features, seed=2), batch_size=bs)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        x, y = batch
        loss = nn.functional.cross_entropy(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return {"loss": loss}

    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        x, y = batch
        return {"validation_loss": nn.functional.cross_entropy(self.model(x), y)}

    def build_callbacks(self) -> dict[str, pytorch.PyTorchCallback]:
        return dict(getattr(self, "benchmark_callbacks", {}))


class Interleave(pytorch.PyTorchCallback):
    """Ends the trainer's round at each training report and runs the hand-written round."""

    def __init__(self, hand: HandLoop, batches: int) -> None:
        self.hand, self.batches = hand, batches
        # Per round: (trainer, hand-written) wall seconds, and the same in process CPU seconds.
        self.wall: list[tuple[float, float]] = []
        self.cpu: list[tuple[float, float]] = []

    def on_training_start(self) -> None:
        self.mark = (time.perf_counter(), time.process_time())

    def on_training_workload_end(self, avg_metrics: Any, batch_metrics: Any) -> None:
        trainer = (time.perf_counter() - self.mark[0], time.process_time() - self.mark[1])
        start = (time.perf_counter(), time.process_time())
        self.hand.round(self.batches)
        hand = (time.perf_counter() - start[0], time.process_time() - start[1])
        self.wall.append((trainer[0], hand[0]))
        self.cpu.append((trainer[1], hand[1]))
        self.mark = (time.perf_counter(), time.process_time())


class HandLoop:
    """What a user would write without searchlab, doing the same work per round."""

    def __init__(self, hp: dict[str, Any]) -> None:
        torch.manual_seed(SEED)  # as searchlab.pytorch.init(seed=SEED) does before the trial
        self.model = make_model(hp["features"], hp["width"])
        self.opt = make_optimizer(self.model)
        data = make_data(hp["n_train"], hp["features"], seed=1)
        self.sampler = EpochShuffleSampler(data, seed=SEED)
        self.loader = torch.utils.data.DataLoader(
            data, batch_size=hp["global_batch_size"], sampler=self.sampler
        )
        self.epoch, self.batches = 0, 0
        self.it = self._epoch_iter()

    def _epoch_iter(self) -> Any:
        self.sampler.set_epoch(self.epoch)
        return iter(self.loader)

    def _next(self) -> Any:
        try:
            return next(self.it)
        except StopIteration:
            self.epoch += 1
            self.it = self._epoch_iter()
            return next(self.it)

    def round(self, batches: int) -> None:
        self.model.train()
        losses = []
        for _ in range(batches):
            x, y = self._next()
            loss = nn.functional.cross_entropy(self.model(x), y)
            loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            losses.append(loss.detach())
        self.batches += batches
        self.train_loss = float(torch.stack(losses).mean())


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu_model": cpu,
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    hp = {
        "global_batch_size": args.batch_size,
        "features": args.features,
        "width": args.width,
        "n_train": args.batch_size * args.batches_per_epoch,
    }
    samples = args.batches * args.batch_size
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        exp_conf = {"scheduling_unit": args.batches}
        with pytorch.init(hparams=hp, exp_conf=exp_conf, checkpoint_dir=tmp, seed=SEED) as ctx:
            trial = BenchTrial(ctx)
            hand = HandLoop(hp)
            interleave = Interleave(hand, args.batches)
            trial.benchmark_callbacks = {"interleave": interleave}
            trainer = pytorch.Trainer(trial, ctx)
            # Round 0 includes starting up (data loader, TensorBoard writer): not counted.
            trainer.fit(max_length=pytorch.Batch(args.batches * (args.rounds + 1)))
            identical = all(
                torch.equal(a, b) for a, b in zip(trial.model.parameters(), hand.model.parameters())
            )
    rows = [
        {
            "round": r,
            "trainer_samples_per_s": samples / t_trainer,
            "handwritten_samples_per_s": samples / t_hand,
            "ratio": t_hand / t_trainer,
            "cpu_ratio": c_hand / c_trainer,
        }
        for r, ((t_trainer, t_hand), (c_trainer, c_hand)) in enumerate(
            zip(interleave.wall, interleave.cpu)
        )
        if r
    ]
    trainer_med = statistics.median(r["trainer_samples_per_s"] for r in rows)
    hand_med = statistics.median(r["handwritten_samples_per_s"] for r in rows)
    trainer_best = max(r["trainer_samples_per_s"] for r in rows)
    hand_best = max(r["handwritten_samples_per_s"] for r in rows)
    return {
        "summary": {
            "trainer_over_handwritten": statistics.median(r["ratio"] for r in rows),
            "ratio_of_medians": trainer_med / hand_med,
            # Each side's fastest round: the least disturbed by other work on the machine.
            "ratio_of_best_rounds": trainer_best / hand_best,
            # Samples per CPU-second of this process (all its threads): other processes taking
            # the CPU hardly change it, unlike wall time on a shared machine.
            "cpu_time_ratio": statistics.median(r["cpu_ratio"] for r in rows),
            "load_average_before_after": [load_before, os.getloadavg()[0]],
            "trainer_samples_per_s": trainer_med,
            "handwritten_samples_per_s": hand_med,
            "final_weights_identical": identical,
            "machine": machine(),
        },
        "config": {**hp, "rounds": args.rounds, "batches_per_round": args.batches},
        "rounds": rows,
    }


def print_table(result: dict[str, Any]) -> None:
    print(f"{'round':>5}  {'trainer samples/s':>18}  {'hand-written samples/s':>22}  {'ratio':>6}")
    for r in result["rounds"]:
        print(
            f"{r['round']:>5}  {r['trainer_samples_per_s']:>18.0f}  "
            f"{r['handwritten_samples_per_s']:>22.0f}  {r['ratio']:>6.3f}"
        )
    s = result["summary"]
    print(
        f"{'median':>5}  {s['trainer_samples_per_s']:>18.0f}  "
        f"{s['handwritten_samples_per_s']:>22.0f}  {s['trainer_over_handwritten']:>6.3f}"
    )
    m = s["machine"]
    print(
        f"trainer/hand-written = {s['trainer_over_handwritten']:.3f} (median of per-round ratios; "
        f"ratio of medians {s['ratio_of_medians']:.3f}, of best rounds "
        f"{s['ratio_of_best_rounds']:.3f}; per CPU-second {s['cpu_time_ratio']:.3f}); "
        f"final weights identical: {s['final_weights_identical']}"
    )
    load = s["load_average_before_after"]
    print(
        f"{m['cpu_model']} ({m['cpus']} CPUs), {m['torch_threads']} torch threads, "
        f"torch {m['torch']}; load average {load[0]:.1f} -> {load[1]:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--batches", type=int, default=32, help="batches per round")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--batches-per-epoch", type=int, default=32)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    result = run(args)
    print_table(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
