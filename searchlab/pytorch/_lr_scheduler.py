"""``LRScheduler``: a torch LR scheduler together with when the trainer steps it."""

from __future__ import annotations

import enum
from typing import Any

import torch

from searchlab.pytorch._errors import TrialValueError

__all__ = ["LRScheduler"]


class LRScheduler:
    """Wraps a ``torch.optim.lr_scheduler`` with a step mode, as ``wrap_lr_scheduler`` returns.

    Example:
        >>> sched = context.wrap_lr_scheduler(
        ...     torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9),
        ...     step_mode=LRScheduler.StepMode.STEP_EVERY_EPOCH,
        ... )
    """

    class StepMode(enum.Enum):
        """When the trainer calls ``scheduler.step()``."""

        STEP_EVERY_EPOCH = 1
        STEP_EVERY_BATCH = 2
        MANUAL_STEP = 3
        STEP_EVERY_OPTIMIZER_STEP = 4

    def __init__(
        self,
        scheduler: torch.optim.lr_scheduler.LRScheduler | Any,
        step_mode: LRScheduler.StepMode,
        frequency: int = 1,
    ) -> None:
        if not isinstance(step_mode, LRScheduler.StepMode):
            raise TrialValueError(
                f"step_mode is {step_mode!r}, but must be one of "
                f"{[m.name for m in LRScheduler.StepMode]} (LRScheduler.StepMode)"
            )
        if frequency < 1:
            raise TrialValueError(f"frequency is {frequency}, but must be >= 1")
        self._scheduler = scheduler
        self._step_mode = step_mode
        self._frequency = frequency
        self._calls = 0

    @property
    def scheduler(self) -> Any:
        """The wrapped torch scheduler."""
        return self._scheduler

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Step the wrapped scheduler (call this yourself in ``MANUAL_STEP`` mode)."""
        self._scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        return list(self._scheduler.get_last_lr())

    def state_dict(self) -> dict[str, Any]:
        return {"scheduler": self._scheduler.state_dict(), "calls": self._calls}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "scheduler" in state and "calls" in state:
            self._scheduler.load_state_dict(state["scheduler"])
            self._calls = int(state["calls"])
        else:  # Determined's checkpoints hold the torch scheduler's own state dict
            self._scheduler.load_state_dict(state)

    def _steps_with(self, optimizer: Any) -> bool:
        """Whether a step of ``optimizer`` counts for ``STEP_EVERY_OPTIMIZER_STEP``."""
        # A scheduler follows its own optimizer, so two optimizers don't double-step it.
        owner = getattr(self._scheduler, "optimizer", None)
        return owner is None or owner is optimizer

    def _tick(self, mode: LRScheduler.StepMode) -> None:
        """Called by the trainer at each event of ``mode``; steps every ``frequency`` events."""
        if mode is not self._step_mode:
            return
        self._calls += 1
        if self._calls % self._frequency == 0:
            self._scheduler.step()

    def __getattr__(self, name: str) -> Any:
        # Delegate e.g. `last_epoch` or `base_lrs` to the torch scheduler, as users expect.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._scheduler, name)
