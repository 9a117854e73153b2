"""``cold_start.py``: its searchlab sides' configs and its summary."""

from __future__ import annotations

import pytest

cold_start = pytest.importorskip("cold_start")


def test_the_before_side_differs_from_searchlabs_only_by_an_environment_variable() -> None:
    from searchlab.config import load_experiment_config

    hp = cold_start.hyperparameters(quick=True, gpu=False)
    now = cold_start.searchlab_config(hp, every=4, reports=2, env=False)
    before = cold_start.searchlab_config(hp, every=4, reports=2, env=True)
    # An environment variable in the config sends the workers' environment through Ray's
    # runtime environment: the way every run took before trials took Ray's idle workers.
    assert load_experiment_config(before).environment.environment_variables
    assert not load_experiment_config(now).environment.environment_variables
    assert {k: v for k, v in before.items() if k != "environment"} == now
    assert now["searcher"]["max_length"] == {"batches": 8}


def test_the_summary_takes_each_sides_medians_and_their_ratios() -> None:
    def run(side: str, first_batch: float, exit_s: float) -> dict[str, float | str]:
        stamps = {"worker_s": 1.0, "build_s": 2.0, "built_s": 3.0}
        return {"side": side, **stamps, "first_batch_s": first_batch, "exit_s": exit_s}

    runs = [
        run("ray_tune", 10.0, 20.0),
        run("ray_tune", 12.0, 22.0),
        run("ray_tune", 30.0, 40.0),  # one slow run does not move the median
        run("searchlab", 9.0, 18.0),
        run("searchlab", 9.0, 18.0),
        run("searchlab_runtime_env", 10.5, 21.0),
    ]
    summary = cold_start.summarize(runs)
    assert summary["ray_tune"]["first_batch_s"] == 12.0
    assert summary["searchlab_over_ray_first_batch"] == pytest.approx(0.75)
    assert summary["searchlab_over_ray_exit"] == pytest.approx(18.0 / 22.0)
    assert summary["prestart_saves_first_batch_s"] == pytest.approx(1.5)
    assert "searchlab_over_ray_first_batch" not in cold_start.summarize(runs[3:])
