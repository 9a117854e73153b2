"""Which checkpoints ``checkpoint_storage`` says to keep, and deleting the others safely.

Determined's three numbers: ``save_trial_latest`` (newest N of each trial),
``save_trial_best`` (best N of each trial by the searcher metric) and ``save_experiment_best``
(best N over the whole experiment). A trial that is not finished always keeps its newest
checkpoint, whatever the numbers say: it is what a paused or restarted trial resumes from.

Deleting is crash-consistent (``DeferredDeletions``): a checkpoint the policy lets go is only
deleted once no saved state names it any more. Tune's experiment state (and searchlab's
snapshot of it) names each trial's latest checkpoint, the one a resumed run restores; that is
never deleted, and a checkpoint let go is deleted only after a snapshot written since names a
newer one. Paths are relative to the experiment directory and never resolve outside it.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import shutil
from collections.abc import Iterable

from searchlab.experiment._protocol import is_being_written

__all__ = [
    "DeferredDeletions",
    "RetentionPolicy",
    "SavedCheckpoint",
    "checkpoints_to_delete",
    "inside",
]


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


def inside(root: pathlib.Path, relative: str) -> pathlib.Path | None:
    """``root / relative`` when it stays inside ``root`` (no ``..``, no absolute path), else None."""
    if not relative or pathlib.PurePosixPath(relative).is_absolute():
        return None
    root = root.resolve()
    path = (root / relative).resolve()
    return path if path != root and path.is_relative_to(root) else None


class DeferredDeletions:
    """Checkpoints let go by the policy, deleted once no saved state can restore from them.

    ``let_go(path, trial_id)`` queues a checkpoint (a path relative to the experiment
    directory) at the current snapshot generation. ``delete_due(generation, latest)`` deletes
    those queued before ``generation`` (a snapshot written since names newer checkpoints)
    that are not a trial's latest checkpoint in ``latest`` (trial id -> relative path, what
    Tune would restore now), and returns the paths it deleted.

    Example:
        >>> later = DeferredDeletions(exp_dir)
        >>> later.let_go("t1/checkpoint_000000", "t1", generation=3)
        >>> later.delete_due(4, {"t1": "t1/checkpoint_000001"})
        ['t1/checkpoint_000000']
    """

    def __init__(self, root: pathlib.Path) -> None:
        self._root = root
        self._queued: dict[str, tuple[str, int]] = {}  # path -> (trial id, generation)

    def let_go(self, path: str, trial_id: str, generation: int) -> None:
        self._queued.setdefault(path, (trial_id, generation))

    def renew(self, path: str, generation: int) -> None:
        """A queued checkpoint stopped being its trial's latest at ``generation``: a snapshot
        written before then may still name it, so it waits for a newer one."""
        if path in self._queued:
            self._queued[path] = (self._queued[path][0], generation)

    def keep(self, path: str) -> None:
        """A queued checkpoint is needed again (a trial re-registered it): keep it."""
        self._queued.pop(path, None)

    def _latest_unfinished(self, latest: str | None) -> bool:
        target = inside(self._root, latest) if latest else None
        return target is not None and is_being_written(target)

    @property
    def queued(self) -> list[str]:
        return list(self._queued)

    def delete_due(self, generation: int, latest: dict[str, str | None]) -> list[str]:
        gone = []
        for path, (trial_id, queued_at) in list(self._queued.items()):
            if queued_at >= generation or latest.get(trial_id) == path:
                continue
            if self._latest_unfinished(latest.get(trial_id)):
                continue  # its state is still being written: an older one is the fallback
            target = inside(self._root, path)
            if target is not None:
                shutil.rmtree(target, ignore_errors=True)
                if target.exists():
                    continue  # retried at the next step
            del self._queued[path]
            gone.append(path)
        return gone
