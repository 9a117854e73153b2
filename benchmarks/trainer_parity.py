"""Trainer parity on a GPU: ResNet-18 through searchlab's training loop vs a hand-written loop.

    PYTHONPATH=. python benchmarks/trainer_parity.py [--rounds 30] [--batches 60] [--num-workers 4]
    PYTHONPATH=. python benchmarks/trainer_parity.py --smoke   # tiny, on CPU if no GPU: seconds

Both sides train ``torchvision.models.resnet18(num_classes=10)`` (behind a layer that turns
uint8 images into normalised floats on the device; channels-last) with SGD + momentum,
batch 256, under bf16 autocast, on the same synthetic CIFAR-shaped data (50,000 images
preloaded as one uint8 tensor; ``benchmarks/resnet_model/cifar_data.py``), in this process:

- searchlab: ``benchmarks/resnet_model/model_def.py:CifarResNetTrial`` (``use_amp()``,
  ``wrap_model``, ``context.backward``, ``step_optimizer``, ``searchlab.pytorch.DataLoader``)
  driven by ``TrialLoop``, the loop that both ``Trainer.fit`` and the Ray trainable run;
- hand-written: the same model, optimizer, autocast and ``torch.utils.data.DataLoader``
  settings (same dataset, shuffle, ``drop_last``, ``--num-workers`` workers, pinned memory,
  ``non_blocking`` copies), the loss kept on the GPU until the end of the round.

Rounds alternate (and alternate which side goes first); round 0 of each side warms up
(cuDNN autotuning, loader workers) and is not counted. A round is ``--batches`` batches and
ends when its mean loss is on the host, on both sides (searchlab: at its training report,
timed by the trial's ``wall_time`` metric). The validation and checkpoint point searchlab's
loop reaches at the end of each round are not timed; the hand-written loop has none. One
epoch spans all rounds (the 50,000 images repeat) unless ``--real-epochs``: both loops start
fresh loader workers at every epoch, the same pause on both sides, kept out of the rounds.

One ResNet-18 at batch 256 leaves an H100/H200 mostly idle: each step is bound by the host
(Python and kernel launches), so samples/s moves with the host's load by 10-20 % within a
run. Many short paired rounds are therefore the measurement: ``trainer_over_handwritten``
is the median over rounds of (searchlab samples/s) / (hand-written samples/s) in the same
round (as in ``trainer_overhead.py``), which cancels drift both sides share;
``ratio_of_medians`` (the two sides' median samples/s) and the quartiles of the round ratios
are kept beside it. Target: >= 0.98. Prints a table and writes
``benchmarks/results/trainer_parity.json`` (``--smoke`` writes to the temp directory).
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
from _cifar import CifarTensors, ensure_fake_cifar  # also puts resnet_model/ on sys.path
from model_def import HPARAM_DEFAULTS, CifarResNetTrial, make_model, make_optimizer
from torch import nn

from searchlab import pytorch
from searchlab.pytorch._loop import LoopSettings, TrialLoop
from searchlab.pytorch.samplers import EpochShuffleSampler

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "trainer_parity.json"
SEED = 0
TARGET = 0.98


class HandLoop:
    """What a user would write without searchlab: the same work, batch for batch."""

    def __init__(
        self,
        hp: dict[str, Any],
        root: pathlib.Path,
        device: torch.device,
        epoch_images: int | None,
    ) -> None:
        torch.manual_seed(SEED)  # as searchlab.pytorch.init(seed=SEED) does before the trial
        self.device = device
        self.model = make_model(bool(hp["channels_last"])).to(device)
        self.opt = make_optimizer(self.model, hp)
        self.amp = bool(hp["amp"])
        data = CifarTensors.load(root, train=True, length=epoch_images)
        self.sampler = EpochShuffleSampler(data, seed=SEED)
        self.loader = torch.utils.data.DataLoader(
            data,
            batch_size=int(hp["global_batch_size"]),
            sampler=self.sampler,
            drop_last=True,
            num_workers=int(hp["num_workers"]),
            pin_memory=device.type == "cuda",
        )
        self.epoch = 0
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

    def round(self, batches: int) -> tuple[float, float]:
        """Train ``batches`` batches; returns (seconds, mean loss)."""
        start = time.time()
        self.model.train()
        losses = []
        for _ in range(batches):
            x, y = self._next()
            x = x.to(self.device, non_blocking=True)
            y = y.to(self.device, non_blocking=True)
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp):
                loss = nn.functional.cross_entropy(self.model(x), y)
            loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            losses.append(loss.detach())
        mean = float(torch.stack(losses).mean())
        return time.time() - start, mean


class SearchlabSide:
    """The trial in ``TrialLoop``, advanced ``batches`` at a time."""

    def __init__(self, loop: TrialLoop) -> None:
        self.loop = loop

    def round(self, batches: int) -> tuple[float, float]:
        start = time.time()
        self.loop.target = self.loop.batches_trained + batches
        reports = list(self.loop.run())
        training = [r for r in reports if r.group == "training"]
        assert len(training) == 1, f"expected one training report per round, got {reports}"
        metrics = training[0].metrics
        return metrics["wall_time"] - start, metrics["loss"]


def machine_info() -> dict[str, Any]:
    """The GPU, CPU and library versions a benchmark ran with."""
    cpu = "unknown"
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, Any] = {
        "gpu": None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "python": platform.python_version(),
        "cpu_model": cpu,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(
            gpu=torch.cuda.get_device_name(0),
            gpu_count=torch.cuda.device_count(),
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            bf16_supported=torch.cuda.is_bf16_supported(),
        )
    return info


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data_dir = pathlib.Path(args.data_dir or tempfile.gettempdir())
    root = ensure_fake_cifar(
        data_dir / f"searchlab-fake-cifar-{args.n_train}-{args.n_test}-0",
        args.n_train,
        args.n_test,
    )
    hp = {
        **HPARAM_DEFAULTS,
        "global_batch_size": args.batch_size,
        "num_workers": args.num_workers,
        "amp": not args.no_amp,
    }
    samples = args.batches * args.batch_size
    # One epoch spans the warm-up and every round unless --real-epochs: both loops start new
    # loader workers at each epoch, which would add the same, noisy pause to some rounds.
    epoch_images = None if args.real_epochs else (args.rounds + 1) * samples + args.batch_size
    data = {"root": str(root), "n_train": args.n_train, "n_test": args.n_test}
    exp_conf = {
        "data": {**data, "epoch_images": epoch_images},
        "scheduling_unit": args.batches,
    }
    rows: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        pytorch.init(
            hparams=hp,
            exp_conf=exp_conf,
            checkpoint_dir=tmp,
            seed=SEED,
            enable_tensorboard_logging=False,
        ) as ctx,
    ):
        trial = CifarResNetTrial(ctx)
        # One training report per round: it ends the round, as the hand loop's mean loss does.
        settings = LoopSettings(scheduling_unit=args.batches, checkpoint_policy="none")
        sides: dict[str, SearchlabSide | HandLoop] = {
            "searchlab": SearchlabSide(TrialLoop(trial, ctx, settings)),
            "handwritten": HandLoop(hp, root, device, epoch_images),
        }
        for r in range(args.rounds + 1):  # round 0 warms both up and is not counted
            order = ["searchlab", "handwritten"] if r % 2 == 0 else ["handwritten", "searchlab"]
            timed = {name: sides[name].round(args.batches) for name in order}
            if r:
                (t_s, loss_s), (t_h, loss_h) = timed["searchlab"], timed["handwritten"]
                rows.append(
                    {
                        "round": r,
                        "first": order[0],
                        "trainer_samples_per_s": samples / t_s,
                        "handwritten_samples_per_s": samples / t_h,
                        "ratio": t_h / t_s,
                        "trainer_loss": loss_s,
                        "handwritten_loss": loss_h,
                    }
                )
    trainer_med = statistics.median(r["trainer_samples_per_s"] for r in rows)
    hand_med = statistics.median(r["handwritten_samples_per_s"] for r in rows)
    ratios = [r["ratio"] for r in rows]
    ratio = statistics.median(ratios)
    q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratio, ratio, ratio)
    return {
        "summary": {
            "trainer_over_handwritten": ratio,
            "ratio_of_medians": trainer_med / hand_med,
            "round_ratio_quartiles": [q1, q3],
            "trainer_samples_per_s": trainer_med,
            "handwritten_samples_per_s": hand_med,
            "target": TARGET,
            "meets_target": ratio >= TARGET,
        },
        "machine": machine_info(),
        "config": {
            "model": "torchvision resnet18(num_classes=10), channels_last",
            "device": str(device),
            "autocast": "bfloat16" if hp["amp"] else None,
            "batch_size": args.batch_size,
            "rounds": args.rounds,
            "batches_per_round": args.batches,
            "num_workers": args.num_workers,
            "pin_memory": device.type == "cuda",
            "n_train": args.n_train,
            "epoch_images": epoch_images or args.n_train,
            "data": "synthetic CIFAR-10 files (throughput only)",
            "smoke": args.smoke,
        },
        "rounds": rows,
    }


def print_table(result: dict[str, Any]) -> None:
    print(
        f"{'round':>5}  {'searchlab samples/s':>19}  {'hand-written samples/s':>22}  {'ratio':>6}"
    )
    for r in result["rounds"]:
        print(
            f"{r['round']:>5}  {r['trainer_samples_per_s']:>19.0f}  "
            f"{r['handwritten_samples_per_s']:>22.0f}  {r['ratio']:>6.3f}"
        )
    s, m = result["summary"], result["machine"]
    print(
        f"{'median':>5}  {s['trainer_samples_per_s']:>19.0f}  "
        f"{s['handwritten_samples_per_s']:>22.0f}  {s['trainer_over_handwritten']:>6.3f}"
    )
    verdict = "meets" if s["meets_target"] else "MISSES"
    q1, q3 = s["round_ratio_quartiles"]
    print(
        f"searchlab / hand-written = {s['trainer_over_handwritten']:.3f} (median of round "
        f"ratios; quartiles {q1:.3f}-{q3:.3f}; ratio of medians {s['ratio_of_medians']:.3f}): "
        f"{verdict} the target >= {s['target']}"
    )
    print(f"{m['gpu'] or 'no GPU: ' + m['cpu_model']}, torch {m['torch']}, CUDA {m['cuda']}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=30, help="timed rounds per side")
    parser.add_argument("--batches", type=int, default=60, help="batches per round")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--num-workers", type=int, default=4, help="DataLoader workers")
    parser.add_argument("--n-train", type=int, default=50_000, help="training images")
    parser.add_argument("--n-test", type=int, default=256, help="validation images")
    parser.add_argument(
        "--real-epochs",
        action="store_true",
        help="epochs of --n-train images (loader restarts inside rounds) instead of one long one",
    )
    parser.add_argument("--no-amp", action="store_true", help="fp32 instead of bf16 autocast")
    parser.add_argument("--data-dir", type=pathlib.Path, default=None)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes to check the script (CPU is fine)"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.batches, args.batch_size = 3, 3, 16
        args.num_workers, args.n_train, args.n_test = 2, 256, 32
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
