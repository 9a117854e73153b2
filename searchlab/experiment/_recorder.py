"""Follows trials as Tune runs them: event lines, a progress table, and ``trials.json``.

``trials.json`` in the experiment directory is rewritten (atomically) whenever a trial changes,
so results can be read while an experiment runs or after its driver died.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
import time
import uuid
import weakref
from collections.abc import Callable
from typing import Any

from ray.tune import Callback
from ray.tune.experiment import Trial

from searchlab.experiment._retention import (
    RetentionPolicy,
    SavedCheckpoint,
    checkpoints_to_delete,
    delete_checkpoints,
)
from searchlab.experiment._spec import HPARAMS_KEY, TRIAL_KEY, ExperimentSpec
from searchlab.experiment._trial_runner import (
    FATAL_KEY,
    INVALID_HP_KEY,
    LENGTH_KEY,
    RUNG_KEY,
    TRIAL_ERROR_KEY,
    WARNING_KEY,
)

__all__ = ["TRIALS_FILE", "TrialRecorder"]

TRIALS_FILE = "trials.json"
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_STATE_FILES = ("state-dict.pth", "state_dict.pth")
_STATES = {
    Trial.PENDING: "PENDING",
    Trial.RUNNING: "RUNNING",
    Trial.PAUSED: "PAUSED",
    Trial.TERMINATED: "COMPLETED",
    Trial.ERROR: "ERRORED",
}


class TrialRecorder(Callback):
    """Keeps one record per trial and tells the user what happens, one line per event.

    It pickles as a reference to the live recorder of its experiment directory in this
    process (see :func:`_live_recorder`).
    """

    def __init__(
        self,
        spec: ExperimentSpec,
        experiment_dir: pathlib.Path,
        echo: Callable[[str], None] = print,
        table_every_s: float = 15.0,
        rung_table: Callable[[], list[dict[str, Any]]] | None = None,
        restored: bool = False,
    ) -> None:
        self._spec = spec
        self._dir = experiment_dir
        self._echo = echo
        self._table_every_s = table_every_s
        self._rung_table = rung_table
        self._last_table = time.monotonic()
        self.records: dict[str, dict[str, Any]] = {}
        self._status: dict[str, str] = {}
        self._dirty = False
        self.fatal: str | None = None
        storage = spec.exp_conf.get("checkpoint_storage") or {}
        self._retention = RetentionPolicy(
            save_trial_latest=int(storage.get("save_trial_latest", 1)),
            save_trial_best=int(storage.get("save_trial_best", 1)),
            save_experiment_best=int(storage.get("save_experiment_best", 0)),
            smaller_is_better=spec.smaller_is_better,
        )
        self._restored = restored
        if restored:
            self._load_existing()
        _LIVE[_registry_key(experiment_dir)] = self

    def __reduce__(self) -> tuple[Any, ...]:
        return _live_recorder, (_registry_key(self._dir),)

    def _drop_phantoms(self, trials: list[Trial]) -> None:
        """Trials the dead driver created after Tune's last saved state never existed for the
        resumed experiment (its searcher will create them anew): forget their records."""
        self._restored = False
        known = {t.trial_id for t in trials}
        for trial_id, rec in list(self.records.items()):
            if trial_id not in known and rec["state"] not in _FINISHED:
                del self.records[trial_id]
                self._dirty = True

    def _load_existing(self) -> None:
        """A resumed experiment keeps its trials' records (best metric, checkpoints, errors)."""
        path = self._dir / TRIALS_FILE
        if not path.is_file():
            return
        for rec in json.loads(path.read_text()).get("trials", []):
            rec.setdefault("saved_checkpoints", [])
            self.records[rec["trial_id"]] = rec
            if rec["state"] in _FINISHED:
                self._status[rec["trial_id"]] = rec["state"]

    # -- Tune hooks -----------------------------------------------------------------
    def on_trial_start(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        self._record(trial)

    def on_trial_result(
        self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any], **info: Any
    ) -> None:
        rec = self._record(trial)
        rec["batches"] = int(result.get("batches", rec["batches"]))
        if result.get(INVALID_HP_KEY):
            rec["state"] = "INVALID_HP"
            rec["error"] = f"InvalidHP: {result[INVALID_HP_KEY]}"
            self._say(trial, f"raised InvalidHP ({result[INVALID_HP_KEY]}); it will be replaced")
        if result.get(FATAL_KEY):
            rec["error"] = result[FATAL_KEY]
            rec["_fatal"] = True
            self.fatal = self.fatal or str(result[FATAL_KEY])
        if result.get(TRIAL_ERROR_KEY):
            rec["error"] = result[TRIAL_ERROR_KEY]
            rec["_fatal"] = True  # shown as ERRORED although Tune ended it normally
        if result.get(WARNING_KEY):
            rec.setdefault("warnings", []).append(str(result[WARNING_KEY]))
            self._say(trial, f"warning: {result[WARNING_KEY]}")
        if result.get("group") == "validation" and self._spec.metric in result:
            rec["_validated_at"] = int(result.get("batches", -1))
            self._on_validation(trial, rec, result)
        self._dirty = True

    def _on_validation(self, trial: Trial, rec: dict[str, Any], result: dict[str, Any]) -> None:
        value = float(result[self._spec.metric])
        rec["last_metric"] = value
        better = rec["best_metric"] is None or _better(value, rec["best_metric"], self._spec)
        if better and math.isfinite(value):
            rec["best_metric"] = value
            rec["_best_pending"] = True
        if RUNG_KEY in result:
            rec["rung"] = max(rec.get("rung") or 0, int(result[RUNG_KEY]))
            self._say(
                trial,
                f"reached {result[LENGTH_KEY]} {self._spec.length_unit}: "
                f"{self._spec.metric}={value:.6g}",
            )

    def on_checkpoint(
        self, iteration: int, trials: list[Trial], trial: Trial, checkpoint: Any, **info: Any
    ) -> None:
        rec = self._record(trial)
        path = str(getattr(checkpoint, "path", checkpoint))
        if not _holds_state(path):
            return  # a trial that never built (InvalidHP, broken trial) saves an empty directory
        rec["latest_checkpoint"] = path
        if rec.pop("_best_pending", False) or rec["checkpoint"] is None:
            rec["checkpoint"] = path
        batches = _checkpoint_batches(path)
        metric = rec["last_metric"] if rec.get("_validated_at") == batches else None
        rec["saved_checkpoints"].append({"path": path, "batches": batches, "metric": metric})
        self._apply_retention()
        self._dirty = True

    def _apply_retention(self) -> None:
        """Delete the checkpoints ``checkpoint_storage`` does not keep (never one a trial needs)."""
        saved = [
            SavedCheckpoint(rec["trial_id"], c["path"], i, c["metric"], rec["state"] in _FINISHED)
            for rec in self.records.values()
            for i, c in enumerate(rec["saved_checkpoints"])
        ]
        gone = set(delete_checkpoints(checkpoints_to_delete(saved, self._retention)))
        if not gone:
            return
        for rec in self.records.values():
            rec["saved_checkpoints"] = [
                c for c in rec["saved_checkpoints"] if c["path"] not in gone
            ]
            if rec["checkpoint"] in gone:
                rec["checkpoint"] = _best_remaining(rec["saved_checkpoints"], self._spec)

    def on_trial_error(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        rec = self._record(trial)
        rec["error"] = _error_text(trial)
        self._dirty = True

    def on_trial_recover(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        rec = self._record(trial)
        rec["restarts"] += 1
        self._say(trial, f"failed; retry {rec['restarts']} from its latest checkpoint")

    def on_step_end(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        if self._restored:
            self._drop_phantoms(trials)
        for trial in trials:
            self._track_status(trial)
        if self._dirty:
            self.write()
        if time.monotonic() - self._last_table >= self._table_every_s:
            self.print_table()

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        for trial in trials:
            self._track_status(trial)
        self.write()

    # -- bookkeeping ----------------------------------------------------------------
    def _record(self, trial: Trial) -> dict[str, Any]:
        rec = self.records.get(trial.trial_id)
        if rec is None:
            info = trial.config.get(TRIAL_KEY, {})
            rec = self.records[trial.trial_id] = {
                "trial_id": trial.trial_id,
                "state": "PENDING",
                "hparams": trial.config.get(HPARAMS_KEY, {}),
                "bracket": info.get("bracket"),
                "rung": None,
                "trial_seed": info.get("trial_seed"),
                "batches": 0,
                "best_metric": None,
                "last_metric": None,
                "checkpoint": None,
                "latest_checkpoint": None,
                "error": None,
                "restarts": 0,
                "warnings": [],
                "trial_dir": trial.local_path,
                "saved_checkpoints": [],
            }
        return rec

    def _track_status(self, trial: Trial) -> None:
        rec = self._record(trial)
        state = _STATES.get(trial.status, trial.status)
        if rec["state"] == "INVALID_HP":
            state = "INVALID_HP"
        elif rec.get("_fatal") and state == "COMPLETED":
            state = "ERRORED"  # Tune ended it normally, but the trial stopped on a user error
        previous = self._status.get(trial.trial_id)
        if previous == state:
            return
        self._status[trial.trial_id] = state
        rec["state"] = state
        self._dirty = True
        if state in _FINISHED:
            self._apply_retention()
        if state == "RUNNING":
            shown = ", ".join(f"{k}={_short(v)}" for k, v in _flat(rec["hparams"]).items())
            verb = "resumed" if previous == "PAUSED" or rec["batches"] else "started"
            self._say(trial, f"{verb} at batch {rec['batches']} ({shown})")
        elif state == "PAUSED":
            self._say(trial, f"paused at batch {rec['batches']}; its slot is free")
        elif state == "COMPLETED":
            self._say(
                trial,
                f"finished at batch {rec['batches']}, best {self._spec.metric}={_short(rec['best_metric'])}",
            )
        elif state == "ERRORED":
            err = (rec["error"] or "").strip().splitlines()
            self._say(trial, f"errored: {err[-1] if err else 'unknown error'}")

    def _say(self, trial: Trial, text: str) -> None:
        self._echo(f"{time.strftime('%H:%M:%S')} trial {trial.trial_id} {text}")

    def print_table(self) -> None:
        from searchlab.experiment._table import format_progress

        self._last_table = time.monotonic()
        rungs = self._rung_table() if self._rung_table else None
        self._echo(format_progress(list(self.records.values()), self._spec, rungs))

    def write(self) -> None:
        self._dirty = False
        self._dir.mkdir(parents=True, exist_ok=True)
        data = {"updated": time.time(), "trials": [_public(r) for r in self.records.values()]}
        tmp = self._dir / f".{TRIALS_FILE}.{uuid.uuid4().hex}.tmp"
        tmp.write_text(json.dumps(data, indent=1, default=str))
        os.replace(tmp, self._dir / TRIALS_FILE)


_FINISHED = ("COMPLETED", "ERRORED", "INVALID_HP")

# Tune pickles the run's stopper, which holds the recorder, into its experiment state at every
# save (each second), and on resume puts the unpickled copy in place of the stopper it was
# given. A recorder pickled by value made every save carry all records and the echo callable,
# and left a resumed run's stopper watching a stale copy that never sees a user error. By
# reference, the copy is the live recorder of the same experiment.
_LIVE: weakref.WeakValueDictionary[str, TrialRecorder] = weakref.WeakValueDictionary()


class _DetachedRecorder(Callback):
    """A recorder unpickled where its experiment does not run: records and stops nothing."""

    fatal: str | None = None


def _registry_key(experiment_dir: pathlib.Path) -> str:
    return str(pathlib.Path(experiment_dir).resolve())


def _live_recorder(key: str) -> TrialRecorder | _DetachedRecorder:
    """The recorder of the experiment running from ``key`` in this process, if any."""
    return _LIVE.get(key) or _DetachedRecorder()


def _checkpoint_batches(path: str) -> int | None:
    try:
        meta = json.loads((pathlib.Path(path) / "metadata.json").read_text())
        return int(meta["batches_trained"])
    except (OSError, ValueError, KeyError):
        return None


def _best_remaining(saved: list[dict[str, Any]], spec: ExperimentSpec) -> str | None:
    sign = 1.0 if spec.smaller_is_better else -1.0
    validated = [c for c in saved if c["metric"] is not None and math.isfinite(c["metric"])]
    return min(validated, key=lambda c: sign * c["metric"])["path"] if validated else None


def _public(rec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in rec.items() if not k.startswith("_")}


def _better(value: float, best: float, spec: ExperimentSpec) -> bool:
    return value < best if spec.smaller_is_better else value > best


def _error_text(trial: Trial) -> str:
    path = getattr(trial, "error_file", None) or ""
    text = ""
    try:
        if path and os.path.exists(path):
            text = pathlib.Path(path).read_text()
    except OSError:
        pass
    text = text or str(getattr(trial, "error_msg", "") or "unknown error")
    return _ANSI_ESCAPE.sub("", text)  # Ray colours the actor name in tracebacks


def _holds_state(path: str) -> bool:
    """False for a local checkpoint directory without a trial state (nothing to load from it)."""
    directory = pathlib.Path(path)
    if not directory.is_dir():
        return True  # remote storage: trust Tune
    return any((directory / name).is_file() for name in _STATE_FILES)


def _flat(hparams: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in hparams.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
