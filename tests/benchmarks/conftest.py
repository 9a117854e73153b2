"""The benchmark helpers (``benchmarks/_mf_*.py``) are plain modules: put their folder on sys.path."""

from __future__ import annotations

import pathlib
import sys

BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))
