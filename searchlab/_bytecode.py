"""Whether trial workers on this machine will compile torch from source at every start.

Python caches a module's compiled bytecode next to its source (or under
``PYTHONPYCACHEPREFIX``). pip compiles a package's bytecode when it installs it; uv does not
unless asked (``--compile-bytecode``), and then the first import writes it. With
``PYTHONDONTWRITEBYTECODE`` set (common in container images), or a read-only install, nothing
is ever written, and every new process compiles torch, ``torch._dynamo`` and sympy from
source: on an H100 host this made each trial worker's start 7-9 s longer
(``benchmarks/README.md``). Each new Ray worker pays it, so searchlab says so once, with the
fix, when it starts Ray on this machine.
"""

from __future__ import annotations

import importlib.util
import os

__all__ = ["uncached_bytecode_hint"]

# Besides the package's own ``__init__``, modules it imports lazily that weigh the most: a
# torch imported once without the variable has bytecode for ``__init__`` but not for these.
_HEAVY_PARTS = {"torch": ("_dynamo/__init__.py",)}


def uncached_bytecode_hint(package: str = "torch") -> str | None:
    """One line saying how to stop every worker compiling ``package`` from source, or None
    where its bytecode is cached or will be on its first import (or it is not installed).
    Never raises: it is advice."""
    try:
        return _hint(package)
    except Exception:  # an odd import system or interpreter: say nothing
        return None


def _hint(package: str) -> str | None:
    try:
        spec = importlib.util.find_spec(package)  # finds the package without importing it
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    root = os.path.dirname(spec.origin)
    sources = [spec.origin]
    sources += [os.path.join(root, part) for part in _HEAVY_PARTS.get(package, ())]
    # cache_from_source honours PYTHONPYCACHEPREFIX
    missing = [
        cached
        for source in sources
        if os.path.exists(source)
        and not os.path.exists(cached := importlib.util.cache_from_source(source))
    ]
    if not missing:
        return None
    folder = os.path.dirname(missing[0])
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):  # what Ray's workers inherit (not ``-B``)
        why = "PYTHONDONTWRITEBYTECODE is set"
    elif not _writable(folder):
        why = f"{folder} cannot be written"
    else:
        return None  # the first import writes it
    site = os.path.dirname(root)
    return (
        f"{package} has no compiled bytecode and {why}, so every trial worker compiles "
        f"{package} from source (seconds per worker start); compile it once with "
        f"`python -m compileall -q -j 0 {site}` (where that folder is read-only, first set "
        "PYTHONPYCACHEPREFIX to a writable one in the shell that runs searchlab, so its "
        "workers read it too), or install with `uv pip install --compile-bytecode`"
    )


def _writable(directory: str) -> bool:
    """Whether ``directory`` (or, where it does not exist yet, its parent) can be written."""
    while directory and not os.path.exists(directory):
        parent = os.path.dirname(directory)
        if parent == directory:
            return False
        directory = parent
    return os.access(directory, os.W_OK)
