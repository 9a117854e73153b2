"""The figures of ``vs_ray_asha`` (``_asha_figures``, ``_asha_sides``): hand-overs per GPU or per worker process, the summary's
split between one trial per GPU and trials sharing a GPU (``--per-gpu``), the sides' order
and the solo rate."""

from __future__ import annotations

import os
from typing import Any

import pytest

# vs_ray_asha.py and its helpers (benchmarks/_asha_*.py): the sides need Ray and torch.
vs_ray_asha = pytest.importorskip("vs_ray_asha")
_asha_figures = pytest.importorskip("_asha_figures")
_asha_sides = pytest.importorskip("_asha_sides")


def _w(trial: str, start: float, end: float, proc: float, gpu: float = 0.0) -> dict[str, Any]:
    return {
        "trial_id": trial,
        "w_start": start,
        "w_end": end,
        "gap_s": 0.0,
        "gpu": gpu,
        "proc_start": proc,
        "n": 10,
    }


# Two worker processes (started at 1.0 and 2.0) share GPU 0: process 1 trains a then c,
# process 2 trains b then d. Their windows interleave in time.
SHARED = [
    _w("a", 10.0, 11.0, proc=1.0),
    _w("b", 10.5, 11.5, proc=2.0),
    _w("a", 11.0, 12.0, proc=1.0),
    _w("b", 11.5, 12.5, proc=2.0),
    _w("c", 12.4, 13.4, proc=1.0),
    _w("d", 13.0, 14.0, proc=2.0),
]


def test_trials_sharing_a_gpu_count_hand_overs_in_each_process() -> None:
    run = {"wall_s": 10.0, "began": 5.0, "windows": SHARED, "slots": 1, "per_gpu": 2}
    got = _asha_figures.figures(run, rate=5.0)
    # Process 1: a ends at 12.0, c starts at 12.4; process 2: b ends at 12.5, d starts at 13.0.
    assert got["handovers"] == 2
    assert got["handover_s"] == pytest.approx(0.45)
    # 60 batches on one GPU in 10 s against a solo rate of 5 batches/s: 1.2 of one GPU.
    assert got["efficiency"] == pytest.approx(1.2)
    assert got["first_batch_s"] == pytest.approx(5.0)
    assert got["after_last_window_s"] == pytest.approx(1.0)  # the last window ends at 14 of 15
    assert got["trial_processes"] == 2


def test_one_trial_per_gpu_counts_hand_overs_on_the_gpu() -> None:
    # The same windows read as one lane (a GPU): every change of trial in time order counts.
    run = {"wall_s": 10.0, "began": 5.0, "windows": SHARED, "slots": 1}
    got = _asha_figures.figures(run, rate=5.0)
    assert got["handovers"] == 5


def _run(side: str, per_gpu: int, efficiency: float, workload: str = "short") -> dict[str, Any]:
    return {
        "workload": workload,
        "data": "resident",
        "side": side,
        "per_gpu": per_gpu,
        "efficiency": efficiency,
        "in_trial_rate": 1.0 / per_gpu,
        "first_batch_s": 10.0,
    }


def test_summary_keeps_shared_gpu_runs_out_of_the_headline() -> None:
    runs = [
        _run("ray_asha", 1, 0.6),
        _run("searchlab", 1, 0.5),
        _run("ray_asha", 2, 1.0),
        _run("searchlab", 2, 1.5),
        _run("ray_asha", 2, 0.8, workload="long"),
        _run("searchlab", 2, 1.2, workload="long"),
    ]
    summary = _asha_figures._summary(runs)
    assert summary["searchlab_over_ray"] == pytest.approx(0.5 / 0.6)
    assert summary["in_search_over_in_process"] == 1.0
    assert summary["long_efficiency"] is None
    packed = summary["packed"]["per_gpu_2"]
    assert packed["searchlab_over_ray"] == pytest.approx(1.5)
    assert packed["long_searchlab_over_ray"] == pytest.approx(1.5)
    assert packed["in_search_over_in_process"] == 0.5


def test_the_gpu_idle_time_counts_overlapping_windows_once_on_each_gpu() -> None:
    windows = [
        _w("a", 0.0, 1.0, proc=1.0, gpu=0.0),
        _w("b", 1.5, 2.0, proc=1.0, gpu=0.0),  # GPU 0 idle 0.5 s
        _w("c", 0.0, 1.0, proc=2.0, gpu=1.0),
        _w("d", 0.5, 0.8, proc=3.0, gpu=1.0),  # inside c's window: no idle time
        _w("e", 3.0, 4.0, proc=2.0, gpu=1.0),  # GPU 1 idle 2.0 s
    ]
    run = {"wall_s": 5.0, "began": 0.0, "windows": windows, "slots": 1}
    assert _asha_figures.figures(run, rate=10.0)["gpu_idle_between_windows_s"] == pytest.approx(2.5)
    shared = {"wall_s": 10.0, "began": 5.0, "windows": SHARED, "slots": 1, "per_gpu": 2}
    assert _asha_figures.figures(shared, rate=5.0)["gpu_idle_between_windows_s"] == 0.0


def test_summary_reads_every_searchlab_side_against_ray() -> None:
    runs = [
        _run("ray_asha", 1, 0.6),
        _run("searchlab", 1, 0.5),
        _run("searchlab_standby2", 1, 0.66),
        _run("searchlab_standby2", 1, 0.72),
        _run("ray_asha", 1, 0.8, workload="long"),
        _run("searchlab_standby2", 1, 0.72, workload="long"),
    ]
    by_side = _asha_figures._summary(runs)["by_side"]
    assert sorted(by_side) == ["searchlab", "searchlab_standby2"]
    assert by_side["searchlab_standby2"] == pytest.approx(
        {
            "short_efficiency": 0.69,
            "short_over_ray": 1.15,
            "long_efficiency": 0.72,
            "long_over_ray": 0.9,
        }
    )
    assert by_side["searchlab"]["short_over_ray"] == pytest.approx(0.5 / 0.6)
    assert by_side["searchlab"]["long_efficiency"] is None
    assert by_side["searchlab"]["long_over_ray"] is None


def test_summary_without_shared_gpu_runs_has_no_packed_block() -> None:
    summary = _asha_figures._summary([_run("ray_asha", 1, 0.6), _run("searchlab", 1, 0.3)])
    assert "packed" not in summary
    assert summary["searchlab_over_ray"] == pytest.approx(0.5)


def test_a_run_is_also_read_against_the_solo_blocks_around_it() -> None:
    # One lane, windows of 10 batches: the first (cuDNN's tuning) is left out, the other four
    # take 1.0, 0.5, 0.5 and 0.4 s, so the median window trains 20 batches/s.
    windows = [
        _w("a", 0.0, 4.0, proc=1.0),
        _w("a", 4.0, 5.0, proc=1.0),
        _w("a", 5.0, 5.5, proc=1.0),
        _w("b", 6.0, 6.5, proc=1.0),
        _w("b", 6.5, 6.9, proc=1.0),
    ]
    run = {"wall_s": 10.0, "began": 0.0, "windows": windows, "slots": 1}
    # The best block before the round (30/s) against the median of the blocks around the run.
    assert _asha_figures.figures(run, rate=30.0)["in_trial_rate"] == pytest.approx(20 / 30)
    got = _asha_figures.bracketed(run, before=[30.0, 24.0, 26.0], after=[22.0, 25.0, 18.0])
    assert got["bracket_batches_per_s"] == pytest.approx(24.5)
    assert got["bracket_blocks_per_s"] == [30.0, 24.0, 26.0, 22.0, 25.0, 18.0]
    assert got["in_trial_rate_bracketed"] == pytest.approx(20 / 24.5)
    assert got["efficiency_bracketed"] == pytest.approx(50 / (24.5 * 10.0))
    # A run with no solo loop after it is read against the blocks before it alone.
    alone = _asha_figures.bracketed(run, before=[30.0, 24.0, 26.0], after=[])
    assert alone["in_trial_rate_bracketed"] == pytest.approx(20 / 26)


def test_summary_reads_both_sides_against_their_brackets() -> None:
    runs = [
        {**_run("ray_asha", 1, 0.6), "in_trial_rate": 0.9, "in_trial_rate_bracketed": 0.95},
        {**_run("searchlab", 1, 0.5), "in_trial_rate_bracketed": 0.98},
        {**_run("searchlab", 1, 0.5), "in_trial_rate_bracketed": 1.02},
    ]
    summary = _asha_figures._summary(runs)
    assert summary["in_search_over_in_process_bracketed"] == pytest.approx(1.0)
    assert summary["ray_in_trial_rate_bracketed"] == pytest.approx(0.95)
    assert summary["ray_in_trial_rate"] == pytest.approx(0.9)


def test_who_goes_first_alternates_between_rounds() -> None:
    sides = ["ray_asha", "searchlab", "searchlab_at_once_checkpoints"]
    firsts = [vs_ray_asha.round_order(sides, r)[0] for r in range(4)]
    assert firsts == ["ray_asha", "searchlab_at_once_checkpoints"] * 2
    assert sorted(vs_ray_asha.round_order(sides, 1)) == sorted(sides)
    assert sides == ["ray_asha", "searchlab", "searchlab_at_once_checkpoints"]  # not reordered


def test_the_solo_loop_times_each_block_after_a_warm_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every block's rate comes back for the results (CPU, the tiny model); the solo rate is
    the best of them."""
    import pathlib

    monkeypatch.syspath_prepend(str(pathlib.Path(_asha_sides.__file__).parent / "asha_model"))
    hp = {"model": "tiny", "batch": 8, "num_workers": 0, "n_train": 64, "data": "resident"}
    got = _asha_sides._solo_blocks(hp, 3)
    assert len(got["rates"]) == _asha_sides.SOLO_BLOCKS and all(b > 0 for b in got["rates"])
    assert got["gpu_busy"] is None  # no CUDA here


def test_rays_side_saves_at_tunes_own_cadence(monkeypatch: pytest.MonkeyPatch) -> None:
    # searchlab's run environment sets a 1 s cadence for its own crash safety; Ray's side must
    # not inherit it (Tune reads the variable when its controller starts, inside fit()).
    monkeypatch.setenv("TUNE_GLOBAL_CHECKPOINT_S", "1")
    with _asha_sides._tune_checkpoint_default():
        assert "TUNE_GLOBAL_CHECKPOINT_S" not in os.environ
    assert os.environ["TUNE_GLOBAL_CHECKPOINT_S"] == "1"
