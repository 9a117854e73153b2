"""The exception hierarchy of searchlab.

Every error a user can fix derives from :class:`SearchlabError`; the CLI prints its message on
one line and exits with code 2. Anything else is a bug in searchlab and keeps its traceback.
"""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "ConfigError",
    "InvalidHP",
    "SearchlabError",
    "TrialDefinitionError",
]


class SearchlabError(Exception):
    """Root of the errors a user can act on (bad config, bad trial class, bad checkpoint)."""


class ConfigError(SearchlabError):
    """An experiment config that cannot be used: ``grid.yaml: searcher.max_trials: must be >= 1, got 0``."""


class TrialDefinitionError(SearchlabError):
    """A ``PyTorchTrial`` subclass that breaks the trial contract (no wrapped model, ...).

    ``config_path`` names the experiment config field the mistake is about, when it is one
    (``searcher.metric`` for a metric the trial never reports), so the one-line error can
    lead with the file and the field.
    """

    def __init__(self, *args: object, config_path: str | None = None) -> None:
        super().__init__(*args)
        self.config_path = config_path


class CheckpointError(SearchlabError):
    """A checkpoint directory that cannot be read or written."""


class InvalidHP(Exception):
    """Raised by a trial's ``__init__`` (or later) to reject its hyperparameters.

    The searcher replaces such a trial with a new one and does not count it, as in Determined.

    Example:
        >>> class MyTrial(PyTorchTrial):
        ...     def __init__(self, context):
        ...         if context.get_hparam("layers") > 8 and context.get_hparam("width") > 512:
        ...             raise InvalidHP("too large for one GPU")
    """
