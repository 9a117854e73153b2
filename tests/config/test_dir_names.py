"""Experiment names as directory names: a config's free-text name is made safe; --name is checked."""

from __future__ import annotations

import os
import re

import pytest

from searchlab.config import MAX_DIR_NAME_LENGTH, check_dir_name, experiment_dir_name
from searchlab.errors import ConfigError


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("mnist pytorch const", "mnist_pytorch_const"),
        ("mnist_pytorch_adaptive_search", "mnist_pytorch_adaptive_search"),
        ("team/mnist", "team-mnist"),
        ("../../x", "x"),
        ("../x/../y", "x-..-y"),
        ("/etc/passwd", "etc-passwd"),
        ("C:\\runs\\a", "C_-runs-a"),
        (".hidden", "hidden"),
        ("-rf", "rf"),
        ("x.", "x"),
        (".", "experiment"),
        ("..", "experiment"),
        ("", "experiment"),
        ("   ", "experiment"),
        ("réseau über", "reseau_uber"),
        ("a:b*c?", "a_b_c_"),
        ("nul\x00byte", "nul_byte"),
    ],
)
def test_a_config_name_becomes_one_safe_directory_name(name: str, expected: str) -> None:
    assert experiment_dir_name(name) == expected


@pytest.mark.parametrize(
    "name", ["../../x", "/abs", "a/b/c", "..", ".", "", "x" * 500, "a\\b", "\u00e9" * 50]
)
def test_the_result_is_one_component_that_stays_below_its_parent(name: str) -> None:
    result = experiment_dir_name(name)

    assert result not in ("", ".", "..")
    assert os.sep not in result and "/" not in result and "\\" not in result
    assert len(result) <= MAX_DIR_NAME_LENGTH
    parent = os.path.abspath("storage")
    assert os.path.dirname(os.path.abspath(os.path.join(parent, result))) == parent
    assert check_dir_name(result) == result  # what it makes, --name accepts


def test_long_names_are_cut_but_stay_apart() -> None:
    a, b = experiment_dir_name("x" * 200 + "a"), experiment_dir_name("x" * 200 + "b")

    assert len(a) == len(b) == MAX_DIR_NAME_LENGTH
    assert a != b
    assert re.fullmatch(r"x+-[0-9a-f]{8}", a)


@pytest.mark.parametrize("name", ["mnist", "mnist-adaptive_v2", "run.3", "_tmp", "A1", "x" * 100])
def test_safe_names_are_unchanged(name: str) -> None:
    assert check_dir_name(name) == name
    assert experiment_dir_name(name) == name


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        ("../x", "x"),
        ("../../etc", "etc"),
        ("/tmp/abs", "tmp-abs"),
        ("a/b", "a-b"),
        ("..", "experiment"),
        (".", "experiment"),
        ("", "experiment"),
        (".hidden", "hidden"),
        ("-x", "x"),
        ("x.", "x"),
        ("my exp", "my_exp"),
        ("a\\b", "a-b"),
    ],
)
def test_an_unsafe_explicit_name_is_refused(name: str, suggestion: str) -> None:
    with pytest.raises(
        ConfigError,
        match=rf"^--name: {re.escape(repr(name))} is not a directory name: use letters, digits, "
        r"'\.', '_' and '-' only, not starting with '\.' or '-' nor ending with '\.', at most 100 "
        rf"characters \(e\.g\. --name {re.escape(suggestion)}\)$",
    ):
        check_dir_name(name)


def test_the_message_names_the_flag_it_was_given_as() -> None:
    with pytest.raises(ConfigError, match=r"^name=: '\.\./x' is not a directory name"):
        check_dir_name("../x", flag="name=")


def test_a_name_too_long_is_refused_and_shown_short() -> None:
    with pytest.raises(ConfigError, match=r"^--name: 'y{76}\.\.\. is not a directory name") as info:
        check_dir_name("y" * (MAX_DIR_NAME_LENGTH + 1))
    assert len(str(info.value)) < 400
