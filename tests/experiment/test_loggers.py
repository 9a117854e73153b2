"""Each trial's reports, appended straight into the experiment directory."""

from __future__ import annotations

import json
import pathlib
from typing import Any

from ray.tune.experiment import Trial

from searchlab.experiment._loggers import ResultLog


class FakeTrial:
    """What the result log reads of a Tune trial: its id, config and status."""

    def __init__(self, trial_id: str) -> None:
        self.trial_id = trial_id
        self.config: dict[str, Any] = {"hparams": {"lr": 0.1}}
        self.status = Trial.RUNNING


def _lines(path: pathlib.Path) -> list[str]:
    return path.read_text().splitlines()


def test_reports_are_on_disk_as_soon_as_they_are_logged(tmp_path: pathlib.Path) -> None:
    log = ResultLog(tmp_path, on_error=lambda exc, path: None)
    trial = FakeTrial("t1")
    log.on_trial_start(0, [trial], trial)
    log.on_trial_result(1, [trial], trial, {"batches": 2, "loss": 0.5, "config": {"x": 1}})
    # Nothing closed, nothing synced: a driver killed now has lost nothing.
    rows = [json.loads(x) for x in _lines(tmp_path / "t1" / "result.json")]
    assert rows == [{"batches": 2, "loss": 0.5}]  # the config is kept once, in params.json
    assert json.loads((tmp_path / "t1" / "params.json").read_text()) == trial.config


def test_a_paused_trial_holds_no_open_file_and_appends_when_it_goes_on(
    tmp_path: pathlib.Path,
) -> None:
    log = ResultLog(tmp_path, on_error=lambda exc, path: None)
    trial = FakeTrial("t1")
    log.on_trial_result(1, [trial], trial, {"batches": 2})
    trial.status = Trial.PAUSED
    log.on_step_end(1, [trial])
    assert "t1" not in log._files
    trial.status = Trial.RUNNING
    log.on_trial_result(2, [trial], trial, {"batches": 4, "accuracy": 0.9})
    log.on_experiment_end([trial])
    assert [json.loads(x)["batches"] for x in _lines(tmp_path / "t1" / "result.json")] == [2, 4]


def test_a_line_cut_short_by_a_crash_spoils_only_itself(tmp_path: pathlib.Path) -> None:
    (tmp_path / "t1").mkdir()
    (tmp_path / "t1" / "result.json").write_text('{"batches": 2}\n{"batches": 4, "lo')
    log = ResultLog(tmp_path, on_error=lambda exc, path: None)
    trial = FakeTrial("t1")
    log.on_trial_result(1, [trial], trial, {"batches": 4, "loss": 0.25})
    log.on_experiment_end([trial])
    lines = _lines(tmp_path / "t1" / "result.json")
    assert lines[0] == '{"batches": 2}' and lines[1] == '{"batches": 4, "lo'
    assert json.loads(lines[2]) == {"batches": 4, "loss": 0.25}


def test_a_failed_write_is_reported_once_and_later_ones_are_skipped(
    tmp_path: pathlib.Path,
) -> None:
    errors: list[tuple[OSError, pathlib.Path]] = []
    (tmp_path / "t1").write_text("a file where the trial directory should be")
    log = ResultLog(tmp_path, on_error=lambda exc, path: errors.append((exc, path)))
    trial = FakeTrial("t1")
    log.on_trial_result(1, [trial], trial, {"batches": 2})
    log.on_trial_result(2, [trial], trial, {"batches": 4})
    assert len(errors) == 1 and errors[0][1] == tmp_path / "t1" / "result.json"
