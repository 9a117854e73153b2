"""Tune's ``result.json`` and ``progress.csv`` loggers, keeping every report of a resumed trial.

Tune's loggers write to a staging copy of each trial directory on the driver, which Tune syncs
to the storage path every ``TUNE_GLOBAL_CHECKPOINT_S``. Whenever a trial starts from a
checkpoint, they first copy the synced file back over the staging one. That is what restoring
an experiment on a new driver needs, but a trial paused and resumed within one run is resumed
with the last synced copy, which misses the reports made since that sync: a trial resumed a
moment after its pause lost its rung-end training and validation reports. These loggers only
copy the synced file when the driver has no staging copy of it.

Tune's loggers also keep each trial's files open until the trial ends, so an ASHA search with
hundreds of trials paused at its rungs held two open files per paused trial (a laptop's
default limit of 256 or 1024 open files is soon reached). These close a trial's files when it
pauses and reopen them, appending, with its next result; ``progress.csv`` keeps the columns
of its header across the reopening.
"""

from __future__ import annotations

import csv
import pathlib
from typing import TYPE_CHECKING, Any

from ray.tune.experiment import Trial as _Trial
from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback
from ray.tune.result import EXPR_PROGRESS_FILE

if TYPE_CHECKING:
    from ray.tune.experiment import Trial

__all__ = ["CsvResultLogger", "JsonResultLogger", "result_loggers"]


def _has_staging_copy(file_name: str, trial: Trial) -> bool:
    return pathlib.Path(trial.local_path or "", file_name).is_file()


def _paused(open_files: dict[Trial, Any]) -> list[Trial]:
    return [trial for trial in open_files if trial.status == _Trial.PAUSED]


class JsonResultLogger(JsonLoggerCallback):
    """``result.json``, appended to across pauses rather than replaced by the synced copy."""

    def _restore_from_remote(self, file_name: str, trial: Trial) -> None:
        if not _has_staging_copy(file_name, trial):
            super()._restore_from_remote(file_name, trial)

    def on_step_end(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        for trial in _paused(self._trial_files):
            self.log_trial_end(trial)  # closes the file; the next result reopens it


class CsvResultLogger(CSVLoggerCallback):
    """``progress.csv``, appended to across pauses rather than replaced by the synced copy."""

    def _restore_from_remote(self, file_name: str, trial: Trial) -> None:
        if not _has_staging_copy(file_name, trial):
            super()._restore_from_remote(file_name, trial)

    def _setup_trial(self, trial: Trial) -> None:
        super()._setup_trial(trial)
        if self._trial_continue[trial]:  # appending: write the header's columns, not new ones
            path = pathlib.Path(trial.local_path or "", EXPR_PROGRESS_FILE)
            with path.open(newline="") as f:
                header = next(csv.reader(f), None)
            if header:
                self._trial_csv[trial] = csv.DictWriter(self._trial_files[trial], header)

    def on_step_end(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        for trial in _paused(self._trial_files):
            self.log_trial_end(trial)


def result_loggers() -> list[JsonLoggerCallback | CSVLoggerCallback]:
    """The loggers for ``RunConfig(callbacks=...)``: Tune adds its own JSON and CSV ones only
    when none is passed."""
    return [JsonResultLogger(), CsvResultLogger()]
