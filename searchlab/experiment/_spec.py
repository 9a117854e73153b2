"""What every trial of an experiment shares, as plain data shipped to Ray workers."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import uuid
from typing import Any, Literal

from searchlab.config import ExperimentConfig
from searchlab.errors import ConfigError
from searchlab.experiment._idle import DEFAULT_AFTER_S, idle_after_s

__all__ = ["ExperimentSpec", "check_environment", "standby_switch"]

TRAIN_AHEAD_VAR = "SEARCHLAB_TRAIN_AHEAD"
BACKGROUND_CHECKPOINTS_VAR = "SEARCHLAB_BACKGROUND_CHECKPOINTS"
STANDBY_VAR = "SEARCHLAB_STANDBY"
STANDBY_PREPARE_VAR = "SEARCHLAB_STANDBY_PREPARE"
STANDBY_AHEAD_VAR = "SEARCHLAB_STANDBY_AHEAD"
STANDBY_WARM_UP_VAR = "SEARCHLAB_STANDBY_WARM_UP"
CheckpointWrites = Literal["auto", "at_once", "idle", "thread", "off"]
# What ``auto`` means where the writing process also trains (a one-process trial): a thread,
# also beside training. On an H100 a trial going on from a rung end waited a median
# 0.11-0.18 s for the write between windows (``idle``) and 0.04-0.10 s with it beside
# training, which cost the loop about 0.015 s per write (``benchmarks/write_overlap.py``;
# benchmarks/README.md, calls 5D-5H).
AUTO_CHECKPOINT_WRITES: CheckpointWrites = "thread"


@dataclasses.dataclass(frozen=True)
class ExperimentSpec:
    """The experiment-level settings a trial needs (picklable, no Ray or torch objects)."""

    name: str
    exp_conf: dict[str, Any]
    entrypoint: str
    model_dir: str
    module_file: str
    metric: str
    smaller_is_better: bool
    length_unit: str
    max_length: int
    scheduling_unit: int
    validation_period: dict[str, int] | None
    checkpoint_period: dict[str, int] | None
    checkpoint_policy: str
    perform_initial_validation: bool
    aggregation_frequency: int
    environment_variables: dict[str, str]
    slots_per_trial: int = 1
    model_archive: Any = None  # an ObjectRef of the zipped model dir when Ray was already up
    # Seconds an actor idles after a checkpoint before it gives the trial's memory back
    # (None: never); ``SEARCHLAB_RELEASE_IDLE_AFTER_S`` on the driver sets it.
    release_idle_after_s: float | None = DEFAULT_AFTER_S
    # Train the next report window while the previous report travels to the driver
    # (``TrialRunner.step``); ``SEARCHLAB_TRAIN_AHEAD=1`` on the driver turns it on. Off by
    # default: on one H100 it did not change how busy the GPU was (benchmarks/README.md).
    # With standby, ``SEARCHLAB_STANDBY_AHEAD=1`` sets it instead: the window trained ahead
    # waits for the GPU's turn like any other, so a trial whose report is still on its way
    # takes the GPU as soon as the other trial's window ends. Off by default too: on one H200
    # it left the GPU as idle as without (call 12B, benchmarks/README.md).
    train_ahead: bool = False
    # How a rung end's checkpoint state is written (``experiment._checkpoint_writer``), from
    # ``SEARCHLAB_BACKGROUND_CHECKPOINTS`` on the driver. Every value but ``off`` stages it (a
    # host copy, kept for a resume from memory) and writes it after Tune's copy of the small
    # files: ``at-once`` before ``save`` returns; ``idle`` in a thread while the worker waits
    # for Tune, finished before the trial trains again; ``thread`` (``1``) in a thread, also
    # while the trial trains. ``auto`` (unset): ``AUTO_CHECKPOINT_WRITES`` where the process
    # trains, a thread in the data-parallel coordinator, which does not. ``off`` (``0``):
    # everything in ``save_checkpoint``, as Tune's own trainables.
    checkpoint_writes: CheckpointWrites = "auto"
    # Trial actors sharing each GPU, one training at a time (``experiment._standby``): set,
    # from ``SEARCHLAB_STANDBY`` on the driver, to the run's key that names its GPU locks.
    standby_key: str | None = None
    # With standby, the trials each GPU holds ready beside the one training
    # (``SEARCHLAB_STANDBY``: 1, or 2 to 7): each one-GPU trial asks for 1 / (1 + this) GPU.
    standby_ready: int = 1
    # With standby, the actor rebuilds a released trial and starts its training loader before
    # it waits for the GPU (``TrialRunner.prepare``); ``SEARCHLAB_STANDBY_PREPARE=0`` on the
    # driver leaves them to the window that trains (to measure what it saves).
    standby_prepare: bool = True
    # With standby, a trial process's first batch trains before it takes the GPU's turn,
    # beside the trial that holds it (``GpuBaton.claim_warm_up``); ``SEARCHLAB_STANDBY_WARM_UP=0``
    # on the driver trains it in the turn. On by default since calls 16A-16B (H200): 1.07-1.41
    # times the efficiency of the same search without it in three pairs (0.95 in call 15D), and
    # a first batch beside a training process neither slowed it nor picked slower kernels
    # (``benchmarks/first_batch_beside.py``).
    standby_warm_up: bool = True
    # ``SEARCHLAB_STANDBY=auto``: standby is decided once Ray is up, from what the cluster
    # and the config allow (``_resources.auto_standby``, then ``with_standby``); until then
    # it is off. Kept after the decision, for the lines that name the setting.
    standby_auto: bool = False

    @property
    def standby(self) -> int:
        """The trials each GPU holds ready beside the one training (0: standby off)."""
        return self.standby_ready if self.standby_key is not None else 0

    @property
    def staged_checkpoints(self) -> bool:
        """Rung-end states go through a ``CheckpointWriter`` (any setting but ``off``)."""
        return self.checkpoint_writes != "off"

    def with_standby(self, ready: int) -> ExperimentSpec:
        """This spec with ``ready`` trials held ready beside each GPU's training one (0: off),
        as ``SEARCHLAB_STANDBY=ready`` would have made it: what ``auto`` decided."""
        return dataclasses.replace(
            self,
            standby_key=uuid.uuid4().hex if ready else None,
            standby_ready=max(ready, 1),
            train_ahead=_train_ahead(ready),
        )

    @classmethod
    def from_config(
        cls, config: ExperimentConfig, name: str, *, standby: int | Literal["auto"] | None = None
    ) -> ExperimentSpec:
        """The spec of ``config``; ``standby`` (the trials each GPU holds ready, 0: off,
        ``"auto"``: decided once Ray is up) None reads ``SEARCHLAB_STANDBY`` (a resumed
        experiment passes the count it started with)."""
        searcher = config.searcher
        switch = standby_switch() if standby is None else standby
        auto = isinstance(switch, str)  # "auto"
        standby = 0 if isinstance(switch, str) else switch
        module = config.entrypoint.partition(":")[0]
        max_length = searcher.max_length
        return cls(
            name=name,
            exp_conf=config.to_dict(),
            entrypoint=config.entrypoint,
            model_dir=str(pathlib.Path(config.model_dir).resolve()),
            module_file=module.replace(".", "/") + ".py",
            metric=searcher.metric,
            smaller_is_better=searcher.smaller_is_better,
            length_unit=max_length.unit.value,
            max_length=int(max_length.value),
            scheduling_unit=config.scheduling_unit,
            validation_period=_length_dict(config.min_validation_period),
            checkpoint_period=_length_dict(config.min_checkpoint_period),
            checkpoint_policy=config.checkpoint_policy.value,
            perform_initial_validation=config.perform_initial_validation,
            aggregation_frequency=config.optimizations.aggregation_frequency,
            environment_variables=dict(config.environment.environment_variables),
            slots_per_trial=config.resources.slots_per_trial,
            release_idle_after_s=idle_after_s(),
            train_ahead=_train_ahead(standby),
            checkpoint_writes=checkpoint_writes(),
            standby_key=uuid.uuid4().hex if standby else None,
            standby_ready=max(standby, 1),
            standby_prepare=_flag(STANDBY_PREPARE_VAR, default=True),
            standby_warm_up=_flag(STANDBY_WARM_UP_VAR, default=True),
            standby_auto=auto,
        )


def _train_ahead(standby: int) -> bool:
    """With standby, ``SEARCHLAB_STANDBY_AHEAD`` decides; without, ``SEARCHLAB_TRAIN_AHEAD``."""
    if standby:
        return _flag(STANDBY_AHEAD_VAR, default=False)
    return _flag(TRAIN_AHEAD_VAR, default=False)


def check_environment() -> None:
    """Read every switch ``from_config`` reads from the environment, raising ``ConfigError``
    for a bad value: called before anything is written."""
    idle_after_s()
    _flag(TRAIN_AHEAD_VAR, default=False)
    standby_switch()
    _flag(STANDBY_PREPARE_VAR, default=True)
    _flag(STANDBY_AHEAD_VAR, default=False)
    _flag(STANDBY_WARM_UP_VAR, default=True)
    checkpoint_writes()


# Most trials one GPU may hold ready beside the one training (``SEARCHLAB_STANDBY``).
MAX_STANDBY = 7
# ``SEARCHLAB_STANDBY=auto``: as many as the cluster and the config allow, up to two.
STANDBY_AUTO = "auto"


def standby_switch() -> int | Literal["auto"]:
    """``SEARCHLAB_STANDBY``: how many trials each GPU holds ready beside the one training,
    their actors taking turns on it (0: off, when unset). ``1`` (or on): one, two trial
    actors per GPU; ``2`` to ``7``: that many, a GPU's 3 to 8 actors taking turns; ``auto``:
    decided once Ray is up (``_resources.auto_standby``)."""
    text = os.environ.get(STANDBY_VAR, "").strip()
    if text.lower() == STANDBY_AUTO:
        return "auto"
    if text.isdigit() and 2 <= int(text) <= MAX_STANDBY:
        return int(text)
    if text.isdigit() and int(text) > MAX_STANDBY:
        raise ConfigError(
            f"environment variable {STANDBY_VAR}={os.environ[STANDBY_VAR]!r} holds more trials "
            f"ready per GPU than searchlab allows; set it to 1 to {MAX_STANDBY}, 0, or unset it"
        )
    on = _flag(
        STANDBY_VAR,
        default=False,
        choices=f"1 to {MAX_STANDBY} (trials ready per GPU), auto or 0",
    )
    return 1 if on else 0


def checkpoint_writes() -> CheckpointWrites:
    """``SEARCHLAB_BACKGROUND_CHECKPOINTS``: ``auto`` (unset), ``at-once``, ``idle``,
    ``thread`` (on) or ``off``."""
    text = os.environ.get(BACKGROUND_CHECKPOINTS_VAR, "").strip().lower().replace("-", "_")
    if text in ("", "auto"):
        return "auto"
    if text == "at_once":
        return "at_once"
    if text == "idle":
        return "idle"
    on = _flag(BACKGROUND_CHECKPOINTS_VAR, default=True, choices="auto, at-once, idle, 1 or 0")
    return "thread" if on else "off"


def _flag(name: str, *, default: bool, choices: str = "1 or 0") -> bool:
    """An on/off environment variable (``default`` when unset); any other value is refused."""
    text = os.environ.get(name, "").strip().lower()
    if not text:
        return default
    if text in ("1", "on", "true", "yes"):
        return True
    if text in ("0", "off", "false", "no"):
        return False
    raise ConfigError(
        f"environment variable {name}={os.environ[name]!r} is not on or off; set it to "
        f"{choices}, or unset it"
    )


def _length_dict(length: Any) -> dict[str, int] | None:
    if length is None or int(length.value) == 0:
        return None
    return {length.unit.value: int(length.value)}
