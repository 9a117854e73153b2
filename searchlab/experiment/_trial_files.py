"""Where a trial worker finds its files: the model directory, its checkpoints, which one loads.

Shared by the single-process trainable, the data-parallel trainable and script trials.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import warnings
from typing import Any

from searchlab.errors import CheckpointError
from searchlab.experiment._protocol import CHECKPOINT_LENGTH_KEY
from searchlab.experiment._spec import ExperimentSpec
from searchlab.pytorch._checkpoint import METADATA_FILE, load_checkpoint

__all__ = [
    "FALLBACK_KEY",
    "checkpoint_rung_length",
    "earlier_checkpoints",
    "load_with_fallback",
    "shipped_model_dir",
    "unpacked_model_dir",
]

logger = logging.getLogger("searchlab")

# In a state dict from ``load_with_fallback``: why it is an earlier checkpoint's. The trainable
# hands the state to ``TrialRunner.load``, which reports it with the trial's next result (a
# warning on a worker would only reach Ray's log files).
FALLBACK_KEY = "searchlab_fallback"


def shipped_model_dir(spec: ExperimentSpec) -> str:
    """The model directory on this worker, which becomes its working directory.

    The shipped zip when the run ships one (unpacked once per content), else the job's
    ``working_dir`` (Ray's copy, already the working directory), else the directory itself.
    The trial's code then finds files relative to its model directory, as on Determined.
    """
    unpacked = unpacked_model_dir(spec)
    if unpacked is not None:
        os.chdir(unpacked)
        return unpacked
    shipped = pathlib.Path.cwd()
    if (shipped / spec.module_file).is_file():
        return str(shipped)
    return spec.model_dir


def unpacked_model_dir(spec: ExperimentSpec) -> str | None:
    """The run's shipped zip of the model directory, unpacked on this worker (None when the
    run ships none: the job's ``working_dir`` carries the directory)."""
    if spec.model_archive is None:
        return None
    import ray

    from searchlab.experiment._ship import unpack_model_dir

    return unpack_model_dir(ray.get(spec.model_archive))


def earlier_checkpoints(path: pathlib.Path) -> list[pathlib.Path]:
    """A trial's checkpoints older than ``path`` (Tune's ``checkpoint_<index>`` siblings),
    newest first."""
    return sorted(
        (p for p in path.parent.glob("checkpoint_*") if p.name < path.name and p.is_dir()),
        reverse=True,
    )


def load_with_fallback(path: str | os.PathLike[str]) -> tuple[dict[str, Any], pathlib.Path]:
    """Load a Tune checkpoint; if it is corrupt, warn and use the newest earlier one that loads.

    The experiment's own checkpoints, written by its trials, load with the full unpickler
    (``trusted``): resuming an experiment runs its model code anyway, and a callback's state
    may hold the user's own objects.

    Tune keeps a trial's checkpoints as ``checkpoint_000000``, ``checkpoint_000001``, ... in the
    trial directory, so the earlier ones are the siblings with smaller names. The state of an
    earlier checkpoint carries the warning, which ``TrialRunner.load`` reports to the driver.

    Raises:
        CheckpointError: ``path`` and every earlier checkpoint are unreadable.
    """
    path = pathlib.Path(path)
    try:
        return load_checkpoint(path, trusted=True)[0], path
    except CheckpointError as first_error:
        for candidate in earlier_checkpoints(path):
            try:
                state = load_checkpoint(candidate, trusted=True)[0]
            except CheckpointError:
                continue
            message = f"{first_error}; resuming from the earlier checkpoint {candidate}"
            warnings.warn(message, stacklevel=2)
            logger.warning("%s", message)
            state[FALLBACK_KEY] = message
            return state, candidate
        raise


def checkpoint_rung_length(path: str | os.PathLike[str]) -> int | None:
    """The longest rung length whose result the trial had reported when it saved ``path``."""
    try:
        meta = json.loads((pathlib.Path(path) / METADATA_FILE).read_text())
        return int(meta[CHECKPOINT_LENGTH_KEY])
    except (OSError, ValueError, KeyError, TypeError):
        return None
