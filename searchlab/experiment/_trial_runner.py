"""One trial's training in one process, step by step, as a Tune trainable (or worker) needs it.

A trial trains to the end of each of its rungs (``rung_ends``), validates and reports the
searcher metric there; Tune then calls ``step`` again (go on), pauses it, or stops it.
Used by the single-process trainable and by every worker of a data-parallel trial.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
import logging
import math
import os
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch

from searchlab.errors import InvalidHP, SearchlabError
from searchlab.experiment._protocol import (
    Outcome,
    TrialConfig,
    TrialReport,
)
from searchlab.experiment._spec import ExperimentSpec
from searchlab.experiment._trial_build import build_trial_loop
from searchlab.experiment._trial_files import FALLBACK_KEY
from searchlab.pytorch import DistributedContext, TrainUnit
from searchlab.pytorch._callback import overrides
from searchlab.pytorch._loop import Report, TrialLoop
from searchlab.pytorch._state import TrialState

__all__ = ["TrialRunner"]

logger = logging.getLogger("searchlab")

# In a checkpoint's state: results trained ahead (see ``TrialRunner.step``) that Tune had not
# received when it saved; a resumed trial hands them out first.
_PENDING_KEY = TrialState.key("pending_results")
_AHEAD = "searchlab-train-ahead"  # the name of the thread that trains a window ahead


class TrialRunner:
    """Builds the user's trial for one Tune config and turns its reports into Tune results.

    ``worker_process``: the runner lives in a Ray worker of its own (a trainable's actor, a
    data-parallel rank), whose imported objects may leave the garbage collector's scans.
    ``turn``: the GPU's turn (standby's ``GpuBaton.held``), held for every window that
    trains, a window trained ahead included. ``warm_up``: asked before a window takes the
    turn (standby's ``GpuBaton.claim_warm_up``); True: the window's first batch, the
    process's first on its GPU, trains before the turn is taken, the rest in it.
    """

    def __init__(
        self,
        spec: ExperimentSpec,
        config: dict[str, Any],
        *,
        trial_id: str,
        logdir: str | None,
        model_dir: str,
        distributed: DistributedContext | None = None,
        worker_process: bool = False,
        turn: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
        warm_up: Callable[[], bool] | None = None,
    ) -> None:
        self._spec = spec
        self._worker_process = worker_process
        self._turn = turn or contextlib.nullcontext
        self._warm_up = warm_up
        os.environ.update(spec.environment_variables)
        plan = TrialConfig.from_tune(config)
        self._rung_ends: list[int] = list(plan.rung_ends)
        self._events: Iterator[Report] | None = None
        self._invalid: str | None = None
        self._fatal: TrialReport | None = None
        self._failure: Exception | None = None
        self._warnings: list[str] = []
        self.timing: dict[str, float] = {}  # reported with the next result
        self._train_ahead = spec.train_ahead
        self._ahead: concurrent.futures.Future[dict[str, Any]] | None = None
        self._pending: list[dict[str, Any]] = []  # results trained ahead, not yet handed out
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._build_args = (plan.hparams, plan, trial_id, logdir, model_dir, distributed)
        self._parked: tuple[bytes, str | None] | None = None
        self._saved_state: dict[str, Any] | None = None  # the last state(), until training
        self._last_rung_end = False
        self.length_done = 0  # the longest rung length whose validation was reported
        self._checkpoint_uuid: str | None = None
        self.loop: TrialLoop | None = None
        try:
            self.loop = self._make_loop()
        except InvalidHP as exc:
            self._invalid = str(exc) or "InvalidHP"
        except SearchlabError as exc:
            self._fatal = _fatal(exc)
        except Exception as exc:
            # Raised by step() instead: Tune retries a trial that fails while it runs, but
            # errors a trial whose build fails as a reused actor resets at once, without
            # the retries of max_restarts.
            self._failure = exc

    def _make_loop(self) -> TrialLoop:
        """The user's trial built anew for this runner's config (``_trial_build``)."""
        return build_trial_loop(self._spec, *self._build_args, worker_process=self._worker_process)

    def _rung_batches(self) -> list[int]:
        assert self.loop is not None
        unit = self._spec.length_unit
        return [self.loop.to_batches(TrainUnit.from_spec(unit, end)) for end in self._rung_ends]

    def _next_segment(self) -> Iterator[Report] | None:
        """The reports up to the next rung end past the current position, or None when done."""
        assert self.loop is not None
        return self.loop.run() if self._next_target() is not None else None

    def _next_target(self) -> int | None:
        """Set the loop's target to the rung end the next segment trains (or validates) to
        and return it; None when the trial is done."""
        assert self.loop is not None
        for target in self._rung_batches():
            if target >= self.loop.batches_trained:
                self.loop.target = target
                if target > self.loop.batches_trained or self.loop.validation_pending():
                    return target
        return None

    @property
    def parked(self) -> bool:
        """True while the trial is released (``park``) and not yet rebuilt."""
        return self._parked is not None

    @property
    def reads_checkpoint_files(self) -> bool:
        """True when a callback of the trial looks at checkpoint files as they are written
        (``on_checkpoint_write_end``/``on_checkpoint_end``/``on_checkpoint_upload_end``):
        those must see the state file in place, so it cannot be written later."""
        callbacks = self.loop.callbacks.values() if self.loop is not None else ()
        hooks = ("on_checkpoint_write_end", "on_checkpoint_end", "on_checkpoint_upload_end")
        return any(overrides(cb, hook) for cb in callbacks for hook in hooks)

    @property
    def at_rung_end(self) -> bool:
        """The last result ended a rung short of the last one: where a search pauses trials."""
        return self._last_rung_end

    def park(self) -> None:
        """Give back everything the trial holds (GPU memory, loader workers), keeping its state.

        The state (the checkpoint's, at this report boundary) stays in host memory; the next
        call that needs the trial rebuilds it from there, so training goes on exactly as if it
        had never been released. Used while a paused trial's actor waits in Tune's cache.
        """
        if self.loop is None or self._parked is not None:
            return
        self.settle()
        # The state the last save captured is the trial's state still (nothing ran since):
        # reusing it keeps the callbacks' checkpoint hooks to one call per checkpoint.
        state = self._saved_state
        if state is None:
            state = self._with_pending(self.loop.state_dict(notify=False))
        buf = io.BytesIO()
        torch.save(state, buf)
        self._parked = (buf.getvalue(), self._checkpoint_uuid)
        self._close_loop()

    def park_between_windows(self) -> None:
        """Park at a turn's end on a crowded GPU (``_standby``'s memory rules); no window
        trains ahead from now on. Not in the thread training ahead: whoever takes its
        window parks at the end of its own turn."""
        self._train_ahead = False
        if self._ahead is None and not threading.current_thread().name.startswith(_AHEAD):
            self.park()

    def unpark(self) -> None:
        """Rebuild a parked trial from its kept state (a no-op when it is not parked)."""
        if self._parked is None:
            return
        blob, checkpoint_uuid = self._parked
        # On the host first, as a checkpoint loads: the new trial's own tensors are on the
        # GPU already, and the state must not need a second copy there.
        state = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=False)
        pending = list(state.pop(_PENDING_KEY, []))
        loop = self._make_loop()
        loop.load_state_dict(state, checkpoint_uuid=checkpoint_uuid)
        self.loop, self._parked, self._events = loop, None, None  # kept until it worked
        self._pending = pending

    def prepare(self) -> None:
        """Do now what the next ``step`` does before its first batch and that needs no GPU of
        its own: rebuild a parked trial, start its training loader (``TrialLoop.prime``).
        Standby calls it before the actor waits for the GPU, while the other trial trains;
        the next ``step`` trains exactly as without it."""
        self.unpark()
        loop = self.loop
        if loop is None or self._pending or self._ahead is not None or self._events is not None:
            return
        # What fails here keeps no stream: the step does it again and meets the same error
        # where it ends a trial as it always did (an InvalidHP, a trial-definition error).
        with contextlib.suppress(Exception):
            if self._next_target() is not None:  # the target the step's next segment sets too
                loop.prime()

    def step(self) -> dict[str, Any]:
        """Train to the next report and return it as a Tune result.

        With ``train_ahead``, a training report inside a segment is handed out
        while the next window already trains in a background thread, so the GPU does not
        wait for the report's way through Tune. The windows, their order and every RNG draw
        are the same as without it; a save taken meanwhile waits for that window and keeps
        its report in the checkpoint, to be handed out first on resume (``_PENDING_KEY``).
        Nothing is trained ahead of a rung end, a validation or a checkpoint. With a ``turn``
        (standby's GPU baton), every window trains in it, one trained ahead included, and a
        parked trial is rebuilt in it.
        """
        self._saved_state = None
        if self._parked is not None:  # rebuilt in the GPU's turn (parked: nothing trains ahead)
            with self._turn():
                self.unpark()
                result = self._take_ahead()  # a report its kept state still owed, if any
                if result is None:
                    result = self._step()
        else:
            result = self._take_ahead()
            if result is None:
                result = self._step_in_turn()
        self._last_rung_end = TrialReport.of(result).rung is not None and not result.get("done")
        if self._may_train_ahead(result):
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=_AHEAD)
            self._ahead = self._executor.submit(_on_this_device(), self._step_in_turn)
        if self._warnings or self.timing:
            report = TrialReport.of(result).merged(
                warning="; ".join(self._warnings) or None, timing=self.timing or None
            )
            report.attach(result)
            self._warnings, self.timing = [], {}
        return result

    def _may_train_ahead(self, result: dict[str, Any]) -> bool:
        loop = self.loop
        return (
            self._train_ahead
            and loop is not None
            and result.get("group") == "training"
            and not result.get("done")
            and not result.get("should_checkpoint")
            and loop.batches_trained < loop.target  # more training before this segment ends
        )

    def _take_ahead(self) -> dict[str, Any] | None:
        if self._pending:
            return self._pending.pop(0)
        if self._ahead is None:
            return None
        ahead, self._ahead = self._ahead, None
        return ahead.result()  # the window's exception, if it failed, is raised here

    def settle(self) -> None:
        """Wait for a window trained ahead; keep its report to hand out (before any save)."""
        if self._ahead is not None:
            ahead, self._ahead = self._ahead, None
            self._pending.append(ahead.result())

    def _step_in_turn(self) -> dict[str, Any]:
        loop = self.loop
        if loop is not None and self._warm_up is not None and self._warm_up():
            return self._step_in_turn_after_first_batch(loop)
        with self._turn():
            return self._step()

    def _step_in_turn_after_first_batch(self, loop: TrialLoop) -> dict[str, Any]:
        """The window's first batch trains before the turn, the rest in it. A window that
        trains no batch (a validation left from a save) runs before the turn whole."""
        with contextlib.ExitStack() as turn:
            loop.after_next_batch = lambda: turn.enter_context(self._turn())
            try:
                return self._step()
            finally:
                loop.after_next_batch = None

    def _step(self) -> dict[str, Any]:
        if self._invalid is not None:
            return _ended(TrialReport(outcome=Outcome.INVALID_HP, message=self._invalid))
        if self._fatal is not None:
            return _ended(self._fatal)
        if self._failure is not None:
            raise self._failure
        try:
            report = self._next_report()
        except InvalidHP as exc:
            return _ended(TrialReport(outcome=Outcome.INVALID_HP, message=str(exc) or "InvalidHP"))
        except SearchlabError as exc:
            return _ended(_fatal(exc))
        if report is None:
            position = self.loop.batches_trained if self.loop is not None else 0
            return {"done": True, "group": "end", "batches": position}
        return self._result(report)

    def _next_report(self) -> Report | None:
        while True:
            if self._events is None:
                self._events = self._next_segment()
                if self._events is None:
                    return None
            report = next(self._events, None)
            if report is not None:
                return report
            self._events = None

    def _result(self, report: Report) -> dict[str, Any]:
        result: dict[str, Any] = dict(report.metrics)
        result.update(
            group=report.group or "checkpoint", batches=report.batches, epochs=report.epochs
        )
        if report.checkpoint:
            result["should_checkpoint"] = True
        ours = TrialReport()
        if report.group == "validation" and report.done:
            batch_ends = self._rung_batches()
            if report.batches in batch_ends:
                rung = batch_ends.index(report.batches)
                ours = ours.merged(length=self._rung_ends[rung], rung=rung)
                self.length_done = max(self.length_done, self._rung_ends[rung])
                result["done"] = rung == len(batch_ends) - 1
        if report.stop_requested:
            result["done"] = True
        problem = self._non_finite(report)
        if problem:
            result["done"] = True
            ours = ours.merged(outcome=Outcome.TRIAL_ERROR, message=problem)
        return ours.attach(result)

    def _non_finite(self, report: Report) -> str | None:
        """A NaN or infinite loss or searcher metric ends the trial with a clear error."""
        name = "loss" if report.group == "training" else self._spec.metric
        value = report.metrics.get(name)
        if report.group not in ("training", "validation") or not isinstance(value, int | float):
            return None  # a metric that is not a number (a list, a string) is only reported
        if math.isfinite(value):
            return None
        first = report.first_non_finite.get(name, report.batches)
        where = f"batch {first}" + (
            f" (reported at batch {report.batches})" if first != report.batches else ""
        )
        return (
            f"{report.group} metric {name!r} is {value} at {where}; the trial stops and "
            "counts as the worst result (lower the learning rate or check the data)"
        )

    def state(self) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The checkpoint state and metadata at this batch boundary (None without a trial)."""
        self.settle()
        self.unpark()
        if self.loop is None:
            return None
        self._saved_state = self._with_pending(self.loop.state_dict())
        return self._saved_state, self.loop.metadata()

    def _with_pending(self, state: dict[str, Any]) -> dict[str, Any]:
        if self._pending:
            state[_PENDING_KEY] = [dict(r) for r in self._pending]
        return state

    def warn(self, message: str) -> None:
        """Report ``message`` to the driver with the trial's next result."""
        self._warnings.append(message)

    def checkpoint_written(self, directory: str) -> None:
        self.settle()
        self.unpark()
        if self.loop is not None:
            self.loop.checkpoint_written(directory)

    def load(
        self, state: dict[str, Any], checkpoint_uuid: str | None, length_done: int = 0
    ) -> None:
        self._discard_ahead()
        self.length_done = length_done
        state = dict(state)
        if FALLBACK_KEY in state:
            self._warnings.append(str(state.pop(FALLBACK_KEY)))
        self._pending = list(state.pop(_PENDING_KEY, []))
        if self._parked is not None:  # the loaded state replaces the kept one
            self._parked = None
            self.loop = self._make_loop()
        self._checkpoint_uuid = checkpoint_uuid
        self._saved_state = None
        if self.loop is not None:
            self.loop.load_state_dict(state, checkpoint_uuid=checkpoint_uuid)
            self._events = None

    def close(self) -> None:
        self._discard_ahead()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        self._parked = None
        self._close_loop()

    def _discard_ahead(self) -> None:
        """Wait for a window trained ahead and drop it (a loaded state or the end replaces it)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            try:
                ahead.result()
            except Exception:
                logger.debug("a window trained ahead failed; its trial is replaced", exc_info=True)
        self._pending = []

    def _close_loop(self) -> None:
        self._saved_state = None
        if self.loop is not None:
            try:
                self.loop.close()
            except Exception:
                logger.warning("trial shutdown hook failed:\n%s", traceback.format_exc())
            self.loop = None
            self._events = None


def _on_this_device() -> Any:
    """A wrapper running a function on the calling thread's CUDA device (the current device is
    per thread: a data-parallel rank's window trained ahead must use the rank's GPU)."""
    device = torch.cuda.current_device() if torch.cuda.is_initialized() else None

    def run(fn: Any) -> Any:
        if device is not None:
            torch.cuda.set_device(device)
        return fn()

    return run


def _ended(report: TrialReport) -> dict[str, Any]:
    """The last result of a trial that ended itself (InvalidHP, a user error)."""
    group = "invalid_hp" if report.outcome is Outcome.INVALID_HP else "error"
    return report.attach({"done": True, "group": group})


def _fatal(exc: SearchlabError) -> TrialReport:
    """A user error every trial would hit, with the config field it is about, if it says."""
    path = getattr(exc, "config_path", None)
    return TrialReport(outcome=Outcome.FATAL, message=str(exc), config_path=path)
