"""``TorchWriter``: Determined's ``determined.tensorboard.metric_writers.pytorch.TorchWriter``."""

from __future__ import annotations

import warnings
from typing import Any

from searchlab.tensorboard import summary_writer
from searchlab.tensorboard._paths import get_base_path
from searchlab.tensorboard.metric_writers import MetricWriter

__all__ = ["TorchWriter"]


class TorchWriter(MetricWriter):
    """A ``SummaryWriter`` (``.writer``) writing into the running trial's TensorBoard directory.

    Deprecated in Determined, kept so its trials run unchanged; new code should use
    ``context.get_tensorboard_writer()``, which writes to the same directory.

    Example:
        >>> from searchlab.tensorboard.metric_writers.pytorch import TorchWriter
        >>> class MyTrial(PyTorchTrial):
        ...     def __init__(self, context):
        ...         self.logger = TorchWriter()
        ...     def train_batch(self, batch, epoch_idx, batch_idx):
        ...         self.logger.writer.add_scalar("my_metric", 0.5, batch_idx)
    """

    def __init__(self) -> None:
        warnings.warn(
            "TorchWriter() is deprecated, as in Determined; use "
            "context.get_tensorboard_writer(), which writes to the same directory",
            FutureWarning,
            stacklevel=2,
        )
        self.log_dir = get_base_path()
        self.writer: Any = summary_writer(self.log_dir)

    def add_scalar(self, name: str, value: Any, step: int) -> None:
        self.writer.add_scalar(name, value, step)

    def reset(self) -> None:
        # Flush and close: the next write opens a new event file.
        self.writer.close()

    def flush(self) -> None:
        self.writer.flush()
