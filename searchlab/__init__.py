"""searchlab: hyperparameter search for PyTorch on Ray Tune, with Determined's trial API.

Example:
    >>> import searchlab
    >>> results = searchlab.run("configs/grid.yaml", model_dir="examples/mnist")
    >>> results.trials.head()

The package imports lazily: ``import searchlab`` (or ``searchlab.errors``, or a trial worker's
``searchlab.pytorch``) loads neither Ray, pandas nor the experiment layer until one of their
names is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from searchlab.errors import (
    CheckpointError,
    ConfigError,
    InvalidHP,
    SearchlabError,
    TrialDefinitionError,
)

if TYPE_CHECKING:
    from searchlab import core
    from searchlab._info import ClusterInfo, TrialInfo, get_cluster_info
    from searchlab.core._import import import_from_path
    from searchlab.experiment import resume, run
    from searchlab.results import Results, load_results

__all__ = [
    "LOG_FORMAT",
    "CheckpointError",
    "ClusterInfo",
    "ConfigError",
    "InvalidHP",
    "Results",
    "SearchlabError",
    "TrialDefinitionError",
    "TrialInfo",
    "core",
    "get_cluster_info",
    "import_from_path",
    "load_results",
    "resume",
    "run",
]

__version__ = "0.1.0"

# Determined's logging format (``det.LOG_FORMAT``), for scripts that configure logging with it.
LOG_FORMAT = "%(levelname)s: [%(process)s] %(name)s: %(message)s"

_SUBMODULES = ("pytorch", "tensorboard", "results", "experiment", "config", "core", "launch")
_LAZY = {
    "run": "searchlab.experiment",
    "resume": "searchlab.experiment",
    "Results": "searchlab.results",
    "load_results": "searchlab.results",
    "get_cluster_info": "searchlab._info",
    "ClusterInfo": "searchlab._info",
    "TrialInfo": "searchlab._info",
    "import_from_path": "searchlab.core._import",
}


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"searchlab.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'searchlab' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
