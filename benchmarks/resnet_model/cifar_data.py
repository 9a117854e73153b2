"""CIFAR-10-shaped data without a download: synthetic files in CIFAR-10's own format.

The images are random (each class has its own mean image plus noise, so a model can learn
something), for measuring throughput only: accuracy on them says nothing about CIFAR-10.
The files are the ``cifar-10-batches-py`` layout torchvision reads (``data_batch_1..5``,
``test_batch``, ``batches.meta``), so :class:`SyntheticCIFAR10` is torchvision's own
``CIFAR10`` loader with only the checksum test relaxed.

This module lives in the benchmark's model directory because Ray ships that directory to the
trial workers; ``benchmarks/_cifar.py`` re-exports it for the benchmark scripts.

Example:
    >>> root = write_fake_cifar("/tmp/fake-cifar", n_train=1000, n_test=200, seed=0)
    >>> train = CifarTensors.load(root, train=True)
    >>> image, label = train[0]  # uint8 (3, 32, 32), int64
"""

from __future__ import annotations

import os
import pathlib
import pickle
import shutil
import struct
import tempfile
import uuid
from typing import Any

import numpy as np
import torch
from torchvision.datasets import CIFAR10
from torchvision.datasets.utils import check_integrity

__all__ = [
    "LABEL_NAMES",
    "SYNTHETIC_KEY",
    "CifarTensors",
    "SyntheticCIFAR10",
    "ensure_fake_cifar",
    "write_fake_cifar",
]

LABEL_NAMES = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
]
SYNTHETIC_KEY = "searchlab_synthetic"  # extra key in batches.meta; real files lack it
_TRAIN_FILES = [f"data_batch_{i}" for i in range(1, 6)]
_TEST_FILE = "test_batch"
_META_FILE = "batches.meta"
_PIXELS = 3 * 32 * 32


class _Py2Str(str):
    """A string pickled as Python 2's ``str``, as in the real CIFAR-10 files."""


_PurePythonPickler: Any = pickle._Pickler  # type: ignore[attr-defined]  # has a dispatch table


class _Py2Pickler(_PurePythonPickler):
    """Writes ``_Py2Str`` with the BINSTRING opcodes of Python 2's ``str``.

    Loaded with ``encoding="latin1"`` (torchvision) they are ``str`` keys such as ``"data"``;
    with ``encoding="bytes"`` (the recipe on the CIFAR-10 page) they are ``b"data"``: the
    same two views the real files give. A Python 3 ``str`` or ``bytes`` key gives only one.
    """

    dispatch = dict(_PurePythonPickler.dispatch)

    def _save_py2str(self, obj: _Py2Str) -> None:
        data = obj.encode("latin1")
        if len(data) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(data)]) + data)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(data)) + data)
        self.memoize(obj)

    dispatch[_Py2Str] = _save_py2str


def _py2(value: Any) -> Any:
    if isinstance(value, str):
        return _Py2Str(value)
    if isinstance(value, dict):
        return {_py2(k): _py2(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_py2(v) for v in value]
    return value


def _dump(path: pathlib.Path, obj: dict[str, Any]) -> None:
    with open(path, "wb") as f:
        _Py2Pickler(f, protocol=3).dump(_py2(obj))


def _images(n: int, rng: np.random.Generator, templates: np.ndarray) -> tuple[np.ndarray, list]:
    labels = rng.integers(0, len(LABEL_NAMES), size=n)
    noise = rng.integers(0, 128, size=(n, _PIXELS), dtype=np.uint8)
    data = (templates[labels] + noise).astype(np.uint8)  # < 256: templates are < 128
    return data, [int(v) for v in labels]


def _batch(data: np.ndarray, labels: list[int], label: str, first: int) -> dict[str, Any]:
    return {
        "batch_label": label,
        "labels": labels,
        "data": data,
        "filenames": [f"synthetic_{first + i:06d}.png" for i in range(len(labels))],
    }


def write_fake_cifar(
    root: str | os.PathLike[str], n_train: int = 50_000, n_test: int = 10_000, seed: int = 0
) -> pathlib.Path:
    """Write synthetic CIFAR-10 python batches under ``root/cifar-10-batches-py``.

    ``n_train`` images are split over the five training batches, ``n_test`` go into
    ``test_batch``; ``data`` is uint8 ``(N, 3072)`` (channel-major rows, as in CIFAR-10) and
    ``labels`` a list of ints in ``[0, 10)``. Returns ``root``.
    """
    if n_train < 0 or n_test < 0:
        raise ValueError(f"n_train is {n_train} and n_test is {n_test}, but both must be >= 0")
    root = pathlib.Path(root)
    folder = root / CIFAR10.base_folder
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    templates = rng.integers(0, 128, size=(len(LABEL_NAMES), _PIXELS), dtype=np.uint8)
    data, labels = _images(n_train, rng, templates)
    first = 0
    for i, (name, idx) in enumerate(zip(_TRAIN_FILES, np.array_split(np.arange(n_train), 5))):
        part = [labels[j] for j in idx]
        label = f"training batch {i + 1} of 5"
        _dump(folder / name, _batch(data[idx], part, label, first))
        first += len(idx)
    data, labels = _images(n_test, rng, templates)
    _dump(folder / _TEST_FILE, _batch(data, labels, "testing batch 1 of 1", 0))
    meta = {
        "num_cases_per_batch": max(len(a) for a in np.array_split(np.arange(n_train), 5)),
        "label_names": LABEL_NAMES,
        "num_vis": _PIXELS,
        SYNTHETIC_KEY: True,
    }
    _dump(folder / _META_FILE, meta)
    return root


def ensure_fake_cifar(
    root: str | os.PathLike[str], n_train: int, n_test: int, seed: int = 0
) -> pathlib.Path:
    """``root`` holding synthetic CIFAR files, written once even when trials race to it."""
    root = pathlib.Path(root)
    if SyntheticCIFAR10.files_present(root):
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(
        tempfile.mkdtemp(prefix=f".{root.name}-{uuid.uuid4().hex[:6]}-", dir=root.parent)
    )
    try:
        write_fake_cifar(tmp, n_train, n_test, seed)
        try:
            os.rename(tmp, root)  # atomic; fails if another process got there first
        except OSError:
            if not SyntheticCIFAR10.files_present(root):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


class SyntheticCIFAR10(CIFAR10):
    """torchvision's ``CIFAR10`` that accepts files from :func:`write_fake_cifar`.

    Only the MD5 checks are dropped (generated files cannot match CIFAR-10's checksums);
    reading, decoding and ``__getitem__`` (PIL images) are torchvision's. Real CIFAR-10
    files load too; ``synthetic`` tells which it got. Never downloads.

    Example:
        >>> ds = SyntheticCIFAR10(write_fake_cifar("/tmp/c", 100, 20), train=False)
        >>> ds.synthetic, len(ds), ds.data.shape
        (True, 20, (20, 32, 32, 3))
    """

    meta = {**CIFAR10.meta, "md5": None}

    def __init__(self, root: str | os.PathLike[str], train: bool = True, **kwargs: Any) -> None:
        if kwargs.get("download"):
            raise ValueError(
                "SyntheticCIFAR10 never downloads (download=True given); write the files "
                "with write_fake_cifar(root, ...) first"
            )
        if not self.files_present(root):
            raise FileNotFoundError(
                f"{pathlib.Path(root) / self.base_folder}: no CIFAR-10 batch files; write "
                f"synthetic ones with write_fake_cifar({str(root)!r}, n_train, n_test)"
            )
        super().__init__(root, train=train, **kwargs)
        with open(os.path.join(self.root, self.base_folder, _META_FILE), "rb") as f:
            self.synthetic = bool(pickle.load(f, encoding="latin1").get(SYNTHETIC_KEY, False))

    @staticmethod
    def files_present(root: str | os.PathLike[str]) -> bool:
        folder = pathlib.Path(root) / CIFAR10.base_folder
        return all((folder / n).is_file() for n in [*_TRAIN_FILES, _TEST_FILE, _META_FILE])

    def _check_integrity(self) -> bool:
        files = [name for name, _ in self.train_list + self.test_list] + [_META_FILE]
        folder = os.path.join(self.root, self.base_folder)
        return all(check_integrity(os.path.join(folder, name), None) for name in files)


class CifarTensors(torch.utils.data.Dataset):
    """CIFAR images preloaded as one uint8 ``(N, 3, 32, 32)`` tensor: cheap to batch.

    ``__getitem__`` returns ``(uint8 image, int64 label)``; scaling to floats happens on the
    GPU (see ``model_def.CifarInput``), so loader workers only index and collate. With
    ``length`` larger than N the images repeat (index ``i`` is image ``i % N``): a longer
    epoch, for benchmarks that keep epoch boundaries out of their timed part.
    """

    def __init__(
        self, images: torch.Tensor, labels: torch.Tensor, length: int | None = None
    ) -> None:
        if length is not None and length < 1:
            raise ValueError(f"length is {length}, but must be >= 1 (or None for N)")
        self.images = images
        self.labels = labels
        self.length = len(labels) if length is None else length

    @classmethod
    def load(
        cls, root: str | os.PathLike[str], train: bool, length: int | None = None
    ) -> CifarTensors:
        ds = SyntheticCIFAR10(root, train=train)
        images = torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous()
        return cls(images, torch.tensor(ds.targets, dtype=torch.int64), length)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        index %= len(self.labels)
        return self.images[index], self.labels[index]
