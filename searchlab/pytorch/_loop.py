"""The training loop that both the local ``Trainer`` and the Ray trainable drive.

``TrialLoop.run()`` is a generator of :class:`Report`s: it trains up to ``target`` batches and
yields a report at each training window end, validation and checkpoint point. Callers decide
what a report means to them (log it, hand it to Ray Tune, write a checkpoint), so the loop
itself knows nothing about where metrics or checkpoints go.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from searchlab.errors import TrialDefinitionError
from searchlab.pytorch._callback import overrides, takes_epoch_idx
from searchlab.pytorch._checkpoint import FORMAT_VERSION
from searchlab.pytorch._context import PyTorchTrialContext
from searchlab.pytorch._loaders import epoch_loader
from searchlab.pytorch._lr_scheduler import LRScheduler
from searchlab.pytorch._metrics import (
    check_metrics,
    is_numerical_scalar,
    mean_metrics,
    report_value,
    to_float,
    to_python,
)
from searchlab.pytorch._state import TrialState, capture_trial_state, restore_trial_state
from searchlab.pytorch._trial import PyTorchTrial
from searchlab.pytorch._units import TrainUnit
from searchlab.pytorch._validation import Validator

__all__ = ["LoopSettings", "Report", "TrialLoop"]


@dataclasses.dataclass
class LoopSettings:
    """How often the loop reports, validates and checkpoints (lengths in any unit)."""

    scheduling_unit: int = 100
    validation_period: TrainUnit | None = None
    checkpoint_period: TrainUnit | None = None
    checkpoint_policy: str = "best"
    searcher_metric: str | None = None
    smaller_is_better: bool = True
    perform_initial_validation: bool = False
    test_mode: bool = False


@dataclasses.dataclass
class Report:
    """One event of the loop: metrics of a ``group``, and what the caller should do next."""

    group: str | None  # "training", "validation", or None for a bare checkpoint point
    # Numbers as floats; non-scalar metrics as lists, strings, or None where a training
    # window's values could not be averaged (as Determined reported them).
    metrics: dict[str, Any]
    batches: int
    epochs: float
    checkpoint: bool = False
    done: bool = False
    stop_requested: bool = False
    # Training metrics whose window mean is not finite: the batch (count) of the first
    # non-finite value in this worker's window.
    first_non_finite: dict[str, int] = dataclasses.field(default_factory=dict)


class TrialLoop:
    """Trains one ``PyTorchTrial`` in this process, batch by batch, resumable at any batch.

    Example:
        >>> loop = TrialLoop(trial, context, LoopSettings(scheduling_unit=10))
        >>> loop.target = 40
        >>> for report in loop.run():
        ...     print(report.group, report.batches, report.metrics)
    """

    def __init__(
        self, trial: PyTorchTrial, context: PyTorchTrialContext, settings: LoopSettings
    ) -> None:
        if not isinstance(trial, PyTorchTrial):
            raise TrialDefinitionError(
                f"{type(trial).__name__} does not subclass searchlab.pytorch.PyTorchTrial; "
                "derive it from PyTorchTrial"
            )
        if not context.models:
            raise TrialDefinitionError(
                f"{type(trial).__name__} has no model: must have at least one model. This might "
                "be caused by not wrapping your model with context.wrap_model() in __init__"
            )
        self.trial, self.context, self.settings = trial, context, settings
        self.callbacks = dict(trial.build_callbacks())
        context._callbacks = self.callbacks
        self._train = epoch_loader(
            trial.build_training_data_loader(),
            context,
            f"{type(trial).__name__}.build_training_data_loader()",
            True,
        )
        self.epoch_len = len(self._train)
        if self.epoch_len == 0:
            raise TrialDefinitionError(
                f"{type(trial).__name__}.build_training_data_loader() yields no batches; check "
                "the dataset is not empty and batch_size/drop_last leave at least one batch"
            )
        context._epoch_len = self.epoch_len
        self._where_train = f"{type(trial).__name__}.train_batch()"
        self.validator = Validator(trial, context, settings, self.callbacks)
        self.batches_trained = 0
        self.target = 0
        self.last_validation: dict[str, Any] = {}
        self._window: list[dict[str, Any]] = []
        # Where the batches not yet given to on_training_workload_end start in the window.
        self._workload_start = 0
        self._workload_hooks = [
            cb for cb in self.callbacks.values() if overrides(cb, "on_training_workload_end")
        ]
        self._epoch_start_takes_index = {
            name: takes_epoch_idx(cb) for name, cb in self.callbacks.items()
        }
        self._best: float | None = None
        self._last_validation_batch = -1
        self._stream: Iterator[Any] | None = None
        self._started = False  # on_trial_startup ran
        self._training = False  # on_training_start ran
        self._checkpoint_uuid: str | None = None
        # Called once after the next batch trains, then cleared (standby takes the GPU's
        # turn there after a process's first batch: ``TrialRunner``).
        self.after_next_batch: Callable[[], object] | None = None

    # -- lengths -----------------------------------------------------------------------
    def to_batches(self, length: TrainUnit | Any) -> int:
        gbs = self.context._hparams.get("global_batch_size")
        return TrainUnit.coerce(length).to_batches(self.epoch_len, int(gbs) if gbs else None)

    def _period(self, length: TrainUnit | None) -> int:
        return self.to_batches(length) if length is not None else 0

    @property
    def epochs(self) -> float:
        return self.batches_trained / self.epoch_len

    def _initial_validation_due(self) -> bool:
        """A fresh trial validates before its first batch (``perform_initial_validation``)."""
        fresh = self.batches_trained == 0 and self._last_validation_batch < 0
        return self.settings.perform_initial_validation and fresh

    def validation_pending(self) -> bool:
        """A validation is due at this batch (a period's or ``target``'s) and has not run."""
        b = self.batches_trained
        if b == 0 or self._last_validation_batch >= b:
            return False
        every = self._period(self.settings.validation_period)
        return b >= self.target or bool(every and b % every == 0)

    # -- the loop ------------------------------------------------------------------------
    def run(self) -> Iterator[Report]:
        """Train up to ``self.target`` batches, yielding each report; ``target`` may change."""
        self._start()
        s = self.settings
        if self._initial_validation_due():
            yield self._validation_report(checkpoint=False, done=self.target == 0)
        if s.test_mode:
            self.target = min(self.target, self.batches_trained + 1)
        validation_every = self._period(s.validation_period)
        checkpoint_every = self._period(s.checkpoint_period)
        if self.validation_pending():
            # Saved between a window's training report and its validation (a pause can come
            # at any report): validate first, as the uninterrupted run did at this batch.
            b = self.batches_trained
            at_end = b >= self.target
            report = self._validation_report(checkpoint=False, done=at_end)
            periodic_ckpt = bool(checkpoint_every) and b % checkpoint_every == 0
            report.checkpoint = report.checkpoint or at_end or periodic_ckpt
            yield report
        while self.batches_trained < self.target:
            self._train_batch()
            b, stop = self.batches_trained, self.context.get_stop_requested()
            at_end = b >= self.target or stop
            periodic_ckpt = bool(checkpoint_every) and b % checkpoint_every == 0
            train_due = b % s.scheduling_unit == 0 or at_end
            validation_due = bool(validation_every and b % validation_every == 0) or (
                at_end and not stop
            )
            # Each report is made when the previous one was taken: a state saved between a
            # window's training report and its validation holds no finished validation, and
            # the validation runs when training goes on (``validation_pending``).
            if train_due:
                report = self._training_report()
                if not validation_due:
                    self._end_reports(report, periodic_ckpt or at_end, at_end, stop)
                yield report
            elif validation_due or periodic_ckpt:
                # Determined ends a training workload before every validation and
                # checkpoint too; training reports keep their scheduling_unit windows.
                self._end_workload(None)
            if validation_due:
                report = self._validation_report(checkpoint=False, done=False)
                wants = periodic_ckpt or at_end or report.checkpoint
                yield self._end_reports(report, wants, at_end, stop)
            elif not train_due and (periodic_ckpt or at_end):
                # As in Determined, every policy (`none` included) checkpoints where training
                # ends; the policy only says which validations also checkpoint.
                yield self._end_reports(Report(None, {}, b, self.epochs), True, at_end, stop)
            if stop:
                return

    def _startup(self, first_batch: int) -> None:
        if not self._started:
            self._started = True
            for cb in self.callbacks.values():
                cb.on_trial_startup(first_batch, self._checkpoint_uuid)

    def _start(self) -> None:
        self.context._training_started = True
        for model in self.context.models:
            model.train()
        if self._training:
            return
        self._startup(self.batches_trained)
        self._training = True
        for cb in self.callbacks.values():
            cb.on_training_start()

    def prime(self) -> None:
        """Start the training loader now, where that changes nothing the loop does: its workers
        start and fetch their first batches (``starts_at_stream``), and the next window's first
        batch is ready when it trains. Elsewhere the loader starts with the first batch: also
        where a callback or a validation runs before it (either may change the dataset the
        workers copy when they start)."""
        if self._stream is not None or not self._train.starts_at_stream or self._hooks_first():
            return
        if self.validation_pending() or self._initial_validation_due():
            return
        self._stream = self._batch_stream()

    def _hooks_first(self) -> bool:
        hooks = ("on_trial_startup", "on_training_start", "on_training_epoch_start")
        return any(overrides(cb, hook) for cb in self.callbacks.values() for hook in hooks)

    def _batch_stream(self) -> Iterator[Any]:
        epoch, skip = divmod(self.batches_trained, self.epoch_len)
        return self._train.stream(epoch, skip)

    def _train_batch(self) -> None:
        ctx, b = self.context, self.batches_trained
        epoch_idx, in_epoch = divmod(b, self.epoch_len)
        if in_epoch == 0:
            for name, cb in self.callbacks.items():
                if self._epoch_start_takes_index[name]:
                    cb.on_training_epoch_start(epoch_idx)
                else:  # Determined's signature before 0.17.8
                    cb.on_training_epoch_start()  # type: ignore[call-arg]
        if self._stream is None:
            self._stream = self._batch_stream()
        batch = next(self._stream)
        if ctx._auto_to_device:
            batch = ctx.to_device(batch)
        ctx._current_batch, ctx._current_epoch = b, epoch_idx
        with ctx._amp.autocast(ctx.device):
            out = self.trial.train_batch(batch, epoch_idx, b)
        ctx._end_batch()
        metrics = check_metrics(out, self._where_train)
        self._window.append(
            {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in metrics.items()}
        )
        self.batches_trained = b + 1
        period = ctx._update_period()
        if (b + 1) % period == 0:
            # As in Determined: per-batch schedulers step only with the optimizer, catching
            # up on the batches it accumulated, so the LR of an update is that of its first batch.
            for sched in ctx.lr_schedulers:
                for _ in range(period):
                    sched._tick(LRScheduler.StepMode.STEP_EVERY_BATCH)
        if in_epoch == self.epoch_len - 1:
            for sched in ctx.lr_schedulers:
                sched._tick(LRScheduler.StepMode.STEP_EVERY_EPOCH)
            for cb in self.callbacks.values():
                cb.on_training_epoch_end(epoch_idx)
        if self.after_next_batch is not None:
            hook, self.after_next_batch = self.after_next_batch, None
            hook()

    @staticmethod
    def _end_reports(report: Report, checkpoint: bool, done: bool, stop: bool) -> Report:
        """Mark the last report of a batch: checkpoint here, target reached, stop requested."""
        report.checkpoint, report.done, report.stop_requested = checkpoint, done, stop
        return report

    def _training_report(self) -> Report:
        window = self._window
        metrics = mean_metrics(window, self.context.distributed)
        metrics.update(self.validator.reducer_metrics(training=True))
        self._end_workload(metrics)
        self._window, self._workload_start = [], 0
        report = Report("training", metrics, self.batches_trained, self.epochs)
        first_batch = self.batches_trained - len(window) + 1
        for name, value in metrics.items():
            if isinstance(value, float) and not math.isfinite(value):
                for offset, batch_metrics in enumerate(window):
                    v = batch_metrics.get(name)
                    if is_numerical_scalar(v) and not math.isfinite(to_float(v)):
                        report.first_non_finite[name] = first_batch + offset
                        break
        return report

    def _end_workload(self, report_metrics: dict[str, Any] | None) -> None:
        """``on_training_workload_end`` with the batches since the previous workload end.

        ``report_metrics`` are the training report's when this workload closes its window;
        a workload that ends at a validation or checkpoint between reports gets the mean of
        its own batches (the training reducers report with the window).
        """
        batches = self._window[self._workload_start :]
        whole_window = self._workload_start == 0
        self._workload_start = len(self._window)
        if not self._workload_hooks:
            return
        if report_metrics is not None and whole_window:
            avg = dict(report_metrics)
        else:
            avg = mean_metrics(batches, self.context.distributed)
        batch_metrics = [{k: to_python(v) for k, v in m.items()} for m in batches]
        for cb in self._workload_hooks:
            cb.on_training_workload_end(avg, batch_metrics)

    def _validation_report(self, *, checkpoint: bool, done: bool) -> Report:
        metrics = self.validator.validate()
        self.last_validation = metrics
        self._last_validation_batch = self.batches_trained
        policy = self.settings.checkpoint_policy
        wants = checkpoint or policy == "all"
        if policy == "best" and self.settings.searcher_metric in metrics:
            value = metrics[self.settings.searcher_metric]
            if not self.settings.smaller_is_better:
                value = -value
            if self._best is None or value < self._best:
                self._best = value
                wants = True
        return Report("validation", metrics, self.batches_trained, self.epochs, wants, done)

    # -- checkpoints ---------------------------------------------------------------------
    def state_dict(self, *, notify: bool = True) -> dict[str, Any]:
        """The trial's whole state at this batch boundary, as saved in ``state-dict.pth``.

        ``notify=False`` skips the callbacks' ``on_checkpoint_save_start`` (state kept in
        memory for an idle actor is no checkpoint of the user's).
        """
        captured = capture_trial_state(self.context, self.callbacks)
        captured.batches_trained = self.batches_trained
        captured.epochs_trained = self.batches_trained // self.epoch_len
        captured.trainer = {
            "window": [{k: report_value(v) for k, v in m.items()} for m in self._window],
            "workload_start": self._workload_start,
            "best": self._best,
            "last_validation_batch": self._last_validation_batch,
            "last_validation": dict(self.last_validation),
        }
        state = captured.to_state_dict()
        if notify:
            for cb in self.callbacks.values():
                cb.on_checkpoint_save_start(state)
        return state

    def metadata(self) -> dict[str, Any]:
        cls = type(self.trial)
        try:
            model_dir = str(pathlib.Path(inspect.getfile(cls)).resolve().parent)
        except (TypeError, OSError):
            model_dir = None
        return {
            "format_version": FORMAT_VERSION,
            "trial_class": f"{cls.__module__}:{cls.__qualname__}",
            "model_dir": model_dir,
            "hparams": self.context.get_hparams(),
            "batches_trained": self.batches_trained,
            "epochs_trained": self.batches_trained // self.epoch_len,
            "metrics": dict(self.last_validation),
            "trial_id": self.context.get_trial_id(),
            "experiment_id": self.context.get_experiment_id(),
            "trial_seed": self.context.get_trial_seed(),
        }

    def checkpoint_written(self, directory: str | pathlib.Path) -> None:
        for cb in self.callbacks.values():
            cb.on_checkpoint_write_end(str(directory))
            cb.on_checkpoint_end(str(directory))
            cb.on_checkpoint_upload_end(pathlib.Path(directory).name)

    def load_state_dict(self, state: dict[str, Any], checkpoint_uuid: str | None = None) -> None:
        """Continue from a checkpoint's state: weights, optimizers, RNG, position."""
        # Determined's order: on_trial_startup (with the checkpoint), then the load hooks.
        self._checkpoint_uuid = checkpoint_uuid
        self._startup(TrialState.from_state_dict(state).batches_trained)
        for cb in self.callbacks.values():
            cb.on_checkpoint_load_start(state)
        saved = TrialState.from_state_dict(state)  # as the callbacks left it (Determined's)
        restore_trial_state(saved, self.context, self.callbacks)
        self.batches_trained = saved.batches_trained
        self.context._initial_batch = self.batches_trained
        self.context._current_batch = self.batches_trained
        trainer_state = saved.trainer
        self._window = list(trainer_state.get("window", []))
        # Checkpoints before searchlab kept this: their window's batches had had no
        # workload end yet.
        self._workload_start = int(trainer_state.get("workload_start", 0))
        self._best = trainer_state.get("best")
        self._last_validation_batch = int(trainer_state.get("last_validation_batch", -1))
        self.last_validation = dict(trainer_state.get("last_validation", {}))
        self._stream = None

    def shutdown(self) -> None:
        """End this run: ``on_trial_shutdown``; a later ``run()`` starts up again."""
        self._stream = None  # also one ``prime`` started before the run
        if not self._started:
            return
        self._started = self._training = False
        for cb in self.callbacks.values():
            cb.on_trial_shutdown()

    def close(self) -> None:
        self.shutdown()
        self.context.close()
