"""Every error a user can cause names the cause and the fix."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest
import torch
from api_trials import LinearTrial, regression_data, train
from torch import nn

from searchlab import pytorch
from searchlab.errors import CheckpointError, TrialDefinitionError
from searchlab.pytorch import Batch, Epoch, Record, TrainUnit
from searchlab.pytorch._loop import LoopSettings, TrialLoop

HP = {"global_batch_size": 4}


class NoModelTrial(LinearTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context, self.hp = context, context.get_hparams()
        self.model = nn.Linear(3, 1)  # not wrapped


class BothEvaluateTrial(LinearTrial):
    def evaluate_full_dataset(self, data_loader: Any) -> dict[str, Any]:
        return {"x": 1.0}


class NeitherEvaluateTrial(LinearTrial):
    evaluate_batch = pytorch.PyTorchTrial.evaluate_batch


def test_no_wrapped_model(tmp_path) -> None:
    with pytest.raises(
        TrialDefinitionError,
        match=r"NoModelTrial has no model: must have at least one model.*wrap_model\(\)",
    ):
        train(tmp_path, HP, trial_cls=NoModelTrial, max_length=1)


@pytest.mark.parametrize(
    ("cls", "which"), [(BothEvaluateTrial, "both"), (NeitherEvaluateTrial, "neither")]
)
def test_exactly_one_evaluate_method(tmp_path, cls, which) -> None:
    match = rf"{cls.__name__} defines {which} of evaluate_batch\(\) and evaluate_full_dataset\(\); define exactly one"
    with pytest.raises(TrialDefinitionError, match=match):
        train(tmp_path, HP, trial_cls=cls, max_length=1)


class ListTrainResult(LinearTrial):
    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        return [super().train_batch(batch, epoch_idx, batch_idx)["loss"]]


class StringMetric(LinearTrial):
    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        return {"validation_loss": 1.0, "label": "good"}


class ObjectMetric(LinearTrial):
    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        return {**super().train_batch(batch, epoch_idx, batch_idx), "model": [self.model]}


@pytest.mark.parametrize(
    ("cls", "match"),
    [
        (
            ListTrainResult,
            r"ListTrainResult.train_batch\(\) returned list; it must return a dict of metrics",
        ),
        (
            StringMetric,
            r"StringMetric.evaluate_batch\(\) returned metric 'label' whose values are not "
            r"numbers of one shape, so its reducer cannot combine them",
        ),
        (
            ObjectMetric,
            r"ObjectMetric.train_batch\(\) returned metric 'model' holding a Linear; metrics "
            r"must be numbers, tensors, numpy arrays, strings or lists/dicts of them",
        ),
    ],
)
def test_metrics_that_cannot_be_reported(tmp_path, cls, match) -> None:
    with pytest.raises(TrialDefinitionError, match=match):
        train(tmp_path, HP, trial_cls=cls, max_length=1)


class TorchLoaderTrial(LinearTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        super().__init__(context)
        if self.hp.get("opt_out"):
            context.experimental.disable_dataset_reproducibility_checks()

    def build_training_data_loader(self) -> Any:
        return torch.utils.data.DataLoader(regression_data(12), batch_size=4)


class TorchValidationLoaderTrial(LinearTrial):
    def build_validation_data_loader(self) -> Any:
        return torch.utils.data.DataLoader(regression_data(8), batch_size=4)


def test_bare_torch_loader_needs_opting_out(tmp_path) -> None:
    match = r"TorchLoaderTrial.build_training_data_loader\(\) returned a torch.utils.data.DataLoader; return searchlab.pytorch.DataLoader .*disable_dataset_reproducibility_checks\(\)"
    with pytest.raises(TrialDefinitionError, match=match):
        train(tmp_path, HP, trial_cls=TorchLoaderTrial, max_length=1)
    with pytest.raises(
        TrialDefinitionError,
        match=r"TorchValidationLoaderTrial.build_validation_data_loader\(\) returned a torch",
    ):
        train(tmp_path, HP, trial_cls=TorchValidationLoaderTrial, max_length=1)


def test_opting_out_trains_on_the_torch_loader_and_resumes(tmp_path) -> None:
    hp = {**HP, "opt_out": True}
    whole = train(tmp_path / "w", hp, trial_cls=TorchLoaderTrial, max_length=Batch(5))
    first = train(tmp_path / "a", hp, trial_cls=TorchLoaderTrial, max_length=Batch(2))
    second = train(
        tmp_path / "b",
        hp,
        trial_cls=TorchLoaderTrial,
        max_length=Batch(5),
        latest_checkpoint=first.path,
    )
    assert whole.trial.indices == [(0, 0), (0, 1), (0, 2), (1, 3), (1, 4)]  # 3 batches an epoch
    assert torch.equal(second.trial.weights[-1], whole.trial.weights[-1])  # unshuffled: exact


class NotALoaderTrial(LinearTrial):
    def build_training_data_loader(self) -> Any:
        return [torch.zeros(3)]


def test_loader_of_another_type(tmp_path) -> None:
    with pytest.raises(
        TrialDefinitionError, match=r"returned list; it must return a searchlab.pytorch.DataLoader"
    ):
        train(tmp_path, HP, trial_cls=NotALoaderTrial, max_length=1)


class DropLastTrial(LinearTrial):
    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(regression_data(3), batch_size=4, drop_last=True)


def test_empty_training_loader(tmp_path) -> None:
    with pytest.raises(
        TrialDefinitionError, match=r"LinearTrial.build_training_data_loader\(\) yields no batches"
    ):
        train(tmp_path, {**HP, "n_train": 0}, max_length=1)
    with pytest.raises(
        TrialDefinitionError,
        match=r"DropLastTrial.build_training_data_loader.* yields no batches; check",
    ):
        train(tmp_path, HP, trial_cls=DropLastTrial, max_length=1)


def test_missing_global_batch_size(tmp_path) -> None:
    with pytest.raises(
        ValueError,
        match=r"get_global_batch_size\(\) needs the hyperparameter `global_batch_size`; add it",
    ):
        train(tmp_path, {"n_train": 8}, max_length=1)
    with pytest.raises(
        ValueError, match=r"Record\(20\) needs the hyperparameter `global_batch_size`"
    ):
        Record(20).to_batches(epoch_len=4, global_batch_size=None)


def test_searcher_metric_missing_from_loop_settings(tmp_path) -> None:
    ctx = pytorch.PyTorchTrialContext(HP)
    loop = TrialLoop(LinearTrial(ctx), ctx, LoopSettings(searcher_metric="accuracy"))
    loop.target = 1
    match = r"the searcher metric 'accuracy' is not among the validation metrics \['validation_loss'\] that LinearTrial reported"
    with pytest.raises(TrialDefinitionError, match=match):
        list(loop.run())


def test_searcher_metric_missing_from_experiment_config(tmp_path) -> None:
    conf = {"searcher": {"name": "single", "metric": "val_acc"}}
    match = r"searcher metric 'val_acc' is not among the validation metrics \['score', 'validation_loss'\].*change searcher.metric"
    with pytest.raises(TrialDefinitionError, match=match):
        train(tmp_path, {**HP, "val_sequence": [1.0]}, exp_conf=conf, max_length=1)


def _checkpoint(tmp_path: pathlib.Path) -> pathlib.Path:
    return pathlib.Path(train(tmp_path / "src", HP, max_length=Batch(2)).path)


def test_corrupt_or_truncated_state_dict(tmp_path) -> None:
    ckpt = _checkpoint(tmp_path)
    state_file = ckpt / "state-dict.pth"
    data = state_file.read_bytes()
    state_file.write_bytes(data[: len(data) // 2])
    with pytest.raises(
        CheckpointError,
        match=r"state-dict.pth: cannot be read \(.*\); the file is truncated or corrupt",
    ):
        train(tmp_path / "t", HP, max_length=Batch(4), latest_checkpoint=str(ckpt))
    state_file.write_bytes(b"not a pickle at all")
    with pytest.raises(
        CheckpointError, match="truncated or corrupt, resume from an earlier checkpoint"
    ):
        pytorch.load_checkpoint(ckpt)


def test_not_a_checkpoint_directory(tmp_path) -> None:
    (tmp_path / "empty").mkdir()
    match = r"empty: not a checkpoint: it holds neither state-dict.pth nor state_dict.pth; pass the directory"
    with pytest.raises(CheckpointError, match=match):
        train(tmp_path / "t", HP, max_length=1, latest_checkpoint=str(tmp_path / "empty"))
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        pytorch.load_checkpoint(tmp_path / "missing")


def test_state_file_of_the_wrong_kind(tmp_path) -> None:
    (tmp_path / "a").mkdir()
    torch.save([1, 2], tmp_path / "a" / "state-dict.pth")
    with pytest.raises(CheckpointError, match="holds list, not a trial's state dict"):
        pytorch.load_checkpoint(tmp_path / "a")
    torch.save({"weights": 1}, tmp_path / "a" / "state-dict.pth")
    with pytest.raises(
        CheckpointError, match="has no `models_state_dict`; it was not written by a trial"
    ):
        pytorch.load_checkpoint(tmp_path / "a")


def test_unreadable_metadata(tmp_path) -> None:
    ckpt = _checkpoint(tmp_path)
    (ckpt / "metadata.json").write_text("{broken")
    with pytest.raises(CheckpointError, match=r"metadata.json: cannot be read as JSON"):
        pytorch.load_checkpoint(ckpt)


class TwoModelTrial(LinearTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        super().__init__(context)
        context.wrap_model(nn.Linear(3, 1))


def test_checkpoint_of_another_trial_class(tmp_path) -> None:
    ckpt = _checkpoint(tmp_path)
    with pytest.raises(
        CheckpointError,
        match=r"holds 1 model\(s\) but the trial wrapped 2; it was written by a different trial class",
    ):
        train(
            tmp_path / "t", HP, trial_cls=TwoModelTrial, max_length=4, latest_checkpoint=str(ckpt)
        )


def test_wrapping_mistakes() -> None:
    ctx = pytorch.PyTorchTrialContext(HP)
    opt = torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1)
    with pytest.raises(
        TrialDefinitionError, match=r"wrap_optimizer\(\) was called before wrap_model\(\)"
    ):
        ctx.wrap_optimizer(opt)
    ctx.wrap_model(nn.Linear(1, 1))
    with pytest.raises(ValueError, match="backward_passes_per_step is 0, but must be >= 1"):
        ctx.wrap_optimizer(opt, backward_passes_per_step=0)
    with pytest.raises(
        TrialDefinitionError, match=r"step_optimizer\(\) got an optimizer that was not wrapped"
    ):
        ctx.step_optimizer(opt)
    with pytest.raises(ValueError, match="aggregation_frequency is 0, but must be >= 1"):
        pytorch.PyTorchTrialContext(HP, aggregation_frequency=0)


class NotATrial:
    pass


def test_trainer_and_loop_arguments(tmp_path) -> None:
    ctx = pytorch.PyTorchTrialContext(HP)
    trial = LinearTrial(ctx)
    with pytest.raises(
        TrialDefinitionError, match=r"NotATrial does not subclass searchlab\.pytorch\.PyTorchTrial"
    ):
        TrialLoop(NotATrial(), ctx, LoopSettings())  # type: ignore[arg-type]
    with pytest.raises(TrialDefinitionError, match=r"Trainer\(trial, context\) needs the context"):
        pytorch.Trainer(NotATrial(), None)  # type: ignore[arg-type]
    trainer = pytorch.Trainer(trial)  # the trial's own `context` attribute
    with pytest.raises(ValueError, match=r"fit\(\) needs max_length, e.g. max_length=Batch\(100\)"):
        trainer.fit()
    with pytest.raises(
        ValueError, match="checkpoint_policy is 'latest', but must be 'best', 'all' or 'none'"
    ):
        trainer.fit(max_length=Batch(1), checkpoint_policy="latest")


def test_length_errors() -> None:
    with pytest.raises(ValueError, match=r"Batch\(-1\): the length must be an int >= 0"):
        Batch(-1)
    with pytest.raises(ValueError, match=r"Epoch\(1.5\): the length must be an int >= 0"):
        Epoch(1.5)  # type: ignore[arg-type]
    with pytest.raises(
        ValueError,
        match=r"unknown length unit 'steps'; use one of \['batches', 'epochs', 'records'\]",
    ):
        TrainUnit.coerce({"steps": 3})
    with pytest.raises(
        ValueError,
        match=r"cannot use 'ten' as a length; pass Batch\(n\), Epoch\(n\), Record\(n\) or an int",
    ):
        TrainUnit.coerce("ten")


def test_loading_trials_from_checkpoints_and_specs(tmp_path) -> None:
    ckpt = _checkpoint(tmp_path)
    meta = json.loads((ckpt / "metadata.json").read_text())
    del meta["trial_class"]
    (ckpt / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(
        TrialDefinitionError,
        match="the checkpoint does not name its trial class; pass trial_class=",
    ):
        pytorch.load_trial_from_checkpoint_path(ckpt)
    with pytest.raises(TrialDefinitionError, match="must have the form `module:Class`"):
        pytorch.load_trial_class("api_trials.LinearTrial")
    with pytest.raises(TrialDefinitionError, match="cannot import module 'no_such_module'"):
        pytorch.load_trial_class("no_such_module:Trial")
    with pytest.raises(TrialDefinitionError, match="module 'api_trials' has no class 'Nope'"):
        pytorch.load_trial_class("api_trials:Nope")
    with pytest.raises(
        TrialDefinitionError,
        match=r"api_trials:Run is not a subclass of searchlab\.pytorch\.PyTorchTrial",
    ):
        pytorch.load_trial_class("api_trials:Run")


def test_an_entrypoint_module_imported_from_elsewhere_does_not_stand_in(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A notebook imported its own ``model_def`` from another folder; the experiment's model
    directory has a ``model_def`` too: its class is the one loaded."""
    import sys

    for name, body in (("other", "VERSION = 'other'\n"), ("exp", TRIAL_MODULE)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model_def.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path / "other"))
    monkeypatch.delitem(sys.modules, "model_def", raising=False)
    import model_def as users_own  # type: ignore[import-not-found]

    try:
        trial_class = pytorch.load_trial_class("model_def:ExpTrial", tmp_path / "exp")
        assert trial_class.__name__ == "ExpTrial"
        assert issubclass(trial_class, pytorch.PyTorchTrial)
        assert users_own.VERSION == "other"  # the caller's module object is untouched
    finally:
        sys.modules.pop("model_def", None)
        if str(tmp_path / "exp") in sys.path:
            sys.path.remove(str(tmp_path / "exp"))


def test_every_module_the_model_dir_provides_replaces_one_loaded_from_elsewhere(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not only the entrypoint: the model's own ``data`` module (a package here) is the model
    directory's, even though the session imported another ``data`` package first."""
    import importlib
    import sys

    for name in ("other", "exp"):
        (tmp_path / name / "data").mkdir(parents=True)
    (tmp_path / "other" / "data" / "__init__.py").write_text("WHERE = 'other'\n")
    (tmp_path / "other" / "data" / "sub.py").write_text("")
    (tmp_path / "exp" / "data" / "__init__.py").write_text("WHERE = 'exp'\n")
    (tmp_path / "exp" / "model_def.py").write_text(
        "import data\nWHERE = data.WHERE\n" + TRIAL_MODULE
    )
    monkeypatch.syspath_prepend(str(tmp_path / "other"))
    for name in ("data", "data.sub", "model_def"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    importlib.import_module("data.sub")
    users_own = sys.modules["data"]
    try:
        trial_class = pytorch.load_trial_class("model_def:ExpTrial", tmp_path / "exp")
        assert sys.modules[trial_class.__module__].WHERE == "exp"
        assert "data.sub" not in sys.modules  # the other package's submodules went with it
        assert users_own.WHERE == "other"
    finally:
        for name in ("data", "data.sub", "model_def"):
            sys.modules.pop(name, None)
        if str(tmp_path / "exp") in sys.path:
            sys.path.remove(str(tmp_path / "exp"))


def test_a_model_dir_module_named_like_the_standard_library_spares_it(
    tmp_path: pathlib.Path,
) -> None:
    """A model directory holding ``logging.py`` or a ``searchlab`` folder: the loaded standard
    library module and searchlab itself stay (forgetting them would break the session)."""
    import logging
    import sys

    import searchlab

    (tmp_path / "logging.py").write_text("raise RuntimeError('shadowing logging')\n")
    (tmp_path / "searchlab").mkdir()
    (tmp_path / "searchlab" / "__init__.py").write_text("")
    (tmp_path / "model_def.py").write_text(TRIAL_MODULE)
    try:
        trial_class = pytorch.load_trial_class("model_def:ExpTrial", tmp_path)
        assert issubclass(trial_class, pytorch.PyTorchTrial)
        assert sys.modules["logging"] is logging
        assert sys.modules["searchlab"] is searchlab
    finally:
        sys.modules.pop("model_def", None)
        if str(tmp_path) in sys.path:
            sys.path.remove(str(tmp_path))


TRIAL_MODULE = """
from searchlab import pytorch


class ExpTrial(pytorch.PyTorchTrial):
    pass
"""
