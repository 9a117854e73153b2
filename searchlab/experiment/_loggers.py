"""Tune's ``result.json`` and ``progress.csv`` loggers, keeping every report of a resumed trial.

Tune's loggers write to a staging copy of each trial directory on the driver, which Tune syncs
to the storage path every ``TUNE_GLOBAL_CHECKPOINT_S``. Whenever a trial starts from a
checkpoint, they first copy the synced file back over the staging one. That is what restoring
an experiment on a new driver needs, but a trial paused and resumed within one run is resumed
with the last synced copy, which misses the reports made since that sync: a trial resumed a
moment after its pause lost its rung-end training and validation reports. These loggers only
copy the synced file when the driver has no staging copy of it.
"""

from __future__ import annotations

import pathlib
from typing import TYPE_CHECKING

from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

if TYPE_CHECKING:
    from ray.tune.experiment import Trial

__all__ = ["CsvResultLogger", "JsonResultLogger", "result_loggers"]


def _has_staging_copy(file_name: str, trial: Trial) -> bool:
    return pathlib.Path(trial.local_path or "", file_name).is_file()


class JsonResultLogger(JsonLoggerCallback):
    """``result.json``, appended to across pauses rather than replaced by the synced copy."""

    def _restore_from_remote(self, file_name: str, trial: Trial) -> None:
        if not _has_staging_copy(file_name, trial):
            super()._restore_from_remote(file_name, trial)


class CsvResultLogger(CSVLoggerCallback):
    """``progress.csv``, appended to across pauses rather than replaced by the synced copy."""

    def _restore_from_remote(self, file_name: str, trial: Trial) -> None:
        if not _has_staging_copy(file_name, trial):
            super()._restore_from_remote(file_name, trial)


def result_loggers() -> list[JsonLoggerCallback | CSVLoggerCallback]:
    """The loggers for ``RunConfig(callbacks=...)``: Tune adds its own JSON and CSV ones only
    when none is passed."""
    return [JsonResultLogger(), CsvResultLogger()]
