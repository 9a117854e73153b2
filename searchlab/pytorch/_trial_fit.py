"""``pytorch.init()`` and ``Trainer.fit()`` inside a searchlab trial (a script entrypoint).

Inside a trial the context comes from the trial (hyperparameters, seed, config, the launcher's
torch.distributed group), and ``fit`` trains in segments that end at the searcher's rung ends:
it validates there, reports to the trial's actor, and waits for the searcher's answer (go on,
checkpoint, pause, stop) as Determined 0.37's Trainer waited for its next searcher operation.
A pause is a preemption: ``fit`` checkpoints and returns, the script exits, and the next run of
the script gets that checkpoint as ``info.latest_checkpoint``.

Example (the script Determined 0.38 users write):
    >>> info = searchlab.get_cluster_info()
    >>> with pytorch.init() as ctx:
    ...     trainer = pytorch.Trainer(MyTrial(ctx, info.trial.hparams), ctx)
    ...     trainer.fit(max_length=pytorch.Batch(937), latest_checkpoint=info.latest_checkpoint)
"""

from __future__ import annotations

import contextlib
import logging
import pathlib
import sys
import uuid
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from searchlab._info import ClusterInfo
from searchlab.core._channel import Action, Stored
from searchlab.core._channel import Report as Message
from searchlab.core._session import TrialSession, trial_session
from searchlab.errors import InvalidHP, SearchlabError, TrialDefinitionError
from searchlab.pytorch._checkpoint import load_checkpoint, save_checkpoint_dir
from searchlab.pytorch._context import PyTorchTrialContext
from searchlab.pytorch._distributed import DistributedContext
from searchlab.pytorch._errors import TrialValueError
from searchlab.pytorch._loop import LoopSettings, Report, TrialLoop
from searchlab.pytorch._state import TrialState, capture_rng_state, restore_rng_state
from searchlab.pytorch._units import TrainUnit

if TYPE_CHECKING:
    from searchlab.pytorch._trainer import Trainer

__all__ = ["fit_in_trial", "trial_context"]

logger = logging.getLogger("searchlab")


@contextlib.contextmanager
def trial_context(
    info: ClusterInfo,
    *,
    hparams: dict[str, Any] | None,
    distributed: DistributedContext | None,
    aggregation_frequency: int,
    enable_tensorboard_logging: bool,
) -> Iterator[PyTorchTrialContext]:
    """The context ``pytorch.init()`` gives a script inside a trial."""
    from searchlab.pytorch._trainer import _init_process_group, seed_everything

    spec = info._session
    session = trial_session()
    try:
        if distributed is None:
            distributed = DistributedContext.from_torch_env()
        if distributed.size == 1 and len(info.slot_ids) > 1:
            raise TrialDefinitionError(
                f"the trial has {len(info.slot_ids)} slots but the script runs as one process; "
                "launch it on every slot: python3 -m searchlab.launch.torch_distributed "
                "python3 SCRIPT.py"
            )
        _init_process_group(distributed)
        conf = info.trial._config
        configured = int((conf.get("optimizations") or {}).get("aggregation_frequency") or 1)
        seed_everything(info.trial.trial_seed + distributed.rank)  # as the class API's workers
        context = PyTorchTrialContext(
            hparams if hparams is not None else dict(info.trial.hparams),
            exp_conf=conf,
            distributed=distributed,
            trial_seed=info.trial.trial_seed,
            trial_id=spec.tune_trial_id,
            experiment_id=spec.experiment_name,
            aggregation_frequency=aggregation_frequency
            if aggregation_frequency != 1
            else configured,
            tensorboard_path=spec.tensorboard_dir,
            enable_tensorboard_logging=enable_tensorboard_logging,
        )
    except SearchlabError as exc:
        if session is not None:
            session.fail("fatal", str(exc))
        raise
    context._checkpoint_dir = pathlib.Path(spec.checkpoint_dir)  # type: ignore[attr-defined]
    context._cluster_info = info  # type: ignore[attr-defined]
    try:
        yield context
    except InvalidHP as exc:
        if session is not None:
            session.fail("invalid_hp", str(exc) or "InvalidHP")
        logger.info("InvalidHP raised in the trial; converting it to exit(0)")
        sys.exit(0)  # as Determined: the searcher replaces the trial
    except SearchlabError as exc:
        if session is not None:
            session.fail("fatal", str(exc))
        raise
    finally:
        context.close()


def fit_in_trial(
    trainer: Trainer,
    info: ClusterInfo,
    settings: LoopSettings,
    *,
    max_length: TrainUnit | None,
    reporting_period: TrainUnit | None,
    latest_checkpoint: str | None,
    trusted: bool,
) -> str | None:
    """``Trainer.fit`` in a trial: train to the searcher's rung ends, as it decides."""
    if settings.test_mode:
        raise TrialValueError("test_mode is only supported when the script runs by hand")
    if latest_checkpoint is None and info.latest_checkpoint is not None:
        logger.warning(
            "latest_checkpoint has not been configured; pause/resume cannot continue from "
            "the latest checkpoint. Did you mean fit(latest_checkpoint=info.latest_checkpoint)?"
        )
    return _TrialFit(trainer, info, settings).run(
        _max_length(max_length, info), reporting_period, latest_checkpoint, trusted
    )


def _max_length(max_length: TrainUnit | None, info: ClusterInfo) -> TrainUnit:
    spec = info._session
    if max_length is not None:
        _check_searcher_length(max_length, info)
        return TrainUnit.coerce(max_length)
    if spec.script_length:
        raise TrialValueError("fit(max_length=X) must be set with your desired training length")
    warnings.warn(
        "fit() without max_length trains to the config's searcher length (Determined 0.38 "
        "deprecated this); pass fit(max_length=...) with your training length",
        FutureWarning,
        stacklevel=4,
    )
    return TrainUnit.from_spec(spec.length_unit, spec.rung_ends[-1])


def _check_searcher_length(max_length: TrainUnit, info: ClusterInfo) -> None:
    spec = info._session
    if spec.script_length:
        return
    unit = {"batches": "Batch", "epochs": "Epoch", "records": "Record"}[spec.length_unit]
    expected = f"{unit}({spec.rung_ends[-1]})"
    if type(max_length).__name__ != unit or max_length.value != spec.rung_ends[-1]:
        logger.warning(
            "max_length passed to fit() (%s) does not match the searcher's length (%s); the "
            "trial trains to the shorter of the two",
            max_length,
            expected,
        )


class _TrialFit:
    def __init__(self, trainer: Trainer, info: ClusterInfo, settings: LoopSettings) -> None:
        self.trainer = trainer
        self.info = info
        self.spec = info._session
        assert trainer.context is not None
        self.context: PyTorchTrialContext = trainer.context
        self.dist = self.context.distributed
        self.session: TrialSession | None = trial_session()
        self.loop: TrialLoop = trainer._loop_with(settings)
        self.latest: str | None = None
        self._reports = 0  # reports made; a checkpoint is current when made after the last one
        self._checkpointed_at = -1

    def run(
        self,
        max_length: TrainUnit,
        reporting_period: TrainUnit | None,
        latest_checkpoint: str | None,
        trusted: bool,
    ) -> str | None:
        loop = self.loop
        if reporting_period is not None:
            loop.settings.scheduling_unit = max(loop.to_batches(reporting_period), 1)
        try:
            if latest_checkpoint is not None:
                self._load(str(latest_checkpoint), trusted)
            self._train(*self._targets(max_length))
        except SearchlabError as exc:
            if self.session is not None:
                self.session.fail("fatal", str(exc))
            raise
        finally:
            loop.shutdown()
        return self.latest

    def _targets(self, max_length: TrainUnit) -> tuple[list[int], dict[int, int]]:
        """Batch counts to train to in turn, and the rung length of those that end a rung."""
        rung_at: dict[int, int] = {}
        if not self.spec.script_length:
            for end in self.spec.rung_ends:
                rung_at.setdefault(
                    self.loop.to_batches(TrainUnit.from_spec(self.spec.length_unit, end)), end
                )
        final = self.loop.to_batches(max_length)
        if rung_at:
            final = min(final, max(rung_at))
        return sorted({b for b in rung_at if b < final} | {final}), rung_at

    def _load(self, path: str, trusted: bool) -> None:
        own = {self.info.latest_checkpoint, self.spec.checkpoint_dir}
        trusted = trusted or any(path == p or path.startswith(f"{p}/") for p in own if p)
        state, _ = load_checkpoint(path, trusted=trusted)
        self.loop.load_state_dict(state, checkpoint_uuid=pathlib.Path(path).name)
        per_rank = TrialState.from_state_dict(state).rng_per_rank
        if per_rank and self.dist.rank < len(per_rank):
            restore_rng_state(per_rank[self.dist.rank])
        self.latest = path
        self._checkpointed_at = self._reports

    def _train(self, targets: list[int], rung_at: dict[int, int]) -> None:
        loop = self.loop
        for target in targets:
            if target < loop.batches_trained:
                continue
            loop.target = target
            if target == loop.batches_trained and not loop.validation_pending():
                continue
            for report in loop.run():
                self._reports += 1
                path = self._save() if report.checkpoint else None
                self.trainer.reports.append(report)
                self.trainer.reporter.report(report)
                self.trainer._log_tensorboard(report)
                ends_rung = report.group == "validation" and report.done
                length = rung_at.get(report.batches) if ends_rung else None
                action = self._exchange(report, path, length)
                if action in (Action.PREEMPT, Action.STOP):
                    self._exit_checkpoint()
                    return
                if report.stop_requested:
                    return

    def _exchange(self, report: Report, path: str | None, length: int | None) -> Action:
        """Hand the report to the trial's actor (rank 0) and share its answer with every rank."""
        reply: str | None = None
        if self.session is not None:
            message = Message(
                group=report.group or "checkpoint",
                metrics=dict(report.metrics),
                batches=report.batches,
                epochs=report.epochs,
                searcher_length=length,
                checkpoint=path,
                first_non_finite=dict(report.first_non_finite),
            )
            reply = self.session.request(message).value
        action = self._shared(reply)
        while action is Action.CHECKPOINT:
            stored = self._current_checkpoint()
            if self.session is not None:
                reply = self.session.request(Stored(stored, self.loop.batches_trained)).value
            action = self._shared(reply)
        return action

    def _shared(self, reply: str | None) -> Action:
        if self.dist.size > 1:
            reply = self.dist.broadcast(reply)
        return Action(reply or Action.STOP.value)

    def _current_checkpoint(self) -> str:
        if self._checkpointed_at == self._reports and self.latest is not None:
            return self.latest
        return self._save()

    def _exit_checkpoint(self) -> None:
        """Checkpoint unsaved work on the way out (preemption or stop), as Determined does."""
        if self._checkpointed_at == self._reports and self.latest is not None:
            return
        path = self._save()
        if self.session is not None:
            self.session.notify(Stored(path, self.loop.batches_trained))

    def _save(self) -> str:
        """A checkpoint of every rank's state (rank 0 writes it; all ranks get its path)."""
        loop = self.loop
        rng = self.dist.allgather(capture_rng_state()) if self.dist.size > 1 else None
        path: str | None = None
        if self.dist.rank == 0:
            state = loop.state_dict()
            if rng is not None:
                state[TrialState.key("rng_per_rank")] = rng
            metadata = {**loop.metadata(), "steps_completed": loop.batches_trained}
            written = save_checkpoint_dir(
                self.spec.checkpoint_dir, str(uuid.uuid4()), state, metadata
            )
            loop.checkpoint_written(written)
            path = str(written)
        if self.dist.size > 1:
            path = self.dist.broadcast(path)
        assert path is not None
        self.latest, self._checkpointed_at = path, self._reports
        return path
