"""``PyTorchCallback``: hooks into the training loop, with state kept across checkpoints."""

from __future__ import annotations

import inspect
import logging
from typing import Any

__all__ = ["PyTorchCallback", "overrides", "takes_epoch_idx"]

logger = logging.getLogger("searchlab")


class PyTorchCallback:
    """Code that runs at fixed points of a trial's life.

    Return callbacks from ``PyTorchTrial.build_callbacks()`` as ``{name: callback}``; the name
    keys its ``state_dict()`` in checkpoints, so a stateful callback resumes with its state.
    Validation and checkpoint hooks run on rank 0 only when training is distributed.

    Example:
        >>> class CountValidations(PyTorchCallback):
        ...     def __init__(self): self.n = 0
        ...     def on_validation_end(self, metrics): self.n += 1
        ...     def state_dict(self): return {"n": self.n}
        ...     def load_state_dict(self, state): self.n = state["n"]
    """

    def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: str | None) -> None:
        """Before training starts, after any checkpoint was loaded."""

    def on_trial_shutdown(self) -> None:
        """When the trial process is done with this trial (finished, paused or failed)."""

    def on_training_start(self) -> None:
        """Before the first training batch of this run (also after a resume)."""

    def on_training_epoch_start(self, epoch_idx: int) -> None:
        """Before the first batch of each training epoch.

        The form without ``epoch_idx`` that Determined had before 0.17.8 is still called
        (with a deprecation warning).
        """

    def on_training_epoch_end(self, epoch_idx: int) -> None:
        """After the last batch of each training epoch."""

    def on_training_workload_end(
        self, avg_metrics: dict[str, Any], batch_metrics: list[dict[str, Any]]
    ) -> None:
        """At the end of each training workload, as in Determined.

        A workload ends every ``scheduling_unit`` batches (with the training report), where
        training ends, and before every validation and checkpoint. ``batch_metrics`` are the
        per-batch metrics of the workload's batches (tensors as Python numbers or lists), each
        batch in exactly one call; ``avg_metrics`` are their averages (the training report's
        metrics, custom reducers included, when the workload covers the whole report window).
        Runs on every worker.
        """

    def on_validation_start(self) -> None:
        """Before each validation."""

    def on_validation_end(self, metrics: dict[str, Any]) -> None:
        """After each validation, with the reduced metrics."""

    def on_validation_epoch_start(self) -> None:
        """Deprecated alias of ``on_validation_start``, kept for Determined code."""

    def on_validation_epoch_end(self, outputs: list[Any]) -> None:
        """Deprecated; called with the per-batch outputs of ``evaluate_batch``."""

    def on_checkpoint_load_start(self, checkpoint: dict[str, Any]) -> None:
        """Before the trial's state is loaded from ``checkpoint`` (the loaded state dict)."""

    def on_checkpoint_save_start(self, checkpoint: dict[str, Any]) -> None:
        """Before ``checkpoint`` (the state dict about to be written) is saved; may add keys."""

    def on_checkpoint_write_end(self, checkpoint_dir: str) -> None:
        """After a checkpoint directory was written."""

    def on_checkpoint_upload_end(self, uuid: str) -> None:
        """After a checkpoint was stored (same time as write end here: storage is local)."""

    def on_checkpoint_end(self, checkpoint_dir: str) -> None:
        """Deprecated alias of ``on_checkpoint_write_end``."""

    def on_before_optimizer_step(self, parameters: Any) -> None:
        """Deprecated: use ``step_optimizer(clip_grads=...)``; runs before each optimizer step."""

    def state_dict(self) -> dict[str, Any]:
        """The callback's state, saved in every checkpoint."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""


def overrides(callback: PyTorchCallback, hook: str) -> bool:
    return getattr(type(callback), hook, None) is not getattr(PyTorchCallback, hook)


def takes_epoch_idx(callback: PyTorchCallback) -> bool:
    """Whether ``on_training_epoch_start`` takes ``epoch_idx`` (Determined >= 0.17.8)."""
    try:
        params = inspect.signature(callback.on_training_epoch_start).parameters
    except (TypeError, ValueError):
        return True
    if params:
        return True
    logger.warning(
        "%s.on_training_epoch_start() without the epoch_idx parameter is deprecated, as in "
        "Determined; add it: on_training_epoch_start(self, epoch_idx)",
        type(callback).__name__,
    )
    return False
