"""Running experiments on Ray Tune."""

from __future__ import annotations

from searchlab.experiment._runner import run

__all__ = ["run"]
