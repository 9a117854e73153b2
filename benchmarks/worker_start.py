"""Where a trial worker's start goes: a fresh Ray actor with one GPU, step by step.

    PYTHONPATH=. python benchmarks/worker_start.py            # 1 GPU, ~1 min
    PYTHONPATH=. python benchmarks/worker_start.py --quick    # CPU

In ``vs_ray_asha.py`` the first trial's process starts ~0.2 s after the call and its build
begins ~9 s later on the GPU machines (2.6 s on a 2-core CPU laptop), on Ray's side and on
searchlab's alike. This creates ``--actors`` fresh actors one after the other (``num_gpus=1``
where there is a GPU), each importing and initialising, in order, what a trial worker does,
and times each step from the ``.remote()`` call:

- ``process_s``: the worker process's start (``/proc/self/stat``);
- ``actor_init_s``: the actor's ``__init__`` entered (Ray's worker start, its ``import ray``,
  the connection to the raylet, this module's import);
- then, each measured alone: ``import torch``, ``import ray.tune``,
  ``import searchlab.experiment._trainable`` (the trial actor's class), ``torch.cuda.init()``
  with a first tensor, ``import torchvision``, ResNet-18 built on the device, the first
  ``torch.optim.SGD`` (which imports ``torch._dynamo``), and one forward/backward pass.

The same steps run once in a plain subprocess (no Ray) for comparison. Medians over the
actors after the first are in the summary; every actor's steps are in ``rows``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from _common import add_common_args, print_table, result_path, write_result

STEPS = (
    "import_torch",
    "import_ray_tune",
    "import_trainable",
    "cuda_init",
    "import_torchvision",
    "build_resnet18",
    "first_optimizer",
    "first_step",
)


def _process_start() -> float:
    """This process's start in ``time.time()`` seconds (NaN where /proc is missing)."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
            up = float(uptime.read().split()[0])
        return time.time() - (up - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return math.nan


def run_steps() -> dict[str, float]:
    """Each step of a trial worker's start, in seconds, measured alone and in order."""
    times: dict[str, float] = {}

    def timed(name: str, fn: Any) -> Any:
        t = time.perf_counter()
        out = fn()
        times[name] = time.perf_counter() - t
        return out

    torch = timed("import_torch", lambda: __import__("torch"))
    timed("import_ray_tune", lambda: __import__("ray.tune"))
    timed("import_trainable", lambda: __import__("searchlab.experiment._trainable"))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")

    def cuda_init() -> None:
        if cuda:
            torch.cuda.init()
            torch.zeros(1, device=device)
            torch.cuda.synchronize()

    timed("cuda_init", cuda_init)
    tv = timed("import_torchvision", lambda: __import__("torchvision"))

    def build() -> Any:
        model = tv.models.resnet18(num_classes=10).to(device)
        if cuda:
            torch.cuda.synchronize()
        return model

    model = timed("build_resnet18", build)
    opt = timed("first_optimizer", lambda: torch.optim.SGD(model.parameters(), lr=0.1))

    def step() -> None:
        x = torch.randn(64, 3, 32, 32, device=device)
        loss = model(x).logsumexp(1).mean()
        loss.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()

    timed("first_step", step)
    return times


class Probe:
    """A fresh worker: notes when its process started and when ``__init__`` ran."""

    def __init__(self) -> None:
        self.entered = time.time()
        self.process = _process_start()

    def measure(self) -> dict[str, float]:
        return {"process": self.process, "entered": self.entered, **run_steps()}


def _plain_subprocess() -> dict[str, float]:
    """The same steps in a fresh interpreter without Ray (``actor_init_s``: its start)."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = (
        f"import json, sys, time; t = time.time(); sys.path.insert(0, {here!r}); "
        "import worker_start as w; "
        "print(json.dumps({'python_start_s': t - w._process_start(), **w.run_steps()}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--actors", type=int, default=3, help="fresh actors, one after the other")
    args = parser.parse_args()

    import ray
    import torch

    gpus = 1 if torch.cuda.is_available() else 0
    plain = _plain_subprocess()
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join([here, os.getcwd(), os.environ.get("PYTHONPATH", "")])
    ray.init(
        num_cpus=4,
        num_gpus=gpus,
        include_dashboard=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )
    remote = ray.remote(num_cpus=1, num_gpus=gpus)(Probe)
    rows: list[dict[str, Any]] = []
    for i in range(args.actors):
        called = time.time()
        actor = remote.remote()
        got = ray.get(actor.measure.remote())
        ray.kill(actor)
        row = {
            "actor": i,
            "process_s": got["process"] - called,
            "actor_init_s": got["entered"] - called,
            **{k: got[k] for k in STEPS},
        }
        row["total_s"] = row["actor_init_s"] + sum(got[k] for k in STEPS)
        rows.append(row)
        time.sleep(1.0)
    ray.shutdown()
    rows.append(
        {
            "actor": "plain python",
            "process_s": 0.0,
            "actor_init_s": plain["python_start_s"],
            **{k: plain[k] for k in STEPS},
            "total_s": plain["python_start_s"] + sum(plain[k] for k in STEPS),
        }
    )
    cols = ["actor", "process_s", "actor_init_s", *STEPS, "total_s"]
    print_table(rows, cols)
    warm = rows[1:-1] or rows[:1]  # the first actor may read cold files
    summary = {k: statistics.median(r[k] for r in warm) for k in cols[1:]}
    summary["gpus"] = gpus
    write_result(
        result_path("worker_start", args),
        summary=summary,
        rows=rows,
    )


if __name__ == "__main__":
    main()
