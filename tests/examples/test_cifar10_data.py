"""The offline CIFAR-10 stand-in of examples/cifar10: CIFAR-10's own files, read by torchvision."""

from __future__ import annotations

import hashlib
import importlib.util
import pathlib
import pickle
import sys
from types import ModuleType

import numpy as np
import pytest
import torch
from torchvision import datasets

EXAMPLE_DIR = pathlib.Path(__file__).resolve().parents[2] / "examples" / "cifar10"
BATCH_FILES = [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "batches.meta"]


def _load_example_data_module() -> ModuleType:
    # The example imports it as plain `data`; a unique name avoids clashes in tests.
    spec = importlib.util.spec_from_file_location("cifar10_example_data", EXAMPLE_DIR / "data.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


data = _load_example_data_module()


@pytest.fixture(scope="module")
def offline_root(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return pathlib.Path(data.ensure_offline_cifar(tmp_path_factory.mktemp("cifar") / "offline"))


def _folder(root: pathlib.Path) -> pathlib.Path:
    return root / datasets.CIFAR10.base_folder


@pytest.mark.parametrize(("train", "size"), [(True, 2500), (False, 500)])
def test_torchvision_reads_the_generated_batches(
    offline_root: pathlib.Path, train: bool, size: int
) -> None:
    dataset = data.OfflineCIFAR10(str(offline_root), train=train)
    assert dataset.data.shape == (size, 32, 32, 3) and dataset.data.dtype == np.uint8
    assert len(dataset.targets) == size and set(dataset.targets) == set(range(10))
    assert dataset.classes == data.LABEL_NAMES
    image, label = dataset[0]
    assert image.size == (32, 32) and label == dataset.targets[0]  # a PIL image, as CIFAR-10's


def test_the_files_are_cifar10_python_batches(offline_root: pathlib.Path) -> None:
    # The recipe of the CIFAR-10 page: pickle.load(f, encoding="bytes") gives bytes keys.
    with open(_folder(offline_root) / "data_batch_1", "rb") as f:
        batch = pickle.load(f, encoding="bytes")
    assert sorted(batch) == [b"batch_label", b"data", b"filenames", b"labels"]
    assert batch[b"data"].shape == (500, 3072) and batch[b"data"].dtype == np.uint8
    assert batch[b"batch_label"] == b"training batch 1 of 5"
    with open(_folder(offline_root) / "batches.meta", "rb") as f:
        meta = pickle.load(f, encoding="latin1")
    assert meta["label_names"] == data.LABEL_NAMES and meta["num_vis"] == 3072
    assert meta[data.OFFLINE_META_KEY] is True and data.is_offline_cifar(offline_root)


def test_only_the_md5_check_is_relaxed(offline_root: pathlib.Path) -> None:
    with pytest.raises(RuntimeError, match="Dataset not found or corrupted"):
        datasets.CIFAR10(str(offline_root), train=True)  # generated files fail CIFAR-10's MD5s
    torchvision_view = data.OfflineCIFAR10(str(offline_root), train=False)
    with open(_folder(offline_root) / "test_batch", "rb") as f:
        raw = pickle.load(f, encoding="latin1")
    images = raw["data"].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    assert np.array_equal(torchvision_view.data, images)
    assert torchvision_view.targets == raw["labels"]


def test_generation_is_deterministic_and_written_once(tmp_path: pathlib.Path) -> None:
    def hashes(root: pathlib.Path) -> dict[str, str]:
        return {
            n: hashlib.sha256((_folder(root) / n).read_bytes()).hexdigest() for n in BATCH_FILES
        }

    first = pathlib.Path(data.ensure_offline_cifar(tmp_path / "a"))
    second = pathlib.Path(data.ensure_offline_cifar(tmp_path / "b"))
    assert hashes(first) == hashes(second)
    before = (_folder(first) / "test_batch").stat().st_mtime_ns
    data.ensure_offline_cifar(first)
    assert (_folder(first) / "test_batch").stat().st_mtime_ns == before
    assert not [p for p in first.iterdir() if p.name.startswith(".cifar-")]  # no staging left


def test_classes_are_learnable_but_not_trivial(offline_root: pathlib.Path) -> None:
    train = data.OfflineCIFAR10(str(offline_root), train=True)
    test = data.OfflineCIFAR10(str(offline_root), train=False)
    x = torch.tensor(train.data, dtype=torch.float32).flatten(1)
    means = torch.stack([x[torch.tensor(train.targets) == c].mean(0) for c in range(10)])
    distances = torch.cdist(torch.tensor(test.data, dtype=torch.float32).flatten(1), means)
    accuracy = (distances.argmin(1) == torch.tensor(test.targets)).float().mean().item()
    assert 0.15 < accuracy < 0.9  # better than chance (0.1), not solved by class means


def test_build_dataset_offline_normalizes_and_keeps_real_data_apart(tmp_path: pathlib.Path) -> None:
    dataset = data.build_dataset({"data_dir": str(tmp_path), "offline": True}, EXAMPLE_DIR, False)
    image, label = dataset[0]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32
    assert isinstance(label, int)
    assert pathlib.Path(dataset.root) == tmp_path / "offline"
    assert not _folder(tmp_path).exists()  # where torchvision downloads real CIFAR-10
    with pytest.raises(FileNotFoundError, match=r"CIFAR-10 is not in .*`download: false`"):
        data.build_dataset({"data_dir": str(tmp_path), "download": False}, EXAMPLE_DIR, True)


def test_a_failed_download_says_how_to_run_offline(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_network(self: object) -> None:
        raise RuntimeError("<urlopen error [Errno -3] Temporary failure in name resolution>")

    monkeypatch.setattr(datasets.CIFAR10, "download", no_network)
    with pytest.raises(RuntimeError, match=r"could not download CIFAR-10.*data\.offline=true"):
        data.build_dataset({"data_dir": str(tmp_path)}, EXAMPLE_DIR, True)
