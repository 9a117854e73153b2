"""``vs_ray_asha.py --warm-cache``: each side runs once, discarded, before round 0."""

from __future__ import annotations

import json
import pathlib

import pytest
from smoke_run import vs_ray_asha_smoke


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(600)
def test_each_side_warms_up_once_and_only_the_rounds_are_recorded(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "run.json"
    done = vs_ray_asha_smoke(out, "--sides", "searchlab,ray_asha", "--no-bracket", "--warm-cache")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    warm = result["config"]["warm_up_s"]
    assert list(warm) == ["searchlab", "ray_asha"] and all(s > 0 for s in warm.values())
    assert [(r["side"], r["round"]) for r in result["runs"]] == [("searchlab", 0), ("ray_asha", 0)]
    # The warm-up trained the first rung only; the round trained the whole workload.
    assert all(r["batches"] > 0 and r["wall_s"] > 0 for r in result["runs"])
    # Each side's memory was watched: its trial workers (with torch) were seen.
    for run in result["runs"]:
        memory = run["memory"]
        assert memory["workers_peak"] >= 1 and memory["samples"] >= 3, memory
        assert memory["trial_worker_pss_max_gib"] > 0.05, memory
    assert "warm-up (discarded): {'searchlab'" in done.stdout


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(600)
def test_a_searchlab_run_records_the_standby_it_ran_and_auto_says_why(
    tmp_path: pathlib.Path,
) -> None:
    # On a GPU host auto held trials ready only where max_restarts allowed it (call 18A ran
    # the auto side with standby off, unseen): the run now records the count and the note.
    out = tmp_path / "run.json"
    done = vs_ray_asha_smoke(out, "--sides", "searchlab_standby_auto", "--no-bracket")
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = json.loads(out.read_text())["runs"]
    assert run["standby"] == 0  # no GPUs here
    assert run["restarts"] == 0 and run["trial_processes"] == 1
    note = "note: SEARCHLAB_STANDBY=auto: standby is off, as the Ray cluster has no GPUs"
    assert run["notes"] == [note]
    assert note in done.stdout
    # Every one-line message, timed from the call: the note, then each trial's start and end.
    times = [t for t, _ in run["events"]]
    lines = [line for _, line in run["events"]]
    assert note in lines and times == sorted(times) and 0 <= times[-1] <= run["wall_s"]
    assert any(" started at batch 0 " in line for line in lines), lines
    assert any(" finished at batch " in line for line in lines), lines
