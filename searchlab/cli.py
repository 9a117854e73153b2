"""The ``searchlab`` command line: run, results, preview."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from searchlab.errors import SearchlabError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="searchlab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run an experiment config on Ray Tune")
    run.add_argument("config", help="experiment YAML (Determined's format)")
    run.add_argument(
        "model_dir", nargs="?", help="directory of the entrypoint module (default: the config's)"
    )
    run.add_argument(
        "--storage-path", help="where experiment directories go (default ./searchlab-results)"
    )
    run.add_argument("--name", help="experiment directory name (default: the config's name)")
    run.add_argument(
        "--address", help="Ray cluster address (default: RAY_ADDRESS, else a local Ray)"
    )
    run.add_argument(
        "--config",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field, e.g. --config searcher.max_trials=8",
    )
    _grid_limit_flag(run)
    resume = sub.add_parser("resume", help="continue an interrupted or crashed experiment")
    resume.add_argument("experiment_dir", help="the experiment directory `searchlab run` printed")
    resume.add_argument(
        "--address", help="Ray cluster address (default: RAY_ADDRESS, else a local Ray)"
    )
    resume.add_argument(
        "--force-restart",
        action="store_true",
        help="when the experiment's state cannot be trusted (damaged, or its config edited): "
        "run its config again in a new directory, leaving this one as it is",
    )
    res = sub.add_parser("results", help="print the trials table of an experiment directory")
    res.add_argument("experiment_dir")
    res.add_argument("--csv", action="store_true", help="print CSV instead of a table")
    res.add_argument("--metrics", action="store_true", help="print every metric report instead")
    prev = sub.add_parser("preview", help="show the search plan of a config without running it")
    prev.add_argument("config")
    prev.add_argument("--json", action="store_true", help="print the plan as JSON")
    prev.add_argument(
        "--config", dest="overrides", action="append", default=[], metavar="KEY=VALUE"
    )
    _grid_limit_flag(prev)
    return parser


def _grid_limit_flag(parser: argparse.ArgumentParser) -> None:
    from searchers import DEFAULT_MAX_GRID_TRIALS

    parser.add_argument(
        "--max-grid-trials",
        type=_grid_limit,
        default=DEFAULT_MAX_GRID_TRIALS,
        metavar="N",
        help=f"allow a grid search of up to N trials (default {DEFAULT_MAX_GRID_TRIALS}; "
        "'none': no limit)",
    )


def _grid_limit(text: str) -> int | None:
    if text.strip().lower() in ("none", "off", "unlimited"):
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of trials") from None


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "run":
            import searchlab
            from searchlab.config import check_dir_name

            if args.name is not None:
                check_dir_name(args.name, flag="--name")

            results = searchlab.run(
                args.config,
                model_dir=args.model_dir,
                storage_path=args.storage_path,
                address=args.address,
                overrides=args.overrides,
                name=args.name,
                max_grid_trials=args.max_grid_trials,
            )
            return _exit_code(results)
        elif args.command == "resume":
            import searchlab

            results = searchlab.resume(
                args.experiment_dir, address=args.address, force_restart=args.force_restart
            )
            return _exit_code(results)
        elif args.command == "results":
            _print_results(args.experiment_dir, csv=args.csv, metrics=args.metrics)
        elif args.command == "preview":
            from searchers import preview_plan
            from searchlab._preview_text import format_plan
            from searchlab.config import load_experiment_config

            plan = preview_plan(
                load_experiment_config(args.config, args.overrides),
                max_grid_trials=args.max_grid_trials,
            )
            print(json.dumps(plan, indent=2) if args.json else format_plan(plan))
    except SearchlabError as exc:
        print(f"searchlab: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("searchlab: interrupted", file=sys.stderr)
        return 130
    return 0


def _exit_code(results: Any) -> int:
    """1 when every trial errored (nothing to compare), else 0."""
    states = set(results.trials["state"]) if len(results.trials) else set()
    if states and states <= {"ERRORED"}:
        print(
            f"searchlab: every trial errored; see their errors with: searchlab results "
            f"{results.experiment_dir}",
            file=sys.stderr,
        )
        return 1
    return 0


def _print_results(experiment_dir: str, *, csv: bool, metrics: bool) -> None:
    import pandas as pd

    from searchlab.results import load_results

    results = load_results(experiment_dir)
    frame = results.metrics if metrics else results.trials
    if csv:
        print(frame.to_csv(index=False), end="")
    else:
        with pd.option_context("display.max_columns", None, "display.width", 200):
            print(frame.to_string(index=False))


if __name__ == "__main__":
    sys.exit(main())
