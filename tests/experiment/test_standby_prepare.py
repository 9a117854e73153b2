"""Standby's preparation before the GPU wait (``TrialRunner.prepare``) changes nothing trained.

With ``SEARCHLAB_STANDBY=1`` an actor rebuilds a released trial and starts its training
loader's workers before it waits for the GPU, while the other trial trains. These tests drive
one ``TrialRunner`` as standby does (prepare, then step; released after every report) against
one that only steps, and check the losses, positions and weights are the same, also for a pause
taken right after a preparation, and that the preparation started the loader's workers.
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
import runner_steps as steps
import torch
from toy_experiment import TOY_MODEL_DIR, toy_config

from searchlab.config import load_experiment_config
from searchlab.errors import ConfigError, InvalidHP
from searchlab.experiment._protocol import TrialConfig
from searchlab.experiment._spec import ExperimentSpec, check_environment
from searchlab.experiment._trial_runner import TrialRunner


def _runner(
    tmp_path: pathlib.Path,
    name: str,
    workers: int = 1,
    fields: dict[str, Any] | None = None,
    **extra: Any,
) -> TrialRunner:
    hparams = {
        "global_batch_size": 16,
        "dropout": 0.3,  # draws from the global RNG in every batch
        "n_train": 64,
        "optimizer": {"lr": 0.1, "momentum": 0.9},
        "loader_workers": workers,  # one persistent loader for the run (0: none)
        **extra,
    }
    config = toy_config(
        "prepare",
        hyperparameters=hparams,
        searcher={"max_length": {"batches": 12}},
        **(fields or {}),
    )
    spec = ExperimentSpec.from_config(
        load_experiment_config(config, model_dir=str(TOY_MODEL_DIR)), "prepare"
    )
    trial_config = TrialConfig(hparams, rung_ends=[6, 12], trial_seed=7).to_tune()
    return TrialRunner(
        spec, trial_config, trial_id=name, logdir=str(tmp_path / name), model_dir=spec.model_dir
    )


def _train(runner: TrialRunner, *, prepare: bool, release: bool) -> list[dict[str, Any]]:
    results = []
    while True:
        if prepare:
            runner.prepare()
        result = runner.step()
        results.append(steps.plain(result))
        if result.get("done"):
            return results
        if release:  # what an idle standby actor does between its turns
            runner.state()
            runner.park()


def test_preparing_before_each_window_trains_exactly_as_without(tmp_path: pathlib.Path) -> None:
    # Each build seeds the process RNG: each runner is built right before it trains.
    plain = _runner(tmp_path, "plain")
    expected = _train(plain, prepare=False, release=False)
    prepared = _runner(tmp_path, "prepared")
    try:
        got = _train(prepared, prepare=True, release=True)
        assert len(expected) > 4
        assert got == expected  # losses (dropout's draws), validations, positions
        for a, b in zip(steps.weights(plain), steps.weights(prepared), strict=True):
            assert torch.equal(a, b)
    finally:
        plain.close()
        prepared.close()


def test_prepare_starts_the_loader_workers_and_rebuilds_a_released_trial(
    tmp_path: pathlib.Path,
) -> None:
    runner = _runner(tmp_path, "started")
    try:
        assert runner.loop is not None and runner.loop._stream is None
        runner.prepare()
        stream: Any = runner.loop._stream
        assert stream is not None
        assert [w.is_alive() for w in stream._workers] == [True]  # started before any batch
        assert runner.loop.batches_trained == 0
        runner.step()
        runner.state()
        runner.park()
        assert runner.loop is None and runner.parked
        runner.prepare()
        assert not runner.parked and runner.loop is not None
        assert runner.loop._stream is not None
    finally:
        runner.close()


def test_a_loader_without_persistent_workers_is_not_started_early(tmp_path: pathlib.Path) -> None:
    # A loader made per epoch starts with its first batch, as without standby.
    runner = _runner(tmp_path, "no-workers", workers=0)
    try:
        runner.prepare()
        assert runner.loop is not None and runner.loop._stream is None
    finally:
        runner.close()


def test_a_trial_whose_callback_runs_before_the_first_batch_starts_its_loader_with_it(
    tmp_path: pathlib.Path,
) -> None:
    # on_trial_startup may change what the loader's workers copy when they start.
    runner = _runner(tmp_path, "hooked", hook_log=str(tmp_path / "hooks.log"))
    try:
        runner.prepare()
        assert runner.loop is not None and runner.loop._stream is None
        runner.step()
        assert runner.loop._stream is not None
    finally:
        runner.close()


def test_a_pause_right_after_a_preparation_resumes_exactly(tmp_path: pathlib.Path) -> None:
    whole = _runner(tmp_path, "whole")  # each build seeds the process RNG (see above)
    expected = _train(whole, prepare=False, release=False)
    first = _runner(tmp_path, "first")
    head = [steps.plain(first.step())]
    first.state()
    first.park()  # released while it waited
    first.prepare()  # rebuilt and its loader started, then paused before it trained again
    assert first.loop is not None and first.loop._stream is not None
    saved = first.state()
    assert saved is not None
    resumed = _runner(tmp_path, "resumed")
    try:
        resumed.load(saved[0], checkpoint_uuid="checkpoint_000000")
        tail = _train(resumed, prepare=True, release=False)
        assert head + tail == expected
        for a, b in zip(steps.weights(whole), steps.weights(resumed), strict=True):
            assert torch.equal(a, b)
    finally:
        for runner in (whole, first, resumed):
            runner.close()


@pytest.mark.parametrize(
    ("variable", "field", "default"),
    [
        ("SEARCHLAB_STANDBY_PREPARE", "standby_prepare", True),
        ("SEARCHLAB_STANDBY_WARM_UP", "standby_warm_up", True),
    ],
)
def test_a_standby_switch_keeps_its_default_unless_set_and_refuses_other_values(
    variable: str, field: str, default: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load_experiment_config(toy_config("switch"), model_dir=str(TOY_MODEL_DIR))
    assert getattr(ExperimentSpec.from_config(config, "switch"), field) is default
    monkeypatch.setenv(variable, "1" if not default else "0")
    assert getattr(ExperimentSpec.from_config(config, "switch"), field) is not default
    monkeypatch.setenv(variable, "maybe")
    with pytest.raises(ConfigError, match=f"{variable}='maybe'"):
        check_environment()


def test_a_validation_before_the_first_batch_starts_the_loader_after_it(
    tmp_path: pathlib.Path,
) -> None:
    # A validation (its callbacks, evaluate_batch) may change the dataset the workers copy.
    fields = {"perform_initial_validation": True}
    plain = _runner(tmp_path, "plain", fields=fields)
    expected = _train(plain, prepare=False, release=False)
    prepared = _runner(tmp_path, "prepared", fields=fields)
    try:
        prepared.prepare()
        assert prepared.loop is not None and prepared.loop._stream is None
        got = _train(prepared, prepare=True, release=True)
        assert got[0]["group"] == "validation" and got[0]["batches"] == 0
        assert got == expected
    finally:
        plain.close()
        prepared.close()


@pytest.mark.parametrize(
    ("where", "what", "error", "group"),
    [
        # the loader's start, as a user's sampler raising InvalidHP would make it fail
        ("loop", "_batch_stream", InvalidHP("no loader for these hyperparameters"), "invalid_hp"),
        # the plan of the segment: a user error every trial would hit
        ("runner", "_rung_batches", ConfigError("max_length: needs global_batch_size"), "error"),
    ],
)
def test_what_fails_while_preparing_fails_in_the_step_as_without_preparation(
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    where: str,
    what: str,
    error: Exception,
    group: str,
) -> None:
    runner = _runner(tmp_path, "failing")
    try:
        assert runner.loop is not None

        def refuse() -> Any:
            raise error

        monkeypatch.setattr(runner.loop if where == "loop" else runner, what, refuse)
        runner.prepare()  # the step meets the error where a trial's errors are handled
        assert runner.loop._stream is None
        result = runner.step()
        assert result["done"] is True and result["group"] == group
    finally:
        runner.close()
