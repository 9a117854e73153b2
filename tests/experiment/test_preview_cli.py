"""``searchlab preview CONFIG``: the plan of a search before running it, as a table or JSON."""

from __future__ import annotations

import json
import pathlib

import pytest

from searchlab.cli import main

ADAPTIVE = """\
name: preview-adaptive
entrypoint: model_def:Trial
hyperparameters:
  lr: {type: log, base: 10, minval: -4, maxval: -1}
searcher:
  name: adaptive_asha
  metric: validation_loss
  max_trials: 64
  mode: standard
  max_length: {batches: 1000}
"""

GRID = """\
name: preview-grid
entrypoint: model_def:Trial
hyperparameters:
  lr: {type: log, base: 10, minval: -4, maxval: -2, count: 3}
  hidden: {type: categorical, vals: [8, 16]}
  momentum: 0.9
searcher:
  name: grid
  metric: validation_loss
  max_concurrent_trials: 4
  max_length: {epochs: 3}
"""


def _write(tmp_path: pathlib.Path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


def _preview(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["preview", *argv]) == 0
    return capsys.readouterr().out


def test_json_of_an_adaptive_plan(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]):
    plan = json.loads(_preview(capsys, _write(tmp_path, ADAPTIVE), "--json"))

    assert plan == {
        "brackets": [
            {"rungs": 4, "trials": 45, "concurrency": 6, "rung_ends": [15, 62, 250, 1000]},
            {"rungs": 3, "trials": 14, "concurrency": 5, "rung_ends": [62, 250, 1000]},
            {"rungs": 2, "trials": 5, "concurrency": 5, "rung_ends": [250, 1000]},
        ],
        "trials_per_length": {"15": 34, "62": 20, "250": 7, "1000": 3},
        "unit": "batches",
    }


def test_table_of_an_adaptive_plan(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]):
    out = _preview(capsys, _write(tmp_path, ADAPTIVE))

    lines = out.splitlines()
    assert lines[0].split() == [
        "bracket",
        "rungs",
        "trials",
        "concurrency",
        "rung",
        "ends",
        "(batches)",
    ]
    assert lines[1].split() == ["0", "4", "45", "6", "15,", "62,", "250,", "1000"]
    assert lines[2].split() == ["1", "3", "14", "5", "62,", "250,", "1000"]
    assert lines[3].split() == ["2", "2", "5", "5", "250,", "1000"]
    assert lines[4].split() == ["all", "64"]
    start = lines.index("trials that train to each length:")
    assert lines[start + 1].split() == ["length", "(batches)", "trials"]
    per_length = [line.split() for line in lines[start + 2 :]]
    assert per_length == [["15", "34"], ["62", "20"], ["250", "7"], ["1000", "3"]]
    assert "{" not in out  # a table, not a printed dict


def test_overrides_change_the_plan(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]):
    config = _write(tmp_path, ADAPTIVE)
    plan = json.loads(_preview(capsys, config, "--json", "--config", "searcher.mode=aggressive"))

    assert plan["brackets"] == [
        {"rungs": 4, "trials": 64, "concurrency": 16, "rung_ends": [15, 62, 250, 1000]}
    ]


def test_grid_plan_trains_every_point_to_full_length(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
):
    config = _write(tmp_path, GRID)
    plan = json.loads(_preview(capsys, config, "--json"))

    assert plan == {
        "brackets": [{"rungs": 1, "trials": 6, "concurrency": 4, "rung_ends": [3]}],
        "trials_per_length": {"3": 6},
        "unit": "epochs",
    }
    lines = _preview(capsys, config).splitlines()
    assert lines[0].split()[-3:] == ["rung", "ends", "(epochs)"]
    assert lines[1].split() == ["0", "1", "6", "4", "3"]
    assert lines[-1].split() == ["3", "6"]


def test_a_bad_config_is_one_line_and_exit_2(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
):
    config = _write(tmp_path, ADAPTIVE.replace("max_trials: 64", "max_trials: 0"))

    assert main(["preview", config]) == 2
    err = capsys.readouterr().err
    assert err.startswith("searchlab: error: ")
    assert "searcher.max_trials" in err
    assert len(err.strip().splitlines()) == 1


HUGE_GRID = """\
name: preview-huge
entrypoint: model_def:Trial
hyperparameters:
  a: {type: int, minval: 0, maxval: 2000000000, count: 1e9}
  b: {type: double, minval: 0.0, maxval: 1.0, count: 1000000}
searcher: {name: grid, metric: validation_loss, max_length: {batches: 10}}
"""


@pytest.mark.timeout(20)
def test_a_huge_grid_is_refused_at_once_with_the_way_to_allow_it(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
):
    config = _write(tmp_path, HUGE_GRID)

    assert main(["preview", config]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "searchlab: error: config.yaml: hyperparameters.a.count: grid search would run "
        "1,000,000,000,000,000 trials (hyperparameters.a.count 1,000,000,000 x "
        "hyperparameters.b.count 1,000,000), more than the limit of 100,000"
    )
    assert "--max-grid-trials 1000000000000000" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.timeout(20)
def test_a_fractional_count_is_one_line_and_exit_2(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
):
    config = _write(tmp_path, GRID.replace("count: 3", "count: 1.5"))

    assert main(["preview", config]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "searchlab: error: config.yaml: hyperparameters.lr.count: must be an integer >= 1 "
        "(the number of points on this axis), got 1.5"
    )
