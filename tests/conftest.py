"""Shared fixtures: the toy trials on sys.path, and one Ray instance for the whole run."""

from __future__ import annotations

import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
sys.path.insert(0, str(FIXTURES))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance with 2 CPUs shared by every Ray test."""
    ray = pytest.importorskip("ray")
    from searchlab._ray_env import ray_init_kwargs

    if not ray.is_initialized():
        ray.init(num_cpus=2, **ray_init_kwargs())
    yield ray
    ray.shutdown()
