"""``core.init()``: the Core API's context, in a trial or run by hand (Determined's ``core``)."""

from __future__ import annotations

import datetime
import logging
import os
import pathlib
import sys
import types
from typing import Any

from searchlab._info import ClusterInfo, get_cluster_info
from searchlab.core._checkpoint import CheckpointContext
from searchlab.core._distributed import DistributedLike, DummyDistributedContext
from searchlab.core._preempt import PreemptContext, PreemptMode
from searchlab.core._searcher import SearcherContext
from searchlab.core._session import TrialSession, trial_session
from searchlab.core._train import EarlyExitReason, TrainContext
from searchlab.errors import InvalidHP

__all__ = ["Context", "TensorboardMode", "init"]

logger = logging.getLogger("searchlab.core")


class TensorboardMode:
    """Accepted for Determined's signature: event files stay in the trial directory."""

    AUTO = "AUTO"
    MANUAL = "MANUAL"


class _Profiler:
    """Determined's system-metrics profiler: nothing to collect here."""

    def on(self, *args: Any, **kwargs: Any) -> None:
        return None

    def off(self) -> None:
        return None


class Context:
    """``checkpoint``, ``distributed``, ``preempt``, ``searcher``, ``train`` and ``info``.

    Use it as ``with core.init() as core_context:``; an ``InvalidHP`` raised inside ends the
    trial as Determined ends it (the searcher replaces it; the script exits with 0).

    Example:
        >>> with searchlab.core.init() as core_context:
        ...     core_context.train.report_training_metrics(steps_completed=1, metrics={"x": 1})
    """

    def __init__(
        self,
        *,
        checkpoint: CheckpointContext,
        distributed: DistributedLike,
        preempt: PreemptContext,
        train: TrainContext,
        searcher: SearcherContext,
        info: ClusterInfo | None,
        session: TrialSession | None,
    ) -> None:
        self.checkpoint = checkpoint
        self.distributed = distributed
        self.preempt = preempt
        self.train = train
        self.searcher = searcher
        self.info = info
        self.profiler = _Profiler()
        self._session = session

    def __enter__(self) -> Context:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: types.TracebackType | None,
    ) -> None:
        if isinstance(exc_val, InvalidHP):
            self.train.report_early_exit(EarlyExitReason.INVALID_HP)
            logger.info("InvalidHP detected during the trial; converting it to exit(0)")
            sys.exit(0)

    def close(self) -> None:
        return None


def init(
    *,
    distributed: DistributedLike | None = None,
    checkpoint_storage: str | dict[str, Any] | None = None,
    preempt_mode: PreemptMode = PreemptMode.WorkersAskChief,
    tensorboard_mode: Any = TensorboardMode.AUTO,
) -> Context:
    """The Core API's context for this process.

    In a trial, metrics and searcher results go to the trial's actor, checkpoints to the
    trial's directory. Run by hand, metrics are logged and checkpoints go to
    ``checkpoint_storage`` (a directory; default ``./searchlab-checkpoints/core-<time>``).

    Args:
        distributed: required when the trial has several processes, e.g.
            ``core.DistributedContext.from_torch_distributed()`` under the launcher.
        checkpoint_storage: a directory for checkpoints (dict forms are Determined's cluster
            storage and are ignored).
        preempt_mode: who asks whether to preempt (see ``PreemptMode``).
        tensorboard_mode: accepted and ignored.

    Example:
        >>> with searchlab.core.init() as core_context:
        ...     for op in core_context.searcher.operations():
        ...         ...
    """
    info = get_cluster_info()
    if distributed is None:
        if info is not None and len(info.slot_ids) > 1:
            raise ValueError("you must provide a valid DistributedContext for a multi-slot task")
        distributed = DummyDistributedContext()
    session = trial_session() if info is not None else None
    root = _storage_root(info, checkpoint_storage)
    tensorboard = pathlib.Path(info._session.tensorboard_dir) if info is not None else None
    return Context(
        checkpoint=CheckpointContext(root, distributed, session),
        distributed=distributed,
        preempt=PreemptContext(session, distributed, preempt_mode),
        train=TrainContext(session, tensorboard),
        searcher=SearcherContext(session, distributed, info),
        info=info,
        session=session,
    )


def _storage_root(info: ClusterInfo | None, storage: str | dict[str, Any] | None) -> pathlib.Path:
    if isinstance(storage, str | os.PathLike) and "://" not in str(storage):
        return pathlib.Path(storage)
    if info is not None:
        return pathlib.Path(info._session.checkpoint_dir)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    root = pathlib.Path.cwd() / "searchlab-checkpoints" / f"core-{stamp}"
    logger.info("no checkpoint_storage given; storing checkpoints in %s", root)
    return root
