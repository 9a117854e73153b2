"""The two sides of ``vs_ray_asha.py`` and the solo loop they are measured against.

Ray Tune's side (``run_ray``: ``RayAshaTrainable``, or with ``--slots`` > 1 ``ray_train_trial``
and its Ray Train workers), searchlab's side (``run_searchlab`` and its one-lever variants in
``SIDES``), each returning its run's window rows for ``_asha_figures``, and the hand-written
solo loop (``solo_rate``). Ray's workers run in ``asha_model/`` and cannot import this module:
its functions and classes travel by value (``ship_by_value``), as those of ``__main__`` do.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import statistics
import sys
import time
from typing import Any

import torch
from _asha_figures import WINDOW_KEYS, _window
from _common import environment
from ray import tune
from ray.tune.schedulers import ASHAScheduler

# The trial's folder: Ray's working_dir (``vs_ray_asha.py``) and searchlab's model_dir.
MODEL_DIR = pathlib.Path(__file__).resolve().parent / "asha_model"

CONCURRENT = [1]  # trials at once: ``--gpus`` x ``--per-gpu`` // ``--slots``
PER_GPU = [1]  # trials sharing one GPU (``--per-gpu``)
SLOTS = [1]  # GPUs per trial (``--slots``): more than one is a data-parallel trial


def _cpus() -> float:
    """CPUs per trial process: 1, or 0.5 for data-parallel trials without a GPU, so that a
    2-CPU machine holds a 2-worker trial and its coordinator (``--quick``)."""
    return 0.5 if SLOTS[0] > 1 and not torch.cuda.is_available() else 1.0


def ship_by_value() -> None:
    """Have Ray pickle this module's functions and classes by value, as it does those of
    ``__main__``: its workers run in ``asha_model/`` (the runtime env's working_dir), where
    this module cannot be imported. Call before anything here is handed to Ray."""
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


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
            # With standby, each GPU runs one trial and holds the next ones ready.
            "max_concurrent_trials": CONCURRENT[0] * (1 + _standby()),
        },
        "resources": {"cpus_per_trial": _cpus(), "slots_per_trial": SLOTS[0]},
        "scheduling_unit": work["report_every"],
        # A failing trial fails the run; with standby (SEARCHLAB_STANDBY=auto needs it), a
        # trial out of GPU memory beside the others is retried once, as a user would allow.
        "max_restarts": 1 if _standby() else 0,
        "reproducibility": {"experiment_seed": 0},
    }
    if PER_GPU[0] > 1 and torch.cuda.is_available():
        config["resources"]["gpus_per_trial"] = 1.0 / PER_GPU[0]
    notes: list[str] = []  # searchlab's own notes (auto's decision among them)
    # Every one-line message (trials started, paused, finished; notes) with its second since
    # the call: what happened where a run's figures show a gap. The progress table is left out.
    events: list[tuple[float, str]] = []

    def echo(line: str) -> None:
        if line.startswith("note:"):
            notes.append(line)
        if "\n" not in line:
            events.append((round(time.time() - began, 3), line))

    began = time.time()
    results = searchlab.run(config, model_dir=MODEL_DIR, storage_path=storage, echo=echo)
    wall = time.time() - began
    decided = json.loads((results.experiment_dir / "experiment.json").read_text())["standby"]
    reports = results.all_reports
    training = reports[reports["group"] == "training"]
    windows = [
        {**row, "trial_id": row["trial_id"], "n": work["report_every"]}
        for row in training[["trial_id", *WINDOW_KEYS]].to_dict("records")
    ]
    return _run(
        began,
        wall,
        windows,
        notes=notes,
        events=events,
        standby=decided,
        # Retries (a trial out of GPU memory beside the others, say) pass without failing
        # the run where max_restarts allows them; count them.
        restarts=int(results.trials["restarts"].sum()) if len(results.trials) else 0,
        **_searchlab_checkpoint_times(results),
    )


def _standby() -> int:
    """The trials each GPU holds ready with the driver's ``SEARCHLAB_STANDBY`` (0: off)."""
    if not torch.cuda.is_available():
        return 0
    from searchlab.experiment._spec import standby_switch

    switch = standby_switch()
    return 2 if isinstance(switch, str) else switch  # auto: 2 where, as here, they fit


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
    # Two trial actors per GPU taking turns: the next trial builds while one trains.
    "searchlab_standby": _searchlab_with({"SEARCHLAB_STANDBY": "1"}),
    # The same without the next trial's rebuild and loader start before it waits for the GPU.
    "searchlab_standby_unprepared": _searchlab_with(
        {"SEARCHLAB_STANDBY": "1", "SEARCHLAB_STANDBY_PREPARE": "0"}
    ),
    # The same with the next window trained ahead in the GPU's turn.
    "searchlab_standby_ahead": _searchlab_with(
        {"SEARCHLAB_STANDBY": "1", "SEARCHLAB_STANDBY_AHEAD": "1"}
    ),
    # Three trial actors per GPU: two trials ready beside the one training.
    "searchlab_standby2": _searchlab_with({"SEARCHLAB_STANDBY": "2"}),
    # The same with each trial process's first batch trained beside the GPU's holder, not in
    # its turn: the default since call 16B (call 15D ran this as "searchlab_standby2", and
    # the then default as "searchlab_standby2_in_turn").
    "searchlab_standby2_warm_up": _searchlab_with(
        {"SEARCHLAB_STANDBY": "2", "SEARCHLAB_STANDBY_WARM_UP": "1"}
    ),
    # Each trial process's first batch in its turn (the default until call 16B).
    "searchlab_standby2_in_turn": _searchlab_with(
        {"SEARCHLAB_STANDBY": "2", "SEARCHLAB_STANDBY_WARM_UP": "0"}
    ),
    # Standby as auto decides it once Ray is up (here: two ready per GPU, as the search's
    # trials at once are tripled for it).
    "searchlab_standby_auto": _searchlab_with({"SEARCHLAB_STANDBY": "auto"}),
}
