"""A checkpoint is data: loading it runs no code and imports nothing unless the user trusts it."""

from __future__ import annotations

import json
import pathlib
import random
import re
import shutil
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
import torch
from api_trials import LinearTrial, train
from toy_trials import ToyTrial

from searchlab import pytorch
from searchlab.errors import CheckpointError, TrialDefinitionError
from searchlab.pytorch import Batch, PyTorchCallback
from searchlab.pytorch._state import restore_rng_state

DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "checkpoints"
HP = {"global_batch_size": 4}
TRUST_HINT = "pass trusted=True only if you trust where this file came from"


def plant_marker(path: str) -> str:
    """What a planted pickle runs while it is loaded: here, it only writes a file."""
    pathlib.Path(path).write_text("code ran while the checkpoint loaded")
    return "planted"


class Planted:
    """An object whose unpickling calls ``plant_marker`` (as a malicious file would call
    ``os.system``)."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return plant_marker, (self.marker,)


def _trained_checkpoint(tmp: pathlib.Path) -> pathlib.Path:
    run = train(tmp / "train", HP, max_length=Batch(3))
    assert run.path is not None
    return pathlib.Path(run.path)


def _plant(ckpt: pathlib.Path, marker: pathlib.Path) -> pathlib.Path:
    state_file = ckpt / "state-dict.pth"
    state = torch.load(state_file, weights_only=True)
    state["callbacks"]["innocent_looking"] = {"value": Planted(marker)}
    torch.save(state, state_file)
    return state_file


def test_a_planted_pickle_is_refused_without_trusted(tmp_path) -> None:
    marker = tmp_path / "marker"
    ckpt = _trained_checkpoint(tmp_path)
    state_file = _plant(ckpt, marker)
    match = (
        rf"^{re.escape(str(state_file))}: weights-only loading refused "
        rf"`test_checkpoint_security\.plant_marker` .*; {TRUST_HINT}$"
    )
    with pytest.raises(CheckpointError, match=match) as err:
        pytorch.load_checkpoint(ckpt)
    assert "\n" not in str(err.value)
    with pytest.raises(CheckpointError, match=match):
        pytorch.load_trial_from_checkpoint_path(ckpt, trial_class=LinearTrial)
    with pytest.raises(CheckpointError, match=match):  # resuming reads it the same way
        train(tmp_path / "resume", HP, max_length=Batch(4), latest_checkpoint=str(ckpt))
    assert not marker.exists()


def test_trusted_loading_uses_the_full_unpickler(tmp_path) -> None:
    marker = tmp_path / "marker"
    ckpt = _trained_checkpoint(tmp_path)
    _plant(ckpt, marker)
    state, _ = pytorch.load_checkpoint(ckpt, trusted=True)
    assert state["callbacks"]["innocent_looking"] == {"value": "planted"}
    assert marker.read_text() == "code ran while the checkpoint loaded"
    marker.unlink()
    trial = pytorch.load_trial_from_checkpoint_path(ckpt, trial_class=LinearTrial, trusted=True)
    assert isinstance(trial, LinearTrial) and marker.exists()
    marker.unlink()
    with pytorch.init(hparams=HP, checkpoint_dir=tmp_path / "resumed") as ctx:
        resumed = LinearTrial(ctx)
        pytorch.Trainer(resumed, ctx).fit(
            max_length=Batch(4), latest_checkpoint=str(ckpt), trusted=True
        )
    assert marker.exists() and ctx.get_initial_batch() == 3


def test_weights_only_false_in_torch_load_kwargs_needs_trusted(tmp_path) -> None:
    ckpt = _trained_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match=r"torch_load_kwargs asks for weights_only=False"):
        pytorch.load_trial_from_checkpoint_path(
            ckpt, trial_class=LinearTrial, torch_load_kwargs={"weights_only": False}
        )


def test_torch_load_kwargs_reach_torch_load(tmp_path) -> None:
    ckpt = _trained_checkpoint(tmp_path)
    state, _ = pytorch.load_checkpoint(ckpt, torch_load_kwargs={"map_location": "meta"})
    assert state["models_state_dict"][0]["weight"].device.type == "meta"
    state, _ = pytorch.load_checkpoint(ckpt)
    assert state["models_state_dict"][0]["weight"].device.type == "cpu"  # the default


def test_corrupt_files_are_still_reported_as_corrupt(tmp_path) -> None:
    ckpt = _trained_checkpoint(tmp_path)
    state_file = ckpt / "state-dict.pth"
    state_file.write_bytes(state_file.read_bytes()[:300])
    for trusted in (False, True):
        with pytest.raises(
            CheckpointError,
            match=r"state-dict.pth: cannot be read \(.*\); the file is truncated or corrupt",
        ):
            pytorch.load_checkpoint(ckpt, trusted=trusted)


def _flip_a_weight_byte(state_file: pathlib.Path, value: float) -> None:
    """Damage one stored weight in place, as a bad disk or a stray write would."""
    data = bytearray(state_file.read_bytes())
    at = data.find(np.float32(value).tobytes())
    assert at > 0, "the weight's bytes are in the file"
    data[at + 3] ^= 0x01
    state_file.write_bytes(bytes(data))


def test_a_flipped_bit_in_a_tensor_is_refused_not_loaded(tmp_path) -> None:
    """torch.load does not check the CRC-32 torch.save writes; load_checkpoint does, so a
    damaged weight is a corrupt checkpoint (the resume falls back) instead of a silent load."""
    ckpt = _trained_checkpoint(tmp_path)
    state, _ = pytorch.load_checkpoint(ckpt)
    weight = state["models_state_dict"][0]["weight"]
    state_file = ckpt / "state-dict.pth"
    _flip_a_weight_byte(state_file, float(weight.flatten()[0]))
    assert torch.load(state_file, weights_only=True)  # torch alone loads it
    for trusted in (False, True):
        with pytest.raises(
            CheckpointError,
            match=r"state-dict.pth: cannot be read \(BadZipFile: Bad CRC-32 for file .*\); "
            r"the file is truncated or corrupt, resume from an earlier checkpoint",
        ):
            pytorch.load_checkpoint(ckpt, trusted=trusted)


def test_a_state_written_with_torchs_checksums_off_still_loads(tmp_path) -> None:
    ckpt = _trained_checkpoint(tmp_path)
    state, _ = pytorch.load_checkpoint(ckpt)
    before = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        torch.save(state, ckpt / "state-dict.pth")
    finally:
        torch.serialization.set_crc32_options(before)
    again, _ = pytorch.load_checkpoint(ckpt)
    assert torch.equal(
        again["models_state_dict"][0]["weight"], state["models_state_dict"][0]["weight"]
    )


def _model_dir(root: pathlib.Path, module: str, body: str) -> pathlib.Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{module}.py").write_text(textwrap.dedent(body))
    return root


def _with_metadata(ckpt: pathlib.Path, **changes: Any) -> None:
    meta_file = ckpt / "metadata.json"
    meta = json.loads(meta_file.read_text())
    meta.update(changes)
    meta_file.write_text(json.dumps(meta))


def test_the_class_a_checkpoint_names_is_not_imported_without_trusted(tmp_path) -> None:
    marker = tmp_path / "imported"
    model_dir = _model_dir(
        tmp_path / "elsewhere",
        "sneaky_model_def",
        f"""
        import pathlib
        pathlib.Path({str(marker)!r}).write_text("imported")
        from api_trials import LinearTrial as SneakyTrial
        """,
    )
    ckpt = _trained_checkpoint(tmp_path)
    _with_metadata(ckpt, trial_class="sneaky_model_def:SneakyTrial", model_dir=str(model_dir))
    match = (
        rf"^{re.escape(str(ckpt))}: the checkpoint names trial class "
        rf"'sneaky_model_def:SneakyTrial' in {re.escape(str(model_dir))}; .*pass "
        r"trial_class=YourTrial, or trusted=True to import it from there$"
    )
    with pytest.raises(TrialDefinitionError, match=match):
        pytorch.load_trial_from_checkpoint_path(ckpt)
    assert "sneaky_model_def" not in sys.modules and not marker.exists()
    # The same checkpoint loads with the class given by the user.
    trial = pytorch.load_trial_from_checkpoint_path(ckpt, trial_class=LinearTrial)
    assert isinstance(trial, LinearTrial) and not marker.exists()


@pytest.fixture
def clean_import():
    """Forget the modules a test imported from checkpoint code (their names are reused)."""
    before = set(sys.modules)
    path = list(sys.path)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("ckpt_code_"):
            del sys.modules[name]
    sys.path[:] = path


def test_trusted_imports_from_the_checkpoints_code_folder(tmp_path, clean_import) -> None:
    ckpt = _trained_checkpoint(tmp_path)
    body = """
        from api_trials import LinearTrial

        class CodeTrial(LinearTrial):
            pass
        """
    _model_dir(ckpt / "code", "ckpt_code_linear", body)
    # The model_dir the metadata names holds a module of the same name that must not be used.
    other = _model_dir(tmp_path / "model_dir", "ckpt_code_linear", "raise ImportError('wrong')")
    _with_metadata(ckpt, trial_class="ckpt_code_linear:CodeTrial", model_dir=str(other))
    trial = pytorch.load_trial_from_checkpoint_path(ckpt, trusted=True)
    assert type(trial).__name__ == "CodeTrial"
    module_file = pathlib.Path(sys.modules[type(trial).__module__].__file__ or "")
    assert module_file.parent == (ckpt / "code").resolve()
    state, _ = pytorch.load_checkpoint(ckpt)
    assert torch.equal(trial.model.weight.detach(), state["models_state_dict"][0]["weight"])


def test_trusted_imports_determineds_trial_cls_spec_from_code(tmp_path, clean_import) -> None:
    ckpt = tmp_path / "det"
    shutil.copytree(DATA / "v1_determined", ckpt)
    body = """
        from toy_trials import ToyTrial

        class DetCodeTrial(ToyTrial):
            pass
        """
    _model_dir(ckpt / "code", "ckpt_code_det", body)
    load_data = json.loads((ckpt / "load_data.json").read_text())
    load_data["trial_cls_spec"] = "ckpt_code_det:DetCodeTrial"
    (ckpt / "load_data.json").write_text(json.dumps(load_data))
    with pytest.raises(TrialDefinitionError, match=r"names trial class 'ckpt_code_det:DetCo"):
        pytorch.load_trial_from_checkpoint_path(ckpt)
    assert "ckpt_code_det" not in sys.modules
    trial = pytorch.load_trial_from_checkpoint_path(ckpt, trusted=True)
    assert type(trial).__name__ == "DetCodeTrial" and isinstance(trial, ToyTrial)
    assert trial.context.get_hparams()["hidden"] == 4


@pytest.mark.parametrize("version", ["v1_determined", "v2"])
def test_checked_in_checkpoints_load_weights_only(version) -> None:
    """Old checkpoints hold numpy's RNG tuple: the allow-list covers exactly that."""
    state, _ = pytorch.load_checkpoint(DATA / version)
    np_state = state["rng_state"]["np_rng_state"]
    assert isinstance(np_state, tuple) and np_state[0] == "MT19937"
    assert isinstance(np_state[1], np.ndarray) and np_state[1].dtype == np.uint32
    restore_rng_state(state["rng_state"])
    assert np.array_equal(np.random.get_state()[1], np_state[1])
    assert np.random.get_state()[2] == np_state[2]
    assert random.getstate() == state["rng_state"]["random_state"]


class RngAtSave(PyTorchCallback):
    """Records the global RNG states at the moment the checkpoint state is captured."""

    def __init__(self) -> None:
        self.seen: list[tuple[Any, ...]] = []

    def on_checkpoint_save_start(self, checkpoint: dict[str, Any]) -> None:
        self.seen.append((np.random.get_state(), random.getstate(), torch.get_rng_state()))


class RngTrial(LinearTrial):
    def build_callbacks(self) -> dict[str, PyTorchCallback]:
        self.rng = RngAtSave()
        return {"rng": self.rng}

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        # Use every global RNG, so that their states move on.
        np.random.rand()
        random.random()
        torch.rand(1)
        return super().train_batch(batch, epoch_idx, batch_idx)


def test_a_trainer_checkpoint_round_trips_weights_only(tmp_path) -> None:
    run = train(tmp_path, HP, trial_cls=RngTrial, max_length=Batch(3))
    ckpt = pathlib.Path(run.path or "")
    # New checkpoints need no allow-list at all: plain weights-only torch.load reads them.
    raw = torch.load(ckpt / "state-dict.pth", weights_only=True)
    assert isinstance(raw["rng_state"]["np_rng_state"]["key"], torch.Tensor)
    state, _ = pytorch.load_checkpoint(ckpt)
    for saved, live in zip(state["models_state_dict"][0].values(), run.trial.model.parameters()):
        assert torch.equal(saved, live.detach())
    np_saved, py_saved, torch_saved = run.trial.rng.seen[-1]
    np.random.seed(0)
    random.seed(0)
    torch.manual_seed(0)
    restore_rng_state(state["rng_state"])
    np_now = np.random.get_state()
    assert np_now[0] == np_saved[0] and np.array_equal(np_now[1], np_saved[1])
    assert np_now[2:] == np_saved[2:]
    assert random.getstate() == py_saved
    assert torch.equal(torch.get_rng_state(), torch_saved)
    trial = pytorch.load_trial_from_checkpoint_path(ckpt, trial_class=LinearTrial)
    assert torch.equal(trial.model.weight, run.trial.model.weight)
