"""What happened in a search, as plain frames: curves, rung visits, best so far, occupancy.

The plots (``searchlab plot``), the HTML report (``searchlab report``) and the trials table of
``searchlab results`` all draw from one :class:`SearchHistory`, built from :class:`Results`
alone (the trials, their reports and the experiment's config), so it reads any experiment
directory the way ``load_results`` does: finished, running or crashed.

A *rung visit* is a trial's validation at one of its bracket's rung ends (for grid, random and
single searches the only rung end is ``max_length``). A visit was *promoted* when the trial
trained past that rung end afterwards; in promotion ASHA the trial paused at the rung end in
between, and ``resumed_s`` is when it continued.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from searchlab.errors import SearchlabError

if TYPE_CHECKING:
    from searchlab.results import Results

__all__ = [
    "SearchHistory",
    "VisitKind",
    "best_so_far",
    "best_trial_id",
    "build_history",
    "hparam_columns",
    "plan_rung_ends",
    "rung_occupancy",
    "varying_hparams",
]

_LIVE_STATES = ("RUNNING", "PAUSED", "PENDING")


class VisitKind(str, Enum):
    """What a trial did at a rung end (the frames hold the values, plain strings)."""

    PROMOTED = "promoted"  # trained past the rung end afterwards (after a pause, in ASHA)
    WAITING = "waiting"  # paused at the rung end; the search may still promote it
    STOPPED = "stopped"  # not promoted: its training ended at this rung
    FINISHED = "finished"  # the bracket's last rung end: trained to the full length


@dataclass(frozen=True)
class SearchHistory:
    """The frames the plots and the report draw.

    Attributes:
        metric: the searcher metric; ``smaller_is_better`` its direction.
        searcher: the searcher's name (``adaptive_asha``, ``grid``, ...).
        unit: the length unit of ``rung_ends`` (``batches``, ``epochs`` or ``records``).
        rung_ends: rung ends per bracket (a bracket of grid/random/single: ``[max_length]``).
        curves: the metric's validation reports: ``trial_id``, ``batches``, ``elapsed_s``,
            ``value`` (superseded reports left out), in report order.
        visits: one row per rung visit: ``trial_id``, ``bracket``, ``rung``, ``rung_end``,
            ``batches``, ``elapsed_s``, ``value``, ``kind`` (a :class:`VisitKind`) and
            ``resumed_s`` (when a promoted trial trained on; NaN otherwise).
        work: every report's ``trial_id``, ``batches`` and ``elapsed_s``, in time order.
        trials: ``Results.trials``.
    """

    metric: str
    smaller_is_better: bool
    searcher: str
    unit: str
    rung_ends: dict[int, list[float]]
    curves: pd.DataFrame
    visits: pd.DataFrame
    work: pd.DataFrame
    trials: pd.DataFrame

    @property
    def has_rungs(self) -> bool:
        """Whether some bracket has more than one rung (an adaptive search)."""
        return any(len(ends) > 1 for ends in self.rung_ends.values())


def build_history(results: Results) -> SearchHistory:
    """The :class:`SearchHistory` of ``results``."""
    metric = results.metric
    metrics = results.metrics
    config = results.experiment.get("config") or {}
    unit, rung_ends = plan_rung_ends(config)
    curves = pd.DataFrame(columns=["trial_id", "batches", "elapsed_s", "value"])
    if metric in metrics:
        rows = metrics[(metrics["group"] == "validation") & metrics[metric].notna()]
        curves = rows[["trial_id", "batches", "elapsed_s", metric]].rename(
            columns={metric: "value"}
        )
        curves = curves.reset_index(drop=True)
    work = metrics[["trial_id", "batches", "elapsed_s"]].sort_values("elapsed_s", kind="stable")
    visits = _visits(results, unit, rung_ends)
    return SearchHistory(
        metric=metric,
        smaller_is_better=results.smaller_is_better,
        searcher=str(results.experiment.get("searcher") or "?"),
        unit=unit,
        rung_ends=rung_ends,
        curves=curves,
        visits=visits,
        work=work.reset_index(drop=True),
        trials=results.trials,
    )


def plan_rung_ends(config: dict[str, Any]) -> tuple[str, dict[int, list[float]]]:
    """The search plan's unit and rung ends per bracket; ``{}`` for a config that no longer
    loads (then nothing is drawn at rung ends)."""
    from searchers import preview_plan
    from searchlab.config import load_experiment_config

    try:
        plan = preview_plan(load_experiment_config(config), max_grid_trials=None)
    except (SearchlabError, KeyError, TypeError, ValueError):
        return "batches", {}
    ends = {i: [float(e) for e in b["rung_ends"]] for i, b in enumerate(plan["brackets"])}
    return str(plan.get("unit", "batches")), ends


def _positions(reports: pd.DataFrame, unit: str, batch_size: Any) -> np.ndarray:
    """Each report's position in the searcher's length unit."""
    if unit == "epochs":
        return reports["epochs"].to_numpy(dtype="float64")
    batches = reports["batches"].to_numpy(dtype="float64")
    if unit == "records":  # records = batches x global batch size, as Determined counts them
        try:
            size = float(batch_size)
        except (TypeError, ValueError):
            size = math.nan
        return batches * (size if size > 0 else math.nan)
    return batches


_VISIT_COLUMNS = ["trial_id", "bracket", "rung", "rung_end", "batches", "elapsed_s", "value"]
_VISIT_COLUMNS += ["kind", "resumed_s"]


def _visits(results: Results, unit: str, rung_ends: dict[int, list[float]]) -> pd.DataFrame:
    metric, metrics, trials = results.metric, results.metrics, results.trials
    if not rung_ends or metric not in metrics or metrics.empty:
        return pd.DataFrame(columns=_VISIT_COLUMNS)
    states = dict(zip(trials["trial_id"], trials["state"]))
    brackets = dict(zip(trials["trial_id"], trials["bracket"]))
    sizes = dict(zip(trials["trial_id"], trials.get("global_batch_size", [None] * len(trials))))
    rows: list[dict[str, Any]] = []
    for trial_id, reports in metrics.groupby("trial_id", sort=False):
        bracket = _bracket(brackets.get(trial_id), rung_ends)
        position = _positions(reports, unit, sizes.get(trial_id))
        visits = _trial_visits(reports, metric, position, rung_ends[bracket], states.get(trial_id))
        rows += [{**visit, "bracket": bracket} for visit in visits]
    return pd.DataFrame(rows, columns=_VISIT_COLUMNS)


def _trial_visits(
    reports: pd.DataFrame, metric: str, position: np.ndarray, ends: list[float], state: Any
) -> list[dict[str, Any]]:
    """One trial's validations at its rung ends, and whether it trained on after each."""
    validated = (reports["group"] == "validation").to_numpy() & reports[metric].notna().to_numpy()
    rows = []
    for rung, end in enumerate(ends):
        at_end = np.flatnonzero(validated & np.isclose(position, end))
        if at_end.size == 0:
            continue
        row = reports.iloc[at_end[-1]]
        later = np.flatnonzero(position > end + 1e-9)
        rows.append(
            {
                "trial_id": row["trial_id"],
                "rung": rung,
                "rung_end": end,
                "batches": int(row["batches"]),
                "elapsed_s": float(row["elapsed_s"]),
                "value": float(row[metric]),
                "kind": _kind(rung, len(ends), bool(later.size), state).value,
                "resumed_s": float(reports["elapsed_s"].iloc[later[0]]) if later.size else math.nan,
            }
        )
    return rows


def _bracket(value: Any, rung_ends: dict[int, list[float]]) -> int:
    try:
        bracket = int(value)
    except (TypeError, ValueError):
        return min(rung_ends)
    return bracket if bracket in rung_ends else min(rung_ends)


def _kind(rung: int, n_rungs: int, went_on: bool, state: Any) -> VisitKind:
    if rung == n_rungs - 1:
        return VisitKind.FINISHED
    if went_on:
        return VisitKind.PROMOTED
    return VisitKind.WAITING if state in _LIVE_STATES else VisitKind.STOPPED


def best_trial_id(history: SearchHistory) -> str | None:
    """The trial with the best validation of the metric, or None before any."""
    if history.curves.empty:
        return None
    values = history.curves["value"]
    index = values.idxmin() if history.smaller_is_better else values.idxmax()
    return str(history.curves.loc[index, "trial_id"])


def best_so_far(history: SearchHistory) -> pd.DataFrame:
    """The best metric after each validation, against the training done by then.

    Columns: ``elapsed_s``, ``total_batches`` (batches trained by all trials up to that
    report; work redone after a restore counts once), ``value`` (the validation's metric),
    ``best`` (the best value so far) and ``trial_id``.
    """
    columns = ["elapsed_s", "total_batches", "value", "best", "trial_id"]
    if history.curves.empty:
        return pd.DataFrame(columns=columns)
    work = history.work
    done = work.groupby("trial_id", sort=False)["batches"].cummax()
    step = done - done.groupby(work["trial_id"], sort=False).shift(fill_value=0)
    total = step.clip(lower=0).cumsum()
    # A validation's training total: the total at the latest report of its time or before.
    marks = (
        pd.DataFrame({"elapsed_s": work["elapsed_s"], "total_batches": total})
        .groupby("elapsed_s", sort=True)["total_batches"]
        .max()
    )
    curves = history.curves.sort_values("elapsed_s", kind="stable")
    positions = marks.index.searchsorted(curves["elapsed_s"].to_numpy(), side="right") - 1
    totals = marks.to_numpy()[np.clip(positions, 0, None)]
    values = curves["value"].to_numpy(dtype="float64")
    best = (
        np.minimum.accumulate(values)
        if history.smaller_is_better
        else np.maximum.accumulate(values)
    )
    return pd.DataFrame(
        {
            "elapsed_s": curves["elapsed_s"].to_numpy(),
            "total_batches": totals.astype("int64"),
            "value": values,
            "best": best,
            "trial_id": curves["trial_id"].to_numpy(),
        },
        columns=columns,
    )


def rung_occupancy(history: SearchHistory) -> pd.DataFrame:
    """How many trials had reached each rung end, over time.

    Columns: ``elapsed_s``, ``rung`` (the rank of the rung end among all of them: the rung's
    index when there is one bracket), ``rung_end`` and ``trials`` (the count at that time);
    one row per visit, in time order within each rung end, starting at 0 trials at time 0.
    Brackets whose rungs end at the same length count together.
    """
    columns = ["elapsed_s", "rung", "rung_end", "trials"]
    if history.visits.empty:
        return pd.DataFrame(columns=columns)
    parts = []
    for rung, (end, visits) in enumerate(history.visits.groupby("rung_end", sort=True)):
        times = np.sort(visits["elapsed_s"].to_numpy(dtype="float64"))
        parts.append(
            pd.DataFrame(
                {
                    "elapsed_s": np.concatenate([[0.0], times]),
                    "rung": rung,
                    "rung_end": float(end),
                    "trials": np.arange(len(times) + 1),
                }
            )
        )
    return pd.concat(parts, ignore_index=True)[columns]


def hparam_columns(results: Results) -> list[str]:
    """The ``trials`` columns that hold hyperparameters, in the config's order."""
    space = (results.experiment.get("config") or {}).get("hyperparameters") or {}
    known = set(results.trials.columns)
    return [name for name in _flat_names(space) if name in known]


def _flat_names(space: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted names of a config's hyperparameters: a nested map without ``type`` is a group."""
    names: list[str] = []
    for key, value in space.items():
        if isinstance(value, dict) and value and "type" not in value:
            names += _flat_names(value, f"{prefix}{key}.")
        else:
            names.append(f"{prefix}{key}")
    return names


def varying_hparams(results: Results) -> list[str]:
    """The hyperparameter columns whose value differs between trials."""
    trials = results.trials
    return [c for c in hparam_columns(results) if trials[c].astype(str).nunique() > 1]
