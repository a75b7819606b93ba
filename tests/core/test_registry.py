"""The generic registry: names, aliases, lazy dotted paths, unknown-name errors."""

import pytest

from argosy.core.errors import UnknownNameError
from argosy.plugins.registry import Registry


def make_registry() -> Registry[object]:
    registry: Registry[object] = Registry("widget")
    registry.register("alpha", 1, aliases=("a", "first"))
    registry.register("beta", "argosy.core.names:closest_names")
    return registry


@pytest.mark.parametrize(
    ("name", "want"),
    [("alpha", 1), ("A", 1), (" first ", 1)],
    ids=["canonical", "alias-case-insensitive", "alias-stripped"],
)
def test_get_resolves_names_and_aliases(name: str, want: object) -> None:
    assert make_registry().get(name) == want


def test_dotted_path_is_imported_on_first_get() -> None:
    from argosy.core.names import closest_names

    assert make_registry().get("beta") is closest_names


def test_unknown_name_lists_known_names_closest_first() -> None:
    with pytest.raises(UnknownNameError) as info:
        make_registry().get("alpah")
    message = str(info.value)
    assert message.startswith("unknown widget 'alpah'; known: alpha")
    assert "beta" in message and "first" in message


def test_duplicate_registration_is_refused() -> None:
    registry = make_registry()
    with pytest.raises(ValueError, match="already registered"):
        registry.register("gamma", 3, aliases=("a",))
    assert "gamma" not in registry
