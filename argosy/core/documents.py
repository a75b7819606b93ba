"""YAML documents that remember where each value came from, and validation with locations.

`load_yaml` parses a file or text into plain Python data plus a map from key path to
line; `validate` runs a pydantic model over it and turns the first errors into a
`ConfigError` that names the file, the line and the dotted field:

    doc = load_yaml(Path("cluster.yaml"))
    spec = validate(ClusterSpec, doc)   # ConfigError: cluster.yaml:7 field 'groups.1.count': ...
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from argosy.core.errors import ConfigError
from argosy.core.text import NOT_TEXT, unencodable

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
    lines: dict[KeyPath, int] = {}
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = _to_python(node, (), lines) if node is not None else {}
    except yaml.MarkedYAMLError as err:
        line = err.problem_mark.line + 1 if err.problem_mark else None
        raise ConfigError(f"malformed YAML: {err.problem}", source=source, line=line) from err
    except RecursionError:
        raise ConfigError("YAML nested too deeply to read", source=source) from None
    except _RefusedError as err:
        field = ".".join(str(p) for p in err.path) or None
        raise ConfigError(err.message, source=source, line=err.line, field=field) from None
    return Document(data=data, source=source, lines=lines)


MAX_YAML_VALUES = 100_000
"""Most values (mappings, lists, scalars) one document may expand to. A job or service
file holds tens (a tidal profile up to 10,000 levels); an alias bomb (`a: &a [x, x]`,
`b: &b [*a, *a]`, ...) expands to billions and would hold the process for minutes."""


class _RefusedError(Exception):
    """A document `load_yaml` will not hand on: too many values, or text UTF-8 cannot
    encode (a `"\\udc80"` escape: no answer could show it back)."""

    def __init__(self, message: str, path: KeyPath, line: int) -> None:
        super().__init__(message)
        self.message, self.path, self.line = message, path, line


def _to_python(node: yaml.Node, path: KeyPath, lines: dict[KeyPath, int]) -> Any:
    line = lines[path] = node.start_mark.line + 1
    if len(lines) > MAX_YAML_VALUES:
        msg = f"more than {MAX_YAML_VALUES} values once its aliases are expanded"
        raise _RefusedError(msg, (), line)
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            if unencodable(key):
                raise _RefusedError(NOT_TEXT, path, key_node.start_mark.line + 1)
            out[key] = _to_python(value_node, (*path, key), lines)
            lines[(*path, key)] = key_node.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_to_python(item, (*path, i), lines) for i, item in enumerate(node.value)]
    value = yaml.SafeLoader("").construct_object(node, deep=True)
    if isinstance(value, str) and unencodable(value):
        raise _RefusedError(NOT_TEXT, path, line)
    return value


def validate(model: type[M], doc: Document) -> M:
    """Validate `doc.data` against `model`; errors point at file, line and field."""
    try:
        return model.model_validate(doc.data)
    except ValidationError as err:
        raise located_error(err, doc, known=list(model.model_fields)) from err


def located_error(
    err: ValidationError, doc: Document, known: list[str] | None = None
) -> ConfigError:
    """One validation error as a `ConfigError` with line and dotted field: an unknown key
    first (a typo, which often explains the rest; with the closest of the `known`
    top-level keys), else pydantic's first (the most specific)."""
    errors = sorted(err.errors(), key=lambda e: e["type"] != "extra_forbidden")  # stable
    first = errors[0]
    loc = tuple(first["loc"])
    message = _describe(first)
    if first["type"] == "extra_forbidden" and len(loc) == 1 and known:
        taken = doc.data if isinstance(doc.data, dict) else {}
        close = difflib.get_close_matches(str(loc[0]), [k for k in known if k not in taken], 1)
        message += f" (did you mean '{close[0]}'?)" if close else ""
    more = len(errors) - 1
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
    msg = str(error["msg"]).removeprefix("Value error, ")  # pydantic's, on our own message
    got = error.get("input")
    if isinstance(got, dict | list) or len(repr(got)) > 200:
        return msg  # the file has it: no echo of a whole section
    return f"{msg} (got {got!r})"
