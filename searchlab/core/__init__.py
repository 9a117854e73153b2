"""The parts of Determined's Core API that training scripts use (``determined.core``).

Metrics (``train``), checkpoints (``checkpoint``), the searcher's operations (``searcher``),
preemption (``preempt``) and the workers (``distributed``), inside a searchlab trial or run
by hand, so that a script written for Determined runs with only the import changed.

Example:
    >>> import searchlab as det
    >>> info = det.get_cluster_info()
    >>> with det.core.init() as core_context:
    ...     core_context.train.report_validation_metrics(
    ...         steps_completed=100, metrics={"validation_loss": 0.3, "batches": 100})
    ...     if core_context.preempt.should_preempt():
    ...         ...
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from searchlab.core._checkpoint import CheckpointContext, DownloadMode
from searchlab.core._context import Context, TensorboardMode, init
from searchlab.core._distributed import DummyDistributedContext
from searchlab.core._preempt import PreemptContext, PreemptMode
from searchlab.core._searcher import SearcherContext, SearcherMode, SearcherOperation, Unit
from searchlab.core._train import EarlyExitReason, TrainContext

if TYPE_CHECKING:
    from searchlab.pytorch._distributed import DistributedContext

__all__ = [
    "CheckpointContext",
    "Context",
    "DistributedContext",
    "DownloadMode",
    "DummyDistributedContext",
    "EarlyExitReason",
    "PreemptContext",
    "PreemptMode",
    "SearcherContext",
    "SearcherMode",
    "SearcherOperation",
    "TensorboardMode",
    "TrainContext",
    "Unit",
    "init",
]


def __getattr__(name: str) -> Any:
    # torch.distributed's context: imported when used, so a script without torch starts fast.
    if name == "DistributedContext":
        from searchlab.pytorch._distributed import DistributedContext

        return DistributedContext
    raise AttributeError(f"module 'searchlab.core' has no attribute {name!r}")
