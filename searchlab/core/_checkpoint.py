"""``core_context.checkpoint``: checkpoint directories named by a storage id (a uuid).

In a trial, checkpoints go to the trial's own directory and the trial's actor keeps the
latest: a paused or restarted trial gets it back as ``info.latest_checkpoint``. Each
checkpoint is written aside and renamed into place, with ``metadata.json`` holding the
metadata the script gave.

Example:
    >>> with core_context.checkpoint.store_path({"steps_completed": 100}) as (path, uuid):
    ...     torch.save(model.state_dict(), path / "model.pt")
    >>> with core_context.checkpoint.restore_path(info.latest_checkpoint) as path:
    ...     model.load_state_dict(torch.load(path / "model.pt"))
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import pathlib
import shutil
import uuid
from collections.abc import Iterator
from typing import Any

from searchlab.core._channel import Stored
from searchlab.core._distributed import DistributedLike
from searchlab.core._session import TrialSession
from searchlab.errors import CheckpointError

__all__ = ["CheckpointContext", "DownloadMode"]

METADATA_FILE = "metadata.json"


class DownloadMode(enum.Enum):
    """Accepted for Determined's signatures; every rank reads the same local directory."""

    LocalWorkersShareDownload = "LOCAL_WORKERS_SHARE_DOWNLOAD"
    NoSharedDownload = "NO_SHARED_DOWNLOAD"


class CheckpointContext:
    """Stores and finds checkpoint directories under one storage root."""

    def __init__(
        self,
        storage_root: str | os.PathLike[str],
        distributed: DistributedLike,
        session: TrialSession | None = None,
    ) -> None:
        self._root = pathlib.Path(storage_root)
        self._dist = distributed
        self._session = session

    @contextlib.contextmanager
    def store_path(
        self, metadata: dict[str, Any] | None = None, *, shard: bool = False
    ) -> Iterator[tuple[pathlib.Path, str]]:
        """A fresh directory to write a checkpoint into, and its storage id.

        Only rank 0 may call it unless ``shard=True`` (then every rank calls it and writes its
        own files into the same directory).
        """
        if not shard and self._dist.rank != 0:
            raise RuntimeError(
                "cannot call store_path(shard=False) from a worker other than the chief "
                f"(rank={self._dist.rank}); call it on rank 0, or pass shard=True on every rank"
            )
        storage_id = str(uuid.uuid4()) if self._dist.rank == 0 else ""
        if shard:
            storage_id = self._dist.broadcast(storage_id)
        tmp = self._root / f".tmp-{storage_id}"
        tmp.mkdir(parents=True, exist_ok=True)
        try:
            yield tmp, storage_id
        except BaseException:
            if self._dist.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        if shard:
            self._dist.barrier()
        if self._dist.rank == 0:
            self._finish(tmp, storage_id, dict(metadata or {}))
        if shard:
            self._dist.barrier()

    def _finish(self, tmp: pathlib.Path, storage_id: str, metadata: dict[str, Any]) -> None:
        (tmp / METADATA_FILE).write_text(json.dumps(metadata, indent=2, default=str))
        final = self._root / storage_id
        os.replace(tmp, final)
        if self._session is not None:
            steps = metadata.get("steps_completed")
            batches = int(steps) if isinstance(steps, int) and not isinstance(steps, bool) else None
            self._session.notify(Stored(path=str(final), batches=batches))

    def upload(
        self,
        ckpt_dir: str | os.PathLike[str] | None,
        metadata: dict[str, Any] | None = None,
        *,
        shard: bool = False,
        selector: Any = None,
    ) -> str:
        """Copy a finished directory in as a new checkpoint; returns its storage id."""
        with self.store_path(metadata, shard=shard) as (path, storage_id):
            if ckpt_dir is not None:
                shutil.copytree(ckpt_dir, path, dirs_exist_ok=True)
        return storage_id

    def _resolve(self, storage_id: str) -> pathlib.Path:
        candidate = pathlib.Path(storage_id)
        for path in (candidate, self._root / storage_id):
            if path.is_absolute() and path.is_dir():
                return path
        raise CheckpointError(
            f"checkpoint {storage_id!r}: not a directory, nor a checkpoint under {self._root}; "
            "pass info.latest_checkpoint or the storage id store_path() returned"
        )

    @contextlib.contextmanager
    def restore_path(
        self,
        storage_id: str,
        download_mode: DownloadMode = DownloadMode.LocalWorkersShareDownload,
        *,
        selector: Any = None,
    ) -> Iterator[pathlib.Path]:
        """The directory of a checkpoint (a storage id or a path, e.g. ``latest_checkpoint``)."""
        yield self._resolve(str(storage_id))

    def download(
        self,
        storage_id: str,
        ckpt_dir: str | os.PathLike[str],
        download_mode: DownloadMode = DownloadMode.LocalWorkersShareDownload,
        *,
        selector: Any = None,
    ) -> None:
        """Copy a checkpoint's files into ``ckpt_dir``."""
        shutil.copytree(self._resolve(str(storage_id)), ckpt_dir, dirs_exist_ok=True)

    def get_metadata(self, storage_id: str) -> dict[str, Any]:
        """The metadata stored with a checkpoint (empty when it has none)."""
        path = self._resolve(str(storage_id)) / METADATA_FILE
        if not path.is_file():
            return {}
        data = json.loads(path.read_text())
        return dict(data) if isinstance(data, dict) else {}

    def delete(self, storage_id: str, globs: list[str] | None = None) -> None:
        """Delete a checkpoint (or only the files matching ``globs``)."""
        path = self._resolve(str(storage_id))
        if not globs:
            shutil.rmtree(path)
            return
        for pattern in globs:
            for match in path.glob(pattern):
                if match.is_dir():
                    shutil.rmtree(match)
                else:
                    match.unlink()
