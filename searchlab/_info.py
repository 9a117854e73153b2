"""``get_cluster_info()``: what a script learns about the trial it runs in (Determined's ``det._info``).

A script trial's process finds its trial in a JSON file named by ``SEARCHLAB_CLUSTER_INFO``,
written by the trial's Ray actor before it starts the script (this module owns the format).
Run by hand, with no such variable, ``get_cluster_info()`` is ``None`` and a script trains
locally, as on a laptop without Determined.

Example:
    >>> import searchlab
    >>> info = searchlab.get_cluster_info()
    >>> if info is not None:
    ...     hparams, latest = info.trial.hparams, info.latest_checkpoint
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import zlib
from typing import Any

__all__ = [
    "ENV_VAR",
    "FORMAT_VERSION",
    "ClusterInfo",
    "SessionInfo",
    "TrialInfo",
    "get_cluster_info",
    "int_id",
    "write_cluster_info",
]

ENV_VAR = "SEARCHLAB_CLUSTER_INFO"
FORMAT_VERSION = 1


class TrialInfo:
    """The trial a script runs for: ids, seed, hyperparameters (as ``det.TrialInfo``).

    Example:
        >>> info.trial.hparams["learning_rate"], info.trial.trial_id
        (0.1, 3)
    """

    def __init__(
        self,
        trial_id: int,
        experiment_id: int,
        trial_seed: int,
        hparams: dict[str, Any],
        config: dict[str, Any],
        steps_completed: int = 0,
        trial_run_id: int = 1,
        debug: bool = False,
        inter_node_network_interface: str | None = None,
    ) -> None:
        #: The trial's number: its directory name's index plus one (Determined's ids start at 1).
        self.trial_id = trial_id
        #: A number for the experiment, derived from its directory name.
        self.experiment_id = experiment_id
        #: The trial's random seed, drawn from ``reproducibility.experiment_seed``.
        self.trial_seed = trial_seed
        #: The hyperparameter values of this trial (nested groups as dicts).
        self.hparams = hparams
        self._config = config
        self._steps_completed = steps_completed
        self._trial_run_id = trial_run_id
        self._debug = debug
        self._inter_node_network_interface = inter_node_network_interface


@dataclasses.dataclass(frozen=True)
class SessionInfo:
    """What searchlab's own trial API needs beyond Determined's fields (private to searchlab)."""

    socket: str  # the trial actor's Unix socket; rank 0 reports through it
    token: str  # proves to the actor that the connection is its script's
    checkpoint_dir: str  # where the script's checkpoints go (the actor keeps the latest)
    tensorboard_dir: str
    rung_ends: list[int]  # lengths (in ``length_unit``) at which the searcher takes a result
    next_rung: int  # the first rung whose result the searcher does not have yet
    length_unit: str  # batches, records or epochs
    script_length: bool  # the config gave no length: the script's fit(max_length) decides
    searcher_metric: str
    smaller_is_better: bool
    tune_trial_id: str  # the trial's name in the results (its directory)
    experiment_name: str


class ClusterInfo:
    """Where and what this process runs, as ``det.ClusterInfo`` for a trial task.

    Example:
        >>> info = searchlab.get_cluster_info()
        >>> info.trial.trial_id, info.latest_checkpoint, info.container_rank
        (1, None, 0)
    """

    def __init__(
        self,
        *,
        trial_info: TrialInfo,
        session: SessionInfo,
        latest_checkpoint: str | None = None,
        slot_ids: list[int] | None = None,
        gpu_uuids: list[str] | None = None,
        container_addrs: list[str] | None = None,
        container_rank: int = 0,
        agent_id: str = "localhost",
    ) -> None:
        self.master_url = "searchlab://local"
        self.cluster_id = "searchlab"
        self.agent_id = agent_id
        #: The slots (GPUs, or CPU workers) of this trial on this machine.
        self.slot_ids = list(slot_ids or [0])
        self.task_id = session.tune_trial_id
        self.allocation_id = f"{session.tune_trial_id}.{trial_info._trial_run_id}"
        self.session_token = ""
        self.task_type = "TRIAL"
        self.master_cert_name: str | None = None
        self.master_cert_file: str | None = None
        self._latest_checkpoint = latest_checkpoint
        self._trial_info = trial_info
        self._session = session
        self._gpu_uuids = list(gpu_uuids or [])
        self._container_addrs = list(container_addrs or ["127.0.0.1"])
        self._container_rank = container_rank

    @property
    def latest_checkpoint(self) -> str | None:
        """The checkpoint directory to continue from (a paused or restarted trial), or None."""
        return self._latest_checkpoint

    @property
    def user_data(self) -> dict[str, Any]:
        """The experiment config's ``data`` section."""
        return dict(self._trial_info._config.get("data") or {})

    @property
    def trial(self) -> TrialInfo:
        return self._trial_info

    @property
    def container_addrs(self) -> list[str]:
        """The address of each machine of the trial, by rank (one machine here)."""
        return list(self._container_addrs)

    @property
    def container_slot_counts(self) -> list[int]:
        return [len(self.slot_ids)]

    @property
    def container_rank(self) -> int:
        return self._container_rank

    @property
    def gpu_uuids(self) -> list[str]:
        """The UUIDs of the GPUs given to the trial (empty on CPU)."""
        return list(self._gpu_uuids)


def int_id(name: str) -> int:
    """A positive number for a name: a trailing index plus one (``3f2a_00002`` -> 3), else
    a stable hash (experiment names)."""
    tail = name.rsplit("_", 1)[-1]
    if tail.isdigit() and tail != name:
        return int(tail) + 1
    return zlib.crc32(name.encode()) & 0x7FFFFFFF or 1


def write_cluster_info(path: str | os.PathLike[str], info: ClusterInfo) -> pathlib.Path:
    """Write ``info`` where a script's ``get_cluster_info()`` reads it (private to the user)."""
    trial = info.trial
    data = {
        "format_version": FORMAT_VERSION,
        "trial": {
            "trial_id": trial.trial_id,
            "experiment_id": trial.experiment_id,
            "trial_seed": trial.trial_seed,
            "hparams": trial.hparams,
            "config": trial._config,
            "steps_completed": trial._steps_completed,
            "trial_run_id": trial._trial_run_id,
        },
        "session": dataclasses.asdict(info._session),
        "latest_checkpoint": info.latest_checkpoint,
        "slot_ids": info.slot_ids,
        "gpu_uuids": info.gpu_uuids,
        "container_addrs": info.container_addrs,
        "container_rank": info.container_rank,
        "agent_id": info.agent_id,
    }
    path = pathlib.Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, default=str)
    os.replace(tmp, path)
    return path


def _read(path: str) -> ClusterInfo:
    data = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    version = data.get("format_version")
    if version != FORMAT_VERSION:
        raise RuntimeError(
            f"{path}: cluster info format {version!r}, but this searchlab reads "
            f"{FORMAT_VERSION}; the trial's script runs a different searchlab than its driver"
        )
    return ClusterInfo(
        trial_info=TrialInfo(**data["trial"]),
        session=SessionInfo(**data["session"]),
        latest_checkpoint=data.get("latest_checkpoint"),
        slot_ids=data.get("slot_ids"),
        gpu_uuids=data.get("gpu_uuids"),
        container_addrs=data.get("container_addrs"),
        container_rank=int(data.get("container_rank", 0)),
        agent_id=str(data.get("agent_id", "localhost")),
    )


_cache: tuple[str, ClusterInfo] | None = None


def get_cluster_info() -> ClusterInfo | None:
    """The trial this process runs in, or None outside an experiment (run by hand).

    Example:
        >>> info = searchlab.get_cluster_info()
        >>> hparams = info.trial.hparams if info else {"learning_rate": 0.1}
    """
    global _cache
    path = os.environ.get(ENV_VAR)
    if not path:
        return None
    if _cache is None or _cache[0] != path:
        _cache = (path, _read(path))
    return _cache[1]
