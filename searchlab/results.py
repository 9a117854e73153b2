"""Experiment results as pandas DataFrames, readable while an experiment runs or after it died."""

from __future__ import annotations

import os
import pathlib
from typing import TYPE_CHECKING, Any

import pandas as pd

from searchlab._lock import driver_alive
from searchlab._results._analysis import (
    best_rows,
    finite,
    flatten_hparams,
    hyperparameter_importance,
    learning_curves,
)
from searchlab._results._records import (
    TRIALS_FILE,
    PathResolver,
    read_experiment,
    read_records,
    rebuild_records,
    saved_checkpoints,
)
from searchlab._results._reports import ResultFile, read_reports
from searchlab.errors import SearchlabError

if TYPE_CHECKING:
    from searchlab.pytorch import PyTorchTrial

__all__ = ["Results", "load_results"]

_TRIAL_EXTRAS = ("bracket", "rung", "restarts", "trial_seed", "error", "warnings")


class Results:
    """The trials and every metric report of an experiment directory.

    ``metrics`` holds each trial's history as it stands: when a trial was restored from a
    checkpoint (a retry, a resumed experiment), the reports of the work it redid replace the
    earlier ones. ``all_reports`` keeps every report, with ``superseded`` marking those. Both
    have ``timestamp`` (the report's wall-clock time, UTC) and ``elapsed_s`` (seconds since the
    experiment's first report).

    Paths (``trials["checkpoint"]``) are absolute paths inside this experiment directory, also
    when the directory was copied or moved after the run.

    Example:
        >>> results = searchlab.load_results("searchlab-results/mnist-grid")
        >>> results.trials[["trial_id", "state", "learning_rate", "best_validation_loss"]]
        >>> results.learning_curves().plot()
        >>> trial = results.load_trial(results.best_trial()["trial_id"], trial_class=MnistTrial)
    """

    def __init__(self, experiment_dir: str | os.PathLike[str], *, rebuild: bool = False) -> None:
        self.experiment_dir = pathlib.Path(experiment_dir).resolve()
        self.experiment: dict[str, Any] = read_experiment(self.experiment_dir)
        self.metric: str = str(self.experiment["metric"])
        self.smaller_is_better: bool = bool(self.experiment["smaller_is_better"])
        self._paths = PathResolver(self.experiment_dir)
        records = None if rebuild else read_records(self.experiment_dir)
        self._rebuilt = records is None
        self._records = rebuild_records(self.experiment_dir) if records is None else records
        if not driver_alive(self.experiment_dir):
            for rec in self._records:  # its driver died (or a full disk stopped its writes):
                if rec.get("state") == "RUNNING":  # the trial is paused at its checkpoint
                    rec["state"] = "PAUSED"
        self.all_reports = read_reports([self._result_file(rec) for rec in self._records])
        superseded = self.all_reports["superseded"].astype(bool)
        self.metrics = self.all_reports.loc[~superseded].drop(columns="superseded")
        if self._rebuilt:
            self._fill_rebuilt_records()
        self.trials = self._trials_frame()
        self._paths.warn_ignored(self.experiment_dir / TRIALS_FILE)

    def _result_file(self, rec: dict[str, Any]) -> ResultFile:
        trial_id = rec["trial_id"]
        candidates = (
            self._paths.trial_dir(rec.get("trial_dir"), trial_id),
            self._paths.own_trial_dir(trial_id),
        )
        paths = tuple(dict.fromkeys(os.path.join(c, "result.json") for c in candidates if c))
        return ResultFile(trial_id, paths)

    def _fill_rebuilt_records(self) -> None:
        """What a rebuilt record can know: batches and metrics from the reports, checkpoints
        from the trial directories."""
        validation = self.metrics[self.metrics["group"] == "validation"]
        best = last = None
        if self.metric in validation:
            values = validation.groupby("trial_id", sort=False)[self.metric]
            best = values.min() if self.smaller_is_better else values.max()
            last = values.last()
        batches = self.metrics.groupby("trial_id", sort=False)["batches"].max()
        for rec in self._records:
            trial_id = rec["trial_id"]
            rec["batches"] = _most_batches(batches, trial_id)
            rec["best_metric"] = finite(best.get(trial_id)) if best is not None else None
            rec["last_metric"] = finite(last.get(trial_id)) if last is not None else None
            self._find_checkpoints(rec)

    def _find_checkpoints(self, rec: dict[str, Any]) -> None:
        trial_dir = self._paths.trial_dir(rec["trial_dir"], rec["trial_id"])
        if trial_dir is None:
            return
        saved = saved_checkpoints(trial_dir, rec.pop("_checkpoints", []))
        sign = 1.0 if self.smaller_is_better else -1.0
        scored = []
        for path, meta in saved:
            value = finite((meta.get("metrics") or {}).get(self.metric))
            if value is not None:
                scored.append((sign * value, -_batches(meta), path))
        rec["checkpoint"] = min(scored)[2] if scored else None
        latest = max(saved, key=lambda s: _batches(s[1]), default=None)
        rec["latest_checkpoint"] = latest[0] if latest else None

    def _trials_frame(self) -> pd.DataFrame:
        batches = pd.Series(dtype="float64")
        if any("batches" not in rec for rec in self._records):
            batches = self.metrics.groupby("trial_id", sort=False)["batches"].max()
        rows = []
        for rec in self._records:
            trial_id = rec["trial_id"]
            row: dict[str, Any] = {"trial_id": trial_id, "state": rec.get("state")}
            row.update(flatten_hparams(rec.get("hparams") or {}))
            if "batches" in rec:
                row["batches"] = rec["batches"]
            else:
                row["batches"] = _most_batches(batches, trial_id)
            row[f"best_{self.metric}"] = rec.get("best_metric")
            row[f"last_{self.metric}"] = rec.get("last_metric")
            row["checkpoint"] = self._paths.checkpoint(rec.get("checkpoint"), trial_id)
            for key in _TRIAL_EXTRAS:
                row[key] = rec.get(key)
            rows.append(row)
        if not rows:  # no trial yet: the columns still exist, so lookups give empty results
            columns = ["trial_id", "state", "batches", f"best_{self.metric}"]
            return pd.DataFrame(
                columns=[*columns, f"last_{self.metric}", "checkpoint", *_TRIAL_EXTRAS]
            )
        return pd.DataFrame(rows)

    def best_trial(self) -> pd.Series:
        """The row of ``trials`` with the best searcher metric."""
        ranked = self.best_trials(n=1)
        if ranked.empty or pd.isna(ranked.iloc[0][f"best_{self.metric}"]):
            raise SearchlabError(f"{self.experiment_dir}: no trial reported {self.metric} yet")
        return ranked.iloc[0]

    def best_trials(self, n: int = 5) -> pd.DataFrame:
        """The ``n`` best rows of ``trials`` by the searcher metric, best first (no value last).

        Example:
            >>> results.best_trials(3)[["trial_id", "best_validation_loss", "checkpoint"]]
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise SearchlabError(f"The value of `n` is {n!r}, but must be an integer `n >= 1`")
        return best_rows(self.trials, f"best_{self.metric}", self.smaller_is_better, n)

    def best_checkpoint(self) -> str | None:
        """The checkpoint directory of the best trial at its best validation."""
        checkpoint = self.best_trial()["checkpoint"]
        return checkpoint if isinstance(checkpoint, str) else None

    def learning_curves(self, metric: str | None = None, group: str | None = None) -> pd.DataFrame:
        """One column per trial with ``metric`` by batches (superseded reports left out).

        ``metric`` defaults to the searcher metric. ``group`` (``training`` or ``validation``)
        defaults to the group whose reports hold the metric.

        Example:
            >>> results.learning_curves().plot(logy=True)
            >>> results.learning_curves("loss")  # training loss
        """
        return learning_curves(
            self.metrics, metric or self.metric, group, self.experiment_dir, self.metric
        )

    def hyperparameter_importance(self) -> pd.Series:
        """How much each hyperparameter explains the searcher metric, by Optuna's fANOVA.

        Uses every trial with a finite best metric, and the ranges of the experiment's
        ``hyperparameters`` (constants are left out). Seeded, so the same results give the same
        importances. Needs scikit-learn.

        Example:
            >>> results.hyperparameter_importance()
            optimizer.lr    0.81
            hidden          0.19
        """
        return hyperparameter_importance(
            self.trials,
            self._records,
            (self.experiment.get("config") or {}).get("hyperparameters") or {},
            metric=self.metric,
            smaller_is_better=self.smaller_is_better,
            where=self.experiment_dir,
        )

    def load_trial(
        self,
        trial_id: str,
        checkpoint: str | os.PathLike[str] | None = None,
        *,
        trial_class: type[PyTorchTrial] | None = None,
        trusted: bool = False,
    ) -> PyTorchTrial:
        """The trial instance with the weights of its best (or the given) checkpoint.

        The trial class is ``trial_class``. Only with ``trusted=True`` is it imported from the
        entrypoint and model directory that ``experiment.json`` names (a data file then decides
        which code runs, and the checkpoint is unpickled without restriction).

        Example:
            >>> trial = results.load_trial(best["trial_id"], trial_class=MnistTrial)
        """
        from searchlab.pytorch import load_trial_class, load_trial_from_checkpoint_path

        rows = self.trials[self.trials["trial_id"] == trial_id]
        if rows.empty:
            raise SearchlabError(f"{self.experiment_dir}: no trial {trial_id!r}")
        path = os.fspath(checkpoint) if checkpoint is not None else rows.iloc[0]["checkpoint"]
        if not isinstance(path, str) or not path:
            raise SearchlabError(f"trial {trial_id} has no checkpoint")
        if checkpoint is None and not self._paths.inside(path):
            raise SearchlabError(
                f"trial {trial_id}: checkpoint {path} leads outside the experiment directory "
                f"{self.experiment_dir}; pass the checkpoint to load explicitly"
            )
        cls = trial_class
        if cls is None:
            entrypoint, model_dir = (
                self.experiment.get("entrypoint"),
                self.experiment.get("model_dir"),
            )
            if not trusted:
                raise SearchlabError(
                    f"{self.experiment_dir / 'experiment.json'} names the entrypoint "
                    f"{entrypoint!r} in {model_dir}, and load_trial does not import code that a "
                    "data file names: pass trial_class=YourTrial, or trusted=True to import it "
                    "from there"
                )
            cls = load_trial_class(str(entrypoint), model_dir)
        return load_trial_from_checkpoint_path(path, trial_class=cls, trusted=trusted)

    def summary(self) -> str:
        """A few lines: the directory, the trials by state, and the best trial."""
        lines = [f"experiment directory: {self.experiment_dir}"]
        states = self.trials["state"].value_counts().to_dict() if len(self.trials) else {}
        counts = ", ".join(f"{n} {str(s).lower()}" for s, n in states.items())
        lines.append(f"trials: {counts or 'none yet'}")
        try:
            best = self.best_trial()
        except SearchlabError:
            lines.append("no trial reported the searcher metric")
            return "\n".join(lines)
        names = flatten_hparams(self._hparams_of(best["trial_id"]))
        hparams = {k: best[k] for k in self.trials.columns if k in names}
        lines.append(
            f"best trial: {best['trial_id']}  {self.metric}={best[f'best_{self.metric}']:.6g}"
        )
        lines.append("  hyperparameters: " + ", ".join(f"{k}={v}" for k, v in hparams.items()))
        checkpoint = best["checkpoint"]
        lines.append(f"  checkpoint: {checkpoint if isinstance(checkpoint, str) else 'none'}")
        return "\n".join(lines)

    def _hparams_of(self, trial_id: str) -> dict[str, Any]:
        for rec in self._records:
            if rec["trial_id"] == trial_id:
                return dict(rec.get("hparams") or {})
        return {}


def _most_batches(batches: pd.Series, trial_id: str) -> int:
    value = finite(batches.get(trial_id))
    return int(value) if value is not None else 0


def _batches(meta: dict[str, Any]) -> int:
    try:
        return int(meta.get("batches_trained", -1))
    except (TypeError, ValueError):
        return -1


def load_results(experiment_dir: str | os.PathLike[str], *, rebuild: bool = False) -> Results:
    """Read an experiment directory (finished, running or crashed) into a :class:`Results`.

    With ``rebuild=True`` the trial records are rebuilt from the trial directories instead of
    read from ``trials.json`` (for a damaged file): states are then ``UNKNOWN``.

    Example:
        >>> results = searchlab.load_results("searchlab-results/mnist-grid")
    """
    return Results(experiment_dir, rebuild=rebuild)
