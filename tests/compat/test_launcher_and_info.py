"""``det.get_cluster_info()``, ``det.LOG_FORMAT``, ``det.import_from_path`` and the launcher
(``python3 -m searchlab.launch.torch_distributed``), run by hand as Determined's docs show."""

from __future__ import annotations

import json
import logging
import pathlib
import subprocess
import sys

import pytest

import searchlab as det
from searchlab._info import int_id
from searchlab.launch import torch_distributed

SCRIPTS = pathlib.Path(__file__).resolve().parent / "scripts"


def test_run_by_hand_there_is_no_cluster_info(monkeypatch) -> None:
    monkeypatch.delenv("SEARCHLAB_CLUSTER_INFO", raising=False)
    assert det.get_cluster_info() is None


def test_log_format_is_determineds(caplog) -> None:
    assert det.LOG_FORMAT == "%(levelname)s: [%(process)s] %(name)s: %(message)s"
    record = logging.LogRecord("train", logging.INFO, __file__, 1, "hello", None, None)
    assert logging.Formatter(det.LOG_FORMAT).format(record).endswith("] train: hello")


def test_trial_numbers_come_from_the_trial_directory_names() -> None:
    assert int_id("3f2a_00000") == 1
    assert int_id("3f2a_00041") == 42
    assert int_id("mnist_adaptive") == int_id("mnist_adaptive") > 0


def test_import_from_path_imports_a_second_model_def_side_by_side(tmp_path, monkeypatch) -> None:
    for version in ("old", "new"):
        (tmp_path / version).mkdir()
        (tmp_path / version / "model_def.py").write_text(f"VERSION = {version!r}\n")
    monkeypatch.syspath_prepend(str(tmp_path / "new"))
    import model_def as new_model_def

    with det.import_from_path(tmp_path / "old"):
        import model_def as old_model_def
    assert (old_model_def.VERSION, new_model_def.VERSION) == ("old", "new")
    import model_def

    assert model_def is new_model_def  # the current one is back in sys.modules
    assert not (tmp_path / "old" / "__pycache__").exists()
    sys.modules.pop("model_def", None)


def test_import_from_path_does_not_nest(tmp_path) -> None:
    with det.import_from_path(tmp_path):
        with pytest.raises(RuntimeError, match="nesting"):
            with det.import_from_path(tmp_path):
                pass


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nproc_per_node", "0", "--", "python3", "x.py"], "needs a number >= 1"),
        (["--bogus", "--", "python3", "x.py"], "unknown option '--bogus'"),
        ([], "no script to launch"),
        (["--trial", "model_def:T"], "put it in the config's entrypoint"),
    ],
)
def test_launcher_arguments(args: list[str], message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        torch_distributed.parse_args(args)


def test_launcher_arguments_before_the_separator_set_the_process_count() -> None:
    assert torch_distributed.parse_args(["--nproc_per_node=3", "--", "python3", "t.py", "-x"]) == (
        3,
        ["python3", "t.py", "-x"],
    )
    assert torch_distributed.parse_args(["python3", "t.py"]) == (None, ["python3", "t.py"])


def _launch(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "searchlab.launch.torch_distributed", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_launcher_sets_torch_distributeds_environment_per_rank(tmp_path) -> None:
    script = tmp_path / "env.py"
    script.write_text(
        "import json, os\n"
        "keys = ['RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT']\n"
        "print(json.dumps({k: os.environ[k] for k in keys}))\n"
    )
    done = _launch("--nproc_per_node", "2", "--", "python3", str(script))
    assert done.returncode == 0, done.stderr
    seen = {}
    for line in done.stdout.splitlines():
        prefix, _, payload = line.partition(" ")
        seen[prefix] = json.loads(payload)
    assert set(seen) == {"[rank=0]", "[rank=1]"}
    assert [seen[f"[rank={r}]"]["RANK"] for r in (0, 1)] == ["0", "1"]
    assert {e["WORLD_SIZE"] for e in seen.values()} == {"2"}
    assert {e["MASTER_ADDR"] for e in seen.values()} == {"127.0.0.1"}
    assert len({e["MASTER_PORT"] for e in seen.values()}) == 1


def test_one_failing_rank_ends_the_others_and_sets_the_exit_code(tmp_path) -> None:
    script = tmp_path / "fail.py"
    script.write_text(
        "import os, sys, time\nif os.environ['RANK'] == '1':\n    sys.exit(3)\ntime.sleep(120)\n"
    )
    done = _launch("--nproc_per_node", "2", "--", "python3", str(script), timeout=60)
    assert done.returncode == 3


@pytest.mark.slow
@pytest.mark.parametrize(
    ("aggregation", "expected"),
    [
        # Global batches [1..4] and [5..8] (mean x 2.5 and 6.5), averaged over both workers.
        (1, [-0.25, -0.9, -1.15, -1.8]),
        # Two batches per update: one update of mean 4.5 every second batch.
        (2, [0.0, -0.45, -0.45, -0.9]),
    ],
)
def test_gradients_are_averaged_across_two_workers(aggregation: int, expected: list[float]) -> None:
    done = _launch(
        "--nproc_per_node",
        "2",
        "--",
        "python3",
        str(SCRIPTS / "identity" / "train.py"),
        "--aggregation",
        str(aggregation),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = [
        json.loads(line.split(" ", 1)[1])
        for line in done.stdout.splitlines()
        if line.split(" ", 1)[1].startswith("{")
    ]
    assert sorted(r["rank"] for r in results) == [0, 1]
    for result in results:
        assert result["size"] == 2
        assert result["weights"] == pytest.approx(expected)


def test_wrap_rank_prefixes_each_line(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "searchlab.launch.wrap_rank", "5", "--", "echo", "a\nb"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.splitlines() == ["[rank=5] a", "[rank=5] b"]
