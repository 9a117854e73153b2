"""Script experiments (Determined 0.38's ``entrypoint: python3 train.py``) run by ``searchlab run``.

The scripts in ``scripts/`` are written as Determined's tutorials write them. Each trial's
script runs in a child process of its Ray actor; a pause at a rung preempts it (checkpoint,
exit) unless it is promoted at once, and the next run gets the checkpoint as
``info.latest_checkpoint``. Trials resumed either way must report what an uninterrupted run
reports.
"""

from __future__ import annotations

import collections
import pathlib
import re
from typing import Any

import pytest

import searchlab
import searchlab as det
from searchlab import pytorch

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SCRIPTS = pathlib.Path(__file__).resolve().parent / "scripts"
EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
_RUN_LINE = re.compile(r"^run (\d+) from (\S+)$", re.MULTILINE)


def _run(config: dict[str, Any] | pathlib.Path, model_dir: pathlib.Path, storage, **kw: Any):
    lines: list[str] = []
    results = searchlab.run(
        config, model_dir=model_dir, storage_path=storage, echo=lines.append, **kw
    )
    return results, lines


def _asha(entrypoint: str, metric: str, hparams: dict[str, Any], **searcher: Any) -> dict:
    """4 trials, one bracket, rungs at 4, 8 and 16 batches (aggressive, divisor 2)."""
    return {
        "name": "script-asha",
        "entrypoint": entrypoint,
        "hyperparameters": hparams,
        "searcher": {
            "name": "adaptive_asha",
            "metric": metric,
            "max_trials": 4,
            "mode": "aggressive",
            "divisor": 2,
            "max_concurrent_trials": 2,
            **({"time_metric": "batches", "max_time": 16} | searcher),
        },
        "scheduling_unit": 2,
        "max_restarts": 0,
        "reproducibility": {"experiment_seed": 11},
    }


def _straight_weights(lr: float, batches: int, tmp_path: pathlib.Path) -> dict[int, float]:
    """The trainer script's weight at every 4th batch of an uninterrupted local run."""
    with det.import_from_path(SCRIPTS / "trainer"):
        import train as trainer_script
    hparams = {"lr": lr, "global_batch_size": 4}
    with pytorch.init(hparams=hparams, checkpoint_dir=tmp_path / f"straight-{lr}") as context:
        trial = trainer_script.LinearTrial(context, hparams)
        trainer = pytorch.Trainer(trial, context)
        trainer.fit(max_length=pytorch.Batch(batches), validation_period=pytorch.Batch(4))
    return {r.batches: r.metrics["weight"] for r in trainer.reports if r.group == "validation"}


def _validations(results: searchlab.Results) -> dict[str, Any]:
    metrics = results.metrics
    return {t: rows for t, rows in metrics[metrics["group"] == "validation"].groupby("trial_id")}


def _runs(results: searchlab.Results) -> dict[str, list[tuple[int, str]]]:
    """Each trial's script runs (run number, latest_checkpoint) from its ``script.log``."""
    runs = {}
    for trial_id in results.trials["trial_id"]:
        log = pathlib.Path(results.experiment_dir) / trial_id / "script.log"
        runs[trial_id] = [(int(n), path) for n, path in _RUN_LINE.findall(log.read_text())]
    return runs


def test_a_trainer_script_search_pauses_and_resumes_exactly(ray_session, tmp_path) -> None:
    config = _asha(
        "python3 train.py --batches 16",  # it validates where the searcher needs it
        "validation_loss",
        {"lr": {"type": "categorical", "vals": [0.01, 0.02, 0.05, 0.1]}, "global_batch_size": 4},
    )
    results, lines = _run(config, SCRIPTS / "trainer", tmp_path)
    trials = results.trials.set_index("trial_id")
    assert set(trials["state"]) == {"COMPLETED"}
    assert collections.Counter(trials["batches"]) == {4: 2, 8: 1, 16: 1}  # ASHA's promotions
    assert any(" paused at batch " in line for line in lines)
    assert any(" resumed at batch " in line for line in lines)
    for trial_id, rows in _validations(results).items():
        lr = trials.loc[trial_id, "lr"]
        batches = list(rows["batches"])
        assert batches == [4, 8, 16][: len(batches)]  # each rung once: nothing replayed
        straight = _straight_weights(lr, batches[-1], tmp_path)
        assert list(rows["weight"]) == [straight[b] for b in batches], trial_id  # bit for bit
    runs = _runs(results)
    for trial_runs in runs.values():
        assert trial_runs[0] == (1, "None")
        # Every later run of a trial's script started from a checkpoint of the trial.
        assert [n for n, _ in trial_runs] == list(range(1, len(trial_runs) + 1))
        assert all(path != "None" for _, path in trial_runs[1:])
    assert trials.loc[trials["batches"] == 16, "checkpoint"].notna().all()


def test_a_core_api_script_search_with_a_time_metric(ray_session, tmp_path) -> None:
    config = _asha(
        "python3 train.py --max-length 16",
        "x",
        {"increment_by": {"type": "categorical", "vals": [1, 2, 3, 4]}},
    )
    results, _ = _run(config, SCRIPTS / "core", tmp_path)
    trials = results.trials.set_index("trial_id")
    assert collections.Counter(trials["batches"]) == {4: 2, 8: 1, 16: 1}
    for trial_id, rows in _validations(results).items():
        batches = list(rows["batches"])
        assert batches == list(range(2, batches[-1] + 1, 2))  # no batch reported twice
        assert list(rows["x"]) == [trials.loc[trial_id, "increment_by"] * b for b in batches]


def test_core_api_searcher_operations(ray_session, tmp_path) -> None:
    config = _asha(
        "python3 train.py --operations",
        "x",
        {"increment_by": {"type": "categorical", "vals": [1, 2, 3, 4]}},
        time_metric=None,
        max_time=None,
        max_length={"batches": 16},
    )
    results, _ = _run(config, SCRIPTS / "core", tmp_path)
    trials = results.trials.set_index("trial_id")
    assert collections.Counter(trials["batches"]) == {4: 2, 8: 1, 16: 1}
    for trial_id, rows in _validations(results).items():
        assert list(rows["batches"]) == [4, 8, 16][: len(rows)]
        assert list(rows["x"]) == [
            trials.loc[trial_id, "increment_by"] * b for b in rows["batches"]
        ]


def test_a_script_on_two_slots_through_the_launcher(ray_session, tmp_path) -> None:
    config = {
        "name": "two-slots",
        "entrypoint": "python3 -m determined.launch.torch_distributed "
        "python3 train.py --batches 8 --validate-every 4",
        "hyperparameters": {"lr": 0.05, "global_batch_size": 4},
        "resources": {"slots_per_trial": 2},
        "searcher": {"name": "single", "metric": "validation_loss"},
        "max_restarts": 0,
    }
    results, _ = _run(config, SCRIPTS / "trainer", tmp_path)
    ((trial_id, rows),) = _validations(results).items()
    assert list(rows["batches"]) == [4, 8]
    # Two workers of 2 records each make the same updates as one worker of 4.
    straight = _straight_weights(0.05, 8, tmp_path)
    assert list(rows["weight"]) == pytest.approx([straight[4], straight[8]])
    log = (pathlib.Path(results.experiment_dir) / trial_id / "script.log").read_text()
    assert "[rank=0] run 1 from None" in log and "[rank=1] run 1 from None" in log


def test_invalid_hp_replaces_a_trial_and_a_failing_script_restarts(ray_session, tmp_path) -> None:
    config = {
        "name": "failures",
        "entrypoint": "python3 train.py --max-length 8 --fail-at 5",
        "hyperparameters": {"increment_by": {"type": "categorical", "vals": [0, 2]}},
        "searcher": {"name": "grid", "metric": "x", "max_length": {"batches": 8}},
        "max_restarts": 1,
    }
    results, _ = _run(config, SCRIPTS / "core", tmp_path)
    trials = results.trials.set_index("increment_by")
    assert trials.loc[0, "state"] == "INVALID_HP"
    failed = trials.loc[2]
    assert failed["state"] == "ERRORED" and failed["restarts"] == 1
    assert "RuntimeError: failing at batch 5 as asked" in failed["error"]  # the script's output
    # The restart went on from the checkpoint the failed run stored last (batch 4).
    runs = _runs(results)[failed["trial_id"]]
    assert [n for n, _ in runs] == [1, 2]
    assert runs[1][1] != "None"


def test_searchlab_run_exits_1_when_every_trial_errored(ray_session, tmp_path, capsys) -> None:
    from searchlab import cli

    config = tmp_path / "fails.yaml"
    config.write_text(
        "name: fails\n"
        "entrypoint: python3 train.py --fail-at 1\n"
        "hyperparameters: {increment_by: 1}\n"
        "searcher: {name: single, metric: x}\n"
        "max_restarts: 0\n"
    )
    code = cli.main(["run", str(config), str(SCRIPTS / "core"), "--storage-path", str(tmp_path)])
    assert code == 1
    assert "every trial errored" in capsys.readouterr().err


def test_a_missing_searcher_metric_stops_the_experiment(ray_session, tmp_path) -> None:
    config = _asha(
        "python3 train.py --max-length 16",
        "validation_loss",
        {"increment_by": 1},
    )
    with pytest.raises(
        searchlab.TrialDefinitionError, match=r"searcher\.metric: the searcher metric"
    ):
        _run(config, SCRIPTS / "core", tmp_path)


@pytest.mark.slow
def test_the_determined_examples_run(ray_session, tmp_path) -> None:
    offline = "data.offline=true"
    trainer = EXAMPLES / "determined_trainer"
    results, _ = _run(trainer / "const.yaml", trainer, tmp_path, overrides=[offline])
    assert list(results.trials["state"]) == ["COMPLETED"]
    assert results.trials["batches"].item() == 24  # one epoch of the offline stand-in
    results, _ = _run(
        trainer / "adaptive.yaml",
        trainer,
        tmp_path,
        overrides=[
            offline,
            "searcher.max_trials=2",
            "searcher.max_time=8",
            "searcher.mode=aggressive",
        ],
    )
    assert set(results.trials["state"]) == {"COMPLETED"}
    results, _ = _run(trainer / "distributed.yaml", trainer, tmp_path, overrides=[offline])
    assert list(results.trials["state"]) == ["COMPLETED"]
    classic = EXAMPLES / "determined_classic"
    results, _ = _run(
        classic / "const.yaml",
        classic,
        tmp_path,
        overrides=[offline, "searcher.max_length.batches=8"],
    )
    assert list(results.trials["state"]) == ["COMPLETED"]
    assert results.trials["batches"].item() == 8
