"""Results at scale: ``load_results`` on an experiment of 10,000 trials x 100 reports.

    PYTHONPATH=. python benchmarks/results_scale.py            # ~1.5 min, 0.6 GB of temp files
    PYTHONPATH=. python benchmarks/results_scale.py --quick    # 200 trials x 20 reports, seconds

Writes an experiment directory as searchlab's driver and Ray Tune write it (``experiment.json``,
``trials.json`` with paths relative to the directory, and per trial ``result.json`` with Tune's
keys and the trial config on every line, ``params.json`` and a ``checkpoint_000001`` holding
``metadata.json``; ``progress.csv`` is left out: results never read it). One trial in ten is
restored from a checkpoint halfway, so superseded reports are marked. Each trial reports 4
training windows, then a validation, over and over.

Each measurement is a fresh child process that imports searchlab and pyarrow, then times
``load_results``: wall ``seconds``, and ``cpu_seconds`` (user + system time of the process, all
its threads: on a shared machine it moves much less than wall time), and reads its peak
resident memory (``ru_maxrss``: everything the process held at its peak, the imports included;
``import_mib`` is that after the imports alone). The median over ``--repeats`` runs, after one
warm-up run (the files are then in the page cache, as they are for an experiment just
written). Two cases:

- **finished**: every file complete.
- **running**: as a driver that is still running, or died, leaves it: no ``trials.json`` yet
  (the records are rebuilt from the trial directories) and a last line cut short in one
  ``result.json`` in ten.

Baseline, in the same run: the quadratic reading searchlab had before (a copy is below) against
``load_results``, on a second experiment of ``--baseline-reports`` reports (5,000 by default:
50 trials; the old reading grows with the square of the reports, so it cannot read the big one).

Prints a table and writes ``benchmarks/results/results_scale.json``; ``summary.seconds`` and
``summary.peak_mib`` are the finished case (targets: <= 2 s and <= 2048 MiB).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from _common import add_common_args, machine_info, print_table, result_path, write_result

REPO = pathlib.Path(__file__).resolve().parent.parent
TARGET_SECONDS = 2.0
TARGET_MIB = 2048.0
_CHILD = """
import json, resource, sys, time
import pyarrow.json, searchlab.results
def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start, start_cpu = time.perf_counter(), cpu()
results = searchlab.results.load_results(sys.argv[1])
seconds, cpu_seconds = time.perf_counter() - start, cpu() - start_cpu
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": seconds, "cpu_seconds": cpu_seconds, "peak_mib": peak / 1024,
                  "import_mib": rss / 1024, "reports": len(results.all_reports),
                  "trials": len(results.trials),
                  "superseded": int(results.all_reports["superseded"].sum())}))
"""


def experiment_meta(name: str) -> dict[str, Any]:
    hparams = {
        "global_batch_size": 16,
        "hidden": {"type": "int", "minval": 2, "maxval": 64},
        "optimizer": {"lr": {"type": "log", "base": 10, "minval": -4, "maxval": -1}},
        "activation": {"type": "categorical", "vals": ["relu", "tanh"]},
    }
    config = {
        "name": name,
        "entrypoint": "model_def:Trial",
        "hyperparameters": hparams,
        "searcher": {"name": "random", "metric": "validation_loss", "smaller_is_better": True},
    }
    return {
        "name": name,
        "config": config,
        "config_file": "<dict>",
        "model_dir": "/nonexistent",
        "entrypoint": "model_def:Trial",
        "metric": "validation_loss",
        "smaller_is_better": True,
        "searcher": "random",
        "length_unit": "batches",
    }


def trial_reports(n: int, restored: bool) -> list[tuple[str, int]]:
    """(group, batches): 4 training windows of 2 batches, then a validation; a restored trial
    goes back, at its halfway point, to its next-to-last validation and redoes the work after."""
    reports: list[tuple[str, int]] = []
    batches = 0
    while len(reports) < n:
        if restored and len(reports) == n // 2:
            validated = [0] + [b for g, b in reports if g == "validation"]
            batches = validated[-2] if len(validated) > 1 else 0  # the one before the latest
            restored = False
        batches += 2
        reports.append(("training", batches))
        if len(reports) % 5 == 4:
            reports.append(("validation", batches))
    return reports[:n]


def result_lines(trial_id: str, hparams: dict[str, Any], n: int, rng: random.Random) -> str:
    config = json.dumps({"hparams": hparams, "searchlab": {"rung_ends": [n * 2], "trial_seed": 7}})
    tail = '"pid": 4242, "hostname": "node-1", "node_ip": "192.0.2.1", "config": ' + config
    lines = []
    restored = rng.random() < 0.1
    for i, (group, batches) in enumerate(trial_reports(n, restored), start=1):
        if group == "training":
            head = f'{{"loss": {rng.random()!r}, "group": "training", '
        else:
            head = (
                f'{{"validation_loss": {rng.random()!r}, "accuracy": {rng.random()!r}, '
                '"group": "validation", '
            )
        head += f'"batches": {batches}, "epochs": {batches / 8!r}, '
        if group == "validation":
            head += '"should_checkpoint": true, '
        lines.append(
            f'{head}"done": false, "training_iteration": {i}, "trial_id": "{trial_id}", '
            f'"date": "2026-01-01_00-00-00", "timestamp": {1_767_225_600 + i}, '
            f'"time_this_iter_s": 0.01, "time_total_s": {i / 100!r}, {tail}, '
            f'"time_since_restore": {i / 100!r}, "iterations_since_restore": {i}}}\n'
        )
    return "".join(lines)


def write_experiment(root: pathlib.Path, trials: int, reports: int) -> pathlib.Path:
    exp_dir = root / "scale"
    exp_dir.mkdir(parents=True)
    (exp_dir / "experiment.json").write_text(json.dumps(experiment_meta("scale"), indent=2))
    rng = random.Random(0)
    records = []
    for index in range(trials):
        trial_id = f"5ca1e_{index:05d}"
        hparams = {
            "activation": rng.choice(["relu", "tanh"]),
            "global_batch_size": 16,
            "hidden": rng.randint(2, 64),
            "optimizer": {"lr": 10 ** rng.uniform(-4, -1)},
        }
        trial_dir = exp_dir / trial_id
        checkpoint = trial_dir / "checkpoint_000001"
        checkpoint.mkdir(parents=True)
        (trial_dir / "result.json").write_text(result_lines(trial_id, hparams, reports, rng))
        (trial_dir / "params.json").write_text(json.dumps({"hparams": hparams}, indent=2))
        (checkpoint / "state-dict.pth").write_bytes(b"\0" * 64)
        metric = rng.random()
        meta = {"batches_trained": 2 * reports, "metrics": {"validation_loss": metric}}
        (checkpoint / "metadata.json").write_text(json.dumps(meta, indent=2))
        records.append(_record(trial_id, hparams, 2 * reports, metric))
    data = {"updated": time.time(), "trials": records}
    (exp_dir / "trials.json").write_text(json.dumps(data, indent=1))
    return exp_dir


def _record(trial_id: str, hparams: dict[str, Any], batches: int, metric: float) -> dict:
    checkpoint = f"{trial_id}/checkpoint_000001"
    return {
        "trial_id": trial_id,
        "state": "COMPLETED",
        "hparams": hparams,
        "bracket": None,
        "rung": 0,
        "trial_seed": 7,
        "batches": batches,
        "best_metric": metric,
        "last_metric": metric,
        "checkpoint": checkpoint,
        "latest_checkpoint": checkpoint,
        "error": None,
        "restarts": 0,
        "warnings": [],
        "trial_dir": trial_id,
        "saved_checkpoints": [{"path": checkpoint, "batches": batches, "metric": metric}],
    }


def make_running(exp_dir: pathlib.Path) -> None:
    """No ``trials.json`` yet, and one ``result.json`` in ten ends in half a line."""
    (exp_dir / "trials.json").unlink()
    for index, result in enumerate(sorted(exp_dir.glob("*/result.json"))):
        if index % 10 == 0:
            with result.open("a") as f:
                f.write('{"loss": 0.5, "group": "training", "batches": 99')


def measure(exp_dir: pathlib.Path, repeats: int) -> dict[str, Any]:
    """Median of ``repeats`` child processes, after one warm-up."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    runs = []
    for _ in range(repeats + 1):
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, str(exp_dir)],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    runs = runs[1:]
    result = {key: runs[0][key] for key in ("reports", "trials", "superseded")}
    for key in ("seconds", "cpu_seconds", "peak_mib", "import_mib"):
        result[key] = statistics.median(r[key] for r in runs)
    result["seconds_all"] = [round(r["seconds"], 3) for r in runs]
    return result


# --- the reading searchlab had before: one pass over all earlier rows per report --------------

_TUNE_KEYS = {
    "timestamp", "training_iteration", "time_this_iter_s", "time_total_s", "pid", "hostname",
    "node_ip", "config", "date", "done", "trial_id", "should_checkpoint", "checkpoint_dir_name",
    "iterations_since_restore", "time_since_restore", "experiment_tag", "group", "batches",
    "epochs",
}  # fmt: skip


def old_reports(exp_dir: pathlib.Path) -> int:
    """The old ``Results._metrics_frame`` loop (without building the DataFrame)."""
    records = json.loads((exp_dir / "trials.json").read_text())["trials"]
    rows: list[dict[str, Any]] = []
    for rec in records:
        trial_id = rec["trial_id"]
        for line in (exp_dir / trial_id / "result.json").read_text().splitlines():
            result = json.loads(line)
            if result.get("group") not in ("training", "validation"):
                continue
            row = {"trial_id": trial_id, "group": result["group"], "batches": result["batches"]}
            row.update({k: v for k, v in result.items() if k not in _TUNE_KEYS})
            rows.append(row)
            new = rows[-1]
            for old in rows[:-1]:
                if old["trial_id"] != trial_id:
                    continue
                if old["batches"] > new["batches"] or (
                    old["batches"] == new["batches"] and old["group"] == new["group"]
                ):
                    old["_superseded"] = True
    return len(rows)


def baseline(root: pathlib.Path, reports_total: int, per_trial: int, repeats: int) -> dict:
    trials = max(1, reports_total // per_trial)
    exp_dir = write_experiment(root / "baseline", trials, per_trial)
    start = time.perf_counter()
    n = old_reports(exp_dir)
    old_s = time.perf_counter() - start
    new = measure(exp_dir, repeats)
    return {
        "reports": n,
        "trials": trials,
        "old_seconds": old_s,
        "new_seconds": new["seconds"],
        "new_cpu_seconds": new["cpu_seconds"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10_000)
    parser.add_argument("--reports", type=int, default=100, help="reports per trial")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--baseline-reports", type=int, default=5_000)
    parser.add_argument("--tmp", type=pathlib.Path, default=None, help="where to write")
    add_common_args(parser)
    args = parser.parse_args()
    if args.quick:
        args.trials, args.reports, args.repeats, args.baseline_reports = 200, 20, 3, 1_000
    load_before = os.getloadavg()[0]
    root = pathlib.Path(tempfile.mkdtemp(prefix="searchlab-results-scale-", dir=args.tmp))
    try:
        start = time.perf_counter()
        exp_dir = write_experiment(root, args.trials, args.reports)
        written_s = time.perf_counter() - start
        size_mib = sum(p.stat().st_size for p in exp_dir.glob("*/result.json")) / 2**20
        finished = measure(exp_dir, args.repeats)
        make_running(exp_dir)
        running = measure(exp_dir, args.repeats)
        old = baseline(root, args.baseline_reports, args.reports, args.repeats)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows = [
        {"case": "finished", **finished},
        {"case": "running", **running},
        {
            "case": f"baseline {old['reports']} reports",
            "reports": old["reports"],
            "trials": old["trials"],
            "seconds": old["new_seconds"],
            "cpu_seconds": old["new_cpu_seconds"],
            "old_seconds": old["old_seconds"],
        },
    ]
    columns = ["case", "trials", "reports", "superseded", "seconds", "cpu_seconds", "old_seconds"]
    print_table(rows, [*columns, "peak_mib", "import_mib"])
    summary = {
        "seconds": finished["seconds"],
        "peak_mib": finished["peak_mib"],
        "cpu_seconds": finished["cpu_seconds"],
        "running_seconds": running["seconds"],
        "running_peak_mib": running["peak_mib"],
        "meets_target": finished["seconds"] <= TARGET_SECONDS
        and max(finished["peak_mib"], running["peak_mib"]) <= TARGET_MIB,
        "baseline_old_seconds": old["old_seconds"],
        "baseline_new_seconds": old["new_seconds"],
        "baseline_reports": old["reports"],
        # Other work on the machine slows wall time (not much cpu_seconds): the 1-min load.
        "load_average_before_after": [load_before, os.getloadavg()[0]],
    }
    machine = machine_info(("pandas", "pyarrow", "numpy"))
    print(
        f"{machine['cpu_model']} x{machine['cpu_count']}; result.json files {size_mib:.0f} MiB, "
        f"written in {written_s:.0f} s; load average {load_before:.1f} -> {os.getloadavg()[0]:.1f}"
    )
    config = {"trials": args.trials, "reports_per_trial": args.reports, "repeats": args.repeats}
    write_result(
        result_path("results_scale", args),
        summary,
        config={**config, "result_json_mib": round(size_mib, 1)},
        cases=rows,
        machine=machine,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
