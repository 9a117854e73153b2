"""Tables, summary figures and the PNG of ``search_efficiency`` (from per-seed curves)."""

from __future__ import annotations

import math
import pathlib
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from _mf_problems import Problem
from _mf_stats import bootstrap_iqm, budget_to_reach, iqm_curve

__all__ = [
    "analyse",
    "plot_curves",
    "ratios_for",
    "summarise_problem",
    "summary_of",
    "worse_than_random",
]

PEERS = ("ray_asha", "ray_bohb", "optuna_tpe_hyperband", "syne_asha", "syne_bohb", "random")
SEARCHLAB = ("searchlab_asha", "searchlab_asha_stop", "searchlab_asha_tpe")


def _jsonable(values: Any) -> list[float | None]:
    return [None if not math.isfinite(float(v)) else round(float(v), 6) for v in values]


def ratios_for(
    method: str, methods: Mapping[str, Any], grid: Sequence[int]
) -> dict[str, float | None]:
    """Budget ``method`` needs to reach each other method's final IQM, over that one's budget."""
    own = _floats(methods[method]["iqm"])
    out: dict[str, float | None] = {}
    for peer, data in methods.items():
        if peer == method:
            continue
        target = float(data["final_iqm"])
        reached = budget_to_reach(own, grid, target) if math.isfinite(target) else None
        out[peer] = None if reached is None else round(reached / float(data["budget"]), 4)
    return out


def worse_than_random(
    method: str, methods: Mapping[str, Any], grid: Sequence[int], from_budget: int
) -> Any:
    """Budgets from ``from_budget`` on where ``method``'s IQM is above random search's.

    ``from_budget`` is ``workers x max_length``: from there on, random search has trained one
    trial to the full length on each worker; before it, both sides hold partly trained models
    of their first few random draws. ``any_budget`` lists the budgets before it as well.
    """
    if "random" not in methods or method not in methods:
        return None
    own, rnd = _floats(methods[method]["iqm"]), _floats(methods["random"]["iqm"])
    worse = [b for b, a, r in zip(grid, own, rnd) if math.isfinite(r) and a > r + 1e-12]
    late = [b for b in worse if b >= from_budget]
    return {"worse": bool(late), "from_budget": from_budget, "budgets": late, "any_budget": worse}


def summarise_problem(
    problem: Problem,
    per_method: Mapping[str, Any],
    grid: Sequence[int],
    budget: int,
    args: Any,
) -> dict[str, Any]:
    """IQM curves with bootstrap intervals, ratios and the printed table of one problem."""
    methods: dict[str, Any] = {}
    for name, data in per_method.items():
        curves = np.asarray(data["curves"], dtype=float)
        center = iqm_curve(curves)
        low, high = bootstrap_iqm(curves, reps=args.bootstrap)
        spent = [r["spent"] for r in data["runs"]]
        methods[name] = {
            "iqm": _jsonable(center),
            "ci_low": _jsonable(low),
            "ci_high": _jsonable(high),
            "final_iqm": float(center[-1]),
            "final_ci": [float(low[-1]), float(high[-1])],
            "budget": float(statistics.median(spent)),
            "runs": data["runs"],
        }
    per_seed = {n: [_jsonable(row) for row in d["curves"]] for n, d in per_method.items()}
    return {
        "score": "regret (noise-free error of the incumbent - optimum)"
        if problem.has_true_value
        else "validation error of the incumbent",
        "max_length": problem.max_length,
        "optimum": problem.optimum,
        "budget": budget,
        "grid": list(grid),
        "seeds": args.seeds,
        "workers": args.workers,
        "divisor": args.divisor,
        "methods": methods,
        **analyse(methods, grid, budget, args.workers * problem.max_length),
        "curves_per_seed": per_seed,
    }


def analyse(
    methods: Mapping[str, Any], grid: Sequence[int], budget: int, random_from: int
) -> dict[str, Any]:
    """Ratios, the comparison with random search, and the table, from the IQM curves."""
    ray = methods.get("ray_asha")
    rows = []
    for name, m in methods.items():
        reach = None
        if ray is not None and math.isfinite(ray["final_iqm"]):
            b = budget_to_reach(_floats(m["iqm"]), grid, ray["final_iqm"])
            reach = None if b is None else round(b / budget, 3)
        rows.append(
            {
                "method": name,
                "final_iqm": round(m["final_iqm"], 4),
                "ci95": f"[{m['final_ci'][0]:.4f}, {m['final_ci'][1]:.4f}]",
                "reaches_ray_asha_final_at": reach,
                "trials": statistics.median(r["trials"] for r in m["runs"]),
                "resumes": statistics.median(r["resumes"] for r in m["runs"]),
                "wall_s": round(statistics.median(r["wall_s"] for r in m["runs"]), 2),
            }
        )
    searchlab = {n: ratios_for(n, methods, grid) for n in SEARCHLAB if n in methods}
    for row in rows:
        for n, ratios in searchlab.items():
            row[f"{n}_ratio"] = ratios.get(row["method"])
    return {
        "searchlab_ratios": searchlab,
        "worse_than_random": {
            n: worse_than_random(n, methods, grid, random_from) for n in searchlab
        },
        "table": rows,
    }


def _floats(values: Sequence[Any]) -> np.ndarray:
    return np.array([math.inf if v is None else v for v in values], dtype=float)


def _pick(ratios: Mapping[str, Any], peer: str) -> Any:
    return ratios.get(peer) if peer in ratios else "not run"


def _figures(problems: Mapping[str, Any], method: str) -> dict[str, Any]:
    per_problem: dict[str, Any] = {}
    for name, res in problems.items():
        ratios = res["searchlab_ratios"].get(method)
        if ratios is None:
            continue
        worse = res["worse_than_random"].get(method)
        per_problem[name] = {
            "budget_ratio_vs_ray_asha": _pick(ratios, "ray_asha"),
            "budget_ratio_vs_optuna": _pick(ratios, "optuna_tpe_hyperband"),
            "budget_ratio_vs_peers": {p: ratios[p] for p in PEERS if p in ratios},
            "worse_than_random": None if worse is None else worse["worse"],
            "worse_than_random_at": None if worse is None else worse["budgets"],
            "worse_than_random_at_any_budget": None if worse is None else worse["any_budget"],
        }

    def worst(key: str) -> Any:
        values = [v[key] for v in per_problem.values() if v[key] != "not run"]
        if not values:
            return None
        return None if any(v is None for v in values) else max(values)

    peers_worst = [r for v in per_problem.values() for r in v["budget_ratio_vs_peers"].values()]
    return {
        "budget_ratio_vs_ray_asha": worst("budget_ratio_vs_ray_asha"),
        "budget_ratio_vs_optuna": worst("budget_ratio_vs_optuna"),
        "worst_ratio_vs_any_peer": None
        if not peers_worst or any(r is None for r in peers_worst)
        else max(peers_worst),
        "worse_than_random": any(bool(v["worse_than_random"]) for v in per_problem.values()),
        "per_problem": per_problem,
    }


def summary_of(problems: Mapping[str, Any], headline: str) -> dict[str, Any]:
    """The summary: the headline searchlab method's figures (worst over problems) and goals."""
    figures = _figures(problems, headline)
    ray, any_peer = figures["budget_ratio_vs_ray_asha"], figures["worst_ratio_vs_any_peer"]
    meets = {
        "ray_asha_at_most_0.5": ray is not None and ray <= 0.5,
        "every_peer_below_1": any_peer is not None and any_peer < 1.0,
        "never_worse_than_random": not figures["worse_than_random"],
    }
    others = {m: _figures(problems, m) for m in SEARCHLAB if m != headline}
    return {"searchlab_method": headline, **figures, "meets": meets, "other_searchlab": others}


def plot_curves(problems: Mapping[str, Any], path: pathlib.Path) -> None:
    """One panel per problem: each method's IQM against budget, with its 95% interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(problems), figsize=(7 * len(problems), 5), squeeze=False)
    for ax, (name, res) in zip(axes[0], problems.items()):
        grid = np.asarray(res["grid"], dtype=float) / res["max_length"]
        for method, m in res["methods"].items():
            y = np.array([np.nan if v is None else v for v in m["iqm"]], dtype=float)
            lo = np.array([np.nan if v is None else v for v in m["ci_low"]], dtype=float)
            hi = np.array([np.nan if v is None else v for v in m["ci_high"]], dtype=float)
            style = "-" if method.startswith("searchlab") else "--"
            width = 2.4 if method.startswith("searchlab") else 1.4
            (line,) = ax.plot(grid, y, style, lw=width, label=method)
            ax.fill_between(grid, lo, hi, color=line.get_color(), alpha=0.12)
        ax.set_yscale("log")
        # From a tenth of the budget on: the part where the methods differ.
        tenth = len(res["grid"]) // 10
        tops = [v for m in res["methods"].values() for v in m["iqm"][tenth:] if v is not None]
        lows = [v for m in res["methods"].values() for v in m["ci_low"] if v is not None]
        if tops and lows:
            ax.set_ylim(0.9 * min(lows), 1.1 * max(tops))
        ax.set_xlabel("budget (full-length trainings = units / max length)")
        ax.set_ylabel(res["score"].split(" (")[0] + " (IQM over seeds, 95% CI)")
        ax.set_title(f"{name}: {res['seeds']} seeds, {res['workers']} workers")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")
