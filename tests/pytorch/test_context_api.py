"""The rest of Determined's context API: misuse errors, TensorBoard switches and writers, and
``DistributedContext``'s getters."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from api_trials import LinearTrial, train
from torch import nn

from searchlab import pytorch
from searchlab.errors import TrialDefinitionError
from searchlab.pytorch import Batch, DistributedContext, LRScheduler
from searchlab.tensorboard.metric_writers.pytorch import TorchWriter

HP = {"global_batch_size": 4}


def test_a_wrong_hparam_name_is_a_trial_definition_error() -> None:
    ctx = pytorch.PyTorchTrialContext({"lr": 0.1, "width": 8})
    match = (
        r"^hyperparameter 'widht' is not defined; defined ones are \['lr', 'width'\]\. "
        r"Add it to the config's `hyperparameters` section$"
    )
    with pytest.raises(TrialDefinitionError, match=match):
        ctx.get_hparam("widht")
    with pytest.raises(ValueError, match=match):  # what Determined raised, and users catch
        ctx.get_hparam("widht")
    with pytest.raises(TrialDefinitionError, match=r"needs the hyperparameter `global_batch_size`"):
        ctx.get_global_batch_size()


class LateWrapTrial(LinearTrial):
    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        if batch_idx == 1:
            self.context.wrap_model(nn.Linear(3, 1))
        return super().train_batch(batch, epoch_idx, batch_idx)


def test_wrapping_after_training_started(tmp_path) -> None:
    match = (
        r"^wrap_model\(\) was called after training started; wrap every model, optimizer, "
        r"scheduler and scaler in the trial's __init__$"
    )
    with pytest.raises(TrialDefinitionError, match=match):
        train(tmp_path, HP, trial_cls=LateWrapTrial, max_length=Batch(2))


def test_scheduler_mistakes() -> None:
    ctx = pytorch.PyTorchTrialContext(HP)
    model = ctx.wrap_model(nn.Linear(1, 1))
    opt = ctx.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
    with pytest.raises(
        TrialDefinitionError,
        match=r"got a ReduceLROnPlateau with step_mode=StepMode.STEP_EVERY_EPOCH; .*MANUAL_STEP",
    ):
        ctx.wrap_lr_scheduler(plateau, LRScheduler.StepMode.STEP_EVERY_EPOCH)
    wrapped = ctx.wrap_lr_scheduler(plateau, LRScheduler.StepMode.MANUAL_STEP)
    wrapped.step(1.0)  # steps with a metric, as the user calls it
    stray = torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1)
    with pytest.raises(
        TrialDefinitionError, match=r"got a scheduler whose optimizer was not wrapped; build it on"
    ):
        ctx.wrap_lr_scheduler(
            torch.optim.lr_scheduler.StepLR(stray, 1), LRScheduler.StepMode.STEP_EVERY_BATCH
        )
    with pytest.raises(TrialDefinitionError, match=r"frequency is 0, but must be >= 1"):
        ctx.wrap_lr_scheduler(
            torch.optim.lr_scheduler.StepLR(opt, 1), LRScheduler.StepMode.STEP_EVERY_BATCH, 0
        )
    with pytest.raises(TypeError, match=r"wrap_model\(\) got str; pass a torch.nn.Module"):
        ctx.wrap_model("resnet")  # type: ignore[arg-type]


class QuietTrial(LinearTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        super().__init__(context)
        context.set_enable_tensorboard_logging(bool(self.hp["tb"]))


@pytest.mark.parametrize("init_flag", [True, False])
def test_set_enable_tensorboard_logging_overrides_init(tmp_path, init_flag) -> None:
    hp = {**HP, "tb": not init_flag}
    run = train(
        tmp_path,
        hp,
        trial_cls=QuietTrial,
        init_kwargs={"enable_tensorboard_logging": init_flag},
        max_length=Batch(2),
    )
    assert run.context.get_enable_tensorboard_logging() is (not init_flag)
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    if init_flag:  # the trial turned it off
        assert events == []
    else:
        (event_file,) = events
        assert b"Determined/loss" in event_file.read_bytes()
    with pytest.raises(TypeError, match=r"set_enable_tensorboard_logging\(\) got str; pass True"):
        run.context.set_enable_tensorboard_logging("yes")  # type: ignore[arg-type]


class TorchWriterTrial(LinearTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        super().__init__(context)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.logger = TorchWriter()
        self.warned = [str(w.message) for w in caught if w.category is FutureWarning]

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        self.logger.writer.add_scalar("my_metric", float(batch_idx), batch_idx)
        if batch_idx == 0:
            self.logger.reset()  # closes the event file; the next write opens another
        self.logger.add_scalar("my_other_metric", 1.5, batch_idx)
        return super().train_batch(batch, epoch_idx, batch_idx)


def test_torch_writer_writes_into_the_trials_tensorboard_path(tmp_path) -> None:
    run = train(tmp_path, HP, trial_cls=TorchWriterTrial, max_length=Batch(2))
    trial = run.trial
    assert trial.logger.log_dir == run.context.get_tensorboard_path() == tmp_path / "tensorboard"
    assert trial.warned and "TorchWriter() is deprecated" in trial.warned[0]
    trial.logger.flush()
    files = sorted((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert files, "no event file in the trial's TensorBoard directory"
    data = b"".join(f.read_bytes() for f in files)
    assert b"my_metric" in data and b"my_other_metric" in data


def test_distributed_context_getters() -> None:
    d = DistributedContext(rank=5, size=8, local_rank=1, local_size=4, cross_rank=1, cross_size=2)
    assert (d.get_rank(), d.get_size(), d.get_local_rank(), d.get_local_size()) == (5, 8, 1, 4)
    assert (d.get_cross_rank(), d.get_cross_size(), d.get_num_agents()) == (1, 2, 2)
    assert d.is_chief is False
    single = DistributedContext()
    assert single.allgather_local("x") == ["x"] and single.gather_local("x") == ["x"]
    assert single.broadcast_local("x") == "x"


def test_distributed_context_from_torchrun_variables(monkeypatch) -> None:
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("GROUP_RANK", raising=False)
    monkeypatch.delenv("GROUP_WORLD_SIZE", raising=False)
    d = DistributedContext.from_torch_env()
    assert (d.rank, d.size, d.local_rank, d.local_size) == (5, 8, 1, 4)
    assert (d.cross_rank, d.cross_size) == (1, 2)  # 2 machines of 4 workers
    monkeypatch.setenv("GROUP_RANK", "0")
    monkeypatch.setenv("GROUP_WORLD_SIZE", "3")
    d = DistributedContext.from_torch_distributed()  # Determined's name
    assert (d.get_cross_rank(), d.get_num_agents()) == (0, 3)
