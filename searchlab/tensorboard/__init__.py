"""TensorBoard for trials: Determined's ``determined.tensorboard`` names, only the import changes.

Example:
    >>> from searchlab.tensorboard.metric_writers.pytorch import TorchWriter
    >>> class MyTrial(PyTorchTrial):
    ...     def __init__(self, context):
    ...         self.logger = TorchWriter()  # writes into context.get_tensorboard_path()
    ...     def train_batch(self, batch, epoch_idx, batch_idx):
    ...         self.logger.writer.add_scalar("my_metric", 0.5, batch_idx)
"""

from __future__ import annotations

import importlib
import pathlib
from typing import Any

from searchlab.tensorboard._paths import get_base_path
from searchlab.tensorboard.metric_writers import MetricWriter

__all__ = ["MetricWriter", "get_base_path", "summary_writer"]


def summary_writer(log_dir: str | pathlib.Path) -> Any:
    """A ``SummaryWriter`` into ``log_dir``: torch's, or tensorboardX's without ``tensorboard``.

    Both have the same methods (``add_scalar``, ``add_image``, ``flush``, ``close``, ...).
    """
    try:
        module: Any = importlib.import_module("torch.utils.tensorboard")
    except ImportError:  # torch's writer needs the `tensorboard` package
        module = importlib.import_module("tensorboardX")
    return module.SummaryWriter(str(log_dir))
