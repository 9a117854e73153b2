"""``benchmarks/first_batch_beside.py``: fresh probes beside a holder that pauses on request."""

from __future__ import annotations

import pathlib

import first_batch_beside
import pytest


def _holder_times(folder: pathlib.Path) -> list[float]:
    lines = (folder / "holder.log").read_text().splitlines()
    return [float(line.split()[0]) for line in lines]


@pytest.mark.timeout(300)
def test_the_holder_trains_beside_a_first_batch_only_where_the_mode_says(
    tmp_path: pathlib.Path,
) -> None:
    rows = first_batch_beside.run_all(rounds=1, quick=True, folder=tmp_path, steady=20)
    assert [r["mode"] for r in rows] == list(first_batch_beside.MODES)
    logged = _holder_times(tmp_path)
    assert logged, "the holder trained"
    for row in rows:
        # No probe's rate is timed while the holder trains.
        assert not [t for t in logged if row["steady_began"] <= t <= row["steady_end"]]
        assert row["steady_batches_per_s"] > 0
        assert row["first_batch_began"] < row["first_batch_end"] <= row["steady_began"]
        if row["mode"] != "beside":
            # The holder was paused before the first batch and stayed paused.
            assert not [t for t in logged if row["first_batch_began"] <= t <= row["steady_end"]]
    by_mode = {r["mode"]: r for r in rows}
    assert "benchmark_batch_s" in by_mode["alone_heuristic_first"]
    assert "holder_rate_before" in by_mode["beside"]
    assert (tmp_path / "stop").exists()


def test_the_holder_rate_is_read_between_two_times(tmp_path: pathlib.Path) -> None:
    log = tmp_path / "holder.log"
    log.write_text("10.0 10\n11.0 110\n12.0 210\n13.0 260\n")
    assert first_batch_beside._holder_rate(log, 10.5, 12.5) == pytest.approx(100.0)
    assert first_batch_beside._holder_rate(log, 11.0, 13.0) == pytest.approx(75.0)
    assert first_batch_beside._holder_rate(log, 11.5, 12.5) is None  # one point only


def test_the_summary_reads_rates_after_a_first_batch_beside_against_alone() -> None:
    def row(mode: str, rate: float, **more: float) -> dict:
        return {"mode": mode, "steady_batches_per_s": rate, "first_batch_s": 1.0} | more

    rows = [
        row("alone", 100.0),
        row("alone", 110.0),
        row("beside", 80.0, holder_rate_before=100.0, holder_rate_during=50.0),
        row("beside", 90.0, holder_rate_before=120.0, holder_rate_during=70.0),
        row("alone_heuristic_first", 104.0, benchmark_batch_s=0.5),
    ]
    summary = first_batch_beside.summary_of(rows)
    assert summary["steady_beside_over_alone"] == pytest.approx(85.0 / 105.0)
    assert summary["holder_during_over_before"] == pytest.approx(60.0 / 110.0)
    assert summary["alone_heuristic_first_benchmark_batch_s"] == 0.5
    assert "alone_benchmark_batch_s" not in summary
    rows = [r for r in rows if r["mode"] != "beside"]
    summary = first_batch_beside.summary_of(rows)
    assert summary["steady_beside_over_alone"] is None
    assert summary["holder_during_over_before"] is None
