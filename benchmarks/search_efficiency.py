"""Search efficiency: best validation error against training budget, searchlab vs its peers.

    PYTHONPATH=. python benchmarks/search_efficiency.py [--problem synthetic|digits|all]
    PYTHONPATH=. python benchmarks/search_efficiency.py --quick      # a few minutes on CPU

Every method gets the same budget, counted in **units trained** (one unit = one step of the
synthetic curve, or one real epoch of an MLP on digits) by any worker, with the same number of
workers (8), the same minimum length (1 unit), maximum length and reduction factor (3). A
method stops when it has trained the budget (``--budget-factor`` x the maximum length: 30 full
trainings on the synthetic family, 20 on digits) or has nothing left to run. Work that a method makes a trial repeat would count again: searchlab's
promotion resumes a paused trial from its checkpoint and Ray's BOHB restores its checkpoint,
so neither repeats anything; ASHA (Ray, Syne Tune, searchlab's ``stop_once``) and Optuna's
pruner stop trials instead of pausing them.

How each method runs (``_mf_methods``, ``_mf_raybohb``): the real decision code of each tool
drives an asynchronous runner with simulated workers and a simulated clock (``_mf_sim``, like
Syne Tune's simulator backend), except Ray's BOHB, which runs in a real ``Tuner.fit``:

- ``searchlab_asha``: ``adaptive_asha`` (promotion; mode ``standard``, the default), random
  sampler, ``max_trials`` = the most whose plan (``searchlab preview``) fits the budget; driven
  through ``searchers.SearchDriver`` as searchlab's Ray adapters drive it.
- ``searchlab_asha_stop``: the same with ``stop_once: true``.
- ``searchlab_asha_tpe``: the same with ``sampler: tpe`` (BOHB-style TPE fed by every rung).
- ``ray_asha``: Ray Tune's ``ASHAScheduler`` (``brackets=1``) with random search.
- ``ray_bohb``: Ray Tune's ``HyperBandForBOHB`` + ``TuneBOHB`` (hpbandster and ConfigSpace).
- ``optuna_tpe_hyperband``: an Optuna study, ``TPESampler`` + ``HyperbandPruner``.
- ``syne_asha`` / ``syne_bohb``: Syne Tune's ``ASHA`` and ``BOHB`` schedulers (0.16 has no
  promotion-type ASHA and no MOBSTER).
- ``random``: searchlab's ``random`` searcher, every trial trained to the maximum length.

What is measured (``_mf_stats``): per seed, the incumbent after each budget step (the result
with the lowest observed validation error so far, at any length: a checkpoint a user can take);
its score is its error on digits, and its noise-free error minus the optimum (regret) on the
synthetic family. Curves are summarised by the interquartile mean (IQM) over seeds, with a
95% percentile bootstrap interval over seeds. ``budget_ratio_vs_<peer>`` is the first budget
at which searchlab's IQM reaches the peer's final IQM, over the peer's budget (lower is better;
null: never within the budget). ``worse_than_random``: searchlab's IQM is above random search's
at a budget where random search has a result.

Problems (``_mf_problems``): (a) ``synthetic``: Hartmann-6 asymptotes with crossing power-law
learning curves and noise, max length 81; (b) ``digits``: an MLP on scikit-learn's digits,
trained for real, max length 27 epochs.

Prints a table per problem, writes ``benchmarks/results/search_efficiency.json`` (``summary``
first) and ``search_efficiency.png`` (IQM curves with their intervals).
"""

from __future__ import annotations

import argparse
import logging
import pathlib
import sys
import time
import warnings
from typing import Any

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from _common import add_common_args, machine_info, print_table, result_path, write_result  # noqa: E402
from _mf_methods import (  # noqa: E402
    OptunaHyperband,
    RayASHA,
    SearchlabMethod,
    SyneTuneMethod,
    searchlab_config,
    searchlab_trials_for_budget,
)
from _mf_problems import DigitsCurves, Problem, SyntheticCurves  # noqa: E402
from _mf_report import analyse, plot_curves, summarise_problem, summary_of  # noqa: E402
from _mf_sim import best_so_far, simulate  # noqa: E402

METHODS = (
    "searchlab_asha",
    "searchlab_asha_stop",
    "searchlab_asha_tpe",
    "ray_asha",
    "ray_bohb",
    "optuna_tpe_hyperband",
    "syne_asha",
    "syne_bohb",
    "random",
)
GRID_POINTS = 100


def build_problem(name: str, quick: bool) -> Problem:
    if name == "synthetic":
        return SyntheticCurves(max_length=27 if quick else 81)
    return DigitsCurves(max_length=9 if quick else 27)


def run_method(
    name: str, problem: Problem, *, seed: int, workers: int, budget: int, divisor: float
) -> Any:
    """One search of ``name`` on ``problem``; the runner's result."""
    kw: dict[str, Any] = {"workers": workers, "divisor": divisor, "seed": seed}
    if name == "ray_bohb":
        from _mf_raybohb import run_ray_bohb

        return run_ray_bohb(
            problem.name, seed=seed, workers=workers, budget=budget, divisor=divisor
        )
    if name.startswith("searchlab_asha"):
        tokens = set(name.split("_")[2:])  # e.g. searchlab_asha_stop_tpe_aggressive
        options: dict[str, Any] = {
            "stop_once": "stop" in tokens,
            "sampler": "tpe" if "tpe" in tokens else "random",
            "mode": "aggressive" if "aggressive" in tokens else "standard",
        }
        trials = searchlab_trials_for_budget(problem, budget, **options, **kw)
        cfg = searchlab_config(problem, name="adaptive_asha", max_trials=trials, **options, **kw)
        method: Any = SearchlabMethod(cfg, workers)
    elif name == "random":
        cfg = searchlab_config(problem, name="random", max_trials=10**6, **kw)
        method = SearchlabMethod(cfg, workers)
    elif name == "ray_asha":
        method = RayASHA(problem, seed=seed, divisor=divisor, num_samples=None)
    elif name == "optuna_tpe_hyperband":
        method = OptunaHyperband(problem, seed=seed, divisor=divisor, n_trials=None)
    elif name in ("syne_asha", "syne_bohb"):
        kind = name.split("_", 1)[1]
        method = SyneTuneMethod(problem, kind=kind, seed=seed, divisor=divisor, num_samples=None)
    else:
        raise ValueError(f"method is {name!r}, but must be one of {', '.join(METHODS)}")
    return simulate(
        method,
        lambda hp: problem.curve(hp, seed),
        workers=workers,
        max_length=problem.max_length,
        budget=budget,
    )


def budget_factor(problem: Problem, args: argparse.Namespace) -> int:
    """Budget in full-length trainings: ``--budget-factor``, else 30 (synthetic), 20 (digits)."""
    if args.budget_factor:
        return int(args.budget_factor)
    return 8 if args.quick else {"synthetic": 30, "digits": 20}[problem.name]


def run_problem(problem: Problem, args: argparse.Namespace) -> dict[str, Any]:
    budget = budget_factor(problem, args) * problem.max_length
    grid = sorted({max(1, round(budget * (i + 1) / GRID_POINTS)) for i in range(GRID_POINTS)})
    per_method: dict[str, Any] = {}
    for name in args.methods:
        curves, runs = [], []
        for seed in range(args.seeds):
            cpu0, wall0 = time.process_time(), time.perf_counter()
            result = run_method(
                name,
                problem,
                seed=seed,
                workers=args.workers,
                budget=budget,
                divisor=args.divisor,
            )
            score = best_so_far(
                result.reports,
                grid,
                use_true=problem.has_true_value,
                optimum=problem.optimum,
            )
            curves.append(score)
            runs.append(
                {
                    "seed": seed,
                    "spent": result.spent,
                    "trials": result.trials,
                    "resumes": result.resumes,
                    "ended": result.ended,
                    "final": score[-1],
                    "wall_s": round(time.perf_counter() - wall0, 3),
                    "driver_cpu_s": round(time.process_time() - cpu0, 3),
                }
            )
        per_method[name] = {"curves": np.array(curves), "runs": runs}
        finals = ", ".join(f"{r['final']:.3f}" for r in runs)
        print(f"  {problem.name} {name}: finals {finals}", flush=True)
    return summarise_problem(problem, per_method, grid, budget, args)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--problem", choices=("synthetic", "digits", "all"), default="all")
    parser.add_argument("--seeds", type=int, default=None, help="repetitions (default 10)")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--divisor", type=float, default=3.0)
    parser.add_argument("--budget-factor", type=int, default=None, help="budget / max length")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated")
    parser.add_argument(
        "--headline", default="searchlab_asha_tpe", help="searchlab method summarised"
    )
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap repetitions")
    parser.add_argument(
        "--combine",
        nargs="+",
        type=pathlib.Path,
        default=None,
        help="no runs: the problems of these result files, analysed and written together",
    )
    args = parser.parse_args()
    args.methods = [m for m in args.methods.split(",") if m]
    for name in args.methods:
        if name not in METHODS:
            parser.error(f"--methods: {name!r} is not a method; use some of {', '.join(METHODS)}")
    args.seeds = args.seeds or (2 if args.quick else 10)
    return args


def main() -> None:
    args = parse_args()
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    problems = ("synthetic", "digits") if args.problem == "all" else (args.problem,)
    out = result_path("search_efficiency", args)
    if args.combine:
        return combine(args.combine, out, args)
    previous = _previous(out)
    results: dict[str, Any] = dict(previous.get("problems", {}))
    for name in problems:
        problem = build_problem(name, args.quick)
        units = budget_factor(problem, args) * problem.max_length
        print(f"{name}: budget {units} units, {args.seeds} seeds, {args.workers} workers")
        results[name] = run_problem(problem, args)
        print_table(results[name]["table"], list(results[name]["table"][0].keys()))
    summary = summary_of(results, args.headline)
    config = {
        "workers": args.workers,
        "divisor": args.divisor,
        "budget_factor": args.budget_factor or "30 (synthetic), 20 (digits)",
        "seeds": args.seeds,
        "methods": args.methods,
        "headline": args.headline,
        "quick": args.quick,
    }
    packages = ("torch", "ray", "optuna", "syne-tune", "hpbandster", "ConfigSpace", "numpy")
    write_result(out, summary, config=config, problems=results, machine=machine_info(packages))
    plot_curves(results, out.with_suffix(".png"))


def combine(paths: list[pathlib.Path], out: pathlib.Path, args: argparse.Namespace) -> None:
    """Write the problems of earlier result files as one result (analysis and plot redone)."""
    results: dict[str, Any] = {}
    configs, machine = {}, None
    for path in paths:
        data = _previous(path)
        for name, res in data.get("problems", {}).items():
            random_from = res["workers"] * res["max_length"]
            res.update(analyse(res["methods"], res["grid"], res["budget"], random_from))
            results[name] = res
            configs[name] = data.get("config")
        machine = machine or data.get("machine")
    for res in results.values():
        print_table(res["table"], list(res["table"][0].keys()))
    summary = summary_of(results, args.headline)
    write_result(out, summary, config=configs, problems=results, machine=machine)
    plot_curves(results, out.with_suffix(".png"))


def _previous(path: pathlib.Path) -> dict[str, Any]:
    """An earlier result of the same file, so ``--problem`` keeps the other problem's rows."""
    import json

    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


if __name__ == "__main__":
    main()
