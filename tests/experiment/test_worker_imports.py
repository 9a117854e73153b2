"""A trial worker's imports: only what it runs on its way to the first batch.

Each check runs in a fresh interpreter (this one has imported everything already).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def _loaded_after(statement: str, names: list[str]) -> dict[str, bool]:
    script = (
        f"import json, sys\n{statement}\n"
        f"print(json.dumps({{n: n in sys.modules for n in {names!r}}}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.splitlines()[-1])


def test_the_trial_actor_does_not_load_the_driver_side() -> None:
    driver_side = [
        "searchlab.experiment._runner",
        "searchers",
        "searchlab.results",
        "searchlab.cli",
        "optuna",
    ]
    loaded = _loaded_after("import searchlab.experiment._trainable", driver_side)
    assert not any(loaded.values()), loaded


def test_a_data_parallel_trials_coordinator_starts_its_ranks_before_loading_torch() -> None:
    """The trainable's module is what its process imports before ``setup`` starts the ranks:
    torch and the trainer load later, while the ranks start (``_data_parallel``)."""
    heavy = ["torch", "searchlab.experiment._trial_runner", "searchlab.experiment._trainable"]
    loaded = _loaded_after("import searchlab.experiment._data_parallel", heavy)
    assert not any(loaded.values()), loaded


def test_the_trial_api_loads_neither_ray_nor_pandas() -> None:
    loaded = _loaded_after(
        "from searchlab import pytorch", ["ray", "pandas", "searchlab.experiment"]
    )
    assert not any(loaded.values()), loaded


@pytest.mark.parametrize("name", ["run", "resume"])
def test_the_experiment_package_still_offers_run_and_resume(name: str) -> None:
    import searchlab.experiment
    from searchlab.experiment import _runner

    assert getattr(searchlab.experiment, name) is getattr(_runner, name)
    with pytest.raises(AttributeError):
        searchlab.experiment.no_such_name  # noqa: B018
