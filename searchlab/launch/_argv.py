"""Telling a Python interpreter in a command (no imports beyond the standard library)."""

from __future__ import annotations

import re

__all__ = ["is_python"]

_PYTHON = re.compile(r"^(.*/)?python(\d+(\.\d+)?)?$")


def is_python(program: str) -> bool:
    """``python``, ``python3``, ``python3.11`` or a path to one of them."""
    return bool(_PYTHON.match(program))
