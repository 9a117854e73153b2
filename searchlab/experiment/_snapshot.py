"""One consistent, atomic snapshot of an experiment's resumable state: ``searchlab_state.json``.

Ray Tune saves an experiment in three files per driver session (``experiment_state-*``,
``search_gen_state-*``, ``searcher-state-*``), written into a staging directory and then
copied to the experiment directory by a background thread, file by file and in place. A
driver killed during that copy leaves them torn or truncated, and Tune's restore then
silently starts the search over. searchlab therefore keeps its own copy: each time Tune
saves, the three files (complete, in the staging directory) and the search driver's state
are written to ``searchlab_state.json`` in one atomic replace. It is never older than what
Tune copied, so ``searchlab resume`` puts Tune's files back from it before Tune reads them.

The snapshot also records the experiment's config (and its digest): a resume whose config
was edited is refused, naming what changed. A checkpoint that the snapshot names is never
deleted (see ``TrialRecorder``): deletions wait until a newer snapshot is on disk.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import pathlib
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from searchlab._failpoints import failpoint
from searchlab.errors import ConfigError
from searchlab.experiment._compat import TUNE_STATE_PATTERNS, tune_session_of

__all__ = [
    "SNAPSHOT_FILE",
    "ResumeCheck",
    "Snapshots",
    "config_digest",
    "prepare_resume",
]

SNAPSHOT_FILE = "searchlab_state.json"
_VERSION = 1
_FORCE = "`searchlab resume {dir} --force-restart` starts the search over in a new directory"


def config_digest(config: Mapping[str, Any]) -> str:
    """SHA-256 of the config as canonical JSON: equal configs, equal digests."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _newest(directory: pathlib.Path, kind: str) -> pathlib.Path | None:
    pattern = TUNE_STATE_PATTERNS[kind].format("*")
    found = [p for p in directory.glob(pattern) if tune_session_of(p, kind)]
    return max(found, key=lambda p: p.name) if found else None


class Snapshots:
    """Writes ``searchlab_state.json`` each time Tune saves the experiment.

    ``generation`` counts the snapshots written by this driver; deletions decided before a
    generation may run once it is on disk. ``error`` holds the OSError of a failed write (a
    full disk): the run then pauses, keeping the last snapshot, which stays consistent.
    """

    def __init__(self, experiment_dir: pathlib.Path, config: Mapping[str, Any]) -> None:
        self.path = experiment_dir / SNAPSHOT_FILE
        self._config = dict(config)
        self._digest = config_digest(config)
        self.generation = 0
        self.error: OSError | None = None
        self._staging: pathlib.Path | None = None
        self._driver_state: Callable[[], dict[str, Any]] | None = None

    def searcher_file_text(self, driver_state: dict[str, Any]) -> str:
        """What Tune's ``searcher-state-*.pkl`` holds: the driver's state and the config digest."""
        return json.dumps({"config_sha256": self._digest, "driver": driver_state})

    def staged(self, staging_dir: pathlib.Path, driver_state: Callable[[], dict[str, Any]]) -> None:
        """Tune is saving into ``staging_dir`` (called from the searcher's ``save``)."""
        self._staging, self._driver_state = staging_dir, driver_state

    def write(self) -> None:
        """Snapshot what Tune just saved (called once its experiment state files are complete)."""
        if self._staging is None or self._driver_state is None:
            return
        staging, self._staging = self._staging, None
        experiment_state = _newest(staging, "experiment_state")
        search_gen = _newest(staging, "search_gen_state")
        if experiment_state is None or search_gen is None:
            return  # Tune saved no experiment state this time
        session = tune_session_of(experiment_state, "experiment_state")
        data = {
            "format": "searchlab-state",
            "version": _VERSION,
            "written_at": time.time(),
            "session": session,
            "config_sha256": self._digest,
            "config": self._config,
            "driver": self._driver_state(),
            "tune": {
                "experiment_state": experiment_state.read_text(),
                "search_gen_state": base64.b64encode(search_gen.read_bytes()).decode(),
            },
        }
        try:
            atomic_write(self.path, json.dumps(data))
        except OSError as exc:
            self.error = exc
            return
        self.generation += 1


def atomic_write(path: pathlib.Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a crash leaves the old or the new file, never half.

    The rename is made durable too (the folder is synced), so files written after it cannot
    outlive it in a power loss. The temporary file is removed when the write fails (a full
    disk leaves nothing behind).
    """
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        failpoint(f"write-{path.name}")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _sync_folder(path.parent)


def _sync_folder(folder: pathlib.Path) -> None:
    """fsync a folder, so that a rename in it is on disk; a file system that cannot sync
    folders (some network ones) is left as it is."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@dataclasses.dataclass(frozen=True)
class ResumeCheck:
    """What ``prepare_resume`` found: lines to tell the user (repairs made)."""

    notes: list[str]


def prepare_resume(experiment_dir: pathlib.Path, config: Mapping[str, Any]) -> ResumeCheck:
    """Check that an experiment can be resumed exactly, and put Tune's state files in order.

    Raises:
        ConfigError: the state is damaged, missing or was saved with another config; the
            message names the file or the config paths and what to do.
    """
    path = experiment_dir / SNAPSHOT_FILE
    if not path.is_file():
        return _check_tune_files(experiment_dir, config)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != "searchlab-state":
            raise ValueError("not a searchlab state file")
        session, tune = str(data["session"]), data["tune"]
        texts = {
            "experiment_state": tune["experiment_state"].encode(),
            "search_gen_state": base64.b64decode(tune["search_gen_state"]),
            "searcher_state": json.dumps(
                {"config_sha256": data["config_sha256"], "driver": data["driver"]}
            ).encode(),
        }
        json.loads(texts["experiment_state"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"{path}: damaged ({_reason(exc)}); the experiment's state cannot be trusted. "
            + _FORCE.format(dir=experiment_dir)
        ) from None
    if data.get("version") != _VERSION:
        raise ConfigError(
            f"{path}: written by another searchlab version (state version "
            f"{data.get('version')!r}, this one reads {_VERSION}); resume with that version"
        )
    _check_config(experiment_dir, data.get("config") or {}, data["config_sha256"], config)
    notes = []
    for kind, content in texts.items():
        target = experiment_dir / TUNE_STATE_PATTERNS[kind].format(session)
        if target.is_file() and target.read_bytes() == content:
            continue
        if target.exists():
            notes.append(
                f"{target.name} was incomplete (the driver stopped while Ray Tune copied it); "
                f"restored from {SNAPSHOT_FILE}"
            )
        atomic_write_bytes(target, content)
        for newer in _newer_sessions(experiment_dir, kind, session):
            newer.rename(newer.with_name(newer.name + ".superseded"))
    return ResumeCheck(notes)


def atomic_write_bytes(path: pathlib.Path, content: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        tmp.write_bytes(content)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _newer_sessions(directory: pathlib.Path, kind: str, session: str) -> list[pathlib.Path]:
    pattern = TUNE_STATE_PATTERNS[kind].format("*")
    return [
        p
        for p in directory.glob(pattern)
        if (s := tune_session_of(p, kind)) is not None and s > session
    ]


def _check_config(
    experiment_dir: pathlib.Path, saved: Mapping[str, Any], digest: str, current: Mapping[str, Any]
) -> None:
    if config_digest(current) == digest:
        return
    changed = _changed_paths(saved, current) if saved else []
    shown = ", ".join(changed[:4]) + (", ..." if len(changed) > 4 else "")
    raise ConfigError(
        f"{experiment_dir / 'experiment.json'}: config: differs from the one the experiment "
        f"started with ({shown or 'changed'}); undo the change to resume, or "
        + _FORCE.format(dir=experiment_dir)
        + " with the new config"
    )


def _changed_paths(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        out: list[str] = []
        for key in sorted(set(old) | set(new), key=str):
            out += _changed_paths(old.get(key), new.get(key), f"{prefix}{key}.")
        return out
    if old != new:
        return [f"{prefix.rstrip('.')}: {_short(old)} -> {_short(new)}"]
    return []


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_tune_files(experiment_dir: pathlib.Path, config: Mapping[str, Any]) -> ResumeCheck:
    """No snapshot (the driver died before Tune's first save): check Tune's own files."""
    state = _newest(experiment_dir, "experiment_state")
    if state is None:
        raise ConfigError(
            f"{experiment_dir}: the experiment stopped before it saved any state, so there is "
            "nothing to resume; run its config again with `searchlab run`"
        )
    session = tune_session_of(state, "experiment_state")
    for kind in TUNE_STATE_PATTERNS:
        path = experiment_dir / TUNE_STATE_PATTERNS[kind].format(session)
        if not path.is_file():
            raise ConfigError(
                f"{path}: missing; the experiment's state is incomplete. "
                + _FORCE.format(dir=experiment_dir)
            )
    for kind in ("experiment_state", "searcher_state"):
        path = experiment_dir / TUNE_STATE_PATTERNS[kind].format(session)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"{path}: damaged ({_reason(exc)}); the experiment's state cannot be trusted. "
                + _FORCE.format(dir=experiment_dir)
            ) from None
        if kind == "searcher_state":
            _check_config(experiment_dir, {}, str(data.get("config_sha256")), config)
    return ResumeCheck([])


def _reason(exc: BaseException) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
    if isinstance(exc, KeyError):
        return f"no {exc.args[0]!r} entry"
    return str(exc) or type(exc).__name__
