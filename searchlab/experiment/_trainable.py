"""The Ray Tune trainable: one Tune trial runs one ``PyTorchTrial`` in its actor's process.

Class API with actor reuse: Tune calls ``save_checkpoint`` exactly when it pauses a trial, so a
pause loses nothing, and a cached actor takes the next trial (``reset_config``) without a new
process. A rung end's checkpoint state is written in the background (``CheckpointWriter``),
and a trial promoted back onto the worker that paused it resumes from that worker's memory. An actor left idle after a checkpoint (a paused trial waiting in Tune's cache) gives
the trial's memory back (``IdleRelease``). The training itself is ``TrialRunner``'s, shared
with data-parallel workers.
"""

from __future__ import annotations

import contextlib
import pathlib
import time
from collections.abc import Iterator
from typing import Any

import pyarrow.fs
import ray
from ray import tune

from searchlab._failpoints import failpoint
from searchlab.experiment._checkpoint_writer import (
    CheckpointWriter,
    is_being_written,
    wait_until_written,
)
from searchlab.experiment._compat import checkpoint_path_of, with_checkpoint_path
from searchlab.experiment._idle import IdleRelease, free_accelerator_memory
from searchlab.experiment._protocol import CHECKPOINT_LENGTH_KEY
from searchlab.experiment._spec import ExperimentSpec
from searchlab.experiment._standby import GpuBaton, MemoryGuard, is_out_of_memory
from searchlab.experiment._trial_files import (
    checkpoint_rung_length,
    earlier_checkpoints,
    load_with_fallback,
    shipped_model_dir,
)
from searchlab.experiment._trial_runner import TrialRunner
from searchlab.pytorch._checkpoint import write_checkpoint_files

__all__ = [
    "SearchlabTrainable",
    "checkpoint_rung_length",
    "existing_checkpoint",
    "save_then_write",
    "write_in_background",
]


def existing_checkpoint(restore_arg: Any, warn: Any) -> Any:
    """Tune's restore argument, or one pointing at the newest earlier checkpoint of the trial
    when the one Tune names is gone (deleted by hand, lost with a disk) or was never completed
    (its state was written in the background by a worker that died first): the trial replays
    the batches in between. None when the trial has no checkpoint left: it starts over.

    A checkpoint another live worker is still writing is waited for."""
    path = checkpoint_path_of(restore_arg)
    if path is None:
        return restore_arg
    if not pathlib.Path(path).exists():
        problem = "is missing"
    elif is_being_written(path) and not wait_until_written(path):
        problem = "was never completed (its worker stopped while writing it)"
    else:
        return restore_arg
    for candidate in earlier_checkpoints(pathlib.Path(path)):
        if is_being_written(candidate):
            continue
        if any((candidate / n).is_file() for n in ("state-dict.pth", "state_dict.pth")):
            warn(f"checkpoint {path} {problem}; resuming from the earlier checkpoint {candidate}")
            return with_checkpoint_path(restore_arg, str(candidate))
    warn(f"checkpoint {path} {problem} and no earlier one exists; the trial starts over")
    return None


def write_in_background(
    spec: ExperimentSpec, storage: Any, at_rung_end: bool, reads_checkpoint_files: bool
) -> bool:
    """Write a checkpoint's state after ``save`` returns? Only at a rung end the trial goes on
    from (a pause or a promotion), into a local experiment directory (``storage``: the
    trainable's Tune storage context), and not for a trial whose callbacks read checkpoint
    files as they are written."""
    return (
        spec.staged_checkpoints
        and at_rung_end
        and not reads_checkpoint_files
        and storage is not None
        and isinstance(storage.storage_filesystem, pyarrow.fs.LocalFileSystem)
    )


def save_then_write(writer: CheckpointWriter, save: Any) -> Any:
    """``save()`` (Tune's ``Trainable.save``: ``save_checkpoint``, then Tune's copy of the
    directory), then the write of a state ``save_checkpoint`` staged into the checkpoint
    directory Tune copied the staged files to. A failed save leaves nothing staged."""
    try:
        saved = save()
    except BaseException:
        writer.drop_staged()
        raise
    if writer.staged:
        checkpoint = saved.checkpoint
        if checkpoint is None:  # pragma: no cover - Tune persists every class trainable's
            raise RuntimeError("Ray Tune kept no checkpoint of a saved trial")
        writer.start(str(checkpoint.path))
    return saved


class SearchlabTrainable(tune.Trainable):
    """Runs the experiment's trial class for one set of hyperparameters."""

    def setup(self, config: dict[str, Any], experiment: ExperimentSpec) -> None:  # type: ignore[override]
        gpus = [str(g) for g in ray.get_gpu_ids()]
        node = ray.get_runtime_context().get_node_id()
        self._baton = GpuBaton.for_worker(experiment.standby_key, gpus, node)
        if self._baton is not None:
            self._memory = MemoryGuard(self._baton)
            self._baton.before_release = self._before_release
        self._spec = experiment
        self._runner: TrialRunner | None = None
        self._idle = IdleRelease(self._release, experiment.release_idle_after_s)
        # With standby, a promoted trial comes back to whichever of its GPU's actors is free,
        # and loads its state there while another trains: kept states (up to 1 GiB an actor)
        # would save a tenth of a second off the GPU's path (calls 18B-18C).
        self._writer = CheckpointWriter.for_setting(
            experiment.checkpoint_writes, trains=True, keep=self._baton is None
        )
        with self._gpu_work():
            self._build(config)

    @contextlib.contextmanager
    def _gpu_work(self) -> Iterator[None]:
        """Around a call that may put the trial on the GPU. With standby (``_standby``'s
        memory rules): running out of GPU memory marks the GPU's next memory level before
        Tune sees the error (and retries the trial), and on a crowded GPU the call runs in
        the GPU's turn, at whose end the trial is parked."""
        if self._baton is None:
            yield
            return
        seen = self._baton.level
        try:
            if seen >= 2 and self._runner is not None:
                self._runner.settle()  # a window trained ahead takes the turn itself: first
            with self._baton.held() if seen >= 2 else contextlib.nullcontext():
                yield
        except RuntimeError as exc:  # torch.cuda.OutOfMemoryError included
            if is_out_of_memory(exc):
                self._baton.out_of_memory(seen)
            raise

    def _before_release(self, failed: bool) -> None:
        """Standby: the end of each turn of this actor on the GPU (``failed``: its work
        raised, and Tune will end the actor)."""
        assert self._baton is not None
        if self._baton.crowded and self._runner is not None and not failed:
            self._runner.park_between_windows()
            # The closed trial's objects hold each other: collect them, then give back.
            free_accelerator_memory()
        else:
            self._memory.after_window()

    def _build(self, config: dict[str, Any]) -> None:
        began = time.perf_counter()
        self._runner = TrialRunner(
            self._spec,
            config,
            trial_id=self.trial_id,
            logdir=self.logdir,
            model_dir=shipped_model_dir(self._spec),
            worker_process=True,
            turn=self._baton.held if self._baton is not None else None,
            warm_up=(
                self._baton.claim_warm_up
                if self._baton is not None and self._spec.standby_warm_up
                else None
            ),
        )
        self._runner.timing["build_s"] = time.perf_counter() - began

    def _release(self) -> None:
        if self._runner is not None:
            self._runner.park()
        free_accelerator_memory()

    def step(self) -> dict[str, Any]:
        with self._idle.busy():
            assert self._runner is not None
            # Its own failed write fails it, as a failed save did; a write this trial must
            # wait for is waited for before it takes the GPU.
            self._writer.before_training(self.trial_id)
            with self._gpu_work():
                baton = self._baton
                if baton is not None and self._spec.standby_prepare and not baton.crowded:
                    self._runner.prepare()  # while this GPU's other trial trains
                # With standby, the runner trains in the GPU's turn (the baton): this GPU's
                # other trial actor trains whenever this one does not.
                return self._runner.step()

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        with self._idle.busy(), self._gpu_work():
            assert self._runner is not None
            saved = self._runner.state()
            if saved is not None:  # a trial that never built (InvalidHP) has nothing to save
                state, metadata = saved
                metadata = {**metadata, CHECKPOINT_LENGTH_KEY: self._runner.length_done}
                if self._in_background():  # the state's write follows Tune's save()
                    self._writer.stage(checkpoint_dir, state, metadata, owner=self.trial_id)
                else:
                    self._writer.flush(self.trial_id)  # an earlier write's error first
                    # Tune copies the directory into the experiment and deletes it: no fsync.
                    write_checkpoint_files(checkpoint_dir, state, metadata, durable=False)
                failpoint("checkpoint-write")  # written, not yet handed to Tune
                self._runner.checkpoint_written(checkpoint_dir)
        if self._runner is not None and self._runner.at_rung_end:
            self._idle.arm()  # a pause at a rung: nothing may call the actor for a long time
        return None

    def load_checkpoint(self, checkpoint: Any) -> None:
        with self._idle.busy(), self._gpu_work():
            assert self._runner is not None
            if self._runner.loop is None and not self._runner.parked:
                return
            began = time.perf_counter()
            path = str(checkpoint)
            kept = self._writer.take(path)
            if kept is not None:  # this worker saved it: resume from host memory
                state, used = kept, pathlib.Path(path)
                self._runner.timing["resumed_from_memory"] = 1.0
            else:  # ``restore`` waited for a write in flight elsewhere
                state, used = load_with_fallback(path)
            done = checkpoint_rung_length(used) or 0
            self._runner.load(state, checkpoint_uuid=used.name, length_done=done)
            self._runner.timing["checkpoint_load_s"] = time.perf_counter() - began

    def save(self, checkpoint_dir: str | None = None) -> Any:
        began = time.perf_counter()
        saved = save_then_write(
            self._writer, lambda: super(SearchlabTrainable, self).save(checkpoint_dir)
        )
        if self._runner is not None:  # the whole save, the state's write at once included
            self._runner.timing["checkpoint_write_s"] = time.perf_counter() - began
        return saved

    def _in_background(self) -> bool:
        runner = self._runner
        return runner is not None and write_in_background(
            self._spec, self._storage, runner.at_rung_end, runner.reads_checkpoint_files
        )

    def restore(self, checkpoint_path: Any, *args: Any, **kwargs: Any) -> Any:
        assert self._runner is not None
        checkpoint_path = existing_checkpoint(checkpoint_path, self._runner.warn)
        if checkpoint_path is None:
            return None
        return super().restore(checkpoint_path, *args, **kwargs)

    def reset(self, *args: Any, **kwargs: Any) -> bool:
        # Tune switches the actor's trial id, directory and log files before reset_config:
        # no release of the previous trial may run while it does.
        self._idle.cancel()
        return bool(super().reset(*args, **kwargs))

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        with self._idle.busy(), self._gpu_work():
            self._close(collect=False)  # the next trial is built at once
            self._build(new_config)
        return True

    def cleanup(self) -> None:
        # Tune ends the actor's process right after: a garbage collection here (~0.8 s with
        # torch and Ray loaded, on 2 cores) only delayed the end of every search.
        with self._idle.busy():
            try:
                # The last checkpoint is in place before the actor ends.
                self._writer.close(self.trial_id)
            finally:
                self._close(collect=False)
                if self._baton is not None:
                    self._baton.close()

    def _close(self, collect: bool = True) -> None:
        if self._runner is not None:
            self._runner.close()
            self._runner = None
        free_accelerator_memory(collect)
