"""``benchmarks/handover_parts.py``: the loader pieces time a start, a step and a real end."""

from __future__ import annotations

import os
import pathlib
import sys
import time

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "asha_model"))

import handover_parts
from _rank_watch import child_processes
from asha_def import TrainStep


def _children() -> set[int]:
    """This process's child processes (a loader's workers while they live)."""
    return child_processes([os.getpid()])


@pytest.mark.parametrize("kind", ["torch", "searchlab"])
def test_a_loaders_pieces_are_timed_and_its_workers_end_inside_the_timed_close(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    hp = {"model": "tiny", "batch": 8, "lr": 0.01, "data": "loader", "num_workers": 2}
    step = TrainStep({**hp, "n_train": 256}, torch.device("cpu"), seed=0)
    before = _children()
    alive_at: list[set[int]] = []  # the loader's workers alive at each clock reading
    clock = time.perf_counter

    def perf_counter() -> float:
        alive_at.append(_children() - before)
        return clock()

    monkeypatch.setattr(handover_parts.time, "perf_counter", perf_counter)
    got = handover_parts.loader_parts(step, kind)
    assert set(got) == {
        f"{kind}_loader_{part}" for part in ("first_batch_s", "first_step_s", "batch_s", "close_s")
    }
    assert all(seconds > 0 for seconds in got.values())
    # Workers ran while the batches were timed, and none was left at the close's last reading.
    assert any(alive_at[:-1])
    assert alive_at[-1] == set()
