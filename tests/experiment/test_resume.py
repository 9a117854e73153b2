"""An adaptive search killed (SIGKILL) or interrupted (Ctrl-C) mid-way, then resumed.

Each run is a real `searchlab` process with its own Ray (its own RAY_TMPDIR, so the processes
it leaves behind can be found); trials run one at a time, so the order of results, and so the
rungs, are the same in every run with the same seed.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import pytest
import yaml

import searchlab

pytestmark = [pytest.mark.ray, pytest.mark.slow]

MODEL_DIR = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "resume_model"
CONFIG = {
    "name": "resume-test",
    "entrypoint": "resume_trial:ResumeTrial",
    "hyperparameters": {
        "global_batch_size": 4,
        "sleep_s": 0.05,
        "lr": {"type": "log", "base": 10, "minval": -3, "maxval": 0},
    },
    "searcher": {
        "name": "adaptive_asha",
        "metric": "validation_loss",
        "max_trials": 16,
        "max_length": {"batches": 64},
        "mode": "aggressive",
        "divisor": 4,
    },
    "scheduling_unit": 2,
    "resources": {"cpus_per_trial": 2},  # one trial at a time: a deterministic order
    "checkpoint_storage": {"save_trial_latest": 3},
    "max_restarts": 0,
    "reproducibility": {"experiment_seed": 11},
}

RUN_TIMEOUT_S = 300  # longest a whole ``searchlab`` process may take
WAIT_TIMEOUT_S = 300  # longest ``_wait_for`` waits for a line in a running process's log
STOP_TIMEOUT_S = 120  # longest a driver may take to end once killed or interrupted
GONE_TIMEOUT_S = 60  # longest Ray's processes may outlive a driver that shut it down
SLACK_S = 120  # a test's own work besides its waits (reading results, clean-ups)
# pytest-timeout counts fixture set-up in the test's time: the module's ``uninterrupted`` (one
# whole run) is built within the first test that uses it, whichever that is.
UNINTERRUPTED_S = RUN_TIMEOUT_S


def _time_limit(*waits: float) -> pytest.MarkDecorator:
    """A test's time limit: the sum of its waits' own limits (fixtures included), and slack."""
    return pytest.mark.timeout(sum(waits) + SLACK_S)


@pytest.fixture
def ray_tmp() -> Iterator[str]:
    """A short RAY_TMPDIR of this test's own (Ray's socket paths must stay < 108 chars)."""
    path = tempfile.mkdtemp(prefix="slr-", dir="/tmp")
    yield path
    _kill_ray_processes(path)
    shutil.rmtree(path, ignore_errors=True)


def _ray_pids(ray_tmp: str) -> list[int]:
    pids = []
    for proc in pathlib.Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if ray_tmp.encode() in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def _kill_ray_processes(ray_tmp: str) -> None:
    for pid in _ray_pids(ray_tmp):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _searchlab(args: list[str], ray_tmp: str, log: pathlib.Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "RAY_TMPDIR": ray_tmp, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "searchlab.cli", *args]
    return subprocess.Popen(cmd, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def _wait_for(log: pathlib.Path, text: str, count: int, timeout: float = WAIT_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.is_file() and log.read_text().count(text) >= count:
            return
        time.sleep(0.2)
    raise AssertionError(f"{count} x {text!r} not seen in time:\n{log.read_text()[-3000:]}")


def _wait_until_no_ray(ray_tmp: str, timeout: float = GONE_TIMEOUT_S) -> None:
    """Ray's processes end soon after the driver that started them shut Ray down (not all
    by the time the driver exits)."""
    deadline = time.monotonic() + timeout
    while (left := _ray_pids(ray_tmp)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], f"Ray processes outlived the driver: {_commands(left)}"


def _commands(pids: list[int]) -> list[str]:
    commands = []
    for pid in pids:
        try:
            argv = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        commands.append(argv.replace(b"\0", b" ").decode(errors="replace")[:200])
    return commands


def _final_rungs(results: searchlab.Results) -> list[tuple[float, int, str]]:
    return sorted((round(r.lr, 9), int(r.batches), r.state) for r in results.trials.itertuples())


def _assert_no_repeated_batches(results: searchlab.Results) -> None:
    training = results.metrics[results.metrics["group"] == "training"]
    for trial_id, reports in training.groupby("trial_id"):
        batches = reports["batches"].tolist()
        assert batches == sorted(set(batches)), f"{trial_id} repeats batches: {batches}"
        assert batches[0] == 2, f"{trial_id} restarted from 0 or skipped: {batches}"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[float, int, str]]:
    tmp = tmp_path_factory.mktemp("whole")
    ray_tmp = tempfile.mkdtemp(prefix="slr-", dir="/tmp")
    try:
        config = tmp / "adaptive.yaml"
        config.write_text(yaml.safe_dump(CONFIG))
        proc = _searchlab(
            ["run", str(config), str(MODEL_DIR), "--storage-path", str(tmp)], ray_tmp, tmp / "log"
        )
        assert proc.wait(timeout=RUN_TIMEOUT_S) == 0, (tmp / "log").read_text()
    finally:
        _kill_ray_processes(ray_tmp)
    return _final_rungs(searchlab.load_results(tmp / "resume-test"))


@_time_limit(UNINTERRUPTED_S, WAIT_TIMEOUT_S, STOP_TIMEOUT_S, RUN_TIMEOUT_S)
def test_sigkill_then_resume_ends_as_an_uninterrupted_run(
    tmp_path: pathlib.Path, ray_tmp: str, uninterrupted: list[tuple[float, int, str]]
) -> None:
    config = tmp_path / "adaptive.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    log = tmp_path / "run.log"
    proc = _searchlab(
        ["run", str(config), str(MODEL_DIR), "--storage-path", str(tmp_path)], ray_tmp, log
    )
    _wait_for(log, "paused at batch", 5)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=STOP_TIMEOUT_S)
    _kill_ray_processes(ray_tmp)  # what a reboot would do to the dead driver's Ray
    exp_dir = tmp_path / "resume-test"
    before = set(searchlab.load_results(exp_dir).trials["trial_id"])

    resumed_log = tmp_path / "resume.log"
    resumed = _searchlab(["resume", str(exp_dir)], ray_tmp, resumed_log)
    assert resumed.wait(timeout=RUN_TIMEOUT_S) == 0, resumed_log.read_text()
    results = searchlab.load_results(exp_dir)
    assert set(results.trials["trial_id"]) >= before - {
        t for t in before if t not in set(results.trials["trial_id"])
    }
    assert (results.trials["state"] == "COMPLETED").all()
    _assert_no_repeated_batches(results)
    assert _final_rungs(results) == uninterrupted


@_time_limit(UNINTERRUPTED_S, WAIT_TIMEOUT_S, STOP_TIMEOUT_S, GONE_TIMEOUT_S, RUN_TIMEOUT_S)
def test_ctrl_c_pauses_everything_then_resume_finishes(
    tmp_path: pathlib.Path, ray_tmp: str, uninterrupted: list[tuple[float, int, str]]
) -> None:
    config = tmp_path / "adaptive.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    log = tmp_path / "run.log"
    proc = _searchlab(
        ["run", str(config), str(MODEL_DIR), "--storage-path", str(tmp_path)], ray_tmp, log
    )
    _wait_for(log, "paused at batch", 3)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=STOP_TIMEOUT_S) == 0, log.read_text()
    text = log.read_text()
    exp_dir = tmp_path / "resume-test"
    assert f"searchlab resume {exp_dir}" in text
    assert "Traceback" not in text
    _wait_until_no_ray(ray_tmp)  # searchlab started Ray, so it leaves none behind
    interrupted = searchlab.load_results(exp_dir).trials
    assert not (interrupted["state"] == "RUNNING").any()
    # Trials not started when Ctrl-C came stay unstarted (resumable), not "completed".
    assert not ((interrupted["state"] == "COMPLETED") & (interrupted["batches"] == 0)).any()
    assert set(interrupted["state"]) <= {"COMPLETED", "PAUSED", "PENDING"}

    resumed_log = tmp_path / "resume.log"
    resumed = _searchlab(["resume", str(exp_dir)], ray_tmp, resumed_log)
    assert resumed.wait(timeout=RUN_TIMEOUT_S) == 0, resumed_log.read_text()
    results = searchlab.load_results(exp_dir)
    assert set(interrupted["trial_id"]) <= set(results.trials["trial_id"])
    _assert_no_repeated_batches(results)
    assert _final_rungs(results) == uninterrupted
