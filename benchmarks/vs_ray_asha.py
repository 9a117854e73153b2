"""searchlab's promotion ASHA against Ray Tune's own ASHA, end to end on one GPU.

    PYTHONPATH=. python benchmarks/vs_ray_asha.py                 # GPU, ~10 min
    PYTHONPATH=. python benchmarks/vs_ray_asha.py --quick         # CPU, tiny model, ~3 min
    PYTHONPATH=. python benchmarks/vs_ray_asha.py --gpus 2        # one trial per GPU
    PYTHONPATH=. python benchmarks/vs_ray_asha.py --gpus 2 --slots 2   # 2-GPU DDP trials
    PYTHONPATH=. python benchmarks/vs_ray_asha.py --per-gpu 2     # 2 trials share each GPU

With ``--slots S`` (> 1), each trial trains data-parallel on S GPUs, ``--gpus`` / S trials at
a time: searchlab with ``resources.slots_per_trial: S`` (its DDP workers in a placement
group), Ray with Ray Train V2's pattern for tuning a multi-GPU trial, a Tune function
trainable per trial that runs a ``TorchTrainer`` of S workers (``prepare_model``,
``prepare_data_loader``) and reports through ``TuneReportCallback``; Ray's ASHA stops the
function, and Tune cannot reuse its actors. Ray's side needs ``ray[default]`` there. Each GPU
trains the same per-GPU batch as a one-GPU trial; efficiency counts per-GPU batches against
the one-GPU solo rate times the GPUs, and ``in_trial_rate`` compares a window's steps per
second with the one-GPU solo rate (1.0: DDP costs nothing).

With ``--per-gpu K`` (> 1), K trials share each GPU on both sides: Ray asks for ``gpu: 1/K``
per trial, searchlab sets ``resources.gpus_per_trial: 1/K``, and both run ``--gpus`` x K
trials at a time. One trial's hand-over then overlaps the others' training, and K trials
together may train faster than one alone, so efficiency (still against one GPU's solo rate)
can pass 1. Hand-overs are then counted per worker process, not per GPU, and
``in_trial_rate`` is one trial's share. The summary's headline keys come from K = 1 runs;
``packed`` holds the same keys for the K > 1 runs.

The same training step (``asha_model/asha_def.py:TrainStep``: ResNet-18, batch 256, bf16,
SGD; ``--quick``: a tiny CNN) runs through Ray Tune's ``ASHAScheduler`` with its best
settings (a class ``Trainable``, ``reuse_actors=True``) and through ``searchlab.run`` with
``adaptive_asha`` (promotion: trials pause at each rung and the best are resumed), on the
same 16 learning rates (log-uniform, one seed; searchlab samples them from that list), one
trial at a time on each GPU (``--gpus``). Ray is
started once; the sides alternate, and who goes first alternates between rounds (Ray,
searchlab, then searchlab, Ray, ...): drift of the machine hits both, and so does the first
run's cold page cache (its imports took ~3.5 s longer in one call). Before each round, a
hand-written loop of the same step gives the solo rate: the best of three timed blocks after a
warm-up, so one slow block (the GPU's clock ramping up, cuDNN still tuning) does not make
every side's efficiency read high. The solo loop runs again after each side's run, so every
run is bracketed by the blocks just before and just after it: the blocks of one round were
seen to differ by up to 19 % on H100 hosts, and the best of them is a rate the card held only
for seconds. ``--no-bracket`` skips the runs after the sides. Each solo run also records
how busy the GPU keeps (``solo_gpu_busy``, ``after_gpu_busy``): the device time of one more
block's kernels and copies under ``torch.profiler``, over the wall time that block takes at
the unprofiled rate (the profiler slows a launch-bound loop ~40 %, not its kernels). Well
below 1, the host's Python and kernel launches set the rate, not the GPU.

``--warm-cache`` first runs each side once on the first workload's first rung, a few trials, and
discards it (``warm_up``): cuDNN compiles kernels for this model at a process's first
backward, and the CUDA compute cache keeps them for the machine's later processes, but
searchlab's trial processes did not find the entries the solo loop and Ray's workers left
(calls 14C-14E, ``benchmarks/README.md``), so without it a call's first searchlab run pays a
4-6 s compile that Ray's side does not. ``config.warm_up_s`` holds each side's seconds.

``--sides`` also takes searchlab with one lever changed from its defaults (``_asha_sides.py:
SIDES``). ``searchlab_standby`` runs it with ``SEARCHLAB_STANDBY=1``: two trial actors per
GPU, one training at a time (``searchlab/experiment/_standby.py``), and the search's
``max_concurrent_trials`` doubled to hold them. Its hand-overs are then the gaps between one
trial's window and the other trial's on the same GPU, and ``wait_per_report_s`` includes
each trial's wait for the other's window. ``searchlab_standby_unprepared`` also sets
``SEARCHLAB_STANDBY_PREPARE=0``: the waiting actor no longer rebuilds a released trial and
starts its loader's workers before it takes the GPU, but in the window that trains.
``searchlab_standby_ahead`` sets ``SEARCHLAB_STANDBY_AHEAD=1``: a trial trains its next
window ahead, in the GPU's turn, while its report travels to the driver (call 12B measured it
on by default, as ``searchlab_standby``, against ``SEARCHLAB_STANDBY_AHEAD=0``).
``searchlab_standby2`` sets ``SEARCHLAB_STANDBY=2``: three trial actors per GPU (two trials
ready beside the one training), ``max_concurrent_trials`` tripled.
``searchlab_standby2_warm_up`` also sets ``SEARCHLAB_STANDBY_WARM_UP=1``: each trial
process's first batch trains beside the trial holding the GPU, not in its turn (the default
since call 16B; call 15D ran it as the default, under the name ``searchlab_standby2``), and
``searchlab_standby2_in_turn`` sets it to ``0``, the default before.
``searchlab_standby_auto`` sets ``SEARCHLAB_STANDBY=auto``: standby as searchlab decides it
once Ray is up (two ready per GPU here, since the search runs three trials per GPU at once).

Workloads: **short** (rungs 40/80/160/320 batches, a report every 40, divisor 2) and
**long** (rungs 200/400/800/1600, a report every 100), each with the batch resident on the
GPU and with a loader of CIFAR-shaped images (4 workers, pinned memory).

Per side and run, from the reports' wall-clock windows (``w_start`` at the window's first
batch, ``w_end`` after its last, synchronised):
- ``efficiency``: batches trained (every window, replays included) / (solo rate x GPUs x
  wall time from the call to the result);
- ``first_batch_s``: from the call to the first batch;
- ``in_trial_rate``: median over windows of the window's rate, over the solo rate;
- ``in_trial_rate_bracketed``/``efficiency_bracketed``: the same over the median of the
  blocks bracketing the run (``bracket_blocks_per_s``): both medians, and the card's clock
  around the run rather than its best moment before the round;
- ``wait_per_report_s``: median time training waited between a report and its next batch;
- ``handover_s``: median time from one trial's last batch to the next trial's first batch
  (pause or stop, checkpoint, the next trial built or restored), and how many;
- ``checkpoint_write_s``/``checkpoint_load_s``: Ray side measured in its Trainable;
  searchlab's from its trials' checkpoint timing reports.
Summary (short workload, resident batch, medians over runs): ``searchlab_efficiency``,
``ray_asha_efficiency``, ``searchlab_over_ray``, ``long_efficiency`` (searchlab, long,
resident), ``in_search_over_in_process`` (searchlab's in-trial rate over the solo rate), and
the bracketed ones: ``in_search_over_in_process_bracketed``, ``ray_in_trial_rate_bracketed``.
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
import shutil
import sys
import tempfile
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
MODEL_DIR = HERE / "asha_model"
sys.path.insert(0, str(MODEL_DIR))

import torch  # noqa: E402
from _asha_figures import _summary, bracketed, figures  # noqa: E402
from _asha_sides import (  # noqa: E402
    CONCURRENT,
    PER_GPU,
    SIDES,
    SLOTS,
    ship_by_value,
    solo_rate,
)
from _common import (  # noqa: E402
    add_common_args,
    machine_info,
    print_table,
    result_path,
    write_result,
)
from _memory_watch import MemoryWatch, gpu_memory_used  # noqa: E402

WORKLOADS = {
    "short": {"rungs": [40, 80, 160, 320], "report_every": 40},
    "long": {"rungs": [200, 400, 800, 1600], "report_every": 100},
}
QUICK_WORKLOADS = {
    "short": {"rungs": [4, 8, 16, 32], "report_every": 4},
    "long": {"rungs": [8, 16, 32, 64], "report_every": 8},
}


def learning_rates(n: int, seed: int = 0) -> list[float]:
    import random

    rng = random.Random(seed)
    return [10 ** rng.uniform(-3, -0.5) for _ in range(n)]


def round_order(sides: list[str], round_index: int) -> list[str]:
    """The sides in the order given in even rounds, reversed in odd ones: the first run after
    Ray's start pays a cold page cache, and the rounds share that between the sides."""
    return list(sides) if round_index % 2 == 0 else list(reversed(sides))


def stack_probe_env(folder: str) -> dict[str, Any]:
    """The runtime environment's part that samples every Ray worker's threads into
    ``folder`` (``_stack_probe.py``), whose sampling starts in this process too."""
    import _stack_probe
    from ray import cloudpickle

    folder = os.path.abspath(folder)
    _stack_probe.start(folder, seconds=math.inf)  # the whole run, as the workers
    # Ray's workers run in asha_model/, where _stack_probe cannot be imported.
    cloudpickle.register_pickle_by_value(_stack_probe)
    return {
        "worker_process_setup_hook": _stack_probe.start_from_environment,
        "env_vars": {
            _stack_probe.FOLDER_VAR: folder,
            _stack_probe.PERIOD_VAR: os.environ.get(_stack_probe.PERIOD_VAR, "0.1"),
        },
    }


def warm_up(
    sides: list[str], hp: dict[str, Any], work: dict[str, Any], lrs: list[float], storage: str
) -> dict[str, float]:
    """Run each side once on ``work``'s first rung, discarding the run; its seconds.

    cuDNN compiles some of the kernels it tries (its runtime-compiled engines, through NVRTC),
    and the CUDA compute cache (``~/.nv/ComputeCache``) keeps them for every later process
    of the machine: a trial process's first backward took 4.3-6.9 s with the cache cold
    against 0.74-1.26 s warm (calls 14C-14D, H200). The solo loop warms it for Ray's side,
    whose workers compile the same code; searchlab's trial processes missed those entries
    and compiled again (14D, 14E), so its first run of a call paid what Ray's did not. After
    this, every side starts as a user's search does on a machine that ran it before."""
    warm = {"rungs": work["rungs"][:1], "report_every": work["report_every"]}
    # Enough trials to start every trial process a side keeps at once (standby holds up to 3
    # more per GPU): each compiles its kernels at its first backward.
    trials = lrs[: 4 * CONCURRENT[0]]
    spent = {}
    for side in dict.fromkeys(sides):  # each side once, in the order given
        began = time.time()
        SIDES[side](hp, warm, trials, storage)
        spent[side] = round(time.time() - began, 2)
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workloads", default="short,long")
    parser.add_argument("--data", default="resident,loader")
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument(
        "--gpus", type=int, default=1, help="GPUs to use, one trial on each at a time"
    )
    parser.add_argument(
        "--slots",
        type=int,
        default=1,
        help="GPUs per trial: more than 1 runs data-parallel trials (searchlab: "
        "slots_per_trial; Ray: a TorchTrainer per trial, which needs ray[default])",
    )
    parser.add_argument(
        "--sides",
        default="ray_asha,searchlab",
        help=f"which of {', '.join(SIDES)} to run: in this order in even rounds, reversed in odd ones",
    )
    parser.add_argument(
        "--image-size",
        type=int,
        default=32,
        help="side of the square images (32: CIFAR-shaped; larger: more GPU work per batch)",
    )
    parser.add_argument(
        "--no-bracket",
        action="store_true",
        help="time the solo loop only before each round, not again after each side's run",
    )
    parser.add_argument(
        "--per-gpu",
        type=int,
        default=1,
        help="trials sharing each GPU on both sides (Ray: gpu 1/K; searchlab: gpus_per_trial)",
    )
    parser.add_argument(
        "--warm-cache",
        action="store_true",
        help="before round 0, run each side once on the first rung (discarded), so that "
        "both start with the kernels cuDNN compiles for them in the CUDA compute cache",
    )
    parser.add_argument(
        "--stacks",
        metavar="FOLDER",
        help="sample every thread of this process and of every Ray worker into FOLDER "
        "(_stack_probe.py; read it with stack_report.py)",
    )
    parser.add_argument(
        "--driver-stacks",
        metavar="FOLDER",
        help="sample every thread of this process alone (no Ray worker), every 0.2 s for the "
        "whole run, into FOLDER: where a search's driver waits (stack_report.py reads it)",
    )
    args = parser.parse_args()
    if args.driver_stacks:
        import _stack_probe

        _stack_probe.start(args.driver_stacks, period_s=0.2, seconds=math.inf)

    import ray

    from searchlab._bytecode import uncached_bytecode_hint
    from searchlab._ray_env import ray_environment, ray_init_kwargs

    if note := uncached_bytecode_hint():  # both sides' workers would pay it: say so
        print(f"note: {note}", file=sys.stderr)
    quick = args.quick or not torch.cuda.is_available()
    SLOTS[0] = max(args.slots, 1)
    if SLOTS[0] > 1 and max(args.gpus, 1) != SLOTS[0]:
        # figures() puts a data-parallel search's windows on one lane (rank 0 may move
        # between GPUs), which holds only for one trial at a time.
        parser.error(f"--slots {args.slots} needs --gpus {args.slots}: one trial at a time")
    PER_GPU[0] = max(args.per_gpu, 1)
    if PER_GPU[0] > 1 and SLOTS[0] > 1:
        parser.error("--per-gpu shares a GPU between one-GPU trials: it needs --slots 1")
    CONCURRENT[0] = max(args.gpus, 1) * PER_GPU[0] // SLOTS[0]
    if SLOTS[0] > 1 and "ray_asha" in args.sides.split(","):
        from ray._private.utils import get_dashboard_dependency_error

        if (missing := get_dashboard_dependency_error()) is not None:
            # Without them Ray has no dashboard, and Ray Train's worker groups were seen to
            # hang at start-up or leak their placement groups when Tune stopped a trial.
            raise SystemExit(
                f"--slots {args.slots} with the ray_asha side needs Ray Train's state API: "
                f"pip install 'ray[default]' ({missing})"
            )
    workloads = QUICK_WORKLOADS if quick else WORKLOADS
    base = {
        "model": "tiny" if quick else "resnet18",
        "batch": 32 if quick else 256,
        "num_workers": 2 if quick else 4,
        "n_train": 2048 if quick else 8192,
        "image_size": args.image_size,
    }
    lrs = learning_rates(args.trials)
    storage = tempfile.mkdtemp(prefix="vs-ray-asha-")
    gpu_used = gpu_memory_used()
    rows, runs = [], []
    warm_s: dict[str, float] = {}
    with ray_environment():
        init = ray_init_kwargs()
        if SLOTS[0] > 1 and "ray_asha" in args.sides.split(","):
            # Ray Train's worker groups watch their controller through the state API, which
            # the dashboard serves: without it they hang (Ray's default starts it; searchlab
            # leaves it off). Both sides then run with it.
            init["include_dashboard"] = True
        runtime_env: dict[str, Any] = {"working_dir": str(MODEL_DIR)}
        if args.stacks:
            runtime_env.update(stack_probe_env(args.stacks))
        ray.init(runtime_env=runtime_env, **init)
        ship_by_value()  # Ray's side lives in _asha_sides, which Ray's workers cannot import
        # Ray's side imported ray.tune at the top of this file (through _asha_sides);
        # searchlab's driver modules load on the first ``searchlab.run`` (the package stays
        # light for the workers): its runner (the search methods, the config loader) is
        # imported here, before any clock. The rest of either side's first use in this
        # process (Tune's lazy imports, searchlab's Tune layer) stays inside its clock.
        from searchlab.experiment import _runner  # noqa: F401

        try:
            if args.warm_cache:
                first = workloads[args.workloads.split(",")[0]]
                hp = {**base, "data": args.data.split(",")[0]}
                warm_s = warm_up(args.sides.split(","), hp, first, lrs, storage)
                print(f"warm-up (discarded): {warm_s}")
            for name in args.workloads.split(","):
                for data in args.data.split(","):
                    hp = {**base, "data": data}
                    solo_batches = 20 if quick else 200
                    last: tuple[float, list[float], dict[str, Any]] | None = None
                    for r in range(args.rounds):
                        # The solo run after the last round's last side is this round's start.
                        solo, blocks, bound = last or solo_rate(hp, solo_batches)
                        before = blocks  # the solo blocks just before the next side's run
                        for side in round_order(args.sides.split(","), r):
                            with MemoryWatch(gpu_used=gpu_used) as memory:
                                run = SIDES[side](hp, workloads[name], lrs, storage)
                            last = None if args.no_bracket else solo_rate(hp, solo_batches)
                            after, after_bound = ([], {}) if last is None else last[1:]
                            got = {**figures(run, solo), **bracketed(run, before, after)}
                            got["after_gpu_busy"] = after_bound.get("gpu_busy")
                            got["memory"] = memory.summary()
                            # the cores of the other Ray workers while one trains a window:
                            # with one trial training at a time, those waiting their turn
                            one_at_a_time = CONCURRENT[0] == 1 and PER_GPU[0] == 1
                            got["beside"] = memory.beside(run["windows"]) if one_at_a_time else {}
                            # searchlab's notes and the standby it ran (auto decides it)
                            got.update(
                                {
                                    k: run[k]
                                    for k in ("notes", "events", "standby", "restarts")
                                    if k in run
                                }
                            )
                            for note in run.get("notes", []):
                                print(note)
                            got["windows"] = run["windows"]
                            before = after or before
                            record = {
                                "workload": name,
                                "data": data,
                                "round": r,
                                "side": side,
                                "slots": SLOTS[0],
                                "per_gpu": PER_GPU[0],
                                "gpus": max(args.gpus, 1),
                                "solo_batches_per_s": solo,
                                "solo_blocks_per_s": blocks,
                                "solo_gpu_busy": bound["gpu_busy"],
                                **got,
                            }
                            runs.append(record)
                            row = {k: v for k, v in record.items() if k != "windows"}
                            rows.append({**row, **got["memory"], **got["beside"]})
                            write_result(  # after every run: a run cut short keeps the rest
                                result_path("vs_ray_asha", args),
                                summary=_summary(runs),
                                runs=runs,
                                partial=True,
                                machine=machine_info(),
                            )
                            print_table(
                                [record],
                                [
                                    "workload",
                                    "data",
                                    "round",
                                    "side",
                                    "efficiency",
                                    "first_batch_s",
                                    "in_trial_rate",
                                    "in_trial_rate_bracketed",
                                    "handover_s",
                                    "after_last_window_s",
                                    "trial_processes",
                                    "wall_s",
                                ],
                            )
        finally:
            _stop_stack_probe()  # before Ray's shutdown, which a sampling thread upsets
            ray.shutdown()
            shutil.rmtree(storage, ignore_errors=True)
    summary = _summary(runs)
    print_table(
        rows,
        [
            "workload",
            "data",
            "side",
            "efficiency",
            "first_batch_s",
            "in_trial_rate",
            "in_trial_rate_bracketed",
            "wait_per_report_s",
            "handover_s",
            "handovers",
            "checkpoint_write_s",
            "checkpoint_load_s",
            "after_last_window_s",
            "wall_s",
        ],
    )
    print_table(
        rows,
        [
            "workload",
            "data",
            "side",
            "workers_peak",
            "workers_pss_peak_gib",
            "trial_worker_pss_max_gib",
            "host_rise_peak_gib",
            "gpu_used_peak_gib",
            "trainer_cores_median",
            "others_cores_median",
            "others_cores_mean",
        ],
    )
    print(summary)
    write_result(
        result_path("vs_ray_asha", args),
        summary=summary,
        runs=runs,
        config={
            "workloads": workloads,
            "base": base,
            "trials": args.trials,
            "rounds": args.rounds,
            "gpus": max(args.gpus, 1),
            "slots": SLOTS[0],
            "per_gpu": PER_GPU[0],
            "quick": quick,
            "warm_up_s": warm_s or None,  # each side's discarded run (--warm-cache)
        },
        machine=machine_info(),
    )


def _stop_stack_probe() -> None:
    if "_stack_probe" in sys.modules:  # --stacks, --driver-stacks
        sys.modules["_stack_probe"].stop()


if __name__ == "__main__":
    main()
