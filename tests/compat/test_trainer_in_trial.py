"""``pytorch.init()`` and ``Trainer.fit()`` inside a trial, as Determined 0.38's scripts use them.

A fake actor (``fake_actor.FakeActor``) stands for the trial's Ray actor and answers each
report; the script side runs in the test process.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest
from determined_fixtures import OneVarTrial
from fake_actor import FakeActor

import searchlab as det
from searchlab import pytorch
from searchlab.core._channel import Action, Failure, Message, Report, Stored
from searchlab.errors import TrialDefinitionError

HPARAMS = {"lr": 0.1, "global_batch_size": 2, "momentum": 0.9}
CONFIG = {"searcher": {"name": "adaptive_asha", "metric": "validation_loss"}, "scheduling_unit": 2}


SIX_BATCHES = pytorch.Batch(6)


def _script(max_length: Any = SIX_BATCHES, **fit: Any) -> OneVarTrial:
    """Determined's tutorial run(): the trial's hparams and latest checkpoint from the info."""
    info = det.get_cluster_info()
    with pytorch.init() as train_context:
        trial = OneVarTrial(train_context)
        trainer = pytorch.Trainer(trial, train_context)
        trainer.fit(max_length=max_length, latest_checkpoint=info.latest_checkpoint, **fit)
    return trial


def _actor(tmp_path: pathlib.Path, monkeypatch: Any, **kwargs: Any) -> FakeActor:
    kwargs.setdefault("hparams", HPARAMS)
    kwargs.setdefault("config", CONFIG)
    kwargs.setdefault("rung_ends", [3, 6])
    return FakeActor(tmp_path, monkeypatch, **kwargs)


def _preempt_at_rung(length: int) -> Any:
    def policy(message: Message) -> Action:
        at = isinstance(message, Report) and message.searcher_length == length
        return Action.PREEMPT if at else Action.GO

    return policy


def _straight_weights(tmp_path: pathlib.Path, monkeypatch: Any) -> list[float]:
    monkeypatch.delenv("SEARCHLAB_CLUSTER_INFO", raising=False)
    with pytorch.init(hparams=HPARAMS, exp_conf=CONFIG, checkpoint_dir=tmp_path) as context:
        trial = OneVarTrial(context)
        pytorch.Trainer(trial, context).fit(max_length=pytorch.Batch(6))
    return trial.weights


def test_fit_validates_at_rung_ends_pauses_and_the_next_run_goes_on_exactly(
    tmp_path, monkeypatch
) -> None:
    first = _actor(tmp_path / "run1", monkeypatch, policy=_preempt_at_rung(3))
    before = _script(validation_period=pytorch.Batch(4))
    messages = first.finish()
    reports = [(m.group, m.batches, m.searcher_length) for m in messages if isinstance(m, Report)]
    # A validation at the rung end (3) although the script validates every 4 batches.
    assert reports == [("training", 2, None), ("training", 3, None), ("validation", 3, 3)]
    paused_at = next(m for m in messages if isinstance(m, Report) and m.searcher_length == 3)
    assert paused_at.checkpoint is not None  # the best validation so far: checkpointed there
    assert len(before.weights) == 3

    second = _actor(
        tmp_path / "run2",
        monkeypatch,
        next_rung=1,
        latest_checkpoint=paused_at.checkpoint,
        run=2,
    )
    after = _script(validation_period=pytorch.Batch(4))
    reports = [(r.group, r.batches, r.searcher_length) for r in second.reports()]
    assert reports == [
        ("training", 4, None),
        ("validation", 4, None),  # the script's own validation period
        ("training", 6, None),
        ("validation", 6, 6),  # the last rung end: the script's max_length
    ]
    second.finish()
    assert before.weights + after.weights == _straight_weights(tmp_path / "straight", monkeypatch)


def test_a_checkpoint_request_is_answered_at_the_reported_batch(tmp_path, monkeypatch) -> None:
    def policy(message: Message) -> Action:
        asked = isinstance(message, Report) and message.batches == 2
        return Action.CHECKPOINT if asked else Action.GO

    actor = _actor(tmp_path, monkeypatch, policy=policy)
    _script()
    messages = actor.finish()
    stored = [m for m in messages if isinstance(m, Stored)]
    assert [s.batches for s in stored] == [2]
    meta = json.loads((pathlib.Path(stored[0].path) / "metadata.json").read_text())
    assert (meta["batches_trained"], meta["steps_completed"]) == (2, 2)
    assert pathlib.Path(stored[0].path).parent == actor.checkpoint_dir
    assert [r.batches for r in actor.reports("validation")] == [3, 6]  # it went on after


def test_init_in_a_trial_is_the_trials_context(tmp_path, monkeypatch) -> None:
    actor = _actor(tmp_path, monkeypatch)
    with pytorch.init() as context:
        assert context.get_hparams() == HPARAMS
        assert context.get_trial_seed() == 1234
        assert context.get_trial_id() == "abc_00002"
        assert context.get_experiment_config() == CONFIG
        assert context.get_tensorboard_path() == tmp_path / "tensorboard"
    actor.finish()
    info = det.get_cluster_info()
    assert (info.trial.trial_id, info.trial.experiment_id, info.container_rank) == (3, 77, 0)
    assert info.user_data == {}


def test_fit_without_max_length_trains_to_the_searchers_length(tmp_path, monkeypatch) -> None:
    actor = _actor(tmp_path, monkeypatch)
    with pytest.warns(FutureWarning, match="max_length"):
        trial = _script(max_length=None)
    actor.finish()
    assert len(trial.weights) == 6
    lengthless = _actor(tmp_path / "b", monkeypatch, rung_ends=[2**62], script_length=True)
    with pytest.raises(ValueError, match=r"fit\(max_length=X\) must be set"):
        _script(max_length=None)
    lengthless.finish()


def test_test_mode_is_for_running_by_hand(tmp_path, monkeypatch) -> None:
    actor = _actor(tmp_path, monkeypatch)
    with pytest.raises(ValueError, match="test_mode"):
        _script(test_mode=True)
    actor.finish()


class NoMetricTrial(OneVarTrial):
    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        return {"accuracy": 1.0}


def test_a_missing_searcher_metric_is_fatal_for_the_experiment(tmp_path, monkeypatch) -> None:
    actor = _actor(tmp_path, monkeypatch)
    with pytest.raises(TrialDefinitionError, match="the searcher metric 'validation_loss'"):
        with pytorch.init() as context:
            pytorch.Trainer(NoMetricTrial(context), context).fit(max_length=pytorch.Batch(6))
    failures = [m for m in actor.finish() if isinstance(m, Failure)]
    assert [f.kind for f in failures] == ["fatal"]
    assert "the searcher metric 'validation_loss'" in failures[0].message


class InvalidTrial(OneVarTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        raise det.InvalidHP("lr too large")


def test_invalid_hp_replaces_the_trial(tmp_path, monkeypatch) -> None:
    actor = _actor(tmp_path, monkeypatch)
    with pytest.raises(SystemExit) as exited, pytorch.init() as context:
        InvalidTrial(context)
    assert exited.value.code == 0
    assert [(f.kind, f.message) for f in actor.finish() if isinstance(f, Failure)] == [
        ("invalid_hp", "lr too large")
    ]


def test_several_slots_need_the_launcher(tmp_path, monkeypatch) -> None:
    actor = _actor(tmp_path, monkeypatch)
    info = det.get_cluster_info()
    monkeypatch.setattr(info, "slot_ids", [0, 1])
    with pytest.raises(TrialDefinitionError, match=r"searchlab\.launch\.torch_distributed"):
        with pytorch.init():
            pass
    assert [f.kind for f in actor.finish() if isinstance(f, Failure)] == ["fatal"]
