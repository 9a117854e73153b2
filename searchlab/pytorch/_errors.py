"""Trial-definition errors that are also the builtin errors Determined raised for them.

A misused context (a hyperparameter that does not exist, a model wrapped after training began)
is a :class:`~searchlab.errors.TrialDefinitionError`: the trial runner stops the experiment with
one line instead of retrying the trial. Determined raised ``ValueError``/``TypeError`` for most of
these, so the errors derive from those too and a user's ``except ValueError`` still catches them.
"""

from __future__ import annotations

from searchlab.errors import TrialDefinitionError

__all__ = ["TrialTypeError", "TrialValueError"]


class TrialValueError(TrialDefinitionError, ValueError):
    """A bad value given to the trial API (Determined: ``ValueError``).

    Example:
        >>> try:
        ...     context.get_hparam("widht")
        ... except ValueError as exc:  # or TrialDefinitionError
        ...     print(exc)
    """


class TrialTypeError(TrialDefinitionError, TypeError):
    """An object of the wrong kind given to the trial API (Determined: ``TypeError``).

    Example:
        >>> DataLoader(my_iterable_dataset)  # raises TrialTypeError: needs a map-style dataset
    """
