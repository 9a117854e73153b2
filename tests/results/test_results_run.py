"""Results of a real (tiny) grid search: the same frames as before, the new views, loading."""

from __future__ import annotations

import json
import pathlib
import shutil
from typing import Any

import pandas as pd
import pytest
import torch
from experiment_files import reference_reports
from toy_experiment import TOY_ENTRYPOINT, TOY_MODEL_DIR, toy_config

import searchlab
from searchlab.pytorch import load_trial_class

pytestmark = pytest.mark.ray

SPACE = {
    "global_batch_size": 16,
    "hidden": {"type": "int", "minval": 2, "maxval": 8, "count": 2},
    "optimizer": {"lr": {"type": "categorical", "vals": [0.01, 0.3]}},
}


@pytest.fixture(scope="module")
def run(ray_session: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    storage = tmp_path_factory.mktemp("results")
    config = toy_config(
        "results-grid",
        hyperparameters=SPACE,
        searcher={"name": "grid", "max_length": {"batches": 6}},
        min_validation_period={"batches": 3},
    )
    results = searchlab.run(config, model_dir=TOY_MODEL_DIR, storage_path=storage, echo=_quiet)
    return {"results": results, "dir": storage / "results-grid"}


def _quiet(line: str) -> None:
    pass


def test_frames_match_the_quadratic_reading(run: dict[str, Any]) -> None:
    results = run["results"]
    reference = reference_reports(run["dir"], results.trials["trial_id"].tolist())
    pd.testing.assert_frame_equal(
        results.all_reports.drop(columns=["timestamp", "elapsed_s"]), reference
    )
    assert len(results.metrics) == 4 * 5  # 3 training and 2 validation reports a trial


def test_reports_have_their_wall_clock_time(run: dict[str, Any]) -> None:
    metrics = run["results"].metrics
    written = [json.loads(line)["timestamp"] for line in _lines(run["dir"])]
    assert metrics["timestamp"].min() == pd.Timestamp(min(written), unit="s", tz="UTC")
    assert metrics["elapsed_s"].min() == 0.0
    expected = (metrics["timestamp"] - metrics["timestamp"].min()).dt.total_seconds()
    assert metrics["elapsed_s"].tolist() == expected.tolist()


def _lines(exp_dir: pathlib.Path) -> list[str]:
    return [line for f in exp_dir.glob("*/result.json") for line in f.read_text().splitlines()]


def test_learning_curves_hold_every_validation(run: dict[str, Any]) -> None:
    results = run["results"]
    curves = results.learning_curves()
    assert curves.index.tolist() == [3, 6]
    assert curves.columns.tolist() == results.trials["trial_id"].tolist()
    validation = results.metrics[results.metrics["group"] == "validation"]
    for row in validation.itertuples(index=False):
        assert curves.loc[row.batches, row.trial_id] == row.validation_loss
    assert results.learning_curves("loss").index.tolist() == [2, 4, 6]


def test_best_trials_and_importance(run: dict[str, Any]) -> None:
    results = run["results"]
    ranked = results.best_trials(4)
    assert ranked["best_validation_loss"].is_monotonic_increasing
    assert ranked.iloc[0]["trial_id"] == results.best_trial()["trial_id"]
    pytest.importorskip("sklearn")
    importance = results.hyperparameter_importance()
    assert sorted(importance.index) == ["hidden", "optimizer.lr"]
    assert importance.sum() == pytest.approx(1.0)


def _assert_weights(trial: Any, checkpoint: str) -> None:
    saved = torch.load(pathlib.Path(checkpoint) / "state-dict.pth", weights_only=False)
    loaded = trial.model.state_dict()
    for key, tensor in saved["models_state_dict"][0].items():
        assert torch.equal(loaded[key].cpu(), tensor), key


def test_load_trial_with_the_users_class_or_trusted(run: dict[str, Any]) -> None:
    results = run["results"]
    best = results.best_trial()
    trial_class = load_trial_class(TOY_ENTRYPOINT, TOY_MODEL_DIR)
    _assert_weights(
        results.load_trial(best["trial_id"], trial_class=trial_class), best["checkpoint"]
    )
    _assert_weights(results.load_trial(best["trial_id"], trusted=True), best["checkpoint"])
    with pytest.raises(searchlab.SearchlabError, match=r"pass trial_class=YourTrial, or trusted"):
        results.load_trial(best["trial_id"])


@pytest.mark.parametrize("absolute", [False, True])
def test_a_copied_experiment_loads_its_own_checkpoints(
    run: dict[str, Any], tmp_path: pathlib.Path, absolute: bool
) -> None:
    first = shutil.copytree(run["dir"], tmp_path / "first")
    if absolute:  # as searchlab wrote trials.json before: absolute paths into `first`
        data = json.loads((first / "trials.json").read_text())
        for rec in data["trials"]:
            for key in ("checkpoint", "latest_checkpoint"):
                rec[key] = str(first / rec[key]) if rec[key] else None
        (first / "trials.json").write_text(json.dumps(data))
    copy = shutil.copytree(first, tmp_path / "copy")
    shutil.rmtree(first)
    results = searchlab.load_results(copy)
    for checkpoint in results.trials["checkpoint"]:
        assert pathlib.Path(checkpoint).parent.parent == copy
    best = results.best_trial()
    trial_class = load_trial_class(TOY_ENTRYPOINT, TOY_MODEL_DIR)
    _assert_weights(
        results.load_trial(best["trial_id"], trial_class=trial_class), best["checkpoint"]
    )
    pd.testing.assert_frame_equal(results.metrics, run["results"].metrics)
