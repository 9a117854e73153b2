"""Run ``benchmarks/vs_ray_asha.py --smoke`` (short workload, resident batch, one round)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"


def vs_ray_asha_smoke(
    out: pathlib.Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The run with ``args`` added, its JSON written to ``out``."""
    return subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "vs_ray_asha.py"),
            *("--smoke", "--workloads", "short", "--data", "resident", "--rounds", "1"),
            *args,
            *("--out", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=540,
        env={**os.environ, **(env or {})},
    )
