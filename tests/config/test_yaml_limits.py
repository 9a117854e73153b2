"""Limits on what a config file may make the loader build: file size, alias bombs, nesting.

Each hostile input must be refused quickly, with one line naming the file and where.
"""

from __future__ import annotations

import pytest

from searchlab.config import MAX_CONFIG_BYTES, MAX_NESTING, load_experiment_config
from searchlab.errors import ConfigError

HEAD = """\
name: limits
entrypoint: model_def:Trial
searcher: {name: single, metric: loss, max_length: 10}
"""


def _laughs(levels: int, width: int = 9) -> str:
    """A "billion laughs" document below hyperparameters: level k repeats level k-1 ``width`` times."""
    lines = ["hyperparameters:", f"  l0: &l0 [{', '.join(['lol'] * width)}]"]
    for level in range(1, levels):
        refs = ", ".join([f"*l{level - 1}"] * width)
        lines.append(f"  l{level}: &l{level} [{refs}]")
    return HEAD + "\n".join(lines) + "\n"


def _write(tmp_path, text: str, name: str = "bomb.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.timeout(20)
def test_billion_laughs_in_a_constant_hyperparameter_is_refused(tmp_path) -> None:
    path = _write(tmp_path, _laughs(levels=10))  # 9**10 ~ 3.5e9 values once expanded

    with pytest.raises(
        ConfigError,
        match=r"^bomb\.yaml: hyperparameters\.l9: aliases expand too far: the config would hold "
        r"[\d,]+ values once each is written out in full, more than the limit of 1,000,000 "
        r"\(at &l6, line 11\); repeat large values less often$",
    ):
        load_experiment_config(path)


@pytest.mark.timeout(20)
def test_a_bomb_of_ninety_levels_is_refused_without_counting_every_value(tmp_path) -> None:
    # 2**90 values: the count must be made per distinct node, not per expanded value.
    path = _write(tmp_path, _laughs(levels=90, width=2))

    with pytest.raises(ConfigError, match=r"^bomb\.yaml: hyperparameters\.l89: aliases expand"):
        load_experiment_config(path)


@pytest.mark.timeout(20)
def test_merge_key_bomb_is_refused_before_the_merges_are_built(tmp_path) -> None:
    lines = ["data:", "  m0: &m0 {" + ", ".join(f"k{i}: {i}" for i in range(10)) + "}"]
    for level in range(1, 8):
        refs = ", ".join([f"*m{level - 1}"] * 10)
        lines.append(f"  m{level}: &m{level} {{<<: [{refs}]}}")
    path = _write(tmp_path, HEAD + "\n".join(lines) + "\n")

    with pytest.raises(ConfigError, match=r"^bomb\.yaml: data\.m7\.<<: aliases expand too far"):
        load_experiment_config(path)


def test_just_under_the_limit_loads(tmp_path) -> None:
    # 10 levels of width 3: about 88,000 values, far below the limit but built from aliases.
    cfg = load_experiment_config(_write(tmp_path, _laughs(levels=10, width=3)))

    assert len(cfg.hyperparameters["l9"]) == 3
    assert cfg.hyperparameters["l9"][0][0][0][0][0][0][0][0][0][0] == "lol"


def test_anchors_and_merge_keys_keep_working(tmp_path) -> None:
    text = """\
name: merged
entrypoint: model_def:Trial
hyperparameters:
  optimizer: &opt {lr: 0.1, momentum: 0.9}
  other_optimizer:
    <<: *opt
    lr: 0.2
searcher: &searcher
  name: single
  metric: loss
  max_length: {batches: 10}
"""
    cfg = load_experiment_config(_write(tmp_path, text, "ok.yaml"))

    assert cfg.hyperparameters["other_optimizer"] == {"lr": 0.2, "momentum": 0.9}
    assert cfg.hyperparameters["optimizer"] == {"lr": 0.1, "momentum": 0.9}
    assert cfg.searcher.max_length.value == 10


def test_a_value_that_contains_itself_is_refused(tmp_path) -> None:
    path = _write(tmp_path, HEAD + "data: &x {self: *x}\n", "cycle.yaml")

    with pytest.raises(
        ConfigError, match=r"^cycle\.yaml: <root>: a value contains itself \(at &x, line 4\)"
    ):
        load_experiment_config(path)


@pytest.mark.timeout(20)
def test_a_file_over_one_mib_is_refused_with_its_size(tmp_path) -> None:
    padding = "#" * 100 + "\n"
    path = _write(tmp_path, HEAD + padding * (MAX_CONFIG_BYTES // len(padding) + 10), "big.yaml")
    size = path.stat().st_size

    with pytest.raises(
        ConfigError,
        match=rf"^big\.yaml: <root>: the file is 1\.0 MiB \({size:,} bytes\); a config may be at "
        r"most 1 MiB; keep large data in files the trial reads",
    ):
        load_experiment_config(path)


def test_a_file_at_the_limit_loads(tmp_path) -> None:
    padding = "#" * 99 + "\n"
    text = HEAD + padding * ((MAX_CONFIG_BYTES - len(HEAD)) // len(padding))
    path = _write(tmp_path, text, "full.yaml")
    assert path.stat().st_size <= MAX_CONFIG_BYTES

    assert load_experiment_config(path).name == "limits"


@pytest.mark.timeout(20)
def test_nesting_deeper_than_the_limit_is_refused(tmp_path) -> None:
    depth = MAX_NESTING + 20
    path = _write(
        tmp_path, HEAD + "data:\n  deep: " + "[" * depth + "]" * depth + "\n", "deep.yaml"
    )

    with pytest.raises(
        ConfigError,
        match=rf"^deep\.yaml: data\.deep: nested {depth + 2} levels deep, more than the limit of "
        rf"{MAX_NESTING} \(at line 5\); flatten the structure$",
    ):
        load_experiment_config(path)


@pytest.mark.timeout(20)
def test_nesting_too_deep_for_the_parser_is_one_line(tmp_path) -> None:
    path = _write(tmp_path, HEAD + "data: " + "[" * 5000 + "]" * 5000 + "\n", "deep.yaml")

    with pytest.raises(ConfigError, match=r"^deep\.yaml: <yaml>: nested too deeply to read"):
        load_experiment_config(path)


def test_a_file_that_is_not_utf8_is_one_line(tmp_path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(HEAD.encode() + b"description: caf\xe9\n")

    with pytest.raises(
        ConfigError,
        match=r"^latin1\.yaml: <root>: not UTF-8 text \(byte \d+\); save the file as UTF-8$",
    ):
        load_experiment_config(path)


@pytest.mark.timeout(20)
def test_an_override_value_is_held_to_the_same_limits(tmp_path) -> None:
    path = _write(tmp_path, HEAD, "ok.yaml")
    levels = ["l0: &a0 [" + ", ".join(["lol"] * 9) + "]"]
    for level in range(1, 9):
        levels.append(f"l{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 9) + "]")
    value = "{" + ", ".join(levels) + "}"

    with pytest.raises(
        ConfigError, match=r"^ok\.yaml: data: override value: l8: aliases expand too far"
    ):
        load_experiment_config(path, [f"data={value}"])


@pytest.mark.timeout(20)
def test_a_dict_config_with_shared_values_is_held_to_the_limit() -> None:
    payload: list[object] = ["lol"] * 10
    for _ in range(8):
        payload = [payload] * 10  # one list object, referenced ten times at each level
    raw = {
        "entrypoint": "model_def:Trial",
        "hyperparameters": {"payload": payload},
        "searcher": {"name": "single", "metric": "loss", "max_length": 10},
    }

    with pytest.raises(
        ConfigError,
        match=r"^<dict>: hyperparameters\.payload: shared values expand too far: the config would "
        r"hold 1,111,111,1\d\d values",
    ):
        load_experiment_config(raw)


def test_a_dict_config_that_contains_itself_is_refused() -> None:
    data: dict[str, object] = {}
    data["self"] = data
    raw = {"entrypoint": "m:T", "data": data, "searcher": {"name": "single", "metric": "l"}}

    with pytest.raises(ConfigError, match=r"^<dict>: <root>: a value contains itself"):
        load_experiment_config(raw)
