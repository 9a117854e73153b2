"""The Ray Tune trainable of a script entrypoint (``python3 train.py``, Determined 0.38).

Each run of the script is a child process of the trial's actor (``ScriptProcess``). The
script's rank 0 reports in lock step (``searchlab.core._channel``): every report becomes one
Tune result, with the ``TrialReport`` the class API's results carry (its ``length`` and
``rung`` on rung-end validations), and the script waits until Tune's answer is known:
the next ``step`` lets it go on, ``save_checkpoint`` takes the checkpoint it stored at that
report (or asks for one), a pause that leaves the actor idle, a stop, or another trial taking
the actor preempts it: it checkpoints and exits. The next run of the script gets the Tune
checkpoint as ``info.latest_checkpoint``. Resuming a trial whose script still waits (its actor
was reused at once) skips the restart.

A Tune checkpoint of a script trial is a copy of the script's checkpoint directory plus the
metadata searchlab needs (``CHECKPOINT_LENGTH_KEY``, ``batches_trained``).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys
import time
import uuid
from typing import Any

import ray
from ray import tune

from searchlab._info import ClusterInfo, SessionInfo, TrialInfo, int_id
from searchlab.config import LAUNCHER_MODULE, SCRIPT_LENGTH, is_python, parse_command
from searchlab.core._channel import Action, Failure, Report, Stored, Unable
from searchlab.experiment._idle import IdleRelease
from searchlab.experiment._protocol import (
    CHECKPOINT_LENGTH_KEY,
    Outcome,
    TrialConfig,
    TrialReport,
)
from searchlab.experiment._spec import ExperimentSpec
from searchlab.experiment._trainable import existing_checkpoint
from searchlab.experiment._trial_files import checkpoint_rung_length, unpacked_model_dir
from searchlab.launch._script_checkpoint import (
    RUNS_KEY,
    SAVE_KEY,
    add_metadata,
    copy_checkpoint,
    load_failed_run,
    read_metadata,
    save_failed_run,
)
from searchlab.launch._script_process import ScriptProcess, gpu_uuids
from searchlab.launch._script_results import metric_problem, non_finite, rung_of

__all__ = ["ScriptTrainable"]

_STOP_TIMEOUT_S = float(os.environ.get("SEARCHLAB_SCRIPT_EXIT_TIMEOUT_S", "300"))


class ScriptTrainable(tune.Trainable):
    """Runs the experiment's script for one set of hyperparameters."""

    def setup(self, config: dict[str, Any], experiment: ExperimentSpec) -> None:  # type: ignore[override]
        self._spec = experiment
        self._command = parse_command(experiment.entrypoint)
        self._run: ScriptProcess | None = None
        self._idle = IdleRelease(self._release, experiment.release_idle_after_s)
        self._saved_token: str | None = None
        # Each actor has its own scratch directory in the trial's: a paused trial resumed in
        # another actor must not lose its copy when its old actor moves on to a new trial.
        self._actor_key = uuid.uuid4().hex[:8]
        self._new_trial(config)

    # -- the trial's state --------------------------------------------------------------
    def _new_trial(self, config: dict[str, Any]) -> None:
        self._plan = TrialConfig.from_tune(config)
        self._config = config
        self._trial_name = self.trial_id
        self._rung_ends: list[int] = list(self._plan.rung_ends)
        self._script_length = self._rung_ends == [SCRIPT_LENGTH]
        self._next_rung = 0
        self._length_done = 0
        self._runs = 0
        self._scratch = pathlib.Path(self.logdir) / ".script-checkpoints" / self._actor_key
        self._restore: dict[str, Any] | None = None  # {"path", "batches"} the next run loads
        self._latest: dict[str, Any] | None = None  # newest checkpoint the script stored
        self._at_result: str | None = None  # a checkpoint at the last result's batch
        self._failure: Failure | None = None
        self._warnings: list[str] = []
        self._batches = 0
        self._done = False
        self._keep_scratch = False
        self._adopt_failed_run()

    def _stored(self, path: str, batches: int | None) -> None:
        self._latest = {"path": path, "batches": batches, "length_done": self._length_done}

    def _adopt_failed_run(self) -> None:
        """After the script failed, the trial restarts (``max_restarts``) in a new actor on
        this machine: it goes on from the newest checkpoint the failed run stored, as
        Determined restarts a trial from its latest checkpoint, rather than from the last
        checkpoint Tune has (a pause's)."""
        kept = load_failed_run(self._scratch.parent)
        if kept is not None:
            self._latest, self._runs = kept
            self._length_done = int(self._latest["length_done"])
            self._next_rung = sum(1 for end in self._rung_ends if end <= self._length_done)

    def _keep_for_restart(self) -> None:
        if self._latest is not None:
            save_failed_run(self._scratch.parent, self._latest, self._runs)
            self._keep_scratch = True

    # -- Tune's calls -------------------------------------------------------------------
    def step(self) -> dict[str, Any]:
        with self._idle.busy():
            result = self._step()
        if TrialReport.of(result).rung is not None and not result.get("done"):
            self._idle.arm()  # paused here, the script waits: give its memory back if idle
        return result

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        with self._idle.busy():
            saved = self._checkpoint_here()
            if saved is not None:
                self._saved_token = uuid.uuid4().hex
                copy_checkpoint(saved["path"], checkpoint_dir)
                add_metadata(
                    checkpoint_dir,
                    {
                        CHECKPOINT_LENGTH_KEY: saved["length_done"],
                        "batches_trained": saved.get("batches"),
                        SAVE_KEY: self._saved_token,
                        RUNS_KEY: self._runs,
                    },
                )
        if self._run is not None:
            self._idle.arm()
        return None

    def load_checkpoint(self, checkpoint: Any) -> None:
        with self._idle.busy():
            path = pathlib.Path(str(checkpoint))
            meta = read_metadata(path)
            if self._run is not None and meta.get(SAVE_KEY) == self._saved_token:
                return  # this actor's own script still waits at that checkpoint: go on
            self._stop_script(Action.STOP)
            batches = meta.get("batches_trained", meta.get("steps_completed"))
            if self._latest is not None and (self._latest["batches"] or -1) > (batches or -1):
                return  # a failed run stored a newer checkpoint (``_adopt_failed_run``)
            if not any(path.iterdir()):
                return  # a trial that never stored anything starts over
            self._scratch.mkdir(parents=True, exist_ok=True)
            target = self._scratch / f"restored-{uuid.uuid4().hex[:8]}"
            copy_checkpoint(path, target)
            self._length_done = checkpoint_rung_length(path) or 0
            self._next_rung = sum(1 for end in self._rung_ends if end <= self._length_done)
            self._runs = int(meta.get(RUNS_KEY) or self._runs)
            self._restore = {"path": str(target), "batches": batches}
            self._latest = {**self._restore, "length_done": self._length_done}

    def restore(self, checkpoint_path: Any, *args: Any, **kwargs: Any) -> Any:
        checkpoint_path = existing_checkpoint(checkpoint_path, self._warnings.append)
        if checkpoint_path is None:
            return None
        return super().restore(checkpoint_path, *args, **kwargs)

    def reset(self, *args: Any, **kwargs: Any) -> bool:
        self._idle.cancel()  # no release of the previous trial while Tune switches trials
        return bool(super().reset(*args, **kwargs))

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        with self._idle.busy():
            if self.trial_id == self._trial_name and self._run is not None:
                return True  # the same trial again (a resume): its script may still wait
            self._stop_script(Action.STOP)
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._new_trial(new_config)
        return True

    def cleanup(self) -> None:
        with self._idle.busy():
            self._stop_script(Action.STOP)
            if not self._keep_scratch:
                shutil.rmtree(self._scratch, ignore_errors=True)

    def _release(self) -> None:
        """Idle after a rung or a save: the script checkpoints and exits (a preemption)."""
        self._stop_script(Action.PREEMPT)

    # -- running the script -------------------------------------------------------------
    def _step(self) -> dict[str, Any]:
        if self._failure is not None or self._done:
            return self._end_result()
        if self._run is None:
            self._start()
        elif self._run.waiting:
            self._run.answer(Action.GO)
        return self._next_result()

    def _start(self) -> None:
        spec = self._spec
        self._runs += 1
        restore = self._restore or (
            {"path": self._latest["path"], "batches": self._latest["batches"]}
            if self._latest
            else None
        )
        session = SessionInfo(
            socket="",
            token="",
            checkpoint_dir=str(self._scratch),
            tensorboard_dir=str(pathlib.Path(self.logdir) / "tensorboard"),
            rung_ends=list(self._rung_ends),
            next_rung=self._next_rung,
            length_unit=spec.length_unit,
            script_length=self._script_length,
            searcher_metric=spec.metric,
            smaller_is_better=spec.smaller_is_better,
            tune_trial_id=self.trial_id,
            experiment_name=spec.name,
        )
        trial = TrialInfo(
            trial_id=int_id(self.trial_id),
            experiment_id=int_id(spec.name),
            trial_seed=self._plan.trial_seed,
            hparams=self._plan.hparams,
            config=spec.exp_conf,
            steps_completed=int((restore or {}).get("batches") or 0),
            trial_run_id=self._runs,
        )
        info = ClusterInfo(
            trial_info=trial,
            session=session,
            latest_checkpoint=restore["path"] if restore else None,
            slot_ids=list(range(spec.slots_per_trial)),
            gpu_uuids=gpu_uuids([str(i) for i in ray.get_gpu_ids()]),
        )
        self._scratch.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **spec.environment_variables}
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
            env.pop(name, None)  # the launcher sets them; one process is rank 0 of 1
        log = self._trial_dir() / "script.log"
        self._run = ScriptProcess(self._argv(), _script_dir(spec, self._command), env, info, log)
        self._restore = None  # a later run continues from the newest checkpoint instead

    def _trial_dir(self) -> pathlib.Path:
        """The trial's directory in the experiment (where results are), when it is on this
        machine's file system; else Tune's local trial directory."""
        storage = getattr(self, "_storage", None)
        try:
            import pyarrow.fs

            if isinstance(getattr(storage, "storage_filesystem", None), pyarrow.fs.LocalFileSystem):
                return pathlib.Path(storage.trial_fs_path)  # type: ignore[union-attr]
        except Exception:  # an older or newer Ray without these names: Tune's directory
            pass
        return pathlib.Path(self.logdir)

    def _argv(self) -> list[str]:
        argv = list(self._command.argv)
        if is_python(argv[0]) and not os.path.isabs(argv[0]):
            argv[0] = sys.executable  # the interpreter searchlab runs in, with its packages
        if self._command.launcher:
            argv[2] = LAUNCHER_MODULE  # Determined's spelling runs searchlab's launcher
        return argv

    def _next_result(self) -> dict[str, Any]:
        assert self._run is not None
        while True:
            message = self._run.recv()
            if message is None:
                return self._on_exit()
            if isinstance(message, Report):
                return self._result(message)
            if isinstance(message, Stored):
                self._stored(message.path, message.batches)
            elif isinstance(message, Failure):
                self._failure = message
            else:
                raise RuntimeError(f"the script sent {message!r} without being asked")

    def _result(self, report: Report) -> dict[str, Any]:
        result: dict[str, Any] = dict(report.metrics)
        batches = report.batches if report.batches >= 0 else self._batches
        self._batches = batches
        result.update(group=report.group, batches=batches)
        if report.epochs is not None:
            result["epochs"] = report.epochs
        rung = None
        if not self._script_length:
            rung = rung_of(report, self._rung_ends, self._next_rung, self._spec.length_unit)
        if rung is not None:
            problem = metric_problem(report, self._spec.metric)
            if problem:
                self._failure = Failure("fatal", problem, config_path="searcher.metric")
                self._stop_script(Action.STOP)
                return self._end_result()
            TrialReport(length=self._rung_ends[rung], rung=rung).attach(result)
            self._next_rung = rung + 1
            self._length_done = max(self._length_done, self._rung_ends[rung])
        self._at_result = report.checkpoint
        if report.checkpoint:
            self._stored(report.checkpoint, batches)
            result["should_checkpoint"] = True
        problem = non_finite(report, self._spec.metric)
        if problem:
            result["done"] = True
            ours = TrialReport.of(result).merged(outcome=Outcome.TRIAL_ERROR, message=problem)
            ours.attach(result)
        if (rung is not None and rung == len(self._rung_ends) - 1) or problem:
            result["done"] = True
            self._finish()  # the searcher is through with the trial: let the script end
            if self._latest is not None and self._latest["path"] != self._at_result:
                result["should_checkpoint"] = True
                self._at_result = self._latest["path"]
        return self._with_warnings(result)

    def _on_exit(self) -> dict[str, Any]:
        """The script ended by itself: done when it exited 0, else the trial failed."""
        assert self._run is not None
        code, tail, argv = self._run.returncode, self._run.output_tail(), self._run.argv
        self._run.close()
        self._run = None
        if self._failure is None and code not in (0, None):
            self._keep_for_restart()
            raise RuntimeError(
                f"the trial's script `{' '.join(argv)}` exited with code {code}; the end of "
                f"its output:\n{tail}"
            )
        self._done = True
        return self._end_result()

    def _end_result(self) -> dict[str, Any]:
        failure = self._failure
        if failure is not None and failure.kind == "invalid_hp":
            ended = TrialReport(outcome=Outcome.INVALID_HP, message=failure.message)
            return ended.attach({"done": True, "group": "invalid_hp"})
        if failure is not None:
            fatal = TrialReport(
                outcome=Outcome.FATAL, message=failure.message, config_path=failure.config_path
            )
            return fatal.attach({"done": True, "group": "error"})
        result: dict[str, Any] = {"done": True, "group": "end", "batches": self._batches}
        if self._latest is not None and self._latest["path"] != self._at_result:
            result["should_checkpoint"] = True
            self._at_result = self._latest["path"]
        return self._with_warnings(result)

    def _with_warnings(self, result: dict[str, Any]) -> dict[str, Any]:
        if self._warnings:
            TrialReport.of(result).merged(warning="; ".join(self._warnings)).attach(result)
            self._warnings = []
        return result

    # -- checkpoints and ending runs -------------------------------------------------------
    def _checkpoint_here(self) -> dict[str, Any] | None:
        """The script's checkpoint at the last result: the one it stored there, or one it
        stores now when asked; a script that cannot is preempted (it stores one as it exits)."""
        if self._at_result is not None and self._latest is not None:
            if self._latest["path"] == self._at_result:
                return self._latest
        run = self._run
        if run is not None and run.waiting:
            run.answer(Action.CHECKPOINT)
            while True:
                message = run.recv()
                if isinstance(message, Stored):
                    self._stored(message.path, message.batches)
                    self._at_result = message.path
                    run.waiting = True  # it waits again, for go, preempt or stop
                    return self._latest
                if isinstance(message, Unable) or message is None:
                    self._stop_script(Action.PREEMPT, answered=message is None)
                    return self._latest
                if isinstance(message, Failure):
                    self._failure = message
        return self._latest

    def _finish(self) -> None:
        self._stop_script(Action.STOP)
        self._done = True

    def _stop_script(self, action: Action, answered: bool = False) -> None:
        """Tell a waiting script to checkpoint and exit (``action``) and wait until it did; a
        checkpoint it stores on the way out is at its last report, where it waited."""
        run = self._run
        if run is None:
            return
        at_result = run.waiting
        if run.waiting and not answered:
            run.answer(action)
        deadline = time.monotonic() + _STOP_TIMEOUT_S
        try:
            while (message := run.recv(deadline, wait_exit=False)) is not None:
                if isinstance(message, Stored):
                    self._stored(message.path, message.batches)
                    if at_result:
                        self._at_result = message.path
                elif isinstance(message, Failure):
                    self._failure = self._failure or message
                elif run.waiting:  # it reported again instead of exiting: say it once more
                    at_result = False
                    run.answer(action)
        except TimeoutError:
            self._warnings.append(
                f"the script did not exit within {_STOP_TIMEOUT_S:.0f} s of being told to "
                "checkpoint and stop; it was killed"
            )
        finally:
            run.close(wait=False)  # its interpreter's exit (~1 s with torch) is not waited for
            self._run = None


def _script_dir(spec: ExperimentSpec, command: Any) -> str:
    """Where the script runs: the model directory as shipped to this worker."""
    unpacked = unpacked_model_dir(spec)
    if unpacked is not None:
        return unpacked
    probe = command.script_file or (command.module.replace(".", "/") if command.module else None)
    cwd = pathlib.Path.cwd()
    if probe and ((cwd / probe).exists() or (cwd / f"{probe}.py").exists()):
        return str(cwd)
    return spec.model_dir
