"""The driver's files of an experiment directory: ``experiment.json`` and ``trials.json``.

Paths in ``trials.json`` are relative to the experiment directory (older files hold absolute
paths). They are resolved against the directory being read and never lead outside it: an
absolute path is re-rooted by its trailing ``<trial dir>/checkpoint_*`` part, so a copied or
moved experiment reads its own checkpoints, and a path that escapes is ignored with a warning.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import warnings
from typing import Any

from searchlab.errors import SearchlabError

__all__ = [
    "EXPERIMENT_FILE",
    "FORMAT_VERSION",
    "TRIALS_FILE",
    "PathResolver",
    "flatten_hparams",
    "read_experiment",
    "read_records",
    "rebuild_records",
    "saved_checkpoints",
]

EXPERIMENT_FILE = "experiment.json"
TRIALS_FILE = "trials.json"
FORMAT_VERSION = 2  # of trials.json: paths relative to the experiment directory
_CHECKPOINT_NAME = re.compile(r"checkpoint_\d+")
_STATE_FILES = ("state-dict.pth", "state_dict.pth")


def _load_json(path: pathlib.Path) -> Any:
    """The file's JSON; ValueError names what is wrong and where."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte {exc.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"not valid JSON at line {exc.lineno} column {exc.colno} ({exc.msg})"
        ) from None


def flatten_hparams(hparams: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested hyperparameters as ``{"optimizer.lr": 0.1, ...}``, keys sorted at every level."""
    out: dict[str, Any] = {}
    for key in sorted(hparams):
        value = hparams[key]
        if isinstance(value, dict) and value:
            out.update(flatten_hparams(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def read_experiment(experiment_dir: pathlib.Path) -> dict[str, Any]:
    """``experiment.json``, checked for the keys results need."""
    path = experiment_dir / EXPERIMENT_FILE
    if not path.is_file():
        raise SearchlabError(
            f"{experiment_dir}: not a searchlab experiment directory (no {EXPERIMENT_FILE})"
        )
    fix = (
        "restore it from a copy (the driver writes it once, when the experiment starts, "
        "from the experiment's config)"
    )
    try:
        data = _load_json(path)
    except (OSError, ValueError) as exc:
        raise SearchlabError(f"{path}: {_reason(exc)}; {fix}") from None
    if not isinstance(data, dict):
        raise SearchlabError(f"{path}: must hold a JSON object, got {type(data).__name__}; {fix}")
    for key in ("metric", "smaller_is_better"):
        if key not in data:
            raise SearchlabError(f"{path}: has no {key!r}; {fix}")
    return data


def read_records(experiment_dir: pathlib.Path) -> list[dict[str, Any]] | None:
    """The trial records of ``trials.json``; None when there is none yet (the driver died first)."""
    path = experiment_dir / TRIALS_FILE
    if not path.exists():
        return None
    try:
        data = _load_json(path)
        trials = data["trials"] if isinstance(data, dict) else None
        if not isinstance(trials, list) or not all(_is_record(r) for r in trials):
            raise ValueError("not a list of trial records under 'trials'")
        version = data.get("format_version", 1)
    except (OSError, ValueError, KeyError) as exc:
        raise SearchlabError(
            f"{path}: {_reason(exc)}; rebuild the trial records from the trial directories "
            f"with load_results({str(experiment_dir)!r}, rebuild=True)"
        ) from None
    if isinstance(version, int) and version > FORMAT_VERSION:
        raise SearchlabError(
            f"{path}: format_version {version} is newer than this searchlab reads "
            f"({FORMAT_VERSION}); upgrade searchlab to read it"
        )
    return trials


def _reason(exc: BaseException) -> str:
    if isinstance(exc, KeyError):
        return "has no 'trials'"
    if isinstance(exc, OSError):
        return f"cannot be read ({exc.strerror or exc})"
    return str(exc)


def _is_record(rec: Any) -> bool:
    return isinstance(rec, dict) and isinstance(rec.get("trial_id"), str) and bool(rec["trial_id"])


def rebuild_records(experiment_dir: pathlib.Path) -> list[dict[str, Any]]:
    """Records rebuilt from Tune's trial directories (state ``UNKNOWN``), in name order.

    A record's ``_checkpoints`` lists the names of its ``checkpoint_*`` directories.
    """
    records = []
    try:
        names = sorted(
            e.name for e in os.scandir(experiment_dir) if e.is_dir(follow_symlinks=False)
        )
    except OSError:
        return []
    for name in names:
        try:
            children = os.listdir(experiment_dir / name)
        except OSError:
            continue
        if "params.json" not in children:
            continue
        try:
            config = _load_json(experiment_dir / name / "params.json")
        except (OSError, ValueError):
            config = {}
        hparams = config.get("hparams", {}) if isinstance(config, dict) else {}
        records.append(
            {
                "trial_id": name,
                "state": "UNKNOWN",
                "hparams": hparams if isinstance(hparams, dict) else {},
                "trial_dir": name,
                "_checkpoints": sorted(c for c in children if _CHECKPOINT_NAME.fullmatch(c)),
            }
        )
    return records


def saved_checkpoints(trial_dir: str, names: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """The checkpoint directories among ``names`` that hold a state, with their metadata."""
    found = []
    for name in names:
        path = os.path.join(trial_dir, name)
        if os.path.islink(path) or not (
            any(os.path.isfile(os.path.join(path, state)) for state in _STATE_FILES)
            or os.path.isfile(os.path.join(path, "metadata.json"))  # a script trial's
        ):
            continue
        try:
            meta = _load_json(pathlib.Path(path) / "metadata.json")
        except (OSError, ValueError):
            meta = {}
        found.append((path, meta if isinstance(meta, dict) else {}))
    return found


class PathResolver:
    """Turns the paths a ``trials.json`` records into paths inside this experiment directory.

    Loading checks paths lexically (no ``..`` or absolute path leads out); before a checkpoint
    is loaded, :meth:`inside` also follows symbolic links.

    Example:
        >>> paths = PathResolver(pathlib.Path("/data/exp"))
        >>> paths.checkpoint("3f2a_00001/checkpoint_000002", "3f2a_00001")
        '/data/exp/3f2a_00001/checkpoint_000002'
        >>> paths.checkpoint("/old/place/exp/3f2a_00001/checkpoint_000002", "3f2a_00001")
        '/data/exp/3f2a_00001/checkpoint_000002'
    """

    def __init__(self, experiment_dir: pathlib.Path) -> None:
        self.root = os.path.realpath(experiment_dir)
        self._prefix = self.root.rstrip(os.sep) + os.sep
        self.ignored: list[str] = []

    def checkpoint(self, value: Any, trial_id: str) -> str | None:
        """The checkpoint directory ``value`` names, inside this experiment, or None."""
        return self._resolve(value, trial_id, "checkpoint", keep=2)

    def trial_dir(self, value: Any, trial_id: str) -> str | None:
        """The trial directory ``value`` names, inside this experiment, or None."""
        return self._resolve(value, trial_id, "trial_dir", keep=1)

    def own_trial_dir(self, trial_id: str) -> str | None:
        """``<experiment>/<trial_id>``, if the trial id is a plain directory name."""
        if trial_id in (".", "..") or os.sep in trial_id or "/" in trial_id:
            return None
        return self._prefix + trial_id

    def _resolve(self, value: Any, trial_id: str, what: str, keep: int) -> str | None:
        if not value:
            return None
        text = str(value)
        path = os.path.normpath(os.path.join(self.root, text))  # an absolute text replaces root
        if os.path.isabs(text) and not self._lexically_inside(path):
            parts = path.split(os.sep)
            named = len(parts) > keep and all(parts[-keep:])
            named = named and (keep == 1 or _CHECKPOINT_NAME.fullmatch(parts[-1]) is not None)
            path = self._prefix + os.sep.join(parts[-keep:]) if named else ""
        if path and self._lexically_inside(path):
            return path
        self.ignored.append(f"trial {trial_id} {what} {text!r}")
        return None

    def _lexically_inside(self, path: str) -> bool:
        return path == self.root or path.startswith(self._prefix)

    def inside(self, path: str) -> bool:
        """Whether ``path`` lies in the experiment directory, symbolic links followed."""
        return self._lexically_inside(os.path.realpath(path))

    def warn_ignored(self, source: pathlib.Path) -> None:
        """One warning line for every path that led outside the experiment directory."""
        if self.ignored:
            more = f" (and {len(self.ignored) - 1} more)" if len(self.ignored) > 1 else ""
            warnings.warn(
                f"{source}: ignored paths outside the experiment directory {self.root}: "
                f"{self.ignored[0]}{more}",
                stacklevel=4,
            )
            self.ignored.clear()
