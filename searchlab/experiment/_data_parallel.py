"""Data-parallel trials: N Ray actors in the trial's placement group form a torch.distributed group.

The Tune trainable holds bundle 0 (driver of the trial); workers sit in bundles 1..N, each with
its GPU (or CPU), and run the same ``TrialRunner`` with their rank. Rank 0's state is the
checkpoint (with every rank's RNG streams), and every rank restores it, so pause and resume are
exact as for one worker. As there, a rung end's state is written to disk in the background
by the trainable's process (``CheckpointWriter``), and a trial promoted back onto the same
trainable resumes from its memory. A trial paused at a rung and left waiting in Tune's actor
cache has every worker give its trial's memory back (``IdleRelease``; the process group and
NCCL's buffers stay, for the next trial), as a one-worker trial does.

This module imports neither torch nor the trainer: the trainable's process starts the ranks
first and imports them while the ranks start and build (torch alone takes 3-4 s on a GPU
node), instead of before; each rank imports them as its actor is created.
"""

from __future__ import annotations

import datetime
import importlib
import io
import logging
import os
import pathlib
import socket
import time
from typing import TYPE_CHECKING, Any

import ray
from ray import tune
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from searchlab.experiment._idle import IdleRelease, free_accelerator_memory
from searchlab.experiment._protocol import CHECKPOINT_LENGTH_KEY
from searchlab.experiment._spec import ExperimentSpec

if TYPE_CHECKING:
    from searchlab.experiment._checkpoint_writer import CheckpointWriter
    from searchlab.experiment._trial_runner import TrialRunner

__all__ = ["DataParallelTrainable", "TrialWorker", "placement_group_factory"]

# As torch's process groups wait by default: NCCL's lazy set-up reads rank 0's id from the store.
_RENDEZVOUS_TIMEOUT = datetime.timedelta(minutes=30)
_RELEASE_TIMEOUT_S = 300.0
logger = logging.getLogger("searchlab")


def placement_group_factory(workers: int, cpus: float, gpus: float) -> tune.PlacementGroupFactory:
    """One bundle per worker. The trainable that drives them only waits on them, so it asks
    for nothing (Tune's empty head bundle): a trial of N one-CPU workers fits N CPUs."""
    worker = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
    return tune.PlacementGroupFactory([{}] + [dict(worker) for _ in range(workers)])


class TrialWorker:
    """One rank of a data-parallel trial (a Ray actor)."""

    def __init__(self, rank: int, size: int) -> None:
        # torch and the trainer, while the other ranks and the trainable import theirs.
        importlib.import_module("searchlab.experiment._trial_runner")
        self.rank, self.size = rank, size
        self.local_rank, self.local_size = 0, 1
        self._runner: TrialRunner | None = None
        self._store: Any = None  # rank 0's rendezvous store (it must outlive the group)
        self._listener: socket.socket | None = None

    def placement(self) -> tuple[str, list[str]]:
        """This worker's node and the GPU ids Ray gave it."""
        return ray.util.get_node_ip_address(), [str(g) for g in ray.get_gpu_ids()]

    def open_store(self, address: str) -> int:
        """Rank 0: serve the group's rendezvous store on ``address``, a port the OS picks.

        The store has no authentication, so it listens only where the other ranks are: the
        loopback interface when they all run on this node, else this node's address (torch
        binds every interface unless it is handed a socket). Binding port 0 and keeping the
        socket leaves no window in which another process could take the port.
        """
        import torch.distributed

        if self._store is None:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind((address, 0))
            listener.listen(max(self.size, 16))
            self._listener = listener
            self._store = torch.distributed.TCPStore(
                address,
                listener.getsockname()[1],
                self.size,
                is_master=True,
                timeout=_RENDEZVOUS_TIMEOUT,
                wait_for_workers=False,
                master_listen_fd=listener.fileno(),
            )
        return int(self._store.port)

    def init_group(
        self, host: str, port: int, local_rank: int, local_size: int, visible: list[str]
    ) -> None:
        """Join the trial's process group. All GPUs of the node's workers stay visible (as
        with torchrun), so NCCL can use the peer-to-peer links between them."""
        import torch
        import torch.distributed

        self.local_rank, self.local_size = local_rank, local_size
        if torch.distributed.is_initialized():
            return
        own = [str(g) for g in ray.get_gpu_ids()]
        if visible and own:
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(visible)
            torch.cuda.set_device(visible.index(own[0]))  # the context trains on this device
        os.environ.update(
            RANK=str(self.rank),
            WORLD_SIZE=str(self.size),
            LOCAL_RANK=str(local_rank),
            LOCAL_WORLD_SIZE=str(local_size),
        )
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        store = self._store or torch.distributed.TCPStore(
            host, port, self.size, is_master=False, timeout=_RENDEZVOUS_TIMEOUT
        )
        torch.distributed.init_process_group(
            backend, store=store, rank=self.rank, world_size=self.size
        )

    def build(
        self, spec: ExperimentSpec, config: dict[str, Any], trial_id: str, logdir: str | None
    ) -> None:
        from searchlab.experiment._trial_files import shipped_model_dir
        from searchlab.experiment._trial_runner import TrialRunner
        from searchlab.pytorch import DistributedContext

        if self._runner is not None:
            self._runner.close()
        dist = DistributedContext(
            rank=self.rank, size=self.size, local_rank=self.local_rank, local_size=self.local_size
        )
        self._runner = TrialRunner(
            spec,
            config,
            trial_id=trial_id,
            logdir=logdir,
            model_dir=shipped_model_dir(spec),
            distributed=dist,
            worker_process=True,
        )

    def step(self) -> dict[str, Any]:
        assert self._runner is not None
        return self._runner.step()

    def park(self) -> bool:
        """Give back this rank's share of an idle paused trial (rebuilt on its next call);
        False when it could not (the trial is left as it was)."""
        try:
            if self._runner is not None:
                self._runner.park()
        except Exception:
            logger.warning("releasing rank %d of an idle trial failed", self.rank, exc_info=True)
            return False
        free_accelerator_memory()
        return True

    def length_done(self) -> int:
        return self._runner.length_done if self._runner is not None else 0

    def warn(self, message: str) -> None:
        if self._runner is not None:
            self._runner.warn(message)

    def at_rung_end(self) -> bool:
        return self._runner is not None and self._runner.at_rung_end

    def reads_checkpoint_files(self) -> bool:
        return self._runner is not None and self._runner.reads_checkpoint_files

    def unpark(self) -> None:
        if self._runner is not None:
            self._runner.unpark()

    def rng_state(self) -> bytes:
        import torch

        from searchlab.pytorch._state import capture_rng_state

        if self._runner is not None:
            self._runner.settle()  # a window trained ahead ends before any rank's state is taken
        buf = io.BytesIO()
        torch.save(capture_rng_state(), buf)
        return buf.getvalue()

    def checkpoint_written(self, directory: str) -> None:
        assert self._runner is not None
        self._runner.checkpoint_written(directory)

    def state(self) -> bytes | None:
        import torch

        assert self._runner is not None
        saved = self._runner.state()
        if saved is None:
            return None
        buf = io.BytesIO()
        torch.save(saved, buf)
        return buf.getvalue()

    def load(
        self,
        state: dict[str, Any],
        checkpoint_uuid: str | None,
        length_done: int,
        from_memory: bool = False,
    ) -> None:
        from searchlab.pytorch._state import TrialState, restore_rng_state

        assert self._runner is not None
        self._runner.load(state, checkpoint_uuid, length_done)
        if from_memory and self.rank == 0:  # rank 0's results are the trial's
            self._runner.timing["resumed_from_memory"] = 1.0
        per_rank = state.get(TrialState.key("rng_per_rank"))
        if per_rank and self.rank < len(per_rank):
            restore_rng_state(per_rank[self.rank])

    def add_timing(self, timing: dict[str, float]) -> None:
        """Seconds the trainable spent for this trial (a save, a load), reported with this
        rank's next result as a one-worker trial reports its own."""
        if self._runner is not None:
            self._runner.timing.update(timing)

    def weights_digest(self) -> list[float]:
        """Sum of every parameter, for tests that check all ranks hold the same weights."""
        assert self._runner is not None
        self._runner.settle()
        self._runner.unpark()
        assert self._runner.loop is not None
        model = self._runner.loop.context.models[0]
        return [float(p.detach().double().sum()) for p in model.parameters()]

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
            self._runner = None


class DataParallelTrainable(tune.Trainable):
    """A Tune trial whose training runs on ``spec.slots_per_trial`` worker actors."""

    def setup(self, config: dict[str, Any], experiment: ExperimentSpec) -> None:  # type: ignore[override]
        self._spec = experiment
        # The experiment's environment holds in every process of the trial, as in each
        # worker's runner: this one writes the rung-end checkpoints.
        os.environ.update(experiment.environment_variables)
        self._idle = IdleRelease(self._release, experiment.release_idle_after_s)
        self._workers = self._start_workers(experiment.slots_per_trial)
        builds = self._build_calls(config)
        # torch and the writer load here, while the ranks build (see the module docstring).
        from searchlab.experiment._checkpoint_writer import CheckpointWriter

        self._writer: CheckpointWriter = CheckpointWriter.for_setting(
            experiment.checkpoint_writes, trains=False
        )
        ray.get(builds)

    def _release(self) -> None:
        parked = ray.get([w.park.remote() for w in self._workers], timeout=_RELEASE_TIMEOUT_S)
        if not all(parked):  # every rank rebuilds at once (DDP's set-up is collective), or none
            ray.get([w.unpark.remote() for w in self._workers], timeout=_RELEASE_TIMEOUT_S)

    def _start_workers(self, n: int) -> list[Any]:
        pg = ray.util.get_current_placement_group()
        if pg is None:
            raise RuntimeError("a data-parallel trial must run in its placement group")
        bundles = pg.bundle_specs
        first = len(bundles) - n  # the worker bundles are the last n
        actor: Any = ray.remote(TrialWorker)
        workers: list[Any] = [
            actor.options(
                num_cpus=bundles[first + i].get("CPU", 0),
                num_gpus=bundles[first + i].get("GPU", 0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=first + i
                ),
            ).remote(i, n)
            for i in range(n)
        ]
        placements = ray.get([w.placement.remote() for w in workers])
        one_node = len({node for node, _ in placements}) == 1
        host = "127.0.0.1" if one_node else placements[0][0]
        port = ray.get(workers[0].open_store.remote(host))
        calls = []
        for worker, (node, _) in zip(workers, placements):
            same_node = [i for i, (n, _) in enumerate(placements) if n == node]
            local_rank = same_node.index(workers.index(worker))
            visible = list(dict.fromkeys(g for i in same_node for g in placements[i][1]))
            calls.append(worker.init_group.remote(host, port, local_rank, len(same_node), visible))
        ray.get(calls)
        return workers

    def _build_calls(self, config: dict[str, Any]) -> list[Any]:
        return [
            w.build.remote(self._spec, config, self.trial_id, self.logdir) for w in self._workers
        ]

    def step(self) -> dict[str, Any]:
        with self._idle.busy():
            # Its own failed write fails it, as a failed save did.
            self._writer.before_training(self.trial_id)
            results = ray.get([w.step.remote() for w in self._workers])
        return results[0]

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        with self._idle.busy():
            pausing = self._save(checkpoint_dir)
        if pausing:
            self._idle.arm()

    def _save(self, checkpoint_dir: str) -> bool:
        """Save the trial's state into ``checkpoint_dir``; True when it stands at a rung end."""
        import torch

        from searchlab.experiment._trainable import write_in_background
        from searchlab.pytorch._checkpoint import write_checkpoint_files
        from searchlab.pytorch._state import TrialState

        began = time.perf_counter()
        ray.get([w.unpark.remote() for w in self._workers])  # every rank's RNG is current
        blob = ray.get(self._workers[0].state.remote())
        if blob is None:
            return bool(ray.get(self._workers[0].at_rung_end.remote()))
        state, metadata = torch.load(io.BytesIO(blob), weights_only=False)
        rng = ray.get([w.rng_state.remote() for w in self._workers])
        state[TrialState.key("rng_per_rank")] = [
            torch.load(io.BytesIO(b), weights_only=False) for b in rng
        ]
        # Every rank's parameter sums: lets anyone check the ranks agreed at this checkpoint.
        metadata["rank_weight_sums"] = ray.get([w.weights_digest.remote() for w in self._workers])
        metadata[CHECKPOINT_LENGTH_KEY] = ray.get(self._workers[0].length_done.remote())
        rank0 = self._workers[0]
        at_rung_end, reads_files = ray.get(
            [rank0.at_rung_end.remote(), rank0.reads_checkpoint_files.remote()]
        )
        if write_in_background(self._spec, self._storage, at_rung_end, reads_files):
            # The state is this process's own copy (loaded from rank 0's bytes), so it is
            # staged as it is; ``save`` writes it after Tune's copy.
            self._writer.stage(checkpoint_dir, state, metadata, owned=True, owner=self.trial_id)
        else:
            self._writer.flush(self.trial_id)  # an earlier write's error first
            write_checkpoint_files(checkpoint_dir, state, metadata, durable=False)
        ray.get(rank0.checkpoint_written.remote(checkpoint_dir))  # rank 0's hooks
        # Reported with rank 0's next result (Ray runs one caller's calls to an actor in order).
        rank0.add_timing.remote({"checkpoint_write_s": time.perf_counter() - began})
        return bool(at_rung_end)

    def load_checkpoint(self, checkpoint: Any) -> None:
        from searchlab.experiment._trial_files import checkpoint_rung_length, load_with_fallback

        with self._idle.busy():
            began = time.perf_counter()
            kept = self._writer.take(str(checkpoint))
            if kept is not None:  # this trainable saved it: no read from disk
                state, used = kept, pathlib.Path(str(checkpoint))
            else:  # ``restore`` waited for a write in flight elsewhere
                state, used = load_with_fallback(str(checkpoint))
            ref = ray.put(state)
            name, done = used.name, checkpoint_rung_length(used) or 0
            memory = kept is not None
            ray.get([w.load.remote(ref, name, done, memory) for w in self._workers])
            self._workers[0].add_timing.remote({"checkpoint_load_s": time.perf_counter() - began})

    def save(self, checkpoint_dir: str | None = None) -> Any:
        from searchlab.experiment._trainable import save_then_write

        return save_then_write(
            self._writer, lambda: super(DataParallelTrainable, self).save(checkpoint_dir)
        )

    def restore(self, checkpoint_path: Any, *args: Any, **kwargs: Any) -> Any:
        from searchlab.experiment._trainable import existing_checkpoint

        checkpoint_path = existing_checkpoint(checkpoint_path, self._warn)
        if checkpoint_path is None:
            return None
        return super().restore(checkpoint_path, *args, **kwargs)

    def _warn(self, message: str) -> None:
        ray.get(self._workers[0].warn.remote(message))

    def reset(self, *args: Any, **kwargs: Any) -> bool:
        self._idle.cancel()  # no release of the previous trial while Tune switches trials
        return bool(super().reset(*args, **kwargs))

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        with self._idle.busy():
            ray.get(self._build_calls(new_config))
        return True

    def cleanup(self) -> None:
        idle = getattr(self, "_idle", None)
        if idle is not None:
            idle.cancel()
        try:  # the workers first: the write in flight needs no GPU
            for worker in getattr(self, "_workers", []):
                try:
                    ray.get(worker.close.remote(), timeout=30)
                except Exception:
                    pass
                ray.kill(worker)
            self._workers = []
        finally:
            writer = getattr(self, "_writer", None)
            if writer is not None:
                # The last checkpoint is in place before the actor ends.
                writer.close(getattr(self, "trial_id", None))
