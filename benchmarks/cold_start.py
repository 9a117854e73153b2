"""From a fresh process to the first batch: searchlab's CLI against a Ray Tune script.

    PYTHONPATH=. python benchmarks/cold_start.py --rounds 3             # GPU, ~2 min
    PYTHONPATH=. python benchmarks/cold_start.py --quick --rounds 2     # CPU, ~2 min

``vs_ray_asha.py`` starts Ray once and times each side from its call, as in a notebook.
Here every run is a new process that starts its own Ray, as a user runs it from a shell:

- ``ray_tune``: a Ray Tune script (``python <script>``: it imports ``ray.tune``, builds a
  ``Tuner`` of the class Trainable of ``vs_ray_asha.py`` and calls ``fit()``, which starts
  Ray with its defaults);
- ``searchlab``: ``searchlab run config.yaml asha_model/`` of the same step (``single``);
- ``searchlab_runtime_env``: the same with an ``environment.environment_variables`` entry,
  which sends the workers' environment through Ray's runtime environment, as every
  ``searchlab run`` did before its trials took the workers Ray starts with itself
  (``searchlab._ray_env.connect_ray``): the before of that change, in the same run.

One trial trains ``--reports`` report windows of the step. Per run, from the moment before
the process starts: ``worker_s`` (the trial's process started), ``build_s`` (its model's
build began), ``built_s``, ``first_batch_s`` and ``exit_s`` (the process ended). Sides
alternate, their order reversed in odd rounds. The summary holds each side's medians and
``searchlab_over_ray_first_batch`` (below 1: searchlab's first batch came sooner).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import yaml
from _common import add_common_args, machine_info, print_table, result_path, write_result

HERE = pathlib.Path(__file__).resolve().parent
MODEL_DIR = HERE / "asha_model"
SIDES = ("ray_tune", "searchlab", "searchlab_runtime_env")
STAMPS = ("worker_s", "build_s", "built_s", "first_batch_s", "exit_s")

# The Ray Tune user's script: a class Trainable, the default ``ray.init`` of ``fit()``.
RAY_SCRIPT = """
import json, sys, time
from ray import tune
from _asha_sides import RayAshaTrainable

hp, batches, out = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rows = []

class Collect(tune.Callback):
    def on_trial_result(self, iteration, trials, trial, result, **info):
        rows.append({k: result.get(k) for k in ("w_start", "proc_start", "build_began", "built_at")})

gpu = 1 if hp["gpu"] else 0
tuner = tune.Tuner(
    tune.with_resources(RayAshaTrainable, {"cpu": 1, "gpu": gpu}),
    param_space=hp,
    run_config=tune.RunConfig(
        storage_path=hp["storage"], name="ray", verbose=0, stop={"batches": batches},
        checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=0), callbacks=[Collect()],
    ),
)
tuner.fit()
json.dump(rows, open(out, "w"))
"""


def hyperparameters(quick: bool, gpu: bool) -> dict[str, Any]:
    return {
        "model": "tiny" if quick else "resnet18",
        "batch": 32 if quick else 256,
        "num_workers": 2 if quick else 4,
        "n_train": 2048 if quick else 8192,
        "image_size": 32,
        "data": "resident",
        "lr": 0.01,
        "gpu": gpu,
    }


def searchlab_config(hp: dict[str, Any], every: int, reports: int, env: bool) -> dict[str, Any]:
    config: dict[str, Any] = {
        "name": "cold",
        "entrypoint": "asha_def:AshaTrial",
        "hyperparameters": {**hp, "global_batch_size": hp["batch"]},
        "searcher": {
            "name": "single",
            "metric": "validation_loss",
            "max_length": {"batches": every * reports},
        },
        "resources": {"cpus_per_trial": 1, "slots_per_trial": 1},
        "scheduling_unit": every,
        "max_restarts": 0,
        "reproducibility": {"experiment_seed": 0},
    }
    if env:
        config["environment"] = {"environment_variables": {"SEARCHLAB_COLD_START": "1"}}
    return config


def run_side(side: str, hp: dict[str, Any], every: int, reports: int, work: pathlib.Path) -> dict:
    """One run of ``side`` in a new process; its stamps, relative to just before the start."""
    work.mkdir(parents=True)
    log = work / "log.txt"
    env = dict(os.environ)
    if side == "ray_tune":
        out = work / "rows.json"
        space = {**hp, "report_every": every, "storage": str(work / "ray")}
        script = work / "tune_script.py"
        script.write_text(RAY_SCRIPT)
        # The user's code sits beside the script: its directory, and the model's, on the path.
        env["PYTHONPATH"] = os.pathsep.join(
            [str(HERE), str(MODEL_DIR), *filter(None, [env.get("PYTHONPATH")])]
        )
        argv = [sys.executable, str(script), json.dumps(space), str(every * reports), str(out)]
    else:
        config = work / "cold.yaml"
        config.write_text(
            yaml.safe_dump(searchlab_config(hp, every, reports, side.endswith("runtime_env")))
        )
        argv = [sys.executable, "-m", "searchlab.cli", "run", str(config), str(MODEL_DIR)]
        argv += ["--storage-path", str(work / "results")]
    began = time.time()
    with log.open("wb") as sink:
        proc = subprocess.run(argv, env=env, cwd=work, stdout=sink, stderr=subprocess.STDOUT)
    ended = time.time()
    if proc.returncode != 0:
        print(log.read_text()[-4000:], file=sys.stderr)
        raise SystemExit(f"{side} run failed (exit {proc.returncode}); its log is above")
    first = _first_window(side, work)
    stamps = {
        "worker_s": first["proc_start"] - began,
        "build_s": first["build_began"] - began,
        "built_s": first["built_at"] - began,
        "first_batch_s": first["w_start"] - began,
        "exit_s": ended - began,
    }
    return {"side": side, **stamps}


def _first_window(side: str, work: pathlib.Path) -> dict[str, float]:
    if side == "ray_tune":
        rows = json.loads((work / "rows.json").read_text())
    else:
        import searchlab

        reports = searchlab.load_results(work / "results" / "cold").all_reports
        training = reports[reports["group"] == "training"]
        rows = training[["w_start", "proc_start", "build_began", "built_at"]].to_dict("records")
    if not rows:
        raise SystemExit(f"{side}: the run reported no training window")
    return min(rows, key=lambda row: row["w_start"])


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for side in SIDES:
        mine = [r for r in runs if r["side"] == side]
        if mine:
            summary[side] = {k: statistics.median(r[k] for r in mine) for k in STAMPS}
    ray, ours = summary.get("ray_tune"), summary.get("searchlab")
    if ray and ours:
        summary["searchlab_over_ray_first_batch"] = ours["first_batch_s"] / ray["first_batch_s"]
        summary["searchlab_over_ray_exit"] = ours["exit_s"] / ray["exit_s"]
    before = summary.get("searchlab_runtime_env")
    if before and ours:
        summary["prestart_saves_first_batch_s"] = before["first_batch_s"] - ours["first_batch_s"]
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reports", type=int, default=2, help="report windows in the trial")
    parser.add_argument("--sides", default=",".join(SIDES))
    args = parser.parse_args()

    import torch

    gpu = torch.cuda.is_available()
    hp = hyperparameters(args.quick, gpu)
    every = 4 if args.quick else 40
    sides = args.sides.split(",")
    unknown = sorted(set(sides) - set(SIDES))
    if unknown:
        parser.error(f"--sides: unknown {unknown}; choose from {', '.join(SIDES)}")
    runs = []
    root = pathlib.Path(tempfile.mkdtemp(prefix="cold-start-"))
    for index in range(args.rounds):
        for side in sides if index % 2 == 0 else list(reversed(sides)):
            row = {
                "round": index,
                **run_side(side, hp, every, args.reports, root / f"{index}-{side}"),
            }
            runs.append(row)
            print_table([row], ["round", "side", *STAMPS])
    print()
    print_table(runs, ["round", "side", *STAMPS])
    summary = summarize(runs)
    print(json.dumps(summary, indent=1))
    write_result(
        result_path("cold_start", args),
        summary,
        runs=runs,
        settings={"hp": hp, "report_every": every, "reports": args.reports, "rounds": args.rounds},
        machine=machine_info(),
    )


if __name__ == "__main__":
    main()
