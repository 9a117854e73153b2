"""``PyTorchTrialContext``: hyperparameters, batch sizes, devices, positions, distributed info."""

from __future__ import annotations

import collections
from typing import Any

import pytest
import torch
from api_trials import LinearTrial, regression_data, train

from searchlab import pytorch
from searchlab.pytorch import Batch, DistributedContext


def test_hyperparameters_and_config() -> None:
    conf = {"data": {"url": "file:///data"}, "name": "exp"}
    ctx = pytorch.PyTorchTrialContext(
        {"lr": 0.1, "optimizer": {"name": "sgd", "momentum": 0.9}},
        exp_conf=conf,
        trial_seed=42,
        trial_id="t-7",
        experiment_id="exp-1",
    )
    assert ctx.get_hparam("optimizer")["momentum"] == 0.9  # nested groups are dicts
    assert ctx.get_hparams() == {"lr": 0.1, "optimizer": {"name": "sgd", "momentum": 0.9}}
    assert ctx.get_experiment_config() == conf
    assert ctx.get_data_config() == {"url": "file:///data"}
    assert (ctx.get_trial_seed(), ctx.get_trial_id(), ctx.get_experiment_id()) == (
        42,
        "t-7",
        "exp-1",
    )
    with pytest.raises(
        ValueError,
        match=r"hyperparameter 'width' is not defined; defined ones are \['lr', 'optimizer'\]",
    ):
        ctx.get_hparam("width")


def test_batch_sizes_on_one_slot() -> None:
    ctx = pytorch.PyTorchTrialContext({"global_batch_size": 32})
    assert ctx.get_global_batch_size() == ctx.get_per_slot_batch_size() == 32


def test_per_slot_batch_size_splits_the_global_batch() -> None:
    ctx = pytorch.PyTorchTrialContext(
        {"global_batch_size": 8}, distributed=DistributedContext(0, 3)
    )
    with pytest.warns(
        UserWarning,
        match="global_batch_size 8 is not divisible by slots_per_trial 3; each worker uses 2",
    ):
        assert ctx.get_per_slot_batch_size() == 2
    small = pytorch.PyTorchTrialContext(
        {"global_batch_size": 2}, distributed=DistributedContext(0, 4)
    )
    with pytest.raises(
        ValueError, match=r"global_batch_size is 2, but must be >= slots_per_trial \(4\)"
    ):
        small.get_per_slot_batch_size()


def test_distributed_info_of_a_single_process(tmp_path) -> None:
    with pytorch.init(hparams={}, checkpoint_dir=tmp_path, enable_tensorboard_logging=False) as ctx:
        d = ctx.distributed
        assert (d.rank, d.size, d.local_rank, d.local_size, d.cross_rank, d.cross_size) == (
            0,
            1,
            0,
            1,
            0,
            1,
        )
        assert (d.get_rank(), d.get_size(), d.get_local_rank(), d.get_local_size()) == (0, 1, 0, 1)
        assert (d.get_cross_rank(), d.get_cross_size(), d.is_chief) == (0, 1, True)
        # Collectives are the identity with one worker.
        assert d.allgather({"n": 3}) == [{"n": 3}]
        assert d.gather(5) == [5]
        assert d.broadcast("x") == "x"
        d.barrier()
        assert ctx.device == torch.device("cpu")


def test_distributed_context_checks_rank() -> None:
    with pytest.raises(ValueError, match=r"rank is 2, but must be in \[0, size=2\)"):
        DistributedContext(rank=2, size=2)


Pair = collections.namedtuple("Pair", ["x", "y"])


def test_to_device_moves_every_tensor_in_nested_batches() -> None:
    batch = {
        "a": torch.ones(2),
        "b": [torch.zeros(1), (torch.ones(1), "label")],
        "p": Pair(torch.ones(1), 3),
    }
    moved = pytorch.to_device(batch, torch.device("meta"))
    assert moved["a"].device.type == "meta"
    assert moved["b"][0].device.type == "meta" and isinstance(moved["b"], list)
    assert moved["b"][1][0].device.type == "meta" and moved["b"][1][1] == "label"
    assert isinstance(moved["p"], Pair) and moved["p"].x.device.type == "meta" and moved["p"].y == 3
    assert batch["a"].device.type == "cpu"  # the input is not modified


class Movable:
    """A custom batch type: searchlab moves anything with a ``.to(device)`` method."""

    def __init__(self, x: torch.Tensor, moved: bool = False) -> None:
        self.x, self.moved = x, moved

    def to(self, device: torch.device) -> Movable:
        return Movable(self.x.to(device), moved=True)


def collate_movable(items: list[Any]) -> Movable:
    return Movable(torch.stack([x for x, _ in items]))


class MovableTrial(LinearTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        if context.get_hparams().get("no_auto"):
            context.experimental.disable_auto_to_device()
        super().__init__(context)
        self.moved: list[bool] = []

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(regression_data(8), batch_size=4, collate_fn=collate_movable)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        self.moved.append(batch.moved)
        loss = self.model(batch.x).pow(2).mean()
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return {"loss": loss}


@pytest.mark.parametrize(("no_auto", "expected"), [(False, [True, True]), (True, [False, False])])
def test_batches_go_to_the_device_unless_disabled(tmp_path, no_auto, expected) -> None:
    hp = {"global_batch_size": 4, "no_auto": no_auto}
    run = train(tmp_path, hp, trial_cls=MovableTrial, max_length=Batch(2))
    assert run.trial.moved == expected


class PositionTrial(LinearTrial):
    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        c = self.context
        self.positions = getattr(self, "positions", [])
        self.positions.append(
            (
                c.current_train_epoch(),
                c.current_train_batch(),
                c.is_epoch_start(),
                c.is_epoch_end(),
                c.get_initial_batch(),
            )
        )
        return super().train_batch(batch, epoch_idx, batch_idx)


def test_epoch_and_batch_position(tmp_path) -> None:
    hp = {"global_batch_size": 4, "n_train": 12}  # 3 batches an epoch
    run = train(tmp_path / "a", hp, trial_cls=PositionTrial, max_length=Batch(4))
    assert run.trial.positions == [
        (0, 0, True, False, 0),
        (0, 1, False, False, 0),
        (0, 2, False, True, 0),
        (1, 3, True, False, 0),
    ]
    assert run.trial.indices == [(0, 0), (0, 1), (0, 2), (1, 3)]  # epoch_idx, global batch_idx
    resumed = train(
        tmp_path / "b", hp, trial_cls=PositionTrial, max_length=Batch(6), latest_checkpoint=run.path
    )
    assert resumed.trial.positions == [(1, 4, False, False, 4), (1, 5, False, True, 4)]
    assert resumed.trial.indices == [(1, 4), (1, 5)]


def test_stop_request_flag() -> None:
    ctx = pytorch.PyTorchTrialContext({})
    assert ctx.get_stop_requested() is False
    ctx.set_stop_requested(True)
    assert ctx.get_stop_requested() is True
    ctx.set_stop_requested(False)
    assert ctx.get_stop_requested() is False


def test_tensorboard_writer_writes_an_event_file(tmp_path) -> None:
    ctx = pytorch.PyTorchTrialContext({}, tensorboard_path=tmp_path / "tb")
    assert ctx.get_tensorboard_path() == tmp_path / "tb"
    writer = ctx.get_tensorboard_writer()
    assert ctx.get_tensorboard_writer() is writer
    writer.add_scalar("my/metric", 1.5, 3)
    ctx.close()
    (event_file,) = (tmp_path / "tb").glob("events.out.tfevents.*")
    assert b"my/metric" in event_file.read_bytes()


def test_trainer_logs_metrics_to_tensorboard_when_enabled(tmp_path) -> None:
    hp = {"global_batch_size": 4}
    train(
        tmp_path / "on", hp, init_kwargs={"enable_tensorboard_logging": True}, max_length=Batch(2)
    )
    (event_file,) = (tmp_path / "on" / "tensorboard").glob("events.out.tfevents.*")
    data = event_file.read_bytes()
    assert b"Determined/loss" in data and b"Determined/validation_loss" in data
    train(tmp_path / "off", hp, max_length=Batch(2))
    assert not (tmp_path / "off" / "tensorboard").exists()


def test_a_closed_trial_frees_its_model_and_optimizer_without_a_garbage_collection(
    tmp_path,
) -> None:
    # What a reused actor's next trial and a parked trial rely on: the memory (on a GPU) of
    # a closed trial goes back at once, not at the next garbage collection.
    import gc
    import weakref

    import runner_steps as steps

    class Holder(pytorch.PyTorchCallback):  # a user's callback that keeps its trial
        def __init__(self, trial: Any) -> None:
            self.trial = trial

    runner = steps.toy_runner(tmp_path, "closed", unit=2)
    runner.step()
    assert runner.loop is not None
    runner.loop.callbacks["holder"] = Holder(runner.loop.trial)
    context = runner.loop.context
    experimental = context.experimental
    refs = [weakref.ref(x) for x in (context, context.models[0], context.optimizers[0])]
    del context
    gc.disable()
    try:
        runner.close()
        assert [ref() for ref in refs] == [None, None, None]
    finally:
        gc.enable()
    with pytest.raises(RuntimeError, match="used after its trial's context ended"):
        experimental.use_amp()
