"""Reading an experiment's files safely: paths stay inside it, damaged files say what to do."""

from __future__ import annotations

import json
import os
import pathlib
import shutil

import pytest
from experiment_files import record, write_checkpoint, write_experiment, write_trial

import searchlab

REPORTS = [
    {"group": "training", "batches": 2, "epochs": 0.5, "loss": 0.9},
    {"group": "validation", "batches": 2, "epochs": 0.5, "validation_loss": 0.8},
    {"group": "training", "batches": 4, "epochs": 1.0, "loss": 0.7},
    {"group": "validation", "batches": 4, "epochs": 1.0, "validation_loss": 0.6},
]


def _experiment(root: pathlib.Path, **fields: object) -> pathlib.Path:
    write_trial(root, "a_00001", REPORTS, {"hidden": 4})
    write_checkpoint(root / "a_00001", 1, 2, 0.8)
    write_checkpoint(root / "a_00001", 2, 4, 0.6)
    rec = record("a_00001", {"hidden": 4}, best_metric=0.6, **fields)
    return write_experiment(root, [rec])


def test_relative_paths_resolve_inside_the_experiment(tmp_path: pathlib.Path) -> None:
    exp = _experiment(tmp_path / "exp", checkpoint="a_00001/checkpoint_000002")
    results = searchlab.load_results(exp)
    assert results.trials["checkpoint"].tolist() == [str(exp / "a_00001" / "checkpoint_000002")]
    assert results.metrics["batches"].tolist() == [2, 2, 4, 4]


def test_a_moved_experiment_reads_its_own_checkpoints(tmp_path: pathlib.Path) -> None:
    old = tmp_path / "old"
    exp = _experiment(
        old,
        checkpoint=str(old / "a_00001" / "checkpoint_000002"),  # format 1: absolute paths
        trial_dir="/tmp/ray/session_1/artifacts/driver_artifacts/a_00001",
    )
    moved = shutil.move(exp, tmp_path / "moved")
    results = searchlab.load_results(moved)
    checkpoint = pathlib.Path(results.trials["checkpoint"].iloc[0])
    assert checkpoint == tmp_path / "moved" / "a_00001" / "checkpoint_000002"
    assert results.best_checkpoint() == str(checkpoint)
    assert len(results.metrics) == 4


@pytest.mark.parametrize(
    "checkpoint",
    ["../outside/a_00001/checkpoint_000002", "a_00001/../../checkpoint_000002", "/etc/passwd"],
)
def test_a_path_that_leads_outside_is_ignored_with_a_warning(
    tmp_path: pathlib.Path, checkpoint: str
) -> None:
    exp = _experiment(tmp_path / "exp", checkpoint=checkpoint, trial_dir="../elsewhere")
    with pytest.warns(UserWarning, match=r"trials\.json: ignored paths outside the experiment"):
        results = searchlab.load_results(exp)
    assert results.trials["checkpoint"].isna().all()
    assert len(results.metrics) == 4  # read from the trial's own directory
    with pytest.raises(searchlab.SearchlabError, match=r"trial a_00001 has no checkpoint"):
        results.load_trial("a_00001", trusted=True)


def test_a_checkpoint_linked_to_outside_is_not_loaded(tmp_path: pathlib.Path) -> None:
    outside = write_checkpoint(tmp_path / "outside", 7, 4, 0.1)
    exp = _experiment(tmp_path / "exp", checkpoint="a_00001/checkpoint_000009")
    os.symlink(outside, exp / "a_00001" / "checkpoint_000009")
    results = searchlab.load_results(exp)
    with pytest.raises(searchlab.SearchlabError, match=r"leads outside the experiment directory"):
        results.load_trial("a_00001", trusted=True)


def test_a_trial_id_that_is_a_path_reads_nothing_outside(tmp_path: pathlib.Path) -> None:
    write_trial(tmp_path, "victim", REPORTS, {})
    exp = write_experiment(tmp_path / "exp", [record("../victim", {}, trial_dir=None)])
    results = searchlab.load_results(exp)
    assert results.metrics.empty
    assert results.trials["trial_id"].tolist() == ["../victim"]


def test_a_truncated_experiment_file_says_where_and_what_to_do(tmp_path: pathlib.Path) -> None:
    exp = _experiment(tmp_path / "exp")
    text = (exp / "experiment.json").read_text()
    (exp / "experiment.json").write_text(text[:60])
    match = r"experiment\.json: not valid JSON at line 4 column 13 \(.*\); restore it from a copy"
    with pytest.raises(searchlab.SearchlabError, match=match) as info:
        searchlab.load_results(exp)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("content", "match"),
    [("[1, 2]", r"must hold a JSON object, got list"), ('{"metric": "m"}', r"has no 'smaller_is")],
)
def test_an_experiment_file_without_its_keys(
    tmp_path: pathlib.Path, content: str, match: str
) -> None:
    exp = _experiment(tmp_path / "exp")
    (exp / "experiment.json").write_text(content)
    with pytest.raises(searchlab.SearchlabError, match=rf"experiment\.json: {match}"):
        searchlab.load_results(exp)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (
            '{"updated": 1, "trials": [{"trial_id": "a_0',
            r"not valid JSON at line 1 column 40 \(.*\)",
        ),
        ('{"updated": 1}', r"has no 'trials'"),
        ('{"trials": [{"state": "COMPLETED"}]}', r"not a list of trial records under 'trials'"),
        (b"\xff\xfe", r"not UTF-8 text \(byte 0\)"),
    ],
)
def test_a_damaged_trials_file_is_not_silently_replaced(
    tmp_path: pathlib.Path, content: str | bytes, reason: str
) -> None:
    exp = _experiment(tmp_path / "exp")
    path = exp / "trials.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    match = rf"trials\.json: {reason}; rebuild .* with load_results\('.*exp', rebuild=True\)"
    with pytest.raises(searchlab.SearchlabError, match=match):
        searchlab.load_results(exp)


@pytest.mark.parametrize("smaller_is_better", [True, False])
def test_rebuild_reads_the_trial_directories(
    tmp_path: pathlib.Path, smaller_is_better: bool
) -> None:
    exp = _experiment(tmp_path / "exp")
    write_trial(exp, "b_00002", REPORTS[:2], {"hidden": 8})  # no checkpoint yet
    meta = json.loads((exp / "experiment.json").read_text())
    meta["smaller_is_better"] = smaller_is_better
    (exp / "experiment.json").write_text(json.dumps(meta))
    (exp / "trials.json").write_text("{")
    results = searchlab.load_results(exp, rebuild=True)
    trials = results.trials.set_index("trial_id")
    assert trials["state"].tolist() == ["UNKNOWN", "UNKNOWN"]
    assert trials["hidden"].tolist() == [4, 8]
    assert trials["batches"].tolist() == [4, 2]
    best = 0.6 if smaller_is_better else 0.8
    assert trials["best_validation_loss"].tolist() == [best, 0.8]
    assert trials["last_validation_loss"].tolist() == [0.6, 0.8]
    number = 2 if smaller_is_better else 1
    assert trials.loc["a_00001", "checkpoint"] == str(exp / "a_00001" / f"checkpoint_{number:06d}")
    assert trials["checkpoint"].isna().tolist() == [False, True]


def test_without_trials_file_the_records_are_rebuilt(tmp_path: pathlib.Path) -> None:
    exp = _experiment(tmp_path / "exp")
    (exp / "trials.json").unlink()  # the driver died before writing it
    with (exp / "a_00001" / "result.json").open("a") as f:
        f.write('{"group": "training", "batches": 6, "lo')  # and mid-line
    results = searchlab.load_results(exp)
    assert results.trials["state"].tolist() == ["UNKNOWN"]
    assert results.trials["batches"].tolist() == [4]
    assert results.best_trial()["best_validation_loss"] == 0.6


def test_a_newer_trials_format_is_refused(tmp_path: pathlib.Path) -> None:
    exp = _experiment(tmp_path / "exp")
    data = json.loads((exp / "trials.json").read_text())
    (exp / "trials.json").write_text(json.dumps({**data, "format_version": 3}))
    with pytest.raises(searchlab.SearchlabError, match=r"format_version 3 is newer than this"):
        searchlab.load_results(exp)


def test_load_trial_imports_no_code_a_data_file_names(tmp_path: pathlib.Path) -> None:
    exp = _experiment(tmp_path / "exp", checkpoint="a_00001/checkpoint_000002")
    results = searchlab.load_results(exp)
    match = (
        r"experiment\.json names the entrypoint 'toy_model_def:ToyModelTrial' in "
        r"/nonexistent/model_dir, .*: pass trial_class=YourTrial, or trusted=True to import it"
    )
    with pytest.raises(searchlab.SearchlabError, match=match):
        results.load_trial("a_00001")
    with pytest.raises(searchlab.SearchlabError, match=r"no trial 'zz'"):
        results.load_trial("zz")
