"""Reliability: failing trials, NaN losses, truncated checkpoints and bad input at the edges.

The Ray tests share the session's Ray (2 CPUs) and the toy model directory, whose
hyperparameters inject the failures: ``fail_in`` (``init``, ``loader``, ``train``,
``evaluate``), ``nan_at_batch``, ``corrupt_latest_in`` with ``fail_at_batch``, and
``interrupt_at_batch`` (Ctrl-C to this driver) with ``unwrapped_if_exists`` (a trial class that
breaks before its resume).
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import re
import warnings
from typing import Any

import pandas as pd
import pytest
import torch
import yaml
from toy_experiment import TOY_MODEL_DIR, toy_config

import searchlab
from searchlab.cli import main
from searchlab.config import load_experiment_config
from searchlab.errors import CheckpointError, TrialDefinitionError
from searchlab.experiment._protocol import Outcome, TrialConfig, TrialReport
from searchlab.experiment._spec import ExperimentSpec
from searchlab.experiment._trial_files import load_with_fallback
from searchlab.experiment._trial_runner import TrialRunner
from searchlab.pytorch._checkpoint import write_checkpoint_files

# Where each injected failure shows in the stored traceback: the user's function that raised.
FAILING_FUNCTION = {"init": "__init__", "loader": "__getitem__", "evaluate": "evaluate_batch"}
_RUNG_TABLE = re.compile(r"bracket 0: (.*)$")


def _run(config: dict[str, Any], storage: pathlib.Path) -> tuple[searchlab.Results, list[str]]:
    lines: list[str] = []
    results = searchlab.run(
        config, model_dir=TOY_MODEL_DIR, storage_path=storage, echo=lines.append
    )
    return results, lines


def _write_config(tmp_path: pathlib.Path, config: dict[str, Any], name: str) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return str(path)


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# -- failing trials --------------------------------------------------------------------------


@pytest.mark.ray
@pytest.mark.slow
def test_each_failure_kind_retries_then_errors_while_the_others_complete(
    ray_session: Any, tmp_path: pathlib.Path
) -> None:
    fail_log = tmp_path / "failures.log"
    config = toy_config(
        "fail-kinds",
        hyperparameters={
            "fail_in": {"type": "categorical", "vals": ["none", "init", "loader", "evaluate"]},
            "fail_log": str(fail_log),
        },
        # One at a time, so that a failing trial starts on the actor the previous one left for
        # reuse: a trial that fails as that actor rebuilds it is retried like any other.
        searcher={"name": "grid", "max_concurrent_trials": 1},
        max_restarts=1,
    )
    results, _ = _run(config, tmp_path)
    trials = results.trials.set_index("fail_in")
    assert trials["state"].to_dict() == {
        "none": "COMPLETED",
        "init": "ERRORED",
        "loader": "ERRORED",
        "evaluate": "ERRORED",
    }
    # Each failing trial ran once and was retried once (max_restarts: 1), then gave up.
    assert collections.Counter(fail_log.read_text().split()) == {
        "init": 2,
        "loader": 2,
        "evaluate": 2,
    }
    for kind, function in FAILING_FUNCTION.items():
        error = trials.loc[kind, "error"]
        assert trials.loc[kind, "restarts"] == 1, kind
        assert f"in {function}\n" in error, error  # the traceback names the user's function
        assert 'toy_model_def.py", line' in error
        assert f"RuntimeError: injected failure in {kind}" in error
        assert pd.isna(trials.loc[kind, "best_validation_loss"])
    fine = trials.loc["none"]
    assert (fine["batches"], fine["restarts"]) == (4, 0)
    assert pd.isna(fine["error"]) and fine["best_validation_loss"] > 0
    validated = results.metrics.loc[results.metrics["group"] == "validation", "trial_id"]
    assert set(validated) == {fine["trial_id"]}


@pytest.mark.ray
def test_nan_loss_errors_that_trial_only(ray_session: Any, tmp_path: pathlib.Path) -> None:
    config = toy_config(
        "nan-loss",
        # batch index 2 (the third batch) gives a NaN loss; 1000 is never reached
        hyperparameters={"nan_at_batch": {"type": "categorical", "vals": [1000, 2]}},
        searcher={"name": "grid"},
        scheduling_unit=1,
        max_restarts=1,
    )
    results, lines = _run(config, tmp_path)
    trials = results.trials.set_index("nan_at_batch")
    assert trials["state"].to_dict() == {1000: "COMPLETED", 2: "ERRORED"}
    nan = trials.loc[2]
    assert nan["error"] == (
        "training metric 'loss' is nan at batch 3; the trial stops and counts as the worst "
        "result (lower the learning rate or check the data)"
    )
    assert nan["restarts"] == 0  # not retried: the same data and seed give the same NaN
    assert nan["batches"] == 3
    assert any(
        f"trial {nan['trial_id']} errored: training metric 'loss' is nan" in x for x in lines
    )
    own = results.metrics[results.metrics["trial_id"] == nan["trial_id"]]
    assert own["group"].tolist() == ["training"] * 3  # stopped before any validation
    assert own["loss"].isna().tolist() == [False, False, True]
    assert trials.loc[1000, "batches"] == 4
    assert results.best_trial()["trial_id"] == trials.loc[1000, "trial_id"]


@pytest.mark.ray
def test_asha_counts_errored_trials_as_worst_at_their_rung(
    ray_session: Any, tmp_path: pathlib.Path
) -> None:
    max_trials = 8
    config = toy_config(
        "asha-failures",
        hyperparameters={
            "fail_in": {"type": "categorical", "vals": ["none", "none", "none", "train"]},
            "nan_at_batch": {"type": "categorical", "vals": [1000, 1000, 1000, 0]},
            "optimizer": {"lr": {"type": "log", "base": 10, "minval": -2, "maxval": 0}},
        },
        searcher={
            "name": "adaptive_asha",
            "max_trials": max_trials,
            "max_length": {"batches": 4},
            "mode": "aggressive",
            "divisor": 2,
        },
        scheduling_unit=1,
        reproducibility={"experiment_seed": 13},  # 2 raise, 1 NaN, 5 fine
    )
    results, lines = _run(config, tmp_path)
    trials = results.trials
    raised = trials["fail_in"] == "train"
    nan = (trials["nan_at_batch"] == 0) & ~raised
    assert raised.any() and nan.any(), "the seed must draw both failure kinds"
    assert len(trials) == max_trials  # errored trials count; they are not replaced
    assert set(trials.loc[raised | nan, "state"]) == {"ERRORED"}
    assert set(trials.loc[~(raised | nan), "state"]) == {"COMPLETED"}  # the search went on
    assert trials.loc[raised, "error"].str.contains("in train_batch").all()
    assert trials.loc[nan, "error"].str.startswith("training metric 'loss' is nan").all()
    assert trials.loc[raised | nan, "rung"].isna().all()  # they never reached a rung end

    # The final rung table: every trial has a result at rung 0, the errored ones as the worst
    # (never promoted), and every promotion came back with a result at the next rung.
    final = [m.group(1) for x in lines if (m := _RUNG_TABLE.search(x))][-1]
    rungs = [tuple(map(int, r)) for r in re.findall(r"(\d+): (\d+) done/(\d+) promoted", final)]
    assert [end for end, _, _ in rungs] == [1, 2, 4]
    reached = [int((trials["rung"] >= k).sum()) for k in range(len(rungs))]
    errored = int((raised | nan).sum())
    assert rungs[0][1] == reached[0] + errored == max_trials
    for k in range(1, len(rungs)):
        assert rungs[k][1] == reached[k] == rungs[k - 1][2]
    assert rungs[0][2] <= reached[0]  # no errored trial was promoted


# -- checkpoints -----------------------------------------------------------------------------


def _checkpoint(trial_dir: pathlib.Path, index: int, batches: int) -> pathlib.Path:
    state = {"batches_trained": batches, "models_state_dict": [{"w": torch.full((4,), batches)}]}
    meta = {"batches_trained": batches, "trial_class": "toy_model_def:ToyModelTrial"}
    return write_checkpoint_files(trial_dir / f"checkpoint_{index:06d}", state, meta)


def _truncate(path: pathlib.Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "bitflip":  # one bit of the stored weights (4.0), which torch.load alone misses
        at = data.find(torch.full((4,), 4).numpy().tobytes())
        assert at > 0, "the weights' bytes are in the file"
        data[at + 1] ^= 0x01
        path.write_bytes(bytes(data))
        return
    path.write_bytes({"half": data[: len(data) // 2], "empty": b"", "garbage": b"\x00" * 64}[how])


@pytest.mark.parametrize(
    ("file", "how"),
    [
        *(
            (f, how)
            for f in ["state-dict.pth", "metadata.json"]
            for how in ["half", "empty", "garbage"]
        ),
        ("state-dict.pth", "bitflip"),
    ],
)
def test_a_corrupt_latest_checkpoint_falls_back_to_the_previous_one(
    tmp_path: pathlib.Path, file: str, how: str
) -> None:
    older = _checkpoint(tmp_path, 0, batches=2)
    newer = _checkpoint(tmp_path, 1, batches=4)
    _truncate(newer / file, how)
    with pytest.warns(
        UserWarning,
        match=rf"checkpoint_000001/{re.escape(file)}: cannot be read .*; resuming from the "
        rf"earlier checkpoint {re.escape(str(older))}$",
    ):
        state, used = load_with_fallback(newer)
    assert used == older
    assert state["batches_trained"] == 2
    assert torch.equal(state["models_state_dict"][0]["w"], torch.full((4,), 2))


def test_an_intact_latest_checkpoint_is_used_without_a_warning(tmp_path: pathlib.Path) -> None:
    _checkpoint(tmp_path, 0, batches=2)
    newer = _checkpoint(tmp_path, 1, batches=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        state, used = load_with_fallback(newer)
    assert (used, state["batches_trained"]) == (newer, 4)


def test_every_checkpoint_corrupt_raises_checkpoint_error(tmp_path: pathlib.Path) -> None:
    older = _checkpoint(tmp_path, 0, batches=2)
    newer = _checkpoint(tmp_path, 1, batches=4)
    _truncate(older / "state-dict.pth", "half")
    _truncate(newer / "state-dict.pth", "half")
    with pytest.raises(
        CheckpointError,
        match=r"checkpoint_000001/state-dict\.pth: cannot be read .*the file is truncated or corrupt",
    ):
        load_with_fallback(newer)


def test_a_corrupt_only_checkpoint_raises_checkpoint_error(tmp_path: pathlib.Path) -> None:
    only = _checkpoint(tmp_path, 0, batches=2)
    _truncate(only / "state-dict.pth", "empty")
    with pytest.raises(CheckpointError, match=r"checkpoint_000000/state-dict\.pth: cannot be read"):
        load_with_fallback(only)


@pytest.mark.ray
def test_a_retried_trial_with_a_truncated_latest_checkpoint_resumes_from_the_previous(
    ray_session: Any, tmp_path: pathlib.Path
) -> None:
    marker = tmp_path / "failed-once"
    exp_dir = tmp_path / "truncated"
    config = toy_config(
        "truncated",
        # Checkpoints at batches 2 and 4; at batch index 5 the trial truncates the newest
        # (batch 4) and fails once, so the retry must go back to the one at batch 2.
        hyperparameters={
            "fail_at_batch": 5,
            "fail_marker": str(marker),
            "corrupt_latest_in": str(exp_dir),
        },
        searcher={"max_length": {"batches": 8}},
        scheduling_unit=1,
        min_checkpoint_period={"batches": 2},
        checkpoint_storage={"save_trial_latest": 2},
        max_restarts=1,
    )
    results, lines = _run(config, tmp_path)
    assert marker.read_text() == "5"  # the failure did happen
    trial = results.trials.iloc[0]
    assert (trial["state"], trial["restarts"], trial["batches"]) == ("COMPLETED", 1, 8)
    training = results.all_reports[results.all_reports["group"] == "training"]
    batches = training["batches"].tolist()
    assert batches == [1, 2, 3, 4, 5, 3, 4, 5, 6, 7, 8]  # back to batch 2, not 4 and not 0
    losses = training["loss"].tolist()
    assert losses[5] == pytest.approx(losses[2], rel=1e-6)  # batch 3 retrained identically
    history = results.metrics[results.metrics["group"] == "training"]
    assert history["batches"].tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    # The user hears of the skipped checkpoint: a progress line and the trial's record.
    warning = (
        rf"checkpoint_000001/state-dict\.pth: cannot be read .*; resuming from the earlier "
        rf"checkpoint {re.escape(str(exp_dir / trial['trial_id']))}/checkpoint_000000$"
    )
    assert len(trial["warnings"]) == 1 and re.match(rf"{exp_dir}/.*{warning}", trial["warnings"][0])
    assert [x for x in lines if re.search(rf"trial {trial['trial_id']} warning: .*{warning}", x)]


# -- bad input at the edges ------------------------------------------------------------------


def test_trial_class_that_is_not_a_pytorch_trial(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model_dir = tmp_path / "plain_model"
    model_dir.mkdir()
    (model_dir / "plain_def.py").write_text(
        "class PlainTrial:\n    def __init__(self, context):\n        self.context = context\n"
    )
    config = toy_config("plain", entrypoint="plain_def:PlainTrial")
    path = _write_config(tmp_path, config, "plain.yaml")
    storage = tmp_path / "results"
    assert main(["run", path, str(model_dir), "--storage-path", str(storage)]) == 2
    assert _one_line_error(capsys) == (
        "searchlab: error: plain.yaml: entrypoint: plain_def:PlainTrial is not a subclass of "
        "searchlab.pytorch.PyTorchTrial; derive it from PyTorchTrial"
    )
    assert not storage.exists()  # rejected before anything ran


def test_unwritable_storage_path(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    path = _write_config(tmp_path, toy_config("unwritable"), "unwritable.yaml")
    storage = blocker / "results"
    assert main(["run", path, str(TOY_MODEL_DIR), "--storage-path", str(storage)]) == 2
    line = _one_line_error(capsys)
    assert line == (
        f"searchlab: error: --storage-path {storage}: cannot write there (Not a directory); "
        "pick a writable directory"
    )


def test_resume_of_a_directory_that_is_no_experiment(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-experiment"
    assert main(["resume", str(missing)]) == 2
    assert _one_line_error(capsys) == (
        f"searchlab: error: {missing}: not a searchlab experiment that can be resumed (no "
        "experiment.json or Tune state); pass the directory `searchlab run` printed"
    )


@pytest.mark.ray
def test_training_data_loader_that_yields_nothing(
    ray_session: Any, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = toy_config(
        "empty-data",
        hyperparameters={"n_train": 0, "hidden": {"type": "categorical", "vals": [4, 8]}},
        searcher={"name": "grid"},
    )
    path = _write_config(tmp_path, config, "empty.yaml")
    storage = tmp_path / "results"
    assert main(["run", path, str(TOY_MODEL_DIR), "--storage-path", str(storage)]) == 2
    assert _one_line_error(capsys) == (
        "searchlab: error: toy_model_def:ToyModelTrial: ToyModelTrial.build_training_data_loader()"
        " yields no batches; check the dataset is not empty and batch_size/drop_last leave at "
        "least one batch"
    )
    trials = searchlab.load_results(storage / "empty-data").trials
    errored = trials[trials["state"] == "ERRORED"]
    assert len(errored) >= 1 and "RUNNING" not in set(trials["state"])  # it stopped
    assert errored["error"].str.contains(r"yields no batches", regex=False).all()


def test_model_directory_not_importable_on_a_worker(tmp_path: pathlib.Path) -> None:
    # What a worker sees when the model directory did not reach it: a path without the module.
    # (A module name no other test imports: a model directory loaded earlier in this process
    # stays on sys.path, and would serve `toy_model_def` from there.)
    bare = tmp_path / "not-shipped"
    bare.mkdir()
    config = toy_config("unshipped", entrypoint="unshipped_model_def:ToyModelTrial")
    spec = ExperimentSpec.from_config(load_experiment_config(config, model_dir=str(bare)), "x")
    trial_config = TrialConfig({"global_batch_size": 16}, rung_ends=[4]).to_tune()
    runner = TrialRunner(
        spec, trial_config, trial_id="t0", logdir=str(tmp_path), model_dir=spec.model_dir
    )
    result = runner.step()
    assert result["done"] is True
    report = TrialReport.of(result)
    assert report.outcome is Outcome.FATAL
    assert re.fullmatch(
        rf"cannot import module 'unshipped_model_def' of 'unshipped_model_def:ToyModelTrial' "
        rf"from {re.escape(str(bare))}: No module named 'unshipped_model_def'; check the "
        r"entrypoint and the model directory",
        report.message or "",
    ), report.message


def test_a_nan_inside_a_report_window_names_its_own_batch(tmp_path: pathlib.Path) -> None:
    hparams = {"global_batch_size": 16, "nan_at_batch": 2}  # the third batch
    config = toy_config("nan-window", hyperparameters=hparams, scheduling_unit=4)
    spec = ExperimentSpec.from_config(
        load_experiment_config(config, model_dir=str(TOY_MODEL_DIR)), "x"
    )
    runner = TrialRunner(
        spec,
        TrialConfig(hparams, rung_ends=[8]).to_tune(),
        trial_id="t0",
        logdir=str(tmp_path),
        model_dir=spec.model_dir,
    )
    result = runner.step()
    assert result["batches"] == 4 and result["done"] is True
    report = TrialReport.of(result)
    assert report.outcome is Outcome.TRIAL_ERROR
    assert report.message == (
        "training metric 'loss' is nan at batch 3 (reported at batch 4); the trial stops and "
        "counts as the worst result (lower the learning rate or check the data)"
    )


# -- resume ----------------------------------------------------------------------------------


@pytest.mark.ray
def test_a_resumed_experiment_stops_at_a_user_error_every_trial_hits(
    ray_session: Any, tmp_path: pathlib.Path
) -> None:
    interrupted, broken = tmp_path / "interrupted", tmp_path / "broken"
    config = toy_config(
        "resume-broken",
        hyperparameters={
            "hidden": {"type": "categorical", "vals": [2, 3, 4, 5, 6]},
            # the first trial presses Ctrl-C on this driver at its second batch
            "interrupt_at_batch": 1,
            "interrupt_pid": os.getpid(),
            "interrupt_marker": str(interrupted),
            "unwrapped_if_exists": str(broken),
        },
        searcher={"name": "grid", "max_concurrent_trials": 1},
    )
    first, lines = _run(config, tmp_path)
    exp_dir = tmp_path / "resume-broken"
    assert any(f"searchlab resume {exp_dir}" in x for x in lines)
    assert first.trials["state"].tolist() == ["PAUSED"]

    broken.write_text("")  # the trial class breaks between the run and its resume
    with pytest.raises(TrialDefinitionError, match=r"ToyModelTrial has no model: must have"):
        searchlab.resume(exp_dir, echo=lambda _: None)
    trials = searchlab.load_results(exp_dir).trials
    assert trials["state"].tolist() == ["ERRORED"]  # stopped at once, no other trial started


@pytest.mark.ray
def test_a_resumed_run_keeps_its_own_snapshot_and_records(
    ray_session: Any, tmp_path: pathlib.Path
) -> None:
    """Tune's restore stages a copy of every state file at the top of the experiment
    directory and copies its staging folder back at each save: only the resumed session's
    own state may go back, never the pre-resume snapshot or records over the new ones."""
    interrupted = tmp_path / "interrupted"
    config = toy_config(
        "resume-own",
        hyperparameters={
            "hidden": {"type": "categorical", "vals": [2, 3, 4]},
            "interrupt_at_batch": 1,  # the first trial presses Ctrl-C at its second batch
            "interrupt_pid": os.getpid(),
            "interrupt_marker": str(interrupted),
        },
        searcher={"name": "grid", "max_concurrent_trials": 1},
    )
    first, _ = _run(config, tmp_path)
    assert first.trials["state"].tolist() == ["PAUSED"]
    exp_dir = tmp_path / "resume-own"
    before = json.loads((exp_dir / "searchlab_state.json").read_text())["session"]

    resumed = searchlab.resume(exp_dir, echo=lambda _: None)
    assert (resumed.trials["state"] == "COMPLETED").all() and len(resumed.trials) == 3
    sessions = sorted(p.name for p in exp_dir.glob("experiment_state-*.json"))
    assert len(sessions) == 2 and sessions[0] == f"experiment_state-{before}.json"
    snapshot = json.loads((exp_dir / "searchlab_state.json").read_text())
    assert sessions[1] == f"experiment_state-{snapshot['session']}.json"  # the new session's
    records = json.loads((exp_dir / "trials.json").read_text())["trials"]
    assert sorted(r["state"] for r in records) == ["COMPLETED"] * 3


def test_an_atomic_write_syncs_the_file_then_its_folder(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The rename must be on disk before anything written after it (experiment.json before
    # Tune's files): the folder is synced after the file.
    import stat

    from searchlab.experiment import _snapshot

    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(_snapshot.os, "fsync", fsync)
    _snapshot.atomic_write(tmp_path / "experiment.json", '{"standby": 2}')
    assert (tmp_path / "experiment.json").read_text() == '{"standby": 2}'
    assert synced == ["file", "folder"]
    assert [p.name for p in tmp_path.iterdir()] == ["experiment.json"]  # no temporary left
