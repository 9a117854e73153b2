"""The examples' configs, and configs/: one file per searcher, none a drifting copy."""

from __future__ import annotations

import pathlib
import warnings

import pytest

from searchers import preview_plan
from searchlab.config import load_experiment_config

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ("mnist", "cifar10")
KINDS = ("const", "grid", "random", "adaptive", "distributed")
SEARCHERS = {
    "const": "single",
    "grid": "grid",
    "random": "random",
    "adaptive": "adaptive_asha",
    "distributed": "single",
}
ENTRYPOINTS = {"mnist": "model_def:MNistTrial", "cifar10": "model_def:CIFARTrial"}


@pytest.mark.parametrize("example", EXAMPLES)
@pytest.mark.parametrize("kind", KINDS)
def test_example_configs_load_without_warnings(example: str, kind: str) -> None:
    path = ROOT / "examples" / example / f"{kind}.yaml"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = load_experiment_config(path)
    assert cfg.name == f"{example}_{kind}"
    assert cfg.entrypoint == ENTRYPOINTS[example]
    assert str(cfg.searcher.name.value) == SEARCHERS[kind]
    # Real users download the data; `--config data.offline=true` is the offline flag.
    assert cfg.data["download"] is True and cfg.data["offline"] is False
    assert cfg.data["data_dir"].startswith("~/.cache/searchlab/")
    assert cfg.resources.slots_per_trial == (2 if kind == "distributed" else 1)
    assert preview_plan(cfg)["brackets"]


def test_the_adaptive_examples_have_three_rungs() -> None:
    for example, ends in (("mnist", [25, 100, 400]), ("cifar10", [50, 200, 800])):
        cfg = load_experiment_config(ROOT / "examples" / example / "adaptive.yaml")
        assert preview_plan(cfg)["brackets"][0]["rung_ends"] == ends


@pytest.mark.parametrize("kind", KINDS)
def test_configs_dir_holds_the_mnist_example_configs_themselves(kind: str) -> None:
    path = ROOT / "configs" / f"{kind}.yaml"
    target = ROOT / "examples" / "mnist" / f"{kind}.yaml"
    assert path.is_symlink() and path.resolve() == target.resolve()  # one file, no copy
    cfg = load_experiment_config(path, model_dir=str(ROOT / "examples" / "mnist"))
    assert cfg.name == f"mnist_{kind}"


def test_every_config_in_configs_dir_is_one_of_an_example() -> None:
    for path in (ROOT / "configs").iterdir():
        assert path.resolve().parent.parent == ROOT / "examples", path


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_readme_names_every_config_and_the_offline_flag(example: str) -> None:
    readme = (ROOT / "examples" / example / "README.md").read_text()
    for kind in KINDS:
        assert f"{kind}.yaml" in readme
    assert "--config data.offline=true" in readme
