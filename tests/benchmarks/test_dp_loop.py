"""``dp_loop.py --smoke``: two gloo ranks per torchrun run, every side in every round, and a
summary that is the medians of the runs' paired ratios."""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys

import pytest
import torch.distributed

# The benchmark runs as a subprocess only: importing it here would put its model_def (the
# resnet_model one) in sys.modules for every test after this one is collected.
if not torch.distributed.is_available():
    pytest.skip("needs torch.distributed", allow_module_level=True)

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_smoke_run_times_every_side_on_both_ranks_and_pairs_them_by_round(
    tmp_path: pathlib.Path,
) -> None:
    out = tmp_path / "x.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "benchmarks/dp_loop.py", "--smoke", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    summary, runs = result["summary"], result["runs"]
    assert summary["rounds"] == result["config"]["rounds"] == 2
    assert summary["gpus"] == 2
    assert {"cpu_model", "python"} <= result["machine"].keys()

    # One run per side per round, in the order that turns round by round.
    assert [(r["round"], r["side"]) for r in runs] == [
        (1, "hand"),
        (1, "loop"),
        (1, "handwide"),
        (2, "handwide"),
        (2, "loop"),
        (2, "hand"),
    ]
    for run in runs:
        assert run["world_size"] == 2
        assert run["backend"] == "gloo"
        assert [r["rank"] for r in run["ranks"]] == [0, 1]
        for rank in run["ranks"]:
            assert rank["wall_ms_per_batch"] > 0
            assert rank["cpu_ms_per_batch"] > 0
        assert run["wall_ms_per_batch"] == max(r["wall_ms_per_batch"] for r in run["ranks"])

    # The summary: medians over rounds of hand's wall ms over the other side's, same round.
    wall = {(r["round"], r["side"]): r["wall_ms_per_batch"] for r in runs}
    for side in ("loop", "handwide"):
        pairs = [wall[(i, "hand")] / wall[(i, side)] for i in (1, 2)]
        assert summary["pair_ratios"][f"{side}_over_hand"] == pytest.approx(pairs)
        assert summary[f"{side}_over_hand"] == pytest.approx(statistics.median(pairs))
    assert "loop/hand rate" in proc.stdout
