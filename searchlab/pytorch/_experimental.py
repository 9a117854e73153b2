"""``context.experimental``: the opt-ins Determined kept there."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from searchlab.pytorch._context import PyTorchTrialContext

__all__ = ["PyTorchExperimentalContext"]


class PyTorchExperimentalContext:
    """Opt-ins that Determined kept under ``context.experimental``.

    Example:
        >>> def __init__(self, context):
        ...     context.experimental.use_amp()
        ...     self.model = context.wrap_model(Net())
    """

    def __init__(self, parent: PyTorchTrialContext) -> None:
        # Weak: a cycle with its context would keep a closed trial's model and optimizer
        # (on the GPU) alive until the next garbage collection, beside the next trial.
        self._parent_ref = weakref.ref(parent)

    @property
    def _parent(self) -> PyTorchTrialContext:
        parent = self._parent_ref()
        if parent is None:
            raise RuntimeError("context.experimental was used after its trial's context ended")
        return parent

    def use_amp(self) -> None:
        """Automatic mixed precision: autocast around ``train_batch``/``evaluate_batch``.

        bf16 where the device supports it, else fp16 with a gradient scaler; call before
        ``wrap_model``/``wrap_optimizer``.
        """
        self._parent._amp.enable_auto(self._parent.device)

    def disable_dataset_reproducibility_checks(self) -> None:
        """Allow plain torch ``DataLoader``s (resume then restarts the interrupted epoch order)."""
        self._parent._allow_torch_loaders = True

    def disable_auto_to_device(self) -> None:
        """Hand batches to ``train_batch`` as the loader yields them (no move to the device)."""
        self._parent._auto_to_device = False
