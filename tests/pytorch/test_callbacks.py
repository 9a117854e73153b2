"""``PyTorchCallback``: every hook fires at its point with its arguments, and state resumes."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
import torch
from api_trials import LinearTrial, train

from searchlab import pytorch
from searchlab.pytorch import Batch, PyTorchCallback


class Recorder(PyTorchCallback):
    """Logs every hook call as (name, args) and keeps a count of trained batches as state."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self.state = {"validations": 0, "workloads": 0}

    def _log(self, name: str, arg: Any = None) -> None:
        self.events.append((name, arg))

    def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: str | None) -> None:
        self._log("trial_startup", (first_batch_idx, checkpoint_uuid, dict(self.state)))

    def on_trial_shutdown(self) -> None:
        self._log("trial_shutdown")

    def on_training_start(self) -> None:
        self._log("training_start", dict(self.state))

    def on_training_epoch_start(self, epoch_idx: int) -> None:
        self._log("epoch_start", epoch_idx)

    def on_training_epoch_end(self, epoch_idx: int) -> None:
        self._log("epoch_end", epoch_idx)

    def on_training_workload_end(self, avg_metrics: Any, batch_metrics: Any) -> None:
        self.state["workloads"] += 1
        self._log("workload_end", (avg_metrics, batch_metrics))

    def on_validation_start(self) -> None:
        self._log("validation_start")

    def on_validation_epoch_start(self) -> None:
        self._log("validation_epoch_start")

    def on_validation_end(self, metrics: dict[str, Any]) -> None:
        self.state["validations"] += 1
        self._log("validation_end", metrics)

    def on_validation_epoch_end(self, outputs: list[Any]) -> None:
        self._log("validation_epoch_end")

    def on_checkpoint_load_start(self, checkpoint: dict[str, Any]) -> None:
        self._log("checkpoint_load_start", checkpoint)

    def on_checkpoint_save_start(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["recorder_note"] = "added by a callback"
        self._log("checkpoint_save_start", sorted(checkpoint))

    def on_checkpoint_write_end(self, checkpoint_dir: str) -> None:
        self._log("checkpoint_write_end", checkpoint_dir)

    def on_checkpoint_end(self, checkpoint_dir: str) -> None:
        self._log("checkpoint_end", checkpoint_dir)

    def on_checkpoint_upload_end(self, uuid: str) -> None:
        self._log("checkpoint_upload_end", uuid)

    def on_before_optimizer_step(self, parameters: Any) -> None:
        self._log("before_optimizer_step", len(list(parameters)))

    def state_dict(self) -> dict[str, Any]:
        return dict(self.state)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.state = dict(state_dict)


class RecordedTrial(LinearTrial):
    def build_callbacks(self) -> dict[str, PyTorchCallback]:
        self.recorder = Recorder()
        return {"recorder": self.recorder}


HP = {"global_batch_size": 4, "n_train": 12}  # 3 batches an epoch
CONF = {"scheduling_unit": 2}


def _fit(tmp: pathlib.Path, max_batches: int, latest: str | None = None, validate: int = 3):
    return train(
        tmp,
        HP,
        trial_cls=RecordedTrial,
        exp_conf=CONF,
        max_length=Batch(max_batches),
        validation_period=Batch(validate),
        checkpoint_period=Batch(2),
        checkpoint_policy="none",
        latest_checkpoint=latest,
    )


VALIDATION = [
    "validation_start",
    "validation_epoch_start",
    "validation_end",
    "validation_epoch_end",
]
CHECKPOINT = [
    "checkpoint_save_start",
    "checkpoint_write_end",
    "checkpoint_end",
    "checkpoint_upload_end",
]


def test_hooks_fire_in_order(tmp_path) -> None:
    run = _fit(tmp_path, 4)
    names = [name for name, _ in run.trial.recorder.events]
    assert names == [
        "trial_startup",
        "training_start",
        "epoch_start",  # epoch 0
        "before_optimizer_step",  # batch 0
        "before_optimizer_step",  # batch 1
        "workload_end",  # scheduling_unit 2
        *CHECKPOINT,  # checkpoint_period 2
        "before_optimizer_step",  # batch 2
        "epoch_end",  # epoch 0
        "workload_end",  # as in Determined, a workload ends before each validation
        *VALIDATION,  # validation_period 3
        "epoch_start",  # epoch 1
        "before_optimizer_step",  # batch 3
        "workload_end",
        *VALIDATION,  # end of training
        *CHECKPOINT,
        "trial_shutdown",
    ]


def test_hook_arguments(tmp_path) -> None:
    run = _fit(tmp_path, 4)
    events = run.trial.recorder.events
    args = {name: [a for n, a in events if n == name] for name, _ in events}
    assert args["trial_startup"] == [(0, None, {"validations": 0, "workloads": 0})]
    assert args["epoch_start"] == [0, 1] and args["epoch_end"] == [0]
    assert args["before_optimizer_step"] == [2] * 4  # weight and bias
    losses = run.trial.losses
    # Workloads end at 2 (scheduling_unit), 3 (validation) and 4: each batch in one call.
    (avg1, batch1), (avg2, batch2), (avg3, batch3) = args["workload_end"]
    assert [m["loss"] for m in batch1] == pytest.approx(losses[:2])
    assert [m["batch_idx"] for m in batch1 + batch2 + batch3] == [0, 1, 2, 3]
    assert avg1["loss"] == pytest.approx(sum(losses[:2]) / 2)
    assert avg1 == run.reports("training")[0].metrics  # the whole report window
    assert avg2["loss"] == pytest.approx(losses[2]) and avg3["loss"] == pytest.approx(losses[3])
    # The training report at 4 still averages its scheduling_unit window (batches 2 and 3).
    assert run.reports("training")[1].metrics["loss"] == pytest.approx(sum(losses[2:4]) / 2)
    validations = [r.metrics for r in run.reports("validation")]
    assert args["validation_end"] == validations
    dirs = args["checkpoint_write_end"]
    assert args["checkpoint_end"] == dirs
    assert [pathlib.Path(d).name for d in dirs] == args["checkpoint_upload_end"]
    assert all(pathlib.Path(d, "state-dict.pth").is_file() for d in dirs)
    assert dirs[-1] == run.path
    assert "rng_state" in args["checkpoint_save_start"][0]


def test_save_start_may_add_to_the_checkpoint(tmp_path) -> None:
    run = _fit(tmp_path, 2)
    state = torch.load(f"{run.path}/state-dict.pth", map_location="cpu", weights_only=False)
    assert state["recorder_note"] == "added by a callback"
    assert state["callbacks"]["recorder"] == {"validations": 1, "workloads": 1}


def test_callback_state_resumes_through_a_checkpoint(tmp_path) -> None:
    # Reports every 2 batches, so a fit that ends at 4 reports nothing extra.
    whole = _fit(tmp_path / "whole", 6, validate=2)
    first = _fit(tmp_path / "first", 4, validate=2)
    second = _fit(tmp_path / "second", 6, latest=first.path, validate=2)
    assert whole.trial.recorder.state == {"validations": 3, "workloads": 3}
    assert second.trial.recorder.state == whole.trial.recorder.state
    events = second.trial.recorder.events
    names = [n for n, _ in events]
    # As in Determined: startup names the checkpoint, then the load hook, then training.
    assert names[:3] == ["trial_startup", "checkpoint_load_start", "training_start"]
    first_batch, uuid, state_at_startup = events[0][1]
    assert (first_batch, uuid) == (4, pathlib.Path(first.path).name)
    assert state_at_startup == {"validations": 0, "workloads": 0}  # not loaded yet
    assert events[1][1]["callbacks"]["recorder"] == {"validations": 2, "workloads": 2}
    assert events[2][1] == {"validations": 2, "workloads": 2}  # loaded before training
    assert ("epoch_start", 1) not in events  # resumed mid-epoch 1: no epoch start


def test_each_fit_is_one_run_from_startup_to_shutdown(tmp_path) -> None:
    with pytorch.init(hparams=HP, checkpoint_dir=tmp_path, enable_tensorboard_logging=False) as ctx:
        trial = RecordedTrial(ctx)
        trainer = pytorch.Trainer(trial, ctx)
        trainer.fit(max_length=Batch(2))
        trainer.fit(max_length=Batch(3))
    names = [n for n, _ in trial.recorder.events]
    assert names.count("trial_startup") == names.count("trial_shutdown") == 2
    assert names.count("training_start") == 2
    startups = [a for n, a in trial.recorder.events if n == "trial_startup"]
    assert [a[0] for a in startups] == [0, 2]
    assert names[-1] == "trial_shutdown"


class FailingTrial(RecordedTrial):
    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        if batch_idx == 1:
            raise RuntimeError("boom in train_batch")
        return super().train_batch(batch, epoch_idx, batch_idx)


def test_shutdown_hook_runs_when_training_fails(tmp_path) -> None:
    with pytorch.init(hparams=HP, checkpoint_dir=tmp_path, enable_tensorboard_logging=False) as ctx:
        trial = FailingTrial(ctx)
        with pytest.raises(RuntimeError, match="boom in train_batch"):
            pytorch.Trainer(trial, ctx).fit(max_length=Batch(3))
    assert trial.recorder.events[-1] == ("trial_shutdown", None)


class WorkloadLog(PyTorchCallback):
    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []

    def on_training_workload_end(self, avg_metrics: Any, batch_metrics: Any) -> None:
        self.calls.append((avg_metrics, batch_metrics))


class WorkloadTrial(LinearTrial):
    def build_callbacks(self) -> dict[str, PyTorchCallback]:
        self.log = WorkloadLog()
        return {"log": self.log}


def test_workloads_end_at_every_boundary_determined_has(tmp_path) -> None:
    run = train(
        tmp_path,
        {"global_batch_size": 4, "n_train": 40},
        trial_cls=WorkloadTrial,
        exp_conf={"scheduling_unit": 5},
        max_length=Batch(10),
        validation_period=Batch(3),
        checkpoint_period=Batch(4),
    )
    calls = run.trial.log.calls
    # Validations at 3, 6, 9, 10; checkpoints at 4, 8, 10; reports at 5, 10.
    ends = [int(batches[-1]["batch_idx"]) + 1 for _, batches in calls]
    assert ends == [3, 4, 5, 6, 8, 9, 10]
    assert [len(batches) for _, batches in calls] == [3, 1, 1, 1, 2, 1, 1]
    assert [m["batch_idx"] for _, batches in calls for m in batches] == list(range(10))
    losses = run.trial.losses
    means = [sum(losses[0:3]) / 3, losses[3], losses[4], losses[5], sum(losses[6:8]) / 2]
    assert [avg["loss"] for avg, _ in calls] == pytest.approx([*means, losses[8], losses[9]])
    # The training reports keep their scheduling_unit windows.
    reports = run.reports("training")
    assert [r.batches for r in reports] == [5, 10]
    assert reports[0].metrics["loss"] == pytest.approx(sum(losses[:5]) / 5)


class LegacyEpochStart(PyTorchCallback):
    def __init__(self) -> None:
        self.calls = 0

    def on_training_epoch_start(self) -> None:  # type: ignore[override]
        self.calls += 1


class LegacyTrial(LinearTrial):
    def build_callbacks(self) -> dict[str, PyTorchCallback]:
        self.legacy = LegacyEpochStart()
        return {"legacy": self.legacy}


def test_on_training_epoch_start_without_epoch_idx_still_runs(tmp_path, caplog) -> None:
    run = train(tmp_path, HP, trial_cls=LegacyTrial, max_length=Batch(7))  # 3 batches an epoch
    assert run.trial.legacy.calls == 3  # epochs 0, 1, 2
    assert "LegacyEpochStart.on_training_epoch_start() without the epoch_idx parameter" in (
        caplog.text
    )


class ZeroingCallback(PyTorchCallback):
    """Replaces the saved weights before they load (Determined lets a load hook edit them)."""

    def on_checkpoint_load_start(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["models_state_dict"] = [
            {k: torch.zeros_like(v) for k, v in m.items()} for m in checkpoint["models_state_dict"]
        ]


class ZeroedOnLoadTrial(LinearTrial):
    def build_callbacks(self) -> dict[str, PyTorchCallback]:
        return {"zeroing": ZeroingCallback()}


def test_a_load_hook_may_replace_what_the_checkpoint_restores(tmp_path) -> None:
    first = _fit(tmp_path / "first", 2)
    resumed = train(
        tmp_path / "second",
        HP,
        trial_cls=ZeroedOnLoadTrial,
        exp_conf=CONF,
        max_length=Batch(2),
        checkpoint_policy="none",
        latest_checkpoint=first.path,
    )
    weights = [p.detach() for p in resumed.trial.model.parameters()]
    assert weights and all(torch.count_nonzero(w) == 0 for w in weights)
