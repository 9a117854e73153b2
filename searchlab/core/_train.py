"""``core_context.train``: metrics to the searcher (in a trial) or to the log (run by hand)."""

from __future__ import annotations

import enum
import logging
import math
import pathlib
from typing import Any

from searchlab.core._channel import Report
from searchlab.core._session import TrialSession

__all__ = ["EarlyExitReason", "TrainContext"]

logger = logging.getLogger("searchlab.core")


class EarlyExitReason(enum.Enum):
    """Why a trial ends before the searcher's length (as Determined's)."""

    INVALID_HP = "EXITED_REASON_INVALID_HP"
    USER_REQUESTED_STOP = "EXITED_REASON_USER_REQUESTED_STOP"


def plain_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """Metrics as JSON values: tensors and arrays become numbers (one element) or lists."""
    return {str(k): _plain(v) for k, v in metrics.items()}


def _plain(value: Any) -> Any:
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    tolist = getattr(value, "tolist", None)  # torch tensors, numpy arrays and scalars
    if callable(tolist):
        detach = getattr(value, "detach", None)
        plain = (detach().cpu() if callable(detach) else value).tolist()
        if isinstance(plain, list) and len(plain) == 1 and not isinstance(plain[0], list):
            return plain[0]  # a one-element tensor is reported as its number, as Determined did
        return _plain(plain)
    raise TypeError(
        f"metric value {value!r} ({type(value).__name__}) is not a number, string, tensor, "
        "array or a list/dict of them"
    )


class TrainContext:
    """Reports training and validation metrics; in a trial they go to the searcher.

    A report waits for the trial's actor to take it (lock step), so a pause the searcher
    decides on shows in ``core_context.preempt.should_preempt()`` right after the report.

    Example:
        >>> core_context.train.report_training_metrics(steps_completed=100, metrics={"loss": l})
        >>> core_context.train.report_validation_metrics(
        ...     steps_completed=100, metrics={"validation_loss": v, "batches": 100})
    """

    def __init__(
        self, session: TrialSession | None, tensorboard_path: pathlib.Path | None = None
    ) -> None:
        self._session = session
        self._tensorboard_path = tensorboard_path or pathlib.Path("tensorboard")
        self._best: float | None = None
        self.status = "training"

    def report_training_metrics(
        self,
        steps_completed: int,
        metrics: dict[str, Any],
        batch_metrics: list[dict[str, Any]] | None = None,
    ) -> None:
        """Training metrics at ``steps_completed`` batches (``batch_metrics`` are not kept)."""
        self.report_metrics("training", steps_completed, metrics)

    def report_validation_metrics(self, steps_completed: int, metrics: dict[str, Any]) -> None:
        """Validation metrics at ``steps_completed`` batches.

        For ``adaptive_asha`` with ``time_metric: batches`` (or ``epochs``), include that
        metric (or rely on ``steps_completed`` for batches): the searcher reads the trial's
        length from it.
        """
        self.report_metrics("validation", steps_completed, metrics)

    def report_metrics(self, group: str, steps_completed: int, metrics: dict[str, Any]) -> None:
        """Metrics of any group; only ``validation`` ones can end a rung."""
        plain = plain_metrics(metrics)
        if self._session is None:
            shown = ", ".join(f"{k}={v}" for k, v in sorted(plain.items()))
            logger.info("%s metrics at %d batches: %s", group, steps_completed, shown)
            return
        session = self._session
        report = Report(
            group=group,
            metrics=plain,
            batches=int(steps_completed),
            epochs=_number(plain.get("epochs")),
            by_time_metric=group == "validation" and not session.operations,
        )
        action = session.request(report)
        session.handle_checkpoint_requests(action, "the Core API stores checkpoints itself")

    def report_progress(self, progress: float) -> None:
        """Progress in [0, 1] (shown by Determined's web UI; logged at debug level here)."""
        if not 0 <= progress <= 1:
            raise ValueError(f"Progress should be between 0 and 1, not {progress}")
        logger.debug("progress %.3f", progress)

    def set_status(self, status: str) -> None:
        self.status = status

    def report_early_exit(self, reason: EarlyExitReason) -> None:
        """End the trial early: ``INVALID_HP`` replaces it with a new one in the search."""
        if self._session is not None and EarlyExitReason(reason) is EarlyExitReason.INVALID_HP:
            self._session.fail("invalid_hp", "the script reported InvalidHP")

    def get_tensorboard_path(self) -> pathlib.Path:
        """Where TensorBoard event files of this trial go (the trial directory's)."""
        return self._tensorboard_path

    def upload_tensorboard_files(self, *args: Any, **kwargs: Any) -> None:
        """A no-op: the event files are written in the trial's directory already."""

    def get_experiment_best_validation(self) -> float | None:
        """Not shared between searchlab's trials: always None."""
        return None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None
