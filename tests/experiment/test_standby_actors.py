"""Standby's actors stay: a GPU's three trial processes are started once and each trains,
and a standby search resumes from what Tune saved.

Tune gave a trial whose new actor was still starting a cached actor that a paused trial had
freed, and removed the starting one (``_compat.keep_starting_actors``): with trials pausing
at every rung, one of a GPU's three actors was started and removed again and again."""

from __future__ import annotations

import collections
import pathlib

import pytest
from runner_steps import asha_model_dir, run_search_script

SEARCH = """
import json, pathlib, sys
import ray
import searchlab
from searchlab._ray_env import ray_init_kwargs
from searchlab.experiment._compat import keep_prestarted_workers

out = pathlib.Path(sys.argv[1])
ray.init(num_cpus=3, num_gpus=1, _memory=8 * 2**30, _system_config=keep_prestarted_workers(),
         **ray_init_kwargs())
for run in range(2):  # Ray started once, as in a notebook
    config = {
        "name": f"actors-{run}",
        "entrypoint": "asha_trial:AshaTrial",
        "hyperparameters": {
            "global_batch_size": 4,
            "lr": {"type": "categorical", "vals": [0.001 * 1.5**i for i in range(16)]},
            "build_log": str(out / f"builds-{run}.log"),
            "batch_sleep": 0.05,
        },
        "searcher": {
            "name": "adaptive_asha", "metric": "validation_loss", "max_trials": 16,
            "max_length": {"batches": 32}, "mode": "aggressive", "divisor": 2,
            "max_rungs": 4, "max_concurrent_trials": 3,
        },
        "scheduling_unit": 4,
        "max_restarts": 1,
        "reproducibility": {"experiment_seed": 3},
    }
    results = searchlab.run(config, model_dir=sys.argv[2], storage_path=str(out / "runs"),
                            echo=lambda _: None)
    assert sorted(set(results.trials["state"])) == ["COMPLETED"], results.trials["state"]
    # Tune restores the search's state from what it saved: the controller's rule is not in it.
    resumed = searchlab.resume(results.experiment_dir, echo=lambda _: None)
    assert list(resumed.trials["state"]) == list(results.trials["state"])
(out / "done").write_text("ok")
"""


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(600 + 60)
def test_each_of_a_gpus_three_actors_starts_once_and_trains(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "search.py"
    script.write_text(SEARCH)
    run_search_script(script, tmp_path, asha_model_dir(tmp_path), standby="2")
    assert (tmp_path / "done").read_text() == "ok"
    for run in range(2):
        events = [line.split() for line in (tmp_path / f"builds-{run}.log").read_text().split("\n")]
        built = collections.Counter(
            pid for pid, what in (e for e in events if e) if what == "build"
        )
        trained = {pid for pid, what in (e for e in events if e) if what == "train"}
        # Before: 8 processes of one search built a trial and were removed before training
        # it, and one process trained alone or beside a second.
        assert set(built) == trained, (run, built, trained)
        assert len(trained) >= 3, (run, built)  # the GPU's three actors all trained
        assert sum(built.values()) >= 16  # every trial was built, on those three
