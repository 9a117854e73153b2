"""Training the next window while a report travels: the same windows, exactly, pauses included."""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import pytest
import torch
from toy_experiment import TOY_MODEL_DIR, toy_config

from searchlab.config import load_experiment_config
from searchlab.experiment._protocol import TrialConfig
from searchlab.experiment._spec import ExperimentSpec
from searchlab.experiment._trial_runner import TrialRunner

HPARAMS = {
    "global_batch_size": 16,
    "dropout": 0.3,  # every batch draws from the RNG: any change of order shows
    "n_train": 64,
    "optimizer": {"lr": 0.1, "momentum": 0.9},
}


def _runner(tmp_path: pathlib.Path, name: str, ahead: bool, **hparams: Any) -> TrialRunner:
    config = toy_config(
        "ahead",
        hyperparameters={**HPARAMS, **hparams},
        searcher={"max_length": {"batches": 12}},
        scheduling_unit=1,
    )
    spec = ExperimentSpec.from_config(
        load_experiment_config(config, model_dir=str(TOY_MODEL_DIR)), "ahead"
    )
    spec = dataclasses.replace(spec, train_ahead=ahead)
    trial = TrialConfig({**HPARAMS, **hparams}, rung_ends=[6, 12], trial_seed=7).to_tune()
    return TrialRunner(
        spec, trial, trial_id=name, logdir=str(tmp_path / name), model_dir=spec.model_dir
    )


def _plain(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if isinstance(v, float | int | str)}


def _weights(runner: TrialRunner) -> list[torch.Tensor]:
    assert runner.loop is not None
    return list(runner.loop.context.models[0].state_dict().values())


def _train(runner: TrialRunner) -> list[dict[str, Any]]:
    results = []
    while not (result := runner.step()).get("done"):
        results.append(_plain(result))
    return [*results, _plain(result)]


def test_training_ahead_gives_the_same_reports_and_weights(tmp_path: pathlib.Path) -> None:
    plain = _runner(tmp_path, "plain", ahead=False)
    expected = _train(plain)
    ahead = _runner(tmp_path, "ahead", ahead=True)
    first = ahead.step()
    assert first["group"] == "training" and first["batches"] == 1
    assert ahead._ahead is not None  # the next window trains while this report travels
    got = [_plain(first), *_train(ahead)]
    assert got == expected
    assert all(torch.equal(a, b) for a, b in zip(_weights(plain), _weights(ahead), strict=True))


def test_nothing_is_trained_ahead_of_a_rung_end(tmp_path: pathlib.Path) -> None:
    runner = _runner(tmp_path, "rung", ahead=True)
    while (result := runner.step())["batches"] < 6 or result["group"] != "training":
        pass
    assert result["batches"] == 6 and runner._ahead is None  # the search decides first
    assert runner.loop is not None and runner.loop.batches_trained == 6


@pytest.mark.parametrize("pause_after", [1, 3, 4])
def test_a_pause_while_a_window_trains_ahead_resumes_exactly(
    pause_after: int, tmp_path: pathlib.Path
) -> None:
    expected = _train(_runner(tmp_path, "whole", ahead=False))
    first = _runner(tmp_path, "first", ahead=True)
    got = [_plain(first.step()) for _ in range(pause_after)]
    saved = first.state()  # Tune saves now: the window trained ahead is kept as a report
    assert saved is not None
    state, _ = saved
    first.close()

    second = _runner(tmp_path, "second", ahead=True)
    second.load(state, checkpoint_uuid="checkpoint_000000")
    got += _train(second)
    assert got == expected  # no report lost, none repeated, same values


def test_a_window_that_fails_ahead_fails_the_next_step(tmp_path: pathlib.Path) -> None:
    runner = _runner(tmp_path, "fails", ahead=True, fail_at_batch=1)  # the second batch fails
    assert runner.step()["batches"] == 1  # the first window is fine; the second fails ahead
    assert runner._ahead is not None
    with pytest.raises(RuntimeError, match="injected failure"):
        runner.step()  # as it would have without training ahead: at the step of that window
