"""CIFAR-10 for the example trial: torchvision's download, or a small offline stand-in.

`build_dataset` is what `model_def.py` calls: it reads the `data` section of the
experiment config and returns `torchvision.datasets.CIFAR10`, downloaded into `data_dir`
the first time (`download: true`, as the configs ship).

Machines without internet (CI, air-gapped clusters) pass `--config data.offline=true`:
then `ensure_offline_cifar` writes a small stand-in in CIFAR-10's own on-disk format
(`cifar-10-batches-py/` with the pickled `data_batch_1..5`, `test_batch` and
`batches.meta`) under `data_dir/offline/`, and torchvision's `CIFAR10` class reads it.
Only its MD5 check is skipped (`OfflineCIFAR10`): generated files cannot match CIFAR-10's
checksums. The stand-in is NOT CIFAR-10: 2500 training and 500 test images of ten
synthetic classes (a blocky colour pattern per class, shifted, brightened or darkened,
and noisy): learnable, so a search has something to find, but accuracies on it say
nothing about CIFAR-10.

Example:
    >>> config = {"data_dir": "/tmp/cifar", "offline": True}
    >>> train_set = build_dataset(config, pathlib.Path("examples/cifar10"), True)
    >>> image, label = train_set[0]  # a normalized (3, 32, 32) tensor and an int
"""

from __future__ import annotations

import os
import pathlib
import pickle
import shutil
import struct
import tempfile
from collections.abc import Mapping
from typing import Any

import filelock
import numpy as np
from torchvision import datasets, transforms
from torchvision.datasets.utils import check_integrity

# Per-channel mean and standard deviation of the real CIFAR-10 training images.
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)

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
OFFLINE_SUBDIR = "offline"  # the stand-in's root inside data_dir
OFFLINE_MARKER = "OFFLINE_STAND_IN.txt"  # beside the generated batches
OFFLINE_META_KEY = "searchlab_offline_stand_in"  # an extra key of the generated batches.meta
N_OFFLINE_TRAIN = 2500
N_OFFLINE_TEST = 500

_TRAIN_FILES = [f"data_batch_{i}" for i in range(1, 6)]
_TEST_FILE = "test_batch"
_META_FILE = "batches.meta"
_SIDE = 32
_PATTERN_SIDE = 4  # each class is a 4x4 colour pattern, upscaled to 32x32
# Low-contrast patterns, shifts, brightness changes and strong noise make the classes hard
# enough that the learning rate matters: with const.yaml's 1e-3 a trial reaches about 85%
# accuracy in 200 batches, with 1e-4 about 60%, and the first 50 batches already tell apart.
_PATTERN_RANGE = (100, 156)
_MAX_SHIFT = 4
_MAX_BRIGHTNESS = 30.0
_NOISE = 60.0


def resolve_data_dir(data_config: Mapping[str, Any], model_dir: pathlib.Path) -> pathlib.Path:
    """Returns `data_config["data_dir"]` (default `data`), relative to `model_dir`."""
    data_dir = pathlib.Path(str(data_config.get("data_dir", "data"))).expanduser()
    return data_dir if data_dir.is_absolute() else pathlib.Path(model_dir) / data_dir


def build_dataset(
    data_config: Mapping[str, Any], model_dir: pathlib.Path, train: bool
) -> datasets.CIFAR10:
    """Builds the CIFAR-10 training or test set that the `data` config section describes.

    Keys of `data_config`: `data_dir` (default `data`, relative to `model_dir`),
    `download` (default true: fetch CIFAR-10 when it is missing) and `offline` (default
    false: when true, never use the network and train on the stand-in in
    `data_dir/offline`). Training images are randomly cropped and flipped.

    Raises:
        FileNotFoundError: CIFAR-10 is missing and neither `download` nor `offline` is set.
        RuntimeError: the download failed (the message says how to run offline).
    """
    data_dir = resolve_data_dir(data_config, model_dir)
    offline = bool(data_config.get("offline", False))
    download = bool(data_config.get("download", True)) and not offline
    root = data_dir / OFFLINE_SUBDIR if offline else data_dir
    root.mkdir(parents=True, exist_ok=True)
    transform = _TRAIN_TRANSFORM if train else _TEST_TRANSFORM
    # Trials run side by side: one downloads or generates, the others wait for it.
    with filelock.FileLock(str(root / "cifar10.lock")):
        if offline:
            ensure_offline_cifar(root)
            return OfflineCIFAR10(str(root), train=train, transform=transform)
        if not download and not _has_batches(root):
            raise FileNotFoundError(
                f"CIFAR-10 is not in {root / datasets.CIFAR10.base_folder} and the data config "
                "has `download: false`. Set `data.download: true` to fetch it, or "
                "`data.offline: true` to generate a small stand-in without internet."
            )
        try:
            return datasets.CIFAR10(str(root), train=train, download=download, transform=transform)
        except (RuntimeError, OSError) as exc:
            if not download:
                raise
            raise RuntimeError(
                f"could not download CIFAR-10 into {root} ({exc}). Without internet, run with "
                "`--config data.offline=true` to train on a small generated stand-in."
            ) from exc


class OfflineCIFAR10(datasets.CIFAR10):
    """torchvision's `CIFAR10` reading the generated stand-in: only the MD5 checks are skipped.

    Loading, decoding and `__getitem__` (PIL images through `transform`) are torchvision's.

    Example:
        >>> ds = OfflineCIFAR10(str(ensure_offline_cifar("/tmp/c")), train=False)
        >>> len(ds), ds.data.shape
        (500, (500, 32, 32, 3))
    """

    meta = {**datasets.CIFAR10.meta, "md5": None}

    def _check_integrity(self) -> bool:
        folder = os.path.join(self.root, self.base_folder)
        names = [name for name, _ in self.train_list + self.test_list]
        return all(check_integrity(os.path.join(folder, name)) for name in names)


def ensure_offline_cifar(root: str | os.PathLike[str]) -> pathlib.Path:
    """Writes the stand-in to `root/cifar-10-batches-py/` unless it is there; returns `root`.

    The content is deterministic (seed 0). The batches are written into a temporary
    directory renamed into place, so a reader never sees half of them.
    """
    root = pathlib.Path(root)
    if _has_batches(root):
        return root
    root.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(dir=root, prefix=".cifar-"))
    try:
        write_offline_batches(staging)
        try:
            os.replace(staging, root / datasets.CIFAR10.base_folder)
        except OSError:
            if not _has_batches(root):  # else another process wrote the same files first
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return root


def is_offline_cifar(root: str | os.PathLike[str]) -> bool:
    """Whether `root/cifar-10-batches-py` holds the generated stand-in."""
    return (pathlib.Path(root) / datasets.CIFAR10.base_folder / OFFLINE_MARKER).exists()


def write_offline_batches(folder: pathlib.Path, seed: int = 0) -> None:
    """The stand-in's batch files in `folder`, pickled as CIFAR-10's Python 2 files are."""
    rng = np.random.default_rng(seed)
    shape = (len(LABEL_NAMES), 3, _PATTERN_SIDE, _PATTERN_SIDE)
    patterns = rng.integers(*_PATTERN_RANGE, size=shape)
    scale = _SIDE // _PATTERN_SIDE
    templates = np.kron(patterns, np.ones((1, 1, scale, scale))).astype(np.float64)
    (folder / OFFLINE_MARKER).write_text(_marker_text())
    data, labels = offline_images(N_OFFLINE_TRAIN, templates, rng)
    for i, rows in enumerate(np.array_split(np.arange(N_OFFLINE_TRAIN), len(_TRAIN_FILES))):
        batch = _batch(data[rows], [labels[j] for j in rows], f"training batch {i + 1} of 5")
        _dump(folder / _TRAIN_FILES[i], batch)
    data, labels = offline_images(N_OFFLINE_TEST, templates, rng)
    _dump(folder / _TEST_FILE, _batch(data, labels, "testing batch 1 of 1"))
    meta = {
        "num_cases_per_batch": N_OFFLINE_TRAIN // len(_TRAIN_FILES),
        "label_names": LABEL_NAMES,
        "num_vis": 3 * _SIDE * _SIDE,
        OFFLINE_META_KEY: True,
    }
    _dump(folder / _META_FILE, meta)


def offline_images(
    n: int, templates: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, list[int]]:
    """`n` rows of uint8 `(3072,)` pixels (channel-major, as CIFAR-10) and their labels."""
    labels = rng.integers(0, len(templates), size=n)
    shifts = rng.integers(-_MAX_SHIFT, _MAX_SHIFT + 1, size=(n, 2))
    images = np.empty((n, 3, _SIDE, _SIDE), dtype=np.float64)
    for i, (label, (dy, dx)) in enumerate(zip(labels, shifts)):
        images[i] = np.roll(templates[label], (int(dy), int(dx)), axis=(1, 2))
    images += rng.uniform(-_MAX_BRIGHTNESS, _MAX_BRIGHTNESS, size=(n, 1, 1, 1))
    images += rng.normal(0.0, _NOISE, size=images.shape)
    pixels = np.clip(np.rint(images), 0, 255).astype(np.uint8).reshape(n, -1)
    return pixels, [int(v) for v in labels]


def _batch(data: np.ndarray, labels: list[int], label: str) -> dict[str, Any]:
    return {
        "batch_label": label,
        "labels": labels,
        "data": data,
        "filenames": [f"offline_{i:05d}.png" for i in range(len(labels))],
    }


class _Py2Str(str):
    """A string pickled as Python 2's `str`, as in the real CIFAR-10 files."""


_PurePythonPickler: Any = pickle._Pickler  # type: ignore[attr-defined]  # has a dispatch table


class _Py2Pickler(_PurePythonPickler):
    """Writes `_Py2Str` with the BINSTRING opcodes of Python 2's `str`.

    torchvision loads them with `encoding="latin1"` as `str` keys (`"data"`); the recipe on
    the CIFAR-10 page (`encoding="bytes"`) gets `b"data"`: the two views the real files give.
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
        _Py2Pickler(f, protocol=2).dump(_py2(obj))


def _has_batches(root: pathlib.Path) -> bool:
    folder = root / datasets.CIFAR10.base_folder
    return all((folder / n).is_file() for n in [*_TRAIN_FILES, _TEST_FILE, _META_FILE])


def _marker_text() -> str:
    return (
        "The batch files in this directory are NOT CIFAR-10. They were generated by\n"
        "examples/cifar10/data.py (ensure_offline_cifar): ten synthetic classes, each a\n"
        f"blocky colour pattern, shifted by up to {_MAX_SHIFT} pixels and noisy; "
        f"{N_OFFLINE_TRAIN} training and {N_OFFLINE_TEST} test images.\n"
        "Real CIFAR-10 is downloaded into the data directory above this one.\n"
    )


_NORMALIZE = transforms.Normalize(CIFAR_MEAN, CIFAR_STD)
_TRAIN_TRANSFORM = transforms.Compose(
    [
        transforms.RandomCrop(_SIDE, padding=4),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        _NORMALIZE,
    ]
)
_TEST_TRANSFORM = transforms.Compose([transforms.ToTensor(), _NORMALIZE])
