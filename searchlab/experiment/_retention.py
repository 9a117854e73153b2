"""Which checkpoints ``checkpoint_storage`` says to keep, and deleting the others.

Determined's three numbers: ``save_trial_latest`` (newest N of each trial),
``save_trial_best`` (best N of each trial by the searcher metric) and ``save_experiment_best``
(best N over the whole experiment). A trial that is not finished always keeps its newest
checkpoint, whatever the numbers say: it is what a paused or restarted trial resumes from.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import shutil
from collections.abc import Iterable

__all__ = ["RetentionPolicy", "SavedCheckpoint", "checkpoints_to_delete", "delete_checkpoints"]


@dataclasses.dataclass(frozen=True)
class RetentionPolicy:
    save_trial_latest: int = 1
    save_trial_best: int = 1
    save_experiment_best: int = 0
    smaller_is_better: bool = True


@dataclasses.dataclass(frozen=True)
class SavedCheckpoint:
    """One checkpoint: its trial, position (order of saving) and searcher metric, if validated."""

    trial_id: str
    path: str
    order: int
    metric: float | None
    trial_finished: bool = False


def _rank(policy: RetentionPolicy, ckpt: SavedCheckpoint) -> float:
    if ckpt.metric is None or not math.isfinite(ckpt.metric):
        return math.inf
    return ckpt.metric if policy.smaller_is_better else -ckpt.metric


def checkpoints_to_delete(
    checkpoints: Iterable[SavedCheckpoint], policy: RetentionPolicy
) -> list[SavedCheckpoint]:
    """The checkpoints no rule keeps."""
    all_ckpts = list(checkpoints)
    keep: set[str] = set()
    by_trial: dict[str, list[SavedCheckpoint]] = {}
    for ckpt in all_ckpts:
        by_trial.setdefault(ckpt.trial_id, []).append(ckpt)
    for ckpts in by_trial.values():
        newest_first = sorted(ckpts, key=lambda c: c.order, reverse=True)
        latest = (
            policy.save_trial_latest
            if newest_first[0].trial_finished
            else max(policy.save_trial_latest, 1)
        )
        keep.update(c.path for c in newest_first[:latest])
        validated = [c for c in ckpts if c.metric is not None]
        best = sorted(validated, key=lambda c: (_rank(policy, c), -c.order))
        keep.update(c.path for c in best[: policy.save_trial_best])
    validated = [c for c in all_ckpts if c.metric is not None]
    best = sorted(validated, key=lambda c: (_rank(policy, c), -c.order))
    keep.update(c.path for c in best[: policy.save_experiment_best])
    return [c for c in all_ckpts if c.path not in keep]


def delete_checkpoints(checkpoints: Iterable[SavedCheckpoint]) -> list[str]:
    """Remove the directories; returns the paths that are gone."""
    gone = []
    for ckpt in checkpoints:
        shutil.rmtree(ckpt.path, ignore_errors=True)
        if not pathlib.Path(ckpt.path).exists():
            gone.append(ckpt.path)
    return gone
