"""``benchmarks/_asha_sides.py`` reaches Ray's workers by value: they run in ``asha_model/``
(the runtime env's working_dir), where ``_asha_sides`` itself cannot be imported."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

_asha_sides = pytest.importorskip("_asha_sides")
cloudpickle = pytest.importorskip("ray.cloudpickle")

ASHA_MODEL = pathlib.Path(_asha_sides.__file__).resolve().parent / "asha_model"

# What a worker does with what it is sent: unpickle it where only asha_model/ (and the
# installed packages) can be imported, and touch each class's and function's code.
_LOAD = """
import sys
sys.path[:] = [p for p in sys.path if not p.rstrip("/").endswith("benchmarks")]
from ray import cloudpickle
objects = cloudpickle.loads(sys.stdin.buffer.read())
assert "_asha_sides" not in sys.modules, "a worker would have imported _asha_sides"
print(sorted(getattr(o, "__name__", type(o).__name__) for o in objects))
"""


def _load_in_a_worker(sent: bytes) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).resolve().parents[2])}
    return subprocess.run(
        [sys.executable, "-c", _LOAD],
        input=sent,
        cwd=ASHA_MODEL,
        env=env,
        capture_output=True,
        timeout=120,
    )


def test_the_ray_side_unpickles_where_its_module_cannot_be_imported() -> None:
    _asha_sides.ship_by_value()
    try:
        sent = cloudpickle.dumps(
            [_asha_sides.RayAshaTrainable, _asha_sides.ray_train_trial, _asha_sides._solo_blocks]
        )
    finally:
        cloudpickle.unregister_pickle_by_value(_asha_sides)
    done = _load_in_a_worker(sent)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.decode().strip() == "['RayAshaTrainable', '_solo_blocks', 'ray_train_trial']"


def test_by_reference_the_same_objects_need_the_module() -> None:
    # Without ship_by_value the worker would have to import _asha_sides: the test above is
    # not passing by accident.
    sent = cloudpickle.dumps([_asha_sides.ray_train_trial])
    done = _load_in_a_worker(sent)
    assert done.returncode != 0
    assert "_asha_sides" in done.stderr.decode()
