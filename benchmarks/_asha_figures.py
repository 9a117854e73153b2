"""The figures of ``vs_ray_asha.py``: the window rows the sides leave, each run's figures
against the solo rate and against the solo blocks around it, and the summary over runs."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable
from typing import Any

# What each window row keeps: its times, position, GPU, and when its process started and its
# step was built (the first window's split the time to the first batch).
WINDOW_KEYS = (
    "w_start",
    "w_end",
    "gap_s",
    "batches",
    "gpu",
    "proc_start",
    "build_began",
    "built_at",
)


def _window(trial_id: str, row: dict[str, Any], every: int) -> dict[str, Any]:
    return {
        "trial_id": trial_id,
        **{key: row.get(key, math.nan) for key in WINDOW_KEYS},
        "gpu": row.get("gpu", -1.0),
        "n": every,
        "checkpoint_write_s": row.get("checkpoint_write_s"),
        "checkpoint_load_s": row.get("checkpoint_load_s"),
    }


def bracketed(run: dict[str, Any], before: list[float], after: list[float]) -> dict[str, Any]:
    """A run's in-trial rate and efficiency against the median of the solo blocks timed just
    before and just after it (``after`` may be empty: the run had no solo loop after it)."""
    blocks = [*before, *after]
    reference = statistics.median(blocks)
    again = figures(run, reference)
    return {
        "bracket_blocks_per_s": blocks,
        "bracket_batches_per_s": reference,
        "in_trial_rate_bracketed": again["in_trial_rate"],
        "efficiency_bracketed": again["efficiency"],
    }


def figures(run: dict[str, Any], rate: float) -> dict[str, Any]:
    """A run's figures against ``rate``, one GPU's solo batches per second. A data-parallel
    trial (``slots`` > 1) trains ``slots`` per-GPU batches per step, and its trials follow each
    other on one lane (its rank 0 may move between GPUs). Where trials share a GPU
    (``per_gpu`` > 1), each worker process is a lane: hand-overs are counted in a process."""
    slots = int(run.get("slots", 1))
    windows = sorted(run["windows"], key=lambda w: w["w_start"])
    if slots > 1:
        windows = [{**w, "gpu": 0.0} for w in windows]
    trained = sum(w["n"] for w in windows) * slots  # per-GPU batches
    gpus = max(len({w.get("gpu", -1.0) for w in windows}), 1) * slots
    rates = [
        w["n"] / (w["w_end"] - w["w_start"]) / rate
        for w in windows[1:]
        if w["w_end"] > w["w_start"]
    ]
    lane_key = "proc_start" if int(run.get("per_gpu", 1)) > 1 else "gpu"
    handovers = []  # per lane: one trial's last window to the next trial's first
    for lane in {w.get(lane_key, -1.0) for w in windows}:
        in_lane = [w for w in windows if w.get(lane_key, -1.0) == lane]
        handovers += [
            b["w_start"] - a["w_end"]
            for a, b in itertools.pairwise(in_lane)
            if a["trial_id"] != b["trial_id"]
        ]
    gaps = [w["gap_s"] for w in windows if w["gap_s"] and w["gap_s"] > 0]
    out = {
        # Summed over GPUs: from the first window to the last, the time no window of the
        # GPU's trials ran (windows that overlap, as standby's first batches may, count once).
        "gpu_idle_between_windows_s": sum(
            _idle_between(w for w in windows if w.get("gpu", -1.0) == gpu)
            for gpu in {w.get("gpu", -1.0) for w in windows}
        ),
        "wall_s": run["wall_s"],
        "batches": trained,
        "efficiency": trained / (rate * run["wall_s"] * gpus),
        "first_batch_s": windows[0]["w_start"] - run["began"] if windows else math.nan,
        # From the last window's end to the call's return: the search's end (Tune stopping
        # the actors, the results read back). 0.1-0.4 s in most runs; 5-7 s in two.
        "after_last_window_s": (
            run["began"] + run["wall_s"] - max(w["w_end"] for w in windows) if windows else math.nan
        ),
        # The first batch's way: the call -> its process started -> its step began and was
        # built (imports, CUDA, model) -> the first batch.
        **{
            f"first_{name}_s": windows[0].get(key, math.nan) - run["began"] if windows else math.nan
            for name, key in (
                ("process", "proc_start"),
                ("build_began", "build_began"),
                ("built", "built_at"),
            )
        },
        "in_trial_rate": statistics.median(rates) if rates else math.nan,
        "wait_per_report_s": statistics.median(gaps) if gaps else 0.0,
        "handover_s": statistics.median(handovers) if handovers else math.nan,
        "handovers": len(handovers),
        # How many trial processes trained a window: standby's actors per GPU, all of them
        # (calls 18B, 18C and 19A each had one auto run in which one of three never did).
        "trial_processes": len(
            {p for w in windows if (p := w.get("proc_start")) is not None and p == p}  # not NaN
        ),
    }
    for key in ("checkpoint_write_s", "checkpoint_load_s", "build_s", "loads", "loads_from_memory"):
        values = [w[key] for w in windows if w.get(key) is not None and w[key] == w[key]]
        out[key] = run.get(key, statistics.median(values) if values else None)
    return out


def _against_ray(runs: list[dict], side: str, workload: str) -> dict[str, float | None]:
    mine = _median(runs, "efficiency", workload=workload, data="resident", side=side)
    ray_ = _median(runs, "efficiency", workload=workload, data="resident", side="ray_asha")
    return {
        "efficiency": mine,
        "ray_asha": ray_,
        "over_ray": mine / ray_ if mine and ray_ else None,
    }


def _idle_between(windows: Iterable[dict[str, Any]]) -> float:
    """The time between the first window's start and the last one's end that no window
    covers (``windows`` in order of their start)."""
    idle, covered = 0.0, None
    for w in windows:
        if covered is not None and w["w_start"] > covered:
            idle += w["w_start"] - covered
        covered = w["w_end"] if covered is None else max(covered, w["w_end"])
    return idle


def _median(runs: list[dict], key: str, **where: Any) -> float | None:
    picked = [r.get(key) for r in runs if all(r.get(k) == v for k, v in where.items())]
    values = [v for v in picked if v is not None and v == v]  # neither missing nor NaN
    return statistics.median(values) if values else None


def _summary(runs: list[dict]) -> dict[str, Any]:
    """The issue's figures from the runs with one trial per GPU; ``packed``: the same figures
    from runs where trials share a GPU (``--per-gpu``), if any."""
    out = _figures_of(runs, per_gpu=1)
    shared = sorted({r.get("per_gpu", 1) for r in runs} - {1})
    if shared:
        out["packed"] = {f"per_gpu_{k}": _figures_of(runs, per_gpu=k) for k in shared}
    return out


def _figures_of(runs: list[dict], per_gpu: int) -> dict[str, Any]:
    runs = [r for r in runs if r.get("per_gpu", 1) == per_gpu]
    short, long_ = _against_ray(runs, "searchlab", "short"), _against_ray(runs, "searchlab", "long")
    return {
        "searchlab_efficiency": short["efficiency"],
        "ray_asha_efficiency": short["ray_asha"],
        "searchlab_over_ray": short["over_ray"],
        "long_efficiency": long_["efficiency"],
        "in_search_over_in_process": _median(
            runs, "in_trial_rate", workload="short", data="resident", side="searchlab"
        ),
        # The same against the solo blocks around each run, and Ray's side beside it.
        "in_search_over_in_process_bracketed": _median(
            runs, "in_trial_rate_bracketed", workload="short", data="resident", side="searchlab"
        ),
        "ray_in_trial_rate_bracketed": _median(
            runs, "in_trial_rate_bracketed", workload="short", data="resident", side="ray_asha"
        ),
        "ray_in_trial_rate": _median(
            runs, "in_trial_rate", workload="short", data="resident", side="ray_asha"
        ),
        "first_batch_s": {
            side: _median(runs, "first_batch_s", workload="short", data="resident", side=side)
            for side in ("searchlab", "ray_asha")
        },
        "long_ray_asha_efficiency": long_["ray_asha"],
        "long_searchlab_over_ray": long_["over_ray"],
        # Every side's median efficiency per workload (resident data) and its ratio to Ray's
        # in the same workload: the levers' sides (standby, ...) beside the headline.
        "by_side": {
            side: {
                f"{workload}_{name}": value
                for workload in ("short", "long")
                for name, value in _against_ray(runs, side, workload).items()
                if name != "ray_asha"
            }
            for side in sorted({r["side"] for r in runs} - {"ray_asha"})
        },
        # Medians over every run of a side: seconds from the call to its first trial's
        # process start, build start, build end and first batch.
        "first_batch_split": {
            side: {
                key: _median(runs, key, side=side)
                for key in (
                    "first_process_s",
                    "first_build_began_s",
                    "first_built_s",
                    "first_batch_s",
                )
            }
            for side in sorted({r["side"] for r in runs})
        },
    }
