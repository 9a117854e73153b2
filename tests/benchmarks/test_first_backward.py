"""``benchmarks/first_backward.py``: each scenario in a fresh process, in its folder, on the
run's own compute cache."""

from __future__ import annotations

import pathlib

import first_backward
import pytest


@pytest.mark.timeout(300)
def test_each_scenario_runs_in_its_folder_on_the_run_s_own_cache(tmp_path: pathlib.Path) -> None:
    rows = first_backward.run_scenarios("step", quick=True, root=tmp_path)
    assert [r["scenario"] for r in rows] == [name for name, _ in first_backward.SCENARIOS]
    folders = [tmp_path / first_backward.FOLDERS[f] for _, f in first_backward.SCENARIOS]
    assert [pathlib.Path(r["cwd"]) for r in rows] == folders
    assert {r["cuda_cache_path"] for r in rows} == {str(tmp_path / "cache")}
    assert rows[2]["cwd_chars"] - rows[0]["cwd_chars"] == 50  # B's path is longer
    assert all(r["first_backward_s"] > 0 and r["forward_and_step_s"] > 0 for r in rows)
    assert all(r["cache_entries_added"] == 0 for r in rows)  # no CUDA on --smoke


def test_the_summary_reads_a_new_folder_against_a_cold_and_a_warm_cache() -> None:
    def row(name: str, seconds: float, added: int = 0) -> dict:
        return {"scenario": name, "first_backward_s": seconds, "cache_entries_added": added}

    rows = [row("cold", 5.0, 25), row("warm_same_dir", 1.0), row("other_dir", 4.6, 18)]
    summary = first_backward.summary_of(rows)
    assert summary["other_dir_share_of_cold"] == pytest.approx(0.9)
    assert summary["other_dir_added_entries"] == 18
    rows[2] = row("other_dir", 1.0)
    assert first_backward.summary_of(rows)["other_dir_share_of_cold"] == 0.0
    rows[0] = row("cold", 0.9)  # no cold cost to compare with (a CPU run)
    assert first_backward.summary_of(rows)["other_dir_share_of_cold"] is None


def test_the_cache_files_are_listed_with_their_sizes(tmp_path: pathlib.Path) -> None:
    (tmp_path / "a" / "2").mkdir(parents=True)
    (tmp_path / "a" / "2" / "daf1").write_bytes(b"x" * 7)
    (tmp_path / "index").write_bytes(b"y" * 3)
    assert first_backward.cache_files(tmp_path) == {
        str(tmp_path / "a" / "2" / "daf1"): 7,
        str(tmp_path / "index"): 3,
    }
    assert first_backward.cache_files(tmp_path / "absent") == {}
