"""Text that can be written back: lone surrogates found wherever they hide, and YAML
documents refused when they hold one, nest too deeply or expand past their budget."""

from __future__ import annotations

import pytest

from argosy.core.documents import MAX_YAML_VALUES, load_yaml
from argosy.core.errors import ConfigError
from argosy.core.text import depth, find_unencodable, unencodable

BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{k}: &{k} [{', '.join([f'*{p}'] * 10)}]\n" for p, k in zip("abcd", "bcde", strict=True)
)
"""An alias bomb: 10**5 values from five short lines."""


@pytest.mark.parametrize(
    ("data", "want"),
    [
        ("plain", None),
        ("é😀\u202e\0", None),
        ("\udc80", ()),
        ({"args": ["ok", "a\ud800"]}, ("args", 1)),
        ({"ok": 1, "\udc80": 2}, ("\udc80",)),
        ([{"a": "x"}, {"b": ["y", {"c": "\udfff"}]}], (1, "b", 1, "c")),
        ({"first": "\udc80", "second": "\udc81"}, ("first",)),
    ],
    ids=["plain", "valid-unicode", "bare", "in-list", "in-key", "deep", "document-order"],
)
def test_find_unencodable_names_the_first_lone_surrogate(data, want) -> None:
    assert find_unencodable(data) == want


def test_unencodable_and_depth() -> None:
    assert unencodable("\ud83d") and not unencodable("\U0001f600")
    assert [depth(x) for x in (1, [], {"a": [1]}, [[[[]]]])] == [0, 1, 2, 4]
    deep: list = []
    for _ in range(50_000):  # deeper than any recursion could walk
        deep = [deep]
    assert depth(deep) == 50_001 and find_unencodable(deep) is None


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ('name: x\nargs: ["\\udc80"]\n', "job.yaml:2 field 'args.0': holds a lone surrogate"),
        ('"\\udc80": 1\n', "job.yaml:1: holds a lone surrogate"),
        ("[" * 20_000, "job.yaml: YAML nested too deeply to read"),
        (BOMB, f"more than {MAX_YAML_VALUES} values once its aliases are expanded"),
    ],
    ids=["surrogate-value", "surrogate-key", "deep", "alias-bomb"],
)
def test_load_yaml_refuses_what_it_cannot_hand_on(text: str, want: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_yaml(text, source="job.yaml")
    assert want in str(err.value)


def test_load_yaml_keeps_aliases_and_large_lists_within_the_budget() -> None:
    doc = load_yaml("base: &b [1, 2]\ncopy: *b\nlevels: [" + ", ".join(["0.5"] * 10_000) + "]\n")
    assert doc.data["copy"] == [1, 2] and len(doc.data["levels"]) == 10_000
    assert load_yaml("name: 'é😀'\n").data == {"name": "é😀"}
