"""Capture and restore everything a trial's training depends on, for exact resume."""

from __future__ import annotations

import dataclasses
import random
from typing import Any, ClassVar

import numpy as np
import torch

from searchlab.errors import CheckpointError
from searchlab.pytorch._callback import PyTorchCallback
from searchlab.pytorch._context import PyTorchTrialContext

__all__ = [
    "TrialState",
    "capture_rng_state",
    "capture_trial_state",
    "restore_rng_state",
    "restore_trial_state",
]


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model) if hasattr(model, "no_sync") else model


def capture_rng_state() -> dict[str, Any]:
    """The global RNG states of torch (CPU and CUDA), numpy and Python.

    numpy's state is stored as a tensor and plain numbers (not ``np.random.get_state()``'s
    ndarray), so that a checkpoint needs no numpy classes to load weights-only.
    """
    state: dict[str, Any] = {
        "cpu_rng_state": torch.get_rng_state(),
        "np_rng_state": _numpy_state_to_plain(np.random.get_state()),
        "random_state": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["gpu_rng_state"] = torch.cuda.get_rng_state_all()
    return state


def _numpy_state_to_plain(state: Any) -> dict[str, Any]:
    kind, key, pos, has_gauss, cached_gaussian = state
    return {
        "kind": str(kind),
        "key": torch.from_numpy(np.asarray(key, dtype=np.int64).copy()),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached_gaussian),
    }


def _numpy_state_from_saved(saved: Any) -> tuple[Any, ...]:
    """``np.random.set_state``'s tuple from either form: searchlab's dict, or the tuple of
    ``np.random.get_state()`` that Determined and earlier searchlab releases saved."""
    if isinstance(saved, dict):
        key = saved["key"]
        key = key.numpy() if isinstance(key, torch.Tensor) else np.asarray(key)
        return (
            saved["kind"],
            key.astype(np.uint32),
            int(saved["pos"]),
            int(saved["has_gauss"]),
            float(saved["cached_gaussian"]),
        )
    return tuple(saved)


def restore_rng_state(state: dict[str, Any]) -> None:
    if "cpu_rng_state" in state:
        torch.set_rng_state(state["cpu_rng_state"])
    if "np_rng_state" in state:
        np.random.set_state(_numpy_state_from_saved(state["np_rng_state"]))
    if "random_state" in state:
        random.setstate(_as_python_random_state(state["random_state"]))
    gpu = state.get("gpu_rng_state")
    if gpu is not None and torch.cuda.is_available():
        n = min(len(gpu), torch.cuda.device_count())
        torch.cuda.set_rng_state_all(gpu[:n])


def _as_python_random_state(saved: Any) -> tuple[Any, ...]:
    # random.setstate needs tuples; a state that went through JSON or a list-based copy
    # comes back as lists.
    version, internal, gauss = saved
    return (version, tuple(internal), gauss)


@dataclasses.dataclass
class TrialState:
    """What a checkpoint's ``state-dict.pth`` holds (format 2): the one owner of its keys.

    The trial's own parts (models, optimizers, LR schedulers, AMP scalers, callbacks, RNG
    streams) come from :func:`capture_trial_state`; the loop adds its position and
    ``trainer`` state. Two fields are declared for the experiment layer: ``rng_per_rank``
    (a data-parallel trial keeps every rank's RNG streams) and ``pending_results`` (results
    trained ahead that Tune had not received when it saved). Callbacks see the dict form
    (``to_state_dict``), as in Determined.

    Example:
        >>> state = TrialState.from_state_dict(torch.load(path / "state-dict.pth"))
        >>> state.batches_trained
        400
    """

    models: list[Any]
    optimizers: list[Any] = dataclasses.field(default_factory=list)
    lr_schedulers: list[Any] = dataclasses.field(default_factory=list)
    scalers: list[Any] = dataclasses.field(default_factory=list)
    callbacks: dict[str, Any] = dataclasses.field(default_factory=dict)
    rng: dict[str, Any] | None = None
    batches_trained: int = 0
    epochs_trained: int = 0
    trainer: dict[str, Any] = dataclasses.field(default_factory=dict)
    rng_per_rank: list[dict[str, Any]] | None = None
    pending_results: list[dict[str, Any]] | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Keys this version does not know (a callback's additions): kept as they were."""

    _KEYS: ClassVar[dict[str, str]] = {
        "models": "models_state_dict",
        "optimizers": "optimizers_state_dict",
        "lr_schedulers": "lr_schedulers_state_dict",
        "scalers": "scaler_state_dict",
        "callbacks": "callbacks",
        "rng": "rng_state",
        "batches_trained": "batches_trained",
        "epochs_trained": "epochs_trained",
        "trainer": "trainer_state",
        "rng_per_rank": "rng_state_per_rank",
        "pending_results": "searchlab_pending_results",
    }

    @classmethod
    def key(cls, field: str) -> str:
        """The key under which ``field`` is saved in ``state-dict.pth``."""
        return cls._KEYS[field]

    def to_state_dict(self) -> dict[str, Any]:
        """The dict saved as ``state-dict.pth`` (fields that are None are left out)."""
        state = dict(self.extra)
        state.update(
            (key, getattr(self, name))
            for name, key in self._KEYS.items()
            if getattr(self, name) is not None
        )
        return state

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> TrialState:
        """A saved state (Determined's, once upgraded by ``load_checkpoint``, too)."""
        values: dict[str, Any] = {
            name: state[key] for name, key in cls._KEYS.items() if key in state
        }
        known = set(cls._KEYS.values())
        if "scalers" not in values and "scalers_state_dict" in state:
            values["scalers"] = state["scalers_state_dict"]
            known.add("scalers_state_dict")
        values["extra"] = {k: v for k, v in state.items() if k not in known}
        values.setdefault("models", [])
        for name in ("batches_trained", "epochs_trained"):
            values[name] = int(values.get(name) or 0)
        return cls(**values)


def capture_trial_state(
    context: PyTorchTrialContext, callbacks: dict[str, PyTorchCallback]
) -> TrialState:
    """The model, optimizer, scheduler, scaler, callback and RNG state of a trial."""
    return TrialState(
        models=[_unwrap(m).state_dict() for m in context.models],
        optimizers=[o.state_dict() for o in context.optimizers],
        lr_schedulers=[s.state_dict() for s in context.lr_schedulers],
        scalers=context._amp.state_dict(),
        callbacks={name: cb.state_dict() for name, cb in callbacks.items()},
        rng=capture_rng_state(),
    )


def _load_model_state(model: torch.nn.Module, state: dict[str, Any]) -> None:
    # Determined saved DDP-wrapped models with their "module." prefix; searchlab saves the
    # unwrapped model, so drop the prefix where the model itself has none.
    prefix = "module."
    if state and all(k.startswith(prefix) for k in state):
        if not any(k.startswith(prefix) for k in model.state_dict()):
            state = {k[len(prefix) :]: v for k, v in state.items()}
    model.load_state_dict(state)


def restore_trial_state(
    state: TrialState,
    context: PyTorchTrialContext,
    callbacks: dict[str, PyTorchCallback],
    *,
    restore_rng: bool = True,
) -> None:
    """Load what :func:`capture_trial_state` saved (or Determined's equivalent) into a trial."""
    if len(state.models) != len(context.models):
        raise CheckpointError(
            f"the checkpoint holds {len(state.models)} model(s) but the trial wrapped "
            f"{len(context.models)}; it was written by a different trial class"
        )
    for model, sd in zip(context.models, state.models):
        _load_model_state(_unwrap(model), sd)
    for opt, sd in zip(context.optimizers, state.optimizers):
        opt.load_state_dict(sd)
    for sched, sd in zip(context.lr_schedulers, state.lr_schedulers):
        sched.load_state_dict(sd)
    context._amp.load_state_dict(list(state.scalers))
    for name, cb in callbacks.items():
        if name in state.callbacks:
            cb.load_state_dict(state.callbacks[name])
    if restore_rng and state.rng is not None:
        restore_rng_state(state.rng)
