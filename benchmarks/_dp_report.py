"""The report of ``data_parallel.py``: the summary over rounds, each run's stats, the table.

Also the ``machine`` entry of its JSON and the one-line view of ``HostWatch.summary``.
"""

from __future__ import annotations

import os
import statistics
from typing import Any

import torch
from _rank_watch import physical_cores

TARGET = 0.95


def machine(gpus: int) -> dict[str, Any]:
    import ray
    from trainer_parity import machine_info

    cuda = torch.cuda.is_available()
    info = {**machine_info(), "ray": ray.__version__, "processes_per_side": gpus}
    info.update(gpus_used=gpus if cuda else 0, gpu_names=[])
    if cuda:
        info["gpu_names"] = [torch.cuda.get_device_name(i) for i in range(gpus)]
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    info["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    cores = physical_cores(os.sched_getaffinity(0))
    info.update(physical_cores=len(cores), threads_per_core=max(map(len, cores)))
    return info


def window_stats(rates: list[float]) -> dict[str, float]:
    return {"median": statistics.median(rates), "min": min(rates), "max": max(rates)}


# Left out of ``rounds_detail`` (the first round's are in the top-level entries): long lists,
# or the same every round.
DETAIL_DROPS = ("window_samples_per_s", "ranks")


def detail(side: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in side.items() if k not in DETAIL_DROPS}


def host_line(host: dict[str, Any]) -> str:
    """One line of ``HostWatch.summary``: busy and stolen cores, who used them, the clock."""
    if not host:
        return "no samples"
    who = {**host["groups"], **dict(host["top_others"][:4])}
    clock = host.get("mhz_busy_weighted")
    return (
        f"{host['busy_cores']:.2f} of {host['cpus']} cores busy, {host['steal_cores']:.2f} stolen; "
        + ", ".join(f"{name} {cores:.2f}" for name, cores in who.items())
        + (f"; busy CPUs at {clock:.0f} MHz" if clock else "")
    )


def summarise(rounds: list[dict[str, Any]], gpus: int, global_batch: int) -> dict[str, Any]:
    """Medians over rounds of each side's samples/s and of the pair ratios, and the pooled ratio."""

    def side(name: str) -> list[dict[str, Any]]:
        return [r[name] for r in rounds]

    def pooled(name: str) -> float:
        samples = sum(s["timed_batches"] * s["global_batch"] for s in side(name))
        return samples / sum(s["timed_s"] for s in side(name))

    def windows(name: str) -> float:
        return statistics.median(w for s in side(name) for w in s["window_samples_per_s"])

    def host_busy(name: str) -> float | None:
        busy = [s["host"]["busy_cores"] for s in side(name) if s.get("host")]
        return statistics.median(busy) if busy else None

    def cpu_per_batch(name: str) -> float | None:
        """Median over rounds of the ranks' mean CPU milliseconds per batch."""
        means = []
        for s in side(name):
            ranks = [r["cpu_ms_per_batch"] for r in s.get("rank_threads", []) if r.get("threads")]
            if ranks:
                means.append(statistics.fmean(ranks))
        return statistics.median(means) if means else None

    pairs = [r["pair_ratio"] for r in rounds]
    ratio = statistics.median(pairs)
    return {
        "searchlab_over_torchrun": ratio,
        "searchlab_samples_per_s": statistics.median(s["samples_per_s"] for s in side("searchlab")),
        "torchrun_samples_per_s": statistics.median(s["samples_per_s"] for s in side("torchrun")),
        "pair_ratios": pairs,
        # An order effect shows as a gap between these two lists.
        "pair_ratios_by_first": {
            name: [r["pair_ratio"] for r in rounds if r.get("first", "torchrun") == name]
            for name in ("torchrun", "searchlab")
        },
        "pooled_ratio": pooled("searchlab") / pooled("torchrun"),
        "window_median_ratio": windows("searchlab") / windows("torchrun"),
        # The host work a batch takes in a rank, all its threads together (RankWatch).
        "rank_cpu_ms_per_batch": {name: cpu_per_batch(name) for name in ("torchrun", "searchlab")},
        # Busy cores of the whole host over the timed windows (HostWatch), medians.
        "host_busy_cores": {name: host_busy(name) for name in ("torchrun", "searchlab")},
        "rounds": len(rounds),
        "target": TARGET,
        "meets_target": ratio >= TARGET,
        "gpus": gpus,
        "global_batch": global_batch,
        "timed_batches": rounds[0]["torchrun"]["timed_batches"],
        "measure": (
            "samples/s over the same N batches after warm-up; sides alternate (see config.order); "
            "ratio = median over rounds of searchlab/torchrun in the same round (see docstring)"
        ),
    }


def print_table(result: dict[str, Any]) -> None:
    s, m = result["summary"], result["machine"]
    print(
        f"{s['gpus']} {'GPUs' if m['gpu'] else 'CPU processes'} per side, global batch "
        f"{s['global_batch']}, {s['timed_batches']} timed batches per run; samples/s, window "
        "median (min-max), mean loss"
    )
    head = f"{'samples/s':>9}  {'window med (min-max)':>22}  {'loss':>6}  {'SM MHz':>6}"
    print(
        f"{'round':<6}  {'torchrun ' + head:>57}  |  {'searchlab ' + head:>58}  |  "
        f"{'ratio':>5}  first"
    )

    def cells(side: dict[str, Any]) -> str:
        w = side["window_stats"]
        spread = f"{w['median']:.0f} ({w['min']:.0f}-{w['max']:.0f})"
        clock = (side.get("gpu_state") or {}).get("sm_clock_mhz")
        clock_cell = f"{clock:>6.0f}" if clock is not None else f"{'-':>6}"
        return (
            f"{side['samples_per_s']:>9.0f}  {spread:>22}  {side['loss_mean']:>6.3f}  {clock_cell}"
        )

    for r in result["rounds_detail"]:
        print(
            f"{r['round']:<6}  {' ' * 9}{cells(r['torchrun'])}  |  {' ' * 10}"
            f"{cells(r['searchlab'])}  |  {r['pair_ratio']:>5.3f}  {r.get('first', 'torchrun')}"
        )
    print(
        f"{'median':<6}  {' ' * 9}{s['torchrun_samples_per_s']:>9.0f}{' ' * 40}  |  {' ' * 10}"
        f"{s['searchlab_samples_per_s']:>9.0f}{' ' * 40}  |  {s['searchlab_over_torchrun']:>5.3f}"
    )
    verdict = "meets" if s["meets_target"] else "MISSES"
    pairs = ", ".join(f"{p:.3f}" for p in s["pair_ratios"])
    print(
        f"searchlab / torchrun = {s['searchlab_over_torchrun']:.3f} (median of {s['rounds']} "
        f"pair ratio(s): {pairs}; pooled {s['pooled_ratio']:.3f}; window medians "
        f"{s['window_median_ratio']:.3f}): {verdict} the target >= {s['target']}"
    )
    if m["gpu"]:
        print(
            f"NCCL transports (round 1): torchrun {result['torchrun']['nccl_transports']}, "
            f"searchlab {result['searchlab']['nccl_transports']}"
        )
    gpu = f"{m['gpu']} x{m['gpus_used']}" if m["gpu"] else "no GPU: " + m["cpu_model"]
    print(f"{gpu}, torch {m['torch']}, CUDA {m['cuda']}, NCCL {m.get('nccl')}, ray {m['ray']}")
