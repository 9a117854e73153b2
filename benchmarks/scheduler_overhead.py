"""Scheduler overhead: many trivial trials through searchlab and through Ray Tune's ASHA.

    PYTHONPATH=. python benchmarks/scheduler_overhead.py [--rounds 2] [--concurrency 4]
    PYTHONPATH=. python benchmarks/scheduler_overhead.py --quick     # ~2 min on CPU

Both sides run the real engine end to end on the same trivial work, in this process, with Ray
started once (``--concurrency`` logical CPUs, one per trial) and kept for every run:

- **searchlab**: ``searchlab.run(config, model_dir="benchmarks/overhead_model")`` of an
  ``adaptive_asha`` search with one rung (every trial trains to ``max_length``),
  ``scheduling_unit: 1`` (a report per batch), ``max_concurrent_trials`` = concurrency and the
  defaults otherwise (a checkpoint and a validation at the rung end, searchlab's records).
  The trial (``overhead_model/model_def.py``) runs one SGD step of ``Linear(1, 1)`` per batch,
  then sleeps ``batch_sleep_s``.
- **Ray Tune**: ``tune.Tuner`` of a class ``tune.Trainable`` (the same SGD step and sleep per
  ``step``) with ``ASHAScheduler`` (``grace_period = max_t``: one rung, as above),
  ``reuse_actors=True``, ``max_concurrent_trials`` = concurrency, random search over the same
  space, Tune's auto loggers off and ``verbose=0`` (its best settings for many small trials).

Scenarios: ``500x1`` (500 trials, one batch each, no sleep) and ``100x10Hz`` (100 trials of 20
batches sleeping 0.1 s: a report 10 times a second). The sides alternate within each round
(which goes first alternates between rounds).

Measured per run: ``wall_s`` from the call to its return; for searchlab also ``tune_s`` (its
Tune run) and ``results_s`` (loading the ``Results`` it returns), by wrapping those two
functions; ``driver_cpu_s`` (``time.process_time`` of this process: Tune's controller, the
scheduler, searcher and loggers); ``min_s`` = trials x batches x sleep / concurrency, the
theoretical minimum; ``over_min_s`` = wall - min (per trial, for the no-sleep scenario);
``driver_cpu_ms_per_report`` = driver CPU / (trials x batches). ``summary.searchlab_over_ray``
is the median over rounds of searchlab's wall over Ray's, for the worse scenario (target
<= 1.0); each scenario's figure is beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
MODEL_DIR = HERE / "overhead_model"
sys.path[:0] = [str(HERE), str(HERE.parent)]

from _common import (  # noqa: E402
    add_common_args,
    environment,
    print_table,
    result_path,
    write_result,
)

SCENARIOS = {"500x1": (500, 1, 0.0), "100x10Hz": (100, 20, 0.1)}
QUICK_SCENARIOS = {"500x1": (60, 1, 0.0), "100x10Hz": (12, 10, 0.1)}


def searchlab_config(trials: int, batches: int, sleep_s: float, concurrency: int) -> dict:
    return {
        "name": "scheduler-overhead",
        "entrypoint": "model_def:OverheadTrial",
        "hyperparameters": {
            "global_batch_size": 1,
            "batch_sleep_s": sleep_s,
            "x": {"type": "double", "minval": 0.0, "maxval": 1.0},
        },
        "searcher": {
            "name": "adaptive_asha",
            "metric": "validation_loss",
            "max_length": {"batches": batches},
            "max_trials": trials,
            "bracket_rungs": [1],
            "max_concurrent_trials": concurrency,
        },
        "scheduling_unit": 1,
        "resources": {"cpus_per_trial": 1},
        "reproducibility": {"experiment_seed": 0},
    }


class _Timer:
    """Wall time spent in a wrapped function (summed over calls)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return timed


@contextlib.contextmanager
def _wrapped(module: Any, name: str, timer: _Timer) -> Iterator[None]:
    original = getattr(module, name)
    setattr(module, name, timer.wrap(original))
    try:
        yield
    finally:
        setattr(module, name, original)


def run_searchlab(scenario: tuple[int, int, float], concurrency: int, storage: str) -> dict:
    import searchlab
    from searchlab.experiment import _runner, _tune

    trials, batches, sleep_s = scenario
    tune_timer, finish_timer = _Timer(), _Timer()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    with _wrapped(_tune, "run_tuner", tune_timer), _wrapped(_runner, "_finish", finish_timer):
        # run() imports run_tuner from _tune at call time, so the wrapper is what it calls.
        results = searchlab.run(
            searchlab_config(trials, batches, sleep_s, concurrency),
            model_dir=MODEL_DIR,
            storage_path=storage,
            name=f"overhead-{trials}x{batches}-{time.time_ns()}",
            echo=lambda line: None,
        )
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    done = int((results.trials["batches"] >= batches).sum())
    return {
        "wall_s": wall,
        "tune_s": tune_timer.seconds,
        "results_s": finish_timer.seconds,
        "driver_cpu_s": cpu,
        "trials_completed": done,
        "results_rows": len(results.all_reports),
    }


def _ray_trainable() -> Any:
    import torch
    from model_def import make_model, step_model
    from ray import tune

    class OverheadTrainable(tune.Trainable):
        def setup(self, config: dict) -> None:
            self.model = make_model()
            self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
            self.x = torch.ones(1, 1)
            self.sleep_s = float(config["batch_sleep_s"])
            self.value = float(config["x"])

        def reset_config(self, new_config: dict) -> bool:
            self.setup(new_config)
            return True

        def save_checkpoint(self, checkpoint_dir: str) -> None:
            torch.save(self.model.state_dict(), os.path.join(checkpoint_dir, "model.pt"))

        def load_checkpoint(self, checkpoint: Any) -> None:
            self.model.load_state_dict(torch.load(os.path.join(str(checkpoint), "model.pt")))

        def step(self) -> dict:
            loss = step_model(self.model, self.opt, self.x)
            if self.sleep_s:
                time.sleep(self.sleep_s)
            return {"loss": float(loss), "validation_loss": self.value}

    return OverheadTrainable


def run_ray(scenario: tuple[int, int, float], concurrency: int, storage: str) -> dict:
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    trials, batches, sleep_s = scenario
    scheduler = ASHAScheduler(max_t=batches, grace_period=batches, reduction_factor=4)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    with environment({"TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1", "RAY_AIR_NEW_OUTPUT": "0"}):
        tuner = tune.Tuner(
            tune.with_resources(_ray_trainable(), {"cpu": 1}),
            param_space={"x": tune.uniform(0.0, 1.0), "batch_sleep_s": sleep_s},
            tune_config=tune.TuneConfig(
                metric="validation_loss",
                mode="min",
                scheduler=scheduler,
                num_samples=trials,
                reuse_actors=True,
                max_concurrent_trials=concurrency,
            ),
            run_config=tune.RunConfig(
                storage_path=storage,
                name=f"ray-{trials}x{batches}-{time.time_ns()}",
                stop={"training_iteration": batches},
                verbose=0,
                checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=False),
            ),
        )
        grid = tuner.fit()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    done = 0
    for i in range(len(grid)):
        metrics = grid[i].metrics or {}
        done += int(metrics.get("training_iteration") == batches)
    return {"wall_s": wall, "driver_cpu_s": cpu, "trials_completed": done}


def _figures(run: dict, scenario: tuple[int, int, float], concurrency: int) -> dict:
    trials, batches, sleep_s = scenario
    min_s = trials * batches * sleep_s / concurrency
    reports = trials * batches
    return {
        **{k: round(v, 4) if isinstance(v, float) else v for k, v in run.items()},
        "min_s": round(min_s, 3),
        "over_min_s": round(run["wall_s"] - min_s, 3),
        "over_min_ms_per_trial": round((run["wall_s"] - min_s) / trials * 1e3, 2),
        "wall_over_min": round(run["wall_s"] / min_s, 3) if min_s else None,
        "driver_cpu_ms_per_report": round(run["driver_cpu_s"] / reports * 1e3, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--rounds", type=int, default=None, help="default 2 (quick: 1)")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument(
        "--sides", default="searchlab,ray", help="one side alone: to profile it (no summary)"
    )
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 2)
    sizes = QUICK_SCENARIOS if args.quick else SCENARIOS
    names = [s for s in args.scenarios.split(",") if s]

    import ray

    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(MODEL_DIR), str(HERE.parent), os.environ.get("PYTHONPATH", "")) if p
    )
    sys.path.insert(0, str(MODEL_DIR))
    ray.init(num_cpus=args.concurrency, include_dashboard=False, log_to_driver=False)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="sched-overhead-") as storage:
        for r in range(rounds):
            for name in names:
                sides = ("searchlab", "ray") if (r % 2 == 0) else ("ray", "searchlab")
                for side in (s for s in sides if s in args.sides.split(",")):
                    runner = run_searchlab if side == "searchlab" else run_ray
                    run = runner(sizes[name], args.concurrency, storage)
                    row = {"round": r, "scenario": name, "side": side}
                    row.update(_figures(run, sizes[name], args.concurrency))
                    rows.append(row)
                    print_table([row], list(row))
    ray.shutdown()
    if len({row["side"] for row in rows}) < 2:
        print_table(rows, list(rows[0]))
        return
    summary = _summary(rows, names)
    columns = ["round", "scenario", "side", "wall_s", "min_s", "over_min_ms_per_trial"]
    columns += ["wall_over_min", "driver_cpu_ms_per_report", "tune_s", "results_s"]
    print_table(rows, columns)
    print(summary)
    config = {
        "rounds": rounds,
        "concurrency": args.concurrency,
        "scenarios": {n: sizes[n] for n in names},
    }
    write_result(result_path("scheduler_overhead", args), summary, config=config, rows=rows)


def _summary(rows: list[dict], names: list[str]) -> dict:
    per: dict[str, Any] = {}
    for name in names:
        ratios: list[float] = []
        cpu: dict[str, list[float]] = {"searchlab": [], "ray": []}
        for r in sorted({row["round"] for row in rows}):
            pair = {
                row["side"]: row for row in rows if row["round"] == r and row["scenario"] == name
            }
            ratios.append(pair["searchlab"]["wall_s"] / pair["ray"]["wall_s"])
            for side in cpu:
                cpu[side].append(pair[side]["driver_cpu_ms_per_report"])
        sl_tune = [
            row["tune_s"] for row in rows if row["scenario"] == name and row["side"] == "searchlab"
        ]
        ray_wall = [
            row["wall_s"] for row in rows if row["scenario"] == name and row["side"] == "ray"
        ]
        per[name] = {
            "searchlab_over_ray": round(statistics.median(ratios), 3),
            "round_ratios": [round(x, 3) for x in ratios],
            "searchlab_tune_over_ray": round(
                statistics.median(sl_tune) / statistics.median(ray_wall), 3
            ),
            "driver_cpu_ms_per_report": {k: statistics.median(v) for k, v in cpu.items()},
        }
    worst = max(v["searchlab_over_ray"] for v in per.values())
    return {
        "searchlab_over_ray": worst,
        "target": 1.0,
        "meets_target": worst <= 1.0,
        "scenarios": per,
    }


if __name__ == "__main__":
    main()
