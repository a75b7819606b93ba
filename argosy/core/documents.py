"""YAML documents that remember where each value came from, and validation with locations.

`load_yaml` parses a file or text into plain Python data plus a map from key path to
line; `validate` runs a pydantic model over it and turns the first errors into a
`ConfigError` that names the file, the line and the dotted field:

    doc = load_yaml(Path("cluster.yaml"))
    spec = validate(ClusterSpec, doc)   # ConfigError: cluster.yaml:7 field 'groups.1.count': ...
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from argosy.core.errors import ConfigError

M = TypeVar("M", bound=BaseModel)
KeyPath = tuple[str | int, ...]


@dataclass(frozen=True)
class Document:
    """Parsed data, where it came from, and the 1-based line of each key path."""

    data: Any
    source: str
    lines: dict[KeyPath, int] = field(default_factory=dict)

    def line_of(self, path: KeyPath) -> int | None:
        """The line of `path`, or of its nearest ancestor that has one."""
        for cut in range(len(path), -1, -1):
            line = self.lines.get(tuple(path[:cut]))
            if line is not None:
                return line
        return None


def load_yaml(path_or_text: Path | str, *, source: str | None = None) -> Document:
    """Parse a YAML file (a `Path`) or YAML text (a `str`) into a `Document`."""
    if isinstance(path_or_text, Path):
        try:
            text = path_or_text.read_text()
        except OSError as err:
            raise ConfigError(f"cannot read: {err.strerror}", source=str(path_or_text)) from err
        source = source or str(path_or_text)
    else:
        text, source = path_or_text, source or "<text>"
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as err:
        line = err.problem_mark.line + 1 if err.problem_mark else None
        raise ConfigError(f"malformed YAML: {err.problem}", source=source, line=line) from err
    lines: dict[KeyPath, int] = {}
    data = _to_python(node, (), lines) if node is not None else {}
    return Document(data=data, source=source, lines=lines)


def _to_python(node: yaml.Node, path: KeyPath, lines: dict[KeyPath, int]) -> Any:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            out[key] = _to_python(value_node, (*path, key), lines)
            lines[(*path, key)] = key_node.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_to_python(item, (*path, i), lines) for i, item in enumerate(node.value)]
    return yaml.SafeLoader("").construct_object(node, deep=True)


def validate(model: type[M], doc: Document) -> M:
    """Validate `doc.data` against `model`; errors point at file, line and field."""
    try:
        return model.model_validate(doc.data)
    except ValidationError as err:
        raise located_error(err, doc) from err


def located_error(err: ValidationError, doc: Document) -> ConfigError:
    """The first validation error as a `ConfigError` with line and dotted field."""
    first = err.errors()[0]
    loc = tuple(first["loc"])
    message = _describe(first)
    more = len(err.errors()) - 1
    if more:
        message += f" (and {more} more error{'s' if more > 1 else ''})"
    return ConfigError(
        message,
        source=doc.source,
        line=doc.line_of(loc),
        field=".".join(str(part) for part in loc) or None,
    )


def _describe(error: Any) -> str:
    if error["type"] == "extra_forbidden":
        return "unknown key"
    if error["type"] == "missing":
        return "required field is missing"
    return f"{error['msg']} (got {error.get('input')!r})"
