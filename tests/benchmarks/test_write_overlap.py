"""``write_overlap``: each writing block read against the loop alone around it, and the write
loop that runs beside training (what it writes must load as the state it was given)."""

from __future__ import annotations

import argparse
import multiprocessing
import pathlib
import threading
import time

import pytest
import torch
import write_overlap


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


def _loop(state: dict, directory: pathlib.Path, period: float) -> tuple[threading.Thread, object]:
    sig = write_overlap.Signals(multiprocessing.get_context("spawn"))
    worker = threading.Thread(
        target=write_overlap._write_loop, args=(state, str(directory), period, sig)
    )
    worker.start()
    assert sig.ready.wait(30)  # its untimed first write is done
    return worker, sig


def test_the_write_loop_writes_only_while_asked_a_period_apart(tmp_path: pathlib.Path) -> None:
    state = {"models_state_dict": [{"w": torch.arange(6.0).reshape(2, 3)}]}
    worker, sig = _loop(state, tmp_path, period=0.1)
    try:
        time.sleep(0.3)
        assert sig.done.value == 0  # go is clear: nothing but the untimed first write
        began = time.perf_counter()
        sig.go.set()
        deadline = time.monotonic() + 30
        while sig.done.value < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sig.done.value >= 2  # it writes on while go stays set
        sig.idle.clear()  # only now: while go was clear the writer kept setting it
        sig.go.clear()
        assert sig.idle.wait(30)  # back to waiting once the write in flight is done
        took = time.perf_counter() - began
        writes = sig.done.value
        time.sleep(0.3)
        assert sig.done.value == writes  # none after go was cleared
    finally:
        sig.stop.set()
        worker.join(30)
    assert not worker.is_alive()
    assert 2 <= writes <= took / 0.1 + 1  # one per period, not as fast as it can
    assert sig.times.value > 0
    written = torch.load(tmp_path / "state-dict.pth", weights_only=True)
    assert torch.equal(written["models_state_dict"][0]["w"], state["models_state_dict"][0]["w"])
    assert not list(tmp_path.glob(".*.tmp"))  # every write was renamed into place


def test_each_mode_takes_each_place_in_the_blocks_equally_often() -> None:
    orders = [write_overlap.block_order(b) for b in range(6)]
    assert all(sorted(o) == sorted(write_overlap.MODES) for o in orders)
    for mode in write_overlap.MODES:
        places = [o.index(mode) for o in orders]
        assert sorted(places) == [0, 0, 1, 1, 2, 2]


def test_a_smoke_run_times_every_mode_in_every_block(tmp_path: pathlib.Path) -> None:
    args = argparse.Namespace(
        quick=True,
        blocks=2,
        batches=6,
        batch=4,
        period=0.02,
        workdir=str(tmp_path),
        device="cpu",
        model=None,
    )
    result = write_overlap.run(args)
    blocks = result["blocks"]
    assert [(b["block"], b["mode"]) for b in blocks] == [
        (0, "none"),
        (0, "thread"),
        (0, "process"),
        (1, "thread"),
        (1, "process"),
        (1, "none"),
    ]
    assert all(b["batches_per_s"] > 0 for b in blocks)
    assert all(b["writes"] == 0 for b in blocks if b["mode"] == "none")
    # Each writing block starts with a write under way and waits for its last one.
    assert all(b["writes"] >= 1 for b in blocks if b["mode"] != "none")
    assert all(b["ratio"] is not None for b in blocks if b["mode"] != "none")
    summary = result["summary"]
    assert summary["model"] == "tiny" and summary["device"] == "cpu"
    assert summary["thread_writes_per_block"] >= 1 and summary["process_writes_per_block"] >= 1
