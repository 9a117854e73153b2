"""``GpuSampler`` with extra nvidia-smi fields, read from a stand-in ``nvidia-smi`` on PATH."""

from __future__ import annotations

import os
import pathlib
import stat
import time

import pytest
from _scale_measure import GpuSampler, gpu_state, physical_gpus

# Prints the same two GPUs' lines every 50 ms until killed: GPU 0 at 1980 MHz, GPU 1 clocked
# down to 1410 MHz and reporting no power; argv is written out so the test can check the query.
FAKE_SMI = """#!/bin/sh
echo "$@" > "{argv}"
while true; do
  now=$(date '+%Y/%m/%d %H:%M:%S.000')
  echo "$now, 0, GPU-aaaa, 97, 30000, 1980, 61, 512.5"
  echo "$now, 1, GPU-bbbb, 40, 20000, 1410, 84, [N/A]"
  sleep 0.05
done
"""


@pytest.fixture()
def fake_smi(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    argv = tmp_path / "argv.txt"
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(FAKE_SMI.format(argv=argv))
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    return argv


def sample(indices: list[int], extra: tuple[str, ...]) -> list[dict]:
    sampler = GpuSampler(indices, period_ms=50, extra=extra)
    assert sampler.start()
    deadline = time.time() + 20
    while len(sampler.samples) < 4 and time.time() < deadline:
        time.sleep(0.05)
    return sampler.stop()


def test_extra_fields_are_queried_and_kept_as_numbers(fake_smi: pathlib.Path) -> None:
    samples = sample([0, 1], ("clocks.sm", "temperature.gpu", "power.draw"))
    query = fake_smi.read_text()
    assert "utilization.gpu,memory.used,clocks.sm,temperature.gpu,power.draw" in query
    by_gpu = {s["index"]: s for s in samples}
    assert by_gpu[0]["clocks_sm"] == 1980.0
    assert by_gpu[0]["power_draw"] == 512.5
    assert by_gpu[1]["temperature_gpu"] == 84.0
    assert by_gpu[1]["power_draw"] is None  # "[N/A]"
    assert by_gpu[0]["util"] == 97.0 and by_gpu[1]["mem_mib"] == 20000.0


def test_lines_of_another_shape_are_skipped(fake_smi: pathlib.Path) -> None:
    # Asked for one extra field, the stand-in prints three: no line has the asked shape.
    sampler = GpuSampler([0, 1], period_ms=50, extra=("clocks.sm",))
    assert sampler.start()
    time.sleep(0.5)
    assert sampler.stop() == []


def test_gpu_state_summarises_only_the_timed_window() -> None:
    def row(t: float, clock: float, temp: float, util: float) -> dict:
        return {
            "t": t,
            "clocks_sm": clock,
            "temperature_gpu": temp,
            "util": util,
            "power_draw": 400.0,
        }

    samples = [
        row(9.9, 300, 95, 0),
        row(10, 1980, 60, 99),
        row(11, 1900, 70, 97),
        row(12, 1800, 80, 98),
    ]
    samples.append(row(12.1, 345, 99, 0))  # after the window: ignored
    state = gpu_state(samples, 10.0, 12.0)
    assert state == {
        "samples": 3,
        "sm_clock_mhz": 1900,
        "util_pct": 98,
        "power_w": 400.0,
        "temperature_max_c": 80,
    }
    assert gpu_state(samples, 20.0, 30.0) is None


@pytest.mark.parametrize(
    ("visible", "expected"),
    [("2,3,5", [2, 3]), ("", [0, 1]), ("GPU-aaaa,GPU-bbbb", [0, 1])],
)
def test_the_sampled_gpus_are_the_visible_ones_when_named_by_index(
    visible: str, expected: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert physical_gpus(2) == expected
