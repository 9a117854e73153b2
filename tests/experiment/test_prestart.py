"""A Ray that ``searchlab run`` starts itself hands the first trials the workers it started
as it started (one per CPU), instead of starting a process for each trial's actor.

Ray gives a job with a runtime environment none of the workers it started before the job,
and Tune registers each trainable with a runtime environment of its own. So a run that starts
Ray here sets the workers' environment variables in the driver while Ray starts (the workers
inherit them), ships the model directory itself, and registers its trainable without one.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import yaml

import searchlab
from tests.fixtures.driver_procs import ray_tmpdir
from tests.fixtures.toy_experiment import TOY_MODEL_DIR, toy_config

pytestmark = pytest.mark.ray

NIL_JOB = "ffffffff"  # RAY_JOB_ID of a worker Ray started before any job asked for one

CONNECT = """
import json, os, sys, time
import psutil
import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from searchlab._ray_env import connect_ray, ray_environment

with ray_environment():
    ship = {"working_dir": sys.argv[1], "env_vars": {"SEARCHLAB_PRESTART_TEST": "yes"}}
    connection = connect_ray(None, ship, prestart=True)
    after = os.environ.get("SEARCHLAB_PRESTART_TEST")

    @ray.remote(num_cpus=1)
    class Probe:
        def __init__(self):
            self.seen = {
                "variable": os.environ.get("SEARCHLAB_PRESTART_TEST"),
                "worker_job": os.environ.get("RAY_JOB_ID"),
            }

        def get(self):
            return self.seen

    # The workers Ray started, once idle (done importing: their CPU time stands still), however
    # slowly a loaded machine starts them.
    cpus = int(ray.cluster_resources()["CPU"])
    raylet = psutil.Process(ray._private.worker._global_node.all_processes["raylet"][0].process.pid)

    def idle_workers():
        found = {}
        for child in raylet.children():
            try:
                if child.cmdline()[:1] == ["ray::IDLE"]:
                    found[child.pid] = sum(child.cpu_times()[:2])
            except psutil.Error:
                continue
        return found

    deadline, before = time.time() + 120, {}
    while time.time() < deadline:
        now = idle_workers()
        if len(now) >= cpus and now == before:
            break
        before = now
        time.sleep(0.5)
    else:
        raise SystemExit(f"Ray's idle workers did not settle in 120 s: {before}")
    # As Tune does: a placement group per trial, here reserving every CPU of the node. Ray's
    # default would kill its idle workers 1 s after they became surplus to the CPUs left.
    group = placement_group([{"CPU": 1}] * cpus)
    ray.get(group.ready())
    time.sleep(2)
    strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0)
    seen = ray.get(Probe.options(scheduling_strategy=strategy).remote().get.remote())
    ray.shutdown()
print(json.dumps({
    "started": connection.started,
    "working_dir": connection.working_dir,
    "inherited": connection.worker_environ.get("SEARCHLAB_PRESTART_TEST"),
    "repr": repr(connection),
    "driver_after": after,
    **seen,
}))
"""


def test_a_ray_started_here_passes_the_environment_to_the_workers_it_started_first(
    tmp_path: pathlib.Path,
) -> None:
    with ray_tmpdir() as ray_tmp:
        proc = subprocess.run(
            [sys.executable, "-c", CONNECT, str(tmp_path)],
            env={**os.environ, "RAY_TMPDIR": ray_tmp},
            capture_output=True,
            text=True,
            timeout=180,
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["started"] and not seen["working_dir"]  # the caller ships the model dir
    # The workers inherited the variables; the driver has them only while Ray starts.
    assert seen["variable"] == seen["inherited"] == "yes"
    assert seen["driver_after"] is None
    assert "SEARCHLAB_PRESTART_TEST" not in seen["repr"]  # never printed
    # The actor started in a worker Ray had started before the job, kept while the
    # placement group reserved every CPU.
    assert seen["worker_job"] == NIL_JOB


def _run(tmp_path: pathlib.Path, name: str, **fields: object) -> list[dict[str, str]]:
    """``searchlab run`` of a 2-trial toy grid in a new process that starts its own Ray;
    where each trial's module was loaded from, its working directory and its worker's job."""
    records = tmp_path / f"records-{name}"
    config = toy_config(
        name,
        hyperparameters={
            "hidden": {"type": "categorical", "vals": [4, 8]},
            "record_dir": str(records),
        },
        searcher={"name": "grid", "max_length": {"batches": 4}},
        **fields,
    )
    config_file = tmp_path / f"{name}.yaml"
    config_file.write_text(yaml.safe_dump(config))
    args = [sys.executable, "-m", "searchlab.cli", "run", str(config_file), str(TOY_MODEL_DIR)]
    with ray_tmpdir() as ray_tmp:
        proc = subprocess.run(
            [*args, "--storage-path", str(tmp_path / "results")],
            env={**os.environ, "RAY_TMPDIR": ray_tmp},
            capture_output=True,
            text=True,
            cwd=TOY_MODEL_DIR,  # a user in the model directory: still runs the shipped copy
            timeout=300,
        )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = searchlab.load_results(tmp_path / "results" / name)
    assert results.trials["state"].tolist() == ["COMPLETED", "COMPLETED"]
    return [json.loads(f.read_text()) for f in sorted(records.glob("*.json"))]


@pytest.mark.slow
def test_searchlab_run_trains_its_first_trials_in_workers_ray_started_beforehand(
    tmp_path: pathlib.Path,
) -> None:
    origins = _run(tmp_path, "prestart")
    assert len(origins) >= 2
    for origin in origins:
        module_file = pathlib.Path(origin["module_file"])
        # the model directory as shipped through the object store, not the user's copy ...
        assert f"searchlab-models-{os.getuid()}" in module_file.parts, origin
        assert not module_file.is_relative_to(TOY_MODEL_DIR), origin
        # ... which the trial runs in, as with Ray's working_dir
        assert pathlib.Path(origin["cwd"]) == module_file.parent, origin
    # The first trial's actor started in a worker Ray started before the job.
    assert NIL_JOB in {origin["worker_job"] for origin in origins}


@pytest.mark.slow
def test_a_run_with_environment_variables_ships_them_with_the_model_dir(
    tmp_path: pathlib.Path,
) -> None:
    """The user's variables reach the workers through Ray's runtime environment, as before:
    the driver's own processes never get them."""
    origins = _run(
        tmp_path, "env", environment={"environment_variables": {"SEARCHLAB_TOY_VAR": "1"}}
    )
    for origin in origins:
        module_file = pathlib.Path(origin["module_file"])
        assert "runtime_resources" in module_file.parts, origin  # Ray's working_dir copy
        assert pathlib.Path(origin["cwd"]) == module_file.parent, origin
        assert origin["worker_job"] != NIL_JOB, origin


def test_the_workers_environment_is_never_saved_with_the_search_state() -> None:
    """Tune pickles the scheduler and searcher into the experiment's state files; the
    environment Ray's workers inherited (which may hold secrets) stays in memory."""
    import pickle

    from searchlab.experiment._adapters import RunControl

    control = RunControl()
    control.worker_environ = {"AWS_SECRET_ACCESS_KEY": "do-not-write-me"}
    saved = pickle.dumps(control)
    assert b"do-not-write-me" not in saved
    assert pickle.loads(saved).worker_environ is None
    assert control.worker_environ == {"AWS_SECRET_ACCESS_KEY": "do-not-write-me"}


def test_the_runs_environment_keeps_the_users_values_and_is_undone_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from searchlab._ray_env import ray_environment

    monkeypatch.setenv("RAY_DEDUP_LOGS", "1")  # the user's own value of a run default
    monkeypatch.delenv("TUNE_GLOBAL_CHECKPOINT_S", raising=False)
    monkeypatch.delenv("SEARCHLAB_EXTRA_TEST", raising=False)
    with ray_environment({"SEARCHLAB_EXTRA_TEST": "x"}):
        assert os.environ["RAY_DEDUP_LOGS"] == "1"
        assert os.environ["TUNE_GLOBAL_CHECKPOINT_S"] == "1"  # a default where unset
        assert os.environ["SEARCHLAB_EXTRA_TEST"] == "x"
    assert os.environ["RAY_DEDUP_LOGS"] == "1"
    assert "TUNE_GLOBAL_CHECKPOINT_S" not in os.environ
    assert "SEARCHLAB_EXTRA_TEST" not in os.environ
