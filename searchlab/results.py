"""Experiment results as pandas DataFrames, readable while an experiment runs or after it died."""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import pandas as pd

from searchlab.errors import SearchlabError

__all__ = ["Results", "load_results"]

_TUNE_KEYS = {
    "timestamp",
    "training_iteration",
    "time_this_iter_s",
    "time_total_s",
    "pid",
    "hostname",
    "node_ip",
    "config",
    "date",
    "done",
    "trial_id",
    "should_checkpoint",
    "checkpoint_dir_name",
    "iterations_since_restore",
    "time_since_restore",
    "experiment_tag",
    "group",
    "batches",
    "epochs",
}

_TRIAL_EXTRAS = ("bracket", "rung", "restarts", "trial_seed", "error", "warnings")


def _flatten(hparams: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in sorted(hparams):
        value = hparams[key]
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _mark_superseded(rows: list[dict[str, Any]], trial_id: str) -> None:
    """A trial restarted from a checkpoint re-reports some batches: the earlier run's reports
    at or past the new report's batch belong to a timeline that was rolled back."""
    new = rows[-1]
    for row in rows[:-1]:
        if row["trial_id"] != trial_id:
            continue
        later = row["batches"] > new["batches"]
        repeated = row["batches"] == new["batches"] and row["group"] == new["group"]
        if later or repeated:
            row["_superseded"] = True


class Results:
    """The trials and every metric report of an experiment directory.

    ``metrics`` holds each trial's history as it stands: when a trial was restored from a
    checkpoint (a retry, a resumed experiment), the reports of the work it redid replace the
    earlier ones. ``all_reports`` keeps every report, with ``superseded`` marking those.

    Example:
        >>> results = searchlab.load_results("searchlab-results/mnist-grid")
        >>> results.trials[["trial_id", "state", "learning_rate", "best_validation_loss"]]
        >>> trial = results.load_trial(results.best_trial()["trial_id"])
    """

    def __init__(self, experiment_dir: str | os.PathLike[str]) -> None:
        self.experiment_dir = pathlib.Path(experiment_dir).resolve()
        meta_file = self.experiment_dir / "experiment.json"
        if not meta_file.is_file():
            raise SearchlabError(
                f"{self.experiment_dir}: not a searchlab experiment directory (no experiment.json)"
            )
        self.experiment = json.loads(meta_file.read_text())
        self.metric: str = self.experiment["metric"]
        self.smaller_is_better: bool = bool(self.experiment["smaller_is_better"])
        self._records = self._read_records()
        self.all_reports = self._metrics_frame()
        superseded = self.all_reports["superseded"].astype(bool)
        self.metrics = self.all_reports.loc[~superseded].drop(columns="superseded")
        self.trials = self._trials_frame()

    def _read_records(self) -> list[dict[str, Any]]:
        path = self.experiment_dir / "trials.json"
        if path.is_file():
            try:
                return list(json.loads(path.read_text())["trials"])
            except (ValueError, KeyError):
                pass
        records = []  # no driver record (it died early): rebuild from Tune's trial directories
        for params in sorted(self.experiment_dir.glob("*/params.json")):
            config = json.loads(params.read_text())
            records.append(
                {
                    "trial_id": params.parent.name,
                    "state": "UNKNOWN",
                    "hparams": config.get("hparams", {}),
                    "trial_dir": str(params.parent),
                }
            )
        return records

    def _trial_dir(self, rec: dict[str, Any]) -> pathlib.Path:
        own = self.experiment_dir / rec["trial_id"]
        return own if own.is_dir() else pathlib.Path(rec.get("trial_dir") or own)

    def _metrics_frame(self) -> pd.DataFrame:
        rows: list[dict[str, Any]] = []
        for rec in self._records:
            result_file = self._trial_dir(rec) / "result.json"
            if not result_file.is_file():
                continue
            for line in result_file.read_text().splitlines():
                try:
                    result = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a crash
                if result.get("group") not in ("training", "validation"):
                    continue
                row = {
                    "trial_id": rec["trial_id"],
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
                _mark_superseded(rows, rec["trial_id"])
        columns = ["trial_id", "group", "batches", "epochs"]
        frame = pd.DataFrame(rows)
        if frame.empty:
            return pd.DataFrame(columns=[*columns, "superseded"])
        frame["superseded"] = frame.pop("_superseded").astype(bool)
        return frame[columns + [c for c in frame.columns if c not in columns]]

    def _trials_frame(self) -> pd.DataFrame:
        rows = []
        for rec in self._records:
            row: dict[str, Any] = {"trial_id": rec["trial_id"], "state": rec.get("state")}
            row.update(_flatten(rec.get("hparams", {})))
            row["batches"] = rec.get("batches", self._batches_from_metrics(rec["trial_id"]))
            row[f"best_{self.metric}"] = rec.get("best_metric")
            row[f"last_{self.metric}"] = rec.get("last_metric")
            row["checkpoint"] = rec.get("checkpoint")
            for key in _TRIAL_EXTRAS:
                row[key] = rec.get(key)
            rows.append(row)
        if not rows:  # no trial yet: the columns still exist, so lookups give empty results
            columns = ["trial_id", "state", "batches", f"best_{self.metric}"]
            return pd.DataFrame(
                columns=[*columns, f"last_{self.metric}", "checkpoint", *_TRIAL_EXTRAS]
            )
        return pd.DataFrame(rows)

    def _batches_from_metrics(self, trial_id: str) -> int:
        own = self.metrics[self.metrics["trial_id"] == trial_id]
        return int(own["batches"].max()) if len(own) else 0

    def best_trial(self) -> pd.Series:
        """The row of ``trials`` with the best searcher metric."""
        column = f"best_{self.metric}"
        ranked = self.trials.dropna(subset=[column])
        if ranked.empty:
            raise SearchlabError(f"{self.experiment_dir}: no trial reported {self.metric} yet")
        idx = ranked[column].idxmin() if self.smaller_is_better else ranked[column].idxmax()
        return ranked.loc[idx]

    def best_checkpoint(self) -> str | None:
        """The checkpoint directory of the best trial at its best validation."""
        return self.best_trial()["checkpoint"]

    def load_trial(self, trial_id: str, checkpoint: str | None = None) -> Any:
        """The trial instance with the weights of its best (or the given) checkpoint."""
        from searchlab.pytorch import load_trial_class, load_trial_from_checkpoint_path

        rows = self.trials[self.trials["trial_id"] == trial_id]
        if rows.empty:
            raise SearchlabError(f"{self.experiment_dir}: no trial {trial_id!r}")
        path = checkpoint or rows.iloc[0]["checkpoint"]
        if not path:
            raise SearchlabError(f"trial {trial_id} has no checkpoint")
        cls = load_trial_class(self.experiment["entrypoint"], self.experiment["model_dir"])
        return load_trial_from_checkpoint_path(path, trial_class=cls)

    def summary(self) -> str:
        lines = [f"experiment directory: {self.experiment_dir}"]
        states = self.trials["state"].value_counts().to_dict() if len(self.trials) else {}
        counts = ", ".join(f"{n} {s.lower()}" for s, n in states.items())
        lines.append(f"trials: {counts or 'none yet'}")
        try:
            best = self.best_trial()
        except SearchlabError:
            lines.append("no trial reported the searcher metric")
            return "\n".join(lines)
        hparams = {
            k: best[k]
            for k in self.trials.columns
            if k in _flatten(self._hparams_of(best["trial_id"]))
        }
        lines.append(
            f"best trial: {best['trial_id']}  {self.metric}={best[f'best_{self.metric}']:.6g}"
        )
        lines.append("  hyperparameters: " + ", ".join(f"{k}={v}" for k, v in hparams.items()))
        lines.append(f"  checkpoint: {best['checkpoint']}")
        return "\n".join(lines)

    def _hparams_of(self, trial_id: str) -> dict[str, Any]:
        for rec in self._records:
            if rec["trial_id"] == trial_id:
                return dict(rec.get("hparams", {}))
        return {}


def load_results(experiment_dir: str | os.PathLike[str]) -> Results:
    """Read an experiment directory (finished, running or crashed) into a :class:`Results`."""
    return Results(experiment_dir)
