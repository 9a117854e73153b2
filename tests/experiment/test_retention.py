"""checkpoint_storage retention: deletes only what no rule keeps, never a trial's newest."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest
from toy_experiment import TOY_MODEL_DIR, toy_config

import searchlab
from searchlab.experiment._retention import (
    RetentionPolicy,
    SavedCheckpoint,
    checkpoints_to_delete,
)


def _ckpts(
    metrics: list[float | None], trial: str = "t", finished: bool = False
) -> list[SavedCheckpoint]:
    return [SavedCheckpoint(trial, f"{trial}/{i}", i, m, finished) for i, m in enumerate(metrics)]


@pytest.mark.parametrize("smaller_is_better", [True, False])
def test_keeps_latest_and_best_of_each_trial(smaller_is_better: bool) -> None:
    ckpts = _ckpts([0.5, 0.1, 0.9, None])
    best = "t/1" if smaller_is_better else "t/2"
    policy = RetentionPolicy(1, 1, 0, smaller_is_better)
    deleted = {c.path for c in checkpoints_to_delete(ckpts, policy)}
    assert deleted == {"t/0", "t/1", "t/2", "t/3"} - {best, "t/3"}


def test_a_running_trial_keeps_its_newest_checkpoint_even_with_latest_zero() -> None:
    policy = RetentionPolicy(save_trial_latest=0, save_trial_best=0, save_experiment_best=0)
    running = _ckpts([0.3, 0.2], finished=False)
    assert [c.path for c in checkpoints_to_delete(running, policy)] == ["t/0"]
    finished = _ckpts([0.3, 0.2], finished=True)
    assert [c.path for c in checkpoints_to_delete(finished, policy)] == ["t/0", "t/1"]


def test_experiment_best_keeps_the_best_over_all_trials() -> None:
    ckpts = _ckpts([0.4, 0.3], "a", True) + _ckpts([0.1, 0.2], "b", True)
    policy = RetentionPolicy(save_trial_latest=0, save_trial_best=0, save_experiment_best=2)
    kept = {c.path for c in ckpts} - {c.path for c in checkpoints_to_delete(ckpts, policy)}
    assert kept == {"b/0", "b/1"}


@pytest.mark.ray
def test_search_deletes_only_what_the_policy_lets_go(
    ray_session: Any, tmp_path: pathlib.Path
) -> None:
    config = toy_config(
        "retention",
        hyperparameters={"worse_after_batch": 2},  # validation is best at batch 2, then worse
        searcher={"max_length": {"batches": 8}},
        min_validation_period={"batches": 1},
        checkpoint_policy="all",
        checkpoint_storage={
            "save_trial_latest": 1,
            "save_trial_best": 1,
            "save_experiment_best": 0,
        },
    )
    results = searchlab.run(
        config, model_dir=TOY_MODEL_DIR, storage_path=tmp_path, echo=lambda _: None
    )
    trial = results.trials.iloc[0]
    trial_dir = results.experiment_dir / trial["trial_id"]
    left = sorted(p.name for p in trial_dir.glob("checkpoint_*"))
    assert len(left) == 2  # the best (batch 2) and the newest (batch 8) of eight
    best = pathlib.Path(trial["checkpoint"])
    assert best.name in left and (best / "state-dict.pth").is_file()
    batches = sorted(
        json.loads((trial_dir / n / "metadata.json").read_text())["batches_trained"] for n in left
    )
    assert batches == [2, 8]
