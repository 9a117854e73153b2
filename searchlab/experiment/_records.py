"""The trial records of ``trials.json``: their fields, paths and reading back on resume.

One record per trial: ``trial_id``, ``state``, ``hparams``, ``bracket``, ``rung``,
``trial_seed``, ``batches``, ``best_metric``, ``last_metric``, ``checkpoint`` (the best),
``latest_checkpoint``, ``error``, ``restarts``, ``warnings``, ``trial_dir`` and
``saved_checkpoints`` (``path``, ``batches``, ``metric``). Paths are POSIX paths relative to
the experiment directory (format version 2); version 1 files held absolute paths, which are
re-rooted here by their ``<trial>/<checkpoint>`` tail, so a copied directory never points into
the original.
"""

from __future__ import annotations

import errno
import json
import math
import os
import pathlib
import re
from typing import Any

from searchlab.errors import ConfigError
from searchlab.experiment._protocol import TrialConfig
from searchlab.experiment._retention import inside
from searchlab.experiment._spec import ExperimentSpec
from searchlab.experiment._standby import says_out_of_memory

__all__ = [
    "FINISHED",
    "TRIALS_FILE",
    "best_remaining",
    "checkpoint_batches",
    "error_line",
    "gpu_sharing_hint",
    "holds_state",
    "is_disk_full",
    "load_records",
    "new_record",
    "public",
    "relative_to",
    "retry_line",
    "trial_error_text",
]

TRIALS_FILE = "trials.json"
FINISHED = ("COMPLETED", "ERRORED", "INVALID_HP")
_STATE_FILES = ("state-dict.pth", "state_dict.pth")
_PATH_FIELDS = ("checkpoint", "latest_checkpoint")


def new_record(trial_id: str, config: dict[str, Any]) -> dict[str, Any]:
    plan = TrialConfig.from_tune(config)
    return {
        "trial_id": trial_id,
        "state": "PENDING",
        "hparams": plan.hparams,
        "bracket": plan.bracket,
        "rung": None,
        "trial_seed": plan.trial_seed,
        "batches": 0,
        "best_metric": None,
        "last_metric": None,
        "checkpoint": None,
        "latest_checkpoint": None,
        "error": None,
        "restarts": 0,
        "warnings": [],
        "trial_dir": trial_id,
        "saved_checkpoints": [],
    }


def relative_to(root: pathlib.Path, path: str | os.PathLike[str] | None) -> str | None:
    """``path`` relative to ``root`` as a POSIX string, or None when it lies outside."""
    if path is None:
        return None
    try:
        rel = pathlib.Path(os.path.abspath(path)).relative_to(os.path.abspath(root))
    except ValueError:
        return None
    return rel.as_posix() if rel.parts else None


def _reroot(root: pathlib.Path, path: Any) -> str | None:
    """A stored path as a relative one inside ``root`` (old absolute paths by their tail)."""
    if not isinstance(path, str) or not path:
        return None
    pure = pathlib.PurePosixPath(path)
    if pure.is_absolute():
        tail = pure.parts[-2:] if pure.name.startswith("checkpoint_") else pure.parts[-1:]
        path = pathlib.PurePosixPath(*tail).as_posix()
    return path if inside(root, path) is not None else None


def load_records(experiment_dir: pathlib.Path) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The records of ``trials.json`` (and its pending deletions), paths made relative.

    Raises:
        ConfigError: the file is damaged; the message names it and what to do.
    """
    path = experiment_dir / TRIALS_FILE
    if not path.is_file():
        return {}, []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        trials = list(data["trials"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"{path}: damaged ({type(exc).__name__}: {exc}); restore it from a backup, or "
            "move it aside and resume again (the records are then rebuilt from Ray Tune's "
            "state, without the best metrics of finished trials)"
        ) from None
    records: dict[str, dict[str, Any]] = {}
    for rec in trials:
        rec.setdefault("saved_checkpoints", [])
        rec["trial_dir"] = str(rec["trial_id"])
        for field in _PATH_FIELDS:
            rec[field] = _reroot(experiment_dir, rec.get(field))
        rec["saved_checkpoints"] = [
            {**c, "path": p}
            for c in rec["saved_checkpoints"]
            if (p := _reroot(experiment_dir, c.get("path"))) is not None
        ]
        records[str(rec["trial_id"])] = rec
    pending = [p for x in data.get("pending_deletions", []) if (p := _reroot(experiment_dir, x))]
    return records, pending


def public(rec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in rec.items() if not k.startswith("_")}


def checkpoint_batches(path: pathlib.Path) -> int | None:
    try:
        meta = json.loads((path / "metadata.json").read_text())
        return int(meta["batches_trained"])
    except (OSError, ValueError, KeyError):
        return None


def best_remaining(saved: list[dict[str, Any]], spec: ExperimentSpec) -> str | None:
    sign = 1.0 if spec.smaller_is_better else -1.0
    validated = [c for c in saved if c["metric"] is not None and math.isfinite(c["metric"])]
    return min(validated, key=lambda c: sign * c["metric"])["path"] if validated else None


def holds_state(directory: pathlib.Path) -> bool:
    """False for a checkpoint directory without a trial state (nothing to load from it).

    A class trial's checkpoint holds ``state-dict.pth``; a script trial's holds whatever the
    script stored, with searchlab's ``metadata.json`` beside it.
    """
    if any((directory / name).is_file() for name in _STATE_FILES):
        return True
    try:
        return "searchlab_length_done" in json.loads((directory / "metadata.json").read_text())
    except (OSError, ValueError):
        return False


_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_DISK_FULL = f"[Errno {errno.ENOSPC}]"


def trial_error_text(trial: Any) -> str:
    """The traceback Tune saved for a failed trial (its error file), without colour codes."""
    path = getattr(trial, "error_file", None) or ""
    text = ""
    try:
        if path and os.path.exists(path):
            text = pathlib.Path(path).read_text()
    except OSError:
        pass
    text = text or str(getattr(trial, "error_msg", "") or "unknown error")
    return _ANSI_ESCAPE.sub("", text)  # Ray colours the actor name in tracebacks


def error_line(error_text: str, spec: ExperimentSpec) -> str:
    """A failed trial's one line: its traceback's last line, then what shares its GPU where
    it ran out of memory on a shared one (``gpu_sharing_hint``)."""
    lines = error_text.strip().splitlines()
    return (lines[-1] if lines else "unknown error") + gpu_sharing_hint(error_text, spec)


def retry_line(error_text: str, restarts: int, spec: ExperimentSpec) -> str:
    """A failed trial's line as Tune retries it: its traceback's last line, and for one that
    ran out of GPU memory beside standby's other trials, what its GPU does about it now."""
    lines = error_text.strip().splitlines()
    line = f"failed; retry {restarts} from its latest checkpoint: "
    line += lines[-1] if lines else "unknown error"
    if says_out_of_memory(error_text) and spec.standby:
        line += (
            " (beside standby's other trials: their GPU now gives memory back after every "
            "window, and parks trials between turns if that is not enough)"
        )
    return line


def gpu_sharing_hint(error_text: str, spec: ExperimentSpec) -> str:
    """For a trial that ran out of GPU memory on a GPU the experiment shares between trials,
    what shares it and how to stop sharing (to append to the failure's line); "" otherwise.

    A trial that fits a GPU alone can fail beside others: standby keeps every actor's model,
    CUDA context and allocator cache on the GPU, and ``gpus_per_trial`` below 1 packs trials.
    """
    if not says_out_of_memory(error_text):
        return ""
    if spec.standby:
        setting = "auto" if spec.standby_auto else spec.standby
        return (
            f" ({1 + spec.standby} trial actors share each GPU with SEARCHLAB_STANDBY="
            f"{setting}, which a resume keeps: run the search as a new experiment without "
            "SEARCHLAB_STANDBY, or with a smaller count)"
        )
    share = (spec.exp_conf.get("resources") or {}).get("gpus_per_trial")
    if share is not None and 0 < float(share) < 1:
        return (
            f" (resources.gpus_per_trial: {share} packs {math.floor(1 / float(share))} trials on "
            "each GPU: raise it to give each trial more of a GPU's memory)"
        )
    return ""


def is_disk_full(error_text: str) -> bool:
    """The trial failed because a disk was full (ENOSPC): a pause, not the trial's fault."""
    return _DISK_FULL in error_text
