"""Experiment directories written as searchlab's driver and Ray Tune write them, and the
quadratic reading of ``result.json`` that searchlab used before, as a reference."""

from __future__ import annotations

import json
import pathlib
import random
from typing import Any

import pandas as pd

METRIC = "validation_loss"
HPARAMS = {
    "global_batch_size": 16,
    "hidden": {"type": "int", "minval": 2, "maxval": 64},
    "optimizer": {"lr": {"type": "log", "base": 10, "minval": -4, "maxval": -1}},
    "activation": {"type": "categorical", "vals": ["relu", "tanh"]},
}


def experiment_meta(smaller_is_better: bool = True, hparams: dict[str, Any] | None = None) -> dict:
    config = {
        "name": "synthetic",
        "entrypoint": "toy_model_def:ToyModelTrial",
        "hyperparameters": HPARAMS if hparams is None else hparams,
        "searcher": {"name": "random", "metric": METRIC, "smaller_is_better": smaller_is_better},
    }
    return {
        "name": "synthetic",
        "config": config,
        "config_file": "<dict>",
        "model_dir": "/nonexistent/model_dir",
        "entrypoint": "toy_model_def:ToyModelTrial",
        "metric": METRIC,
        "smaller_is_better": smaller_is_better,
        "searcher": "random",
        "length_unit": "batches",
    }


def tune_line(trial_id: str, report: dict[str, Any], iteration: int, hparams: dict) -> str:
    """One ``result.json`` line as Tune writes it: the report, then Tune's own keys."""
    line = dict(report)
    line.update(
        {
            "done": False,
            "training_iteration": iteration,
            "trial_id": trial_id,
            "date": "2026-01-01_00-00-00",
            "timestamp": 1_767_225_600 + iteration,
            "time_this_iter_s": 0.01,
            "time_total_s": 0.01 * iteration,
            "pid": 1234,
            "hostname": "host",
            "node_ip": "192.0.2.1",
            "config": {"hparams": hparams, "searchlab": {"rung_ends": [8], "trial_seed": 7}},
            "time_since_restore": 0.01,
            "iterations_since_restore": iteration,
        }
    )
    return json.dumps(line)


def restart_history(rng: random.Random, n: int) -> list[tuple[str, int]]:
    """``n`` (group, batches) reports of a trial that is restored from earlier checkpoints."""
    reports: list[tuple[str, int]] = []
    batches, checkpoints = 0, [0]
    while len(reports) < n:
        if reports and rng.random() < 0.12:
            batches = rng.choice(checkpoints)  # restored: the work after it is redone
            continue
        batches += rng.choice([0, 1, 1, 2, 3])
        group = rng.choice(["training", "training", "validation", "checkpoint"])
        reports.append((group, batches))
        if group == "validation":
            checkpoints.append(batches)
    return reports


def report_of(rng: random.Random, group: str, batches: int) -> dict[str, Any]:
    report: dict[str, Any] = {"group": group, "batches": batches, "epochs": batches / 4}
    if group == "training":
        report["loss"] = (
            rng.choice([rng.random(), float("nan")]) if rng.random() < 0.1 else rng.random()
        )
    elif group == "validation":
        report.update({METRIC: rng.random(), "accuracy": rng.random()})
        if rng.random() < 0.3:
            report.update({"should_checkpoint": True, "searchlab_length": batches})
    else:
        report["checkpoint_metric"] = 1.0  # a group Results leaves out
    return report


def write_trial(
    exp_dir: pathlib.Path,
    trial_id: str,
    reports: list[dict[str, Any]],
    hparams: dict[str, Any],
    tail: str = "",
) -> None:
    trial_dir = exp_dir / trial_id
    trial_dir.mkdir(parents=True, exist_ok=True)
    lines = [tune_line(trial_id, r, i + 1, hparams) for i, r in enumerate(reports)]
    (trial_dir / "result.json").write_text("".join(f"{line}\n" for line in lines) + tail)
    (trial_dir / "params.json").write_text(json.dumps({"hparams": hparams}, indent=2))


def record(trial_id: str, hparams: dict[str, Any], **fields: Any) -> dict[str, Any]:
    rec = {
        "trial_id": trial_id,
        "state": "COMPLETED",
        "hparams": hparams,
        "bracket": None,
        "rung": 0,
        "trial_seed": 7,
        "batches": 8,
        "best_metric": None,
        "last_metric": None,
        "checkpoint": None,
        "latest_checkpoint": None,
        "error": None,
        "restarts": 0,
        "warnings": [],
        "trial_dir": trial_id,
        "saved_checkpoints": [],
    }
    rec.update(fields)
    return rec


def write_experiment(
    exp_dir: pathlib.Path,
    records: list[dict[str, Any]] | None,
    smaller_is_better: bool = True,
    hparams: dict[str, Any] | None = None,
) -> pathlib.Path:
    exp_dir.mkdir(parents=True, exist_ok=True)
    meta = experiment_meta(smaller_is_better, hparams)
    (exp_dir / "experiment.json").write_text(json.dumps(meta, indent=2))
    if records is not None:
        data = {"updated": 1.0, "trials": records}
        (exp_dir / "trials.json").write_text(json.dumps(data, indent=1))
    return exp_dir


def write_checkpoint(trial_dir: pathlib.Path, n: int, batches: int, metric: float) -> pathlib.Path:
    path = trial_dir / f"checkpoint_{n:06d}"
    path.mkdir(parents=True)
    (path / "state-dict.pth").write_bytes(b"not a real state")
    meta = {"batches_trained": batches, "metrics": {METRIC: metric}}
    (path / "metadata.json").write_text(json.dumps(meta))
    return path


# --- the reading searchlab had before (quadratic), kept as the reference ---------------------

_TUNE_KEYS = {
    "timestamp", "training_iteration", "time_this_iter_s", "time_total_s", "pid", "hostname",
    "node_ip", "config", "date", "done", "trial_id", "should_checkpoint", "checkpoint_dir_name",
    "iterations_since_restore", "time_since_restore", "experiment_tag", "group", "batches",
    "epochs",
}  # fmt: skip


def _mark_superseded(rows: list[dict[str, Any]], trial_id: str) -> None:
    new = rows[-1]
    for row in rows[:-1]:
        if row["trial_id"] != trial_id:
            continue
        later = row["batches"] > new["batches"]
        repeated = row["batches"] == new["batches"] and row["group"] == new["group"]
        if later or repeated:
            row["_superseded"] = True


def reference_reports(exp_dir: pathlib.Path, trial_ids: list[str]) -> pd.DataFrame:
    """``all_reports`` as the old ``Results._metrics_frame`` built it (without the new columns)."""
    rows: list[dict[str, Any]] = []
    for trial_id in trial_ids:
        result_file = exp_dir / trial_id / "result.json"
        if not result_file.is_file():
            continue
        for line in result_file.read_text().splitlines():
            try:
                result = json.loads(line)
            except ValueError:
                continue
            if result.get("group") not in ("training", "validation"):
                continue
            row = {
                "trial_id": trial_id,
                "group": result["group"],
                "batches": result.get("batches"),
                "epochs": result.get("epochs"),
                "_superseded": False,
            }
            row.update(
                {
                    k: v
                    for k, v in result.items()
                    if k not in _TUNE_KEYS and not k.startswith("searchlab_")
                }
            )
            rows.append(row)
            _mark_superseded(rows, trial_id)
    columns = ["trial_id", "group", "batches", "epochs"]
    frame = pd.DataFrame(rows)
    if frame.empty:
        return pd.DataFrame(columns=[*columns, "superseded"])
    frame["superseded"] = frame.pop("_superseded").astype(bool)
    return frame[columns + [c for c in frame.columns if c not in columns]]
