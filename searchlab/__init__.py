"""searchlab: hyperparameter search for PyTorch on Ray Tune, with Determined's trial API.

Example:
    >>> import searchlab
    >>> results = searchlab.run("configs/grid.yaml", model_dir="examples/mnist_pytorch")
    >>> results.trials.head()
"""

from __future__ import annotations

from searchlab.errors import (
    CheckpointError,
    ConfigError,
    InvalidHP,
    SearchlabError,
    TrialDefinitionError,
)

__all__ = [
    "CheckpointError",
    "ConfigError",
    "InvalidHP",
    "SearchlabError",
    "TrialDefinitionError",
]

__version__ = "0.1.0"
