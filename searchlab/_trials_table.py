"""The trials table people read: best first, the hyperparameters that vary, aligned text.

``searchlab results DIR`` prints it and the HTML report shows it. Machines read the full
``Results.trials`` instead (``--csv``, ``--json``), which keeps every column, checkpoints
included.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from searchlab._results._analysis import best_rows
from searchlab._search_history import plan_rung_ends, varying_hparams

if TYPE_CHECKING:
    from searchlab.results import Results

__all__ = ["format_table", "table_frame"]

_ERROR_WIDTH = 60


def table_frame(results: Results) -> pd.DataFrame:
    """The rows and columns of the readable table, best trial first.

    Columns: ``trial_id``, ``state``, the hyperparameters that differ between trials,
    ``batches``, ``rung`` (adaptive searches only), ``best_<metric>``, then ``restarts`` and
    ``error`` (the last line of the traceback) only when some trial has one.
    """
    trials = results.trials
    best = f"best_{results.metric}"
    ranked = best_rows(trials, best, results.smaller_is_better, max(len(trials), 1))
    columns = ["trial_id", "state", *varying_hparams(results), "batches"]
    _, rung_ends = plan_rung_ends(results.experiment.get("config") or {})
    if not trials.empty and any(len(ends) > 1 for ends in rung_ends.values()):
        columns.append("rung")
    columns.append(best)
    frame = ranked[columns].copy()
    if "restarts" in trials and pd.to_numeric(trials["restarts"], errors="coerce").fillna(0).any():
        frame["restarts"] = ranked["restarts"]
    if "error" in trials and ranked["error"].notna().any():
        frame["error"] = ranked["error"].map(_last_line)
    return frame.reset_index(drop=True)


def _last_line(error: Any) -> Any:
    if not isinstance(error, str) or not error.strip():
        return None
    line = error.strip().splitlines()[-1].strip()
    return line if len(line) <= _ERROR_WIDTH else line[: _ERROR_WIDTH - 3] + "..."


def format_table(frame: pd.DataFrame) -> str:
    """``frame`` as aligned text: numbers right-aligned (4 significant digits), text left,
    missing values as ``-``."""
    if frame.empty:
        return "  ".join(str(c) for c in frame.columns) + "\n(no trials yet)"
    cells = {c: [_text(v) for v in frame[c].tolist()] for c in frame.columns}
    numeric = {c: all(_is_number(v) for v in frame[c].tolist()) for c in frame.columns}
    widths = {c: max(len(str(c)), *(len(t) for t in cells[c])) for c in frame.columns}
    last = frame.columns[-1]

    def line(texts: dict[Any, str]) -> str:
        parts = []
        for c in frame.columns:
            text = texts[c]
            if numeric[c]:
                parts.append(text.rjust(widths[c]))
            else:
                parts.append(text if c == last else text.ljust(widths[c]))
        return "  ".join(parts).rstrip()

    lines = [line({c: str(c) for c in frame.columns})]
    lines += [line({c: cells[c][i] for c in frame.columns}) for i in range(len(frame))]
    return "\n".join(lines)


def _is_number(value: Any) -> bool:
    if isinstance(value, bool | np.bool_):
        return False
    return value is None or isinstance(value, int | float | np.integer | np.floating)


def _text(value: Any) -> str:
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
