"""Reading every report of an experiment in linear time; the old quadratic rule is the reference."""

from __future__ import annotations

import pathlib
import random
from typing import Any

import numpy as np
import pandas as pd
import pytest
from experiment_files import (
    record,
    reference_reports,
    report_of,
    restart_history,
    write_experiment,
    write_trial,
)

import searchlab
from searchlab._results import _reports
from searchlab._results._reports import mark_superseded

NEW_COLUMNS = ["timestamp", "elapsed_s"]


def _random_experiment(tmp_path: pathlib.Path, seed: int, trials: int = 12) -> list[str]:
    rng = random.Random(seed)
    ids = [f"t{seed}_{i:03d}" for i in range(trials)]
    for trial_id in ids:
        history = restart_history(rng, rng.randint(0, 40))
        reports = [report_of(rng, group, batches) for group, batches in history]
        write_trial(tmp_path, trial_id, reports, {"hidden": rng.randint(2, 64)})
    write_experiment(tmp_path, [record(t, {"hidden": 1}) for t in ids])
    return ids


def _assert_same_as_reference(results: searchlab.Results, ids: list[str]) -> None:
    reference = reference_reports(results.experiment_dir, ids)
    got = results.all_reports.drop(columns=NEW_COLUMNS)
    pd.testing.assert_frame_equal(got, reference)
    kept = reference.loc[~reference["superseded"]].drop(columns="superseded")
    pd.testing.assert_frame_equal(results.metrics.drop(columns=NEW_COLUMNS), kept)


@pytest.mark.parametrize("seed", range(8))
def test_random_restart_histories_match_the_quadratic_rule(
    tmp_path: pathlib.Path, seed: int
) -> None:
    ids = _random_experiment(tmp_path, seed)
    results = searchlab.load_results(tmp_path)
    assert results.all_reports["superseded"].sum() >= 5  # these histories restart
    _assert_same_as_reference(results, ids)


def test_pyarrow_reads_a_clean_experiment(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _random_experiment(tmp_path, 1)

    def slow(chunk: Any) -> None:
        raise AssertionError("read line by line")

    monkeypatch.setattr(_reports, "_parse_slow", slow)
    _assert_same_as_reference(searchlab.load_results(tmp_path), ids)


@pytest.mark.parametrize("seed", range(3))
def test_line_by_line_reading_gives_the_same_frames(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    ids = _random_experiment(tmp_path, seed)
    fast = searchlab.load_results(tmp_path)
    monkeypatch.setattr(_reports, "_parse_fast", lambda chunk: None)
    slow = searchlab.load_results(tmp_path)
    pd.testing.assert_frame_equal(slow.all_reports, fast.all_reports)
    _assert_same_as_reference(slow, ids)


def test_many_small_chunks_give_the_same_frames(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _random_experiment(tmp_path, 3, trials=30)
    whole = searchlab.load_results(tmp_path)
    monkeypatch.setattr(_reports, "_CHUNK_BYTES", 1)  # one chunk per trial
    chunked = searchlab.load_results(tmp_path)
    pd.testing.assert_frame_equal(chunked.all_reports, whole.all_reports)
    _assert_same_as_reference(chunked, ids)


def test_chunks_of_several_files_in_reused_buffers_give_the_same_frames(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _random_experiment(tmp_path, 4, trials=40)
    whole = searchlab.load_results(tmp_path)
    monkeypatch.setattr(_reports, "_CHUNK_BYTES", 64 << 10)  # a few files a chunk
    chunks = list(_reports._chunks([whole._result_file(rec) for rec in whole._records]))
    assert len(chunks) > 4 and all(len(c.pieces) > 1 for c in chunks[:-1])
    chunked = searchlab.load_results(tmp_path)
    pd.testing.assert_frame_equal(chunked.all_reports, whole.all_reports)
    _assert_same_as_reference(chunked, ids)


def test_a_damaged_file_is_read_line_by_line_alone(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _random_experiment(tmp_path, 5, trials=6)
    with (tmp_path / ids[2] / "result.json").open("a") as f:
        f.write('{"group": "training", "batches"\n')  # a crash, then the next run appended
    slow_lines = []
    parse_slow = _reports._parse_slow

    def counting(chunk: Any) -> Any:
        slow_lines.extend(piece.lines for piece in chunk.pieces)
        return parse_slow(chunk)

    monkeypatch.setattr(_reports, "_parse_slow", counting)
    _assert_same_as_reference(searchlab.load_results(tmp_path), ids)
    lines = (tmp_path / ids[2] / "result.json").read_text().count("\n")
    assert slow_lines == [lines]


def test_damaged_lines_and_changing_types_are_read_as_json_reads_them(
    tmp_path: pathlib.Path,
) -> None:
    reports = [
        {"group": "training", "batches": 1, "epochs": 0.25, "loss": 1.0, "note": "a"},
        {"group": "validation", "batches": 2, "epochs": 0.5, "validation_loss": float("nan")},
        {"group": "training", "batches": 3, "epochs": 0.75, "loss": 2, "note": 5},
    ]
    write_trial(tmp_path, "a", reports, {"act": "relu"})
    with (tmp_path / "a" / "result.json").open("a") as f:
        f.write('{"group": "training", "batches": 4, "lo')  # the driver died mid-line
    write_trial(tmp_path, "b", reports[:1], {"act": 3})
    text = (tmp_path / "b" / "result.json").read_text()
    (tmp_path / "b" / "result.json").write_text("not json\n" + text.rstrip("\n"))  # no newline
    write_experiment(tmp_path, [record("a", {}), record("b", {})])
    results = searchlab.load_results(tmp_path)
    _assert_same_as_reference(results, ["a", "b"])
    assert results.metrics["note"].fillna("-").tolist() == ["a", "-", 5, "a"]
    assert results.metrics["batches"].tolist() == [1, 2, 3, 1]


def test_a_report_with_fewer_batches_supersedes_the_ones_past_it() -> None:
    # trial 0: trained to 6, restored from its checkpoint at 4 and reported 4 again (training)
    trials = np.array([0, 0, 0, 0, 0, 0, 1, 1])
    groups = np.array([0, 1, 0, 0, 0, 1, 0, 1])  # 0 training, 1 validation
    batches = np.array([2, 4, 4, 6, 4, 4, 2, 2], dtype=float)
    got = mark_superseded(trials, groups, batches)
    # the training report at 4 is redone, 6 is rolled back; validation at 4 is redone later
    assert got.tolist() == [False, True, True, True, False, False, False, False]


def test_superseded_matches_brute_force_on_random_vectors() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(0, 30))
        trials = np.sort(rng.integers(0, 3, n))
        groups = rng.integers(0, 2, n)
        batches = rng.integers(0, 6, n).astype(float)
        expected = [
            any(
                trials[j] == trials[i]
                and (
                    batches[j] < batches[i] or (batches[j] == batches[i] and groups[j] == groups[i])
                )
                for j in range(i + 1, n)
            )
            for i in range(n)
        ]
        assert mark_superseded(trials, groups, batches).tolist() == expected


def test_timestamp_and_elapsed_seconds(tmp_path: pathlib.Path) -> None:
    reports = [{"group": "training", "batches": b, "epochs": b / 4, "loss": 0.5} for b in (1, 2)]
    write_trial(tmp_path, "a", reports, {})  # timestamps 1767225601, 1767225602
    write_trial(tmp_path, "b", reports[1:], {})  # 1767225601
    write_experiment(tmp_path, [record("a", {}), record("b", {})])
    metrics = searchlab.load_results(tmp_path).metrics
    assert list(metrics.columns[:6]) == ["trial_id", "group", "batches", "epochs", *NEW_COLUMNS]
    assert metrics["timestamp"].tolist() == [
        pd.Timestamp("2026-01-01 00:00:01", tz="UTC"),
        pd.Timestamp("2026-01-01 00:00:02", tz="UTC"),
        pd.Timestamp("2026-01-01 00:00:01", tz="UTC"),
    ]
    assert metrics["elapsed_s"].tolist() == [0.0, 1.0, 0.0]


def test_an_experiment_without_reports_has_the_columns(tmp_path: pathlib.Path) -> None:
    write_experiment(tmp_path, [record("a", {})])
    results = searchlab.load_results(tmp_path)
    assert results.metrics.empty and results.all_reports.empty
    assert list(results.all_reports.columns) == [
        "trial_id", "group", "batches", "epochs", *NEW_COLUMNS, "superseded"
    ]  # fmt: skip
    assert results.trials["batches"].tolist() == [8]


@pytest.mark.parametrize("fast", [True, False])
def test_a_metric_that_is_only_ever_null_has_no_column(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, fast: bool
) -> None:
    reports = [
        {"group": "training", "batches": b, "epochs": 0.0, "loss": 1.0, "grad": None}
        for b in (1, 2)
    ]
    write_trial(tmp_path, "a", reports, {})
    write_experiment(tmp_path, [record("a", {})])
    if not fast:
        monkeypatch.setattr(_reports, "_parse_fast", lambda chunk: None)
    metrics = searchlab.load_results(tmp_path).metrics
    assert list(metrics.columns) == ["trial_id", "group", "batches", "epochs", *NEW_COLUMNS, "loss"]
