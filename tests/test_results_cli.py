"""``searchlab results DIR``: a table people read, and complete CSV/JSON for programs."""

from __future__ import annotations

import io
import json
import pathlib
from typing import Any

import pandas as pd
import pytest
from synthetic_search import ERRORED, Story, write_asha_search, write_grid_search

import searchlab
from searchlab.cli import main


@pytest.fixture(scope="module")
def asha(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, Story]:
    exp_dir = tmp_path_factory.mktemp("asha") / "search"
    return exp_dir, write_asha_search(exp_dir)


def _print(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["results", *argv]) == 0
    return capsys.readouterr().out


def test_table_is_best_first_with_the_hyperparameters_that_vary(
    asha: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    exp_dir, story = asha
    header, *rows = _print(capsys, str(exp_dir)).splitlines()
    assert header.split() == [
        "trial_id",
        "state",
        "lr",
        "width",
        "activation",
        "batches",
        "rung",
        "best_validation_loss",
        "error",
    ]  # global_batch_size is the same in every trial; checkpoints only in --csv/--json
    assert [row.split()[0] for row in rows] == story.ranked()
    best = rows[0].split()
    assert best[1] == "COMPLETED" and best[5] == "64" and best[6] == "2"
    assert float(best[7]) == pytest.approx(story.best[story.best_trial], rel=1e-3)
    assert rows[-1].split()[:2] == [ERRORED, "ERRORED"]
    assert rows[-1].endswith("RuntimeError: loss is NaN at batch 2")
    paused = next(row for row in rows if row.startswith(story.paused))
    assert paused.split()[1] == "PAUSED"


def test_table_columns_are_aligned(asha: Any, capsys: pytest.CaptureFixture[str]) -> None:
    exp_dir, _ = asha
    header, *rows = _print(capsys, str(exp_dir)).splitlines()
    for column in ("batches", "rung", "best_validation_loss"):  # numbers: right-aligned
        end = header.index(column) + len(column)
        for row in rows:
            assert row[end - 1] != " " and (end == len(row) or row[end] == " "), (column, row)
    for column in ("state", "activation", "error"):  # text: left-aligned
        start = header.index(column)
        for row in rows:
            assert row[start] != " " and row[start - 1] == " ", (column, row)


def test_a_grid_table_has_no_rung_column(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    story = write_grid_search(tmp_path / "grid")
    header, *rows = _print(capsys, str(tmp_path / "grid")).splitlines()
    assert header.split() == ["trial_id", "state", "lr", "width", "batches", "best_validation_loss"]
    assert [row.split()[0] for row in rows] == story.ranked()


def test_csv_has_every_column_in_trial_order(asha: Any, capsys: pytest.CaptureFixture[str]) -> None:
    exp_dir, story = asha
    table = pd.read_csv(io.StringIO(_print(capsys, str(exp_dir), "--csv")))
    trials = searchlab.load_results(exp_dir).trials
    assert list(table.columns) == list(trials.columns)
    assert table["trial_id"].tolist() == story.trial_ids
    best = table.set_index("trial_id").loc[story.best_trial]
    assert best["checkpoint"] == str(exp_dir / story.best_trial / "checkpoint_000002")


def test_json_has_every_column_with_plain_paths_and_nulls(
    asha: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    exp_dir, story = asha
    out = _print(capsys, str(exp_dir), "--json")
    assert "\\/" not in out
    rows = json.loads(out)
    assert [row["trial_id"] for row in rows] == story.trial_ids
    errored = next(row for row in rows if row["trial_id"] == ERRORED)
    assert errored["best_validation_loss"] is None and errored["checkpoint"] is None
    best = next(row for row in rows if row["trial_id"] == story.best_trial)
    assert best["checkpoint"] == str(exp_dir / story.best_trial / "checkpoint_000002")
    assert best["lr"] == pytest.approx(story.hparams[story.best_trial]["lr"])


def test_metrics_as_a_table_and_as_csv(asha: Any, capsys: pytest.CaptureFixture[str]) -> None:
    exp_dir, _ = asha
    header, *rows = _print(capsys, str(exp_dir), "--metrics").splitlines()
    assert header.split()[:4] == ["trial_id", "group", "batches", "epochs"]
    metrics = searchlab.load_results(exp_dir).metrics
    assert len(rows) == len(metrics)
    frame = pd.read_csv(io.StringIO(_print(capsys, str(exp_dir), "--metrics", "--csv")))
    assert len(frame) == len(metrics) and "elapsed_s" in frame


def test_an_experiment_without_trials_says_so(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_grid_search(tmp_path / "grid")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "experiment.json").write_bytes(
        (tmp_path / "grid" / "experiment.json").read_bytes()
    )
    out = _print(capsys, str(tmp_path / "empty")).splitlines()
    assert out[0].split() == ["trial_id", "state", "batches", "best_validation_loss"]
    assert out[1] == "(no trials yet)"


def test_csv_and_json_together_are_refused(asha: Any, capsys: pytest.CaptureFixture[str]) -> None:
    exp_dir, _ = asha
    with pytest.raises(SystemExit, match="2"):
        main(["results", str(exp_dir), "--csv", "--json"])
    assert "not allowed with argument" in capsys.readouterr().err
