"""Determined's Core API (``det.core``) as its documentation uses it, in a trial and run by hand.

In a trial, a fake actor (``fake_actor.FakeActor``) stands for the trial's Ray actor: the
script's reports reach it in lock step and its answers (go on, checkpoint, preempt) decide
what ``should_preempt()`` says. The code in the tests is the code of Determined's Core API
tutorials with ``determined`` changed to ``searchlab``.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest
from fake_actor import FakeActor

import searchlab as det
from searchlab.core._channel import Action, Failure, Message, Report, Stored, Unable


def _preempt_at(batches: int) -> Any:
    def policy(message: Message) -> Action:
        at = isinstance(message, Report) and message.group == "validation"
        return Action.PREEMPT if at and message.batches >= batches else Action.GO

    return policy


def _stage_3(core_context: Any, increment_by: int, start: int = 0, x: int = 0) -> int:
    """Determined's core_api/3_hpsearch.py main loop (without the sleep)."""
    trial_id = det.get_cluster_info().trial.trial_id
    for batch in range(start, 100):
        x += increment_by
        steps_completed = batch + 1
        if steps_completed % 10 == 0:
            core_context.train.report_training_metrics(
                steps_completed=steps_completed, metrics={"x": x}
            )
            core_context.train.report_progress(steps_completed / float(100))
            core_context.train.report_validation_metrics(
                steps_completed=steps_completed, metrics={"x": x, "batches": steps_completed}
            )
            with core_context.checkpoint.store_path({"steps_completed": steps_completed}) as (
                path,
                _uuid,
            ):
                path.joinpath("state").write_text(f"{x},{steps_completed},{trial_id}")
            if core_context.preempt.should_preempt():
                return steps_completed
    return 100


def test_reports_wait_for_the_searcher_and_a_pause_preempts(tmp_path, monkeypatch) -> None:
    actor = FakeActor(
        tmp_path,
        monkeypatch,
        hparams={"increment_by": 3},
        rung_ends=[20, 100],
        metric="x",
        policy=_preempt_at(20),
    )
    with det.core.init() as core_context:
        stopped_at = _stage_3(core_context, det.get_cluster_info().trial.hparams["increment_by"])
    messages = actor.finish()
    assert stopped_at == 20  # it stopped right after the validation the searcher paused at
    reports = [(m.group, m.batches, m.metrics) for m in messages if isinstance(m, Report)]
    assert reports == [
        ("training", 10, {"x": 30}),
        ("validation", 10, {"x": 30, "batches": 10}),
        ("training", 20, {"x": 60}),
        ("validation", 20, {"x": 60, "batches": 20}),
    ]
    assert all(
        m.by_time_metric for m in messages if isinstance(m, Report) and m.group == "validation"
    )
    stored = [m for m in messages if isinstance(m, Stored)]
    assert [s.batches for s in stored] == [10, 20]
    latest = pathlib.Path(stored[-1].path)
    assert latest.parent == actor.checkpoint_dir
    assert (latest / "state").read_text() == "60,20,3"
    assert json.loads((latest / "metadata.json").read_text()) == {"steps_completed": 20}


def test_the_next_run_resumes_from_latest_checkpoint(tmp_path, monkeypatch) -> None:
    first = FakeActor(
        tmp_path / "a",
        monkeypatch,
        hparams={"increment_by": 2},
        rung_ends=[20, 100],
        metric="x",
        policy=_preempt_at(20),
    )
    with det.core.init() as core_context:
        _stage_3(core_context, 2)
    latest = [m for m in first.finish() if isinstance(m, Stored)][-1].path
    second = FakeActor(
        tmp_path / "b",
        monkeypatch,
        hparams={"increment_by": 2},
        rung_ends=[20, 100],
        next_rung=1,
        metric="x",
        latest_checkpoint=latest,
        run=2,
    )
    info = det.get_cluster_info()
    assert info.latest_checkpoint == latest and info.trial._trial_run_id == 2
    with det.core.init() as core_context:
        with core_context.checkpoint.restore_path(info.latest_checkpoint) as path:
            x, steps, _ = (int(v) for v in (path / "state").read_text().split(","))
        assert _stage_3(core_context, 2, start=steps, x=x) == 100
    validations = second.reports("validation")
    assert [r.batches for r in validations] == list(range(30, 101, 10))
    assert all(r.metrics["x"] == 2 * r.batches for r in validations)  # as if never paused


def test_core_code_refuses_a_checkpoint_request_and_is_preempted(tmp_path, monkeypatch) -> None:
    def policy(message: Message) -> Action:
        if isinstance(message, Unable):
            return Action.PREEMPT
        validation = isinstance(message, Report) and message.group == "validation"
        return Action.CHECKPOINT if validation else Action.GO

    actor = FakeActor(
        tmp_path,
        monkeypatch,
        hparams={"increment_by": 1},
        rung_ends=[100],
        metric="x",
        policy=policy,
    )
    with det.core.init() as core_context:
        assert _stage_3(core_context, 1) == 10  # preempted after its first checkpoint
    messages = actor.finish()
    kinds = [type(m).__name__ for m in messages]
    assert kinds == ["Report", "Report", "Unable", "Stored"]


def test_searcher_operations_follow_the_rungs_the_trial_has_left(tmp_path, monkeypatch) -> None:
    completed = []

    def policy(message: Message) -> Action:
        if isinstance(message, Report) and message.searcher_length is not None:
            completed.append((message.searcher_length, message.metrics))
            return Action.PREEMPT if message.searcher_length == 16 else Action.GO
        return Action.GO

    actor = FakeActor(
        tmp_path,
        monkeypatch,
        hparams={},
        rung_ends=[4, 8, 16, 32],
        next_rung=1,
        metric="x",
        policy=policy,
    )
    lengths, batches, x = [], 4, 4.0
    with det.core.init() as core_context:
        assert core_context.searcher.get_configured_units() is det.core.Unit.BATCHES
        for op in core_context.searcher.operations():
            lengths.append(op.length)
            while batches < op.length:
                batches += 1
                x += 1
                op.report_progress(batches)
            core_context.train.report_validation_metrics(steps_completed=batches, metrics={"x": x})
            op.report_completed(x)
        assert core_context.preempt.should_preempt()
    actor.finish()
    assert lengths == [8, 16]  # rung 0 was done before this run; the pause at 16 ends them
    assert completed == [(8, {"x": 8.0}), (16, {"x": 16.0})]
    validations = actor.reports("validation")
    assert not any(r.by_time_metric for r in validations)  # operations decide the rungs


def test_an_operation_must_be_completed(tmp_path, monkeypatch) -> None:
    actor = FakeActor(tmp_path, monkeypatch, hparams={}, rung_ends=[4, 8], metric="x")
    with det.core.init() as core_context:
        with pytest.raises(RuntimeError, match="report_completed"):
            for _op in core_context.searcher.operations():
                pass
    actor.finish()


def test_searcher_context_needs_a_configured_length(tmp_path, monkeypatch) -> None:
    actor = FakeActor(
        tmp_path, monkeypatch, hparams={}, rung_ends=[2**62], metric="x", script_length=True
    )
    with det.core.init() as core_context:
        with pytest.raises(ValueError, match=r"searcher\.max_length"):
            next(iter(core_context.searcher.operations()))
    actor.finish()


def test_invalid_hp_ends_the_script_with_exit_0_and_replaces_the_trial(
    tmp_path, monkeypatch
) -> None:
    actor = FakeActor(tmp_path, monkeypatch, hparams={"increment_by": 0}, rung_ends=[10])
    with pytest.raises(SystemExit) as exited, det.core.init():
        raise det.InvalidHP("increment_by must not be 0")
    assert exited.value.code == 0
    failures = [m for m in actor.finish() if isinstance(m, Failure)]
    assert [f.kind for f in failures] == ["invalid_hp"]


def test_tensor_metrics_are_sent_as_numbers_and_lists(tmp_path, monkeypatch) -> None:
    import numpy as np
    import torch

    actor = FakeActor(tmp_path, monkeypatch, hparams={}, rung_ends=[100])
    with det.core.init() as core_context:
        core_context.train.report_training_metrics(
            steps_completed=1,
            metrics={"loss": torch.tensor(0.5), "per_class": np.array([1.0, 2.0]), "n": 3},
        )
    (report,) = actor.finish()
    assert report.metrics == {"loss": 0.5, "per_class": [1.0, 2.0], "n": 3}


def test_run_by_hand_core_init_stores_checkpoints_locally(tmp_path, monkeypatch, caplog) -> None:
    caplog.set_level("INFO", logger="searchlab.core")
    monkeypatch.delenv("SEARCHLAB_CLUSTER_INFO", raising=False)
    assert det.get_cluster_info() is None
    with det.core.init(checkpoint_storage=str(tmp_path)) as core_context:
        core_context.train.report_training_metrics(steps_completed=5, metrics={"x": 1})
        assert "training metrics at 5 batches: x=1" in caplog.text
        assert not core_context.preempt.should_preempt()
        for op in core_context.searcher.operations():
            assert op.length == 1  # Determined's dummy searcher: one operation of length 1
            op.report_completed(0.5)
        with core_context.checkpoint.store_path({"steps_completed": 5}) as (path, storage_id):
            (path / "model.txt").write_text("weights")
        assert core_context.checkpoint.get_metadata(storage_id) == {"steps_completed": 5}
        with core_context.checkpoint.restore_path(storage_id) as restored:
            assert (restored / "model.txt").read_text() == "weights"
        core_context.checkpoint.download(storage_id, tmp_path / "copy")
        assert (tmp_path / "copy" / "model.txt").is_file()
        core_context.checkpoint.delete(storage_id)
        with pytest.raises(det.CheckpointError, match=storage_id):
            core_context.checkpoint.get_metadata(storage_id)
