"""Capture and restore everything a trial's training depends on, for exact resume."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from searchlab.errors import CheckpointError
from searchlab.pytorch._callback import PyTorchCallback
from searchlab.pytorch._context import PyTorchTrialContext

__all__ = ["capture_rng_state", "capture_trial_state", "restore_rng_state", "restore_trial_state"]


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


def capture_trial_state(
    context: PyTorchTrialContext, callbacks: dict[str, PyTorchCallback]
) -> dict[str, Any]:
    """The model, optimizer, scheduler, scaler, callback and RNG state of a trial."""
    return {
        "models_state_dict": [_unwrap(m).state_dict() for m in context.models],
        "optimizers_state_dict": [o.state_dict() for o in context.optimizers],
        "lr_schedulers_state_dict": [s.state_dict() for s in context.lr_schedulers],
        "scaler_state_dict": context._amp.state_dict(),
        "callbacks": {name: cb.state_dict() for name, cb in callbacks.items()},
        "rng_state": capture_rng_state(),
    }


def _load_model_state(model: torch.nn.Module, state: dict[str, Any]) -> None:
    # Determined saved DDP-wrapped models with their "module." prefix; searchlab saves the
    # unwrapped model, so drop the prefix where the model itself has none.
    prefix = "module."
    if state and all(k.startswith(prefix) for k in state):
        if not any(k.startswith(prefix) for k in model.state_dict()):
            state = {k[len(prefix) :]: v for k, v in state.items()}
    model.load_state_dict(state)


def restore_trial_state(
    state: dict[str, Any],
    context: PyTorchTrialContext,
    callbacks: dict[str, PyTorchCallback],
    *,
    restore_rng: bool = True,
) -> None:
    """Load what :func:`capture_trial_state` saved (or Determined's equivalent) into a trial."""
    models = state.get("models_state_dict", [])
    if len(models) != len(context.models):
        raise CheckpointError(
            f"the checkpoint holds {len(models)} model(s) but the trial wrapped "
            f"{len(context.models)}; it was written by a different trial class"
        )
    for model, sd in zip(context.models, models):
        _load_model_state(_unwrap(model), sd)
    for opt, sd in zip(context.optimizers, state.get("optimizers_state_dict", [])):
        opt.load_state_dict(sd)
    for sched, sd in zip(context.lr_schedulers, state.get("lr_schedulers_state_dict", [])):
        sched.load_state_dict(sd)
    scalers = state.get("scaler_state_dict", state.get("scalers_state_dict", []))
    context._amp.load_state_dict(list(scalers))
    saved_callbacks = state.get("callbacks", {})
    for name, cb in callbacks.items():
        if name in saved_callbacks:
            cb.load_state_dict(saved_callbacks[name])
    if restore_rng and "rng_state" in state:
        restore_rng_state(state["rng_state"])
