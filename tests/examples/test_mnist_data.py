"""The offline MNIST stand-in of examples/mnist loads through torchvision."""

from __future__ import annotations

import hashlib
import importlib.util
import pathlib
import sys
from types import ModuleType

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from torchvision import datasets

EXAMPLE_DIR = pathlib.Path(__file__).resolve().parents[2] / "examples" / "mnist"
N_DIGITS = 1797


def _load_example_data_module() -> ModuleType:
    # The example imports it as plain `data`; a unique name avoids clashes in tests.
    spec = importlib.util.spec_from_file_location("mnist_example_data", EXAMPLE_DIR / "data.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


data = _load_example_data_module()


def _file_hashes(root: pathlib.Path) -> dict[str, str]:
    raw = root / "MNIST" / "raw"
    return {name: hashlib.sha256((raw / name).read_bytes()).hexdigest() for name in data.RAW_FILES}


@pytest.fixture(scope="module")
def offline_root(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("offline-mnist") / data.OFFLINE_SUBDIR
    data.ensure_offline_mnist(root)
    return root


@pytest.mark.parametrize(("train", "size"), [(True, 1500), (False, N_DIGITS - 1500)])
def test_torchvision_mnist_reads_generated_files(
    offline_root: pathlib.Path, train: bool, size: int
) -> None:
    mnist = datasets.MNIST(str(offline_root), train=train, download=False)
    assert mnist.data.shape == (size, 28, 28)
    assert mnist.data.dtype == torch.uint8
    assert mnist.targets.shape == (size,)
    assert mnist.targets.dtype == torch.int64
    assert set(mnist.targets.tolist()) == set(range(10))
    assert int(mnist.data.max()) == 255
    # MNIST's layout: the digit fills the central 20x20 box; the 4-pixel border is 0.
    assert int(mnist.data[:, :4].max()) == 0
    assert int(mnist.data[:, :, -4:].max()) == 0


@pytest.mark.parametrize(("train", "rows"), [(True, slice(0, 1500)), (False, slice(1500, None))])
def test_images_and_labels_are_upscaled_sklearn_digits(
    offline_root: pathlib.Path, train: bool, rows: slice
) -> None:
    digits = load_digits()
    mnist = datasets.MNIST(str(offline_root), train=train, download=False)
    assert mnist.targets.tolist() == digits.target[rows].tolist()
    # An independent bilinear upscale (torch's, in float32) agrees up to rounding.
    expected = torch.nn.functional.interpolate(
        torch.tensor(digits.images[rows], dtype=torch.float32)[:, None],
        size=(20, 20),
        mode="bilinear",
        align_corners=False,
    )[:, 0]
    expected = (expected * 255 / 16).round().clamp(0, 255)
    assert (mnist.data[:, 4:24, 4:24].float() - expected).abs().max() <= 1


def test_dataset_items_are_normalized_tensors(offline_root: pathlib.Path) -> None:
    dataset = data.build_dataset(
        {"data_dir": str(offline_root.parent), "offline": True, "download": False},
        EXAMPLE_DIR,
        train=False,
    )
    image, label = dataset[0]
    assert image.shape == (1, 28, 28)
    assert image.dtype == torch.float32
    assert image.min() == pytest.approx(-data.MNIST_MEAN / data.MNIST_STD)
    assert label == load_digits().target[1500]


def test_generation_is_deterministic(tmp_path: pathlib.Path) -> None:
    data.ensure_offline_mnist(tmp_path / "first")
    data.ensure_offline_mnist(tmp_path / "second")
    assert _file_hashes(tmp_path / "first") == _file_hashes(tmp_path / "second")


def test_train_and_test_images_are_disjoint(offline_root: pathlib.Path) -> None:
    train = datasets.MNIST(str(offline_root), train=True, download=False).data.numpy()
    test = datasets.MNIST(str(offline_root), train=False, download=False).data.numpy()
    train_images = {image.tobytes() for image in train}
    assert len(train_images) == len(train)
    assert not train_images & {image.tobytes() for image in test}


def test_existing_files_are_kept(tmp_path: pathlib.Path) -> None:
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in data.RAW_FILES:
        (raw / name).write_bytes(b"real MNIST")
    data.ensure_offline_mnist(tmp_path)
    assert all((raw / name).read_bytes() == b"real MNIST" for name in data.RAW_FILES)
    assert not data.is_offline_mnist(tmp_path)


def test_second_generation_does_not_rewrite(offline_root: pathlib.Path) -> None:
    raw = offline_root / "MNIST" / "raw"
    before = {name: (raw / name).stat().st_mtime_ns for name in data.RAW_FILES}
    data.ensure_offline_mnist(offline_root)
    assert {name: (raw / name).stat().st_mtime_ns for name in data.RAW_FILES} == before
    assert sorted(path.name for path in raw.iterdir()) == sorted(
        [*data.RAW_FILES, data.OFFLINE_MARKER]
    )


def test_relative_data_dir_starts_at_model_dir(tmp_path: pathlib.Path) -> None:
    dataset = data.build_dataset({"data_dir": "data", "offline": True}, tmp_path, train=True)
    assert pathlib.Path(dataset.root) == tmp_path / "data" / "offline"
    assert data.is_offline_mnist(tmp_path / "data" / "offline")


def test_stand_in_and_real_mnist_never_share_a_directory(tmp_path: pathlib.Path) -> None:
    data.build_dataset({"data_dir": str(tmp_path), "offline": True}, EXAMPLE_DIR, True)
    assert not (tmp_path / "MNIST").exists()  # where torchvision downloads real MNIST
    with pytest.raises(FileNotFoundError, match=r"MNIST is not in .*`download: false`"):
        data.build_dataset({"data_dir": str(tmp_path), "download": False}, EXAMPLE_DIR, True)


def test_a_failed_download_says_how_to_run_offline(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_network(*args: object, **kwargs: object) -> None:
        raise RuntimeError("Error downloading train-images-idx3-ubyte.gz")

    monkeypatch.setattr(datasets.MNIST, "download", no_network)
    with pytest.raises(RuntimeError, match=r"could not download MNIST.*data\.offline=true"):
        data.build_dataset({"data_dir": str(tmp_path)}, EXAMPLE_DIR, True)


def test_missing_mnist_without_download_says_how_to_fix(tmp_path: pathlib.Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"`download: false`.*`data\.offline: true`"):
        data.build_dataset({"data_dir": str(tmp_path), "download": False}, EXAMPLE_DIR, True)


def test_upscale_maps_full_ink_to_255_and_blank_to_0() -> None:
    images = np.stack([np.full((8, 8), 16.0), np.zeros((8, 8))])
    upscaled = data.upscale_digits(images)
    assert upscaled.dtype == np.uint8
    assert upscaled[0, 4:24, 4:24].min() == 255
    assert upscaled[1].max() == 0
