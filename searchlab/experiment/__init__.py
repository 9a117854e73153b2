"""Running experiments on Ray Tune.

``run`` and ``resume`` load on first use: a trial worker imports this package's
``_trainable`` and must not pay for the driver's modules (the search methods, the config
loader, the results layer) on its way to the first batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from searchlab.experiment._runner import resume, run

__all__ = ["resume", "run"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from searchlab.experiment import _runner

        return getattr(_runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
