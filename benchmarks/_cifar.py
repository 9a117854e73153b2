"""CIFAR-10-shaped synthetic data for the benchmarks (no download).

One copy of the code: it lives in ``benchmarks/resnet_model/cifar_data.py``, because Ray ships
that model directory to trial workers; this module puts the directory on ``sys.path`` and
re-exports it, so benchmark scripts write ``from _cifar import write_fake_cifar``.
The images are random (label-correlated): good for throughput, meaningless for accuracy.

Example:
    >>> from _cifar import SyntheticCIFAR10, write_fake_cifar
    >>> ds = SyntheticCIFAR10(write_fake_cifar("/tmp/fake-cifar", 1000, 200, seed=0))
"""

from __future__ import annotations

import pathlib
import sys

MODEL_DIR = pathlib.Path(__file__).resolve().parent / "resnet_model"
if str(MODEL_DIR) not in sys.path:
    sys.path.insert(0, str(MODEL_DIR))

from cifar_data import (  # noqa: E402
    LABEL_NAMES,
    SYNTHETIC_KEY,
    CifarTensors,
    SyntheticCIFAR10,
    ensure_fake_cifar,
    write_fake_cifar,
)

__all__ = [
    "LABEL_NAMES",
    "MODEL_DIR",
    "SYNTHETIC_KEY",
    "CifarTensors",
    "SyntheticCIFAR10",
    "ensure_fake_cifar",
    "write_fake_cifar",
]
