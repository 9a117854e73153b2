"""The note that trial workers would compile a package from source at every start."""

from __future__ import annotations

import compileall
import importlib
import pathlib
import sys

import pytest

from searchlab._bytecode import uncached_bytecode_hint


@pytest.fixture
def package(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """A package with no compiled bytecode, importable as ``slfakepkg``."""
    root = tmp_path / "site"
    (root / "slfakepkg").mkdir(parents=True)
    (root / "slfakepkg" / "__init__.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    importlib.invalidate_caches()
    return root


def test_no_bytecode_and_none_written_names_the_fix(
    package: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    hint = uncached_bytecode_hint("slfakepkg")
    assert hint is not None
    assert "slfakepkg has no compiled bytecode and PYTHONDONTWRITEBYTECODE is set" in hint
    assert f"python -m compileall -q -j 0 {package}" in hint
    assert "\n" not in hint


def test_compiled_bytecode_silences_it(
    package: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    assert compileall.compile_dir(str(package), quiet=1)  # what the hint tells users to run
    assert uncached_bytecode_hint("slfakepkg") is None


def test_bytecode_under_a_cache_prefix_counts(
    package: pathlib.Path, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path / "pyc"))
    assert uncached_bytecode_hint("slfakepkg") is not None
    assert compileall.compile_dir(str(package), quiet=1)  # writes under the prefix
    assert not (package / "slfakepkg" / "__pycache__").exists()
    assert uncached_bytecode_hint("slfakepkg") is None


def test_silent_where_the_first_import_writes_it(package: pathlib.Path) -> None:
    assert uncached_bytecode_hint("slfakepkg") is None


def test_read_only_install_is_named(package: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The folder its bytecode would go to cannot be written (as a root-owned install).
    monkeypatch.setattr("searchlab._bytecode.os.access", lambda path, mode: False)
    hint = uncached_bytecode_hint("slfakepkg")
    assert hint is not None
    assert f"{package / 'slfakepkg' / '__pycache__'} cannot be written" in hint


def test_missing_package_is_silent() -> None:
    assert uncached_bytecode_hint("slno_such_package_here") is None


def test_a_heavy_submodule_without_bytecode_is_noticed(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch imported once without the variable: its __init__ has bytecode, torch._dynamo
    # (imported lazily, the heaviest part) does not.
    root = tmp_path / "site"
    (root / "torch" / "_dynamo").mkdir(parents=True)
    (root / "torch" / "__init__.py").write_text("")
    (root / "torch" / "_dynamo" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setitem(sys.modules, "torch", None)  # find the fake, not the real one
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    importlib.invalidate_caches()
    assert compileall.compile_file(str(root / "torch" / "__init__.py"), quiet=1)

    hint = uncached_bytecode_hint("torch")

    assert hint is not None and "torch has no compiled bytecode" in hint
    assert compileall.compile_dir(str(root / "torch"), quiet=1)
    assert uncached_bytecode_hint("torch") is None


def test_an_odd_import_system_gets_no_note_and_no_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a finder that breaks")

    monkeypatch.setattr("searchlab._bytecode.importlib.util.find_spec", broken)
    assert uncached_bytecode_hint("slfakepkg") is None
