"""MNIST for the example trial: torchvision's download, or a small offline stand-in.

`build_dataset` is what `model_def.py` calls: it reads the `data` section of the
experiment config and returns `torchvision.datasets.MNIST`, downloaded into `data_dir`
the first time (`download: true`, as the configs ship).

Machines without internet (CI, air-gapped clusters) pass `--config data.offline=true`:
then `ensure_offline_mnist` writes a small stand-in made from scikit-learn's bundled
digits (1797 real handwritten digits, 8x8 pixels, upscaled to 28x28) in MNIST's own IDX
file format under `data_dir/offline/`, and the same `torchvision.datasets.MNIST` class reads
it unchanged. It is not MNIST: 1500 training and 297 test images instead of 60000 and
10000. Real and generated files never share a directory.

Example:
    >>> config = {"data_dir": "data", "offline": True}
    >>> train_set = build_dataset(config, pathlib.Path("examples/mnist"), True)
    >>> image, label = train_set[0]  # a normalized (1, 28, 28) tensor and an int
"""

from __future__ import annotations

import os
import pathlib
import struct
import tempfile
from collections.abc import Mapping
from typing import Any

import filelock
import numpy as np
from torchvision import datasets, transforms

# Mean and standard deviation of the real MNIST training pixels (after ToTensor).
MNIST_MEAN = 0.1307
MNIST_STD = 0.3081

RAW_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
# Written next to the generated files so they are never mistaken for real MNIST.
OFFLINE_MARKER = "OFFLINE_DIGITS.txt"
OFFLINE_SUBDIR = "offline"  # the stand-in's root inside data_dir
N_OFFLINE_TRAIN = 1500

_IMAGE_SIDE = 28
_DIGIT_SIDE = 20  # MNIST centres each digit in a 20x20 box inside the 28x28 frame.
_DIGITS_MAX = 16.0  # each digits pixel counts the ink pixels of a 4x4 block: 0..16
_IDX_UBYTE_1D = 0x00000801
_IDX_UBYTE_3D = 0x00000803


def resolve_data_dir(data_config: Mapping[str, Any], model_dir: pathlib.Path) -> pathlib.Path:
    """Returns `data_config["data_dir"]` (default `data`), relative to `model_dir`."""
    data_dir = pathlib.Path(str(data_config.get("data_dir", "data"))).expanduser()
    return data_dir if data_dir.is_absolute() else pathlib.Path(model_dir) / data_dir


def build_dataset(
    data_config: Mapping[str, Any], model_dir: pathlib.Path, train: bool
) -> datasets.MNIST:
    """Builds the MNIST training or test set that the `data` config section describes.

    Keys of `data_config`: `data_dir` (default `data`, relative to `model_dir`),
    `download` (default true: fetch real MNIST when it is missing) and `offline`
    (default false: when true, never use the network and train on the digits stand-in
    in `data_dir/offline`).

    Raises:
        FileNotFoundError: MNIST is missing and neither `download` nor `offline` is set.
        RuntimeError: the download failed (the message says how to run offline).
    """
    data_dir = resolve_data_dir(data_config, model_dir)
    offline = bool(data_config.get("offline", False))
    download = bool(data_config.get("download", True)) and not offline
    root = data_dir / OFFLINE_SUBDIR if offline else data_dir
    root.mkdir(parents=True, exist_ok=True)
    # Trials run side by side: one downloads or generates, the others wait for it.
    with filelock.FileLock(str(root / "mnist.lock")):
        if offline:
            ensure_offline_mnist(root)
        elif not download and not _has_raw_files(root):
            raise FileNotFoundError(
                f"MNIST is not in {_raw_dir(root)} and the data config has "
                "`download: false`. Set `data.download: true` to fetch it, or "
                "`data.offline: true` to generate a small stand-in from scikit-learn's "
                "digits without internet."
            )
        try:
            return datasets.MNIST(
                root=str(root), train=train, download=download, transform=_TRANSFORM
            )
        except (RuntimeError, OSError) as exc:
            if not download:
                raise
            raise RuntimeError(
                f"could not download MNIST into {_raw_dir(root)} ({exc}). Without internet, "
                "run with `--config data.offline=true` to train on a small stand-in "
                "generated from scikit-learn's digits, or copy MNIST's files there."
            ) from exc


_TRANSFORM = transforms.Compose(
    [transforms.ToTensor(), transforms.Normalize((MNIST_MEAN,), (MNIST_STD,))]
)


def ensure_offline_mnist(root: str | os.PathLike[str]) -> pathlib.Path:
    """Writes the digits stand-in to `root/MNIST/raw/` unless MNIST files are there.

    `build_dataset` passes `data_dir/offline` as `root`, so the stand-in never lands
    beside (or is read as) a real MNIST download.

    The files are uncompressed big-endian IDX, exactly what
    `torchvision.datasets.MNIST(root, train=..., download=False)` reads. Train is
    digits 0..1499 of `sklearn.datasets.load_digits()`, test is digits 1500..1796.
    The content is deterministic; existing files (generated or real MNIST) are kept.

    Returns:
        The `MNIST/raw` directory.
    """
    raw_dir = _raw_dir(pathlib.Path(root))
    if _has_raw_files(pathlib.Path(root)):
        return raw_dir
    raw_dir.mkdir(parents=True, exist_ok=True)
    # The marker goes first, so no generated file is ever without one beside it.
    _write_atomically(raw_dir / OFFLINE_MARKER, _marker_text().encode())
    images, labels = offline_digits()
    splits = {"train": slice(0, N_OFFLINE_TRAIN), "t10k": slice(N_OFFLINE_TRAIN, None)}
    for prefix, rows in splits.items():
        _write_atomically(raw_dir / f"{prefix}-images-idx3-ubyte", _idx_bytes(images[rows]))
        _write_atomically(raw_dir / f"{prefix}-labels-idx1-ubyte", _idx_bytes(labels[rows]))
    return raw_dir


def is_offline_mnist(root: str | os.PathLike[str]) -> bool:
    """Whether `root/MNIST/raw` holds the generated stand-in rather than real MNIST."""
    return (_raw_dir(pathlib.Path(root)) / OFFLINE_MARKER).exists()


def offline_digits() -> tuple[np.ndarray, np.ndarray]:
    """Returns all 1797 scikit-learn digits as (N, 28, 28) uint8 images, and labels."""
    from sklearn.datasets import load_digits  # only the offline path needs scikit-learn

    digits = load_digits()
    return upscale_digits(digits.images), digits.target.astype(np.uint8)


def upscale_digits(images: np.ndarray) -> np.ndarray:
    """Turns (N, 8, 8) images of values 0..16 into MNIST-like (N, 28, 28) uint8 images.

    Bilinear interpolation (pixel centres aligned, as `torch.nn.functional.interpolate`
    with `align_corners=False`) to 20x20, scaled to 0..255, then a 4-pixel black border.
    """
    side = images.shape[-1]
    weights = _bilinear_weights(side, _DIGIT_SIDE)
    digits = weights @ images.astype(np.float64) @ weights.T
    digits = np.clip(np.rint(digits * (255.0 / _DIGITS_MAX)), 0, 255).astype(np.uint8)
    border = (_IMAGE_SIDE - _DIGIT_SIDE) // 2
    return np.pad(digits, ((0, 0), (border, border), (border, border)))


def _bilinear_weights(size_in: int, size_out: int) -> np.ndarray:
    """The (size_out, size_in) matrix of 1-D linear interpolation of pixel centres."""
    weights = np.zeros((size_out, size_in))
    for out in range(size_out):
        src = min(max((out + 0.5) * size_in / size_out - 0.5, 0.0), size_in - 1.0)
        low = int(src)
        high = min(low + 1, size_in - 1)
        weights[out, low] += 1.0 - (src - low)
        weights[out, high] += src - low
    return weights


def _idx_bytes(array: np.ndarray) -> bytes:
    """Encodes a uint8 array of 1 or 3 dimensions in the IDX format of MNIST's files."""
    magic = {1: _IDX_UBYTE_1D, 3: _IDX_UBYTE_3D}[array.ndim]
    header = struct.pack(f">{1 + array.ndim}i", magic, *array.shape)
    return header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()


def _write_atomically(path: pathlib.Path, content: bytes) -> None:
    # Other trials, and a rerun after a crash, never see a partially written file.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; data files are world-readable
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _marker_text() -> str:
    return (
        "The IDX files in this directory are NOT MNIST. They were generated by\n"
        "examples/mnist/data.py (ensure_offline_mnist) from scikit-learn's\n"
        f"digits: images 0..{N_OFFLINE_TRAIN - 1} of sklearn.datasets.load_digits()\n"
        "for training, the rest for test, upscaled from 8x8 to 28x28.\n"
        "Real MNIST is downloaded into the data directory above this one.\n"
    )


def _raw_dir(root: pathlib.Path) -> pathlib.Path:
    return root / "MNIST" / "raw"


def _has_raw_files(root: pathlib.Path) -> bool:
    return all((_raw_dir(root) / name).exists() for name in RAW_FILES)
