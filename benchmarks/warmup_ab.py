"""A new trial worker's way to its first step, with CUDA set up in a thread or not (GPU).

    PYTHONPATH=. python benchmarks/warmup_ab.py --rounds 5     # 1 GPU, ~2.5 min
    PYTHONPATH=. python benchmarks/warmup_ab.py --quick        # CPU (no CUDA: warm = cold)

Each probe is a fresh Ray actor with a GPU. From its ``__init__`` it imports what a trial
actor imports, the benchmark's model module, builds the ``TrainStep`` of ``vs_ray_asha.py``
(ResNet-18, batch 256 resident on the GPU) and trains one step, in one of three modes:

- ``cold``: searchlab's trial actor's imports (``searchlab.experiment._trainable``), CUDA set
  up by the build's first use;
- ``warm``: the same, with ``torch.cuda.init()``, a first tensor and cuBLAS's handle started
  in a thread first, as searchlab's trial actors did from Nov 26 to Nov 28
  (``experiment/_warmup.py``, removed after this measured it);
- ``ray``: Ray's side's imports (``torch``, ``ray.tune``).

Modes alternate, their order reversed in odd rounds; the first probe of each mode pays for
reading the libraries into the page cache and is left out of the medians. Per probe:
``imports_s``, ``build_s`` (the model module and the build), ``first_step_s`` and
``total_s`` (from ``__init__`` to the first step's end).
"""

from __future__ import annotations

import argparse
import importlib
import json
import pathlib
import statistics
import sys
import threading
import time
from typing import Any

import ray
import torch
from _common import add_common_args, machine_info, print_table, result_path, write_result

MODEL_DIR = pathlib.Path(__file__).resolve().parent / "asha_model"
MODES = ("ray", "cold", "warm")
STEPS = ("imports_s", "build_s", "first_step_s", "total_s")
CUDA = torch.cuda.is_available()


def _warm_cuda() -> None:
    """What the removed warm-up thread did."""
    import torch

    torch.cuda.init()
    torch.empty(1, device="cuda")
    torch.cuda.current_blas_handle()


@ray.remote(num_cpus=1, num_gpus=1 if CUDA else 0)
class Probe:
    def __init__(self, mode: str, hp: dict[str, Any]) -> None:
        began = time.time()
        if mode == "warm" and CUDA:
            threading.Thread(target=_warm_cuda, daemon=True).start()
        if mode == "ray":
            importlib.import_module("torch")
            importlib.import_module("ray.tune")
        else:
            importlib.import_module("searchlab.experiment._trainable")
        imported = time.time()
        sys.path.insert(0, str(MODEL_DIR))
        from asha_def import TrainStep

        device = torch.device("cuda" if CUDA else "cpu")
        step = TrainStep(hp, device, seed=0)
        built = time.time()
        x, y = step.resident
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(step.model(x), y)
        loss.backward()
        step.opt.step()
        if CUDA:
            torch.cuda.synchronize()
        done = time.time()
        self.row = {
            "mode": mode,
            "imports_s": imported - began,
            "build_s": built - imported,
            "first_step_s": done - built,
            "total_s": done - began,
        }

    def get(self) -> dict[str, Any]:
        return self.row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    hp = {
        "model": "tiny" if args.quick else "resnet18",
        "batch": 32 if args.quick else 256,
        "image_size": 32,
        "data": "resident",
        "lr": 0.01,
    }
    ray.init(include_dashboard=False, log_to_driver=False)
    rows = []
    for index in range(args.rounds):
        for mode in MODES if index % 2 == 0 else MODES[::-1]:
            probe = Probe.remote(mode, hp)
            rows.append({"round": index, **ray.get(probe.get.remote())})
            ray.kill(probe)
            time.sleep(1.0)  # the killed actor's process goes before the next one starts
            print(json.dumps(rows[-1]), flush=True)
    ray.shutdown()
    print_table(rows, ["round", "mode", *STEPS])
    summary: dict[str, Any] = {}
    for mode in MODES:
        later = [r for r in rows if r["mode"] == mode][1:]
        if later:
            summary[mode] = {k: statistics.median(r[k] for r in later) for k in STEPS}
    if "warm" in summary and "cold" in summary:
        summary["warm_minus_cold_total_s"] = summary["warm"]["total_s"] - summary["cold"]["total_s"]
    print(json.dumps(summary, indent=1))
    write_result(result_path("warmup_ab", args), summary, rows=rows, machine=machine_info())


if __name__ == "__main__":
    main()
