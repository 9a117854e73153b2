"""Each example's offline path end to end on Ray: a search, its results, plots and report.

The examples' own configs, made small with ``--config``-style overrides: offline data under
a temporary directory, 4 trials and rungs ending at 4 and 16 batches for the adaptive
searches, 8 batches on 2 CPU workers for the data-parallel ones.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from typing import Any

import pytest
import torch

import searchlab
from searchlab.cli import main

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENTRY_CLASSES = {"mnist": "MNistTrial", "cifar10": "CIFARTrial"}
SMALL = ["min_validation_period.batches=4", "scheduling_unit=4"]


def _offline(tmp_path: pathlib.Path) -> list[str]:
    return ["data.offline=true", f"data.data_dir={tmp_path / 'data'}"]


def _trial_class(example: str) -> type[Any]:
    # The example's modules import each other by plain names (`data`), as Ray runs them.
    model_dir = ROOT / "examples" / example
    sys.path.insert(0, str(model_dir))
    try:
        for name in ("data", "model_def"):
            sys.modules.pop(name, None)
        spec = importlib.util.spec_from_file_location("model_def", model_dir / "model_def.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return getattr(module, ENTRY_CLASSES[example])  # type: ignore[no-any-return]
    finally:
        sys.path.remove(str(model_dir))
        for name in ("data", "model_def"):
            sys.modules.pop(name, None)


@pytest.mark.parametrize("example", ["mnist", "cifar10"])
def test_adaptive_search_of_the_example_offline(
    example: str, ray_session: Any, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model_dir = ROOT / "examples" / example
    overrides = [*_offline(tmp_path), *SMALL, "searcher.max_trials=4"]
    overrides.append("searcher.max_length.batches=16")  # 4 trials: rungs end at 4 and 16
    results = searchlab.run(
        model_dir / "adaptive.yaml", storage_path=tmp_path / "runs", overrides=overrides
    )
    trials = results.trials
    assert len(trials) == 4 and set(trials["state"]) == {"COMPLETED"}
    metric = results.metric
    best = results.best_trial()
    assert best["batches"] == 16 and best["rung"] == 1  # the one trial promoted
    assert sorted(trials["batches"]) == [4, 4, 4, 16]
    curve = results.learning_curves("validation_loss")[best["trial_id"]].dropna()
    assert curve.iloc[-1] < curve.iloc[0]  # it learned on the generated data
    assert (tmp_path / "data" / "offline").is_dir()

    exp_dir = results.experiment_dir
    capsys.readouterr()  # the search's own progress lines
    assert main(["results", str(exp_dir)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[1].split()[0] == best["trial_id"] and f"best_{metric}" in table[0]
    assert main(["plot", str(exp_dir)]) == 0 and main(["report", str(exp_dir)]) == 0
    written = sorted(p.name for p in (exp_dir / "plots").iterdir())
    assert written == ["best_so_far.png", "learning_curves.png", "rung_ladder.png"]
    assert (exp_dir / "report.html").stat().st_size > 1_000_000

    trial = results.load_trial(best["trial_id"], trial_class=_trial_class(example))
    assert isinstance(trial.model, torch.nn.Module)


@pytest.mark.parametrize("example", ["mnist", "cifar10"])
def test_distributed_config_trains_on_two_workers_offline(
    example: str, ray_session: Any, tmp_path: pathlib.Path
) -> None:
    overrides = [*_offline(tmp_path), *SMALL, "searcher.max_length.batches=8"]
    results = searchlab.run(
        ROOT / "examples" / example / "distributed.yaml",
        storage_path=tmp_path / "runs",
        overrides=overrides,
    )
    [trial] = results.trials.to_dict("records")
    assert trial["state"] == "COMPLETED" and trial["batches"] == 8
    validations = results.metrics[results.metrics["group"] == "validation"]
    assert validations["batches"].tolist() == [4, 8]
    assert results.experiment["config"]["resources"]["slots_per_trial"] == 2
