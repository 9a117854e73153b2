"""What Determined's documentation says a PyTorchTrial computes, checked on a trial simple enough
to work out by hand (``determined_fixtures.OneVarTrial``: SGD on ``mean(w * x)``, so each
update moves ``w`` by ``-lr * gradient`` with the batch gradients 1.5, 3.5, 5.5, 7.5, ...).

Every expected weight below is written as the sum Determined's documentation implies.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from determined_fixtures import OneVarTrial, gradient, weight

from searchlab import pytorch

LR = 0.1


@pytest.fixture(autouse=True)
def _run_by_hand(monkeypatch) -> None:
    monkeypatch.delenv("SEARCHLAB_CLUSTER_INFO", raising=False)


def _fit(
    tmp_path,
    hparams: dict[str, Any],
    *,
    aggregation_frequency: int = 1,
    trial_cls: type[OneVarTrial] = OneVarTrial,
    **fit: Any,
) -> tuple[OneVarTrial, pytorch.Trainer, str | None]:
    hparams = {"lr": LR, "global_batch_size": 2, **hparams}
    fit.setdefault("max_length", pytorch.Batch(6))
    with pytorch.init(
        hparams=hparams,
        exp_conf={"searcher": {"metric": "validation_loss"}},
        aggregation_frequency=aggregation_frequency,
        checkpoint_dir=tmp_path / "ckpt",
    ) as context:
        trial = trial_cls(context)
        trainer = pytorch.Trainer(trial, context)
        path = trainer.fit(**fit)
    return trial, trainer, path


def test_plain_sgd_moves_the_weight_by_each_batch_gradient(tmp_path) -> None:
    trial, _, _ = _fit(tmp_path, {})
    expected = [-LR * sum(gradient(b) for b in range(n + 1)) for n in range(6)]
    assert trial.weights == pytest.approx(expected)
    assert weight(trial) == pytest.approx(-2.3)


@pytest.mark.parametrize(
    ("mode", "lr_of_batch"),
    [
        # StepLR(gamma=0.5) stepped after every batch: batch b trains with LR * 0.5**b.
        ("STEP_EVERY_BATCH", lambda b: LR * 0.5**b),
        # ... after every epoch (4 batches): epoch e trains with LR * 0.5**e.
        ("STEP_EVERY_EPOCH", lambda b: LR * 0.5 ** (b // 4)),
        # ... only when the trial steps it: never here.
        ("MANUAL_STEP", lambda b: LR),
        # ... after every optimizer step, which is every batch without aggregation.
        ("STEP_EVERY_OPTIMIZER_STEP", lambda b: LR * 0.5**b),
    ],
)
def test_lr_scheduler_step_modes(tmp_path, mode: str, lr_of_batch: Any) -> None:
    trial, _, _ = _fit(tmp_path, {"step_mode": mode})
    assert weight(trial) == pytest.approx(-sum(lr_of_batch(b) * gradient(b) for b in range(6)))


def test_aggregation_frequency_averages_the_gradients_of_each_window(tmp_path) -> None:
    trial, _, _ = _fit(tmp_path, {}, aggregation_frequency=2)
    # Three updates, each with the mean gradient of two batches.
    steps = [(gradient(2 * k) + gradient(2 * k + 1)) / 2 for k in range(3)]
    assert steps == [2.5, 6.5, 2.5]
    assert weight(trial) == pytest.approx(-LR * sum(steps))
    assert trial.weights == pytest.approx([0.0, -0.25, -0.25, -0.9, -0.9, -1.15])


def test_step_every_optimizer_step_counts_updates_not_batches(tmp_path) -> None:
    trial, _, _ = _fit(
        tmp_path, {"step_mode": "STEP_EVERY_OPTIMIZER_STEP"}, aggregation_frequency=2
    )
    # Update k uses LR * 0.5**k and the mean gradient of batches 2k and 2k+1.
    assert weight(trial) == pytest.approx(-(LR * 2.5 + LR / 2 * 6.5 + LR / 4 * 2.5))


def test_step_every_batch_with_aggregation_takes_the_lr_of_each_updates_first_batch(
    tmp_path,
) -> None:
    trial, _, _ = _fit(tmp_path, {"step_mode": "STEP_EVERY_BATCH"}, aggregation_frequency=2)
    # The scheduler catches up two steps per update: updates use LR * 0.5**(2k).
    assert weight(trial) == pytest.approx(-(LR * 2.5 + LR / 4 * 6.5 + LR / 16 * 2.5))


def test_clip_grads_clips_before_the_step(tmp_path) -> None:
    trial, _, _ = _fit(tmp_path, {"clip": 1.0})
    assert weight(trial) == pytest.approx(-LR * 1.0 * 6)  # every gradient is above 1.0
    clipped, _, _ = _fit(tmp_path / "agg", {"clip": 1.0}, aggregation_frequency=2)
    assert weight(clipped) == pytest.approx(-LR * 1.0 * 3)  # clipped after averaging


class ReducerTrial(OneVarTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        super().__init__(context)
        self.median = context.wrap_reducer(
            lambda batches: sorted(v for b in batches for v in b)[len(batches)],
            name="median",
            for_training=False,
        )

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        (x,) = batch
        self.median.update(x.squeeze(1).tolist())
        m = x.mean().item()
        return {"validation_loss": 0.0, "m_avg": m, "m_sum": m, "m_max": m, "m_min": m}

    def evaluation_reducer(self) -> Any:
        return {
            "m_avg": pytorch.Reducer.AVG,
            "m_sum": pytorch.Reducer.SUM,
            "m_max": pytorch.Reducer.MAX,
            "m_min": pytorch.Reducer.MIN,
        }


def test_reducers_combine_the_batch_values(tmp_path) -> None:
    _, trainer, _ = _fit(tmp_path, {}, trial_cls=ReducerTrial, max_length=pytorch.Batch(1))
    metrics = [r for r in trainer.reports if r.group == "validation"][-1].metrics
    # Validation batches [1, 2], [3, 4], [5, 6], [7, 8]: means 1.5, 3.5, 5.5, 7.5.
    assert metrics["m_avg"] == pytest.approx(4.5)
    assert metrics["m_sum"] == pytest.approx(18.0)
    assert metrics["m_max"] == pytest.approx(7.5)
    assert metrics["m_min"] == pytest.approx(1.5)
    assert metrics["median"] == 5.0  # the function saw every batch's values: 1..8


def test_callbacks_fire_at_the_boundaries_determined_has(tmp_path) -> None:
    trial, _, _ = _fit(
        tmp_path,
        {},
        validation_period=pytorch.Batch(2),
        checkpoint_period=pytorch.Batch(3),
        checkpoint_policy="none",
    )
    calls = trial.callback.calls
    assert dict(calls) == {
        "on_trial_startup": 1,
        "on_training_start": 1,
        "on_training_epoch_start": 2,  # batches 0 and 4 start epochs 0 and 1
        "on_training_epoch_end": 1,  # after batch 3
        "on_validation_start": 3,  # after batches 2, 4 and 6
        "on_validation_end": 3,
        "on_checkpoint_save_start": 2,  # after batches 3 and 6
        "on_checkpoint_end": 2,
        # A training workload ends at each validation and checkpoint: batches 2, 3, 4, 6.
        "on_training_workload_end": 4,
        "on_trial_shutdown": 1,
    }
    assert trial.callback.epochs_started == [0, 1]
    assert trial.callback.workload_batches == [2, 1, 1, 2]


def test_checkpoint_then_resume_equals_training_straight_through(tmp_path) -> None:
    hparams = {"momentum": 0.9, "step_mode": "STEP_EVERY_BATCH"}
    straight, _, _ = _fit(tmp_path / "a", hparams, validation_period=pytorch.Batch(2))
    first, _, path = _fit(
        tmp_path / "b",
        hparams,
        max_length=pytorch.Batch(3),
        validation_period=pytorch.Batch(2),
        checkpoint_period=pytorch.Batch(3),
    )
    assert path is not None
    resumed, _, _ = _fit(
        tmp_path / "c", hparams, validation_period=pytorch.Batch(2), latest_checkpoint=path
    )
    assert first.weights + resumed.weights == straight.weights  # bit for bit, batch by batch
    momentum = [s["momentum_buffer"] for s in resumed.opt.state.values()]
    assert momentum == [s["momentum_buffer"] for s in straight.opt.state.values()]
    assert resumed.sched.get_last_lr() == straight.sched.get_last_lr()
    # Its count came with the checkpoint: 2 and 3 (where the first fit ended), then 4 and 6.
    assert resumed.callback.calls["on_validation_end"] == 4
    assert not math.isclose(weight(first), weight(straight))
