"""What each trial asks Ray for, checked against what the cluster has."""

from __future__ import annotations

from typing import Any

from searchlab.config import ExperimentConfig
from searchlab.errors import ConfigError

__all__ = ["trial_resources"]


def trial_resources(cfg: ExperimentConfig, cluster: dict[str, Any]) -> dict[str, float]:
    """``{"cpu": c, "gpu": g}`` per worker of a trial: GPUs when the cluster has any, else CPUs.

    A trial has ``resources.slots_per_trial`` workers, each with one GPU (or one CPU worker
    without GPUs); ``resources.gpus_per_trial`` (fractions pack trials on a GPU) and
    ``cpus_per_trial`` set the share of each worker.
    """
    res = cfg.resources
    gpus_available = float(cluster.get("GPU", 0))
    workers = res.slots_per_trial
    if res.gpus_per_trial is not None:
        gpus = float(res.gpus_per_trial)
    else:
        gpus = 1.0 if gpus_available > 0 else 0.0
    cpus = float(res.cpus_per_trial) if res.cpus_per_trial is not None else 1.0
    if gpus * workers > gpus_available:
        raise ConfigError(
            f"{cfg.source_name}: resources: each trial asks for {gpus * workers:g} GPU(s) but the Ray cluster "
            f"has {gpus_available:g}; lower resources.slots_per_trial / gpus_per_trial or add GPU nodes"
        )
    if cpus * workers > float(cluster.get("CPU", 0)):
        raise ConfigError(
            f"{cfg.source_name}: resources: each trial asks for {cpus * workers:g} CPUs but the "
            f"Ray cluster has {cluster.get('CPU', 0):g}; lower resources.slots_per_trial or cpus_per_trial"
        )
    return {"cpu": cpus, "gpu": gpus}
