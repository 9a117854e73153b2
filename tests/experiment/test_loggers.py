"""Tune's result files of a trial: closed while it is paused, appended to when it goes on."""

from __future__ import annotations

import csv
import json
import pathlib
from typing import Any

import pytest
from ray.tune.experiment import Trial

from searchlab.experiment._loggers import CsvResultLogger, JsonResultLogger


class FakeTrial:
    """What the loggers read of a Tune trial: its staging directory, config and status."""

    def __init__(self, path: pathlib.Path) -> None:
        self.local_path = str(path)
        self.config: dict[str, Any] = {"lr": 0.1}
        self.status = Trial.RUNNING

    def init_local_path(self) -> None:
        pathlib.Path(self.local_path).mkdir(parents=True, exist_ok=True)


@pytest.fixture
def trial(tmp_path: pathlib.Path) -> FakeTrial:
    t = FakeTrial(tmp_path / "trial")
    t.init_local_path()
    for name in ("result.json", "progress.csv"):  # the driver's staging copies exist
        (tmp_path / "trial" / name).touch()
    return t


def _pause_and_go_on(logger: Any, trial: FakeTrial) -> None:
    logger.log_trial_result(1, trial, {"training_iteration": 1, "loss": 0.5, "batches": 2})
    trial.status = Trial.PAUSED
    logger.on_step_end(1, [trial])
    assert trial not in logger._trial_files  # no file kept open for a paused trial
    trial.status = Trial.RUNNING
    logger.log_trial_result(2, trial, {"training_iteration": 2, "batches": 4, "accuracy": 0.9})
    logger.log_trial_end(trial)


def test_json_results_survive_a_pause_with_the_file_closed(trial: FakeTrial) -> None:
    _pause_and_go_on(JsonResultLogger(), trial)

    lines = pathlib.Path(trial.local_path, "result.json").read_text().splitlines()
    assert [json.loads(line)["batches"] for line in lines] == [2, 4]


def test_csv_rows_after_a_pause_keep_the_header_columns(trial: FakeTrial) -> None:
    _pause_and_go_on(CsvResultLogger(), trial)

    with pathlib.Path(trial.local_path, "progress.csv").open(newline="") as f:
        rows = list(csv.reader(f))
    assert rows == [
        ["training_iteration", "loss", "batches"],
        ["1", "0.5", "2"],
        ["2", "", "4"],  # a column the header lacks is left out, none is shifted
    ]
