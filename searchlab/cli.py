"""The ``searchlab`` command line: run, resume, results, plot, report, preview."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from enum import Enum
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
    res = sub.add_parser(
        "results",
        help="print the trials of an experiment directory, best first",
        description="Print the trials, best first: the hyperparameters that vary, state, "
        "batches, rung and best metric. --csv and --json print every column of every trial "
        "(checkpoints included) in trial order, for programs.",
    )
    res.add_argument("experiment_dir")
    form = res.add_mutually_exclusive_group()
    form.add_argument("--csv", action="store_true", help="print CSV with every column")
    form.add_argument("--json", action="store_true", help="print JSON with every column")
    res.add_argument("--metrics", action="store_true", help="print every metric report instead")
    plot = sub.add_parser(
        "plot", help="write PNG plots of an experiment: learning curves, best so far, rungs"
    )
    plot.add_argument("experiment_dir")
    plot.add_argument("--out", help="directory for the PNGs (default: EXPERIMENT_DIR/plots)")
    report = sub.add_parser("report", help="write one self-contained HTML page about an experiment")
    report.add_argument("experiment_dir")
    report.add_argument("--out", help="the HTML file (default: EXPERIMENT_DIR/report.html)")
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
            _print_results(args.experiment_dir, form=_form(args), metrics=args.metrics)
        elif args.command == "plot":
            from searchlab._plot import write_plots
            from searchlab.results import load_results

            for path in write_plots(load_results(args.experiment_dir), args.out):
                print(path)
        elif args.command == "report":
            from searchlab._report import write_report
            from searchlab.results import load_results

            print(write_report(load_results(args.experiment_dir), args.out))
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
    except BrokenPipeError:  # the reader went away (`searchlab results DIR | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a tool killed by SIGPIPE
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


class _Form(str, Enum):
    """How ``searchlab results`` prints: a table for people, CSV or JSON for programs."""

    TABLE = "table"
    CSV = "csv"
    JSON = "json"


def _form(args: argparse.Namespace) -> _Form:
    return _Form.CSV if args.csv else _Form.JSON if args.json else _Form.TABLE


def _print_results(experiment_dir: str, *, form: _Form, metrics: bool) -> None:
    from searchlab._trials_table import format_table, table_frame
    from searchlab.results import load_results

    results = load_results(experiment_dir)
    frame = results.metrics if metrics else results.trials
    if form is _Form.CSV:
        print(frame.to_csv(index=False), end="")
    elif form is _Form.JSON:
        # Through pandas for its NaN/timestamp handling, then json for plain "/" in paths.
        rows = json.loads(frame.to_json(orient="records", date_format="iso"))
        print(json.dumps(rows, indent=1))
    elif metrics:
        print(format_table(frame))
    else:
        print(format_table(table_frame(results)))


if __name__ == "__main__":
    sys.exit(main())
