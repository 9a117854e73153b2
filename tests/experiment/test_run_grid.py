"""End to end on the shared Ray instance: a grid search, its Results, and seeded random search."""

from __future__ import annotations

import io
import itertools
import json
import pathlib
import shutil
from typing import Any

import pandas as pd
import pytest
import torch
from toy_experiment import TOY_ENTRYPOINT, TOY_MODEL_DIR, toy_config

import searchlab
from searchlab.cli import main
from searchlab.pytorch import load_trial_class

pytestmark = pytest.mark.ray

# The grid of SPEC.md section 2, per leaf; keys in sorted order, the first one varies slowest.
GRID_SPACE = {
    "activation": {"type": "categorical", "vals": ["tanh", "relu"]},
    "dropout": {"type": "double", "minval": 0.0, "maxval": 0.2, "count": 1},
    "global_batch_size": 16,
    "hidden": {"type": "int", "minval": 2, "maxval": 7, "count": 3},
    "optimizer": {
        "lr": {"type": "log", "base": 10, "minval": -2, "maxval": -1, "count": 2},
        "momentum": {"type": "const", "val": 0.9},
    },
}
HP_COLUMNS = [
    "activation",
    "dropout",
    "global_batch_size",
    "hidden",
    "optimizer.lr",
    "optimizer.momentum",
]
EXPECTED_GRID = list(
    itertools.product(
        ["tanh", "relu"],  # categorical: vals in their order
        [0.1],  # double, count 1: the midpoint
        [16],  # a plain scalar is a constant
        [2, 5, 7],  # int 2..7, count 3: 2 + 2.5 = 4.5 rounds half away from zero to 5
        [0.01, 0.1],  # log base 10, -2..-1, count 2
        [0.9],  # const
    )
)
MAX_BATCHES = 6  # 4 batches an epoch (64 records, batch 16)


@pytest.fixture(scope="module")
def grid_run(ray_session: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    storage = tmp_path_factory.mktemp("grid")
    config = toy_config(
        "toy-grid",
        hyperparameters=GRID_SPACE,
        searcher={"name": "grid", "max_length": {"batches": MAX_BATCHES}},
        min_validation_period={"batches": 3},
    )
    lines: list[str] = []
    results = searchlab.run(
        config, model_dir=TOY_MODEL_DIR, storage_path=storage, echo=lines.append
    )
    return {"results": results, "lines": lines, "dir": storage / "toy-grid"}


def _hp_rows(trials: pd.DataFrame) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in trials[HP_COLUMNS].itertuples(index=False)]


def test_every_grid_point_runs_once_in_spec_order(grid_run: dict[str, Any]) -> None:
    trials = grid_run["results"].trials
    rows = _hp_rows(trials)
    assert len(rows) == len(EXPECTED_GRID) == 12
    for got, want in zip(rows, EXPECTED_GRID):
        assert _same_point(got, want), (got, want)
    assert trials["trial_id"].is_unique


def _same_point(got: tuple[Any, ...], want: tuple[Any, ...]) -> bool:
    return all(g == pytest.approx(w) if isinstance(w, float) else g == w for g, w in zip(got, want))


def test_trials_frame_has_one_completed_row_per_trial(grid_run: dict[str, Any]) -> None:
    trials = grid_run["results"].trials
    columns = list(trials.columns)
    assert columns[:2] == ["trial_id", "state"]
    assert columns[2 : 2 + len(HP_COLUMNS)] == HP_COLUMNS
    assert columns[2 + len(HP_COLUMNS) : 6 + len(HP_COLUMNS)] == [
        "batches",
        "best_validation_loss",
        "last_validation_loss",
        "checkpoint",
    ]
    assert set(trials["state"]) == {"COMPLETED"}
    assert set(trials["batches"]) == {MAX_BATCHES}
    assert set(trials["restarts"]) == {0}
    assert (trials["best_validation_loss"] <= trials["last_validation_loss"]).all()


def test_checkpoint_column_is_the_best_checkpoint(grid_run: dict[str, Any]) -> None:
    trials = grid_run["results"].trials
    for row in trials.itertuples(index=False):
        checkpoint = pathlib.Path(row.checkpoint)
        assert (checkpoint / "state-dict.pth").is_file(), checkpoint
        assert checkpoint.parent == grid_run["dir"] / row.trial_id
        saved = json.loads((checkpoint / "metadata.json").read_text())
        assert saved["metrics"]["validation_loss"] == pytest.approx(row.best_validation_loss)


def test_metrics_frame_holds_every_report(grid_run: dict[str, Any]) -> None:
    results = grid_run["results"]
    metrics = results.metrics
    assert list(metrics.columns[:4]) == ["trial_id", "group", "batches", "epochs"]
    assert {"loss", "validation_loss", "accuracy"} <= set(metrics.columns)
    assert set(metrics["group"]) == {"training", "validation"}
    assert set(metrics["trial_id"]) == set(results.trials["trial_id"])
    for (_, group), reports in metrics.groupby(["trial_id", "group"]):
        batches = reports["batches"].tolist()
        assert batches == sorted(set(batches)), batches  # strictly increasing
        expected = [2, 4, 6] if group == "training" else [3, 6]
        assert batches == expected
        assert reports["epochs"].tolist() == pytest.approx([b / 4 for b in batches])
    training = metrics[metrics["group"] == "training"]
    validation = metrics[metrics["group"] == "validation"]
    assert training["loss"].notna().all() and training["validation_loss"].isna().all()
    assert (
        validation["validation_loss"].notna().all() and validation["accuracy"].between(0, 1).all()
    )
    per_trial = validation.groupby("trial_id")["validation_loss"]
    trials = results.trials.set_index("trial_id")
    assert per_trial.min().to_dict() == pytest.approx(trials["best_validation_loss"].to_dict())
    assert per_trial.last().to_dict() == pytest.approx(trials["last_validation_loss"].to_dict())


def test_best_trial_and_best_checkpoint(grid_run: dict[str, Any]) -> None:
    results = grid_run["results"]
    trials = results.trials
    best = results.best_trial()
    assert best["trial_id"] == trials.loc[trials["best_validation_loss"].idxmin(), "trial_id"]
    assert best["best_validation_loss"] == trials["best_validation_loss"].min()
    assert results.best_checkpoint() == best["checkpoint"]


def test_load_trial_has_the_checkpoint_weights(grid_run: dict[str, Any]) -> None:
    results = grid_run["results"]
    best = results.best_trial()
    trial = results.load_trial(best["trial_id"], trusted=True)  # the toy model is ours
    state = torch.load(
        pathlib.Path(best["checkpoint"]) / "state-dict.pth", map_location="cpu", weights_only=False
    )
    saved = state["models_state_dict"][0]
    loaded = trial.model.state_dict()
    assert saved.keys() == loaded.keys()
    for key, tensor in saved.items():
        assert torch.equal(loaded[key].cpu(), tensor), key
    assert trial.model[0].out_features == best["hidden"]  # built with that trial's hyperparameters
    with pytest.raises(searchlab.SearchlabError, match=r"no trial 'nope'"):
        results.load_trial("nope")


def test_load_results_reads_back_the_same_frames(grid_run: dict[str, Any]) -> None:
    results = grid_run["results"]
    again = searchlab.load_results(grid_run["dir"])
    pd.testing.assert_frame_equal(again.trials, results.trials)
    pd.testing.assert_frame_equal(again.metrics, results.metrics)


def test_run_prints_progress_and_a_summary(grid_run: dict[str, Any]) -> None:
    text = "\n".join(grid_run["lines"])
    best = grid_run["results"].best_trial()
    for trial_id in grid_run["results"].trials["trial_id"]:
        assert f"trial {trial_id} started at batch 0" in text
        assert f"trial {trial_id} finished at batch {MAX_BATCHES}" in text
    assert f"best trial: {best['trial_id']}" in text
    assert f"checkpoint: {best['checkpoint']}" in text
    assert f"experiment directory: {grid_run['dir']}" in text


def test_results_cli_prints_the_trials_table_as_csv(
    grid_run: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["results", str(grid_run["dir"]), "--csv"]) == 0
    out = capsys.readouterr().out
    table = pd.read_csv(io.StringIO(out))
    trials = grid_run["results"].trials
    assert list(table.columns) == list(trials.columns)
    assert table["trial_id"].tolist() == trials["trial_id"].tolist()
    assert table["state"].tolist() == ["COMPLETED"] * 12
    assert table["hidden"].tolist() == trials["hidden"].tolist()
    assert table["best_validation_loss"].tolist() == pytest.approx(
        trials["best_validation_loss"].tolist()
    )


def test_results_cli_on_a_directory_without_an_experiment(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["results", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        f"searchlab: error: {tmp_path}: not a searchlab experiment directory (no experiment.json)"
    )


def test_results_of_an_experiment_that_died_before_its_first_trial(
    grid_run: dict[str, Any], tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    died = tmp_path / "died"
    died.mkdir()
    shutil.copy(grid_run["dir"] / "experiment.json", died)  # all a driver writes before trials
    results = searchlab.load_results(died)
    assert results.trials.empty and results.metrics.empty
    assert list(results.trials.columns[:6]) == [
        "trial_id",
        "state",
        "batches",
        "best_validation_loss",
        "last_validation_loss",
        "checkpoint",
    ]
    with pytest.raises(searchlab.SearchlabError, match=r"no trial reported validation_loss yet"):
        results.best_trial()
    assert "trials: none yet" in results.summary()
    assert main(["results", str(died), "--csv"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("trial_id,state,batches,")


# --- seeded random search ------------------------------------------------------------------

RANDOM_SPACE = {
    "activation": {"type": "categorical", "vals": ["tanh", "relu"]},
    "dropout": {"type": "double", "minval": 0.0, "maxval": 0.5},
    "hidden": {"type": "int", "minval": 2, "maxval": 64},
    "optimizer": {"lr": {"type": "log", "base": 10, "minval": -3, "maxval": 0}},
}
RANDOM_COLUMNS = ["activation", "dropout", "hidden", "optimizer.lr", "trial_seed"]


def _random_search(seed: int, storage: pathlib.Path) -> pd.DataFrame:
    config = toy_config(
        f"random-{seed}",
        hyperparameters=RANDOM_SPACE,
        searcher={"name": "random", "max_trials": 3, "max_length": {"batches": 2}},
        reproducibility={"experiment_seed": seed},
    )
    results = searchlab.run(config, model_dir=TOY_MODEL_DIR, storage_path=storage, echo=_quiet)
    assert results.trials["state"].tolist() == ["COMPLETED"] * 3
    return results.trials[RANDOM_COLUMNS]


def _quiet(line: str) -> None:
    pass


def test_random_search_is_reproducible_from_its_seed(
    ray_session: Any, tmp_path: pathlib.Path
) -> None:
    first = _random_search(7, tmp_path / "a")
    again = _random_search(7, tmp_path / "b")
    other = _random_search(8, tmp_path / "c")
    pd.testing.assert_frame_equal(again, first)
    assert first["optimizer.lr"].between(1e-3, 1.0).all()
    assert first["hidden"].between(2, 64).all()
    assert first["trial_seed"].is_unique
    assert not other.drop(columns="trial_seed").equals(first.drop(columns="trial_seed"))
    assert set(other["trial_seed"]).isdisjoint(first["trial_seed"])


# --- the best checkpoint is not the latest ---------------------------------------------------


def test_checkpoint_is_the_best_one_not_the_latest(
    ray_session: Any, tmp_path: pathlib.Path
) -> None:
    config = toy_config(
        "gets-worse",
        hyperparameters={"worse_after_batch": 3},  # validation loss +1.0 after batch 3
        searcher={"max_length": {"batches": 6}},
        min_validation_period={"batches": 3},
    )
    results = searchlab.run(config, model_dir=TOY_MODEL_DIR, storage_path=tmp_path, echo=_quiet)
    trial = results.trials.iloc[0]
    validation = results.metrics[results.metrics["group"] == "validation"]
    at = dict(zip(validation["batches"], validation["validation_loss"]))
    assert sorted(at) == [3, 6]
    assert trial["best_validation_loss"] == pytest.approx(at[3])
    assert trial["last_validation_loss"] == pytest.approx(at[6])
    assert at[6] > at[3]
    best = pathlib.Path(results.best_checkpoint())
    assert json.loads((best / "metadata.json").read_text())["batches_trained"] == 3
    saved = torch.load(best / "state-dict.pth", map_location="cpu", weights_only=False)
    trial_class = load_trial_class(TOY_ENTRYPOINT, TOY_MODEL_DIR)
    loaded = results.load_trial(trial["trial_id"], trial_class=trial_class).model.state_dict()
    for key, tensor in saved["models_state_dict"][0].items():
        assert torch.equal(loaded[key].cpu(), tensor), key
