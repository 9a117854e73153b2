"""Shipping the model directory to Ray workers when Ray was started by someone else.

``searchlab run`` starts or joins Ray with the model directory as the job's ``working_dir``.
A notebook or test that called ``ray.init()`` itself cannot take a job runtime environment
any more, so the directory travels as a zip in Ray's object store instead and each worker
unpacks it once. No shared disk is assumed either way.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import os
import pathlib
import shutil
import stat
import tempfile
import zipfile

__all__ = ["EXCLUDES", "pack_model_dir", "unpack_model_dir"]

EXCLUDES = [".git", "__pycache__", "*.pyc", "searchlab-results", "searchlab-checkpoints", ".venv"]


def _excluded(rel: pathlib.Path) -> bool:
    return any(fnmatch.fnmatch(part, pattern) for part in rel.parts for pattern in EXCLUDES)


def pack_model_dir(model_dir: str | os.PathLike[str]) -> bytes:
    """The model directory as zip bytes (without caches, results and virtualenvs)."""
    root = pathlib.Path(model_dir)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root)
            if path.is_file() and not _excluded(rel):
                zf.write(path, rel.as_posix())
    return buf.getvalue()


def _private_root() -> pathlib.Path:
    """``<tmp>/searchlab-models-<uid>``: created 0700, and used only if it is this user's own
    and nobody else can write into it (another user could otherwise plant code in it)."""
    root = pathlib.Path(tempfile.gettempdir()) / f"searchlab-models-{os.getuid()}"
    try:
        root.mkdir(mode=0o700)
    except FileExistsError:
        pass
    info = root.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(
            f"{root} is not a private directory of this user (owner uid {info.st_uid}, mode "
            f"{stat.S_IMODE(info.st_mode):o}); remove it or set TMPDIR to a private directory"
        )
    return root


def unpack_model_dir(archive: bytes) -> str:
    """Unpack ``archive`` under this user's private temp dir (once per content); return it."""
    digest = hashlib.sha256(archive).hexdigest()
    target = _private_root() / digest
    if target.is_dir():
        return str(target)
    staging = pathlib.Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{digest[:16]}-"))
    with zipfile.ZipFile(io.BytesIO(archive)) as zf:
        zf.extractall(staging)
    try:
        os.replace(staging, target)  # atomic: concurrent workers agree on one copy
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)  # another worker won the race
    return str(target)
