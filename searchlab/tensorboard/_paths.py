"""Where this process's trial writes TensorBoard files (set by the trial's context)."""

from __future__ import annotations

import pathlib

__all__ = ["get_base_path", "set_base_path"]

_DEFAULT = pathlib.Path("tensorboard")
_current: pathlib.Path | None = None


def set_base_path(path: str | pathlib.Path) -> None:
    """Make ``path`` the TensorBoard directory of the trial this process now runs."""
    global _current
    _current = pathlib.Path(path)


def get_base_path() -> pathlib.Path:
    """The running trial's TensorBoard directory (``./tensorboard`` before any trial)."""
    return _current if _current is not None else _DEFAULT
