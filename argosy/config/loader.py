"""Assemble a `PlatformConfig` from a YAML file, the environment and `--set` overrides."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from argosy.config.model import PlatformConfig
from argosy.core.documents import Document, load_yaml
from argosy.core.errors import ConfigError

ENV_PREFIX = "ARGOSY__"
Origin = tuple[str, int | None]  # (source, line)


def load_config(
    path: Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Sequence[str] = (),
) -> PlatformConfig:
    """The validated config; later sources override earlier ones key by key."""
    data: dict[str, Any] = {}
    origins: dict[tuple[str, ...], Origin] = {}
    if path is not None:
        doc = load_yaml(path)
        if not isinstance(doc.data, dict):
            raise ConfigError("a config file is a mapping of sections", source=doc.source, line=1)
        _merge_document(data, origins, doc)
    env = os.environ if env is None else env
    for name in sorted(env):
        if name.startswith(ENV_PREFIX):
            keys = tuple(part.lower() for part in name[len(ENV_PREFIX) :].split("__"))
            _set(data, origins, keys, _parse_value(env[name]), (f"environment {name}", None))
    for item in overrides:
        keys, value = _parse_override(item)
        _set(data, origins, keys, value, (f"--set {item}", None))
    try:
        return PlatformConfig.model_validate(data)
    except ValidationError as err:
        raise _locate(err, origins) from err


def _merge_document(data: dict, origins: dict, doc: Document) -> None:
    def walk(value: Any, keys: tuple[str, ...]) -> None:
        if isinstance(value, dict) and (value or not keys):
            for key, child in value.items():
                walk(child, (*keys, key))
        else:
            _set(data, origins, keys, value, (doc.source, doc.line_of(keys)))

    walk(doc.data, ())


def _parse_override(item: str) -> tuple[tuple[str, ...], Any]:
    key, sep, raw = item.partition("=")
    if not sep or not key.strip() or any(not part for part in key.strip().split(".")):
        raise ConfigError(f"--set expects section.field=value, got '{item}'")
    return tuple(key.strip().split(".")), _parse_value(raw)


def _parse_value(raw: str) -> Any:
    try:
        return yaml.safe_load(raw) if raw.strip() else raw
    except yaml.YAMLError:
        return raw


def _set(data: dict, origins: dict, keys: tuple[str, ...], value: Any, origin: Origin) -> None:
    node = data
    for key in keys[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    node[keys[-1]] = value
    origins[keys] = origin


def _locate(err: ValidationError, origins: dict[tuple[str, ...], Origin]) -> ConfigError:
    first = err.errors()[0]
    loc = tuple(str(part) for part in first["loc"])
    source, line = "config", None
    for cut in range(len(loc), 0, -1):
        if loc[:cut] in origins:
            source, line = origins[loc[:cut]]
            break
    else:
        below = [k for k in origins if k[: len(loc)] == loc]
        if below:
            source, line = origins[below[0]]
    message = "unknown key" if first["type"] == "extra_forbidden" else first["msg"]
    return ConfigError(message, source=source, line=line, field=".".join(loc))
