"""Where the threads of each trial process were during a run's slowest windows.

Usage::

    PYTHONPATH=. python benchmarks/vs_ray_asha.py --stacks /tmp/stacks --out run.json ...
    PYTHONPATH=. python benchmarks/stack_report.py /tmp/stacks run.json [--windows 3]

``vs_ray_asha.py --stacks`` samples every thread of every process of the run
(``_stack_probe.py``). For each run of the JSON this prints its ``--windows`` longest
training windows and, for each process whose samples inside a window show the benchmark's
trial (``asha_def.py``), each thread's stack whenever it changed: the frames outermost
first, shortened to the last ``--frames``. Call 13D's question was of this kind: two
processes on two GPUs sat 4-4.6 s in their first ``loss.backward()`` and left it together
(``benchmarks/README.md``).
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import sys
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from _stack_probe import read_samples

TRIAL_FILE = "asha_def.py"


def longest_windows(run: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """The run's ``count`` longest training windows, longest first."""
    windows = [w for w in run.get("windows") or [] if w.get("w_start") and w.get("w_end")]
    return sorted(windows, key=lambda w: w["w_end"] - w["w_start"], reverse=True)[:count]


def thread_timelines(
    samples: list[tuple[int, dict[str, Any]]], start: float, end: float, frames: int
) -> dict[int, dict[str, list[tuple[float, str]]]]:
    """For each process whose samples in [start, end] show the trial's file: each thread's
    (time, stack) whenever its stack changed, the stack written outermost first."""
    inside = [(pid, s) for pid, s in samples if start <= s["t"] <= end]
    trial_pids = {pid for pid, s in inside if any(TRIAL_FILE in f for f in s["frames"])}
    out: dict[int, dict[str, list[tuple[float, str]]]] = collections.defaultdict(dict)
    for pid, sample in sorted(inside, key=lambda x: x[1]["t"]):
        if pid not in trial_pids:
            continue
        stack = " < ".join(reversed(sample["frames"][:frames])) or "(no Python frames)"
        timeline = out[pid].setdefault(sample["thread"], [])
        if not timeline or timeline[-1][1] != stack:
            timeline.append((sample["t"], stack))
    return dict(out)


def report(folder: str, result: dict[str, Any], windows: int, frames: int) -> list[str]:
    samples = list(read_samples(folder))
    lines = []
    for run in result.get("runs", []):
        lines.append(
            f"== {run.get('workload')} {run.get('data')} round {run.get('round')}: "
            f"{run.get('side')}"
        )
        for w in longest_windows(run, windows):
            start, end = w["w_start"], w["w_end"]
            lines.append(
                f"  window of trial {str(w.get('trial_id'))[-8:]} on GPU {w.get('gpu')}, "
                f"batches to {w.get('batches')}: {end - start:.2f} s"
            )
            found = thread_timelines(samples, start, end, frames)
            if not found:
                lines.append("    (no samples of a trial process in it)")
            for pid, threads in found.items():
                lines.append(f"    process {pid}")
                for thread, timeline in threads.items():
                    lines.append(f"      thread {thread}")
                    for t, stack in timeline:
                        lines.append(f"        +{t - start:6.2f} s  {stack}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="the folder vs_ray_asha.py --stacks wrote")
    parser.add_argument("result", help="the run's JSON (vs_ray_asha.py --out)")
    parser.add_argument("--windows", type=int, default=3, help="longest windows per run")
    parser.add_argument("--frames", type=int, default=6, help="innermost frames per stack")
    args = parser.parse_args()
    result = json.loads(pathlib.Path(args.result).read_text())
    print("\n".join(report(args.folder, result, args.windows, args.frames)))


if __name__ == "__main__":
    main()
