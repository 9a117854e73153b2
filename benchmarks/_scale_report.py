"""Summary, table and printing of ``scale.py``'s result."""

from __future__ import annotations

import json
import pathlib
from typing import Any

__all__ = ["TARGETS", "keep_previous", "print_table", "summarise", "table"]

TARGETS = {
    "busy_fraction_min": 0.97,
    "busy_fraction_of_available_min": 0.97,
    "median_gap_s": 1.0,
    "paused_trial_memory_mib": 0.0,
    "ddp_over_torchrun": 0.95,
}


def summarise(search: dict[str, Any] | None, ddp: dict[str, Any] | None, n: int) -> dict[str, Any]:
    """The headline figures; those of a part that did not run (or failed) are None."""
    s: dict[str, Any] = {
        "gpus": n,
        "busy_fraction_per_gpu": None,
        "busy_fraction_min": None,
        "busy_fraction_of_available_min": None,
        "median_gap_s": None,
        "paused_trial_memory_mib": None,
        "ddp_over_torchrun": None,
    }
    if search is not None and "per_gpu" in search:
        rows = search["per_gpu"]
        busy = {k: r["busy_fraction"] for k, r in rows.items()}
        until = {k: r["busy_fraction_until_last_new_trial"] for k, r in rows.items()}
        of_available = {k: r.get("busy_fraction_of_available") for k, r in rows.items()}
        available = {k: r.get("available_fraction") for k, r in rows.items()}
        s.update(_paused_memory(search))
        s.update(
            busy_fraction_of_available_per_gpu=of_available,
            busy_fraction_of_available_min=_min(of_available),
            available_fraction_per_gpu=available,
            available_fraction_min=_min(available),
        )
        s.update(
            busy_fraction_per_gpu=busy,
            busy_fraction_min=min((v for v in busy.values() if v is not None), default=None),
            busy_fraction_until_last_new_trial_per_gpu=until,
            busy_fraction_until_last_new_trial_min=min(
                (v for v in until.values() if v is not None), default=None
            ),
            smi_busy_fraction_per_gpu={k: r.get("smi_busy_fraction") for k, r in rows.items()},
            median_gap_s=search["gap_s"]["median"],
            gap_p90_s=search["gap_s"]["p90"],
            median_gap_to_first_batch_s=search["gap_to_first_batch_s"]["median"],
            idle_gpu_memory_with_paused_trials_mib=search["paused_trial_memory_mib"]["median"],
            idle_gpu_memory_with_paused_trials_max_mib=search["paused_trial_memory_mib"]["max"],
            idle_gpu_memory_samples=search["paused_trial_memory_mib"]["count"],
            max_trials_running_at_once=search["concurrency"]["max"],
            mean_trials_running=search["concurrency"]["mean"],
            builds_without_training=search["builds_without_training"],
            search_interrupted_by_time_limit=search["interrupted_by_time_limit"],
            window_s=search["window"]["seconds"],
            search_wall_s=search["search_wall_s"],
        )
        # End to end, as a user sees it: each GPU's training time over the whole call (Ray's
        # start, the first build and the end of the search included), beside the window's.
        wall = search["search_wall_s"]
        e2e = {k: r["busy_s"] / wall if wall else None for k, r in rows.items()}
        s.update(end_to_end_busy_fraction_per_gpu=e2e, end_to_end_busy_fraction_min=_min(e2e))
    if ddp is not None:
        s["ddp_over_torchrun"] = ddp.get("summary", {}).get("searchlab_over_torchrun")
    s["targets"] = TARGETS
    s["meets"] = {k: _meets(k, s.get(k)) for k in TARGETS}
    return s


def _min(values: dict[str, float | None]) -> float | None:
    return _min_or_max(values, min)


def _min_or_max(values: dict[str, float | None] | None, pick: Any) -> float | None:
    known = [v for v in (values or {}).values() if v is not None]
    return pick(known) if known else None


def _paused_memory(search: dict[str, Any]) -> dict[str, Any]:
    """GPU memory that paused trials hold: on GPUs no trial runs on while some trial is
    paused, after they settled (idle ``settle_s``: the last trial's actor had time to give
    its memory back), beyond what an idle process's CUDA context takes on that card.

    The figure is the worst GPU's median; None without settled samples (no GPU sat idle long
    enough while trials were paused).
    """
    context = search.get("cuda_context_mib")
    medians = {
        k: (r.get("memory_idle_with_paused_trials_settled_mib") or {}).get("median")
        for k, r in search["per_gpu"].items()
    }
    known = [v for v in medians.values() if v is not None]
    worst = max(known, default=None)
    held = None if worst is None else max(0.0, worst - (context or 0.0))
    settled = search.get("paused_trial_memory_settled_mib") or {}
    return {
        "paused_trial_memory_mib": held,
        "cuda_context_mib": context,
        "idle_gpu_memory_settled_per_gpu_mib": medians,
        "idle_gpu_memory_settled_max_mib": settled.get("max"),
        "idle_gpu_memory_settled_samples": settled.get("count"),
        "settle_s": search.get("settle_s"),
    }


def _meets(key: str, value: float | None) -> bool | None:
    if value is None:
        return None
    return (
        value <= TARGETS[key]
        if key in ("median_gap_s", "paused_trial_memory_mib")
        else (value >= TARGETS[key])
    )


def table(search: dict[str, Any] | None, ddp: dict[str, Any] | None) -> dict[str, Any]:
    """The printed rows, as data."""
    rows = []
    for k, r in (search or {}).get("per_gpu", {}).items():
        idle = r.get("memory_idle_with_paused_trials_mib") or {}
        settled = r.get("memory_idle_with_paused_trials_settled_mib") or {}
        rows.append(
            {
                "gpu": k,
                "runs": r["runs"],
                "resumes": r["resumes"],
                "first_run_at_s": r["first_run_at_s"],
                "builds_without_training": r["builds_without_training"],
                "busy_fraction": r["busy_fraction"],
                "busy_until_last_new_trial": r["busy_fraction_until_last_new_trial"],
                "available_fraction": r.get("available_fraction"),
                "busy_of_available": r.get("busy_fraction_of_available"),
                "smi_util_gt0": r.get("smi_busy_fraction"),
                "smi_util_mean": r.get("smi_util_mean"),
                "gap_median_s": r["gap_s"]["median"],
                "gap_p90_s": r["gap_s"]["p90"],
                "mem_running_mib": (r.get("memory_running_mib") or {}).get("median"),
                "mem_idle_paused_median_mib": idle.get("median"),
                "mem_idle_paused_max_mib": idle.get("max"),
                "mem_idle_paused_samples": idle.get("count"),
                "mem_idle_paused_settled_median_mib": settled.get("median"),
                "mem_idle_paused_settled_samples": settled.get("count"),
            }
        )
    sides = []
    for side in ("torchrun", "searchlab"):
        if ddp and side in ddp:
            d = ddp[side]
            sides.append(
                {
                    "side": side,
                    "gpus": d["world_size"],
                    "global_batch": d["global_batch"],
                    "samples_per_s": d["samples_per_s"],
                    "timed_s": d["timed_s"],
                }
            )
    return {"search": rows, "ddp": sides}


def _f(value: Any, fmt: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-"
    return format(value, fmt if fmt != "d" or isinstance(value, int) else ".0f")


_COLUMNS = [  # header, key, format, width
    ("GPU", "gpu", "", 9),
    ("runs", "runs", "d", 4),
    ("res", "resumes", "d", 3),
    ("drop", "builds_without_training", "d", 4),
    ("1st s", "first_run_at_s", ".1f", 5),
    ("busy", "busy_fraction", ".3f", 5),
    ("busy<new", "busy_until_last_new_trial", ".3f", 8),
    ("avail", "available_fraction", ".3f", 5),
    ("busy/av", "busy_of_available", ".3f", 7),
    ("util>0", "smi_util_gt0", ".2f", 6),
    ("util%", "smi_util_mean", ".0f", 5),
    ("gap s", "gap_median_s", ".2f", 5),
    ("gap p90", "gap_p90_s", ".2f", 7),
    ("mem run", "mem_running_mib", ".0f", 7),
    ("idle+paused", "mem_idle_paused_median_mib", ".0f", 11),
    ("max", "mem_idle_paused_max_mib", ".0f", 6),
    ("n", "mem_idle_paused_samples", "d", 4),
    ("settled", "mem_idle_paused_settled_median_mib", ".0f", 7),
    ("n", "mem_idle_paused_settled_samples", "d", 4),
]


def print_table(result: dict[str, Any]) -> None:
    rows, s = result["table"]["search"], result["summary"]
    if rows:
        print("  ".join(f"{h:>{w}}" if f else f"{h:<{w}}" for h, _, f, w in _COLUMNS))
        for r in rows:
            print(
                "  ".join(f"{_f(r[k], f):>{w}}" if f else f"{r[k]:<{w}}" for _, k, f, w in _COLUMNS)
            )
        print(
            "(runs: trial starts and resumes on the GPU; drop: workers built for a trial that "
            "then ran elsewhere; 1st s: first run, seconds into the window; mem in MiB)"
        )
        print(
            f"window {_f(s.get('window_s'), '.1f')} s of a {_f(s.get('search_wall_s'), '.0f')} s "
            f"search; trials at once: max {s.get('max_trials_running_at_once')}, mean "
            f"{_f(s.get('mean_trials_running'), '.2f')}; {s.get('builds_without_training')} "
            "workers built and dropped; busy min "
            f"{_f(s.get('busy_fraction_min'), '.3f')} (until the last new trial "
            f"{_f(s.get('busy_fraction_until_last_new_trial_min'), '.3f')}); median gap "
            f"{_f(s.get('median_gap_s'), '.2f')} s (to the first batch "
            f"{_f(s.get('median_gap_to_first_batch_s'), '.2f')} s); end to end (busy over "
            f"the whole call) min {_f(s.get('end_to_end_busy_fraction_min'), '.3f')}"
        )
        print(
            "avail: share of the window the GPU had work (new trials waiting, or a hand-over "
            "to a promoted trial); busy/av: busy share of that time. Busy/avail min "
            f"{_f(s.get('busy_fraction_of_available_min'), '.3f')}, avail min "
            f"{_f(s.get('available_fraction_min'), '.3f')}"
        )
        print(
            "memory of idle GPUs with trials paused: "
            f"{_f(s.get('idle_gpu_memory_with_paused_trials_mib'), '.0f')} MiB median, "
            f"{_f(s.get('idle_gpu_memory_with_paused_trials_max_mib'), '.0f')} max; settled "
            f"(idle >= {_f(s.get('settle_s'), '.0f')} s): worst GPU median "
            f"{_f(_min_or_max(s.get('idle_gpu_memory_settled_per_gpu_mib'), max), '.0f')}"
            f" MiB; an idle CUDA context here: {_f(s.get('cuda_context_mib'), '.0f')} MiB; "
            f"held by paused trials: {_f(s.get('paused_trial_memory_mib'), '.0f')} MiB"
        )
    if s.get("search_interrupted_by_time_limit"):
        print("the search was interrupted at --search-timeout: the figures cover what ran")
    for part, date in (result.get("carried_over") or {}).items():
        print(f"{part}: kept from the run of {date} in {result['config']['out']}")
    workers = "GPUs" if result["machine"]["gpu_names"] else "CPU processes"
    for d in result["table"]["ddp"]:
        print(
            f"ddp {d['side']:<9} {d['gpus']} {workers}, batch {d['global_batch']}: "
            f"{d['samples_per_s']:.0f} samples/s over {d['timed_s']:.1f} s"
        )
    print(f"ddp searchlab / torchrun = {_f(s.get('ddp_over_torchrun'), '.3f')}")
    print(f"targets {TARGETS}")
    print(f"meets   {s['meets']}")
    m = result["machine"]
    gpu = ", ".join(m["gpu_names"]) if m["gpu_names"] else "no GPU: " + m["cpu_model"]
    print(f"{gpu}; torch {m['torch']}, CUDA {m['cuda']}, ray {m['ray']}")


def keep_previous(result: dict[str, Any], out: pathlib.Path, part: str) -> None:
    """With one part run, take the other from an earlier result of the same GPUs."""
    if part == "all" or not out.is_file():
        return
    old = json.loads(out.read_text())
    if old.get("machine", {}).get("gpu_names") != result["machine"]["gpu_names"]:
        return
    other = "ddp" if part == "search" else "search"
    if old.get(other) is not None and result.get(other) is None:
        result[other] = old[other]
        result.setdefault("carried_over", {})[other] = old.get("date")
