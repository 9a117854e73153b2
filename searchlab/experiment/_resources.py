"""What each trial asks Ray for, checked against what the cluster's nodes have.

A trial that can never be placed would wait forever in Tune's queue ("pending 1"), so it is
refused before anything starts, in one line naming what it asks and what the cluster has.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from searchlab.config import ExperimentConfig, is_command
from searchlab.errors import ConfigError

__all__ = ["auto_standby", "standby_memory_note", "standby_share", "trial_resources"]

# Host memory one trial process holds, for auto's check of a node's memory: torch and CUDA's
# host side, and room for the trial's own (its data, a trial parked in host memory on a
# crowded GPU). On an H200 host (call 19A, ResNet-18) Ray's own ASHA trial worker peaked at
# 1.48 GiB (proportional set size) and each of standby's, which keep no paused states since
# 18C, at 1.39-1.45 GiB (three per GPU: 3.5-4.2 GiB together). Before that change they held
# 2.1-2.4 GiB each, and this estimate was 2.5 GiB.
TRIAL_PROCESS_BYTES = 2 * 2**30


def trial_resources(
    cfg: ExperimentConfig,
    nodes: Sequence[Mapping[str, Any]],
    *,
    standby: int = 0,
    resumed: bool = False,
) -> dict[str, float]:
    """``{"cpu": c, "gpu": g}`` per worker of a trial: GPUs when the cluster has any, else CPUs.

    A trial has ``resources.slots_per_trial`` workers, each with one GPU (or one CPU worker
    without GPUs); ``resources.gpus_per_trial`` (fractions pack trials on a GPU) and
    ``cpus_per_trial`` set the share of each worker. ``nodes`` is ``ray.nodes()``. With
    ``standby`` (``SEARCHLAB_STANDBY``: the trials each GPU holds ready beside the one
    training), a one-GPU trial asks for ``standby_share(standby)`` of a GPU, half of it for
    one: ``1 + standby`` trial actors share it and take turns (``experiment._standby``); CPU
    trials are unchanged. A ``resumed`` experiment keeps the standby it started with, so a
    refusal says so instead of offering to unset it.

    Raises:
        ConfigError: no node can hold one worker, or the cluster cannot hold all of them; or
            ``standby`` with trials that are not one process on one GPU.
    """
    res = cfg.resources
    standby = int(standby)  # a count (``True`` from older callers: one)
    alive = _alive(nodes)
    total = {k: sum(float(n.get(k, 0)) for n in alive) for k in ("CPU", "GPU")}
    workers = res.slots_per_trial
    if standby and total["GPU"] > 0:  # CPU trials are unchanged
        _check_standby(cfg, alive, standby, resumed=resumed)
    if res.gpus_per_trial is not None:
        gpus = float(res.gpus_per_trial)
    else:
        gpus = standby_share(standby) if total["GPU"] > 0 else 0.0
    cpus = float(res.cpus_per_trial) if res.cpus_per_trial is not None else 1.0
    asked = _describe(workers, cpus, gpus)
    if gpus * workers > total["GPU"] or cpus * workers > total["CPU"]:
        raise ConfigError(
            f"{cfg.source_name}: resources: each trial asks for {asked} but the Ray cluster has "
            f"{_cluster(alive)} in all; lower resources.slots_per_trial, cpus_per_trial or "
            "gpus_per_trial, or add nodes"
        )
    fits = [n for n in alive if float(n.get("CPU", 0)) >= cpus and float(n.get("GPU", 0)) >= gpus]
    if not fits:
        raise ConfigError(
            f"{cfg.source_name}: resources: each worker of a trial asks for "
            f"{_describe(1, cpus, gpus)} but no node of the Ray cluster has that much "
            f"({_cluster(alive)}); lower cpus_per_trial or gpus_per_trial"
        )
    return {"cpu": cpus, "gpu": gpus}


def standby_share(standby: int) -> float:
    """The GPU a one-GPU trial asks for when each GPU holds ``standby`` trials ready beside
    the one training: 1 / (1 + standby), rounded down to Ray's four decimals (1/3 asks for
    0.3333, so three of them fit on one GPU)."""
    return math.floor(10_000 / (1 + standby)) / 10_000


def auto_standby(cfg: ExperimentConfig, nodes: Sequence[Mapping[str, Any]]) -> tuple[int, str]:
    """What ``SEARCHLAB_STANDBY=auto`` runs on this cluster: the trials each GPU holds ready
    (2, or 1 where only that many fit, or 0) and a line saying so, and why not more.

    Standby needs GPUs, trials of one process on one whole GPU, enough trials at once and
    enough CPUs for every GPU's actors (the checks an explicit count must pass), host memory
    on every GPU node for them (``TRIAL_PROCESS_BYTES`` each, within Ray's ``memory``
    resource there), and ``max_restarts`` of at least 1: a trial that runs out of GPU memory
    beside the others is retried from its checkpoint, on a GPU that then keeps less on it
    (``experiment._standby``).
    """
    alive = _alive(nodes)
    head = "SEARCHLAB_STANDBY=auto"
    if sum(float(n.get("GPU", 0)) for n in alive) <= 0:
        return 0, f"{head}: standby is off, as the Ray cluster has no GPUs"
    if cfg.max_restarts < 1:
        return 0, (
            f"{head}: standby is off, as max_restarts is 0 and standby retries a trial that "
            "runs out of GPU memory beside the others from its checkpoint; set max_restarts "
            "to 1 or more to have it"
        )
    two = _auto_refusal(cfg, alive, 2)
    if two is None:
        return 2, f"{head}: each GPU holds 2 trials ready beside the one training (3 actors)"
    one = _auto_refusal(cfg, alive, 1)
    if one is None:
        return 1, (
            f"{head}: each GPU holds 1 trial ready beside the one training (2 actors), not 2: {two}"
        )
    return 0, f"{head}: standby is off, as {one}"


def _auto_refusal(cfg: ExperimentConfig, alive: list[dict[str, Any]], standby: int) -> str | None:
    """Why auto does not hold ``standby`` trials ready per GPU: an explicit count's reasons,
    and a search with fewer trials in all than the actors (one an explicit count lets run)."""
    refusal = _standby_refusal(cfg, alive, standby)
    if refusal is not None:
        return refusal[1]
    if (short := _memory_shortfall(alive, 1 + standby)) is not None:
        return short
    gpus, need = _trials_needed(alive, standby)
    trials, search = _search_trials(cfg)
    if 0 < trials < need:
        return (
            f"the {search} search has {trials} trial(s), fewer than the {need} it would run at "
            f"once on {gpus:g} GPU(s)"
        )
    return None


def standby_memory_note(
    nodes: Sequence[Mapping[str, Any]], standby: int, *, resumed: bool = False
) -> str | None:
    """A line for an explicit ``SEARCHLAB_STANDBY`` count, or the one a ``resumed``
    experiment keeps, whose trial processes a GPU node's memory may not hold (auto's check,
    ``_memory_shortfall``); None where they fit. Such a count runs as set: the estimate is a
    guide, not a limit."""
    alive = _alive(nodes)
    short = _memory_shortfall(alive, 1 + standby) if standby else None
    if short is None:
        return None
    if resumed:  # its trials keep their GPU share: auto cannot change the count now
        return (
            f"this experiment keeps the SEARCHLAB_STANDBY={standby} it started with, but "
            f"{short}, so the host may run out of memory"
        )
    return (
        f"SEARCHLAB_STANDBY={standby}: {short}, so the host may run out of memory; "
        "SEARCHLAB_STANDBY=auto holds fewer trials ready where they do not fit"
    )


def _memory_shortfall(alive: list[dict[str, Any]], actors: int) -> str | None:
    """Why a GPU node's memory cannot hold ``actors`` trial processes per GPU, at
    ``TRIAL_PROCESS_BYTES`` each, within what Ray gives its workers there (the node's
    ``memory`` resource; a node that does not declare it is not checked); None where it can."""
    for node in alive:
        memory = float(node.get("memory", 0))
        processes = _actors_on(node, actors)
        if memory > 0 and processes * TRIAL_PROCESS_BYTES > memory:
            return (
                f"a GPU node gives Ray's workers {memory / 2**30:.1f} GiB of memory, less than "
                f"its {processes} trial processes would hold (~{TRIAL_PROCESS_BYTES / 2**30:g} "
                "GiB each)"
            )
    return None


def _check_standby(
    cfg: ExperimentConfig, alive: list[dict[str, Any]], standby: int, *, resumed: bool
) -> None:
    refusal = _standby_refusal(cfg, alive, standby)
    if refusal is None:
        return
    if not resumed:
        raise ConfigError(refusal[0])
    raise ConfigError(
        f"{cfg.source_name}: this experiment started with SEARCHLAB_STANDBY={standby}, which "
        f"its trials keep when it resumes, but on this Ray cluster {refusal[1]}; resume it on "
        "a cluster like the one it started on, or run its config anew without standby "
        "(searchlab resume --force-restart with SEARCHLAB_STANDBY unset)"
    )


def _standby_refusal(
    cfg: ExperimentConfig, alive: list[dict[str, Any]], standby: int
) -> tuple[str, str] | None:
    """Why ``standby`` trials ready per GPU cannot run on the nodes ``alive`` (their
    resources): the one-line error for an explicit ``SEARCHLAB_STANDBY``, and the reason
    alone (for ``auto``'s note); None where they can."""
    res = cfg.resources
    cluster_gpus, need = _trials_needed(alive, standby)
    actors = 1 + standby
    setting = f"SEARCHLAB_STANDBY={standby}"
    fix = "unset SEARCHLAB_STANDBY or "
    if res.slots_per_trial > 1:
        what = f"resources.slots_per_trial is {res.slots_per_trial}"
        fix += "set resources.slots_per_trial to 1"
    elif res.gpus_per_trial is not None:
        what = f"resources.gpus_per_trial is {res.gpus_per_trial:g}"
        fix += "remove resources.gpus_per_trial"
    elif is_command(cfg.entrypoint):
        what = f"entrypoint is the command {cfg.entrypoint!r}"
        fix += "use a PyTorchTrial entrypoint"
    else:
        cpus = float(res.cpus_per_trial) if res.cpus_per_trial is not None else 1.0
        limits = {
            "searcher.max_concurrent_trials": getattr(cfg.searcher, "max_concurrent_trials", 0),
            "searcher.max_trials": getattr(cfg.searcher, "max_trials", 0),
        }
        for key, value in limits.items():
            if 0 < value < need:
                return (
                    f"{cfg.source_name}: {key} is {value}, but {setting} runs {actors} "
                    f"trials on each GPU (one training, {standby} ready) and the Ray cluster has "
                    f"{cluster_gpus:g} GPU(s); set {key.rpartition('.')[2]} to {need} or more, "
                    "or unset SEARCHLAB_STANDBY",
                    f"{key} is {value}, fewer than the {need} trials it would run at once on "
                    f"{cluster_gpus:g} GPU(s)",
                )
        # Each GPU's actors run on its own node: count each GPU node's CPUs, up to its actors.
        fit = sum(
            min(math.floor(float(n.get("CPU", 0)) / cpus + 1e-9), _actors_on(n, actors))
            for n in alive
            if float(n.get("GPU", 0)) > 0
        )
        if fit < need:
            return (
                f"{cfg.source_name}: resources.cpus_per_trial is {cpus:g}, so the CPUs of the "
                f"Ray cluster's GPU nodes hold {fit} trials, fewer than {setting} needs "
                f"({actors} per GPU, {need} for {cluster_gpus:g} GPU(s)); lower cpus_per_trial, "
                "or unset SEARCHLAB_STANDBY",
                f"the CPUs of the Ray cluster's GPU nodes hold {fit} trials of {cpus:g} CPU, "
                f"fewer than the {need} it would run at once on {cluster_gpus:g} GPU(s)",
            )
        return None
    return (
        f"{cfg.source_name}: {what}, but {setting} keeps one-GPU trials ready beside the "
        f"one training on each GPU, which only a PyTorchTrial of one slot and one whole GPU "
        f"can share; {fix}",
        f"{what} (standby shares a GPU between trials of one slot and one whole GPU)",
    )


def _alive(nodes: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The resources of each live node of ``ray.nodes()``."""
    return [dict(n.get("Resources") or {}) for n in nodes if n.get("Alive", True)]


def _trials_needed(alive: list[dict[str, Any]], standby: int) -> tuple[float, int]:
    """The cluster's GPUs, and the trials at once that fill each with ``1 + standby`` actors
    (fewer, and Ray would pack them onto some GPUs and leave others idle)."""
    gpus = sum(float(n.get("GPU", 0)) for n in alive)
    return gpus, math.ceil((1 + standby) * gpus - 1e-9)


def _actors_on(node: Mapping[str, Any], actors: int) -> int:
    """The trial actors a node's GPUs take, ``actors`` on each."""
    return math.floor(actors * float(node.get("GPU", 0)) + 1e-9)


def _search_trials(cfg: ExperimentConfig) -> tuple[int, str]:
    """How many trials the search makes in all where its kind fixes it (``single``: one;
    ``grid``: its points; 0 for the others, whose ``max_trials`` is a limit checked for every
    count), and the search's name."""
    name = str(getattr(cfg.searcher.name, "value", cfg.searcher.name))
    if name == "single":
        return 1, name
    if name == "grid":
        from searchers._space import HyperparameterSpace

        return HyperparameterSpace.from_config(cfg).grid_size(), name
    return 0, name


def _describe(workers: int, cpus: float, gpus: float) -> str:
    parts = [f"{cpus * workers:g} CPU"] + ([f"{gpus * workers:g} GPU"] if gpus else [])
    each = f" ({workers} workers)" if workers > 1 else ""
    return " + ".join(parts) + each


def _cluster(nodes: list[dict[str, Any]]) -> str:
    shown = [f"{float(n.get('CPU', 0)):g} CPU/{float(n.get('GPU', 0)):g} GPU" for n in nodes]
    return f"{len(nodes)} node(s): " + ", ".join(shown[:4]) + (", ..." if len(shown) > 4 else "")
