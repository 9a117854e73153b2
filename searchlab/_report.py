"""One self-contained HTML page about a search (``searchlab report DIR``), drawn with plotly.

The page holds plotly.js itself, the figures as JSON and a small script, so it opens from a
file on any machine without a network: learning curves (by batches or by time, rung visits
marked), the best value against total training, parallel coordinates of the hyperparameters
against the metric, how many trials had reached each rung over time, and the trials table,
sortable by any column.
"""

from __future__ import annotations

import html
import json
import math
import os
import pathlib
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from searchlab._report_page import PAGE, SCRIPT, STYLE
from searchlab._search_history import (
    SearchHistory,
    VisitKind,
    best_so_far,
    best_trial_id,
    build_history,
    rung_occupancy,
    varying_hparams,
)
from searchlab._trials_table import table_frame
from searchlab.errors import SearchlabError

if TYPE_CHECKING:
    from searchlab.results import Results

__all__ = ["CHART_IDS", "write_report"]

CHART_IDS = (
    "learning-curves",
    "best-so-far",
    "rung-occupancy",
    "parallel-coordinates",
    "importance",
)

_VISIT_STYLE = {  # plotly marker symbol, colour, legend label
    VisitKind.PROMOTED: ("triangle-up", "#2ca02c", "paused at a rung end, then promoted"),
    VisitKind.WAITING: ("circle", "#ff7f0e", "paused at a rung end, waiting"),
    VisitKind.STOPPED: ("circle-open", "#555555", "stopped at a rung end"),
    VisitKind.FINISHED: ("star", "#1f1f1f", "trained to the full length"),
}
_BEST_COLOR = "#d62728"
_LINE_COLOR = "rgba(76,114,176,0.5)"


def write_report(results: Results, path: str | os.PathLike[str] | None = None) -> pathlib.Path:
    """Writes the report of ``results`` to ``path`` (default ``<experiment>/report.html``).

    Raises:
        SearchlabError: plotly is missing, or ``path`` cannot be written.
    """
    plotly_js = _plotly_js()
    out = pathlib.Path(path) if path is not None else results.experiment_dir / "report.html"
    history = build_history(results)
    figures = {
        "learning-curves": _learning_curves(history),
        "best-so-far": _best_so_far(history),
        "parallel-coordinates": _parallel_coordinates(results, history),
        "rung-occupancy": _rung_occupancy(history),
        "importance": _importance(results),
    }
    name = str(results.experiment.get("name") or results.experiment_dir.name)
    page = PAGE.format(
        title=html.escape(f"{name}: searchlab report"),
        style=STYLE,
        heading=html.escape(name),
        summary=_summary(results, history),
        table=_table(results),
        plotly_js=plotly_js,
        figures=_script_json(figures),
        script=SCRIPT,
    )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(page, encoding="utf-8")
        os.replace(tmp, out)
    except OSError as exc:
        raise SearchlabError(f"{out}: cannot write the report ({exc.strerror})") from None
    return out


def _plotly_js() -> str:
    try:
        from plotly.offline import get_plotlyjs
    except ImportError:
        raise SearchlabError(
            "searchlab report needs plotly: pip install 'searchlab[plots]' (or plotly)"
        ) from None
    return str(get_plotlyjs()).replace("</script", "<\\/script")


def _script_json(value: Any) -> str:
    """JSON safe inside a ``<script>`` element (NaN as null)."""
    text = json.dumps(_clean(value), separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, np.ndarray):
        return [_clean(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _direction(history: SearchHistory) -> str:
    return "lower is better" if history.smaller_is_better else "higher is better"


def _layout(title: str, x: str, y: str, **extra: Any) -> dict[str, Any]:
    return {
        "title": {"text": title, "font": {"size": 15}, "x": 0.01, "xanchor": "left"},
        "xaxis": {"title": {"text": x}, "zeroline": False},
        "yaxis": {"title": {"text": y}, "zeroline": False},
        "margin": {"l": 70, "r": 20, "t": 50, "b": 60},
        "legend": {"orientation": "h", "y": -0.2},
        "hovermode": "closest",
        **extra,
    }


def _learning_curves(history: SearchHistory) -> dict[str, Any]:
    """One line per trial; a button switches the x axis between batches and time."""
    traces = _curve_traces(history) + _visit_traces(history)
    by_batches = [trace.pop("_batches") for trace in traces]
    by_time = [trace.pop("_times") for trace in traces]
    buttons = [
        {"label": "by batches", "method": "update",
         "args": [{"x": by_batches}, {"xaxis.title.text": "batches trained by the trial"}]},
        {"label": "by time", "method": "update",
         "args": [{"x": by_time}, {"xaxis.title.text": "seconds since the first report"}]},
    ]  # fmt: skip
    layout = _layout(
        f"Learning curves: {history.metric}, {len(history.trials)} trials",
        "batches trained by the trial",
        f"{history.metric} ({_direction(history)})",
        updatemenus=[{"type": "buttons", "direction": "right", "x": 0.5, "xanchor": "center",
                      "y": 1.13, "yanchor": "bottom", "buttons": buttons, "showactive": True}],
    )  # fmt: skip
    _log_if_wide(layout, history.curves["value"])
    return {"data": traces, "layout": layout}


def _curve_traces(history: SearchHistory) -> list[dict[str, Any]]:
    best = best_trial_id(history)
    traces = []
    for trial_id, rows in history.curves.groupby("trial_id", sort=False):
        is_best = trial_id == best
        traces.append(
            {"type": "scatter", "mode": "lines+markers" if len(rows) < 30 else "lines",
             "name": f"best: {trial_id}" if is_best else trial_id, "showlegend": is_best,
             "x": rows["batches"].tolist(), "y": rows["value"].tolist(),
             "line": {"color": _BEST_COLOR if is_best else _LINE_COLOR,
                      "width": 3 if is_best else 1.2},
             "marker": {"size": 4},
             "hovertemplate": f"trial {trial_id}<br>%{{x}}: %{{y:.4g}}<extra></extra>",
             "_batches": rows["batches"].tolist(), "_times": rows["elapsed_s"].tolist()}
        )  # fmt: skip
    return traces


def _visit_traces(history: SearchHistory) -> list[dict[str, Any]]:
    """One marker trace per kind of rung decision (promoted, waiting, stopped, finished)."""
    traces = []
    for kind, (symbol, color, label) in _VISIT_STYLE.items():
        rows = history.visits[history.visits["kind"] == kind]
        if rows.empty or (kind == VisitKind.FINISHED and not history.has_rungs):
            continue
        traces.append(
            {"type": "scatter", "mode": "markers", "name": label,
             "x": rows["batches"].tolist(), "y": rows["value"].tolist(),
             "text": rows["trial_id"].tolist(),
             "marker": {"symbol": symbol, "color": color, "size": 10,
                        "line": {"color": "black", "width": 1}},
             "hovertemplate": f"trial %{{text}}<br>{label}<br>%{{y:.4g}}<extra></extra>",
             "_batches": rows["batches"].tolist(), "_times": rows["elapsed_s"].tolist()}
        )  # fmt: skip
    return traces


def _log_if_wide(layout: dict[str, Any], values: pd.Series) -> None:
    finite = values[np.isfinite(pd.to_numeric(values, errors="coerce"))]
    if len(finite) and finite.min() > 0 and finite.max() / finite.min() > 20:
        layout["yaxis"]["type"] = "log"


def _best_so_far(history: SearchHistory) -> dict[str, Any]:
    frame = best_so_far(history)
    traces = [
        {"type": "scatter", "mode": "markers", "name": "each validation",
         "x": frame["total_batches"].tolist(), "y": frame["value"].tolist(),
         "text": frame["trial_id"].tolist(), "marker": {"color": "#999999", "size": 5},
         "hovertemplate": "trial %{text}<br>%{y:.4g}<extra></extra>"},
        {"type": "scatter", "mode": "lines", "name": "best so far",
         "x": frame["total_batches"].tolist(), "y": frame["best"].tolist(),
         "line": {"color": _BEST_COLOR, "width": 3, "shape": "hv"}},
    ]  # fmt: skip
    layout = _layout(
        f"Best {history.metric} against total training",
        "batches trained by all trials so far",
        f"{history.metric} ({_direction(history)})",
    )
    _log_if_wide(layout, frame["value"])
    return {"data": traces, "layout": layout}


def _parallel_coordinates(results: Results, history: SearchHistory) -> dict[str, Any]:
    metric_column = f"best_{results.metric}"
    trials = results.trials
    names = varying_hparams(results)
    scored = trials[pd.to_numeric(trials[metric_column], errors="coerce").notna()]
    if not names or scored.empty:
        why = "no hyperparameter varies between trials" if not names else "no trial has a metric"
        return _note_figure(f"Hyperparameters against {results.metric}: {why}")
    space = (results.experiment.get("config") or {}).get("hyperparameters") or {}
    dimensions = [_dimension(name, scored[name], _spec_of(space, name)) for name in names]
    values = scored[metric_column].astype("float64")
    dimensions.append({"label": f"best {results.metric}", "values": values.tolist()})
    line = {
        "color": values.tolist(),
        "colorscale": "Viridis",
        "reversescale": history.smaller_is_better,  # the best trials are yellow
        "showscale": True,
        "colorbar": {"title": {"text": results.metric}},
    }
    left_out = len(trials) - len(scored)
    title = f"Hyperparameters against best {results.metric} ({len(scored)} trials"
    title += f"; {left_out} without a metric left out)" if left_out else ")"
    layout = _layout(title, "", "", margin={"l": 80, "r": 80, "t": 90, "b": 30})
    return {"data": [{"type": "parcoords", "dimensions": dimensions, "line": line}],
            "layout": layout}  # fmt: skip


def _spec_of(space: dict[str, Any], dotted: str) -> dict[str, Any]:
    node: Any = space
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else {}


def _dimension(name: str, column: pd.Series, spec: dict[str, Any]) -> dict[str, Any]:
    numeric = pd.to_numeric(column, errors="coerce")
    is_bool = column.map(lambda v: isinstance(v, bool | np.bool_)).all()
    if numeric.notna().all() and not is_bool:
        if spec.get("type") == "log" and (numeric > 0).all():
            logs = np.log10(numeric.to_numpy(dtype="float64"))
            ticks = np.arange(math.floor(logs.min()), math.ceil(logs.max()) + 1)
            return {"label": name, "values": logs.tolist(), "tickvals": ticks.tolist(),
                    "ticktext": [f"{10.0**t:g}" for t in ticks]}  # fmt: skip
        return {"label": name, "values": numeric.astype("float64").tolist()}
    labels = column.astype(str)
    categories = sorted(labels.unique())
    codes = [categories.index(v) for v in labels]
    return {"label": name, "values": codes, "tickvals": list(range(len(categories))),
            "ticktext": categories}  # fmt: skip


def _rung_occupancy(history: SearchHistory) -> dict[str, Any]:
    frame = rung_occupancy(history)
    if frame.empty:
        return _note_figure("Rung occupancy: no trial has reached a rung end yet")
    traces = []
    last = float(history.work["elapsed_s"].max())  # each count holds until the last report
    for rung, rows in frame.groupby("rung", sort=True):
        end = float(rows["rung_end"].iloc[0])
        x, y = rows["elapsed_s"].tolist(), rows["trials"].tolist()
        traces.append(
            {"type": "scatter", "mode": "lines", "line": {"shape": "hv", "width": 2},
             "name": f"rung {rung} ({end:g} {history.unit})",
             "x": [*x, max(last, x[-1])], "y": [*y, y[-1]]}
        )  # fmt: skip
    what = "Trials that had reached each rung" if history.has_rungs else "Trials finished"
    layout = _layout(f"{what}, over time", "seconds since the first report", "trials")
    return {"data": traces, "layout": layout}


def _importance(results: Results) -> dict[str, Any]:
    try:
        importance = results.hyperparameter_importance()
    except (SearchlabError, ImportError) as exc:
        reason = str(exc).split(": ", 1)[-1] if isinstance(exc, SearchlabError) else str(exc)
        return _note_figure(f"Hyperparameter importance: not available ({reason})")
    ordered = importance.sort_values()
    trace = {"type": "bar", "orientation": "h", "x": ordered.tolist(),
             "y": [str(i) for i in ordered.index], "marker": {"color": "#4c72b0"},
             "hovertemplate": "%{y}: %{x:.3f}<extra></extra>"}  # fmt: skip
    layout = _layout(
        f"Hyperparameter importance for best {results.metric} (Optuna's fANOVA)",
        "share of the metric's variance explained",
        "",
    )
    layout["margin"]["l"] = 140
    return {"data": [trace], "layout": layout}


def _note_figure(text: str) -> dict[str, Any]:
    layout = _layout(text, "", "")
    layout["xaxis"]["visible"] = False
    layout["yaxis"]["visible"] = False
    return {"data": [], "layout": layout}


def _summary(results: Results, history: SearchHistory) -> str:
    states = results.trials["state"].value_counts().to_dict() if len(results.trials) else {}
    counts = ", ".join(f"{n} {str(s).lower()}" for s, n in states.items()) or "none yet"
    items = [
        ("directory", str(results.experiment_dir)),
        ("searcher", f"{history.searcher} on {history.metric} ({_direction(history)})"),
        ("trials", counts),
    ]
    try:
        best = results.best_trial()
        items.append(
            ("best trial", f"{best['trial_id']}: {history.metric} = "
                           f"{best[f'best_{history.metric}']:.6g}")
        )  # fmt: skip
    except SearchlabError:
        items.append(("best trial", f"no trial reported {history.metric} yet"))
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in items)
    return f'<table class="summary">{rows}</table>'


def _table(results: Results) -> str:
    frame = table_frame(results)
    head = "".join(
        f'<th data-column="{i}" title="sort by {html.escape(c)}">{html.escape(c)}</th>'
        for i, c in enumerate(frame.columns)
    )
    best = f"best_{results.metric}"
    body = []
    for i, (_, row) in enumerate(frame.iterrows()):
        cells = "".join(_cell(value) for value in row.tolist())
        is_best = i == 0 and pd.notna(row[best])
        body.append(f'<tr class="best" title="the best trial">{cells}</tr>' if is_best else
                    f"<tr>{cells}</tr>")  # fmt: skip
    return (
        f'<table id="trials" class="trials"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def _cell(value: Any) -> str:
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return '<td data-sort="" class="missing">-</td>'
    if isinstance(value, bool):
        return f'<td data-sort="{html.escape(str(value))}">{value}</td>'
    if isinstance(value, int | float):
        text = f"{value:.6g}" if isinstance(value, float) else str(value)
        return f'<td data-sort="{value!r}" class="number">{html.escape(text)}</td>'
    return f'<td data-sort="{html.escape(str(value))}">{html.escape(str(value))}</td>'
