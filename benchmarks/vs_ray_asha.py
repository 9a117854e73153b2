"""searchlab's promotion ASHA against Ray Tune's own ASHA, end to end on one GPU.

    PYTHONPATH=. python benchmarks/vs_ray_asha.py                 # GPU, ~10 min
    PYTHONPATH=. python benchmarks/vs_ray_asha.py --quick         # CPU, tiny model, ~3 min
    PYTHONPATH=. python benchmarks/vs_ray_asha.py --gpus 2        # one trial per GPU
    PYTHONPATH=. python benchmarks/vs_ray_asha.py --gpus 2 --slots 2   # 2-GPU DDP trials
    PYTHONPATH=. python benchmarks/vs_ray_asha.py --per-gpu 2     # 2 trials share each GPU

With ``--slots S`` (> 1), each trial trains data-parallel on S GPUs, ``--gpus`` / S trials at
a time: searchlab with ``resources.slots_per_trial: S`` (its DDP workers in a placement
group), Ray with Ray Train V2's pattern for tuning a multi-GPU trial, a Tune function
trainable per trial that runs a ``TorchTrainer`` of S workers (``prepare_model``,
``prepare_data_loader``) and reports through ``TuneReportCallback``; Ray's ASHA stops the
function, and Tune cannot reuse its actors. Ray's side needs ``ray[default]`` there. Each GPU
trains the same per-GPU batch as a one-GPU trial; efficiency counts per-GPU batches against
the one-GPU solo rate times the GPUs, and ``in_trial_rate`` compares a window's steps per
second with the one-GPU solo rate (1.0: DDP costs nothing).

With ``--per-gpu K`` (> 1), K trials share each GPU on both sides: Ray asks for ``gpu: 1/K``
per trial, searchlab sets ``resources.gpus_per_trial: 1/K``, and both run ``--gpus`` x K
trials at a time. One trial's hand-over then overlaps the others' training, and K trials
together may train faster than one alone, so efficiency (still against one GPU's solo rate)
can pass 1. Hand-overs are then counted per worker process, not per GPU, and
``in_trial_rate`` is one trial's share. The summary's headline keys come from K = 1 runs;
``packed`` holds the same keys for the K > 1 runs.

The same training step (``asha_model/asha_def.py:TrainStep``: ResNet-18, batch 256, bf16,
SGD; ``--quick``: a tiny CNN) runs through Ray Tune's ``ASHAScheduler`` with its best
settings (a class ``Trainable``, ``reuse_actors=True``) and through ``searchlab.run`` with
``adaptive_asha`` (promotion: trials pause at each rung and the best are resumed), on the
same 16 learning rates (log-uniform, one seed; searchlab samples them from that list), one
trial at a time on each GPU (``--gpus``). Ray is
started once; the sides alternate, and who goes first alternates between rounds (Ray,
searchlab, then searchlab, Ray, ...): drift of the machine hits both, and so does the first
run's cold page cache (its imports took ~3.5 s longer in one call). Before each round, a
hand-written loop of the same step gives the solo rate: the best of three timed blocks after a
warm-up, so one slow block (the GPU's clock ramping up, cuDNN still tuning) does not make
every side's efficiency read high. The solo loop runs again after each side's run, so every
run is bracketed by the blocks just before and just after it: the blocks of one round were
seen to differ by up to 19 % on H100 hosts, and the best of them is a rate the card held only
for seconds. ``--no-bracket`` skips the runs after the sides. Each solo run also records
how busy the GPU keeps (``solo_gpu_busy``, ``after_gpu_busy``): the device time of one more
block's kernels and copies under ``torch.profiler``, over the wall time that block takes at
the unprofiled rate (the profiler slows a launch-bound loop ~40 %, not its kernels). Well
below 1, the host's Python and kernel launches set the rate, not the GPU.

Workloads: **short** (rungs 40/80/160/320 batches, a report every 40, divisor 2) and
**long** (rungs 200/400/800/1600, a report every 100), each with the batch resident on the
GPU and with a loader of CIFAR-shaped images (4 workers, pinned memory).

Per side and run, from the reports' wall-clock windows (``w_start`` at the window's first
batch, ``w_end`` after its last, synchronised):
- ``efficiency``: batches trained (every window, replays included) / (solo rate x GPUs x
  wall time from the call to the result);
- ``first_batch_s``: from the call to the first batch;
- ``in_trial_rate``: median over windows of the window's rate, over the solo rate;
- ``in_trial_rate_bracketed``/``efficiency_bracketed``: the same over the median of the
  blocks bracketing the run (``bracket_blocks_per_s``): both medians, and the card's clock
  around the run rather than its best moment before the round;
- ``wait_per_report_s``: median time training waited between a report and its next batch;
- ``handover_s``: median time from one trial's last batch to the next trial's first batch
  (pause or stop, checkpoint, the next trial built or restored), and how many;
- ``checkpoint_write_s``/``checkpoint_load_s``: Ray side measured in its Trainable;
  searchlab's from its trials' checkpoint timing reports.
Summary (short workload, resident batch, medians over runs): ``searchlab_efficiency``,
``ray_asha_efficiency``, ``searchlab_over_ray``, ``long_efficiency`` (searchlab, long,
resident), ``in_search_over_in_process`` (searchlab's in-trial rate over the solo rate), and
the bracketed ones: ``in_search_over_in_process_bracketed``, ``ray_in_trial_rate_bracketed``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
MODEL_DIR = HERE / "asha_model"
sys.path.insert(0, str(MODEL_DIR))

import torch  # noqa: E402
from _common import (  # noqa: E402
    add_common_args,
    environment,
    machine_info,
    print_table,
    result_path,
    write_result,
)
from ray import tune  # noqa: E402
from ray.tune.schedulers import ASHAScheduler  # noqa: E402

WORKLOADS = {
    "short": {"rungs": [40, 80, 160, 320], "report_every": 40},
    "long": {"rungs": [200, 400, 800, 1600], "report_every": 100},
}
QUICK_WORKLOADS = {
    "short": {"rungs": [4, 8, 16, 32], "report_every": 4},
    "long": {"rungs": [8, 16, 32, 64], "report_every": 8},
}


CONCURRENT = [1]  # trials at once: ``--gpus`` x ``--per-gpu`` // ``--slots``
PER_GPU = [1]  # trials sharing one GPU (``--per-gpu``)
SLOTS = [1]  # GPUs per trial (``--slots``): more than one is a data-parallel trial


def _cpus() -> float:
    """CPUs per trial process: 1, or 0.5 for data-parallel trials without a GPU, so that a
    2-CPU machine holds a 2-worker trial and its coordinator (``--quick``)."""
    return 0.5 if SLOTS[0] > 1 and not torch.cuda.is_available() else 1.0


def learning_rates(n: int, seed: int = 0) -> list[float]:
    import random

    rng = random.Random(seed)
    return [10 ** rng.uniform(-3, -0.5) for _ in range(n)]


class RayAshaTrainable(tune.Trainable):
    """The same ``TrainStep`` as a Ray Tune class Trainable (Ray's recommended form)."""

    def setup(self, config: dict[str, Any]) -> None:  # type: ignore[override]
        self._build(config)

    def _build(self, config: dict[str, Any]) -> None:
        from asha_def import TrainStep, Window

        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.step_ = TrainStep(config, device, seed=0)
        self.window = Window(device, self.step_)
        self.every = int(config["report_every"])
        self.batches = 0
        self.timings: dict[str, float] = {}
        loader = torch.utils.data.DataLoader(self.step_.dataset(), **self.step_.loader_kwargs())
        self.it = _forever(loader)

    def step(self) -> dict[str, Any]:  # type: ignore[override]
        loss = self.step_.train_window(self.it, self.window, self.every)
        self.batches += self.every
        out = {"batches": self.batches, "loss": loss}
        out.update(self.window.close())
        out["validation_loss"] = self.step_.validate()
        out.update(self.timings)
        self.timings = {}
        return out

    def save_checkpoint(self, checkpoint_dir: str) -> None:  # type: ignore[override]
        began = time.perf_counter()
        state = {
            "model": self.step_.model.state_dict(),
            "opt": self.step_.opt.state_dict(),
            "batches": self.batches,
        }
        torch.save(state, os.path.join(checkpoint_dir, "state.pt"))
        self.timings["checkpoint_write_s"] = time.perf_counter() - began

    def load_checkpoint(self, checkpoint_dir: str) -> None:  # type: ignore[override]
        began = time.perf_counter()
        state = torch.load(os.path.join(checkpoint_dir, "state.pt"), map_location=self.step_.device)
        self.step_.model.load_state_dict(state["model"])
        self.step_.opt.load_state_dict(state["opt"])
        self.batches = int(state["batches"])
        self.timings["checkpoint_load_s"] = time.perf_counter() - began

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        self._build(new_config)
        return True


def ray_train_trial(config: dict[str, Any]) -> None:
    """One data-parallel trial on Ray's side: a Tune function trainable that runs a Ray Train
    ``TorchTrainer`` with ``slots`` GPU workers (Ray Train V2's way to tune a multi-GPU
    trial). Rank 0's reports reach Tune through ``TuneReportCallback``; ASHA stops the trial
    by stopping this function, and the trainer's workers go with it."""
    import ray.train
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    slots = int(config["slots"])
    trainer = TorchTrainer(
        _ray_train_loop,
        train_loop_config=config,
        scaling_config=ray.train.ScalingConfig(
            num_workers=slots,
            use_gpu=torch.cuda.is_available(),
            resources_per_worker={
                "CPU": _cpus(),
                **({"GPU": 1} if torch.cuda.is_available() else {}),
            },
        ),
        run_config=ray.train.RunConfig(
            name=f"train-{time.time_ns()}",
            storage_path=config["storage"],
            callbacks=[TuneReportCallback()],
        ),
    )
    trainer.fit()


def _ray_train_loop(config: dict[str, Any]) -> None:
    """Each Ray Train worker: the same ``TrainStep``, its model in DDP (``prepare_model``) and,
    with a loader, Ray's ``DistributedSampler`` (``prepare_data_loader``)."""
    import ray.train
    import ray.train.torch
    from asha_def import TrainStep, Window

    device = ray.train.torch.get_device()
    step = TrainStep(config, device, seed=0)
    step.forward_model = ray.train.torch.prepare_model(step.model, move_to_device=False)
    window = Window(device, step)
    every, total = int(config["report_every"]), int(config["max_batches"])
    loader = torch.utils.data.DataLoader(step.dataset(), **step.loader_kwargs())
    loader = ray.train.torch.prepare_data_loader(loader, move_to_device=False)
    it = _forever(loader)
    for batches in range(every, total + 1, every):
        out = {"batches": batches, "loss": step.train_window(it, window, every)}
        out.update(window.close())
        out["validation_loss"] = step.validate()
        ray.train.report(out)


SOLO_BLOCKS = 3


def round_order(sides: list[str], round_index: int) -> list[str]:
    """The sides in the order given in even rounds, reversed in odd ones: the first run after
    Ray's start pays a cold page cache, and the rounds share that between the sides."""
    return list(sides) if round_index % 2 == 0 else list(reversed(sides))


def solo_rate(hp: dict[str, Any], batches: int) -> tuple[float, list[float], dict[str, Any]]:
    """Batches per second of a hand-written loop of the same step, in a Ray worker with a
    trial's resources (threads, GPU), as the trials run: the best of ``SOLO_BLOCKS`` timed
    blocks of ``batches`` after a warm-up, every block's rate, and what bounds the loop
    (``_solo_blocks``)."""
    import ray

    gpu = 1 if torch.cuda.is_available() else 0
    remote = ray.remote(num_cpus=1, num_gpus=gpu)(_solo_blocks)
    got = ray.get(remote.remote(hp, batches))
    blocks = [float(b) for b in got.pop("rates")]
    return max(blocks), blocks, got


def bracketed(run: dict[str, Any], before: list[float], after: list[float]) -> dict[str, Any]:
    """A run's in-trial rate and efficiency against the median of the solo blocks timed just
    before and just after it (``after`` may be empty: the run had no solo loop after it)."""
    blocks = [*before, *after]
    reference = statistics.median(blocks)
    again = figures(run, reference)
    return {
        "bracket_blocks_per_s": blocks,
        "bracket_batches_per_s": reference,
        "in_trial_rate_bracketed": again["in_trial_rate"],
        "efficiency_bracketed": again["efficiency"],
    }


def _solo_blocks(hp: dict[str, Any], batches: int) -> dict[str, Any]:
    """The solo loop's blocks: ``rates`` (batches/s) and ``gpu_busy`` (``_gpu_busy``)."""
    from asha_def import TrainStep, train_rate

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    step = TrainStep({**hp, "lr": 0.01}, device, seed=0)
    loader = torch.utils.data.DataLoader(step.dataset(), **step.loader_kwargs())
    it = _forever(loader)
    train_rate(step, it, max(batches // 5, 2))  # warm-up: cuDNN's tuning, the allocator
    rates = [train_rate(step, it, batches) for _ in range(SOLO_BLOCKS)]
    busy = _gpu_busy(step, it, device, max(batches // 5, 2), statistics.median(rates))
    del step, loader, it
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"rates": rates, "gpu_busy": busy}


def _gpu_busy(step: Any, batches: Any, device: torch.device, n: int, rate: float) -> float | None:
    """The GPU's busy share of the loop at ``rate`` batches/s: the device time of ``n`` more
    steps' kernels and copies under ``torch.profiler``, over ``n / rate``. None without CUDA
    or where the profiler cannot start."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CUDA])
    try:
        prof.start()
    except Exception as e:  # no CUPTI here: the figure is left out, not the run
        print(f"note: no GPU busy share ({type(e).__name__}: {e})", file=sys.stderr)
        return None
    try:
        from asha_def import train_rate

        train_rate(step, batches, n)
    finally:
        prof.stop()
    device_us = sum(e.self_device_time_total for e in prof.key_averages())
    return device_us / 1e6 / (n / rate)


def _forever(loader: Any) -> Any:
    while True:
        yield from loader


def run_ray(hp: dict[str, Any], work: dict[str, Any], lrs: list[float], storage: str) -> dict:
    rungs = work["rungs"]
    gpu = 1 if torch.cuda.is_available() else 0
    scheduler = ASHAScheduler(
        time_attr="batches", max_t=rungs[-1], grace_period=rungs[0], reduction_factor=2
    )
    collect = _Collect()
    space = {**hp, "report_every": work["report_every"], "lr": tune.grid_search(lrs)}
    if SLOTS[0] > 1:  # the trainer's workers hold the GPUs; the function only waits on them
        trainable = tune.with_resources(ray_train_trial, {"cpu": _cpus()})
        space.update(slots=SLOTS[0], max_batches=rungs[-1], storage=storage)
    else:
        trainable = tune.with_resources(RayAshaTrainable, {"cpu": 1, "gpu": gpu / PER_GPU[0]})
    began = time.time()
    tuner = tune.Tuner(
        trainable,
        param_space=space,
        tune_config=tune.TuneConfig(
            metric="validation_loss",
            mode="min",
            scheduler=scheduler,
            reuse_actors=SLOTS[0] == 1,  # a function trainable cannot be reused
            max_concurrent_trials=CONCURRENT[0],
        ),
        run_config=tune.RunConfig(
            storage_path=storage,
            name=f"ray-{time.time_ns()}",
            verbose=0,
            stop={"batches": rungs[-1]},
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=0),
            callbacks=[collect],
        ),
    )
    with _tune_checkpoint_default():
        tuner.fit()
    wall = time.time() - began
    windows = [_window(tid, row, work["report_every"]) for tid, row in collect.rows]
    return _run(began, wall, windows)


@contextlib.contextmanager
def _tune_checkpoint_default() -> Any:
    """Ray's side saves its experiment state at Tune's own cadence. searchlab saves it every
    second (``TUNE_GLOBAL_CHECKPOINT_S=1``, its crash safety), and the environment both sides
    share set that for Ray's side too until Nov 27."""
    saved = os.environ.pop("TUNE_GLOBAL_CHECKPOINT_S", None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ["TUNE_GLOBAL_CHECKPOINT_S"] = saved


def _run(began: float, wall: float, windows: list[dict[str, Any]], **extra: Any) -> dict:
    """One side's run: when it began, its wall time, its windows and how it was placed."""
    return {
        "wall_s": wall,
        "began": began,
        "windows": windows,
        "slots": SLOTS[0],
        "per_gpu": PER_GPU[0],
        **extra,
    }


class _Collect(tune.Callback):
    """Every result of the Ray side, in the driver (no files needed)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, dict[str, Any]]] = []

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        self.rows.append((trial.trial_id, dict(result)))


def run_searchlab(hp: dict[str, Any], work: dict[str, Any], lrs: list[float], storage: str) -> dict:
    import searchlab

    rungs = work["rungs"]
    config = {
        "name": f"searchlab-{time.time_ns()}",
        "entrypoint": "asha_def:AshaTrial",
        "hyperparameters": {
            **hp,
            "global_batch_size": hp.get("batch", 256) * SLOTS[0],
            "lr": {"type": "categorical", "vals": lrs},
        },
        "searcher": {
            "name": "adaptive_asha",
            "metric": "validation_loss",
            "max_trials": len(lrs),
            "max_length": {"batches": rungs[-1]},
            "mode": "aggressive",
            "divisor": 2,
            "max_rungs": len(rungs),
            "max_concurrent_trials": CONCURRENT[0],
        },
        "resources": {"cpus_per_trial": _cpus(), "slots_per_trial": SLOTS[0]},
        "scheduling_unit": work["report_every"],
        "max_restarts": 0,
        "reproducibility": {"experiment_seed": 0},
    }
    if PER_GPU[0] > 1 and torch.cuda.is_available():
        config["resources"]["gpus_per_trial"] = 1.0 / PER_GPU[0]
    began = time.time()
    results = searchlab.run(config, model_dir=MODEL_DIR, storage_path=storage, echo=lambda _: None)
    wall = time.time() - began
    reports = results.all_reports
    training = reports[reports["group"] == "training"]
    windows = [
        {**row, "trial_id": row["trial_id"], "n": work["report_every"]}
        for row in training[["trial_id", *WINDOW_KEYS]].to_dict("records")
    ]
    return _run(began, wall, windows, **_searchlab_checkpoint_times(results))


def _searchlab_with(env: dict[str, str]) -> Any:
    """``run_searchlab`` with driver environment variables set (one lever on or off)."""

    def run(hp: dict[str, Any], work: dict[str, Any], lrs: list[float], storage: str) -> dict:
        with environment(env):
            return run_searchlab(hp, work, lrs, storage)

    return run


def _searchlab_checkpoint_times(results: Any) -> dict[str, Any]:
    """Medians of the seconds searchlab's workers report spending on checkpoints and builds
    (``searchlab_timing_*`` in each trial's ``result.json``)."""
    found: dict[str, list[float]] = {}
    for path in results.experiment_dir.glob("*/result.json"):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                for key, value in json.loads(line).items():
                    if not key.startswith("searchlab_timing_"):
                        continue
                    key = key.removeprefix("searchlab_timing_")
                    found.setdefault(key, []).append(float(value))
    out = {key: statistics.median(values) for key, values in found.items()}
    # How many checkpoint loads there were, and how many of them came from the worker's memory.
    out["loads"] = len(found.get("checkpoint_load_s", []))
    out["loads_from_memory"] = len(found.pop("resumed_from_memory", []))
    out.pop("resumed_from_memory", None)
    return out


# What each window row keeps: its times, position, GPU, and when its process started and its
# step was built (the first window's split the time to the first batch).
WINDOW_KEYS = (
    "w_start",
    "w_end",
    "gap_s",
    "batches",
    "gpu",
    "proc_start",
    "build_began",
    "built_at",
)


def _window(trial_id: str, row: dict[str, Any], every: int) -> dict[str, Any]:
    return {
        "trial_id": trial_id,
        **{key: row.get(key, math.nan) for key in WINDOW_KEYS},
        "gpu": row.get("gpu", -1.0),
        "n": every,
        "checkpoint_write_s": row.get("checkpoint_write_s"),
        "checkpoint_load_s": row.get("checkpoint_load_s"),
    }


def figures(run: dict[str, Any], rate: float) -> dict[str, Any]:
    """A run's figures against ``rate``, one GPU's solo batches per second. A data-parallel
    trial (``slots`` > 1) trains ``slots`` per-GPU batches per step, and its trials follow each
    other on one lane (its rank 0 may move between GPUs). Where trials share a GPU
    (``per_gpu`` > 1), each worker process is a lane: hand-overs are counted in a process."""
    slots = int(run.get("slots", 1))
    windows = sorted(run["windows"], key=lambda w: w["w_start"])
    if slots > 1:
        windows = [{**w, "gpu": 0.0} for w in windows]
    trained = sum(w["n"] for w in windows) * slots  # per-GPU batches
    gpus = max(len({w.get("gpu", -1.0) for w in windows}), 1) * slots
    rates = [
        w["n"] / (w["w_end"] - w["w_start"]) / rate
        for w in windows[1:]
        if w["w_end"] > w["w_start"]
    ]
    lane_key = "proc_start" if int(run.get("per_gpu", 1)) > 1 else "gpu"
    handovers = []  # per lane: one trial's last window to the next trial's first
    for lane in {w.get(lane_key, -1.0) for w in windows}:
        in_lane = [w for w in windows if w.get(lane_key, -1.0) == lane]
        handovers += [
            b["w_start"] - a["w_end"]
            for a, b in itertools.pairwise(in_lane)
            if a["trial_id"] != b["trial_id"]
        ]
    gaps = [w["gap_s"] for w in windows if w["gap_s"] and w["gap_s"] > 0]
    out = {
        "wall_s": run["wall_s"],
        "batches": trained,
        "efficiency": trained / (rate * run["wall_s"] * gpus),
        "first_batch_s": windows[0]["w_start"] - run["began"] if windows else math.nan,
        # The first batch's way: the call -> its process started -> its step began and was
        # built (imports, CUDA, model) -> the first batch.
        **{
            f"first_{name}_s": windows[0].get(key, math.nan) - run["began"] if windows else math.nan
            for name, key in (
                ("process", "proc_start"),
                ("build_began", "build_began"),
                ("built", "built_at"),
            )
        },
        "in_trial_rate": statistics.median(rates) if rates else math.nan,
        "wait_per_report_s": statistics.median(gaps) if gaps else 0.0,
        "handover_s": statistics.median(handovers) if handovers else math.nan,
        "handovers": len(handovers),
    }
    for key in ("checkpoint_write_s", "checkpoint_load_s", "build_s", "loads", "loads_from_memory"):
        values = [w[key] for w in windows if w.get(key) is not None and w[key] == w[key]]
        out[key] = run.get(key, statistics.median(values) if values else None)
    return out


SIDES = {
    "ray_asha": run_ray,
    "searchlab": run_searchlab,
    # One lever changed from searchlab's defaults, to measure what it is worth:
    "searchlab_train_ahead": _searchlab_with({"SEARCHLAB_TRAIN_AHEAD": "1"}),
    "searchlab_sync_checkpoints": _searchlab_with({"SEARCHLAB_BACKGROUND_CHECKPOINTS": "0"}),
    # The state written by a thread while the trial trains on: what "auto" means where the
    # process trains since call 5E (benchmarks/README.md); "idle" before it.
    "searchlab_thread_checkpoints": _searchlab_with({"SEARCHLAB_BACKGROUND_CHECKPOINTS": "1"}),
    # Written at once, in the save, and in a thread while the worker waits for Tune, finished
    # before the trial trains again.
    "searchlab_at_once_checkpoints": _searchlab_with(
        {"SEARCHLAB_BACKGROUND_CHECKPOINTS": "at-once"}
    ),
    "searchlab_idle_checkpoints": _searchlab_with({"SEARCHLAB_BACKGROUND_CHECKPOINTS": "idle"}),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workloads", default="short,long")
    parser.add_argument("--data", default="resident,loader")
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument(
        "--gpus", type=int, default=1, help="GPUs to use, one trial on each at a time"
    )
    parser.add_argument(
        "--slots",
        type=int,
        default=1,
        help="GPUs per trial: more than 1 runs data-parallel trials (searchlab: "
        "slots_per_trial; Ray: a TorchTrainer per trial, which needs ray[default])",
    )
    parser.add_argument(
        "--sides",
        default="ray_asha,searchlab",
        help=f"which of {', '.join(SIDES)} to run: in this order in even rounds, reversed in odd ones",
    )
    parser.add_argument(
        "--image-size",
        type=int,
        default=32,
        help="side of the square images (32: CIFAR-shaped; larger: more GPU work per batch)",
    )
    parser.add_argument(
        "--no-bracket",
        action="store_true",
        help="time the solo loop only before each round, not again after each side's run",
    )
    parser.add_argument(
        "--per-gpu",
        type=int,
        default=1,
        help="trials sharing each GPU on both sides (Ray: gpu 1/K; searchlab: gpus_per_trial)",
    )
    args = parser.parse_args()

    import ray

    from searchlab._bytecode import uncached_bytecode_hint
    from searchlab._ray_env import ray_environment, ray_init_kwargs

    if note := uncached_bytecode_hint():  # both sides' workers would pay it: say so
        print(f"note: {note}", file=sys.stderr)
    quick = args.quick or not torch.cuda.is_available()
    SLOTS[0] = max(args.slots, 1)
    if SLOTS[0] > 1 and max(args.gpus, 1) != SLOTS[0]:
        # figures() puts a data-parallel search's windows on one lane (rank 0 may move
        # between GPUs), which holds only for one trial at a time.
        parser.error(f"--slots {args.slots} needs --gpus {args.slots}: one trial at a time")
    PER_GPU[0] = max(args.per_gpu, 1)
    if PER_GPU[0] > 1 and SLOTS[0] > 1:
        parser.error("--per-gpu shares a GPU between one-GPU trials: it needs --slots 1")
    CONCURRENT[0] = max(args.gpus, 1) * PER_GPU[0] // SLOTS[0]
    if SLOTS[0] > 1 and "ray_asha" in args.sides.split(","):
        from ray._private.utils import get_dashboard_dependency_error

        if (missing := get_dashboard_dependency_error()) is not None:
            # Without them Ray has no dashboard, and Ray Train's worker groups were seen to
            # hang at start-up or leak their placement groups when Tune stopped a trial.
            raise SystemExit(
                f"--slots {args.slots} with the ray_asha side needs Ray Train's state API: "
                f"pip install 'ray[default]' ({missing})"
            )
    workloads = QUICK_WORKLOADS if quick else WORKLOADS
    base = {
        "model": "tiny" if quick else "resnet18",
        "batch": 32 if quick else 256,
        "num_workers": 2 if quick else 4,
        "n_train": 2048 if quick else 8192,
        "image_size": args.image_size,
    }
    lrs = learning_rates(args.trials)
    storage = tempfile.mkdtemp(prefix="vs-ray-asha-")
    rows, runs = [], []
    with ray_environment():
        init = ray_init_kwargs()
        if SLOTS[0] > 1 and "ray_asha" in args.sides.split(","):
            # Ray Train's worker groups watch their controller through the state API, which
            # the dashboard serves: without it they hang (Ray's default starts it; searchlab
            # leaves it off). Both sides then run with it.
            init["include_dashboard"] = True
        ray.init(runtime_env={"working_dir": str(MODEL_DIR)}, **init)
        # Ray's side imported ray.tune at the top of this file; searchlab's driver modules
        # load on the first ``searchlab.run`` (the package stays light for the workers).
        # Both sides' libraries are imported before any clock starts.
        from searchlab.experiment import _runner  # noqa: F401

        try:
            for name in args.workloads.split(","):
                for data in args.data.split(","):
                    hp = {**base, "data": data}
                    solo_batches = 20 if quick else 200
                    last: tuple[float, list[float], dict[str, Any]] | None = None
                    for r in range(args.rounds):
                        # The solo run after the last round's last side is this round's start.
                        solo, blocks, bound = last or solo_rate(hp, solo_batches)
                        before = blocks  # the solo blocks just before the next side's run
                        for side in round_order(args.sides.split(","), r):
                            run = SIDES[side](hp, workloads[name], lrs, storage)
                            last = None if args.no_bracket else solo_rate(hp, solo_batches)
                            after, after_bound = ([], {}) if last is None else last[1:]
                            got = {**figures(run, solo), **bracketed(run, before, after)}
                            got["after_gpu_busy"] = after_bound.get("gpu_busy")
                            got["windows"] = run["windows"]
                            before = after or before
                            record = {
                                "workload": name,
                                "data": data,
                                "round": r,
                                "side": side,
                                "slots": SLOTS[0],
                                "per_gpu": PER_GPU[0],
                                "gpus": max(args.gpus, 1),
                                "solo_batches_per_s": solo,
                                "solo_blocks_per_s": blocks,
                                "solo_gpu_busy": bound["gpu_busy"],
                                **got,
                            }
                            runs.append(record)
                            rows.append({k: v for k, v in record.items() if k != "windows"})
                            write_result(  # after every run: a run cut short keeps the rest
                                result_path("vs_ray_asha", args),
                                summary=_summary(runs),
                                runs=runs,
                                partial=True,
                                machine=machine_info(),
                            )
                            print_table(
                                [record],
                                [
                                    "workload",
                                    "data",
                                    "round",
                                    "side",
                                    "efficiency",
                                    "first_batch_s",
                                    "in_trial_rate",
                                    "in_trial_rate_bracketed",
                                    "handover_s",
                                    "wall_s",
                                ],
                            )
        finally:
            ray.shutdown()
            shutil.rmtree(storage, ignore_errors=True)
    summary = _summary(runs)
    print_table(
        rows,
        [
            "workload",
            "data",
            "side",
            "efficiency",
            "first_batch_s",
            "in_trial_rate",
            "in_trial_rate_bracketed",
            "wait_per_report_s",
            "handover_s",
            "handovers",
            "checkpoint_write_s",
            "checkpoint_load_s",
            "wall_s",
        ],
    )
    print(summary)
    write_result(
        result_path("vs_ray_asha", args),
        summary=summary,
        runs=runs,
        config={
            "workloads": workloads,
            "base": base,
            "trials": args.trials,
            "rounds": args.rounds,
            "gpus": max(args.gpus, 1),
            "slots": SLOTS[0],
            "per_gpu": PER_GPU[0],
            "quick": quick,
        },
        machine=machine_info(),
    )


def _median(runs: list[dict], key: str, **where: Any) -> float | None:
    picked = [r.get(key) for r in runs if all(r.get(k) == v for k, v in where.items())]
    values = [v for v in picked if v is not None and v == v]  # neither missing nor NaN
    return statistics.median(values) if values else None


def _summary(runs: list[dict]) -> dict[str, Any]:
    """The issue's figures from the runs with one trial per GPU; ``packed``: the same figures
    from runs where trials share a GPU (``--per-gpu``), if any."""
    out = _figures_of(runs, per_gpu=1)
    shared = sorted({r.get("per_gpu", 1) for r in runs} - {1})
    if shared:
        out["packed"] = {f"per_gpu_{k}": _figures_of(runs, per_gpu=k) for k in shared}
    return out


def _figures_of(runs: list[dict], per_gpu: int) -> dict[str, Any]:
    runs = [r for r in runs if r.get("per_gpu", 1) == per_gpu]
    mine = _median(runs, "efficiency", workload="short", data="resident", side="searchlab")
    ray_ = _median(runs, "efficiency", workload="short", data="resident", side="ray_asha")
    long_mine = _median(runs, "efficiency", workload="long", data="resident", side="searchlab")
    long_ray = _median(runs, "efficiency", workload="long", data="resident", side="ray_asha")
    return {
        "searchlab_efficiency": mine,
        "ray_asha_efficiency": ray_,
        "searchlab_over_ray": mine / ray_ if mine and ray_ else None,
        "long_efficiency": long_mine,
        "in_search_over_in_process": _median(
            runs, "in_trial_rate", workload="short", data="resident", side="searchlab"
        ),
        # The same against the solo blocks around each run, and Ray's side beside it.
        "in_search_over_in_process_bracketed": _median(
            runs, "in_trial_rate_bracketed", workload="short", data="resident", side="searchlab"
        ),
        "ray_in_trial_rate_bracketed": _median(
            runs, "in_trial_rate_bracketed", workload="short", data="resident", side="ray_asha"
        ),
        "ray_in_trial_rate": _median(
            runs, "in_trial_rate", workload="short", data="resident", side="ray_asha"
        ),
        "first_batch_s": {
            side: _median(runs, "first_batch_s", workload="short", data="resident", side=side)
            for side in ("searchlab", "ray_asha")
        },
        "long_ray_asha_efficiency": long_ray,
        "long_searchlab_over_ray": long_mine / long_ray if long_mine and long_ray else None,
        # Medians over every run of a side: seconds from the call to its first trial's
        # process start, build start, build end and first batch.
        "first_batch_split": {
            side: {
                key: _median(runs, key, side=side)
                for key in (
                    "first_process_s",
                    "first_build_began_s",
                    "first_built_s",
                    "first_batch_s",
                )
            }
            for side in sorted({r["side"] for r in runs})
        },
    }


if __name__ == "__main__":
    main()
