"""Standby (``SEARCHLAB_STANDBY=1``): two trial actors per GPU, one training at a time.

The GPU lock itself (exclusive, handed over at once, freed when its holder dies, kept in a
private directory), what a trial asks Ray for, and a search on a Ray node that declares one
GPU (the trials train on the CPU): two actors take turns, never training at the same time.
"""

from __future__ import annotations

import collections
import itertools
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from typing import Any

import pytest
from runner_steps import asha_model_dir, gpu_is_free, run_search_script

from searchlab.config import load_experiment_config
from searchlab.errors import ConfigError
from searchlab.experiment._resources import trial_resources
from searchlab.experiment._spec import ExperimentSpec, check_environment
from searchlab.experiment._standby import GpuBaton, baton_dir

ROOT = pathlib.Path(__file__).resolve().parents[2]
ASHA_MODEL = ROOT / "tests" / "fixtures" / "asha_model"
NODE = "a1b2c3"


@pytest.fixture(autouse=True)
def _private_tmp(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))


def _spans(hold: bool, workers: int = 2, rounds: int = 5) -> list[tuple[float, float, int]]:
    """Each worker thread, with a baton of its own on GPU 0 (its own open file, as a process
    of its own would have), trains ``rounds`` 20 ms windows: (start, end, worker) of each.

    Without the baton (``hold`` False) the workers meet inside each window, so their
    windows of a round overlap however late a loaded machine runs a thread."""
    spans: list[tuple[float, float, int]] = []
    batons = [GpuBaton("k1", "0", NODE) for _ in range(workers)]
    start = threading.Barrier(workers)
    meet = threading.Barrier(workers)

    def work(i: int) -> None:
        start.wait()
        for _ in range(rounds):
            with batons[i].held() if hold else _nothing():
                began = time.monotonic()
                if not hold:
                    meet.wait(timeout=60)
                time.sleep(0.02)
                spans.append((began, time.monotonic(), i))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for baton in batons:
        baton.close()
    return sorted(spans)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def _overlaps(spans: list[tuple[float, float, int]]) -> int:
    return sum(1 for a, b in itertools.pairwise(spans) if b[0] < a[1] and a[2] != b[2])


def test_one_holder_at_a_time_and_both_get_turns() -> None:
    spans = _spans(hold=True)
    assert _overlaps(spans) == 0
    assert {w for *_, w in spans} == {0, 1} and len(spans) == 10
    # Without the baton the same windows do overlap: the check above can fail.
    assert _overlaps(_spans(hold=False)) > 0


def test_three_holders_take_turns() -> None:
    # SEARCHLAB_STANDBY=2: three actors on one lock, each with turns, never two at once.
    spans = _spans(hold=True, workers=3, rounds=4)
    assert _overlaps(spans) == 0
    assert collections.Counter(w for *_, w in spans) == {0: 4, 1: 4, 2: 4}
    assert _overlaps(_spans(hold=False, workers=3, rounds=2)) > 0


def test_other_gpus_and_runs_do_not_wait() -> None:
    held, same = GpuBaton("k1", "0", NODE), GpuBaton("k1", "0", NODE)
    others = [GpuBaton("k1", "1", NODE), GpuBaton("k2", "0", NODE), GpuBaton("k1", "0", "d4e5")]
    with held.held():
        assert not gpu_is_free(same)  # the probe can tell a held GPU
        assert all(gpu_is_free(other) for other in others)
    assert gpu_is_free(same)
    for baton in [held, same, *others]:
        baton.close()
    with pytest.raises(RuntimeError, match="closed"), held.held():
        pass


def test_a_forked_child_closes_its_copy_of_the_lock() -> None:
    baton = GpuBaton("k1", "0", NODE)
    fd = baton._fd
    with baton.held():
        pid = os.fork()
        if pid == 0:  # a loader worker forked while the trial trains
            try:
                os.fstat(fd)  # type: ignore[arg-type]
            except OSError:
                os._exit(0 if baton._fd is None else 2)
            os._exit(1)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert baton._fd == fd  # the parent's stays open
    baton.close()


def test_a_killed_holder_gives_the_gpu_back(tmp_path: pathlib.Path) -> None:
    ready = tmp_path / "holding"
    code = textwrap.dedent(
        f"""
        import pathlib, sys, tempfile, time
        tempfile.tempdir = {str(tmp_path)!r}
        from searchlab.experiment._standby import GpuBaton
        baton = GpuBaton("k1", "0", {NODE!r})
        with baton.held():
            pathlib.Path({str(ready)!r}).touch()
            time.sleep(600)
        """
    )
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert holder.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        waiter = GpuBaton("k1", "0", NODE)
        got = threading.Event()

        def take() -> None:
            with waiter.held():
                got.set()

        thread = threading.Thread(target=take, daemon=True)
        thread.start()
        assert not got.wait(0.5)  # the holder has it
        os.kill(holder.pid, signal.SIGKILL)
        assert got.wait(10)  # the kernel freed it with the process
        thread.join()
        waiter.close()
    finally:
        holder.kill()
        holder.wait()


def test_the_lock_directory_is_private(tmp_path: pathlib.Path) -> None:
    made = baton_dir("k1")
    assert made.parent == tmp_path and made.stat().st_mode & 0o777 == 0o700
    assert baton_dir("k1") == made  # the next worker of the run finds it
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / f"searchlab-{os.getuid()}-standby-k2").symlink_to(elsewhere)
    with pytest.raises(PermissionError, match="not a private directory"):
        baton_dir("k2")  # a link another user left in the shared folder
    (tmp_path / f"searchlab-{os.getuid()}-standby-k3").mkdir(mode=0o755)
    os.chmod(tmp_path / f"searchlab-{os.getuid()}-standby-k3", 0o755)
    with pytest.raises(PermissionError, match="not a private directory"):
        baton_dir("k3")
    with pytest.raises(ValueError, match="not alphanumeric"):
        baton_dir("../k")
    # GPU ids that are UUIDs or MIG paths name a lock file all the same.
    mig = GpuBaton("k1", "MIG-GPU-8a7f/1/0", NODE)
    assert mig.path.parent == made and "/" not in mig.path.name
    mig.close()


def test_a_baton_only_for_one_gpu_with_standby_on() -> None:
    assert GpuBaton.for_worker(None, ["0"], NODE) is None
    assert GpuBaton.for_worker("k1", [], NODE) is None  # a CPU trial
    assert GpuBaton.for_worker("k1", ["0", "1"], NODE) is None
    baton = GpuBaton.for_worker("k1", ["3"], NODE)
    other = GpuBaton("k1", "4", NODE)
    assert baton is not None and baton.path.name.endswith(".lock")
    assert baton.path != other.path  # one lock per GPU
    baton.close()
    other.close()


def _cfg(entrypoint: str = "asha_trial:AshaTrial", **resources: Any) -> Any:
    return load_experiment_config(
        {
            "name": "s",
            "entrypoint": entrypoint,
            "hyperparameters": {"global_batch_size": 4, "lr": 0.1},
            "searcher": {"name": "single", "metric": "validation_loss", "max_length": 4},
            "resources": resources,
        },
        model_dir=str(ASHA_MODEL),
    )


def _nodes(cpus: float, gpus: float) -> list[dict[str, Any]]:
    return [{"Alive": True, "Resources": {"CPU": cpus, "GPU": gpus}}]


def test_a_one_gpu_trial_asks_for_half_a_gpu() -> None:
    assert trial_resources(_cfg(), _nodes(8, 1), standby=True) == {"cpu": 1.0, "gpu": 0.5}
    assert trial_resources(_cfg(), _nodes(8, 1)) == {"cpu": 1.0, "gpu": 1.0}
    # Without GPUs there is nothing to take turns on: CPU trials as always.
    assert trial_resources(_cfg(), _nodes(8, 0), standby=True) == {"cpu": 1.0, "gpu": 0.0}


@pytest.mark.parametrize(("ready", "share"), [(1, 0.5), (2, 0.3333), (3, 0.25), (7, 0.125)])
def test_each_trial_ready_takes_a_share_of_the_gpu(ready: int, share: float) -> None:
    from searchlab.experiment._tune import _trials_that_fit

    cfg = _cfg()
    got = trial_resources(cfg, _nodes(16, 2), standby=ready)
    assert got == {"cpu": 1.0, "gpu": share}
    # Ray places 1 + ready of them on each GPU (1/3 rounded down to Ray's four decimals).
    assert _trials_that_fit(cfg, got, {"CPU": 16, "GPU": 2}) == 2 * (1 + ready)


def test_more_trials_ready_need_more_trials_at_once() -> None:
    cfg = _random_search(max_trials=8, max_concurrent_trials=4)
    assert trial_resources(cfg, _nodes(8, 2), standby=1)["gpu"] == 0.5
    with pytest.raises(ConfigError) as err:
        trial_resources(cfg, _nodes(8, 2), standby=2)  # 3 per GPU: 6 at once
    message = str(err.value)
    assert "\n" not in message and "max_concurrent_trials is 4" in message
    assert "SEARCHLAB_STANDBY=2 runs 3 trials on each GPU (one training, 2 ready)" in message
    assert "set max_concurrent_trials to 6 or more" in message
    with pytest.raises(ConfigError, match="hold 6 trials, fewer than SEARCHLAB_STANDBY=3 needs"):
        trial_resources(_random_search(max_trials=8), _nodes(6, 2), standby=3)  # 8 CPUs


@pytest.mark.parametrize(
    ("value", "ready"), [("", 0), ("0", 0), ("off", 0), ("1", 1), ("on", 1), ("2", 2), ("7", 7)]
)
def test_the_switch_counts_the_trials_ready(
    monkeypatch: pytest.MonkeyPatch, value: str, ready: int
) -> None:
    from searchlab.experiment._spec import standby_switch

    monkeypatch.setenv("SEARCHLAB_STANDBY", value)
    assert standby_switch() == ready
    spec = ExperimentSpec.from_config(_cfg(), "s")
    assert spec.standby == ready and (spec.standby_key is not None) == (ready > 0)


@pytest.mark.parametrize("value", ["8", "-1", "two", "1.5"])
def test_a_bad_count_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("SEARCHLAB_STANDBY", value)
    with pytest.raises(ConfigError) as err:
        check_environment()
    message = str(err.value)
    assert "\n" not in message and f"SEARCHLAB_STANDBY={value!r}" in message
    assert "1 to 7" in message and "unset it" in message


@pytest.mark.parametrize(
    ("entrypoint", "resources", "named", "fix"),
    [
        ("asha_trial:AshaTrial", {"slots_per_trial": 2}, "slots_per_trial is 2", "to 1"),
        ("asha_trial:AshaTrial", {"gpus_per_trial": 0.5}, "gpus_per_trial is 0.5", "remove"),
        ("python3 train.py", {}, "the command 'python3 train.py'", "PyTorchTrial entrypoint"),
    ],
)
def test_standby_is_refused_where_trials_cannot_take_turns(
    entrypoint: str, resources: dict[str, Any], named: str, fix: str
) -> None:
    with pytest.raises(ConfigError) as err:
        trial_resources(_cfg(entrypoint, **resources), _nodes(8, 2), standby=True)
    message = str(err.value)
    assert "\n" not in message and named in message and fix in message
    assert "unset SEARCHLAB_STANDBY" in message


def test_without_gpus_standby_changes_nothing() -> None:
    cfg = _cfg(slots_per_trial=2)
    assert trial_resources(cfg, _nodes(8, 0), standby=True) == {"cpu": 1.0, "gpu": 0.0}


def test_standby_needs_the_cpus_for_two_trials_per_gpu() -> None:
    assert trial_resources(_cfg(cpus_per_trial=2), _nodes(4, 1), standby=True)["gpu"] == 0.5
    with pytest.raises(ConfigError) as err:
        trial_resources(_cfg(cpus_per_trial=2), _nodes(6, 2), standby=True)
    message = str(err.value)
    assert "cpus_per_trial is 2" in message and "4 for 2 GPU(s)" in message
    assert "lower cpus_per_trial, or unset SEARCHLAB_STANDBY" in message


def test_a_resumed_experiment_keeps_the_setting_it_started_with(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from searchlab.experiment._runner import resumed_standby

    said: list[str] = []
    monkeypatch.setenv("SEARCHLAB_STANDBY", "1")
    assert resumed_standby({"standby": True}, said.append) and not said
    assert not resumed_standby({}, said.append)  # recorded before standby existed: off
    assert said == [
        "note: this experiment started with SEARCHLAB_STANDBY=0; it resumes so (its trials "
        "keep the GPU share they were given)"
    ]
    monkeypatch.delenv("SEARCHLAB_STANDBY")
    assert resumed_standby({"standby": True}, said.append)
    assert "SEARCHLAB_STANDBY=1" in said[-1]


def test_a_resumed_experiment_keeps_its_count_of_trials_ready(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from searchlab.experiment._runner import resumed_standby

    said: list[str] = []
    monkeypatch.setenv("SEARCHLAB_STANDBY", "2")
    assert resumed_standby({"standby": 2}, said.append) == 2 and not said
    assert resumed_standby({"standby": 1}, said.append) == 1
    assert said[-1].startswith("note: this experiment started with SEARCHLAB_STANDBY=1;")
    # experiment.json changed by hand: refused in one line naming the file and the value.
    for bad in ("2", 9, -1, None):
        with pytest.raises(ConfigError) as err:
            resumed_standby({"standby": bad}, said.append, where="runs/x/experiment.json")
        message = str(err.value)
        assert message.startswith(f"runs/x/experiment.json: standby is {bad!r},")
        assert "\n" not in message and "set it to 0" in message


def test_the_switch_sets_a_run_key_and_its_own_train_ahead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SEARCHLAB_TRAIN_AHEAD", "0")
    assert ExperimentSpec.from_config(_cfg(), "s").standby_key is None
    assert not ExperimentSpec.from_config(_cfg(), "s").train_ahead
    monkeypatch.setenv("SEARCHLAB_STANDBY", "1")
    one, two = (ExperimentSpec.from_config(_cfg(), "s") for _ in range(2))
    assert one.standby_key and two.standby_key and one.standby_key != two.standby_key
    # With standby, SEARCHLAB_STANDBY_AHEAD (off unless 1) decides, not SEARCHLAB_TRAIN_AHEAD.
    assert one.standby_key.isalnum() and not one.train_ahead
    monkeypatch.setenv("SEARCHLAB_STANDBY_AHEAD", "1")
    assert ExperimentSpec.from_config(_cfg(), "s").train_ahead
    monkeypatch.setenv("SEARCHLAB_STANDBY_AHEAD", "0")
    monkeypatch.setenv("SEARCHLAB_TRAIN_AHEAD", "1")
    assert not ExperimentSpec.from_config(_cfg(), "s").train_ahead
    monkeypatch.setenv("SEARCHLAB_STANDBY_AHEAD", "later")
    with pytest.raises(ConfigError, match="SEARCHLAB_STANDBY_AHEAD='later' is not on or off"):
        check_environment()
    monkeypatch.delenv("SEARCHLAB_STANDBY_AHEAD")
    monkeypatch.setenv("SEARCHLAB_STANDBY", "maybe")
    with pytest.raises(ConfigError, match="SEARCHLAB_STANDBY='maybe' is not on or off"):
        check_environment()


# The toy trial, whose first trial to reach its second batch (the one that creates
# ``marker``) holds the GPU there until the other actors (``actors`` in all) wait for it (or
# ``seconds`` pass):
# Tune then runs a trial on each actor before any trial pauses (a trial that pauses first
# hands its actor to the second trial, and Tune drops the one still starting, even one that
# has built its trial). A waiter is seen in the kernel's table of locks, /proc/locks, as
# blocked ("->") on the lock this actor holds (its baton's, whose id in that table the
# descriptor's fdinfo shows). It writes what it saw to ``marker``.
WAITING_TRIAL = """
import os, time
from asha_trial import AshaTrial


def _held_lock_id():
    mine = f"searchlab-{os.getuid()}-standby-"
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            info = open(f"/proc/self/fdinfo/{fd}").read()
        except OSError:
            continue
        if mine in target and target.endswith(".lock"):
            for line in info.splitlines():  # lock: N: FLOCK ADVISORY WRITE pid dev:ino 0 EOF
                if line.startswith("lock:") and "FLOCK" in line:
                    return line.split()[6]
    return None


def _waiters(lock_id):
    with open("/proc/locks") as table:
        return [
            line.strip()
            for line in table
            if line.split()[1] == "->" and line.split()[6] == lock_id
        ]


class WaitingTrial(AshaTrial):
    def train_batch(self, batch, epoch_idx, batch_idx):
        wait = self.context.get_hparams()["wait_for_second_actor"]
        if batch_idx == 1 and wait["seconds"]:
            try:
                fd = os.open(wait["marker"], os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            except FileExistsError:
                fd = None
            if fd is not None:
                lock_id, seen = _held_lock_id(), "none: this actor holds no GPU lock"
                deadline = time.monotonic() + wait["seconds"]
                while lock_id is not None and time.monotonic() < deadline:
                    waiters = _waiters(lock_id)
                    if len(waiters) >= wait["actors"] - 1:
                        seen = "waiters: " + "; ".join(waiters)
                        break
                    seen = f"{len(waiters)} of the other actors waited for the GPU"
                    time.sleep(0.05)
                os.write(fd, seen.encode())
                os.close(fd)
        return super().train_batch(batch, epoch_idx, batch_idx)
"""

SEARCH = """
import collections, json, os, pathlib, sys
import ray
import searchlab
from searchlab._ray_env import ray_init_kwargs
from searchlab.experiment._compat import keep_prestarted_workers

out = pathlib.Path(sys.argv[1])
# As searchlab starts Ray: it keeps its prestarted workers once both trials reserve the CPUs.
standby = int(os.environ["SEARCHLAB_STANDBY"])  # trials ready beside the one training
ray.init(
    num_cpus=max(2, 1 + standby),
    num_gpus=1,
    _system_config=keep_prestarted_workers(),
    **ray_init_kwargs(),
)
config = {
    "name": "standby",
    "entrypoint": "waiting_trial:WaitingTrial",
    "hyperparameters": {
        "global_batch_size": 4,
        "lr": {"type": "categorical", "vals": [0.001, 0.01, 0.1, 0.3, 0.5, 1.0]},
        "batch_log": str(out / "batches.log"),
        "batch_sleep": 0.01,
        # With standby, the first trial waits at its second batch for the other actors
        # (WAITING_TRIAL); without it there is one actor per GPU, and nothing to wait for.
        "wait_for_second_actor": {
            "marker": str(out / "waited"),
            "seconds": 120 if standby else 0,
            "actors": 1 + standby,
        },
    },
    "searcher": {
        "name": "adaptive_asha", "metric": "validation_loss", "max_trials": 6,
        "max_length": {"batches": 16}, "mode": "aggressive", "divisor": 2, "max_rungs": 3,
    },
    "scheduling_unit": 2,
    "max_restarts": 0,
    "reproducibility": {"experiment_seed": 3},
}
lines = []
results = searchlab.run(
    config, model_dir=sys.argv[2], storage_path=str(out / "runs"), echo=lines.append
)
metrics = results.metrics
first = metrics[(metrics["group"] == "validation") & (metrics["batches"] == 4)]
reported = [
    json.loads(line)
    for f in results.experiment_dir.glob("*/result.json")
    for line in f.read_text().splitlines()
]
json.dump(
    {
        "states": sorted(results.trials["state"]),
        "rung0": sorted(float(v) for v in first["validation_loss"]),
        # promoted trials' loads, and those from the worker's memory (kept states)
        "loads": sum("searchlab_timing_checkpoint_load_s" in r for r in reported),
        # paused trials that came back (a promoted trial that goes on at once loads nothing)
        "resumed": sum(" resumed at batch " in line for line in lines),
        "from_memory": sum("searchlab_timing_resumed_from_memory" in r for r in reported),
        "standby": json.loads((results.experiment_dir / "experiment.json").read_text())["standby"],
    },
    open(out / "result.json", "w"),
)
"""


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(3 * 600 + 60)  # the three searches' own limits, and the checks
def test_a_search_takes_turns_on_its_gpu(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One GPU's actors take turns: two with ``SEARCHLAB_STANDBY=1``, three with ``2``."""
    monkeypatch.setattr("tempfile.tempdir", None)  # the workers' temporary folder
    script = tmp_path / "search.py"
    script.write_text(SEARCH)
    model = asha_model_dir(tmp_path, waiting_trial=WAITING_TRIAL)
    outcome = {}
    locks = set(pathlib.Path(tempfile.gettempdir()).glob(f"searchlab-{os.getuid()}-standby-*"))
    for standby in ("2", "1", "0"):
        out = tmp_path / f"standby-{standby}"
        out.mkdir()
        run_search_script(script, out, model, standby=standby)
        rows = [line.split() for line in (out / "batches.log").read_text().splitlines()]
        spans = sorted((float(a), float(b), int(pid)) for pid, a, b in rows)
        outcome[standby] = (spans, __import__("json").loads((out / "result.json").read_text()))
    for standby in ("2", "1"):
        spans, result = outcome[standby]
        actors = 1 + int(standby)
        assert result["states"] == ["COMPLETED"] * 6
        windows = collections.Counter(pid for *_, pid in spans)
        waited = (tmp_path / f"standby-{standby}" / "waited").read_text()  # the first trial's
        # The actors shared the GPU ...
        assert len(windows) == actors and min(windows.values()) >= 4, (standby, waited)
        # ... and never trained at the same time, but for each process's first batch, which
        # trains beside the holder (standby's warm-up, SEARCHLAB_STANDBY_WARM_UP).
        first = {pid: (a, b, pid) for a, b, pid in reversed(spans)}
        assert _overlaps([span for span in spans if span not in first.values()]) == 0
        switches = sum(1 for a, b in itertools.pairwise(spans) if a[2] != b[2])
        assert switches >= 2 * actors  # they took turns, not one after the other
        # Each trial's training is its own: every trial's first validation (before any
        # promotion, which the order of results decides) is the same as without standby.
        assert len(result["rung0"]) == 6 and result["rung0"] == outcome["0"][1]["rung0"]
        assert result["standby"] == int(standby)  # recorded for a resume
        # Promoted trials came back on any of the GPU's actors, from their files: standby's
        # actors keep no states in memory.
        # (Whether a promoted trial pauses first depends on the order results arrive in.)
        assert result["from_memory"] == 0, result
        assert result["loads"] > 0 or result["resumed"] == 0, result
    assert outcome["0"][1]["standby"] == 0
    # One actor per GPU keeps them: promoted trials came back to it, from its memory.
    assert outcome["0"][1]["from_memory"] > 0, outcome["0"][1]
    assert len({pid for *_, pid in outcome["0"][0]}) == 1  # without it: one actor per GPU
    # The driver removed the run's lock directory.
    assert (
        set(pathlib.Path(tempfile.gettempdir()).glob(f"searchlab-{os.getuid()}-standby-*")) == locks
    )


def _random_search(**searcher: Any) -> Any:
    """A random search of the toy trial with ``searcher`` fields (``max_trials``, ...)."""
    return load_experiment_config(
        {
            "name": "s",
            "entrypoint": "asha_trial:AshaTrial",
            "hyperparameters": {"global_batch_size": 4, "lr": {"type": "const", "val": 0.1}},
            "searcher": {
                "name": "random",
                "metric": "validation_loss",
                "max_length": 4,
                **searcher,
            },
        },
        model_dir=str(ASHA_MODEL),
    )


def test_standby_needs_two_trials_per_gpu() -> None:
    cfg = _random_search(max_trials=8, max_concurrent_trials=4)
    assert trial_resources(cfg, _nodes(8, 2), standby=True)["gpu"] == 0.5
    with pytest.raises(ConfigError) as err:
        trial_resources(cfg, _nodes(8, 4), standby=True)  # 4 trials would fill 2 of 4 GPUs
    assert "max_concurrent_trials is 4" in str(err.value)
    assert "set max_concurrent_trials to 8 or more" in str(err.value)
    assert trial_resources(cfg, _nodes(8, 4))["gpu"] == 1.0  # without standby: as before
    few = _random_search(max_trials=3)
    with pytest.raises(ConfigError, match=r"searcher\.max_trials is 3, .* set max_trials to 4"):
        trial_resources(few, _nodes(8, 2), standby=True)
