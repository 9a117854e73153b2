"""The trial API: Determined's ``determined.pytorch``, so that only the import changes.

The loop that runs a trial (``searchlab.pytorch._loop``) is searchlab's plumbing, not exported.

Example:
    >>> from searchlab import pytorch
    >>> class MyTrial(pytorch.PyTorchTrial):
    ...     ...
    >>> with pytorch.init(hparams={"global_batch_size": 32}) as ctx:
    ...     pytorch.Trainer(MyTrial(ctx), ctx).fit(max_length=pytorch.Epoch(1))
"""

from __future__ import annotations

from searchlab.pytorch import samplers
from searchlab.pytorch._callback import PyTorchCallback
from searchlab.pytorch._checkpoint import load_checkpoint
from searchlab.pytorch._context import PyTorchExperimentalContext, PyTorchTrialContext
from searchlab.pytorch._data import (
    DataLoader,
    TorchData,
    adapt_batch_sampler,
    data_length,
    to_device,
)
from searchlab.pytorch._distributed import DistributedContext
from searchlab.pytorch._load import (
    CheckpointLoadContext,
    load_trial_class,
    load_trial_from_checkpoint_path,
)
from searchlab.pytorch._lr_scheduler import LRScheduler
from searchlab.pytorch._reducer import MetricReducer, Reducer, SimpleReducer
from searchlab.pytorch._trainer import Trainer, init
from searchlab.pytorch._trial import PyTorchTrial
from searchlab.pytorch._units import Batch, Epoch, Record, TrainUnit

__all__ = [
    "Batch",
    "CheckpointLoadContext",
    "DataLoader",
    "DistributedContext",
    "Epoch",
    "LRScheduler",
    "MetricReducer",
    "PyTorchCallback",
    "PyTorchExperimentalContext",
    "PyTorchTrial",
    "PyTorchTrialContext",
    "Record",
    "Reducer",
    "SimpleReducer",
    "TorchData",
    "TrainUnit",
    "Trainer",
    "adapt_batch_sampler",
    "data_length",
    "init",
    "load_checkpoint",
    "load_trial_class",
    "load_trial_from_checkpoint_path",
    "samplers",
    "to_device",
]
