"""``import_from_path``: import modules from a directory, then forget them (``det.import_from_path``)."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from types import ModuleType

__all__ = ["import_from_path"]

_lock = threading.Lock()


def _names_in(directory: str) -> set[str]:
    """The top-level module names that ``directory`` provides (files and packages)."""
    names: set[str] = set()
    try:
        entries = os.listdir(directory)
    except OSError:
        return names
    for entry in entries:
        if entry.endswith(".py"):
            names.add(entry[:-3])
        elif os.path.isfile(os.path.join(directory, entry, "__init__.py")):
            names.add(entry)
    return names


def _modules_from(directory: str) -> dict[str, ModuleType]:
    """The loaded modules whose file lies in ``directory`` (packages: their parent dir)."""
    found: dict[str, ModuleType] = {}
    for name, module in sorted(sys.modules.items()):
        origin = getattr(module, "__file__", None)
        if not origin:
            continue
        parent, base = os.path.split(os.path.abspath(origin))
        if base == "__init__.py":
            parent = os.path.dirname(parent)
        if parent == directory or name.partition(".")[0] in found:
            found[name] = module
    return found


@contextlib.contextmanager
def import_from_path(path: str | os.PathLike[str]) -> Iterator[None]:
    """Import from ``path`` first; afterwards the modules imported from it are forgotten.

    Loaded modules with the names of modules in ``path`` are set aside meanwhile and come
    back after, so an older ``model_def`` (from a checkpoint's code) and the current one can
    be imported side by side under different names. No ``__pycache__`` is written into
    ``path``. Not for nesting or for use from several threads at once.

    Example:
        >>> import model_def as new_model_def
        >>> with searchlab.import_from_path(checkpoint_dir / "code"):
        ...     import model_def as old_model_def
        >>> old_model_def is not new_model_def
        True
    """
    if not _lock.acquire(blocking=False):
        raise RuntimeError("import_from_path does not support nesting or calls from threads")
    directory = os.path.abspath(os.fspath(path))
    old_path, old_bytecode = list(sys.path), sys.dont_write_bytecode
    shadowed = _names_in(directory)  # e.g. a model_def imported from the current directory
    set_aside = {n: m for n, m in sys.modules.items() if n.partition(".")[0] in shadowed}
    for name in set_aside:
        del sys.modules[name]
    sys.path[:] = [directory, *old_path]
    sys.dont_write_bytecode = True
    try:
        yield
    finally:
        for name in _modules_from(directory):
            del sys.modules[name]
        sys.path[:] = old_path
        sys.dont_write_bytecode = old_bytecode
        sys.modules.update(set_aside)
        _lock.release()
