"""YAML documents keep line numbers; validation errors name file, line and field."""

from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from argosy.core.clock import FakeClock
from argosy.core.documents import load_yaml, validate
from argosy.core.errors import ConfigError


class Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    count: int


class Outer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    items: list[Inner]


TEXT = """name: demo
items:
  - count: 1
  - count: two
"""


def test_line_numbers_follow_key_paths() -> None:
    doc = load_yaml(TEXT, source="demo.yaml")
    assert doc.line_of(("name",)) == 1
    assert doc.line_of(("items", 1, "count")) == 4
    assert doc.line_of(("items", 1, "missing")) == 4  # nearest ancestor


@pytest.mark.parametrize(
    ("text", "want_line", "want_field", "want_text"),
    [
        (TEXT, 4, "items.1.count", "valid integer"),
        ("name: demo\nitems: []\ncolour: red\n", 3, "colour", "unknown key"),
        ("items: []\n", 1, "name", "required field is missing"),
    ],
    ids=["bad-type", "unknown-key", "missing-key"],
)
def test_validation_errors_are_located(
    text: str, want_line: int | None, want_field: str, want_text: str
) -> None:
    with pytest.raises(ConfigError) as info:
        validate(Outer, load_yaml(text, source="demo.yaml"))
    err = info.value
    assert (err.line, err.field) == (want_line, want_field)
    assert want_text in str(err)
    assert str(err).startswith("demo.yaml")


def test_malformed_yaml_points_at_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("a: 1\nb: [1, 2\nc: 3\n")
    with pytest.raises(ConfigError) as info:
        load_yaml(path)
    assert info.value.source == str(path)
    assert info.value.line is not None and info.value.line >= 2


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_yaml(tmp_path / "absent.yaml")


def test_fake_clock_moves_only_forward() -> None:
    clock = FakeClock(10.0)
    clock.advance(2.5)
    assert clock.now_s() == 12.5
    with pytest.raises(AssertionError):
        clock.set(1.0)
