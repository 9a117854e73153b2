"""``searchlab run --address`` against a real two-node Ray cluster started with ``ray start``.

Everything here runs in subprocesses, so the session's own Ray instance is left alone. The
cluster is stopped by terminating the two ``ray start --block`` processes this test started
(each takes its node's processes down with it): ``ray stop`` would kill every Ray instance on
the machine, the test session's and anyone else's included. Each node gets its own short
``--temp-dir``: that keeps ``/tmp/ray/ray_current_cluster`` (which a bare ``ray.init()`` joins)
untouched, keeps Ray's socket paths under the 107-character limit, and gives each node its own
copy of the shipped model directory.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from driver_procs import kill_ray_processes
from toy_experiment import TOY_MODEL_DIR, toy_config

import searchlab

pytestmark = [pytest.mark.ray, pytest.mark.slow]

BIN = pathlib.Path(sys.executable).parent
START_TIMEOUT_S = 90
_PR_SET_PDEATHSIG = 1

# Reads the cluster's state from the GCS (``ray.util.state`` needs the dashboard's packages).
CLUSTER_STATE = """
import json, sys
import ray
from ray._private import state

ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
me = ray.get_runtime_context().get_job_id()
print(json.dumps({
    "nodes": sum(1 for n in ray.nodes() if n["Alive"]),
    "cpus": ray.cluster_resources().get("CPU", 0),
    "free_cpus": ray.available_resources().get("CPU", 0),
    "live_actors": len(state.actors(actor_state_name="ALIVE")),
    "placement_groups": sum(
        1 for pg in ray.util.placement_group_table().values() if pg["state"] != "REMOVED"
    ),
    "other_live_drivers": sum(
        1 for job in state.jobs() if not job["IsDead"] and job["JobID"] != me
    ),
}))
"""


@dataclasses.dataclass
class LocalCluster:
    address: str
    root: pathlib.Path
    env: dict[str, str]

    def state(self) -> dict[str, Any]:
        proc = subprocess.run(
            [sys.executable, "-c", CLUSTER_STATE, self.address],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_node(
    args: list[str], temp_dir: pathlib.Path, env: dict[str, str], procs: list[subprocess.Popen]
) -> subprocess.Popen:
    temp_dir.mkdir()
    log = (temp_dir.parent / f"{temp_dir.name}.log").open("w")
    command = [
        str(BIN / "ray"),
        "start",
        *args,
        "--num-cpus=1",
        f"--temp-dir={temp_dir}",
        f"--dashboard-agent-listen-port={_free_port()}",
        "--disable-usage-stats",
        "--block",  # stays in the foreground: terminating it stops this node
    ]
    proc = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=_die_with_parent
    )
    procs.append(proc)
    return proc


def _die_with_parent() -> None:
    """SIGTERM this node's ``ray start`` if the test process dies without stopping it (Linux)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _log_tail(root: pathlib.Path) -> str:
    return "\n".join(f"--- {log.name}\n{log.read_text()[-2000:]}" for log in root.glob("*.log"))


def _wait_for_head(root: pathlib.Path, head: subprocess.Popen) -> str:
    address_file = root / "head" / "ray_current_cluster"
    deadline = time.monotonic() + START_TIMEOUT_S
    while not address_file.is_file() or not address_file.read_text().strip():
        if head.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the head node did not start:\n{_log_tail(root)}")
        time.sleep(0.5)
    return address_file.read_text().strip()


def _wait_for_nodes(cluster: LocalCluster, count: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while cluster.state()["nodes"] < count:
        if time.monotonic() > deadline:
            pytest.fail(f"the worker node did not join:\n{_log_tail(cluster.root)}")
        time.sleep(1)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()  # `ray start --block` drains and stops its node's processes
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


@pytest.fixture(scope="module")
def local_cluster() -> Iterator[LocalCluster]:
    """A head node and one worker node, 1 CPU each, on this machine."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="slray-", dir="/tmp"))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    procs: list[subprocess.Popen] = []
    try:
        head = _start_node(
            [
                "--head",
                f"--port={_free_port()}",
                "--include-dashboard=false",
                f"--dashboard-port={_free_port()}",
            ],
            root / "head",
            env,
            procs,
        )
        address = _wait_for_head(root, head)
        cluster = LocalCluster(address, root, env)
        _start_node([f"--address={address}"], root / "worker", env, procs)
        _wait_for_nodes(cluster, 2)
        yield cluster
    finally:
        for proc in reversed(procs):
            _stop(proc)
        shutil.rmtree(root, ignore_errors=True)


def _wait_until_clean(cluster: LocalCluster, timeout_s: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        state = cluster.state()
        clean = (
            state["live_actors"] == 0
            and state["placement_groups"] == 0
            and state["other_live_drivers"] == 0
            and state["free_cpus"] == state["cpus"]
        )
        if clean or time.monotonic() > deadline:
            return state
        time.sleep(1)


NOTEBOOK = """
import sys
import ray
import searchlab

ray.init(address=sys.argv[1], log_to_driver=False)
searchlab.run(sys.argv[2], model_dir=sys.argv[3], storage_path=sys.argv[4])
"""


BARRIER_TRIAL = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "barrier_trial"


def _experiment(
    tmp_path: pathlib.Path, *, together: bool = False
) -> tuple[pathlib.Path, pathlib.Path, pathlib.Path]:
    """A copy of the toy model directory and a 2-trial grid config that records imports.

    ``together``: each trial, once built, waits until both have been built before it trains
    (``barrier_trial.py``, copied beside the toy model). A waiting trial holds its node's one
    CPU, so the trials run at the same time, one on each node, however long either node's
    worker takes to start."""
    model_dir = tmp_path / "model"
    shutil.copytree(TOY_MODEL_DIR, model_dir, ignore=shutil.ignore_patterns("__pycache__"))
    hyperparameters: dict[str, Any] = {
        "hidden": {"type": "categorical", "vals": [4, 8]},
        "record_dir": str(tmp_path / "records"),
    }
    fields: dict[str, Any] = {}
    if together:
        shutil.copy(BARRIER_TRIAL / "barrier_trial.py", model_dir)
        fields["entrypoint"] = "barrier_trial:BarrierTrial"
        hyperparameters["barrier_dir"] = str(tmp_path / "barrier")
        hyperparameters["barrier_parties"] = 2
    config = toy_config(
        "cluster-run",
        hyperparameters=hyperparameters,
        searcher={"name": "grid", "max_length": {"batches": 6}},
        **fields,
    )
    config_file = tmp_path / "cluster.yaml"
    config_file.write_text(yaml.safe_dump(config))
    return config_file, model_dir, tmp_path / "results"


def _check_finished(storage: pathlib.Path) -> None:
    results = searchlab.load_results(storage / "cluster-run")
    assert results.trials["state"].tolist() == ["COMPLETED", "COMPLETED"]
    assert sorted(results.trials["hidden"]) == [4, 8]
    for checkpoint in results.trials["checkpoint"]:
        assert (pathlib.Path(checkpoint) / "state-dict.pth").is_file()


def _check_shipped(tmp_path: pathlib.Path, model_dir: pathlib.Path, root: pathlib.Path) -> None:
    """Every trial imported the model from Ray's copy on its own node, not from model_dir."""
    origins = [json.loads(f.read_text()) for f in (tmp_path / "records").glob("*.json")]
    assert len(origins) >= 2
    nodes_used = set()
    for origin in origins:
        module_file = pathlib.Path(origin["module_file"])
        assert not module_file.is_relative_to(model_dir), origin
        assert module_file.is_relative_to(root), origin
        assert "runtime_resources" in module_file.parts, origin
        assert pathlib.Path(origin["cwd"]) == module_file.parent
        nodes_used.add(module_file.relative_to(root).parts[0])
    assert nodes_used == {"head", "worker"}


def _check_shipped_as_archive(tmp_path: pathlib.Path, model_dir: pathlib.Path) -> None:
    """Ray was up before searchlab.run (a notebook): the model dir travelled through Ray's
    object store and each worker imported it from its unpacked copy, not from model_dir."""
    origins = [json.loads(f.read_text()) for f in (tmp_path / "records").glob("*.json")]
    assert len(origins) >= 2
    for origin in origins:
        module_file = pathlib.Path(origin["module_file"])
        assert not module_file.is_relative_to(model_dir), origin
        # ... in this user's private directory of shipped model code
        assert f"searchlab-models-{os.getuid()}" in module_file.parts, origin


def _check_running_and_clean(cluster: LocalCluster) -> None:
    status = subprocess.run(
        [str(BIN / "ray"), "status", f"--address={cluster.address}"],
        capture_output=True,
        text=True,
        env=cluster.env,
        timeout=60,
    )
    assert status.returncode == 0, status.stderr[-2000:]
    assert _wait_until_clean(cluster) == {
        "nodes": 2,
        "cpus": 2.0,
        "free_cpus": 2.0,
        "live_actors": 0,
        "placement_groups": 0,
        "other_live_drivers": 0,
    }


def test_searchlab_run_address_ships_the_model_dir_and_leaves_the_cluster_clean(
    local_cluster: LocalCluster, tmp_path: pathlib.Path
) -> None:
    config_file, model_dir, storage = _experiment(tmp_path, together=True)
    proc = subprocess.run(
        [
            str(BIN / "searchlab"),
            *("run", str(config_file), str(model_dir)),
            *("--storage-path", str(storage), "--address", local_cluster.address),
        ],
        capture_output=True,
        text=True,
        env=local_cluster.env,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "best trial:" in proc.stdout
    _check_finished(storage)
    _check_shipped(tmp_path, model_dir, local_cluster.root)
    _check_running_and_clean(local_cluster)


def test_searchlab_run_without_an_address_starts_its_own_ray_beside_a_running_one(
    local_cluster: LocalCluster, tmp_path: pathlib.Path
) -> None:
    """Ray alone would join the cluster ``ray start`` last ran on this machine; searchlab
    starts Ray locally, as its README says (its workers inherit the run's environment)."""
    config_file, model_dir, storage = _experiment(tmp_path)
    ray_tmp = pathlib.Path(tempfile.mkdtemp(prefix="slr-", dir="/tmp"))
    try:
        (ray_tmp / "ray").mkdir()
        (ray_tmp / "ray" / "ray_current_cluster").write_text(local_cluster.address)
        args = ["run", str(config_file), str(model_dir), "--storage-path", str(storage)]
        proc = subprocess.run(
            [str(BIN / "searchlab"), *args],
            capture_output=True,
            text=True,
            env={**local_cluster.env, "RAY_TMPDIR": str(ray_tmp)},
            cwd=tmp_path,
            timeout=300,
        )
    finally:
        kill_ray_processes(str(ray_tmp))
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _check_finished(storage)
    origins = [json.loads(f.read_text()) for f in (tmp_path / "records").glob("*.json")]
    assert len(origins) >= 2
    assert local_cluster.address not in {origin["gcs_address"] for origin in origins}
    assert None not in {origin["gcs_address"] for origin in origins}
    _check_running_and_clean(local_cluster)


def test_searchlab_run_in_a_process_already_on_the_cluster_ships_the_model_dir(
    local_cluster: LocalCluster, tmp_path: pathlib.Path
) -> None:
    config_file, model_dir, storage = _experiment(tmp_path)
    proc = subprocess.run(
        [
            *(sys.executable, "-c", NOTEBOOK, local_cluster.address),
            *(str(config_file), str(model_dir), str(storage)),
        ],
        capture_output=True,
        text=True,
        env=local_cluster.env,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _check_finished(storage)
    _check_running_and_clean(local_cluster)
    _check_shipped_as_archive(tmp_path, model_dir)
