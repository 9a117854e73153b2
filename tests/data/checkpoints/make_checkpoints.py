"""Write the tiny checked-in checkpoints of each format version (run from the repo root).

    PYTHONPATH=. python tests/data/checkpoints/make_checkpoints.py

Both hold the same trial state: ``toy_trials:ToyTrial`` (hidden=4, SGD with momentum, an
epoch-stepped StepLR, dropout, shuffled data of 4 batches an epoch) after 6 batches, seed 7.

- ``v2/``: searchlab's current layout, written by the ``Trainer`` (``state-dict.pth`` +
  ``metadata.json``); ``model_dir`` is blanked so the file names no path of this machine.
  The checked-in one predates the plain form of ``np_rng_state`` (a tensor and numbers): it
  holds ``np.random.get_state()``'s tuple, which loading must keep accepting, so it is not
  rewritten.
- ``v1_determined/``: the layout Determined's ``PyTorchTrialController._save`` wrote:
  ``state_dict.pth`` (torch schedulers' own state dicts, ``random_rng_state``),
  ``metadata.json`` with ``steps_completed`` and ``load_data.json`` naming the trial class.
"""

from __future__ import annotations

import json
import pathlib
import random
import shutil
import sys
import tempfile

import numpy as np
import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "fixtures"))

from toy_trials import ToyTrial  # noqa: E402

from searchlab import pytorch  # noqa: E402
from searchlab.pytorch._state import _numpy_state_from_saved  # noqa: E402

HPARAMS = {"global_batch_size": 8, "n_train": 32, "hidden": 4, "lr": 0.1}
SEED = 7
BATCHES = 6


def _train(tmp: pathlib.Path) -> tuple[ToyTrial, pathlib.Path]:
    with pytorch.init(
        hparams=HPARAMS, checkpoint_dir=tmp, seed=SEED, enable_tensorboard_logging=False
    ) as ctx:
        trial = ToyTrial(ctx)
        path = pytorch.Trainer(trial, ctx).fit(max_length=pytorch.Batch(BATCHES))
    assert path is not None
    return trial, pathlib.Path(path)


def write_v2(checkpoint: pathlib.Path, out: pathlib.Path) -> None:
    out.mkdir()
    shutil.copy(checkpoint / "state-dict.pth", out / "state-dict.pth")
    meta = json.loads((checkpoint / "metadata.json").read_text())
    meta["model_dir"] = None
    (out / "metadata.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


def write_v1_determined(checkpoint: pathlib.Path, out: pathlib.Path) -> None:
    """Determined's layout, from the same trial state (RNG streams included)."""
    ours, _ = pytorch.load_checkpoint(checkpoint)
    rng = ours["rng_state"]
    state = {
        "models_state_dict": ours["models_state_dict"],
        "optimizers_state_dict": ours["optimizers_state_dict"],
        "lr_schedulers_state_dict": [s["scheduler"] for s in ours["lr_schedulers_state_dict"]],
        "callbacks": {},
        "rng_state": {
            "cpu_rng_state": rng["cpu_rng_state"],
            "np_rng_state": _numpy_state_from_saved(rng["np_rng_state"]),  # Determined's tuple
            "random_rng_state": rng["random_state"],
        },
    }
    out.mkdir()
    torch.save(state, out / "state_dict.pth")
    metadata = {
        "determined_version": "0.38.1",
        "steps_completed": BATCHES,
        "framework": f"torch-{torch.__version__.split('+')[0]}",
        "format": "pickle",
    }
    (out / "metadata.json").write_text(json.dumps(metadata, indent=2) + "\n")
    load_data = {
        "trial_type": "PyTorchTrial",
        "experiment_config": {"hyperparameters": HPARAMS},
        "hparams": HPARAMS,
        "trial_cls_spec": "toy_trials:ToyTrial",
        "is_trainer": True,
    }
    (out / "load_data.json").write_text(json.dumps(load_data, indent=2) + "\n")


def main() -> None:
    for name in ("v1_determined", "v2"):
        shutil.rmtree(HERE / name, ignore_errors=True)
    random.seed(0)
    np.random.seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        _, checkpoint = _train(pathlib.Path(tmp))
        write_v2(checkpoint, HERE / "v2")
        write_v1_determined(checkpoint, HERE / "v1_determined")
    for path in sorted(HERE.glob("v*/*")):
        print(f"{path.relative_to(HERE)}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
