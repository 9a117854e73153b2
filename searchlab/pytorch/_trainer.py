"""The local ``Trainer`` for notebooks and scripts, and loading trials from checkpoints."""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import pathlib
import random
import uuid
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np
import torch

from searchlab._info import get_cluster_info
from searchlab.errors import TrialDefinitionError
from searchlab.pytorch._checkpoint import load_checkpoint, save_checkpoint_dir
from searchlab.pytorch._context import PyTorchTrialContext
from searchlab.pytorch._distributed import DistributedContext
from searchlab.pytorch._errors import TrialValueError
from searchlab.pytorch._loop import LoopSettings, Report, TrialLoop
from searchlab.pytorch._metrics import is_numerical_scalar
from searchlab.pytorch._trial import PyTorchTrial
from searchlab.pytorch._trial_fit import fit_in_trial, trial_context
from searchlab.pytorch._units import TrainUnit

__all__ = ["MetricsReporter", "Trainer", "init", "seed_everything"]

logger = logging.getLogger("searchlab")


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global RNGs (as each trial starts)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@contextlib.contextmanager
def init(
    *,
    hparams: dict[str, Any] | None = None,
    exp_conf: dict[str, Any] | None = None,
    distributed: DistributedContext | None = None,
    aggregation_frequency: int = 1,
    enable_tensorboard_logging: bool = True,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    seed: int | None = None,
) -> Iterator[PyTorchTrialContext]:
    """A ``PyTorchTrialContext`` for training in this process, as ``determined.pytorch.init``.

    Inside a searchlab trial (a script entrypoint) the context is the trial's: its
    hyperparameters (unless ``hparams`` is given), seed, config and checkpoint directory, and
    the launcher's torch.distributed group; ``checkpoint_dir``, ``exp_conf`` and ``seed`` then
    do not apply.

    Example:
        >>> with init(hparams={"lr": 0.1, "global_batch_size": 32}, checkpoint_dir="ckpts") as ctx:
        ...     Trainer(MyTrial(ctx), ctx).fit(max_length=Batch(100), validation_period=Batch(50))
    """
    info = get_cluster_info()
    if info is not None:
        with trial_context(
            info,
            hparams=hparams,
            distributed=distributed,
            aggregation_frequency=aggregation_frequency,
            enable_tensorboard_logging=enable_tensorboard_logging,
        ) as context:
            yield context
        return
    exp_conf = dict(exp_conf or {})
    if seed is None:
        seed = int((exp_conf.get("reproducibility") or {}).get("experiment_seed") or 0)
    if distributed is None:
        distributed = DistributedContext.from_torch_env()
    _init_process_group(distributed)
    ckpt_dir = pathlib.Path(checkpoint_dir or _default_checkpoint_dir())
    logger.info("searchlab: checkpoints go to %s", ckpt_dir.resolve())
    seed_everything(seed)
    context = PyTorchTrialContext(
        hparams if hparams is not None else dict(exp_conf.get("hyperparameters") or {}),
        exp_conf=exp_conf,
        distributed=distributed,
        trial_seed=seed,
        aggregation_frequency=aggregation_frequency,
        tensorboard_path=ckpt_dir / "tensorboard",
        enable_tensorboard_logging=enable_tensorboard_logging,
    )
    context._checkpoint_dir = ckpt_dir  # type: ignore[attr-defined]
    try:
        yield context
    finally:
        context.close()


def _default_checkpoint_dir() -> pathlib.Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return pathlib.Path.cwd() / "searchlab-checkpoints" / f"{stamp}-{uuid.uuid4().hex[:6]}"


def _init_process_group(distributed: DistributedContext) -> None:
    if distributed.size > 1 and not torch.distributed.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if torch.cuda.is_available():
            torch.cuda.set_device(distributed.local_rank % torch.cuda.device_count())
        torch.distributed.init_process_group(backend)


class MetricsReporter(Protocol):
    """Where the trainer's reports go: logs here, Ray Tune in an experiment."""

    def report(self, report: Report) -> None: ...

    def checkpoint_saved(self, path: pathlib.Path, report: Report) -> None: ...


class _LogReporter:
    def report(self, report: Report) -> None:
        if report.group:
            shown = ", ".join(f"{k}={_shown(v)}" for k, v in sorted(report.metrics.items()))
            logger.info("batch %d %s: %s", report.batches, report.group, shown)

    def checkpoint_saved(self, path: pathlib.Path, report: Report) -> None:
        logger.info("batch %d: checkpoint %s", report.batches, path)


def _shown(value: Any) -> str:
    return f"{value:.6g}" if is_numerical_scalar(value) else repr(value)


class Trainer:
    """Trains a trial in this process: ``fit()`` to a length, checkpointing as it goes.

    Example:
        >>> with searchlab.pytorch.init(hparams=hp, checkpoint_dir="ckpts") as ctx:
        ...     trainer = Trainer(MyTrial(ctx), ctx)
        ...     path = trainer.fit(max_length=Batch(40), validation_period=Batch(20))
        ...     trainer.fit(max_length=Batch(80), latest_checkpoint=path)  # later, anywhere
    """

    def __init__(
        self,
        trial: PyTorchTrial,
        context: PyTorchTrialContext | None = None,
        reporter: MetricsReporter | None = None,
    ) -> None:
        self.trial = trial
        self.context = context or getattr(trial, "context", None)
        if not isinstance(self.context, PyTorchTrialContext):
            raise TrialDefinitionError(
                "Trainer(trial, context) needs the context the trial was built with"
            )
        self.reporter = reporter or _LogReporter()
        self.reports: list[Report] = []
        self._loop: TrialLoop | None = None
        self._latest: pathlib.Path | None = None

    def configure_profiler(self, *args: Any, **kwargs: Any) -> None:
        """Determined's deprecated profiler set-up: accepted and ignored."""
        logger.info("Trainer.configure_profiler() is ignored: searchlab has no system profiler")

    def fit(
        self,
        checkpoint_period: TrainUnit | None = None,
        validation_period: TrainUnit | None = None,
        max_length: TrainUnit | None = None,
        reporting_period: TrainUnit | None = None,
        checkpoint_policy: str = "best",
        latest_checkpoint: str | os.PathLike[str] | None = None,
        step_zero_validation: bool = False,
        test_mode: bool = False,
        profiling_enabled: bool = False,
        *,
        trusted: bool = False,
    ) -> str | None:
        """Train to ``max_length``; returns the newest checkpoint directory (or None).

        ``latest_checkpoint`` is loaded weights-only (tensors, containers, RNG states);
        ``trusted=True`` unpickles it fully, e.g. for callbacks that saved their own classes,
        and only for checkpoints whose origin you trust. ``profiling_enabled`` (Determined's
        system-metrics profiler) is accepted and does nothing.
        """
        if profiling_enabled:
            logger.info("fit(profiling_enabled=True): searchlab has no system profiler; ignored")
        conf = self.context.get_experiment_config()  # type: ignore[union-attr]
        searcher = conf.get("searcher") or {}
        info = getattr(self.context, "_cluster_info", None)
        if info is not None:
            return fit_in_trial(
                self,
                info,
                self._settings(
                    conf,
                    validation_period,
                    checkpoint_period,
                    checkpoint_policy,
                    step_zero_validation,
                    test_mode,
                ),
                max_length=max_length,
                reporting_period=reporting_period,
                latest_checkpoint=None if latest_checkpoint is None else str(latest_checkpoint),
                trusted=trusted,
            )
        if max_length is None:
            if "max_length" not in searcher:
                raise TrialValueError(
                    "fit() needs max_length, e.g. max_length=Batch(100) or Epoch(1)"
                )
            max_length = TrainUnit.coerce(searcher["max_length"])
        settings = self._settings(
            conf,
            validation_period,
            checkpoint_period,
            checkpoint_policy,
            step_zero_validation,
            test_mode,
        )
        loop = self._loop_with(settings)
        if reporting_period is not None:
            settings.scheduling_unit = max(loop.to_batches(reporting_period), 1)
        # Each fit() is one run of the trial: on_trial_startup ... on_trial_shutdown.
        try:
            if latest_checkpoint is not None:
                state, _ = load_checkpoint(latest_checkpoint, trusted=trusted)
                loop.load_state_dict(state, checkpoint_uuid=pathlib.Path(latest_checkpoint).name)
                self._latest = pathlib.Path(latest_checkpoint)
            loop.target = loop.to_batches(max_length)
            for report in loop.run():
                self.reports.append(report)
                self.reporter.report(report)
                self._log_tensorboard(report)
                if report.checkpoint:
                    self._latest = self._save(loop, report)
        finally:
            loop.shutdown()
        return str(self._latest) if self._latest is not None else None

    @staticmethod
    def _settings(
        conf: dict[str, Any],
        validation_period: TrainUnit | None,
        checkpoint_period: TrainUnit | None,
        checkpoint_policy: str,
        step_zero_validation: bool,
        test_mode: bool,
    ) -> LoopSettings:
        if checkpoint_policy not in ("best", "all", "none"):
            raise TrialValueError(
                f"checkpoint_policy is {checkpoint_policy!r}, but must be 'best', 'all' or 'none'"
            )
        searcher = conf.get("searcher") or {}
        return LoopSettings(
            scheduling_unit=int(conf.get("scheduling_unit") or 100),
            validation_period=validation_period,
            checkpoint_period=checkpoint_period,
            checkpoint_policy=checkpoint_policy,
            searcher_metric=searcher.get("metric"),
            smaller_is_better=bool(searcher.get("smaller_is_better", True)),
            perform_initial_validation=step_zero_validation,
            test_mode=test_mode,
        )

    def _log_tensorboard(self, report: Report) -> None:
        """Metrics into the context's TensorBoard writer, tagged as Determined tagged them."""
        ctx = self.context
        assert ctx is not None
        if not report.group or not ctx.get_enable_tensorboard_logging():
            return
        if ctx.distributed.rank != 0:
            return
        writer = ctx.get_tensorboard_writer()
        for name, value in report.metrics.items():
            if not is_numerical_scalar(value):  # as Determined: lists and None are not plotted
                continue
            if report.group == "validation" and not name.startswith("val"):
                name = f"val_{name}"
            writer.add_scalar(f"Determined/{name}", value, report.batches)

    def _loop_with(self, settings: LoopSettings) -> TrialLoop:
        if self._loop is None:
            self._loop = TrialLoop(self.trial, self.context, settings)  # type: ignore[arg-type]
        else:
            self._loop.settings = settings
            self._loop.validator._settings = settings
        return self._loop

    def _save(self, loop: TrialLoop, report: Report) -> pathlib.Path:
        root = getattr(self.context, "_checkpoint_dir", None) or _default_checkpoint_dir()
        name = f"ckpt-b{loop.batches_trained:08d}-{uuid.uuid4().hex[:8]}"
        path = save_checkpoint_dir(root, name, loop.state_dict(), loop.metadata())
        loop.checkpoint_written(path)
        self.reporter.checkpoint_saved(path, report)
        return path
