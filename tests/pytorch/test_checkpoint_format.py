"""Checkpoint layout, and loading + resuming from each checked-in format version."""

from __future__ import annotations

import json
import pathlib
import random
import shutil

import pytest
import torch
from api_trials import train
from toy_trials import ToyTrial

from searchlab import pytorch
from searchlab.pytorch import Batch

DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "checkpoints"
VERSIONS = {"v1_determined": 1, "v2": 2}
# What make_checkpoints.py trained: 6 batches of ToyTrial with these hyperparameters, seed 7.
HPARAMS = {"global_batch_size": 8, "n_train": 32, "hidden": 4, "lr": 0.1}


def _resume(tmp: pathlib.Path, latest: pathlib.Path | None, batches: int = 10):
    with pytorch.init(
        hparams=HPARAMS, checkpoint_dir=tmp, seed=7, enable_tensorboard_logging=False
    ) as ctx:
        trial = ToyTrial(ctx)
        trainer = pytorch.Trainer(trial, ctx)
        trainer.fit(max_length=Batch(batches), latest_checkpoint=str(latest) if latest else None)
    return trial, trainer, ctx


def test_trainer_writes_the_spec_layout(tmp_path) -> None:
    run = train(
        tmp_path, {"global_batch_size": 4, "step_mode": "STEP_EVERY_EPOCH"}, max_length=Batch(6)
    )
    ckpt = pathlib.Path(run.path)
    assert sorted(p.name for p in ckpt.iterdir()) == ["metadata.json", "state-dict.pth"]
    state = torch.load(ckpt / "state-dict.pth", map_location="cpu", weights_only=True)
    assert {
        "models_state_dict",
        "optimizers_state_dict",
        "lr_schedulers_state_dict",
        "callbacks",
        "rng_state",
        "scaler_state_dict",
        "batches_trained",
        "epochs_trained",
    } <= set(state)
    assert set(state["rng_state"]) >= {"cpu_rng_state", "np_rng_state", "random_state"}
    assert (state["batches_trained"], state["epochs_trained"]) == (6, 1)
    assert torch.equal(state["models_state_dict"][0]["weight"], run.trial.model.weight.detach())
    meta = json.loads((ckpt / "metadata.json").read_text())
    assert meta["format_version"] == 2
    assert meta["trial_class"] == "api_trials:LinearTrial"
    assert meta["hparams"] == {"global_batch_size": 4, "step_mode": "STEP_EVERY_EPOCH"}
    assert meta["batches_trained"] == 6
    assert meta["metrics"] == run.reports("validation")[-1].metrics
    # Written aside and renamed: nothing half-written is left next to it.
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_checked_in_checkpoint_loads(version) -> None:
    state, meta = pytorch.load_checkpoint(DATA / version)
    assert meta["format_version"] == VERSIONS[version]
    assert state["batches_trained"] == 6
    assert meta["trial_class"] == "toy_trials:ToyTrial"
    assert meta["hparams"] == HPARAMS


def test_both_formats_hold_the_same_trial_state() -> None:
    v1, _ = pytorch.load_checkpoint(DATA / "v1_determined")
    v2, _ = pytorch.load_checkpoint(DATA / "v2")
    for name, tensor in v2["models_state_dict"][0].items():
        assert torch.equal(v1["models_state_dict"][0][name], tensor)
    assert v1["rng_state"]["random_state"] == v2["rng_state"]["random_state"]


@pytest.fixture(scope="module")
def resumed(tmp_path_factory) -> dict[str, ToyTrial]:
    tmp = tmp_path_factory.mktemp("resume")
    out = {v: _resume(tmp / v, DATA / v)[0] for v in VERSIONS}
    out["uninterrupted"] = _resume(tmp / "whole", None)[0]
    return out


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_training_resumes_from_each_format(tmp_path, version) -> None:
    trial, trainer, ctx = _resume(tmp_path, DATA / version)
    assert ctx.get_initial_batch() == 6
    assert [r.batches for r in trainer.reports if r.group == "validation"] == [10]
    # The epoch-stepped scheduler continued: stepped after batches 4 and 8.
    assert trial.sched.last_epoch == 2
    assert trial.opt.state_dict()["state"][0]["momentum_buffer"] is not None


def test_both_formats_resume_to_the_same_weights(resumed) -> None:
    v1, v2, whole = resumed["v1_determined"], resumed["v2"], resumed["uninterrupted"]
    for a, b, c in zip(v1.model.parameters(), v2.model.parameters(), whole.model.parameters()):
        assert torch.equal(a, b)  # Determined's RNG streams were restored too
        assert torch.allclose(b, c, rtol=0, atol=1e-6)  # = 10 batches at once (same torch)


def test_determined_python_rng_state_is_restored(tmp_path) -> None:
    random.seed(12345)
    _resume(tmp_path, DATA / "v1_determined", batches=6)  # loads, trains nothing
    saved = torch.load(DATA / "v1_determined" / "state_dict.pth", weights_only=False)
    assert random.getstate() == saved["rng_state"]["random_rng_state"]


def _determined_variant(tmp: pathlib.Path) -> tuple[pathlib.Path, dict]:
    """v1 rewritten as older or multi-GPU Determined wrote it."""
    ckpt = tmp / "variant"
    shutil.copytree(DATA / "v1_determined", ckpt)
    state = torch.load(ckpt / "state_dict.pth", weights_only=False)
    original = {k: v.clone() for k, v in state["models_state_dict"][0].items()}
    state["model_state_dict"] = {
        f"module.{k}": v for k, v in state.pop("models_state_dict")[0].items()
    }
    state["optimizer_state_dict"] = state.pop("optimizers_state_dict")[0]
    state["lr_scheduler"] = state.pop("lr_schedulers_state_dict")[0]
    state["rng_state"]["gpu_rng_state"] = torch.zeros(16, dtype=torch.uint8)
    (ckpt / "determined").mkdir()
    torch.save(state, ckpt / "determined" / "state_dict.pth")
    (ckpt / "state_dict.pth").unlink()
    return ckpt, original


def test_older_and_ddp_determined_checkpoints_load(tmp_path) -> None:
    ckpt, original = _determined_variant(tmp_path)
    state, _ = pytorch.load_checkpoint(ckpt)
    assert len(state["optimizers_state_dict"]) == len(state["lr_schedulers_state_dict"]) == 1
    assert isinstance(state["rng_state"]["gpu_rng_state"], list)  # one device's state
    trial = pytorch.load_trial_from_checkpoint_path(ckpt, trial_class=ToyTrial)
    for name, tensor in trial.model.state_dict().items():  # "module." prefix dropped
        assert torch.equal(tensor, original[name])


@pytest.mark.parametrize("version", sorted(VERSIONS))
@pytest.mark.parametrize("how", [{"trial_class": ToyTrial}, {"trusted": True}])
def test_load_trial_from_checkpoint_path(version, how) -> None:
    # trusted=True imports the class the checkpoint names (toy_trials is on sys.path here).
    trial = pytorch.load_trial_from_checkpoint_path(DATA / version, **how)
    assert type(trial).__name__ == "ToyTrial"
    assert trial.context.get_hparams() == HPARAMS
    state, _ = pytorch.load_checkpoint(DATA / version)
    for name, tensor in trial.model.state_dict().items():
        assert torch.equal(tensor, state["models_state_dict"][0][name])
    assert trial.sched.last_epoch == 1


def test_load_trial_with_explicit_class_and_hparams() -> None:
    trial = pytorch.load_trial_from_checkpoint_path(
        DATA / "v2", trial_class=ToyTrial, hparams={**HPARAMS, "lr": 0.5}
    )
    assert isinstance(trial, ToyTrial) and trial.context.get_hparam("lr") == 0.5


def test_trial_state_owns_every_key_a_checkpoint_holds(tmp_path) -> None:
    """Every key the trainer writes is a declared TrialState field; others survive a round trip."""
    from searchlab.pytorch._state import TrialState

    run = train(tmp_path, {"global_batch_size": 4}, max_length=Batch(6))
    state = torch.load(
        pathlib.Path(run.path) / "state-dict.pth", map_location="cpu", weights_only=True
    )
    saved = TrialState.from_state_dict(state)
    assert saved.extra == {}, f"keys written outside TrialState: {sorted(saved.extra)}"
    assert (saved.batches_trained, saved.epochs_trained) == (6, 1)
    assert set(saved.to_state_dict()) == set(state)
    # A callback's own key (Determined lets on_checkpoint_save_start add some) is kept.
    state["my_callback_key"] = {"seen": 3}
    assert TrialState.from_state_dict(state).to_state_dict()["my_callback_key"] == {"seen": 3}
    assert TrialState.key("rng_per_rank") == "rng_state_per_rank"
