"""What a trial asks Ray for: refused in one line when no placement can ever hold it."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

import searchlab
from searchlab.config import load_experiment_config
from searchlab.errors import ConfigError
from searchlab.experiment._data_parallel import placement_group_factory
from searchlab.experiment._resources import trial_resources

MODEL_DIR = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "ddp_model"


def _cfg(**resources: Any) -> Any:
    return load_experiment_config(
        {
            "name": "r",
            "entrypoint": "model_def:DDPTrial",
            "hyperparameters": {"global_batch_size": 16, "lr": 0.05},
            "searcher": {"name": "single", "metric": "validation_loss", "max_length": 10},
            "resources": resources,
        },
        model_dir=str(MODEL_DIR),
    )


def _nodes(*shapes: tuple[float, float]) -> list[dict[str, Any]]:
    return [{"Alive": True, "Resources": {"CPU": c, "GPU": g}} for c, g in shapes]


def test_two_one_cpu_workers_fit_two_cpus_exactly() -> None:
    assert trial_resources(_cfg(slots_per_trial=2), _nodes((2, 0))) == {"cpu": 1.0, "gpu": 0.0}
    # The trial's own actor only waits on its workers: it asks for nothing (an empty head
    # bundle), so the placement group is the workers' bundles and nothing more.
    pgf = placement_group_factory(2, 1.0, 0.0)
    assert pgf.head_bundle_is_empty
    assert pgf.bundles == [{"CPU": 1.0}, {"CPU": 1.0}]
    assert pgf.required_resources == {"CPU": 2.0}


@pytest.mark.parametrize(
    ("resources", "nodes", "message"),
    [
        (
            {"slots_per_trial": 3},
            [(2, 0)],
            r"each trial asks for 3 CPU \(3 workers\) but the Ray cluster has 1 node\(s\): "
            r"2 CPU/0 GPU in all",
        ),
        (
            {"slots_per_trial": 2, "gpus_per_trial": 1},
            [(8, 1)],
            r"each trial asks for 2 CPU \+ 2 GPU \(2 workers\) but the Ray cluster has 1 "
            r"node\(s\): 8 CPU/1 GPU",
        ),
        (
            {"cpus_per_trial": 3},
            [(2, 0), (2, 0)],
            r"each worker of a trial asks for 3 CPU but no node of the Ray cluster has that much "
            r"\(2 node\(s\): 2 CPU/0 GPU, 2 CPU/0 GPU\)",
        ),
    ],
)
def test_a_trial_that_can_never_be_placed_is_refused_in_one_line(
    resources: dict[str, Any], nodes: list[tuple[float, float]], message: str
) -> None:
    with pytest.raises(ConfigError, match=r"^<dict>: resources: " + message) as caught:
        trial_resources(_cfg(**resources), _nodes(*nodes))
    assert "\n" not in str(caught.value)


def test_dead_nodes_do_not_count() -> None:
    nodes = [*_nodes((1, 0)), {"Alive": False, "Resources": {"CPU": 64, "GPU": 8}}]
    with pytest.raises(ConfigError, match=r"1 node\(s\): 1 CPU/0 GPU in all"):
        trial_resources(_cfg(slots_per_trial=2), nodes)


@pytest.mark.ray
@pytest.mark.slow
def test_a_two_slot_trial_runs_on_a_two_cpu_machine(
    ray_session: Any, tmp_path: pathlib.Path
) -> None:
    assert ray_session.cluster_resources()["CPU"] == 2
    config = {
        "name": "two-slots",
        "entrypoint": "model_def:DDPTrial",
        "hyperparameters": {"global_batch_size": 16, "lr": 0.05},
        "searcher": {"name": "single", "metric": "validation_loss", "max_length": 10},
        "resources": {"slots_per_trial": 2, "gpus_per_trial": 0},  # one CPU per worker
        "scheduling_unit": 5,
    }
    results = searchlab.run(config, model_dir=MODEL_DIR, storage_path=tmp_path, echo=print)
    trial = results.trials.iloc[0]
    assert (trial["state"], trial["batches"]) == ("COMPLETED", 10)
    training = results.metrics[results.metrics["group"] == "training"]
    assert set(training["world_size"]) == {2.0}
