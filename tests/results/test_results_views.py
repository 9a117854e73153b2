"""Learning curves, the best trials and hyperparameter importance, on written experiments."""

from __future__ import annotations

import math
import pathlib
import random

import pandas as pd
import pytest
from experiment_files import record, write_experiment, write_trial

import searchlab


def _curves_experiment(tmp_path: pathlib.Path) -> searchlab.Results:
    restarted = [  # trained to 4, restored from 2: its reports past 2 are redone
        {"group": "training", "batches": 2, "epochs": 0.5, "loss": 0.9, "lr_now": 0.1},
        {"group": "validation", "batches": 2, "epochs": 0.5, "validation_loss": 0.8},
        {"group": "training", "batches": 4, "epochs": 1.0, "loss": 0.7, "lr_now": 0.1},
        {"group": "validation", "batches": 4, "epochs": 1.0, "validation_loss": 0.65},
        {"group": "training", "batches": 4, "epochs": 1.0, "loss": 0.6, "lr_now": 0.1},
        {"group": "validation", "batches": 4, "epochs": 1.0, "validation_loss": 0.5},
    ]
    other = [
        {"group": "training", "batches": 2, "epochs": 0.5, "loss": 1.0, "accuracy": 0.1},
        {
            "group": "validation",
            "batches": 2,
            "epochs": 0.5,
            "validation_loss": 0.9,
            "accuracy": 0.2,
        },
    ]
    write_trial(tmp_path, "r", restarted, {})
    write_trial(tmp_path, "o", other, {})
    write_experiment(tmp_path, [record("r", {}), record("o", {})])
    return searchlab.load_results(tmp_path)


def test_learning_curves_of_the_searcher_metric(tmp_path: pathlib.Path) -> None:
    curves = _curves_experiment(tmp_path).learning_curves()
    assert curves.index.name == "batches" and curves.columns.name == "trial_id"
    assert curves.index.tolist() == [2, 4]
    assert curves.columns.tolist() == ["r", "o"]
    assert curves["r"].tolist() == [0.8, 0.5]  # the redone validation, not the rolled-back one
    assert curves["o"].iloc[0] == 0.9 and math.isnan(curves["o"].iloc[1])


def test_learning_curves_of_training_metrics(tmp_path: pathlib.Path) -> None:
    results = _curves_experiment(tmp_path)
    loss = results.learning_curves("loss")
    assert loss["r"].tolist() == [0.9, 0.6]
    assert loss["o"].iloc[0] == 1.0 and math.isnan(loss["o"].iloc[1])
    assert results.learning_curves("lr_now").columns.tolist() == ["r"]  # only training has it
    validation = results.learning_curves("accuracy", group="validation")
    assert validation["o"].tolist() == [0.2]


def test_learning_curves_refuse_what_they_cannot_show(tmp_path: pathlib.Path) -> None:
    results = _curves_experiment(tmp_path)
    with pytest.raises(searchlab.SearchlabError, match=r"both training and validation .*accur"):
        results.learning_curves("accuracy")
    with pytest.raises(searchlab.SearchlabError, match=r"no report holds the metric 'acc'; the re"):
        results.learning_curves("acc")
    with pytest.raises(searchlab.SearchlabError, match=r"`group` is 'test', but must be one of"):
        results.learning_curves(group="test")


def test_learning_curves_before_any_validation(tmp_path: pathlib.Path) -> None:
    write_experiment(tmp_path, [record("a", {})])
    curves = searchlab.load_results(tmp_path).learning_curves()
    assert curves.empty and curves.index.name == "batches"


@pytest.mark.parametrize("smaller_is_better", [True, False])
def test_best_trials_rank_by_the_searcher_metric(
    tmp_path: pathlib.Path, smaller_is_better: bool
) -> None:
    metrics = {"a": 0.5, "b": None, "c": 0.2, "d": 0.9, "e": 0.5}
    records = [record(t, {}, best_metric=m) for t, m in metrics.items()]
    write_experiment(tmp_path, records, smaller_is_better=smaller_is_better)
    results = searchlab.load_results(tmp_path)
    ranked = results.best_trials(n=10)["trial_id"].tolist()
    assert ranked == (["c", "a", "e", "d", "b"] if smaller_is_better else ["d", "a", "e", "c", "b"])
    assert results.best_trials(2)["trial_id"].tolist() == ranked[:2]
    assert results.best_trial()["trial_id"] == ranked[0]
    with pytest.raises(searchlab.SearchlabError, match=r"The value of `n` is 0, but must be"):
        results.best_trials(0)


def _importance_experiment(
    tmp_path: pathlib.Path, n: int, hparams: dict | None = None
) -> searchlab.Results:
    rng = random.Random(0)
    records = []
    for i in range(n):
        hp = {
            "activation": rng.choice(["relu", "tanh"]),
            "global_batch_size": 16,
            "hidden": rng.randint(2, 64),
            "optimizer": {"lr": 10 ** rng.uniform(-4, -1)},
        }
        metric = (math.log10(hp["optimizer"]["lr"]) + 2.5) ** 2 + 0.01 * rng.random()
        records.append(record(f"t{i:02d}", hp, best_metric=metric))
    records.append(record("never_validated", {"hidden": 3}, best_metric=None))
    write_experiment(tmp_path, records, hparams=hparams)
    return searchlab.load_results(tmp_path)


def test_hyperparameter_importance_finds_what_drives_the_metric(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("sklearn")
    results = _importance_experiment(tmp_path, 30)
    importance = results.hyperparameter_importance()
    assert importance.index.tolist()[0] == "optimizer.lr"
    assert set(importance.index) == {"optimizer.lr", "hidden", "activation"}  # no constant
    assert importance.iloc[0] > 0.5
    assert importance.sum() == pytest.approx(1.0)
    assert importance.is_monotonic_decreasing
    pd.testing.assert_series_equal(results.hyperparameter_importance(), importance)  # seeded


def test_hyperparameter_importance_needs_two_trials(tmp_path: pathlib.Path) -> None:
    results = _importance_experiment(tmp_path, 1)
    with pytest.raises(searchlab.SearchlabError, match=r"needs at least 2 trials with a finite"):
        results.hyperparameter_importance()


def test_hyperparameter_importance_needs_something_that_varies(tmp_path: pathlib.Path) -> None:
    records = [record(f"t{i}", {"lr": 0.1, "hidden": 4}, best_metric=i) for i in range(3)]
    hparams = {"lr": {"type": "categorical", "vals": [0.1, 0.2]}, "hidden": 4}
    write_experiment(tmp_path, records, hparams=hparams)
    results = searchlab.load_results(tmp_path)
    with pytest.raises(searchlab.SearchlabError, match=r"no hyperparameter varies across the 3"):
        results.hyperparameter_importance()


def test_hyperparameter_importance_needs_a_metric_that_varies(tmp_path: pathlib.Path) -> None:
    records = [record(f"t{i}", {"hidden": 2 + i}, best_metric=0.5) for i in range(3)]
    write_experiment(
        tmp_path, records, hparams={"hidden": {"type": "int", "minval": 2, "maxval": 9}}
    )
    results = searchlab.load_results(tmp_path)
    with pytest.raises(searchlab.SearchlabError, match=r"the 3 trials with a validation_loss all"):
        results.hyperparameter_importance()
