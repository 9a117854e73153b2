"""Checkpoint directories: ``state-dict.pth`` plus ``metadata.json``, written atomically.

Format versions:
  1. Determined's layout: ``state_dict.pth`` (underscore) and ``metadata.json`` with
     ``steps_completed``; read only.
  2. searchlab's: ``state-dict.pth`` holding the trial position (``batches_trained``,
     ``epochs_trained``) and ``trainer_state``, and ``metadata.json`` with ``format_version``.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import uuid
from collections.abc import Mapping
from typing import Any

import torch

from searchlab.errors import CheckpointError

__all__ = [
    "FORMAT_VERSION",
    "METADATA_FILE",
    "STATE_FILE",
    "load_checkpoint",
    "save_checkpoint_dir",
    "write_checkpoint_files",
]

FORMAT_VERSION = 2
STATE_FILE = "state-dict.pth"
DETERMINED_STATE_FILE = "state_dict.pth"
METADATA_FILE = "metadata.json"


def write_checkpoint_files(
    directory: str | os.PathLike[str], state: Mapping[str, Any], metadata: Mapping[str, Any]
) -> pathlib.Path:
    """Write ``state`` and ``metadata`` into an existing ``directory``, each file atomically.

    The metadata file is written last, so a directory with ``metadata.json`` holds a complete
    ``state-dict.pth``.
    """
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _atomic_torch_save(dict(state), directory / STATE_FILE)
    meta = {"format_version": FORMAT_VERSION, **metadata}
    tmp = directory / f".{METADATA_FILE}.{uuid.uuid4().hex}.tmp"
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=True, default=_json_default))
    os.replace(tmp, directory / METADATA_FILE)
    return directory


def save_checkpoint_dir(
    root: str | os.PathLike[str], name: str, state: Mapping[str, Any], metadata: Mapping[str, Any]
) -> pathlib.Path:
    """Write a new checkpoint directory ``root/name`` atomically (built aside, then renamed)."""
    root = pathlib.Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / name
    if final.exists():
        raise CheckpointError(f"{final}: a checkpoint with this name already exists")
    tmp = root / f".tmp-{name}-{uuid.uuid4().hex[:8]}"
    try:
        write_checkpoint_files(tmp, state, metadata)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def load_checkpoint(directory: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The state dict and metadata of a checkpoint directory (either format version).

    Raises:
        CheckpointError: no state file, or one that cannot be read (truncated, corrupt).
    """
    directory = pathlib.Path(directory)
    metadata = _read_metadata(directory)
    for name in (STATE_FILE, DETERMINED_STATE_FILE):
        path = directory / name
        if path.is_file():
            break
    else:
        raise CheckpointError(
            f"{directory}: not a checkpoint: it holds neither {STATE_FILE} nor "
            f"{DETERMINED_STATE_FILE}; pass the directory that contains one"
        )
    try:
        # weights_only=False: checkpoints hold numpy and Python RNG states; they are the
        # user's own files, written by searchlab or Determined.
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means a bad file
        raise CheckpointError(
            f"{path}: cannot be read ({type(exc).__name__}: {exc}); the file is truncated or "
            "corrupt, resume from an earlier checkpoint"
        ) from exc
    if not isinstance(state, dict) or "models_state_dict" not in state:
        raise CheckpointError(f"{path}: has no `models_state_dict`; it was not written by a trial")
    if "batches_trained" not in state:  # format 1 (Determined)
        state["batches_trained"] = int(metadata.get("steps_completed", 0))
        metadata.setdefault("format_version", 1)
    return state, metadata


def _read_metadata(directory: pathlib.Path) -> dict[str, Any]:
    path = directory / METADATA_FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: cannot be read as JSON ({exc})") from exc
    return data if isinstance(data, dict) else {}


def _atomic_torch_save(obj: Any, path: pathlib.Path) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, pathlib.Path):
        return str(obj)
    return repr(obj)
