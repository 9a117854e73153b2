"""A 2-worker (gloo) data-parallel trial inside a search: paused, resumed, exact on every rank."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest
import torch

import searchlab
from searchlab.experiment._protocol import WRITING_MARKER

MODEL_DIR = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "ddp_model"
LENGTH = 20


def _config(searcher: dict[str, Any], lr: Any, gpus: float) -> dict[str, Any]:
    # One GPU per worker where 2 GPUs exist (nccl); otherwise CPU workers (gloo).
    # A CPU per worker: one 2-worker trial fills the 2-CPU test cluster, so trials run one
    # at a time and the winner pauses at its rung before it is promoted.
    resources = {"slots_per_trial": 2, "cpus_per_trial": 1}
    if gpus < 2:
        resources["gpus_per_trial"] = 0
    return {
        "name": "ddp",
        "entrypoint": "model_def:DDPTrial",
        "hyperparameters": {"global_batch_size": 16, "lr": lr},
        "searcher": {"metric": "validation_loss", "max_length": {"batches": LENGTH}, **searcher},
        "resources": resources,
        "scheduling_unit": 5,
        "max_restarts": 0,
        # Seed 0 gives the first trial lr=0.05 (it learns) and the second lr=0.0 (it cannot),
        # so the first is the one promoted at the rung; `single` gives its trial the same seed.
        "reproducibility": {"experiment_seed": 0},
    }


def _last_checkpoint(trial_dir: pathlib.Path) -> pathlib.Path:
    last = max(trial_dir.glob("checkpoint_*"))
    assert json.loads((last / "metadata.json").read_text())["batches_trained"] == LENGTH
    return last


def _final_state(checkpoint: pathlib.Path) -> tuple[dict[str, torch.Tensor], list[list[float]]]:
    state = torch.load(checkpoint / "state-dict.pth", weights_only=False)
    meta = json.loads((checkpoint / "metadata.json").read_text())
    return state["models_state_dict"][0], meta["rank_weight_sums"]


@pytest.mark.ray
@pytest.mark.slow
def test_two_worker_trial_pauses_resumes_and_matches_uninterrupted_run(
    ray_session: Any, tmp_path: pathlib.Path
) -> None:
    lines: list[str] = []
    gpus = ray_session.cluster_resources().get("GPU", 0)
    paused = searchlab.run(
        _config(
            {"name": "async_halving", "num_rungs": 2, "divisor": 2, "max_trials": 2},
            {"type": "categorical", "vals": [0.05, 0.0]},
            gpus,
        ),
        model_dir=MODEL_DIR,
        storage_path=tmp_path / "search",
        echo=lines.append,
    )
    trials = paused.trials.set_index("trial_id")
    winner = trials[trials["batches"] == LENGTH]
    assert len(winner) == 1 and winner.iloc[0]["lr"] == 0.05
    winner_id = winner.index[0]
    assert any(f"trial {winner_id} paused at batch 10" in line for line in lines)
    assert any(f"trial {winner_id} resumed at batch 10" in line for line in lines)
    reports = paused.metrics[
        (paused.metrics["trial_id"] == winner_id) & (paused.metrics["group"] == "training")
    ]
    assert list(reports["batches"]) == [5, 10, 15, 20]  # resumed, never restarted
    assert set(reports["world_size"]) == {2.0}
    # On a machine with 2 GPUs the workers train on them (nccl); elsewhere on CPU (gloo).
    assert set(reports["on_cuda"]) == {1.0 if gpus >= 2 else 0.0}
    # The winner's rung-end state was written in the background by the trainable that paused
    # it, which then ran the other trial and took the winner back: it resumed from that
    # trainable's memory (not from the file), and no write was left half done.
    resumed_from_memory = [
        line
        for line in (paused.experiment_dir / winner_id / "result.json").read_text().splitlines()
        if json.loads(line).get("searchlab_timing_resumed_from_memory") == 1.0
    ]
    assert len(resumed_from_memory) == 1
    assert not list(paused.experiment_dir.rglob(WRITING_MARKER))

    whole = searchlab.run(
        _config({"name": "single"}, 0.05, gpus),
        model_dir=MODEL_DIR,
        storage_path=tmp_path / "whole",
        echo=lines.append,
    )
    whole_ckpt = _last_checkpoint(whole.experiment_dir / whole.trials.iloc[0]["trial_id"])
    resumed_ckpt = _last_checkpoint(paused.experiment_dir / winner_id)
    weights_whole, ranks_whole = _final_state(whole_ckpt)
    weights_resumed, ranks_resumed = _final_state(resumed_ckpt)
    assert ranks_resumed[0] == ranks_resumed[1]  # both ranks hold the same weights
    assert ranks_whole[0] == ranks_whole[1]
    for name, tensor in weights_whole.items():
        assert torch.equal(tensor, weights_resumed[name]), name


@pytest.mark.ray
@pytest.mark.slow
def test_a_dead_worker_fails_the_trial_which_retries_from_its_checkpoint(
    ray_session: Any, tmp_path: pathlib.Path
) -> None:
    gpus = ray_session.cluster_resources().get("GPU", 0)
    marker = tmp_path / "rank1-died"
    config = _config({"name": "single"}, 0.05, gpus)
    config["hyperparameters"].update(die_at_batch=13, die_marker=str(marker))
    config["min_checkpoint_period"] = {"batches": 5}
    config["max_restarts"] = 1
    lines: list[str] = []
    results = searchlab.run(config, model_dir=MODEL_DIR, storage_path=tmp_path, echo=lines.append)
    assert marker.exists()  # rank 1 did die at batch index 13
    trial = results.trials.iloc[0]
    assert (trial["state"], trial["restarts"], trial["batches"]) == ("COMPLETED", 1, LENGTH)
    assert any("failed; retry 1 from its latest checkpoint" in line for line in lines)
    reports = results.all_reports[results.all_reports["group"] == "training"]
    # Died at batch 13 after the checkpoint at 10: the retry resumed there (a restart from 0
    # would report 5 and 10 again).
    assert reports["batches"].tolist() == [5, 10, 15, 20]


@pytest.mark.ray
@pytest.mark.slow
def test_a_trainable_killed_mid_write_retries_as_an_uninterrupted_search(
    ray_session: Any, tmp_path: pathlib.Path
) -> None:
    """The trainable that drives the two workers dies while it writes the winner's rung-end
    state in the background. The retry finds that checkpoint never completed, says so, goes
    back to the checkpoint before it (here none: it starts over), and the search ends as one
    nobody killed."""
    from driver_procs import check_a_kill_mid_write_recovers

    gpus = ray_session.cluster_resources().get("GPU", 0)

    def config(name: str) -> dict[str, Any]:
        searcher = {"name": "async_halving", "num_rungs": 2, "divisor": 2, "max_trials": 2}
        return {
            **_config(searcher, {"type": "categorical", "vals": [0.05, 0.0]}, gpus),
            "name": name,
        }

    # The trainable writes rank 0's state: the kill hits it, and its workers go with it.
    check_a_kill_mid_write_recovers(config, MODEL_DIR, tmp_path, nth_write=1)
