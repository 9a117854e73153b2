"""Training 40 batches at once equals 20 batches, a new process, and 20 more: bit for bit."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import torch

WORKER = pathlib.Path(__file__).with_name("resume_worker.py")
ROOT = pathlib.Path(__file__).resolve().parents[2]


def _run(tmp: pathlib.Path, name: str, batches: int, latest: str | None = None) -> dict:
    out = tmp / f"{name}.pt"
    cmd = [sys.executable, str(WORKER), str(out), str(tmp / f"ckpt-{name}"), str(batches)]
    if latest:
        cmd.append(latest)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(cmd, check=True, env=env, timeout=300)
    return torch.load(out, weights_only=False)


def _assert_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        elif isinstance(a[key], dict):
            _assert_identical(a[key], b[key])
        elif isinstance(a[key], list):
            assert len(a[key]) == len(b[key])
            for x, y in zip(a[key], b[key]):
                _assert_identical({"v": x}, {"v": y})
        else:
            assert a[key] == b[key], key


def test_resume_mid_epoch_in_new_process_is_bit_identical(tmp_path: pathlib.Path) -> None:
    whole = _run(tmp_path, "whole", 40)
    first = _run(tmp_path, "first", 20)  # 20 = 1 epoch of 12 batches + 8: mid-epoch
    assert pathlib.Path(first["path"], "state-dict.pth").is_file()
    second = _run(tmp_path, "second", 40, latest=first["path"])

    assert second["initial_batch"] == 20
    _assert_identical(whole["model"], second["model"])
    _assert_identical(whole["optimizer"], second["optimizer"])
    assert whole["sched"] == second["sched"]
    # The epoch-stepped scheduler stepped 3 times in 40 batches of 12-batch epochs.
    assert whole["sched"]["scheduler"]["last_epoch"] == 3
    whole_vals = dict(whole["validations"])
    resumed_vals = dict(first["validations"]) | dict(second["validations"])
    assert sorted(whole_vals) == [10, 20, 30, 40]
    assert resumed_vals == whole_vals


def test_resumed_run_differs_without_restoring_state(tmp_path: pathlib.Path) -> None:
    """Guard: a fresh run of 20 batches does not land on the 40-batch weights by accident."""
    whole = _run(tmp_path, "whole", 40)
    short = _run(tmp_path, "short", 20)
    assert not torch.equal(whole["model"]["0.weight"], short["model"]["0.weight"])
