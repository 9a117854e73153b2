"""Warming Ray's idle workers while Tune sets up, so the first trials start sooner.

A trial's actor is one of Ray's pooled worker processes. Before its first batch it imports
torch, Ray Tune and searchlab (seconds on any machine) and the experiment's model module. Tune
asks for the actors only once its controller runs, after the searcher, the trainable and the
experiment directory are set up. ``prewarm_workers`` hands idle workers a task that does those
imports at the start of ``searchlab.run``; a worker that ran it goes back to the pool and is
the one Ray gives the next actor of the same job and runtime environment. Nothing touches the
GPU (the trials set up CUDA themselves). On a machine with nothing idle, the tasks wait in
Ray's queue and cost nothing but the queue entries.
"""

from __future__ import annotations

import logging
from typing import Any

from searchlab.experiment._spec import ExperimentSpec

__all__ = ["prewarm_workers"]

logger = logging.getLogger("searchlab")


def _import_trial_modules(spec: ExperimentSpec) -> bool:
    import importlib

    importlib.import_module("searchlab.experiment._trainable")
    from searchlab.config import is_command
    from searchlab.experiment._trial_runner import shipped_model_dir

    if not is_command(spec.entrypoint):
        from searchlab.pytorch import load_trial_class

        load_trial_class(spec.entrypoint, shipped_model_dir(spec))
    return True


def prewarm_workers(spec: ExperimentSpec, count: int) -> list[Any]:
    """Submit ``count`` warm-up tasks (no resources held); returns their refs, not waited on."""
    import ray

    task = ray.remote(num_cpus=0, max_retries=0)(_import_trial_modules)
    try:
        return [task.remote(spec) for _ in range(max(count, 0))]
    except Exception:  # a warm-up is never worth failing a run for
        logger.debug("could not submit worker warm-ups", exc_info=True)
        return []
