"""A fresh process's first backward, against the CUDA compute cache and its working directory.

    PYTHONPATH=. python benchmarks/first_backward.py            # 1 GPU, ~2 min
    PYTHONPATH=. python benchmarks/first_backward.py --smoke    # CPU, tiny CNN, ~1 min

cuDNN compiles some kernels at a process's first convolutions (its runtime-compiled engines,
through NVRTC, while ``cudnn.benchmark`` tries them), and the CUDA compute cache keeps them
for the machine's later processes. Calls 14A-14E (H200) found the first backward of
``vs_ray_asha.py``'s ResNet-18 step at 4.3-6.9 s with that cache cold or disabled and
0.74-1.26 s warm, and searchlab's trial processes compiling again what the solo loop and
Ray's workers had left in it: the same kernels, each cache entry 20 bytes shorter. Searchlab
runs a trial in its unpacked model directory, whose path is shorter than Ray's package folder;
NVRTC writes the working directory into a program it compiles with ``-lineinfo``. This runs
the scenarios that tell whether the working directory is what misses the cache.

Each scenario is one fresh process (``--worker``) that builds the step and times its first
forward and first backward (between two synchronisations), with ``CUDA_CACHE_PATH`` set to a
folder of this run (empty at the start) and its working directory set to one of two folders
whose paths differ in length:

1. ``cold``: the cache empty, folder A;
2. ``warm_same_dir``: the cache as 1 left it, folder A again;
3. ``other_dir``: the same cache, folder B (a longer path);
4. ``other_dir_again``: folder B again;
5. ``back_to_first_dir``: folder A again.

If 3 is as slow as 1 and 4 and 5 are fast, the working directory decides which cache entries
a process can use. Per scenario: ``first_backward_s``, ``forward_and_step_s``, the cache
entries and bytes it added. ``--mode loop`` runs ``asha_def.AshaTrial`` in searchlab's
``TrialLoop`` (in-process, no Ray) instead of ``TrainStep.train_step``. Prints a table and
writes ``benchmarks/results/first_backward.json`` (``--smoke``: the temp directory).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "asha_model"))

SCENARIOS = (
    ("cold", "a"),
    ("warm_same_dir", "a"),
    ("other_dir", "b"),
    ("other_dir_again", "b"),
    ("back_to_first_dir", "a"),
)
# Two working directories whose paths differ in length (B is 40 characters longer).
FOLDERS = {"a": "a", "b": "b" + "_longer_working_directory" * 2}


def worker(mode: str, quick: bool) -> dict[str, Any]:
    """Build the step in this process and time its first backward and the rest of the step."""
    import torch
    from asha_def import AshaTrial, TrainStep

    device = torch.device("cuda" if torch.cuda.is_available() and not quick else "cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    hp = {"lr": 0.1, "batch": 256 if device.type == "cuda" else 32, "data": "resident"}
    hp |= {"num_workers": 0, "model": "resnet18" if device.type == "cuda" else "tiny"}
    times: dict[str, float] = {}
    backward = torch.Tensor.backward

    def timed_backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        sync()
        began = time.perf_counter()
        backward(tensor, *args, **kwargs)
        sync()
        times.setdefault("first_backward_s", time.perf_counter() - began)

    torch.Tensor.backward = timed_backward  # type: ignore[method-assign]
    began = time.perf_counter()
    if mode == "step":
        step = TrainStep(hp, device, seed=1)
        sync()
        built = time.perf_counter()
        step.train_step(None)
    else:
        from searchlab import pytorch
        from searchlab.pytorch._loop import LoopSettings, TrialLoop

        with (
            tempfile.TemporaryDirectory() as tmp,
            pytorch.init(hparams=hp, checkpoint_dir=tmp, seed=1) as ctx,
        ):
            loop = TrialLoop(AshaTrial(ctx), ctx, LoopSettings(scheduling_unit=1))
            sync()
            built = time.perf_counter()
            loop.target = 1
            list(loop.run())
    sync()
    end = time.perf_counter()
    return {
        "build_s": built - began,
        "first_step_s": end - built,
        "forward_and_step_s": end - built - times["first_backward_s"],
        "first_backward_s": times["first_backward_s"],
        "device": device.type,
        "cwd": os.getcwd(),
        "cuda_cache_path": os.environ.get("CUDA_CACHE_PATH"),
    }


def cache_files(cache: pathlib.Path) -> dict[str, int]:
    """Every file of the compute cache and its size."""
    return {str(p): p.stat().st_size for p in cache.rglob("*") if p.is_file()}


def run_scenarios(mode: str, quick: bool, root: pathlib.Path) -> list[dict[str, Any]]:
    """Each scenario in a fresh process, in order, sharing one new cache under ``root``."""
    cache = root / "cache"
    rows = []
    for name, folder in SCENARIOS:
        cwd = root / FOLDERS[folder]
        cwd.mkdir(parents=True, exist_ok=True)
        before = cache_files(cache)
        env = {**os.environ, "CUDA_CACHE_PATH": str(cache)}
        env.pop("CUDA_CACHE_DISABLE", None)
        argv = [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker", mode]
        done = subprocess.run(
            argv + (["--quick"] if quick else []),
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0:
            raise SystemExit(f"scenario {name} failed:\n{done.stderr[-3000:]}")
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        after = cache_files(cache)
        added = {p: n for p, n in after.items() if p not in before}
        rows.append(
            {
                "scenario": name,
                "cwd_chars": len(str(cwd)),
                **figures,
                "cache_entries_added": len(added),
                "cache_bytes_added": sum(added.values()),
                "entry_sizes_added": sorted(added.values()),
            }
        )
    return rows


def summary_of(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by = {r["scenario"]: r for r in rows}
    cold, warm = by["cold"]["first_backward_s"], by["warm_same_dir"]["first_backward_s"]
    other = by["other_dir"]["first_backward_s"]
    return {
        "cold_s": cold,
        "warm_same_dir_s": warm,
        "other_dir_s": other,
        # Near 1: a new working directory costs what a cold cache does; near 0: nothing.
        "other_dir_share_of_cold": (other - warm) / (cold - warm) if cold > warm else None,
        "other_dir_added_entries": by["other_dir"]["cache_entries_added"],
    }


def main() -> None:
    from _common import add_common_args, print_table, result_path, write_result

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--mode", choices=("step", "loop"), default="step")
    parser.add_argument("--worker", choices=("step", "loop"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.quick)))
        return
    with tempfile.TemporaryDirectory(prefix="first-backward-") as tmp:
        rows = run_scenarios(args.mode, args.quick, pathlib.Path(tmp))
    columns = ["scenario", "cwd_chars", "forward_and_step_s", "first_backward_s"]
    print_table(rows, [*columns, "cache_entries_added", "cache_bytes_added"])
    summary = summary_of(rows)
    print(summary)
    write_result(result_path("first_backward", args), summary=summary, runs=rows, mode=args.mode)


if __name__ == "__main__":
    main()
