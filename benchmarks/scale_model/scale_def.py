"""The trial of ``benchmarks/scale.py``: ``resnet_model``'s ResNet-18, logging where and when it ran.

A model directory: Ray ships it to the trial workers. ``model_def.py`` and ``cifar_data.py``
here are symbolic links to ``benchmarks/resnet_model/``, so there is one copy of that code;
Ray and searchlab pack the files the links point to, and the directory stays self-contained.

``ScaleResNetTrial`` trains exactly as ``model_def.CifarResNetTrial`` (ResNet-18, SGD with
momentum, bf16 autocast, channels-last, 4 loader workers). Besides, every run of a trial in a
worker process (a start, or a resume after a pause) appends JSON lines to the file named by
the experiment's ``data.event_log`` (an absolute path on the machine: the benchmark runs on
one host). Each line has ``t`` (``time.time()``), ``event``, ``trial_id``, ``pid``, ``device``
(``cuda`` or ``cpu``), ``gpu_uuid`` (the physical GPU, from CUDA's device properties) and
``visible`` (``CUDA_VISIBLE_DEVICES``, which Ray sets to the GPU it gave the worker). Events:

- ``build``: the trial's ``__init__`` begins (the worker starts on this trial);
- ``startup``: before its first batch, after any checkpoint was loaded (``first_batch``);
- ``first_batch``: the first ``train_batch`` call of this run (``batch``);
- ``report``: the end of each training report window (``batches``);
- ``validation_end``; ``checkpoint_end`` (the checkpoint files are written);
- ``shutdown``: the worker is done with the trial (it runs when the worker's next trial is
  built or the worker stops, so it is not the moment the trial left the GPU).
"""

from __future__ import annotations

import json
import os
import time
import uuid as uuidlib
from typing import Any

import torch
from model_def import CifarResNetTrial

from searchlab import pytorch

__all__ = ["EventLog", "ScaleResNetTrial"]


class EventLog(pytorch.PyTorchCallback):
    """Appends one JSON line per event of this trial's run to a shared file."""

    def __init__(
        self, path: str | None, fields: dict[str, Any], context: pytorch.PyTorchTrialContext
    ) -> None:
        self.path = path
        self.fields = fields
        self.context = context

    def write(self, event: str, t: float | None = None, **extra: Any) -> None:
        if not self.path:
            return
        stamp = time.time() if t is None else t
        line = json.dumps({"t": stamp, "event": event, **self.fields, **extra})
        # One short write in append mode: lines from concurrent workers do not interleave.
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")

    def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: str | None) -> None:
        self.write("startup", first_batch=first_batch_idx, resumed=checkpoint_uuid is not None)

    def on_training_workload_end(
        self, avg_metrics: dict[str, Any], batch_metrics: list[dict[str, Any]]
    ) -> None:
        self.write("report", batches=self.context.current_train_batch() + 1)

    def on_validation_end(self, metrics: dict[str, Any]) -> None:
        self.write("validation_end")

    def on_checkpoint_write_end(self, checkpoint_dir: str) -> None:
        self.write("checkpoint_end")

    def on_trial_shutdown(self) -> None:
        self.write("shutdown")


def _device_fields(device: torch.device) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "pid": os.getpid(),
        "device": device.type,
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "gpu_uuid": None,
    }
    if device.type == "cuda":
        uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
        raw = getattr(uuid, "bytes", None)
        if raw is not None and len(raw) == 16:
            fields["gpu_uuid"] = str(uuidlib.UUID(bytes=bytes(raw)))
        elif uuid is not None:
            fields["gpu_uuid"] = str(uuid)
    return fields


class ScaleResNetTrial(CifarResNetTrial):
    """``CifarResNetTrial`` with an ``EventLog`` of where and when it ran."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        built = time.time()
        fields = {"trial_id": context.get_trial_id(), "build_t": built}  # build_t names the run
        fields.update(_device_fields(context.device))
        self.events = EventLog(context.get_data_config().get("event_log"), fields, context)
        self.events.write("build", t=built)
        super().__init__(context)
        self._first_batch_logged = False

    def build_callbacks(self) -> dict[str, pytorch.PyTorchCallback]:
        return {"scale_events": self.events}

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        if not self._first_batch_logged:
            self._first_batch_logged = True
            self.events.write("first_batch", batch=batch_idx)
        return super().train_batch(batch, epoch_idx, batch_idx)
