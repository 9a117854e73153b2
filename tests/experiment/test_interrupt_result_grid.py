"""After Ctrl-C, only a failure of Tune's unused ResultGrid is passed over, nothing else."""

from __future__ import annotations

import pytest

from searchlab.experiment._tune import _in_result_grid


def _raised_in(filename: str) -> RuntimeError:
    with pytest.raises(RuntimeError) as info:
        exec(compile("raise RuntimeError('trial_dir_name')", filename, "exec"))
    return info.value


def test_a_failure_building_the_result_grid_is_recognised() -> None:
    assert _in_result_grid(_raised_in("/site-packages/ray/tune/result_grid.py"))


def test_any_other_failure_is_not() -> None:
    assert not _in_result_grid(_raised_in("/site-packages/ray/tune/execution/tune_controller.py"))
