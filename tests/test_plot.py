"""``searchlab plot DIR``: the PNGs, and the search history they are drawn from.

The experiment directories are simulated searches written in the driver's and Tune's formats
(``tests/fixtures/synthetic_search.py``), so what each plot must show is known exactly.
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pytest
from synthetic_search import (
    ERRORED,
    RUNG_ENDS,
    Story,
    write_asha_search,
    write_grid_search,
)

import searchlab
from searchlab._search_history import VisitKind, best_so_far, build_history, rung_occupancy
from searchlab.cli import main

matplotlib = pytest.importorskip("matplotlib")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def asha(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, Story]:
    exp_dir = tmp_path_factory.mktemp("asha") / "search"
    return exp_dir, write_asha_search(exp_dir)


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, Story]:
    exp_dir = tmp_path_factory.mktemp("grid") / "search"
    return exp_dir, write_grid_search(exp_dir)


# --- the history ------------------------------------------------------------------------------


def test_rung_visits_say_who_was_promoted_stopped_waiting_or_finished(asha: Any) -> None:
    exp_dir, story = asha
    history = build_history(searchlab.load_results(exp_dir))
    assert history.rung_ends == {0: [float(e) for e in RUNG_ENDS]} and history.has_rungs
    visits = history.visits
    for rung, trial_ids in story.visits.items():
        at_rung = visits[visits["rung"] == rung]
        assert sorted(at_rung["trial_id"]) == sorted(trial_ids)
        assert (at_rung["batches"] == RUNG_ENDS[rung]).all()
    kinds = dict(zip(zip(visits["trial_id"], visits["rung"]), visits["kind"]))
    for rung, trial_ids in story.promoted.items():
        assert {kinds[(t, rung)] for t in trial_ids} == {VisitKind.PROMOTED}
    top = len(RUNG_ENDS) - 1
    assert {kinds[(t, top)] for t in story.visits[top]} == {VisitKind.FINISHED}
    assert kinds[(story.paused, 0)] == VisitKind.WAITING
    assert ERRORED not in set(visits["trial_id"])  # it never validated
    for rung in range(top):
        stopped = {t for (t, r), kind in kinds.items() if kind == VisitKind.STOPPED and r == rung}
        expected = set(story.visits[rung]) - set(story.promoted[rung]) - {story.paused}
        assert stopped == expected and stopped
    promoted = visits[visits["kind"] == VisitKind.PROMOTED]
    assert (promoted["resumed_s"] >= promoted["elapsed_s"]).all()
    assert visits.loc[visits["kind"] != VisitKind.PROMOTED, "resumed_s"].isna().all()


def test_best_so_far_only_improves_and_counts_all_training(asha: Any) -> None:
    exp_dir, story = asha
    frame = best_so_far(build_history(searchlab.load_results(exp_dir)))
    assert (np.diff(frame["best"]) <= 0).all()
    assert (np.diff(frame["total_batches"]) >= 0).all()
    assert frame["best"].iloc[-1] == pytest.approx(story.best[story.best_trial])
    # The errored trial's 2 batches count too; nothing is counted twice.
    assert frame["total_batches"].iloc[-1] <= sum(story.batches.values())
    assert frame["total_batches"].iloc[-1] >= sum(story.batches.values()) - story.batches[ERRORED]


def test_rung_occupancy_ends_with_every_visit(asha: Any) -> None:
    exp_dir, story = asha
    frame = rung_occupancy(build_history(searchlab.load_results(exp_dir)))
    final = frame.groupby("rung")["trials"].max().to_dict()
    assert final == {rung: len(trials) for rung, trials in story.visits.items()}
    for _, rows in frame.groupby("rung"):
        assert rows["trials"].iloc[0] == 0 and (np.diff(rows["elapsed_s"]) >= 0).all()


def test_a_grid_has_one_rung_at_its_full_length(grid: Any) -> None:
    exp_dir, story = grid
    history = build_history(searchlab.load_results(exp_dir))
    assert history.rung_ends == {0: [16.0]} and not history.has_rungs
    assert set(history.visits["kind"]) == {VisitKind.FINISHED}
    assert sorted(history.visits["trial_id"]) == sorted(story.trial_ids)


# --- the PNGs ---------------------------------------------------------------------------------


def _image(path: pathlib.Path) -> np.ndarray:
    assert path.read_bytes()[:8] == PNG_MAGIC
    return matplotlib.image.imread(path)


def test_plot_cli_writes_the_three_pngs_of_an_adaptive_search(
    asha: Any, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exp_dir, _ = asha
    assert main(["plot", str(exp_dir), "--out", str(tmp_path / "png")]) == 0
    names = ["learning_curves.png", "best_so_far.png", "rung_ladder.png"]
    assert capsys.readouterr().out.splitlines() == [str(tmp_path / "png" / n) for n in names]
    for name in names:
        image = _image(tmp_path / "png" / name)
        assert image.shape[0] > 300 and image.shape[1] > 500
        assert image[..., :3].std() > 0.05  # drawn on, not a blank canvas


def test_plots_go_into_the_experiment_directory_by_default(grid: Any) -> None:
    exp_dir, _ = grid
    assert main(["plot", str(exp_dir)]) == 0
    # A grid has no rungs to climb: no ladder.
    assert sorted(p.name for p in (exp_dir / "plots").iterdir()) == [
        "best_so_far.png",
        "learning_curves.png",
    ]
    assert searchlab.load_results(exp_dir).trials["trial_id"].tolist() == ["g0", "g1", "g2", "g3"]


def test_learning_curves_mark_each_rung_decision(asha: Any, tmp_path: pathlib.Path) -> None:
    from searchlab import _plot

    exp_dir, story = asha
    history = build_history(searchlab.load_results(exp_dir))
    figure = _plot._learning_curves(_plot._pyplot(), history, "test")
    by_batches = figure.axes[0]
    points = {c.get_label(): len(c.get_offsets()) for c in by_batches.collections if c.get_label()}
    promoted = sum(len(t) for t in story.promoted.values())
    assert points["paused at a rung end, then promoted"] == promoted
    assert points["paused at a rung end, waiting"] == 1
    assert points["trained to the full length"] == len(story.visits[len(RUNG_ENDS) - 1])
    best = [
        line for line in by_batches.lines if line.get_label() == f"best trial {story.best_trial}"
    ]
    assert len(best) == 1
    pauses = [line for line in figure.axes[1].lines if line.get_linewidth() == 5]
    assert len(pauses) == sum(
        1 for _, v in history.visits.iterrows() if v["resumed_s"] > v["elapsed_s"]
    )
    _plot._pyplot().close(figure)


def test_an_experiment_without_reports_still_plots(tmp_path: pathlib.Path) -> None:
    exp_dir = tmp_path / "search"
    write_grid_search(exp_dir)
    for result in exp_dir.glob("*/result.json"):
        result.write_text("")  # the driver died before any trial reported
    assert main(["plot", str(exp_dir), "--out", str(tmp_path / "png")]) == 0
    assert _image(tmp_path / "png" / "learning_curves.png").shape[0] > 300


def test_plot_of_a_directory_without_an_experiment_is_a_one_line_error(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        f"searchlab: error: {tmp_path}: not a searchlab experiment directory (no experiment.json)"
    )
