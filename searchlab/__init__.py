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
from searchlab.experiment import resume, run
from searchlab.results import Results, load_results

__all__ = [
    "CheckpointError",
    "ConfigError",
    "InvalidHP",
    "Results",
    "SearchlabError",
    "TrialDefinitionError",
    "load_results",
    "resume",
    "run",
]

__version__ = "0.1.0"
