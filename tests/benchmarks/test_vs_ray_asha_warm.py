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
    assert "warm-up (discarded): {'searchlab'" in done.stdout
