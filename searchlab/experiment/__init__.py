"""Running experiments on Ray Tune."""

from __future__ import annotations

from searchlab.experiment._runner import resume, run

__all__ = ["resume", "run"]
