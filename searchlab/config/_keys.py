"""Unknown keys, found before anything else is validated.

A misspelled key (``max_trails``) also makes the key it should have been missing; naming the
misspelling first, with the closest valid key, points at the real fix. This pass walks the raw
config in document order: the top level, every section, the searcher (by its ``name``) and the
hyperparameter specs.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from searchlab.config._hparams import unknown_hparam_keys
from searchlab.config._length import Length
from searchlab.config._model import ExperimentConfig
from searchlab.config._searchers import SEARCHER_ALIASES, SEARCHER_CONFIGS, SearcherName

__all__ = ["unknown_key_message", "unknown_keys"]


def unknown_key_message(key: str, valid: Sequence[str], *, also: Sequence[str] = ()) -> str:
    """``unknown key; did you mean X?`` (or the valid keys when none is close).

    ``also`` are names accepted but ignored (Determined cluster-only fields): they are offered as
    suggestions too, not listed.
    """
    close = difflib.get_close_matches(key, [*valid, *also], n=1)
    if close:
        return f"unknown key; did you mean {close[0]}?"
    return f"unknown key; valid keys are: {', '.join(sorted(valid))}"


def _section_model(annotation: Any) -> type[BaseModel] | None:
    candidates = (
        typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    )
    for candidate in candidates:
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return None if candidate is Length else candidate
    return None


def _searcher_keys(raw: Mapping[Any, Any]) -> tuple[list[str], str | None]:
    """The keys the named searcher takes (all searchers' keys when the name is unknown)."""
    name = raw.get("name")
    name = SEARCHER_ALIASES.get(name, name) if isinstance(name, str) else None
    if name in {member.value for member in SearcherName}:
        searcher = SearcherName(name)
        return list(SEARCHER_CONFIGS[searcher].model_fields), searcher.value
    every = {key for model in SEARCHER_CONFIGS.values() for key in model.model_fields}
    return sorted(every), None


def _searcher_problems(raw: Mapping[Any, Any]) -> Iterator[tuple[str, str]]:
    valid, searcher = _searcher_keys(raw)
    for key in raw:
        if key in valid:
            continue
        users = sorted(
            name.value for name, model in SEARCHER_CONFIGS.items() if key in model.model_fields
        )
        if users and searcher is not None:
            message = f"unknown key for {searcher} search; only {', '.join(users)} take it"
        else:
            message = unknown_key_message(str(key), valid)
        yield f"searcher.{key}", message


def _model_problems(
    raw: Mapping[Any, Any], model: type[BaseModel], prefix: str, ignored: Mapping[str, list[str]]
) -> Iterator[tuple[str, str]]:
    for key, value in raw.items():
        path = f"{prefix}{key}"
        field = model.model_fields.get(key) if isinstance(key, str) else None
        if field is None:
            section = prefix.rstrip(".")
            yield (
                path,
                unknown_key_message(
                    str(key), list(model.model_fields), also=ignored.get(section, [])
                ),
            )
        elif path == "searcher" and isinstance(value, Mapping):
            yield from _searcher_problems(value)
        elif path == "hyperparameters":
            yield from unknown_hparam_keys(value, path)
        elif isinstance(value, Mapping):
            sub_model = _section_model(field.annotation)
            if sub_model is not None:
                yield from _model_problems(value, sub_model, f"{path}.", ignored)


def unknown_keys(raw: Mapping[Any, Any], ignored: Sequence[str] = ()) -> list[tuple[str, str]]:
    """Every unknown key of a raw config as ``(yaml path, message)``, in document order.

    Args:
        raw: The config as loaded from YAML (cluster-only fields already dropped).
        ignored: Dotted names accepted and ignored (``resources.resource_pool``); a misspelling
            of one is pointed at it.
    """
    by_section: dict[str, list[str]] = {}
    for dotted in ignored:
        section, _, leaf = dotted.rpartition(".")
        by_section.setdefault(section, []).append(leaf)
    return list(_model_problems(raw, ExperimentConfig, "", by_section))
