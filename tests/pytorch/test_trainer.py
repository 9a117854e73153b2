"""The local ``Trainer``: lengths in every unit, returned checkpoints, reporting, continuing."""

from __future__ import annotations

import logging
import pathlib

import torch
from api_trials import LinearTrial, train

from searchlab import pytorch
from searchlab.pytorch import Batch, Epoch, Record
from searchlab.pytorch._loop import Report

HP = {"global_batch_size": 4, "n_train": 16}  # 4 batches an epoch


def test_epoch_lengths(tmp_path) -> None:
    run = train(tmp_path, HP, max_length=Epoch(2), validation_period=Epoch(1))
    assert len(run.trial.indices) == 8
    assert run.trial.indices[-1] == (1, 7)
    assert [(r.batches, r.epochs) for r in run.reports("validation")] == [(4, 1.0), (8, 2.0)]


def test_record_lengths_round_up_to_whole_batches(tmp_path) -> None:
    run = train(
        tmp_path, HP, max_length=Record(20), checkpoint_period=Record(8), checkpoint_policy="none"
    )
    assert len(run.trial.indices) == 5  # ceil(20 / 4)
    assert run.checkpoint_batches() == [2, 4, 5]


def test_max_length_from_the_experiment_config(tmp_path) -> None:
    conf = {
        "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": 3}}
    }
    run = train(tmp_path, HP, exp_conf=conf)
    assert len(run.trial.indices) == 3


def test_fit_returns_the_newest_checkpoint_and_resumes_from_it(tmp_path) -> None:
    first = train(tmp_path / "a", HP, max_length=Batch(3), checkpoint_period=Batch(2))
    assert pathlib.Path(first.path).name.startswith("ckpt-b00000003-")
    second = train(tmp_path / "b", HP, max_length=Batch(6), latest_checkpoint=first.path)
    assert second.context.get_initial_batch() == 3
    assert second.trial.indices == [(0, 3), (1, 4), (1, 5)]
    assert pathlib.Path(second.path).parent == tmp_path / "b"
    whole = train(tmp_path / "c", HP, max_length=Batch(6))
    assert torch.equal(second.trial.weights[-1], whole.trial.weights[-1])


def test_already_trained_length_returns_the_given_checkpoint(tmp_path) -> None:
    first = train(tmp_path / "a", HP, max_length=Batch(3))
    again = train(tmp_path / "b", HP, max_length=Batch(3), latest_checkpoint=first.path)
    assert again.path == first.path and again.trial.indices == []


def test_fit_again_continues_where_the_last_fit_stopped(tmp_path) -> None:
    with pytorch.init(hparams=HP, checkpoint_dir=tmp_path, enable_tensorboard_logging=False) as ctx:
        trial = LinearTrial(ctx)
        trainer = pytorch.Trainer(trial, ctx)
        trainer.fit(max_length=Batch(3))
        trainer.fit(max_length=Batch(6))
    whole = train(tmp_path / "whole", HP, max_length=Batch(6))
    assert trial.indices == whole.trial.indices
    assert torch.equal(trial.weights[-1], whole.trial.weights[-1])


class ListReporter:
    def __init__(self) -> None:
        self.reports: list[Report] = []
        self.saved: list[tuple[pathlib.Path, int]] = []

    def report(self, report: Report) -> None:
        self.reports.append(report)

    def checkpoint_saved(self, path: pathlib.Path, report: Report) -> None:
        self.saved.append((path, report.batches))


def test_reports_go_to_the_given_reporter(tmp_path) -> None:
    reporter = ListReporter()
    with pytorch.init(hparams=HP, checkpoint_dir=tmp_path, enable_tensorboard_logging=False) as ctx:
        trainer = pytorch.Trainer(LinearTrial(ctx), ctx, reporter=reporter)
        path = trainer.fit(max_length=Batch(4), validation_period=Batch(2))
    assert reporter.reports == trainer.reports
    assert [(r.group, r.batches) for r in reporter.reports] == [
        ("validation", 2),
        ("training", 4),
        ("validation", 4),
    ]
    assert reporter.saved == [(pathlib.Path(path), 4)]


def test_default_checkpoint_dir_is_under_the_working_directory(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    caplog.set_level(logging.INFO, logger="searchlab")
    with pytorch.init(hparams=HP, enable_tensorboard_logging=False) as ctx:
        path = pytorch.Trainer(LinearTrial(ctx), ctx).fit(max_length=Batch(2))
    ckpt = pathlib.Path(path)
    assert ckpt.parent.parent == tmp_path / "searchlab-checkpoints"
    assert f"searchlab: checkpoints go to {ckpt.parent}" in caplog.text
    assert "batch 2 validation: validation_loss=" in caplog.text
    assert f"batch 2: checkpoint {ckpt}" in caplog.text


def test_load_trial_from_a_trainer_checkpoint(tmp_path) -> None:
    run = train(tmp_path, {**HP, "lr": 0.05}, max_length=Batch(3))
    trial = pytorch.load_trial_from_checkpoint_path(run.path, trial_class=LinearTrial)
    assert isinstance(trial, LinearTrial)
    assert trial.hp == {**HP, "lr": 0.05}
    assert torch.equal(trial.model.weight, run.trial.model.weight)
    assert trial.opt.param_groups[0]["lr"] == 0.05
