"""What an experiment's files and processes can make searchlab expose, run or write.

Ray's token authentication is kept; the data-parallel rendezvous store listens only where the
ranks are; shipped model code is unpacked only into a directory of this user's own; experiment
names never lead outside the storage path. (Checkpoint pickles and data-file imports are
covered in tests/pytorch/test_checkpoint_security.py and tests/results.)
"""

from __future__ import annotations

import os
import pathlib
import socket
import stat
import subprocess
import sys
import tempfile
from typing import Any

import pytest
import yaml
from driver_procs import ray_tmpdir, run_to_end
from toy_experiment import TOY_MODEL_DIR, toy_config

import searchlab
from searchlab._ray_env import ray_environment
from searchlab.cli import main
from searchlab.experiment._data_parallel import TrialWorker
from searchlab.experiment._ship import pack_model_dir, unpack_model_dir

# -- Ray's authentication ------------------------------------------------------------------


def test_a_run_never_turns_rays_authentication_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.setenv("TUNE_GLOBAL_CHECKPOINT_S", "7")  # the user's own setting
    with ray_environment():
        assert "RAY_AUTH_MODE" not in os.environ
        assert os.environ["TUNE_GLOBAL_CHECKPOINT_S"] == "7"
        assert os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] == "1"
    assert "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS" not in os.environ  # scoped to the run


def _env_without_auth_mode(home: pathlib.Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    return {**env, "HOME": str(home)}


@pytest.mark.ray
@pytest.mark.slow
def test_a_local_run_keeps_rays_token_authentication(tmp_path: pathlib.Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    config = tmp_path / "single.yaml"
    config.write_text(yaml.safe_dump(toy_config("auth")))
    log = tmp_path / "log"
    args = ["run", str(config), str(TOY_MODEL_DIR), "--storage-path", str(tmp_path)]
    with ray_tmpdir() as ray_tmp:
        full_env = {**_env_without_auth_mode(home), "RAY_TMPDIR": ray_tmp}
        proc = subprocess.run(
            [sys.executable, "-m", "searchlab.cli", *args],
            env=full_env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            timeout=300,
        )
    assert proc.returncode == 0, log.read_text()
    # Ray started its cluster with a token of this user's, and the trial ran with it.
    assert (home / ".ray" / "auth_token").is_file()
    assert "Token authentication is enabled for this Ray cluster" in log.read_text()
    assert searchlab.load_results(tmp_path / "auth").trials["state"].tolist() == ["COMPLETED"]


@pytest.mark.ray
@pytest.mark.slow
def test_joining_a_token_protected_cluster_without_its_token_is_one_line(
    tmp_path: pathlib.Path,
) -> None:
    head_home, driver_home = tmp_path / "head", tmp_path / "driver"
    head_home.mkdir(), driver_home.mkdir()
    ray_cli = pathlib.Path(sys.executable).with_name("ray")
    with ray_tmpdir() as ray_tmp:
        head_env = {**_env_without_auth_mode(head_home), "RAY_TMPDIR": ray_tmp}
        subprocess.run(
            [ray_cli, "get-auth-token", "--generate"], env=head_env, check=True, capture_output=True
        )
        head_env["RAY_AUTH_MODE"] = "token"
        with socket.socket() as sock:  # a free port, not a fixed one another run may hold
            sock.bind(("127.0.0.1", 0))
            port = str(sock.getsockname()[1])
        started = subprocess.run(
            [
                ray_cli,
                "start",
                "--head",
                "--port",
                port,
                "--num-cpus",
                "1",
                "--include-dashboard",
                "false",
            ],
            env=head_env,
            capture_output=True,
            timeout=120,
        )
        assert started.returncode == 0, started.stderr.decode()
        config = tmp_path / "single.yaml"
        config.write_text(yaml.safe_dump(toy_config("remote")))
        log = tmp_path / "log"
        driver_env = {**_env_without_auth_mode(driver_home), "RAY_TMPDIR": ray_tmp}
        args = [
            "run",
            str(config),
            str(TOY_MODEL_DIR),
            "--storage-path",
            str(tmp_path),
            "--address",
            f"127.0.0.1:{port}",
        ]
        code = run_to_end(args, ray_tmp, log, env=driver_env)
    errors = [x for x in log.read_text().splitlines() if x.startswith("searchlab: error:")]
    assert code == 2, log.read_text()
    assert len(errors) == 1 and "Traceback" not in log.read_text()
    assert f"--address 127.0.0.1:{port}: cannot connect" in errors[0]
    assert "set RAY_AUTH_TOKEN" in errors[0]
    assert not (tmp_path / "remote").exists()  # nothing written


# -- the data-parallel rendezvous store ----------------------------------------------------


def _listening(port: int) -> set[str]:
    """The local addresses listening on ``port`` (IPv4), from /proc/net/tcp."""
    found = set()
    for line in pathlib.Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        address, hex_port = fields[1].split(":")
        if int(hex_port, 16) == port and fields[3] == "0A":  # 0A: LISTEN
            octets = [str(int(address[i : i + 2], 16)) for i in range(6, -2, -2)]
            found.add(".".join(octets))
    return found


def test_the_rendezvous_store_listens_only_where_the_ranks_are() -> None:
    worker = TrialWorker(rank=0, size=2)
    port = worker.open_store("127.0.0.1")
    assert _listening(port) == {"127.0.0.1"}  # not 0.0.0.0: nobody else can reach it


# -- shipped model code -------------------------------------------------------------------


@pytest.fixture
def private_tmp(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_model_code_is_unpacked_into_a_private_directory(private_tmp: pathlib.Path) -> None:
    shipped = pathlib.Path(unpack_model_dir(pack_model_dir(TOY_MODEL_DIR)))
    root = private_tmp / f"searchlab-models-{os.getuid()}"
    assert shipped.parent == root
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert (shipped / "toy_model_def.py").read_bytes() == (
        TOY_MODEL_DIR / "toy_model_def.py"
    ).read_bytes()


def test_a_directory_others_can_write_is_not_trusted(private_tmp: pathlib.Path) -> None:
    root = private_tmp / f"searchlab-models-{os.getuid()}"
    root.mkdir(mode=0o777)
    root.chmod(0o777)  # anyone could have planted code in it
    with pytest.raises(PermissionError, match=r"is not a private directory of this user"):
        unpack_model_dir(pack_model_dir(TOY_MODEL_DIR))


# -- experiment names ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["../x", "/etc/x", "a/b", ".."])
def test_a_name_that_leaves_the_storage_path_is_refused(
    name: str, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(toy_config("x")))
    storage = tmp_path / "storage"
    args = ["run", str(config), str(TOY_MODEL_DIR), "--storage-path", str(storage)]
    assert main([*args, "--name", name]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"searchlab: error: --name: {name!r} is not a directory name"), err
    assert list(tmp_path.rglob("experiment.json")) == []


@pytest.mark.ray
def test_a_config_name_with_path_parts_stays_inside_the_storage_path(
    ray_session: Any, tmp_path: pathlib.Path
) -> None:
    storage = tmp_path / "storage"
    results = searchlab.run(
        toy_config("../../escape"), model_dir=TOY_MODEL_DIR, storage_path=storage, echo=print
    )
    assert results.experiment_dir.parent == storage.resolve()
    assert not (tmp_path / "escape").exists()
