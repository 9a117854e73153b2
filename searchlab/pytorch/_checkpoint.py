"""Checkpoint directories: ``state-dict.pth`` plus ``metadata.json``, written atomically.

Loading is weights-only by default: ``torch.load(weights_only=True)`` with an allow-list of what
searchlab's and Determined's checkpoints hold (tensors, plain containers, numpy's and Python's RNG
states), so a planted pickle in ``state-dict.pth`` cannot run code; ``trusted=True`` uses the full
unpickler for files whose origin the user vouches for. Before either, every record's CRC-32
(written by ``torch.save``, never checked by ``torch.load``) is checked, so damaged weights are
a corrupt checkpoint, from which a resume falls back, instead of a silent load.

Format versions:
  1. Determined's layout: ``state_dict.pth`` (underscore; older releases put it under
     ``determined/``), ``metadata.json`` with ``steps_completed`` and ``load_data.json`` with
     the trial class and hyperparameters; read only, upgraded to format 2 as it is loaded.
  2. searchlab's: ``state-dict.pth`` holding the trial position (``batches_trained``,
     ``epochs_trained``) and ``trainer_state``, and ``metadata.json`` with ``format_version``.
"""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import re
import shutil
import uuid
import zipfile
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from searchlab._failpoints import failpoint
from searchlab.errors import CheckpointError

__all__ = [
    "CODE_DIR",
    "FORMAT_VERSION",
    "METADATA_FILE",
    "STATE_FILE",
    "load_checkpoint",
    "save_checkpoint_dir",
    "write_checkpoint_files",
    "write_checkpoint_metadata",
    "write_checkpoint_state",
]

FORMAT_VERSION = 2
STATE_FILE = "state-dict.pth"
DETERMINED_STATE_FILE = "state_dict.pth"
METADATA_FILE = "metadata.json"
DETERMINED_LOAD_DATA = "load_data.json"
CODE_DIR = "code"  # Determined's copy of the model code inside a checkpoint
_STATE_PATHS = (STATE_FILE, DETERMINED_STATE_FILE, f"determined/{DETERMINED_STATE_FILE}")
# Determined's single-object keys of its oldest checkpoints, and their list-valued successors.
_LEGACY_KEYS = {
    "model_state_dict": "models_state_dict",
    "optimizer_state_dict": "optimizers_state_dict",
    "lr_scheduler": "lr_schedulers_state_dict",
}


def write_checkpoint_files(
    directory: str | os.PathLike[str],
    state: Mapping[str, Any],
    metadata: Mapping[str, Any],
    *,
    durable: bool = True,
) -> pathlib.Path:
    """Write ``state`` and ``metadata`` into an existing ``directory``, each file atomically.

    The metadata file is written last, so a directory this writes with ``metadata.json`` holds
    a complete ``state-dict.pth``. (A trial worker may write the state after the metadata, in
    the background: ``searchlab.experiment._checkpoint_writer`` marks such a directory until
    its state is in place.) ``durable=False`` skips the fsync: for a staging directory that is
    copied elsewhere and deleted right away (Ray Tune's), where waiting for the disk costs
    ~0.2 s per ResNet-18 checkpoint and protects nothing.
    """
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_checkpoint_state(directory, state, durable=durable)
    write_checkpoint_metadata(directory, metadata)
    return directory


def write_checkpoint_state(
    directory: str | os.PathLike[str],
    state: Mapping[str, Any],
    *,
    durable: bool = True,
    crash_point: str | None = None,
) -> None:
    """Write ``state-dict.pth`` into ``directory`` atomically: a temporary file, renamed.

    ``crash_point`` names a crash point (``searchlab._failpoints``) between the two, for the
    crash tests: a crash there leaves no state file.
    """
    path = pathlib.Path(directory) / STATE_FILE
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "wb") as f:
        torch.save(dict(state), f)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    if crash_point is not None:
        failpoint(crash_point)
    os.replace(tmp, path)


def write_checkpoint_metadata(
    directory: str | os.PathLike[str], metadata: Mapping[str, Any]
) -> None:
    """Write ``metadata.json`` into ``directory`` atomically (with the format version)."""
    meta = {"format_version": FORMAT_VERSION, **metadata}
    tmp = pathlib.Path(directory) / f".{METADATA_FILE}.{uuid.uuid4().hex}.tmp"
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=True, default=_json_default))
    os.replace(tmp, pathlib.Path(directory) / METADATA_FILE)


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


def load_checkpoint(
    directory: str | os.PathLike[str],
    *,
    trusted: bool = False,
    torch_load_kwargs: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The state dict and metadata of a checkpoint directory (either format version).

    Args:
        directory: the checkpoint directory.
        trusted: load with the full unpickler, which runs whatever code the file names; only
            for files whose origin you trust. By default only tensors, plain containers and
            RNG states are accepted.
        torch_load_kwargs: passed to ``torch.load`` (e.g. ``{"map_location": "cuda:0"}``);
            ``map_location`` defaults to ``"cpu"``.

    Raises:
        CheckpointError: no state file, one that cannot be read (truncated, corrupt), or one
            holding objects that weights-only loading refuses (without ``trusted``).
    """
    directory = pathlib.Path(directory)
    metadata = _read_json(directory / METADATA_FILE)
    for name in _STATE_PATHS:
        path = directory / name
        if path.is_file():
            break
    else:
        raise CheckpointError(
            f"{directory}: not a checkpoint: it holds neither {STATE_FILE} nor "
            f"{DETERMINED_STATE_FILE}; pass the directory that contains one"
        )
    _check_sums(path)
    state = _torch_load(path, trusted=trusted, torch_load_kwargs=torch_load_kwargs)
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: holds {type(state).__name__}, not a trial's state dict")
    if "batches_trained" not in state:
        _upgrade_determined(state, metadata, directory)
    if "models_state_dict" not in state:
        raise CheckpointError(f"{path}: has no `models_state_dict`; it was not written by a trial")
    return state, metadata


def _weights_only_globals() -> list[Callable[..., Any] | tuple[Callable[..., Any], str]]:
    """What weights-only loading accepts beyond torch's defaults: numpy RNG states and numbers.

    ``np.random.get_state()`` holds a uint32 ``ndarray`` (rebuilt by ``_reconstruct``, ``ndarray``
    and ``dtype``); callbacks' states may hold numpy scalars. numpy 1.x wrote the same functions
    under ``numpy.core``, numpy 2 under ``numpy._core``. None of these can call arbitrary code:
    an object array's items go through the same allow-list.
    """
    multiarray = np._core.multiarray  # type: ignore[attr-defined]
    allowed: list[Callable[..., Any] | tuple[Callable[..., Any], str]] = [
        np.ndarray,
        np.dtype,
        multiarray._reconstruct,
        multiarray.scalar,
        (multiarray._reconstruct, "numpy.core.multiarray._reconstruct"),
        (multiarray.scalar, "numpy.core.multiarray.scalar"),
    ]
    # numpy >= 1.25 may pickle a dtype through its class (``numpy.dtypes.UInt32DType``).
    for code in ("?", "b", "h", "i", "l", "q", "B", "H", "I", "L", "Q", "e", "f", "d"):
        cls = type(np.dtype(code))
        if cls not in allowed:
            allowed.append(cls)
    return allowed


_REFUSED_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


def _torch_load(
    path: pathlib.Path, *, trusted: bool, torch_load_kwargs: dict[str, Any] | None
) -> Any:
    kwargs: dict[str, Any] = {"map_location": "cpu", **(torch_load_kwargs or {})}
    if trusted:
        kwargs["weights_only"] = False
        return _read(path, kwargs)
    if kwargs.pop("weights_only", True) is False:
        raise CheckpointError(
            f"{path}: torch_load_kwargs asks for weights_only=False; pass trusted=True instead, "
            "and only if you trust where this file came from"
        )
    # Added for this load only (and not removed if the user had added them already).
    present = set(map(_global_key, torch.serialization.get_safe_globals()))
    extra = [g for g in _weights_only_globals() if _global_key(g) not in present]
    with torch.serialization.safe_globals(extra):
        try:
            return torch.load(path, weights_only=True, **kwargs)
        except pickle.UnpicklingError as exc:
            refused = _refused_global(path, exc)
            if refused is None:
                raise _corrupt(path, exc) from exc
            raise CheckpointError(
                f"{path}: weights-only loading refused `{refused}` (this checkpoint holds "
                "objects beyond tensors, containers and RNG states); pass trusted=True only "
                "if you trust where this file came from"
            ) from None
        except Exception as exc:  # any other failure to unpickle means a bad file
            raise _corrupt(path, exc) from exc


def _check_sums(path: pathlib.Path) -> None:
    """Check the CRC-32 that ``torch.save`` writes for every record of its zip file.

    ``torch.load`` does not check them: a flipped bit in a tensor's bytes loads without a
    word, and the trial would train on from damaged weights. Records written with torch's
    checksums off (``torch.serialization.set_crc32_options(False)``: CRC 0) are not checked,
    nor are files in torch's legacy format, which is not a zip file.
    """
    if not zipfile.is_zipfile(path):
        return  # the legacy format, or a truncated file: torch.load tells which
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if info.CRC == 0 and info.file_size:
                    continue
                with archive.open(info) as record:  # raises BadZipFile on a CRC mismatch
                    while record.read(1 << 22):
                        pass
    except (zipfile.BadZipFile, EOFError, ValueError) as exc:
        raise _corrupt(path, exc) from exc


def _read(path: pathlib.Path, kwargs: dict[str, Any]) -> Any:
    try:
        return torch.load(path, **kwargs)
    except Exception as exc:  # any unpickling failure means a bad file
        raise _corrupt(path, exc) from exc


def _corrupt(path: pathlib.Path, exc: BaseException) -> CheckpointError:
    detail = " ".join(str(exc).split())[:300]
    return CheckpointError(
        f"{path}: cannot be read ({type(exc).__name__}: {detail}); the file is truncated or "
        "corrupt, resume from an earlier checkpoint"
    )


def _global_key(item: Any) -> str:
    if isinstance(item, tuple):
        return str(item[1])
    return f"{getattr(item, '__module__', '')}.{getattr(item, '__qualname__', item)}"


def _refused_global(path: pathlib.Path, exc: BaseException) -> str | None:
    """The name of the class or function weights-only loading refused, or None (a bad file)."""
    match = _REFUSED_GLOBAL.search(str(exc)) if "Weights only load failed" in str(exc) else None
    if match:  # torch names the first global it refused
        return match.group(1)
    try:  # else look for any global beyond the allow-list in the file
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # not a zip checkpoint, or a damaged one
        return None
    return str(sorted(unsafe)[0]) if unsafe else None


def _upgrade_determined(
    state: dict[str, Any], metadata: dict[str, Any], directory: pathlib.Path
) -> None:
    """Determined's state dict and metadata (format 1) in searchlab's layout, in place."""
    for old, new in _LEGACY_KEYS.items():
        if old in state and new not in state:
            state[new] = [state.pop(old)]
    if isinstance(state.get("scaler_state_dict"), Mapping):  # Determined saved one GradScaler
        state["scaler_state_dict"] = [state["scaler_state_dict"]]
    rng = state.get("rng_state")
    if isinstance(rng, dict):
        if "random_rng_state" in rng:
            rng.setdefault("random_state", rng.pop("random_rng_state"))
        if isinstance(rng.get("gpu_rng_state"), torch.Tensor):  # one device's state
            rng["gpu_rng_state"] = [rng["gpu_rng_state"]]
    state["batches_trained"] = int(metadata.get("steps_completed", 0))
    load_data = _read_json(directory / DETERMINED_LOAD_DATA)
    if load_data.get("trial_cls_spec"):
        metadata.setdefault("trial_class", load_data["trial_cls_spec"])
    if isinstance(load_data.get("hparams"), dict):
        metadata.setdefault("hparams", load_data["hparams"])
    metadata.setdefault("format_version", 1)


def _read_json(path: pathlib.Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: cannot be read as JSON ({exc})") from exc
    return data if isinstance(data, dict) else {}


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, pathlib.Path):
        return str(obj)
    return repr(obj)
