"""Each trial's reports, appended to ``<experiment>/<trial>/result.json`` as they arrive.

Tune's own loggers write into a staging copy of each trial directory on the driver and copy it
to the experiment directory every few seconds, so a driver killed between two copies lost the
reports made since the last one, and a copy cut short left a truncated file. These reports are
written straight into the experiment directory, one JSON line per report, flushed at once: a
killed driver loses nothing it was told. A line cut short by a crash is ended before the next
one is appended, so only that line is unreadable (``Results`` skips it, and the resumed trial
reports those batches again). A trial's file is closed while it is paused, so hundreds of
paused trials hold no open files.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
from collections.abc import Callable
from typing import IO, Any

from ray.tune import Callback
from ray.tune.experiment import Trial

from searchlab.experiment._protocol import RESULT_KEY

__all__ = ["PARAMS_FILE", "RESULT_FILE", "ResultLog"]

RESULT_FILE = "result.json"
PARAMS_FILE = "params.json"
_SKIPPED = ("config",)  # every result carries the trial's config; params.json holds it once


class ResultLog(Callback):
    """Appends every result of every trial to its ``result.json``; writes ``params.json``."""

    def __init__(
        self, experiment_dir: pathlib.Path, on_error: Callable[[OSError, pathlib.Path], None]
    ) -> None:
        self._dir = experiment_dir
        self._on_error = on_error
        self._files: dict[str, IO[str]] = {}
        self._failed = False

    def __reduce__(self) -> tuple[Any, ...]:
        return _NullCallback, ()  # a resumed run brings its own log (see TrialRecorder)

    def on_trial_start(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        path = self._dir / trial.trial_id / PARAMS_FILE
        if not path.is_file():
            self._guarded(path, lambda: _write_params(path, trial.config))

    def on_trial_result(
        self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any], **info: Any
    ) -> None:
        line = json.dumps(_flat_line(result), default=_plain)
        path = self._dir / trial.trial_id / RESULT_FILE
        self._guarded(path, lambda: self._append(trial.trial_id, path, line))

    def _append(self, trial_id: str, path: pathlib.Path, line: str) -> None:
        f = self._files.get(trial_id)
        if f is None:
            f = self._files[trial_id] = _open_for_append(path)
        f.write(line + "\n")
        f.flush()

    def _guarded(self, path: pathlib.Path, write: Callable[[], None]) -> None:
        if self._failed:
            return
        try:
            write()
        except OSError as exc:
            self._failed = True
            self._on_error(exc, path)

    def on_step_end(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        for trial in trials:
            if trial.status != Trial.RUNNING and trial.trial_id in self._files:
                self._close(trial.trial_id)

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        for trial_id in list(self._files):
            self._close(trial_id)

    def _close(self, trial_id: str) -> None:
        f = self._files.pop(trial_id)
        try:
            f.close()
        except OSError:
            pass


class _NullCallback(Callback):
    """What a result log unpickles to outside its driver: a callback that does nothing."""


def _flat_line(result: dict[str, Any]) -> dict[str, Any]:
    """A result as one flat JSON object: searchlab's part (``TrialReport``) as
    ``searchlab_<field>`` keys (timings as ``searchlab_timing_<name>``), so that every value
    on a line is a scalar and readers parse result files column by column."""
    line = {k: v for k, v in result.items() if k not in _SKIPPED and k != RESULT_KEY}
    ours = result.get(RESULT_KEY) or {}
    for key, value in ours.items():
        if isinstance(value, dict):
            line.update({f"searchlab_{key}_{k}": v for k, v in value.items()})
        else:
            line[f"searchlab_{key}"] = value
    return line


def _open_for_append(path: pathlib.Path) -> IO[str]:
    """Open for appending; a last line cut short by a crash is ended first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    f = path.open("a+", encoding="utf-8")
    if f.tell() > 0:
        f.seek(f.tell() - 1)
        if f.read(1) != "\n":
            f.write("\n")
    return f


def _write_params(path: pathlib.Path, config: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(config, indent=1, default=_plain))
    os.replace(tmp, path)


def _plain(value: Any) -> Any:
    """JSON for what results hold besides plain values: numpy scalars, 0-d tensors, paths."""
    if hasattr(value, "item"):
        try:
            value = value.item()
            return value if not isinstance(value, float) or math.isfinite(value) else str(value)
        except (TypeError, ValueError):
            pass
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
