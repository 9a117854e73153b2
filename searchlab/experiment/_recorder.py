"""Follows trials as Tune runs them: event lines, a progress table, and ``trials.json``.

``trials.json`` in the experiment directory is rewritten (atomically) whenever a trial changes,
so results can be read while an experiment runs or after its driver died. Paths in it are
relative to the experiment directory, so a copied or moved directory reads its own files.

The recorder also keeps the experiment's writes in a crash-safe order: each time Tune saves
the experiment, it has the snapshot written (``Snapshots``), and checkpoints the retention
policy lets go are deleted only after that (``DeferredDeletions``). A write that fails (a full
disk) pauses every trial at its checkpoint and ends the run resumably, saying so.
"""

from __future__ import annotations

import errno
import json
import math
import os
import pathlib
import time
from collections.abc import Callable, Iterable
from typing import Any

from ray.tune import Callback
from ray.tune.experiment import Trial

from searchlab._failpoints import failpoint
from searchlab.experiment._adapters import RestoreFailed
from searchlab.experiment._protocol import Outcome, TrialReport
from searchlab.experiment._records import (
    FINISHED,
    TRIALS_FILE,
    best_remaining,
    checkpoint_batches,
    error_line,
    holds_state,
    is_disk_full,
    load_records,
    new_record,
    public,
    relative_to,
    retry_line,
    trial_error_text,
)
from searchlab.experiment._retention import (
    DeferredDeletions,
    RetentionPolicy,
    SavedCheckpoint,
    checkpoints_to_delete,
)
from searchlab.experiment._snapshot import Snapshots, atomic_write
from searchlab.experiment._spec import ExperimentSpec

__all__ = ["TRIALS_FILE", "TrialRecorder"]

_STATES = {
    Trial.PENDING: "PENDING",
    Trial.RUNNING: "RUNNING",
    Trial.PAUSED: "PAUSED",
    Trial.TERMINATED: "COMPLETED",
    Trial.ERROR: "ERRORED",
}

_ENDED = (Trial.TERMINATED, Trial.ERROR)

_MAX_WRITE_INTERVAL_S = 10.0


class TrialRecorder(Callback):
    """Keeps one record per trial and tells the user what happens, one line per event."""

    def __init__(
        self,
        spec: ExperimentSpec,
        experiment_dir: pathlib.Path,
        echo: Callable[[str], None] = print,
        table_every_s: float = 15.0,
        rung_table: Callable[[], list[dict[str, Any]]] | None = None,
        *,
        control: Any,
        snapshots: Snapshots | None = None,
        restored: bool = False,
    ) -> None:
        self._spec = spec
        self._dir = experiment_dir
        self._echo = echo
        self._table_every_s = table_every_s
        self._rung_table = rung_table
        self._control = control
        self._snapshots = snapshots
        self._last_table = time.monotonic()
        self.records: dict[str, dict[str, Any]] = {}
        self._status: dict[str, str] = {}
        self._dirty = False
        self._next_write = 0.0  # monotonic time before which a step does not rewrite the file
        self.fatal: TrialReport | None = None  # a user error every trial would hit
        self.write_error: str | None = None
        storage = spec.exp_conf.get("checkpoint_storage") or {}
        self._retention = RetentionPolicy(
            save_trial_latest=int(storage.get("save_trial_latest", 1)),
            save_trial_best=int(storage.get("save_trial_best", 1)),
            save_experiment_best=int(storage.get("save_experiment_best", 0)),
            smaller_is_better=spec.smaller_is_better,
        )
        self._deletions = DeferredDeletions(experiment_dir)
        self._latest: dict[str, str | None] = {}  # trial id -> Tune's latest checkpoint
        self._restored = restored
        if restored:
            self.records, pending = load_records(experiment_dir)
            for path in pending:
                trial_id = path.split("/", 1)[0]
                self._deletions.let_go(path, trial_id, generation=0)
            self._status = {
                t: r["state"] for t, r in self.records.items() if r["state"] in FINISHED
            }

    def __reduce__(self) -> tuple[Any, ...]:
        # Tune pickles its callbacks into tuner.pkl; a resumed run brings its own recorder, so
        # nothing of this one (records, echo, live objects) needs to travel.
        return _NullCallback, ()

    def get_state(self) -> dict | None:
        """Tune calls this right after it saved the experiment state: snapshot it now.

        ``trials.json`` is written first, so it is never older than the snapshot: a
        checkpoint let go before this snapshot (deleted once it is on disk) is already out of
        the records on disk.
        """
        if self._dirty:
            self.write()
        if self.write_error is not None:
            return None  # no snapshot newer than the trials.json that could not be written
        if self._snapshots is not None:
            self._snapshots.write()
            if self._snapshots.error is not None:
                self.write_failed(self._snapshots.error, self._snapshots.path)
        return None  # nothing of the recorder's goes into Tune's own files

    # -- Tune hooks -----------------------------------------------------------------------
    def on_step_begin(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        if self._control.restore_failed:
            raise RestoreFailed  # before Tune saves anything or starts the search over

    def on_trial_start(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        self._record(trial)

    def on_trial_result(
        self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any], **info: Any
    ) -> None:
        rec = self._record(trial)
        if rec.pop("_paused", False):
            failpoint("result-after-resume")  # the first result of a trial resumed just now
        rec["batches"] = int(result.get("batches", rec["batches"]))
        report = TrialReport.of(result)
        if report.outcome is Outcome.INVALID_HP:
            rec["state"] = "INVALID_HP"
            rec["error"] = f"InvalidHP: {report.message}"
            self._say(trial, f"raised InvalidHP ({report.message}); it will be replaced")
        elif report.outcome is Outcome.FATAL:
            rec["error"] = report.message
            rec["_fatal"] = True
            if self.fatal is None:
                self.fatal = report
            self._control.fatal = True
        elif report.outcome is Outcome.TRIAL_ERROR:
            rec["error"] = report.message
            rec["_fatal"] = True  # shown as ERRORED although Tune ended it normally
        if report.warning:
            rec.setdefault("warnings", []).append(report.warning)
            self._say(trial, f"warning: {report.warning}")
        if result.get("group") == "validation" and self._spec.metric in result:
            rec["_validated_at"] = int(result.get("batches", -1))
            self._on_validation(trial, rec, result, report)
        self._dirty = True

    def _on_validation(
        self, trial: Trial, rec: dict[str, Any], result: dict[str, Any], report: TrialReport
    ) -> None:
        value = float(result[self._spec.metric])
        rec["last_metric"] = value
        better = rec["best_metric"] is None or _better(value, rec["best_metric"], self._spec)
        if better and math.isfinite(value):
            rec["best_metric"] = value
            rec["_best_pending"] = True
        if report.rung is not None:
            rec["rung"] = max(rec.get("rung") or 0, report.rung)
            self._say(
                trial,
                f"reached {report.length} {self._spec.length_unit}: "
                f"{self._spec.metric}={value:.6g}",
            )

    def on_checkpoint(
        self, iteration: int, trials: list[Trial], trial: Trial, checkpoint: Any, **info: Any
    ) -> None:
        rec = self._record(trial)
        path = relative_to(self._dir, str(getattr(checkpoint, "path", checkpoint)))
        if path is None or not holds_state(self._dir / path):
            return  # a trial that never built (InvalidHP, broken trial) saves an empty directory
        previous = self._latest.get(trial.trial_id)
        self._latest[trial.trial_id] = path
        if previous is not None and previous != path:
            # No longer what Tune would restore, but the snapshot on disk may still name it:
            # a let-go copy of it waits for a snapshot written from now on.
            generation = self._snapshots.generation if self._snapshots is not None else 0
            self._deletions.renew(previous, generation)
        self._deletions.keep(path)
        rec["latest_checkpoint"] = path
        if rec.pop("_best_pending", False) or rec["checkpoint"] is None:
            rec["checkpoint"] = path
        batches = checkpoint_batches(self._dir / path)
        metric = rec["last_metric"] if rec.get("_validated_at") == batches else None
        saved = [c for c in rec["saved_checkpoints"] if c["path"] != path]  # a replay's again
        rec["saved_checkpoints"] = [*saved, {"path": path, "batches": batches, "metric": metric}]
        self._apply_retention(trial.trial_id)
        self._dirty = True
        failpoint("checkpoint-registered")

    def on_trial_error(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        rec = self._record(trial)
        rec["error"] = trial_error_text(trial)
        self._dirty = True
        if is_disk_full(rec["error"]):
            self.write_failed(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), self._dir)

    def on_trial_recover(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        rec = self._record(trial)
        rec["restarts"] += 1
        self._dirty = True
        self._say(trial, retry_line(trial_error_text(trial), rec["restarts"], self._spec))

    def on_step_end(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        if self._restored:
            self._settle_restored(trials)
        for trial in trials:
            self._track_status(trial)
        if self._dirty and time.monotonic() >= self._next_write:
            self.write()
        if self._snapshots is not None and self.write_error is None:
            self._delete_let_go()
        if time.monotonic() - self._last_table >= self._table_every_s:
            self.print_table()

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        if self._control.restore_failed:
            return  # nothing ran: leave the experiment's files as they were
        if not self._control.interrupted:
            # An interrupted run keeps its trials as saved (paused, or not started yet):
            # Tune's clean-up ends them in memory, which is not what a resume finds.
            for trial in trials:
                self._track_status(trial)
        self.write()
        if self._snapshots is not None and self.write_error is None:
            self._delete_let_go()  # Tune's final save is on disk: what it let go can go
            if self._dirty:
                self.write()

    # -- bookkeeping ----------------------------------------------------------------------
    def _settle_restored(self, trials: list[Trial]) -> None:
        """The first step of a resumed run: take Tune's view of each trial's latest checkpoint,
        and forget records of trials the dead driver created after the saved state, finished
        or not: the restored search driver creates them anew (with the same hyperparameters
        under a new id), so keeping them would count their work twice."""
        self._restored = False
        known = {t.trial_id for t in trials}
        for trial in trials:
            checkpoint = trial.checkpoint
            path = getattr(checkpoint, "path", None)
            self._latest[trial.trial_id] = relative_to(self._dir, path) if path else None
        forgotten = [t for t in self.records if t not in known]
        for trial_id in forgotten:
            del self.records[trial_id]
            self._status.pop(trial_id, None)
        if forgotten:
            self._dirty = True
            self._next_write = 0.0  # at once: until then trials.json counts them twice
            self._echo(
                f"searchlab: {len(forgotten)} trial(s) ran after the stopped driver's last saved "
                f"state ({', '.join(sorted(forgotten)[:4])}{', ...' if len(forgotten) > 4 else ''}"
                "); the search runs them again under new ids"
            )

    def _record(self, trial: Trial) -> dict[str, Any]:
        rec = self.records.get(trial.trial_id)
        if rec is None:
            rec = self.records[trial.trial_id] = new_record(trial.trial_id, trial.config)
        return rec

    def _apply_retention(self, trial_id: str) -> None:
        """Let go of the checkpoints ``checkpoint_storage`` does not keep (deleted later).

        Called when ``trial_id`` saved a checkpoint or finished. Without
        ``save_experiment_best`` every rule is per trial, so only its checkpoints are looked
        at (a search of many trials does not rescan all of them at each checkpoint).
        """
        records = (
            list(self.records.values())
            if self._retention.save_experiment_best
            else [self.records[trial_id]]
        )
        saved = [
            SavedCheckpoint(rec["trial_id"], c["path"], i, c["metric"], rec["state"] in FINISHED)
            for rec in records
            for i, c in enumerate(rec["saved_checkpoints"])
        ]
        doomed = checkpoints_to_delete(saved, self._retention)
        if not doomed:
            return
        generation = self._snapshots.generation if self._snapshots is not None else 0
        gone = {c.path for c in doomed}
        for ckpt in doomed:
            self._deletions.let_go(ckpt.path, ckpt.trial_id, generation)
        for rec in records:
            rec["saved_checkpoints"] = [
                c for c in rec["saved_checkpoints"] if c["path"] not in gone
            ]
            if rec["checkpoint"] in gone:
                rec["checkpoint"] = best_remaining(rec["saved_checkpoints"], self._spec)
            if rec["latest_checkpoint"] in gone:
                kept = rec["saved_checkpoints"]
                rec["latest_checkpoint"] = kept[-1]["path"] if kept else None
        self._dirty = True

    def _delete_let_go(self) -> None:
        assert self._snapshots is not None
        if self._deletions.delete_due(self._snapshots.generation, self._latest):
            self._dirty = True  # the pending list in trials.json shrank

    def _track_status(self, trial: Trial) -> None:
        previous = self._status.get(trial.trial_id)
        if previous in FINISHED and trial.status in _ENDED:
            # Most trials of a long search, at every step; and a resumed run stops the ended
            # trials Tune brought back: they stay as they were.
            return
        rec = self._record(trial)
        state = _STATES.get(trial.status, trial.status)
        if state == "ERRORED" and trial.trial_id in self._control.disk_full:
            state = "PAUSED"  # stopped by a full disk, not by its own fault: it resumes
        if rec["state"] == "INVALID_HP":
            state = "INVALID_HP"
        elif rec.get("_fatal") and state == "COMPLETED":
            state = "ERRORED"  # Tune ended it normally, but the trial stopped on a user error
        if previous == state:
            return
        self._status[trial.trial_id] = state
        rec["state"] = state
        self._dirty = True
        if state in FINISHED:
            self._apply_retention(trial.trial_id)
        if state == "PAUSED":
            rec["_paused"] = True
        self._announce(trial, rec, state, previous)
        if state == "COMPLETED":
            failpoint("trial-finished")

    def _announce(
        self, trial: Trial, rec: dict[str, Any], state: str, previous: str | None
    ) -> None:
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
            self._say(trial, f"errored: {error_line(rec['error'] or '', self._spec)}")

    def _say(self, trial: Trial, text: str) -> None:
        self._echo(f"{time.strftime('%H:%M:%S')} trial {trial.trial_id} {text}")

    def print_table(self) -> None:
        from searchlab.experiment._table import format_progress

        self._last_table = time.monotonic()
        rungs = self._rung_table() if self._rung_table else None
        self._echo(format_progress(list(self.records.values()), self._spec, rungs))

    def write(self) -> None:
        """Rewrite ``trials.json``; a failure (a full disk) pauses the run resumably.

        The file holds every trial, so a step rewrites it only when the last write's cost
        has been paid back twenty times (at most 5% of the driver's time, however many
        trials there are); Tune's saves (``get_state``) and the experiment's end always
        write it.
        """
        if self.write_error is not None:
            return
        began = time.monotonic()
        self._dirty = False
        path = self._dir / TRIALS_FILE
        try:
            atomic_write(path, _trials_file_text(self.records.values(), self._deletions.queued))
        except OSError as exc:
            self.write_failed(exc, path)
        now = time.monotonic()
        self._next_write = now + min(20 * (now - began), _MAX_WRITE_INTERVAL_S)

    def write_failed(self, exc: OSError, path: pathlib.Path) -> None:
        if self.write_error is not None:
            return
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        self.write_error = f"cannot write {path} ({reason})"
        self._echo(
            f"searchlab: {self.write_error}: pausing every trial at its checkpoint; "
            f"free space, then continue with: searchlab resume {self._dir}"
        )
        self._control.interrupted = True


def _trials_file_text(records: Iterable[dict[str, Any]], pending: list[Any]) -> str:
    """``trials.json``: one trial per line, each encoded by ``json``'s C encoder (an indented
    dump runs in Python: 3-4 times as long, every trial at every rewrite)."""
    head = json.dumps(
        {"format_version": 2, "updated": time.time(), "pending_deletions": pending}, default=str
    )
    body = ",\n".join(json.dumps(public(r), default=str) for r in records)
    return f'{head[:-1]}, "trials": [\n{body}\n]}}\n'


class _NullCallback(Callback):
    """What a recorder unpickles to outside its driver: a callback that does nothing."""


def _better(value: float, best: float, spec: ExperimentSpec) -> bool:
    return value < best if spec.smaller_is_better else value > best


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
