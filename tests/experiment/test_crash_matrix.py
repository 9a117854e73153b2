"""``kill -9`` of the driver at each dangerous moment of an adaptive search, then resume.

Each case runs a real ``searchlab run`` that a named crash point (``searchlab._failpoints``)
kills at an exact moment, then ``searchlab resume``, and asserts the same final trials, the
same kept reports (every batch, every value) and the same final rung table as an
uninterrupted run with the same seed. Trials run one at a time, so the order of results, and
so the search, is the same in every run.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from driver_procs import (
    RUN_TIMEOUT_S,
    WAIT_TIMEOUT_S,
    last_rung_table,
    ray_pids,
    ray_tmpdir,
    run_to_end,
    search_outcome,
    start,
    wait_for,
)

import searchlab
from searchlab._lock import LOCK_FILE, driver_alive

pytestmark = [pytest.mark.ray, pytest.mark.slow]

MODEL_DIR = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "resume_model"
NAME = "crash-matrix"
CONFIG = {
    "name": NAME,
    "entrypoint": "resume_trial:ResumeTrial",
    "hyperparameters": {
        "global_batch_size": 4,
        "sleep_s": 0.01,
        "lr": {"type": "log", "base": 10, "minval": -3, "maxval": 0},
    },
    "searcher": {
        "name": "adaptive_asha",
        "metric": "validation_loss",
        "max_trials": 8,
        "max_length": {"batches": 16},
        "mode": "aggressive",
        "divisor": 2,
    },
    "scheduling_unit": 1,
    "resources": {"cpus_per_trial": 2},  # one trial at a time: a deterministic order
    "max_restarts": 0,
    "reproducibility": {"experiment_seed": 42},
}

# (crash point, how many times it is passed before the kill): the phases of a search.
KILL_POINTS = [
    ("checkpoint-registered", 3),  # Tune took a checkpoint; retention let an older one go
    ("checkpoint-write", 4),  # a worker wrote a rung's checkpoint; Tune has not taken it
    ("result-after-resume", 1),  # a promoted trial was resumed and reported its first result
    ("trial-finished", 1),  # a trial just finished
    ("trials-stopped", 1),  # close-out: paused trials that will never go on were stopped
    ("searcher-save", 3),  # Tune wrote its experiment state, not yet the search's (a run makes 5-6)
    # the snapshot's temporary file is written (once per Tune save: not the last one)
    ("write-searchlab_state.json", 3),
    ("write-trials.json", 9),  # trials.json's temporary file is written
]

GONE_TIMEOUT_S = 120  # longest a killed driver's Ray may outlive it (its reaper ends it)
FINISH_TIMEOUT_S = 300  # longest a driver let go on (SIGCONT) may take to finish the search
FULL_DISK_EXIT_S = 120  # longest a driver may take to stop once its disk is full
STOP_TIMEOUT_S = 60  # longest a driver sent SIGSTOP may take to show as stopped
SLACK_S = 120  # a test's own work besides its waits (copies, reading results, clean-ups)
# The module's fixtures, each built (one whole ``searchlab`` process) within the first test
# that uses it, whichever that is: pytest-timeout counts fixture set-up in the test's time.
UNINTERRUPTED_S = KILLED_S = RUN_TIMEOUT_S


def _time_limit(*waits: float) -> pytest.MarkDecorator:
    """A test's time limit: the sum of its waits' own limits (fixtures included), and slack."""
    return pytest.mark.timeout(sum(waits) + SLACK_S)


def _config_file(tmp: pathlib.Path) -> pathlib.Path:
    path = tmp / "adaptive.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    return path


def _run_args(tmp: pathlib.Path) -> list[str]:
    return ["run", str(_config_file(tmp)), str(MODEL_DIR), "--storage-path", str(tmp)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("whole")
    log = tmp / "log"
    with ray_tmpdir() as ray_tmp:
        assert run_to_end(_run_args(tmp), ray_tmp, log) == 0, log.read_text()
    return {"outcome": search_outcome(tmp / NAME), "rungs": last_rung_table(log)}


def _killed_at(point: str, count: int, tmp: pathlib.Path, ray_tmp: str) -> pathlib.Path:
    log = tmp / "run.log"
    code = run_to_end(
        _run_args(tmp), ray_tmp, log, env={"SEARCHLAB_FAILPOINTS": f"{point}:{count}"}
    )
    assert code == -signal.SIGKILL, (
        f"not killed at {point}:{count} (exit {code}):\n{log.read_text()}"
    )
    return tmp / NAME


def _resume(exp_dir: pathlib.Path, ray_tmp: str, log: pathlib.Path, *extra: str) -> int:
    return run_to_end(["resume", str(exp_dir), *extra], ray_tmp, log)


@_time_limit(UNINTERRUPTED_S, RUN_TIMEOUT_S, GONE_TIMEOUT_S, RUN_TIMEOUT_S)
@pytest.mark.parametrize(("point", "count"), KILL_POINTS, ids=[p for p, _ in KILL_POINTS])
def test_kill_then_resume_ends_as_an_uninterrupted_run(
    point: str, count: int, tmp_path: pathlib.Path, uninterrupted: dict[str, Any]
) -> None:
    with ray_tmpdir() as ray_tmp:
        exp_dir = _killed_at(point, count, tmp_path, ray_tmp)
        # Nothing of the dead driver's Ray is left for long: its reaper ends it.
        _wait_until_gone(ray_tmp)
        log = tmp_path / "resume.log"
        assert _resume(exp_dir, ray_tmp, log) == 0, log.read_text()
    text = log.read_text()
    assert "Traceback" not in text
    # Every trial resumed from the checkpoint the saved state named: none was missing (a
    # trial would fall back to an earlier one, or start over) and none was damaged.
    assert "warning:" not in text and "is missing" not in text, text
    assert search_outcome(exp_dir) == uninterrupted["outcome"]
    assert last_rung_table(log) == uninterrupted["rungs"]
    assert len(list(exp_dir.glob("experiment_state-*.json"))) == 2  # one per driver session
    _assert_checkpoints_kept(exp_dir)


def _wait_until_gone(ray_tmp: str, timeout: float = GONE_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while ray_pids(ray_tmp) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray_pids(ray_tmp) == [], "the dead driver's Ray processes outlived it"


def _assert_checkpoints_kept(exp_dir: pathlib.Path) -> None:
    """Every checkpoint trials.json names is on disk, and only those (save_trial_latest 1 and
    save_trial_best 1 keep at most two per trial)."""
    results = searchlab.load_results(exp_dir)
    for row in results.trials.itertuples():
        if isinstance(row.checkpoint, str):
            assert (pathlib.Path(row.checkpoint) / "state-dict.pth").is_file(), row.checkpoint
        kept = list((exp_dir / row.trial_id).glob("checkpoint_*"))
        assert 1 <= len(kept) <= 2, (row.trial_id, sorted(p.name for p in kept))


# -- damaged state, copies, two drivers, a full disk ------------------------------------------


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """An experiment killed mid-way (after a promotion's first result), to copy and damage."""
    tmp = tmp_path_factory.mktemp("killed")
    with ray_tmpdir() as ray_tmp:
        return _killed_at("result-after-resume", 1, tmp, ray_tmp)


def _copy(killed: pathlib.Path, tmp: pathlib.Path) -> pathlib.Path:
    target = tmp / "copy" / NAME
    shutil.copytree(killed, target)
    return target


def _truncate(path: pathlib.Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@_time_limit(KILLED_S, UNINTERRUPTED_S, RUN_TIMEOUT_S)
@pytest.mark.parametrize(
    "pattern", ["experiment_state-*.json", "search_gen_state-*.json", "searcher-state-*.pkl"]
)
def test_truncated_tune_state_is_restored_from_the_snapshot(
    pattern: str, killed: pathlib.Path, tmp_path: pathlib.Path, uninterrupted: dict[str, Any]
) -> None:
    exp_dir = _copy(killed, tmp_path)
    (damaged,) = exp_dir.glob(pattern)
    _truncate(damaged)
    log = tmp_path / "resume.log"
    with ray_tmpdir() as ray_tmp:
        assert _resume(exp_dir, ray_tmp, log) == 0, log.read_text()
    assert f"{damaged.name} was incomplete" in log.read_text()  # said, not silent
    assert search_outcome(exp_dir) == uninterrupted["outcome"]
    assert last_rung_table(log) == uninterrupted["rungs"]


@_time_limit(KILLED_S, RUN_TIMEOUT_S)
@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            "searchlab_state.json",
            r"searchlab_state.json: damaged \(not valid JSON.*--force-restart",
        ),
        ("experiment.json", r"experiment.json: damaged \(.*restore it from a backup"),
        ("trials.json", r"trials.json: damaged \(.*restore it from a backup"),
    ],
)
def test_a_damaged_state_file_is_refused_in_one_line(
    damage: str, message: str, killed: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    exp_dir = _copy(killed, tmp_path)
    _truncate(exp_dir / damage)
    before = _tree(exp_dir)
    log = tmp_path / "resume.log"
    with ray_tmpdir() as ray_tmp:
        assert _resume(exp_dir, ray_tmp, log) == 2
    lines = log.read_text().strip().splitlines()
    assert len(lines) == 1 and re.search(message, lines[0]), lines
    assert _tree(exp_dir) == before  # nothing written, nothing deleted


@_time_limit(KILLED_S, RUN_TIMEOUT_S, RUN_TIMEOUT_S)
def test_an_edited_config_is_refused_naming_the_change_then_force_restart_runs_it(
    killed: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    exp_dir = _copy(killed, tmp_path)
    meta_file = exp_dir / "experiment.json"
    meta = json.loads(meta_file.read_text())
    meta["config"]["searcher"]["max_trials"] = 16
    meta.pop("config_sha256")  # an edit that also drops the digest is caught by the snapshot
    meta_file.write_text(json.dumps(meta))
    log = tmp_path / "resume.log"
    with ray_tmpdir() as ray_tmp:
        assert _resume(exp_dir, ray_tmp, log) == 2
        line = log.read_text().strip()
        assert "searcher.max_trials: 8 -> 16" in line and "--force-restart" in line, line
        assert "\n" not in line
        forced = tmp_path / "forced.log"
        assert _resume(exp_dir, ray_tmp, forced, "--force-restart") == 0, forced.read_text()
    restarted = searchlab.load_results(exp_dir.parent / f"{NAME}-restart")
    assert len(restarted.trials) == 16 and (restarted.trials["state"] == "COMPLETED").all()


@_time_limit(KILLED_S, UNINTERRUPTED_S, RUN_TIMEOUT_S)
def test_resuming_a_copy_leaves_the_original_untouched(
    killed: pathlib.Path, tmp_path: pathlib.Path, uninterrupted: dict[str, Any]
) -> None:
    original = _copy(killed, tmp_path / "a")  # a private original, so other tests share nothing
    before, first_ran_in = _tree(original), _tree(killed)
    copy = _copy(original, tmp_path / "b")
    log = tmp_path / "resume.log"
    with ray_tmpdir() as ray_tmp:
        assert _resume(copy, ray_tmp, log) == 0, log.read_text()
    assert _tree(original) == before  # retention deleted only the copy's own checkpoints
    # Nor did the trials the resumed search created write where the search first ran (the
    # directory Tune's saved state names): they are in the copy, checkpoints and all.
    assert _tree(killed) == first_ran_in
    assert search_outcome(copy) == uninterrupted["outcome"]
    assert str(original) not in (copy / "trials.json").read_text()
    _assert_checkpoints_kept(copy)


@_time_limit(KILLED_S, WAIT_TIMEOUT_S, STOP_TIMEOUT_S, RUN_TIMEOUT_S, FINISH_TIMEOUT_S)
def test_a_second_driver_on_the_same_directory_is_refused(
    killed: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    exp_dir = _copy(killed, tmp_path)
    lock = exp_dir / LOCK_FILE
    with ray_tmpdir() as ray_tmp:
        first = start(["resume", str(exp_dir)], ray_tmp, tmp_path / "first.log")
        try:
            wait_for(tmp_path / "first.log", "continues")
            # Stopped, the first driver cannot finish the search (and let the lock go) while
            # the second one starts up; a stopped process keeps its open files, its flock too.
            first.send_signal(signal.SIGSTOP)
            _wait_until_stopped(first)
            assert driver_alive(exp_dir) and json.loads(lock.read_text())["pid"] == first.pid
            second = tmp_path / "second.log"
            assert _resume(exp_dir, ray_tmp, second) == 2, second.read_text()
            line = second.read_text().strip()
            assert f"in use by another searchlab driver (pid {first.pid} on" in line, line
            assert _state(first) == "T"  # the first was stopped all along: it held the lock
            first.send_signal(signal.SIGCONT)
            assert first.wait(timeout=FINISH_TIMEOUT_S) == 0, (tmp_path / "first.log").read_text()
        finally:
            if first.poll() is None:
                first.kill()  # SIGKILL ends a stopped process too
    assert not driver_alive(exp_dir)  # the first let it go when it ended
    assert (searchlab.load_results(exp_dir).trials["state"] == "COMPLETED").all()


def _state(proc: subprocess.Popen[bytes]) -> str:
    """The process's state letter (``T``: stopped), from /proc/<pid>/stat."""
    assert proc.poll() is None, f"driver {proc.pid} ended (exit {proc.returncode})"
    stat = pathlib.Path(f"/proc/{proc.pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


def _wait_until_stopped(proc: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while _state(proc) != "T":
        assert time.monotonic() < deadline, f"driver {proc.pid} not stopped: {_state(proc)}"
        time.sleep(0.1)


def _tree(root: pathlib.Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != LOCK_FILE
    }


@pytest.fixture
def small_disk(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    """A 32 MiB tmpfs of the test's own (needs root, as the CI machine is)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@_time_limit(UNINTERRUPTED_S, WAIT_TIMEOUT_S, FULL_DISK_EXIT_S, RUN_TIMEOUT_S)
def test_a_full_disk_pauses_the_search_resumably_and_says_so(
    small_disk: pathlib.Path, tmp_path: pathlib.Path, uninterrupted: dict[str, Any]
) -> None:
    config = _config_file(tmp_path)
    args = ["run", str(config), str(MODEL_DIR), "--storage-path", str(small_disk)]
    log = tmp_path / "run.log"
    filler = small_disk / "filler"
    with ray_tmpdir() as ray_tmp:
        proc = start(args, ray_tmp, log)
        try:
            wait_for(log, "paused at batch", 4)
            with filler.open("wb") as f:  # the disk fills up mid-search
                with contextlib.suppress(OSError):
                    while True:
                        f.write(b"\0" * (1 << 20))
                        f.flush()
            assert proc.wait(timeout=FULL_DISK_EXIT_S) == 2, log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
        text = log.read_text()
        assert "Traceback" not in text, text
        last = text.strip().splitlines()[-1]
        assert last.startswith("searchlab: error: cannot write ") and "No space left" in last
        assert f"searchlab resume {small_disk / NAME}" in last
        assert not list(small_disk.glob(f"{NAME}/.*.tmp"))  # no half-written file left
        states = set(searchlab.load_results(small_disk / NAME).trials["state"])
        assert states <= {"COMPLETED", "PAUSED", "PENDING"}, states  # nothing shown RUNNING

        filler.unlink()
        resumed = tmp_path / "resume.log"
        assert _resume(small_disk / NAME, ray_tmp, resumed) == 0, resumed.read_text()
    assert search_outcome(small_disk / NAME) == uninterrupted["outcome"]
    assert last_rung_table(resumed) == uninterrupted["rungs"]


@_time_limit(UNINTERRUPTED_S, RUN_TIMEOUT_S, GONE_TIMEOUT_S, RUN_TIMEOUT_S)
def test_kill_during_a_background_checkpoint_write_resumes_from_the_previous_checkpoint(
    tmp_path: pathlib.Path, uninterrupted: dict[str, Any]
) -> None:
    # The third staged rung-end state: its small files in place, its state not yet.
    with ray_tmpdir() as ray_tmp:
        exp_dir = _killed_at("checkpoint-background-write", 3, tmp_path, ray_tmp)
        unfinished = [p.parent for p in exp_dir.glob("*/checkpoint_*/state-dict.writing")]
        assert unfinished and not any((p / "state-dict.pth").exists() for p in unfinished)
        _wait_until_gone(ray_tmp)
        log = tmp_path / "resume.log"
        assert _resume(exp_dir, ray_tmp, log) == 0, log.read_text()
    text = log.read_text()
    assert "Traceback" not in text
    assert search_outcome(exp_dir) == uninterrupted["outcome"]
    assert last_rung_table(log) == uninterrupted["rungs"]
    _assert_checkpoints_kept(exp_dir)
