"""Reading config YAML safely: YAML 1.2 floats, no duplicate keys, and limits on size.

A config file may be at most :data:`MAX_CONFIG_BYTES`; its document, counted as if every alias
(``*name``) and merge key (``<<: *name``) were expanded, at most :data:`MAX_EXPANDED_VALUES`
values and :data:`MAX_NESTING` levels. The count is taken on the composed YAML nodes, where an
alias is the anchored node itself, so it costs one visit per distinct node: a "billion laughs"
file is refused in milliseconds, before anything is constructed.
"""

from __future__ import annotations

import os
import re
import stat
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import yaml

from searchlab.errors import ConfigError

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_EXPANDED_VALUES",
    "MAX_NESTING",
    "check_expanded_size",
    "parse_yaml",
    "read_config_text",
]

MAX_CONFIG_BYTES = 1 << 20
MAX_EXPANDED_VALUES = 1_000_000
MAX_NESTING = 100

_FLOAT_TAG = "tag:yaml.org,2002:float"
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _YamlLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 floats (``1e-4`` is a number, as in Determined) and no duplicate keys."""

    anchors: dict[Any, yaml.Node]
    anchor_names: dict[int, str]

    def compose_document(self) -> yaml.Node | None:
        # The composer forgets its anchors at the end of a document; keep their names for messages.
        self.get_event()
        node = self.compose_node(None, None)  # type: ignore[arg-type]
        self.get_event()
        self.anchor_names = {id(anchored): name for name, anchored in self.anchors.items()}
        self.anchors = {}
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, typing.Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}; keep only one", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_YamlLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _FLOAT_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_YamlLoader.add_implicit_resolver(
    _FLOAT_TAG,
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


# --- expanded size ------------------------------------------------------------------------


class _Cycle(Exception):
    def __init__(self, node: object) -> None:
        super().__init__()
        self.node = node


@dataclass(frozen=True)
class _Sizes:
    """Per distinct node (by id): values in its expansion and levels below it."""

    values: dict[int, int]
    depth: dict[int, int]


def _measure(root: object, children: Callable[[Any], Iterable[Any]]) -> _Sizes:
    """Expanded sizes of every node under ``root``, each node visited once (no recursion)."""
    values: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, closing = stack.pop()
        key = id(node)
        if closing:
            open_nodes.discard(key)
            kids = list(children(node))
            values[key] = 1 + sum(values[id(kid)] for kid in kids)
            depth[key] = 1 + max((depth[id(kid)] for kid in kids), default=0)
        elif key not in values:
            if key in open_nodes:  # reached again below itself
                raise _Cycle(node)
            open_nodes.add(key)
            stack.append((node, True))
            stack.extend((kid, False) for kid in children(node) if id(kid) not in values)
    return _Sizes(values, depth)


def _node_children(node: yaml.Node) -> Iterable[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return ()


def _node_items(node: yaml.Node) -> Iterable[tuple[str | int, yaml.Node]]:
    if isinstance(node, yaml.MappingNode):
        return [
            (str(key.value) if key.tag != _MERGE_TAG else "<<", value) for key, value in node.value
        ]
    if isinstance(node, yaml.SequenceNode):
        return list(enumerate(node.value))
    return ()


def _object_children(value: Any) -> Iterable[Any]:
    if isinstance(value, dict):
        return [*value.keys(), *value.values()]
    if isinstance(value, (list, tuple)):
        return list(value)
    return ()


def _object_items(value: Any) -> Iterable[tuple[str | int, Any]]:
    if isinstance(value, dict):
        return [(str(key), item) for key, item in value.items()]
    if isinstance(value, (list, tuple)):
        return list(enumerate(value))
    return ()


def _path_text(parts: list[str | int]) -> str:
    text = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in parts)
    return text.lstrip(".") or "<root>"


def _hot_path(
    root: object,
    items: Callable[[Any], Iterable[tuple[str | int, Any]]],
    size: Callable[[Any], int],
    limit: int,
) -> tuple[list[str | int], Any]:
    """Follow the biggest child while it alone is over ``limit``: where the blow-up happens.

    Returns the path through map keys down to the first list (an index into an expanded alias
    names nothing in the file) and the deepest node on the way that is still over the limit.
    """
    path: list[str | int] = []
    node, in_maps = root, True
    while True:
        name, kid = max(items(node), key=lambda item: size(item[1]), default=(None, None))
        if kid is None or size(kid) <= limit:
            return path, node
        if in_maps and isinstance(name, str):
            path.append(name)
        else:
            in_maps = False
        node = kid


def _figure(count: int) -> str:
    return f"{count:,}" if count < 10**15 else f"about 10^{len(str(count)) - 1}"


def _check_sizes(
    name: str,
    root: object,
    children: Callable[[Any], Iterable[Any]],
    items: Callable[[Any], Iterable[tuple[str | int, Any]]],
    where: Callable[[Any], str],
    repeats: str,
) -> None:
    try:
        sizes = _measure(root, children)
    except _Cycle as cycle:
        raise ConfigError(
            f"{name}: <root>: a value contains itself{where(cycle.node)}; "
            "an alias (or reference) may not point at a map or list that contains it"
        ) from None
    if sizes.depth[id(root)] > MAX_NESTING:
        path, node = _hot_path(root, items, lambda n: sizes.depth[id(n)], MAX_NESTING)
        raise ConfigError(
            f"{name}: {_path_text(path)}: nested {sizes.depth[id(root)]:,} levels deep, more than "
            f"the limit of {MAX_NESTING}{where(node)}; flatten the structure"
        )
    total = sizes.values[id(root)]
    if total > MAX_EXPANDED_VALUES:
        path, node = _hot_path(root, items, lambda n: sizes.values[id(n)], MAX_EXPANDED_VALUES)
        raise ConfigError(
            f"{name}: {_path_text(path)}: {repeats} expand too far: the config would hold "
            f"{_figure(total)} values once each is written out in full, more than the limit of "
            f"{MAX_EXPANDED_VALUES:,}{where(node)}; repeat large values less often"
        )


def check_expanded_size(data: object, name: str) -> None:
    """Refuse loaded data (or a dict config) that contains itself, nests too deep, or is too
    large once a value used at several places is counted at each (as JSON would write it).

    Raises:
        ConfigError: ``<file>: <yaml.path>: shared values expand too far: ...`` and the like.
    """
    _check_sizes(name, data, _object_children, _object_items, lambda node: "", "shared values")


def _check_node_sizes(loader: _YamlLoader, root: yaml.Node, name: str) -> None:
    def where(node: yaml.Node) -> str:
        anchor = loader.anchor_names.get(id(node))
        line = f"line {node.start_mark.line + 1}"
        return f" (at &{anchor}, {line})" if anchor else f" (at {line})"

    _check_sizes(name, root, _node_children, _node_items, where, "aliases")


# --- parsing ------------------------------------------------------------------------------


def parse_yaml(text: str, name: str) -> Any:
    """Parse one YAML document within the limits; errors are one ``ConfigError`` line.

    Args:
        text: The YAML text.
        name: What messages start with (the file name, or ``file: key: override value``).
    """
    loader = _YamlLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_node_sizes(loader, node, name)
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "<yaml>"
        problem = exc.problem or exc.context or "syntax error"
        fix = "" if "duplicate key" in problem else "; fix the syntax there"
        raise ConfigError(f"{name}: {where}: invalid YAML: {problem}{fix}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{name}: <yaml>: invalid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise ConfigError(
            f"{name}: <yaml>: nested too deeply to read (more than {MAX_NESTING} levels are "
            "refused anyway); flatten the structure"
        ) from None
    finally:
        loader.dispose()


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB ({size:,} bytes)"


def read_config_text(path: str, name: str) -> str:
    """The text of a config file of at most :data:`MAX_CONFIG_BYTES`, decoded as UTF-8.

    Raises:
        ConfigError: Missing, a directory, too large or not UTF-8.
    """
    too_big = (
        f"a config may be at most {MAX_CONFIG_BYTES >> 20} MiB; keep large data in files "
        "the trial reads (e.g. named under data:)"
    )
    try:
        with open(path, "rb") as stream:
            size = _regular_size(stream.fileno())
            if size > MAX_CONFIG_BYTES:
                raise ConfigError(f"{name}: <root>: the file is {_mib(size)}; {too_big}")
            raw = stream.read(MAX_CONFIG_BYTES + 1)  # a pipe has no size to check beforehand
    except FileNotFoundError:
        raise ConfigError(f"{name}: file not found: {path}; check the path") from None
    except IsADirectoryError:
        raise ConfigError(f"{name}: is a directory, not a YAML file: {path}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{name}: <root>: the file is over {_mib(MAX_CONFIG_BYTES)}; {too_big}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{name}: <root>: not UTF-8 text (byte {exc.start}); save the file as UTF-8"
        ) from None


def _regular_size(fileno: int) -> int:
    info = os.fstat(fileno)
    return info.st_size if stat.S_ISREG(info.st_mode) else 0
