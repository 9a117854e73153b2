"""Validation, training-metric windows, test mode, checkpoint policies and stop requests."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
import torch
from api_trials import LinearTrial, regression_data, train
from torch import nn

from searchlab import pytorch
from searchlab.pytorch import Batch

HP = {"global_batch_size": 4, "n_train": 16}  # 4 batches an epoch


class ModeTrial(LinearTrial):
    """Records the model's train/eval mode and progress whenever it is called."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        super().__init__(context)
        self.modes: list[tuple[str, bool, int]] = []

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        self.modes.append(("train", self.model.training, len(self.indices)))
        return super().train_batch(batch, epoch_idx, batch_idx)

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        self.modes.append(("eval", self.model.training, len(self.indices)))
        return super().evaluate_batch(batch, batch_idx)


class FullDatasetTrial(LinearTrial):
    evaluate_batch = pytorch.PyTorchTrial.evaluate_batch  # back to "not defined"

    def evaluate_full_dataset(self, data_loader: Any) -> dict[str, Any]:
        self.loader = data_loader
        xs, ys = zip(*data_loader)
        x, y = torch.cat(xs), torch.cat(ys)
        self.records = len(x)
        return {"validation_loss": nn.functional.mse_loss(self.model(x), y), "n": len(x)}


def test_evaluate_full_dataset_sees_the_whole_validation_set(tmp_path) -> None:
    run = train(
        tmp_path, {**HP, "n_val": 10, "val_batch": 4}, trial_cls=FullDatasetTrial, max_length=2
    )
    assert isinstance(run.trial.loader, torch.utils.data.DataLoader)
    assert run.trial.records == 10
    x, y = regression_data(10, seed=1).tensors
    with torch.no_grad():
        expected = float(nn.functional.mse_loss(run.trial.model(x), y))
    (metrics,) = [r.metrics for r in run.reports("validation")]
    assert metrics == {"validation_loss": pytest.approx(expected), "n": 10.0}


def test_validation_runs_in_eval_mode_without_grad(tmp_path) -> None:
    run = train(tmp_path, HP, trial_cls=ModeTrial, max_length=Batch(2), validation_period=Batch(1))
    assert run.trial.modes == [
        ("train", True, 0),
        ("eval", False, 1),
        ("eval", False, 1),
        ("train", True, 1),
        ("eval", False, 2),
        ("eval", False, 2),
    ]


def test_perform_initial_validation_validates_before_the_first_batch(tmp_path) -> None:
    run = train(tmp_path, HP, trial_cls=ModeTrial, max_length=Batch(2), step_zero_validation=True)
    first = run.trainer.reports[0]
    assert (first.group, first.batches, first.epochs) == ("validation", 0, 0.0)
    assert run.trial.modes[0] == ("eval", False, 0)
    assert [r.batches for r in run.reports("validation")] == [0, 2]
    without = train(tmp_path / "no", HP, max_length=Batch(2))
    assert [r.batches for r in without.reports("validation")] == [2]


def test_test_mode_trains_one_batch_validates_one_batch_and_checkpoints(tmp_path) -> None:
    run = train(tmp_path, HP, trial_cls=ModeTrial, max_length=Batch(10), test_mode=True)
    assert run.trial.indices == [(0, 0)]
    assert [m[0] for m in run.trial.modes] == ["train", "eval"]  # 1 of 2 validation batches
    assert [(r.group, r.batches, r.checkpoint) for r in run.trainer.reports] == [
        ("training", 1, False),
        ("validation", 1, True),
    ]
    assert pathlib.Path(run.path, "state-dict.pth").is_file()


def test_training_metrics_are_window_means(tmp_path) -> None:
    run = train(tmp_path, HP, exp_conf={"scheduling_unit": 3}, max_length=Batch(7))
    losses = run.trial.losses
    reports = run.reports("training")
    assert [(r.batches, r.epochs) for r in reports] == [(3, 0.75), (6, 1.5), (7, 1.75)]
    assert reports[0].metrics["loss"] == pytest.approx(sum(losses[0:3]) / 3, rel=1e-6)
    assert reports[1].metrics["loss"] == pytest.approx(sum(losses[3:6]) / 3, rel=1e-6)
    assert reports[2].metrics["loss"] == pytest.approx(losses[6], rel=1e-6)
    assert [r.metrics["batch_idx"] for r in reports] == [1.0, 4.0, 6.0]


def test_reporting_period_overrides_scheduling_unit(tmp_path) -> None:
    run = train(tmp_path, HP, max_length=Batch(4), reporting_period=Batch(2))
    assert [r.batches for r in run.reports("training")] == [2, 4]


def test_a_window_cut_by_a_checkpoint_resumes_whole(tmp_path) -> None:
    conf = {"scheduling_unit": 3}
    fit = {"max_length": Batch(6), "checkpoint_period": Batch(2)}
    whole = train(tmp_path / "whole", HP, exp_conf=conf, **fit)
    (at_2,) = (tmp_path / "whole").glob("ckpt-b00000002-*")
    resumed = train(tmp_path / "resumed", HP, exp_conf=conf, latest_checkpoint=str(at_2), **fit)
    expected = [r.metrics for r in whole.reports("training")]
    assert [r.metrics for r in resumed.reports("training")] == expected  # window [0, 1, 2]


SEQUENCE = [3.0, 1.0, 2.0, 4.0, 0.0]  # the `score` of validations at batches 1..5


@pytest.mark.parametrize(
    ("policy", "smaller_is_better", "period", "expected"),
    [
        ("best", True, None, [1, 2, 5]),  # new minima at 1, 2 (and 5); the end always
        ("best", False, None, [1, 4, 5]),
        ("all", True, None, [1, 2, 3, 4, 5]),
        ("none", True, None, [5]),  # Determined: `none` still checkpoints where training ends
        ("none", True, Batch(2), [2, 4, 5]),
    ],
)
def test_checkpoint_policy_and_period(tmp_path, policy, smaller_is_better, period, expected):
    conf = {"searcher": {"metric": "score", "smaller_is_better": smaller_is_better}}
    run = train(
        tmp_path,
        {**HP, "val_sequence": SEQUENCE},
        exp_conf=conf,
        max_length=Batch(5),
        validation_period=Batch(1),
        checkpoint_period=period,
        checkpoint_policy=policy,
    )
    assert run.checkpoint_batches() == expected
    on_disk = sorted(int(p.name[6:14]) for p in tmp_path.glob("ckpt-b*"))
    assert on_disk == expected
    assert run.path is not None and pathlib.Path(run.path).name.startswith(f"ckpt-b{5:08d}")


def test_stop_requested_ends_training_with_a_checkpoint(tmp_path) -> None:
    run = train(tmp_path, {**HP, "stop_at": 2}, max_length=Batch(10))
    assert len(run.trial.indices) == 3  # batches 0, 1, 2: the request takes effect after it
    last = run.trainer.reports[-1]
    assert (last.batches, last.stop_requested, last.checkpoint) == (3, True, True)
    assert run.reports("validation") == []  # a stop is not the end of the asked length
    assert run.context.get_stop_requested() is True
    assert pathlib.Path(run.path).name.startswith("ckpt-b00000003")
