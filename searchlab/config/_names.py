"""Experiment names as directory names: one safe path component below the storage path.

A config's ``name`` is free text in Determined ("mnist pytorch const", "team/mnist"), so it is
turned into a directory name. A name given explicitly for the directory (``--name``) is used
as given, so it must already be one: it is refused, not rewritten, when it is not.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

from searchlab.errors import ConfigError

__all__ = ["MAX_DIR_NAME_LENGTH", "check_dir_name", "experiment_dir_name"]

MAX_DIR_NAME_LENGTH = 100
_FALLBACK = "experiment"
_SAFE = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9._-]*[A-Za-z0-9_-])?")
_SEPARATORS = re.compile(r"[/\\]+")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def experiment_dir_name(name: str) -> str:
    """One safe directory name for a config's ``name`` (free text).

    Path separators become ``-``, other characters outside letters, digits, ``.``, ``_`` and
    ``-`` become ``_`` (accents are dropped first: ``é`` -> ``e``); leading dots and dashes and
    trailing dots go; the result is never empty, ``.`` or ``..``, and at most
    :data:`MAX_DIR_NAME_LENGTH` characters (a long name keeps a hash of the whole, so two long
    names stay apart). A name :func:`check_dir_name` accepts comes back unchanged.

    Example:
        >>> experiment_dir_name("mnist pytorch const")
        'mnist_pytorch_const'
        >>> experiment_dir_name("../../etc/x")
        'etc-x'
    """
    text = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode("ascii")
    text = _SEPARATORS.sub("-", text.strip())
    text = _UNSAFE.sub("_", text)
    text = text.lstrip(".-").rstrip(".") or _FALLBACK
    if len(text) > MAX_DIR_NAME_LENGTH:
        digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:8]
        text = f"{text[: MAX_DIR_NAME_LENGTH - 9].rstrip('.')}-{digest}"
    return text


def check_dir_name(name: str, flag: str = "--name") -> str:
    """``name`` itself, if it is one safe directory name; refused otherwise.

    Args:
        name: The directory name given explicitly (``--name`` or ``searchlab.run(name=...)``).
        flag: How the caller calls it, for the message.

    Returns:
        ``name`` unchanged.

    Raises:
        ConfigError: ``--name: '../x' is not a directory name: ...``, with a safe suggestion.

    Example:
        >>> check_dir_name("mnist-adaptive")
        'mnist-adaptive'
    """
    if (
        isinstance(name, str)
        and len(name) <= MAX_DIR_NAME_LENGTH
        and _SAFE.fullmatch(name)
        and name not in (".", "..")
    ):
        return name
    suggestion = experiment_dir_name(name) if isinstance(name, str) else _FALLBACK
    shown = repr(name) if len(repr(name)) <= 80 else repr(name)[:77] + "..."
    raise ConfigError(
        f"{flag}: {shown} is not a directory name: use letters, digits, '.', '_' and '-' only, "
        f"not starting with '.' or '-' nor ending with '.', at most {MAX_DIR_NAME_LENGTH} characters "
        f"(e.g. {flag} {suggestion})"
    )
