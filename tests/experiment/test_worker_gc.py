"""A trial worker keeps its imports out of the garbage collector's scans, and only them."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import textwrap

FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures"
ROOT = pathlib.Path(__file__).parents[2]

# Run in a process of its own, as a trial worker is: freezing pytest's objects would outlive
# the test.
SCRIPT = textwrap.dedent(
    """
    import gc, pathlib, sys, weakref

    from toy_experiment import TOY_MODEL_DIR, toy_config

    from searchlab.config import load_experiment_config
    from searchlab.experiment._protocol import TrialConfig
    from searchlab.experiment._spec import ExperimentSpec
    from searchlab.experiment._trial_runner import TrialRunner

    hp = {"global_batch_size": 16, "n_train": 64, "optimizer": {"lr": 0.1}}
    config = toy_config("gc", hyperparameters=hp, searcher={"max_length": {"batches": 4}})
    spec = ExperimentSpec.from_config(
        load_experiment_config(config, model_dir=str(TOY_MODEL_DIR)), "gc"
    )
    trial = TrialConfig(hp, rung_ends=[4], trial_seed=1).to_tune()
    logdir = sys.argv[1]

    def build(name, worker_process=True):
        return TrialRunner(spec, trial, trial_id=name, logdir=logdir, model_dir=spec.model_dir,
                           worker_process=worker_process)

    assert gc.get_freeze_count() == 0
    runner = build("a")
    frozen = gc.get_freeze_count()
    assert frozen > 10_000, frozen  # torch's and the trial module's objects
    runner.step()
    # A trial in a reference cycle: only the cyclic collector frees it.
    model = runner.loop.trial
    model.cycle = model
    gone = weakref.ref(model)
    del model
    runner.close()
    second = build("b")  # a reused actor's next trial freezes nothing more
    assert gc.get_freeze_count() <= frozen, (gc.get_freeze_count(), frozen)
    gc.collect()
    assert gone() is None, "the replaced trial was frozen with the imports"
    second.step()
    second.close()
    print("ok")
    """
)


def test_worker_freezes_imports_once_and_still_collects_replaced_trials(
    tmp_path: pathlib.Path,
) -> None:
    _run_ok(SCRIPT, tmp_path)


def test_a_runner_in_the_callers_process_freezes_nothing(tmp_path: pathlib.Path) -> None:
    script = SCRIPT.replace('runner = build("a")', 'runner = build("a", worker_process=False)')
    script = script.split("frozen = gc.get_freeze_count()")[0] + (
        "assert gc.get_freeze_count() == 0\nprint('ok')\n"
    )
    _run_ok(script, tmp_path)


def _run_ok(script: str, tmp_path: pathlib.Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        env={"PYTHONPATH": f"{FIXTURES}:{ROOT}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")
