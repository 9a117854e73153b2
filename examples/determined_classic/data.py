"""MNIST for the example: Determined's download from `data.url`, or an offline stand-in.

Determined 0.26's tutorial downloads a tarball of MNIST from `data.url`. Machines without
internet train on a stand-in instead (`data.offline: true`, as this directory's configs ship):
scikit-learn's bundled handwritten digits (1797 images of 8x8 pixels) scaled to MNIST's 28x28
and normalized like MNIST, 1500 for training and 297 for validation. It is not MNIST, but it is
real handwriting with the same shapes, so the tutorial's model trains on it unchanged.
"""

import logging
import os
import pathlib
import shutil
import urllib.parse
import urllib.request
from typing import Any

import numpy as np
import torch
from torch.utils.data import TensorDataset

OFFLINE_MARKER = "OFFLINE_STAND_IN"  # in a download directory: use the stand-in
N_TRAIN = 1500
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


def get_dataset(data_dir: str, train: bool) -> Any:
    if (pathlib.Path(data_dir) / OFFLINE_MARKER).exists():
        return offline_digits(train)
    from torchvision import datasets, transforms

    return datasets.MNIST(
        data_dir,
        train=train,
        transform=transforms.Compose(
            [
                transforms.ToTensor(),
                # These are the precomputed mean and standard deviation of the
                # MNIST data; this normalizes the data to have zero mean and unit
                # standard deviation.
                transforms.Normalize((MNIST_MEAN,), (MNIST_STD,)),
            ]
        ),
    )


def download_dataset(download_directory: str, data_config: dict[str, Any]) -> str:
    if data_config.get("offline"):
        os.makedirs(download_directory, exist_ok=True)
        pathlib.Path(download_directory, OFFLINE_MARKER).touch()
        return download_directory

    url = data_config["url"]
    url_path = urllib.parse.urlparse(url).path
    basename = url_path.rsplit("/", 1)[1]

    download_directory = os.path.join(download_directory, "MNIST")
    os.makedirs(download_directory, exist_ok=True)
    filepath = os.path.join(download_directory, basename)
    if not os.path.exists(filepath):
        logging.info(f"Downloading {url} to {filepath}")
        with urllib.request.urlopen(url) as response, open(filepath, "wb") as f:
            shutil.copyfileobj(response, f)

    shutil.unpack_archive(filepath, download_directory)

    return os.path.dirname(download_directory)


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
