"""Metrics that are not plain numbers, accepted as Determined accepted them.

Determined turned tensors into numpy arrays, averaged a training window with ``np.mean`` over
the stacked values (so equal-shape arrays give the mean of all their numbers), kept the key with
``None`` for values that cannot be averaged, and reported ``evaluate_full_dataset``'s values as
they were. Reports here carry floats for scalars and Python lists for arrays.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
import torch
from api_trials import LinearTrial, train

from searchlab import pytorch
from searchlab.errors import TrialDefinitionError
from searchlab.pytorch import Batch, PyTorchCallback, Reducer
from searchlab.pytorch._loop import LoopSettings, TrialLoop

HP = {"global_batch_size": 4, "n_train": 16}


class BatchLog(PyTorchCallback):
    def __init__(self) -> None:
        self.batches: list[dict[str, Any]] = []

    def on_training_workload_end(self, avg_metrics: Any, batch_metrics: Any) -> None:
        self.batches += batch_metrics


class MixedTrainMetrics(LinearTrial):
    def build_callbacks(self) -> dict[str, PyTorchCallback]:
        self.log = BatchLog()
        return {"log": self.log}

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        out = super().train_batch(batch, epoch_idx, batch_idx)
        b = float(batch_idx)
        return {
            "loss": out["loss"],
            "zero_d": torch.tensor(b),  # 0-d
            "one_element": torch.tensor([2 * b]),  # shape (1,)
            "vector": torch.tensor([b, b + 1, b + 2, b + 3]),  # shape (4,)
            "array": np.full((2, 2), b),
            "label": "sgd",
            "sometimes": None if batch_idx % 2 else b,
        }


def test_training_metrics_of_any_shape_are_reported(tmp_path) -> None:
    run = train(
        tmp_path,
        HP,
        trial_cls=MixedTrainMetrics,
        exp_conf={"scheduling_unit": 2},
        max_length=Batch(4),
    )
    first, second = (r.metrics for r in run.reports("training"))  # batches 0-1, then 2-3
    assert first["zero_d"] == 0.5 and second["zero_d"] == 2.5
    assert first["one_element"] == 1.0 and isinstance(first["one_element"], float)
    # np.mean over the window's stacked arrays: all 8 numbers of batches 0 and 1.
    assert first["vector"] == pytest.approx(np.mean([0, 1, 2, 3, 1, 2, 3, 4]))
    assert second["array"] == 2.5
    assert first["label"] is None and "label" in second  # kept, but cannot be averaged
    assert first["sometimes"] == 0.0 and second["sometimes"] == 2.0  # None values skipped
    assert first["loss"] == pytest.approx(sum(run.trial.losses[:2]) / 2)
    # The per-batch values, as the callbacks see them: Python numbers and lists.
    b1 = run.trial.log.batches[1]
    assert b1["vector"] == [1.0, 2.0, 3.0, 4.0] and b1["array"] == [[1.0, 1.0], [1.0, 1.0]]
    assert b1["zero_d"] == 1.0 and b1["one_element"] == 2.0 and b1["sometimes"] is None
    assert isinstance(b1["loss"], float)


def _loop(ctx: pytorch.PyTorchTrialContext) -> TrialLoop:
    settings = LoopSettings(scheduling_unit=4, checkpoint_period=Batch(2))
    loop = TrialLoop(MixedTrainMetrics(ctx), ctx, settings)
    loop.target = 4
    return loop


def test_a_window_holding_arrays_resumes_to_the_same_report(tmp_path) -> None:
    with pytorch.init(hparams=HP, checkpoint_dir=tmp_path, enable_tensorboard_logging=False) as c:
        whole = [r for r in _loop(c).run() if r.group == "training"]
    with pytorch.init(hparams=HP, checkpoint_dir=tmp_path, enable_tensorboard_logging=False) as c:
        loop = _loop(c)
        for report in loop.run():
            if report.checkpoint:  # the bare checkpoint at batch 2, mid-window
                break
        assert report.batches == 2 and report.group is None
        buf = io.BytesIO()
        torch.save(loop.state_dict(), buf)
        buf.seek(0)
        state = torch.load(buf, weights_only=True)  # the window needs no numpy classes
        assert state["trainer_state"]["window"][1]["vector"] == [1.0, 2.0, 3.0, 4.0]
    with pytorch.init(hparams=HP, checkpoint_dir=tmp_path, enable_tensorboard_logging=False) as c:
        resumed = _loop(c)
        resumed.load_state_dict(state)
        after = [r for r in resumed.run() if r.group == "training"]
    assert [r.batches for r in after] == [r.batches for r in whole] == [4]
    assert after[0].metrics == whole[0].metrics


class FullDatasetArrays(LinearTrial):
    evaluate_batch = pytorch.PyTorchTrial.evaluate_batch  # type: ignore[assignment]

    def evaluate_full_dataset(self, data_loader: Any) -> dict[str, Any]:
        return {
            "validation_loss": torch.tensor(0.25),
            "confusion": np.array([[3, 1], [0, 4]]),
            "per_class": torch.tensor([0.5, 0.75]),
            "history": [1, 2, 3],
            "label": "val",
        }


def test_evaluate_full_dataset_reports_arrays_as_lists(tmp_path) -> None:
    run = train(
        tmp_path,
        HP,
        trial_cls=FullDatasetArrays,
        exp_conf={"searcher": {"metric": "validation_loss"}},
        max_length=Batch(1),
    )
    metrics = run.reports("validation")[-1].metrics
    assert metrics == {
        "validation_loss": 0.25,
        "confusion": [[3, 1], [0, 4]],
        "per_class": [0.5, 0.75],
        "history": [1, 2, 3],
        "label": "val",
    }


class VectorPerBatch(LinearTrial):
    reducer: Any = Reducer.AVG

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        b = float(batch_idx)
        return {"validation_loss": b, "errors": torch.tensor([b, b + 2])}

    def evaluation_reducer(self) -> Any:
        return self.reducer


class VectorPerBatchSum(VectorPerBatch):
    reducer = {"validation_loss": Reducer.AVG, "errors": Reducer.SUM}


@pytest.mark.parametrize(("cls", "expected"), [(VectorPerBatch, 1.5), (VectorPerBatchSum, 6.0)])
def test_evaluate_batch_arrays_reduce_over_all_their_numbers(tmp_path, cls, expected) -> None:
    # Two validation batches (8 records, batches of 4): errors [0, 2] and [1, 3].
    run = train(tmp_path, HP, trial_cls=cls, max_length=Batch(1))
    assert run.reports("validation")[-1].metrics["errors"] == expected


class ListSearcherMetric(FullDatasetArrays):
    def evaluate_full_dataset(self, data_loader: Any) -> dict[str, Any]:
        return {"validation_loss": [0.1, 0.2]}


def test_the_searcher_metric_must_be_a_number(tmp_path) -> None:
    match = (
        r"the searcher metric 'validation_loss' that ListSearcherMetric reported is "
        r"\[0.1, 0.2\], not a number; the searcher compares numbers: return a scalar"
    )
    with pytest.raises(TrialDefinitionError, match=match):
        train(
            tmp_path,
            HP,
            trial_cls=ListSearcherMetric,
            exp_conf={"searcher": {"metric": "validation_loss"}},
            max_length=Batch(1),
        )


def test_tensorboard_gets_the_scalars_only(tmp_path) -> None:
    run = train(
        tmp_path,
        HP,
        trial_cls=FullDatasetArrays,
        init_kwargs={"enable_tensorboard_logging": True},
        max_length=Batch(1),
    )
    (event_file,) = (tmp_path / "tensorboard").glob("events.out.tfevents.*")
    data = event_file.read_bytes()
    assert b"Determined/val_validation_loss" not in data  # it starts with "val" already
    assert b"Determined/validation_loss" in data and b"Determined/loss" in data
    assert b"confusion" not in data and b"per_class" not in data
    assert run.reports("validation")[-1].metrics["per_class"] == [0.5, 0.75]
