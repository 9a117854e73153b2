"""The Tune checkpoint of a script trial: a copy of the script's checkpoint directory, with
searchlab's keys added to its ``metadata.json``; and what a failed run leaves for its restart.

The keys: ``searchlab_length_done`` (the longest rung length reported, as for class trials),
``batches_trained`` (the trial's position, from the script's ``steps_completed`` where it gave
no other), ``searchlab_script_save`` (which save of its actor it is: an actor whose script still
waits at that save resumes it without a restart) and ``searchlab_script_runs`` (how many times
the script ran: Determined's ``trial_run_id``).

Example:
    >>> copy_checkpoint(script_checkpoint, tune_dir)
    >>> add_metadata(tune_dir, {LENGTH_DONE_KEY: 8, SAVE_KEY: token, RUNS_KEY: 2})
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
from typing import Any

__all__ = [
    "RUNS_KEY",
    "SAVE_KEY",
    "add_metadata",
    "copy_checkpoint",
    "load_failed_run",
    "read_metadata",
    "save_failed_run",
]

METADATA_FILE = "metadata.json"
SAVE_KEY = "searchlab_script_save"
RUNS_KEY = "searchlab_script_runs"
_FAILED_RUN = "failed-run.json"


def copy_checkpoint(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Copy a checkpoint directory (hard links where the file system allows: the files of a
    stored checkpoint are never written again)."""

    def link_or_copy(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, target, copy_function=link_or_copy, dirs_exist_ok=True)


def read_metadata(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """A checkpoint's ``metadata.json`` (empty when it has none or it is not a map)."""
    try:
        data = json.loads((pathlib.Path(directory) / METADATA_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def add_metadata(directory: str | os.PathLike[str], extra: dict[str, Any]) -> None:
    """Add searchlab's keys to a copied checkpoint's metadata, in a new file (the copy's may be
    a hard link to the script's own)."""
    path = pathlib.Path(directory) / METADATA_FILE
    meta = read_metadata(directory)
    meta.setdefault("batches_trained", meta.get("steps_completed"))
    meta.update({k: v for k, v in extra.items() if v is not None or k not in meta})
    if path.exists():
        path.unlink()
    tmp = path.with_name(f".{METADATA_FILE}.tmp")
    tmp.write_text(json.dumps(meta, indent=2, default=str))
    os.replace(tmp, path)


def save_failed_run(trial_scratch: pathlib.Path, latest: dict[str, Any], runs: int) -> None:
    """Note, in the trial's scratch directory, the newest checkpoint of a run that failed."""
    trial_scratch.mkdir(parents=True, exist_ok=True)
    (trial_scratch / _FAILED_RUN).write_text(json.dumps({"latest": latest, "runs": runs}))


def load_failed_run(trial_scratch: pathlib.Path) -> tuple[dict[str, Any], int] | None:
    """What ``save_failed_run`` noted, while its checkpoint is still there."""
    try:
        kept = json.loads((trial_scratch / _FAILED_RUN).read_text())
        latest, runs = dict(kept["latest"]), int(kept["runs"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (latest, runs) if pathlib.Path(str(latest.get("path"))).is_dir() else None
