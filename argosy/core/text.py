"""Text that can be stored and written back: a check for lone UTF-16 surrogates.

JSON (`"\\udc80"`) and YAML (`"\\udc80"`) escapes can make a Python `str` holding a
surrogate code point that no UTF-8 encoder accepts. Stored as is, such a value breaks
every later answer that shows it, so inputs are refused at the door instead:

    unencodable("a\\udc80")                       # True
    find_unencodable({"args": ["ok", "\\udc80"]})  # ("args", 1): where it is
"""

from __future__ import annotations

from typing import Any

KeyPath = tuple[str | int, ...]
NOT_TEXT = "holds a lone surrogate escape (such as \\udc80), which is not Unicode text"
"""How a refusal of such a value reads, wherever it is refused."""


def unencodable(text: str) -> bool:
    """Whether `text` holds a code point UTF-8 cannot encode (a lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def find_unencodable(data: Any) -> KeyPath | None:
    """The path of the first string or mapping key in `data` (parsed JSON or YAML) that
    UTF-8 cannot encode, in document order; None if there is none. Iterative, so any
    depth the parser produced is walked."""
    stack: list[tuple[KeyPath, Any]] = [((), data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if unencodable(value):
                return path
        elif isinstance(value, dict):
            for key in value:
                if isinstance(key, str) and unencodable(key):
                    return (*path, key)
            stack += [((*path, k), v) for k, v in reversed(value.items())]
        elif isinstance(value, list):
            stack += [((*path, i), v) for i, v in reversed(list(enumerate(value)))]
    return None


def depth(data: Any) -> int:
    """How deeply lists and mappings nest in `data` (a scalar: 0)."""
    deepest = 0
    stack: list[tuple[int, Any]] = [(0, data)]
    while stack:
        level, value = stack.pop()
        if isinstance(value, dict | list):
            level += 1
            deepest = max(deepest, level)
            stack += [(level, v) for v in (value.values() if isinstance(value, dict) else value)]
    return deepest
