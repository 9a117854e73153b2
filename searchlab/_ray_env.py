"""Starting or joining Ray quietly, so that searchlab's own progress output is what users see."""

from __future__ import annotations

import logging
import os
from typing import Any

__all__ = ["connect_ray", "quiet_ray_environment", "ray_init_kwargs"]


def quiet_ray_environment() -> None:
    """Environment settings read by Ray at import or init time (set before importing ray)."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "1000")
    os.environ.setdefault("RAY_TRAIN_ENABLE_V2_MIGRATION_WARNINGS", "0")
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "1")
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    # searchlab adds its own JSON and CSV loggers; this drops only Tune's tensorboardX one,
    # which kept a writer thread and files open per paused trial in the driver.
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")
    for name in ("ray", "ray.tune", "ray.train", "ray.data"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # Trial failures are reported by searchlab (one line, traceback in Results), not by Tune.
    logging.getLogger("ray.tune").setLevel(logging.CRITICAL)


def ray_init_kwargs() -> dict[str, Any]:
    return {
        "include_dashboard": False,
        "log_to_driver": False,
        "logging_level": logging.WARNING,
        "configure_logging": False,
    }


def connect_ray(address: str | None, runtime_env: dict[str, Any] | None) -> bool:
    """Join the cluster at ``address`` (or ``RAY_ADDRESS``), else start Ray here.

    Returns True when this call started or joined Ray (and so should shut it down), False when
    Ray was already initialised in this process (a notebook or the test suite).
    """
    quiet_ray_environment()
    import ray

    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    ray.init(address=address, runtime_env=runtime_env, **ray_init_kwargs())
    return True
