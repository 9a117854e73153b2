"""MNIST for the example: real MNIST (torchvision, downloaded) or an offline stand-in.

Determined's tutorial downloads MNIST with torchvision. Machines without internet (CI, this
repository's tests) train on a stand-in instead: scikit-learn's bundled handwritten digits
(1797 images of 8x8 pixels) scaled to MNIST's 28x28 and normalized like MNIST, 1500 for
training and 297 for validation. It is not MNIST, but it is real handwriting with the same
shapes, so the tutorial's model trains on it unchanged.

The experiment config's ``data.offline`` chooses (``--config data.offline=true``); run by
hand (``python3 train.py``), ``MNIST_OFFLINE=1`` does.
"""

import os
import pathlib
from typing import Any

import numpy as np
import torch
from torch.utils.data import TensorDataset

import searchlab as det

N_TRAIN = 1500
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


def get_dataset(data_dir: pathlib.Path, train: bool) -> Any:
    info = det.get_cluster_info()
    if info is not None:
        offline = bool(info.user_data.get("offline", False))
    else:
        offline = os.environ.get("MNIST_OFFLINE", "0") == "1"
    if offline:
        return offline_digits(train)
    return _mnist(data_dir, train)


def offline_digits(train: bool) -> TensorDataset:
    """scikit-learn's digits as 28x28 MNIST-like images (normalized), and their labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    rows = slice(0, N_TRAIN) if train else slice(N_TRAIN, None)
    images = digits.images[rows] / 16.0  # ink 0..1
    # 8x8 -> 24x24 (each pixel a 3x3 block), centred in 28x28 as MNIST centres its digits.
    images = np.kron(images, np.ones((3, 3)))
    images = np.pad(images, ((0, 0), (2, 2), (2, 2)))
    x = torch.tensor((images - MNIST_MEAN) / MNIST_STD, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(digits.target[rows], dtype=torch.long)
    return TensorDataset(x, y)


def _mnist(data_dir: pathlib.Path, train: bool) -> Any:
    """Determined's tutorial code: torchvision's MNIST, downloaded once per node."""
    import filelock
    from torchvision import datasets, transforms

    data_dir.mkdir(parents=True, exist_ok=True)

    # Use a file lock so that only one worker on each node downloads.
    with filelock.FileLock(str(data_dir / "lock")):
        return datasets.MNIST(
            root=str(data_dir),
            train=train,
            transform=transforms.Compose(
                [transforms.ToTensor(), transforms.Normalize((MNIST_MEAN,), (MNIST_STD,))]
            ),
            download=True,
        )
