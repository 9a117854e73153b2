"""Trials that fail, fail once, or reject their hyperparameters, on the shared Ray instance."""

from __future__ import annotations

import pathlib
from typing import Any

import pandas as pd
import pytest
import yaml
from toy_experiment import TOY_MODEL_DIR, toy_config

import searchlab
from searchlab.cli import main

pytestmark = pytest.mark.ray


def _run(config: dict[str, Any], storage: pathlib.Path) -> searchlab.Results:
    lines: list[str] = []
    return searchlab.run(config, model_dir=TOY_MODEL_DIR, storage_path=storage, echo=lines.append)


def test_a_trial_that_always_raises_errors_and_the_others_complete(
    ray_session: Any, tmp_path: pathlib.Path
) -> None:
    config = toy_config(
        "always-fails",
        # batch 1000 is never reached; batch 2 raises on every try
        hyperparameters={"fail_at_batch": {"type": "categorical", "vals": [1000, 2, 1001]}},
        searcher={"name": "grid"},
        max_restarts=1,
    )
    results = _run(config, tmp_path)
    trials = results.trials.set_index("fail_at_batch")
    assert trials["state"].to_dict() == {1000: "COMPLETED", 2: "ERRORED", 1001: "COMPLETED"}
    failed = trials.loc[2]
    assert failed["restarts"] == 1
    assert 'toy_model_def.py", line' in failed["error"]  # the traceback, down to the user's code
    assert "in train_batch" in failed["error"]
    assert "RuntimeError: injected failure at batch 2" in failed["error"]
    assert "\x1b[" not in failed["error"]  # no terminal colour codes in the stored text
    assert pd.isna(failed["best_validation_loss"])  # it never validated
    for fine in (1000, 1001):
        assert trials.loc[fine, "batches"] == 4
        assert pd.isna(trials.loc[fine, "error"])
    assert results.best_trial()["fail_at_batch"] in (1000, 1001)
    reported = set(results.metrics.loc[results.metrics["group"] == "validation", "trial_id"])
    assert reported == set(trials.loc[[1000, 1001], "trial_id"])
    again = searchlab.load_results(tmp_path / "always-fails")
    assert again.trials.set_index("fail_at_batch")["state"].to_dict() == trials["state"].to_dict()


def test_a_failed_trial_restarts_from_its_latest_checkpoint(
    ray_session: Any, tmp_path: pathlib.Path
) -> None:
    marker = tmp_path / "failed-once"
    config = toy_config(
        "fails-once",
        hyperparameters={"fail_at_batch": 5, "fail_marker": str(marker)},
        searcher={"max_length": {"batches": 8}},
        scheduling_unit=1,
        min_checkpoint_period={"batches": 2},  # checkpoints at 2 and 4; batch index 5 fails once
        max_restarts=1,
    )
    results = _run(config, tmp_path)
    assert marker.read_text() == "5"  # the failure did happen
    trial = results.trials.iloc[0]
    assert (trial["state"], trial["restarts"], trial["batches"]) == ("COMPLETED", 1, 8)
    assert (pathlib.Path(trial["checkpoint"]) / "state-dict.pth").is_file()
    training = results.all_reports[results.all_reports["group"] == "training"]
    batches = training["batches"].tolist()
    restart = next((i for i in range(1, len(batches)) if batches[i] <= batches[i - 1]), None)
    assert restart is not None, f"no restart in the training reports {batches}"
    before, after = batches[:restart], batches[restart:]
    assert before == [1, 2, 3, 4, 5]  # reported up to the failure in the 6th batch
    assert after == [5, 6, 7, 8]  # resumed after the checkpoint at batch 4, not from batch 0
    losses = training["loss"].tolist()
    assert losses[restart] == pytest.approx(losses[4], rel=1e-6)  # batch 5 retrained identically
    assert training["superseded"].tolist() == [False] * 4 + [True] + [False] * 4
    history = results.metrics[results.metrics["group"] == "training"]
    assert history["batches"].tolist() == [1, 2, 3, 4, 5, 6, 7, 8]  # no batch reported twice


def test_invalid_hyperparameters_are_replaced_in_a_random_search(
    ray_session: Any, tmp_path: pathlib.Path
) -> None:
    config = toy_config(
        "invalid-hp",
        hyperparameters={"invalid": {"type": "categorical", "vals": [True, False]}},
        searcher={"name": "random", "max_trials": 3, "max_length": {"batches": 2}},
        reproducibility={"experiment_seed": 1},  # draws at least one invalid trial
    )
    results = _run(config, tmp_path)
    trials = results.trials
    invalid = trials[trials["invalid"]]
    valid = trials[~trials["invalid"]]
    assert len(invalid) >= 1, "the seed must draw an invalid trial for this test to mean anything"
    assert len(valid) == 3
    assert set(valid["state"]) == {"COMPLETED"}
    assert set(invalid["state"]) == {"INVALID_HP"}
    assert invalid["error"].str.startswith("InvalidHP: this hyperparameter combination").all()
    assert invalid["checkpoint"].isna().all()
    assert set(results.metrics["trial_id"]) == set(valid["trial_id"])
    assert results.best_trial()["trial_id"] in set(valid["trial_id"])


@pytest.mark.ray
@pytest.mark.parametrize("where", ["init", "train"])
def test_a_trial_definition_mistake_stops_the_experiment_once_without_retries(
    where: str, ray_session: Any, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "attempts.log"
    config = toy_config(
        f"misuse-{where}",
        hyperparameters={"misuse_in": where, "fail_log": str(log)},
        max_restarts=3,  # a transient failure would be retried three times
    )
    path = tmp_path / "misuse.yaml"
    path.write_text(yaml.safe_dump(config))
    args = ["run", str(path), str(TOY_MODEL_DIR), "--storage-path", str(tmp_path / "runs")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert err[0].startswith(
        "searchlab: error: toy_model_def:ToyModelTrial: hyperparameter 'no_such_hparam' is not "
        "defined; defined ones are ['fail_log', 'global_batch_size', 'misuse_in']"
    ), err[0]
    assert log.read_text().split() == [f"misuse-{where}"]  # tried once, never retried
