"""Mixed precision state: automatic (``use_amp``) or a user's own ``GradScaler``."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

__all__ = ["AmpState"]


class AmpState:
    """Which autocast dtype to use and which gradient scalers to save with checkpoints."""

    def __init__(self) -> None:
        self.dtype: torch.dtype | None = None
        self.auto_scaler: Any = None
        self.manual_scalers: list[Any] = []

    @property
    def enabled(self) -> bool:
        return self.dtype is not None

    def enable_auto(self, device: torch.device) -> None:
        if device.type == "cuda":
            if torch.cuda.is_bf16_supported():
                self.dtype = torch.bfloat16
            else:
                self.dtype = torch.float16
                self.auto_scaler = torch.amp.GradScaler("cuda")
        else:
            # CPU autocast supports bf16 only; bf16 needs no loss scaling.
            self.dtype = torch.bfloat16

    def add_manual_scaler(self, scaler: Any) -> None:
        self.manual_scalers.append(scaler)

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager[Any]:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.dtype)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self.auto_scaler.scale(loss) if self.auto_scaler is not None else loss

    def scalers(self) -> list[Any]:
        return ([self.auto_scaler] if self.auto_scaler is not None else []) + self.manual_scalers

    def state_dict(self) -> list[dict[str, Any]]:
        return [s.state_dict() for s in self.scalers()]

    def load_state_dict(self, states: list[dict[str, Any]]) -> None:
        for scaler, state in zip(self.scalers(), states):
            scaler.load_state_dict(state)
