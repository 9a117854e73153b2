"""Validation metric reduction: built-in ``Reducer``s per metric, and custom ``MetricReducer``s."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from api_trials import train
from torch import nn
from torch.utils.data import TensorDataset

from searchlab import pytorch
from searchlab.errors import TrialDefinitionError
from searchlab.pytorch import Batch, MetricReducer, Reducer

# Validation records 0..9 in batches of 4: [0..3], [4..7], [8, 9] with means 1.5, 5.5, 8.5.
BATCH_MEANS = [1.5, 5.5, 8.5]


class ExactMean(MetricReducer):
    """The mean over records (not over batches), combined across workers."""

    def reset(self) -> None:
        self.total, self.count = 0.0, 0

    def update(self, values: torch.Tensor) -> None:
        self.total += float(values.sum())
        self.count += values.numel()

    def per_slot_reduce(self) -> tuple[float, int]:
        return self.total, self.count

    def cross_slot_reduce(self, per_slot_metrics: list[Any]) -> float:
        return sum(t for t, _ in per_slot_metrics) / sum(c for _, c in per_slot_metrics)


class Stats(ExactMean):
    """A reducer with several metrics: registered without a name, it returns a dict."""

    def cross_slot_reduce(self, per_slot_metrics: list[Any]) -> dict[str, float]:
        return {"stats_mean": super().cross_slot_reduce(per_slot_metrics), "stats_n": self.count}


class RecordCount(ExactMean):
    def cross_slot_reduce(self, per_slot_metrics: list[Any]) -> float:
        return sum(c for _, c in per_slot_metrics)


class ValuesTrial(pytorch.PyTorchTrial):
    """Trains on records 0..11, validates on records 0..9; metrics are batch means."""

    reducer: Any = Reducer.AVG

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.model = context.wrap_model(nn.Linear(1, 1))
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.01))
        self.exact = context.wrap_reducer(ExactMean(), name="exact_mean", for_training=False)
        self.stats = context.wrap_reducer(Stats(), for_training=False)
        self.train_records = context.wrap_reducer(
            RecordCount(), name="train_records", for_validation=False
        )

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(TensorDataset(torch.arange(12.0).unsqueeze(1)), batch_size=4)

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(TensorDataset(torch.arange(10.0).unsqueeze(1)), batch_size=4)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        (x,) = batch
        loss = nn.functional.mse_loss(self.model(x), x)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        self.train_records.update(x)
        return {"loss": loss}

    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        (x,) = batch
        self.exact.update(x)
        self.stats.update(x)
        m = x.mean()
        return {"m_avg": m, "m_sum": m, "m_max": m, "m_min": m}

    def evaluation_reducer(self) -> Any:
        return self.reducer


class PerMetricTrial(ValuesTrial):
    reducer = {
        "m_avg": Reducer.AVG,
        "m_sum": Reducer.SUM,
        "m_max": Reducer.MAX,
        "m_min": Reducer.MIN,
    }


class AllSumTrial(ValuesTrial):
    reducer = Reducer.SUM


def _validate(tmp_path, trial_cls, **fit: Any):
    fit.setdefault("max_length", Batch(1))
    return train(tmp_path, {"global_batch_size": 4}, trial_cls=trial_cls, **fit)


def test_default_reducer_is_the_unweighted_mean_of_batch_values(tmp_path) -> None:
    metrics = _validate(tmp_path, ValuesTrial).reports("validation")[-1].metrics
    for name in ("m_avg", "m_sum", "m_max", "m_min"):
        assert metrics[name] == pytest.approx(sum(BATCH_MEANS) / 3)  # 5.1667, not 4.5


def test_one_reducer_per_metric(tmp_path) -> None:
    metrics = _validate(tmp_path, PerMetricTrial).reports("validation")[-1].metrics
    assert metrics["m_avg"] == pytest.approx(sum(BATCH_MEANS) / 3)
    assert metrics["m_sum"] == pytest.approx(sum(BATCH_MEANS))
    assert metrics["m_max"] == pytest.approx(max(BATCH_MEANS))
    assert metrics["m_min"] == pytest.approx(min(BATCH_MEANS))


def test_one_reducer_for_all_metrics(tmp_path) -> None:
    metrics = _validate(tmp_path, AllSumTrial).reports("validation")[-1].metrics
    assert metrics["m_avg"] == metrics["m_min"] == pytest.approx(sum(BATCH_MEANS))


def test_custom_reducer_by_name_and_as_dict(tmp_path) -> None:
    run = _validate(tmp_path, ValuesTrial, max_length=Batch(3), validation_period=Batch(1))
    validations = [r.metrics for r in run.reports("validation")]
    assert len(validations) == 3
    for metrics in validations:  # reset before every validation: nothing accumulates
        assert metrics["exact_mean"] == pytest.approx(4.5)
        assert metrics["stats_mean"] == pytest.approx(4.5)
        assert metrics["stats_n"] == 10
        assert "train_records" not in metrics


def test_training_reducer_covers_each_report_window(tmp_path) -> None:
    run = _validate(tmp_path, ValuesTrial, max_length=Batch(3), exp_conf={"scheduling_unit": 2})
    windows = [r.metrics for r in run.reports("training")]
    assert [m["train_records"] for m in windows] == [8, 4]  # batches 0-1, then batch 2
    assert all("exact_mean" not in m for m in windows)


class NotADictReducer(ExactMean):
    def cross_slot_reduce(self, per_slot_metrics: list[Any]) -> float:
        return 1.0


class UnnamedScalarTrial(ValuesTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        super().__init__(context)
        context.wrap_reducer(NotADictReducer(), for_training=False)


def test_unnamed_reducer_must_return_a_dict(tmp_path) -> None:
    match = r"NotADictReducer.cross_slot_reduce\(\) returned float; without a name"
    with pytest.raises(TrialDefinitionError, match=match):
        _validate(tmp_path, UnnamedScalarTrial)


def test_wrap_reducer_rejects_other_objects() -> None:
    ctx = pytorch.PyTorchTrialContext({})
    match = r"wrap_reducer\(\) got int; pass a function of the list of values, or a "
    with pytest.raises(TrialDefinitionError, match=match):
        ctx.wrap_reducer(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"wrap_reducer\(\) got str"):  # as users catch it
        ctx.wrap_reducer("sum")  # type: ignore[arg-type]
    reducer = ExactMean()
    ctx.wrap_reducer(reducer, name="m")
    with pytest.raises(
        TrialDefinitionError, match=r"wrap_reducer\(\) got the same ExactMean twice; wrap each"
    ):
        ctx.wrap_reducer(reducer, name="again")


def median_of(values: list[Any]) -> float:
    """A reducer function, as in Determined's docs: it gets every value given to update()."""
    flat = sorted(float(v) for batch in values for v in batch)
    mid = len(flat) // 2
    return (flat[mid - 1] + flat[mid]) / 2 if len(flat) % 2 == 0 else flat[mid]


class FunctionReducerTrial(ValuesTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        super().__init__(context)
        self.seen: list[list[Any]] = []

        def record_then_count(values: list[Any]) -> dict[str, Any]:
            self.seen.append(list(values))
            return {"updates": len(values), "first": values[0]}

        self.median = context.wrap_reducer(median_of, name="median", for_training=False)
        self.counts = context.wrap_reducer(record_then_count, for_validation=False)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        self.counts.update(batch_idx)
        return super().train_batch(batch, epoch_idx, batch_idx)

    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        (x,) = batch
        self.median.update(x.squeeze(1).tolist())
        return super().evaluate_batch(batch)


def test_wrap_reducer_accepts_a_function(tmp_path) -> None:
    run = _validate(
        tmp_path, FunctionReducerTrial, max_length=Batch(3), exp_conf={"scheduling_unit": 2}
    )
    assert isinstance(run.trial.median, pytorch.SimpleReducer)
    # Validation records 0..9: the function got the three batches' lists, in order.
    assert run.reports("validation")[-1].metrics["median"] == 4.5
    # Training: a dict-valued function without a name reports its keys, per report window.
    windows = [r.metrics for r in run.reports("training")]
    assert [(m["updates"], m["first"]) for m in windows] == [(2, 0), (1, 2)]
    assert run.trial.seen == [[0, 1], [2]]  # reset between windows


def test_simple_reducer_interleaves_the_workers_values() -> None:
    reducer = pytorch.SimpleReducer(lambda values: values)
    # What allgather hands over with two workers: rank 0 saw batches 0, 2, 4; rank 1 saw 1, 3.
    assert reducer.cross_slot_reduce([["b0", "b2", "b4"], ["b1", "b3"]]) == [
        "b0",
        "b1",
        "b2",
        "b3",
        "b4",
    ]


class NamedDictTrial(ValuesTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        super().__init__(context)
        context.wrap_reducer(lambda values: {"a": 1}, name="oops", for_training=False)


def test_a_named_reducer_must_not_return_a_dict(tmp_path) -> None:
    match = r"the reducer function <lambda>\(\) was wrapped with name='oops' but returned a dict"
    with pytest.raises(TrialDefinitionError, match=match):
        _validate(tmp_path, NamedDictTrial)
