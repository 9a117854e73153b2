"""``write_overlap``: each writing block read against the loop alone around it, and the write
loop that runs beside training (what it writes must load as the state it was given)."""

from __future__ import annotations

import multiprocessing
import pathlib
import threading

import pytest
import torch

write_overlap = pytest.importorskip("write_overlap")


def _b(mode: str, rate: float) -> dict:
    return {"mode": mode, "batches_per_s": rate}


def test_a_writing_block_is_read_against_the_nearest_lone_blocks_on_each_side() -> None:
    blocks = [
        _b("none", 100.0),
        _b("thread", 90.0),
        _b("process", 99.0),
        _b("none", 80.0),
        _b("thread", 72.0),
    ]
    write_overlap._bracket(blocks)
    ratios = [b["ratio"] for b in blocks]
    assert ratios[0] is None and ratios[3] is None  # the loop alone has no ratio
    assert ratios[1] == pytest.approx(90.0 / 90.0)  # median of 100 and 80
    assert ratios[2] == pytest.approx(99.0 / 90.0)
    assert ratios[4] == pytest.approx(72.0 / 80.0)  # no lone block after it: the one before


def test_no_lone_block_leaves_the_ratio_out() -> None:
    blocks = [_b("thread", 90.0), _b("process", 99.0)]
    write_overlap._bracket(blocks)
    assert [b["ratio"] for b in blocks] == [None, None]


def test_the_write_loop_writes_the_state_while_asked_and_counts_each_write(
    tmp_path: pathlib.Path,
) -> None:
    ctx = multiprocessing.get_context("spawn")
    go, stop = ctx.Event(), ctx.Event()
    done, times = ctx.Value("i", 0), ctx.Value("d", 0.0)
    state = {"models_state_dict": [{"w": torch.arange(6.0).reshape(2, 3)}]}
    worker = threading.Thread(
        target=write_overlap._write_loop, args=(state, str(tmp_path), 0.01, go, stop, done, times)
    )
    worker.start()
    try:
        go.set()
        for _ in range(500):
            if done.value >= 2:
                break
            threading.Event().wait(0.01)
        go.clear()
    finally:
        stop.set()
        worker.join(30)
    assert not worker.is_alive()
    assert done.value >= 2 and times.value > 0
    written = torch.load(tmp_path / "state-dict.pth", weights_only=True)
    assert torch.equal(written["models_state_dict"][0]["w"], state["models_state_dict"][0]["w"])
    assert not list(tmp_path.glob(".*.tmp"))  # every write was renamed into place
