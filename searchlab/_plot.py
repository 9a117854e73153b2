"""PNG plots of a search (``searchlab plot DIR``), drawn with matplotlib.

Three figures: the searcher metric's learning curve of every trial, by batches and by time,
with what each trial did at a rung end marked (promoted after a pause, paused and waiting,
stopped, finished); the best value so far against the training done by all trials; and, for
adaptive searches, the rung ladder: each rung's results, and which were promoted.
"""

from __future__ import annotations

import os
import pathlib
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from searchlab._search_history import (
    SearchHistory,
    VisitKind,
    best_so_far,
    best_trial_id,
    build_history,
)
from searchlab.errors import SearchlabError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from searchlab.results import Results

__all__ = ["PLOT_FILES", "write_plots"]

PLOT_FILES = ("learning_curves.png", "best_so_far.png", "rung_ladder.png")

# How each kind of rung visit is drawn: marker, face colour, label.
_VISIT_STYLE = {
    VisitKind.PROMOTED: ("^", "#2ca02c", "paused at a rung end, then promoted"),
    VisitKind.WAITING: ("o", "#ff7f0e", "paused at a rung end, waiting"),
    VisitKind.STOPPED: ("o", "white", "stopped at a rung end (not promoted)"),
    VisitKind.FINISHED: ("*", "#1f1f1f", "trained to the full length"),
}
_BEST_COLOR = "#d62728"
_DPI = 110


def write_plots(
    results: Results, out_dir: str | os.PathLike[str] | None = None
) -> list[pathlib.Path]:
    """Writes the PNGs of ``results`` into ``out_dir`` (default ``<experiment>/plots``).

    ``rung_ladder.png`` is written only for searches with rungs (adaptive ASHA).

    Returns:
        The paths written.

    Raises:
        SearchlabError: matplotlib is missing, or ``out_dir`` cannot be written.
    """
    plt = _pyplot()
    out = pathlib.Path(out_dir) if out_dir is not None else results.experiment_dir / "plots"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SearchlabError(f"{out}: cannot create the plot directory ({exc.strerror})") from None
    history = build_history(results)
    title = f"{results.experiment.get('name') or results.experiment_dir.name}"
    figures = {
        "learning_curves.png": _learning_curves(plt, history, title),
        "best_so_far.png": _best_so_far(plt, history, title),
    }
    if history.has_rungs:
        figures["rung_ladder.png"] = _rung_ladder(plt, history, title)
    written = []
    for name, figure in figures.items():
        path = out / name
        figure.savefig(path, dpi=_DPI, bbox_inches="tight")
        plt.close(figure)
        written.append(path)
    return written


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise SearchlabError(
            "searchlab plot needs matplotlib: pip install 'searchlab[plots]' (or matplotlib)"
        ) from None
    matplotlib.use("Agg", force=False)  # files only: no display needed
    import matplotlib.pyplot as plt

    return plt


def _direction(history: SearchHistory) -> str:
    return "lower is better" if history.smaller_is_better else "higher is better"


def _use_log_scale(ax: Axes, values: pd.Series) -> None:
    finite = values[np.isfinite(values.to_numpy(dtype="float64"))]
    if len(finite) and finite.min() > 0 and finite.max() / finite.min() > 20:
        ax.set_yscale("log")


def _learning_curves(plt: Any, history: SearchHistory, title: str) -> Figure:
    fig, (by_batches, by_time) = plt.subplots(1, 2, figsize=(14, 5.5), sharey=True)
    best = best_trial_id(history)
    curves = history.curves
    if curves.empty:
        for ax in (by_batches, by_time):
            _empty(ax, f"no trial reported {history.metric} yet")
    for trial_id, rows in curves.groupby("trial_id", sort=False):
        is_best = trial_id == best
        style = {
            "color": _BEST_COLOR if is_best else "#4c72b0",
            "alpha": 1.0 if is_best else 0.45,
            "linewidth": 2.2 if is_best else 1.0,
            "zorder": 3 if is_best else 2,
        }
        label = f"best trial {trial_id}" if is_best else None
        by_batches.plot(rows["batches"], rows["value"], label=label, **style)
        by_time.plot(rows["elapsed_s"], rows["value"], **style)
    _mark_visits(history, by_batches, by_time)
    by_batches.set_xlabel("batches trained by the trial")
    by_time.set_xlabel("seconds since the search's first report")
    by_batches.set_ylabel(f"{history.metric} (validation, {_direction(history)})")
    if not curves.empty:
        _use_log_scale(by_batches, curves["value"])
    for end in sorted({e for ends in history.rung_ends.values() for e in ends}):
        if history.unit == "batches" and history.has_rungs:
            by_batches.axvline(end, color="grey", linestyle=":", linewidth=0.8, zorder=1)
    _legend(by_batches, "upper right")
    _legend(by_time, "upper right")
    fig.suptitle(f"{title}: learning curves of {history.metric}, {len(history.trials)} trials")
    fig.tight_layout()
    return fig


def _mark_visits(history: SearchHistory, by_batches: Axes, by_time: Axes) -> None:
    visits = history.visits
    paused = visits[visits["resumed_s"].notna() & (visits["resumed_s"] > visits["elapsed_s"])]
    for i, (_, visit) in enumerate(paused.iterrows()):
        by_time.plot(
            [visit["elapsed_s"], visit["resumed_s"]],
            [visit["value"], visit["value"]],
            color="#2ca02c",
            linewidth=5,
            alpha=0.3,
            solid_capstyle="butt",
            label="paused until promoted" if i == 0 else None,
            zorder=1,
        )
    for kind, (marker, face, label) in _VISIT_STYLE.items():
        rows = visits[visits["kind"] == kind]
        if rows.empty or (kind == VisitKind.FINISHED and not history.has_rungs):
            continue
        for ax, x in ((by_batches, "batches"), (by_time, "elapsed_s")):
            _scatter_visits(ax, rows[x], rows["value"], marker, face, label, zorder=4)


def _best_so_far(plt: Any, history: SearchHistory, title: str) -> Figure:
    fig, ax = plt.subplots(figsize=(9, 5))
    frame = best_so_far(history)
    if frame.empty:
        _empty(ax, f"no trial reported {history.metric} yet")
    else:
        ax.scatter(
            frame["total_batches"],
            frame["value"],
            s=12,
            color="#8c8c8c",
            alpha=0.6,
            label="each validation",
            zorder=2,
        )
        ax.step(
            frame["total_batches"],
            frame["best"],
            where="post",
            color=_BEST_COLOR,
            linewidth=2,
            label="best so far",
            zorder=3,
        )
        last = frame.iloc[-1]
        winner = frame.loc[frame["value"] == last["best"]].iloc[0]
        ax.annotate(
            f"{last['best']:.4g} (trial {winner['trial_id']})",
            (last["total_batches"], last["best"]),
            textcoords="offset points",
            xytext=(-10, 10),
            ha="right",
            fontsize=9,
            color=_BEST_COLOR,
        )
        _use_log_scale(ax, frame["value"])
        _legend(ax, "upper right")
    ax.set_xlabel("batches trained by all trials so far")
    ax.set_ylabel(f"{history.metric} ({_direction(history)})")
    ax.set_title(f"{title}: best {history.metric} against total training")
    fig.tight_layout()
    return fig


def _rung_ladder(plt: Any, history: SearchHistory, title: str) -> Figure:
    brackets = sorted(history.rung_ends)
    fig, axes = plt.subplots(
        1, len(brackets), figsize=(max(6.0, 4.5 * len(brackets)), 5.5), squeeze=False
    )
    for ax, bracket in zip(axes[0], brackets):
        ends = history.rung_ends[bracket]
        visits = history.visits[history.visits["bracket"] == bracket]
        for _, path in visits.groupby("trial_id", sort=False):
            if len(path) > 1:
                ax.plot(path["rung"], path["value"], color="#2ca02c", alpha=0.6, linewidth=1)
        for kind, (marker, face, label) in _VISIT_STYLE.items():
            rows = visits[visits["kind"] == kind]
            if not rows.empty:
                _scatter_visits(ax, rows["rung"], rows["value"], marker, face, label, zorder=3)
        for rung in range(len(ends)):
            at_rung = visits[visits["rung"] == rung]
            promoted = int((at_rung["kind"] == VisitKind.PROMOTED).sum())
            note = f"{len(at_rung)} results"
            if rung < len(ends) - 1:
                note += f"\n{promoted} promoted"
            ax.annotate(
                note,
                (rung, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(0, 4),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.set_xticks(range(len(ends)))
        ax.set_xticklabels([f"rung {i}\n{end:g} {history.unit}" for i, end in enumerate(ends)])
        ax.set_xlim(-0.5, len(ends) - 0.5)
        ax.set_xlabel(f"bracket {bracket}")
        if not visits.empty:
            _use_log_scale(ax, visits["value"])
    axes[0][0].set_ylabel(f"{history.metric} at the rung end ({_direction(history)})")
    _legend(axes[0][0], "best")
    fig.suptitle(f"{title}: rung ladder", y=1.02)
    fig.tight_layout()
    return fig


def _legend(ax: Axes, where: Any) -> None:
    if ax.get_legend_handles_labels()[1]:
        ax.legend(loc=where, fontsize=8)


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="grey")


def _scatter_visits(
    ax: Any, x: Any, y: Any, marker: str, face: str, label: str, *, zorder: int
) -> None:
    """One kind of rung visit (promoted, waiting, stopped, finished) in its marker style."""
    ax.scatter(
        x,
        y,
        marker=marker,
        s=70 if marker == "*" else 38,
        facecolors=face,
        edgecolors="black",
        linewidths=0.7,
        label=label,
        zorder=zorder,
    )
