"""Pause/resume cost of adaptive ASHA: from a pause decision to the first result after resume.

    PYTHONPATH=. python benchmarks/pause_resume.py [--reps 3] [--raw-reps 5]

Each measurement is a real ``searchlab.run`` of a 2-trial ``adaptive_asha`` search (rungs at 2
and 4 batches, divisor 2, one trial at a time, tied validation results), which always goes:
trial A trains 2 batches and is paused; trial B starts, trains 2 batches and reports; that one
decision pauses B and promotes A; A is resumed from its checkpoint and trains on. The number
measured is the time from that decision (the scheduler returning PAUSE for B, taken on the
driver by wrapping ``SearchScheduler.on_trial_result``) to the start of A's first batch after
the resume (``time.time()`` that the trial writes into its metrics as it begins the batch). It
covers saving B's checkpoint, handing A a worker, rebuilding A's trial, and loading A's
``state-dict.pth``. The time until the scheduler receives that first result (one more batch of
training, plus reporting) is kept beside it.

Warm: ``reuse_actors=True`` (searchlab's setting): A resumes in B's cached worker process.
Cold: ``reuse_actors=False``: A resumes in a new worker process, which imports torch again.
The script checks which process ran A after the resume (the ``pid`` of its results) and that A
went on from batch 2 rather than starting over.

Two model sizes: a tiny MLP, and ``torchvision.models.resnet18(num_classes=10)`` trained with
SGD momentum, so the checkpoint holds ~11.7M weights plus ~11.7M momentum values (~94 MB). Next
to them, in the same process, ``torch.save`` + ``torch.load`` of the very state A was paused with
(read back from its checkpoint), written to the same file system.

Prints a table and writes ``benchmarks/results/pause_resume.json``; its ``summary`` holds
``warm_resume_s``, ``cold_resume_s`` and ``raw_save_load_s`` (medians) for the ResNet-18 state.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import platform
import statistics
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import ray
import torch
from ray import tune
from ray.tune.schedulers import TrialScheduler

import searchlab
from searchlab.experiment._adapters import SearchScheduler

HERE = pathlib.Path(__file__).resolve().parent
MODEL_DIR = HERE / "pause_resume_model"
RESULTS = HERE / "results" / "pause_resume.json"
MODELS = ("small", "resnet18")
MODES = ("warm", "cold")


def _config(model: str, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "entrypoint": "model_def:PauseResumeTrial",
        "hyperparameters": {"global_batch_size": 8, "model": model},
        "searcher": {
            "name": "adaptive_asha",
            "metric": "validation_loss",
            "max_trials": 2,
            "max_length": {"batches": 4},  # rungs end at 2 and 4 batches
            "mode": "aggressive",
            "divisor": 2,
            "max_concurrent_trials": 1,
        },
        "scheduling_unit": 1,  # a training result after every batch
        # Keep trial A's pause checkpoint: the raw save + load runs on the state it holds.
        "checkpoint_storage": {"save_trial_latest": 2},
        "max_restarts": 0,
        "reproducibility": {"experiment_seed": 0},
    }


@contextlib.contextmanager
def _reuse_actors(reuse: bool) -> Iterator[None]:
    """searchlab always asks Tune to reuse actors; the cold runs turn that off here."""
    original = tune.TuneConfig

    def tune_config(**kwargs: Any) -> Any:
        kwargs["reuse_actors"] = reuse
        return original(**kwargs)

    tune.TuneConfig = tune_config  # type: ignore[assignment, misc]
    try:
        yield
    finally:
        tune.TuneConfig = original  # type: ignore[misc]


@contextlib.contextmanager
def _scheduler_log() -> Iterator[list[dict[str, Any]]]:
    """Every result the scheduler sees: when it arrived, what was decided, and when."""
    log: list[dict[str, Any]] = []
    original = SearchScheduler.on_trial_result

    def timed(self: SearchScheduler, controller: Any, trial: Any, result: dict[str, Any]) -> str:
        received = time.time()
        decision = original(self, controller, trial, result)
        log.append(
            {
                "trial_id": trial.trial_id,
                "received": received,
                "decided": time.time(),
                "decision": decision,
                "group": result.get("group"),
                "batches": result.get("batches"),
                "step_start": result.get("step_start"),
                "pid": result.get("pid"),
                "iterations_since_restore": result.get("iterations_since_restore"),
            }
        )
        return decision

    SearchScheduler.on_trial_result = timed  # type: ignore[method-assign]
    try:
        yield log
    finally:
        SearchScheduler.on_trial_result = original  # type: ignore[method-assign]


def measure_resume(model: str, mode: str, storage: pathlib.Path, rep: int) -> dict[str, Any]:
    """One search; the pause decision that promotes A, and A's first result after it."""
    name = f"{model}-{mode}-{rep}"
    with _reuse_actors(mode == "warm"), _scheduler_log() as log:
        searchlab.run(_config(model, name), model_dir=MODEL_DIR, storage_path=storage, echo=_quiet)
    pauses = [e for e in log if e["decision"] == TrialScheduler.PAUSE]
    if len(pauses) != 2 or pauses[0]["trial_id"] == pauses[1]["trial_id"]:
        raise RuntimeError(f"{name}: expected one pause of each trial, got {pauses}")
    first, trigger = pauses
    resumed = next(
        e for e in log if e["trial_id"] == first["trial_id"] and e["received"] > trigger["decided"]
    )
    if resumed["batches"] != 3 or resumed["iterations_since_restore"] != 1:
        raise RuntimeError(f"{name}: trial A did not go on from batch 2 after a restore: {resumed}")
    same_process = resumed["pid"] == trigger["pid"]
    if same_process != (mode == "warm"):
        raise RuntimeError(
            f"{name}: {mode} resume ran in pid {resumed['pid']}; B had {trigger['pid']}"
        )
    return {
        "model": model,
        "mode": mode,
        "rep": rep,
        "resume_s": resumed["step_start"] - trigger["decided"],
        "to_first_result_s": resumed["received"] - trigger["decided"],
        "paused_trial_pid": first["pid"],
        "pausing_trial_pid": trigger["pid"],
        "resumed_pid": resumed["pid"],
        "checkpoint": str(
            storage / name / first["trial_id"] / "checkpoint_000000" / "state-dict.pth"
        ),
    }


def measure_raw(state_file: pathlib.Path, scratch: pathlib.Path, reps: int) -> dict[str, Any]:
    """``torch.save`` + ``torch.load`` of the state read from a paused trial's checkpoint."""
    state = torch.load(state_file, map_location="cpu", weights_only=False)
    target = scratch / "raw-state.pth"
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        torch.save(state, target)
        torch.load(target, map_location="cpu", weights_only=False)
        times.append(time.perf_counter() - start)
    return {
        "raw_save_load_s": times,
        "state_bytes": state_file.stat().st_size,
        "tensor_values": _count_values(state),
    }


def _count_values(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel()
    if isinstance(obj, dict):
        return sum(_count_values(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_count_values(v) for v in obj)
    return 0


def _quiet(line: str) -> None:
    pass


def machine() -> dict[str, Any]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cpu_model": cpu,
        "cpu_count": os.cpu_count(),  # searchlab.run starts Ray with all of them
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ray": ray.__version__,
        "platform": platform.platform(),
    }


def _times(runs: list[dict[str, Any]], model: str, mode: str) -> list[float]:
    return [r["resume_s"] for r in runs if r["model"] == model and r["mode"] == mode]


def _range(runs: list[dict[str, Any]], model: str, mode: str) -> list[float]:
    times = _times(runs, model, mode)
    return [min(times), max(times)]


def summarise(runs: list[dict[str, Any]], raw: dict[str, dict[str, Any]]) -> dict[str, Any]:
    per_model: dict[str, dict[str, Any]] = {}
    for model in MODELS:
        warm = statistics.median(_times(runs, model, "warm"))
        cold = statistics.median(_times(runs, model, "cold"))
        save_load = statistics.median(raw[model]["raw_save_load_s"])
        per_model[model] = {
            "warm_resume_s": warm,
            "cold_resume_s": cold,
            "raw_save_load_s": save_load,
            "warm_range_s": _range(runs, model, "warm"),
            "cold_range_s": _range(runs, model, "cold"),
            "state_mb": raw[model]["state_bytes"] / 1e6,
            "state_tensor_values": raw[model]["tensor_values"],
            "cold_over_warm": cold / warm,
            "warm_over_raw": warm / save_load,
            "cold_over_raw": cold / save_load,
        }
    big = per_model["resnet18"]
    return {
        "warm_resume_s": big["warm_resume_s"],
        "cold_resume_s": big["cold_resume_s"],
        "raw_save_load_s": big["raw_save_load_s"],
        "ratios": {k: big[k] for k in ("cold_over_warm", "warm_over_raw", "cold_over_raw")},
        "resnet18": big,
        "small": per_model["small"],
        "statistic": "median over repetitions",
        "measured": "pause decision (scheduler returns PAUSE for the trial whose result promotes "
        "the paused one) -> start of the resumed trial's first batch",
        "machine": machine(),
    }


def print_table(runs: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    print(
        f"{'model':<9} {'mode':<5} {'rep':>3} {'resume s':>9} {'to result s':>12} {'pid A->B->A'}"
    )
    for r in runs:
        pids = f"{r['paused_trial_pid']}->{r['pausing_trial_pid']}->{r['resumed_pid']}"
        print(
            f"{r['model']:<9} {r['mode']:<5} {r['rep']:>3} {r['resume_s']:>9.3f} "
            f"{r['to_first_result_s']:>12.3f} {pids}"
        )
    print()
    header = (
        f"{'model':<9} {'state MB':>9} {'warm s':>8} {'cold s':>8} {'save+load s':>12} "
        f"{'cold/warm':>10} {'warm/raw':>9} {'cold/raw':>9}"
    )
    print(header)
    for model in MODELS:
        m = summary[model]
        print(
            f"{model:<9} {m['state_mb']:>9.1f} {m['warm_resume_s']:>8.3f} {m['cold_resume_s']:>8.3f} "
            f"{m['raw_save_load_s']:>12.3f} {m['cold_over_warm']:>10.1f} {m['warm_over_raw']:>9.1f} "
            f"{m['cold_over_raw']:>9.1f}"
        )
    print(
        f"\nmachine: {summary['machine']['cpu_model']}, torch {torch.__version__}, ray {ray.__version__}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="searches per model and mode")
    parser.add_argument("--raw-reps", type=int, default=5, help="raw save+load repetitions")
    args = parser.parse_args()
    runs: list[dict[str, Any]] = []
    raw: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="searchlab-pause-resume-") as tmp:
        storage = pathlib.Path(tmp)
        for rep in range(args.reps):
            for model in MODELS:
                for mode in MODES if rep % 2 == 0 else MODES[::-1]:
                    runs.append(measure_resume(model, mode, storage, rep))
                    print(f"{model} {mode} rep {rep}: {runs[-1]['resume_s']:.3f} s", flush=True)
        for model in MODELS:
            state_file = next(pathlib.Path(r["checkpoint"]) for r in runs if r["model"] == model)
            raw[model] = measure_raw(state_file, storage, args.raw_reps)
    summary = summarise(runs, raw)
    print_table(runs, summary)
    for r in runs:
        del r["checkpoint"]  # it was in a temporary directory
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    data = {"summary": summary, "runs": runs, "raw": raw, "reps": args.reps}
    RESULTS.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
