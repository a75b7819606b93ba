"""The config model: file, then environment, then --set; unknown keys are located errors."""

from pathlib import Path

import pytest

from argosy.config import PlatformConfig, load_config
from argosy.core.errors import ConfigError


def test_defaults_without_any_source() -> None:
    assert load_config(env={}) == PlatformConfig()


def test_precedence_file_then_env_then_set(tmp_path: Path) -> None:
    path = tmp_path / "argosy.yaml"
    path.write_text("hardware:\n  default_cluster: a100:8\n  catalog_path: /tmp/x.yaml\n")
    from_file = load_config(path, env={})
    assert from_file.hardware.default_cluster == "a100:8"
    env = {"ARGOSY__HARDWARE__DEFAULT_CLUSTER": "h200:16"}
    from_env = load_config(path, env=env)
    assert from_env.hardware.default_cluster == "h200:16"
    assert from_env.hardware.catalog_path == "/tmp/x.yaml"  # untouched keys survive
    from_set = load_config(path, env=env, overrides=["hardware.default_cluster=mi300x:8"])
    assert from_set.hardware.default_cluster == "mi300x:8"


@pytest.mark.parametrize(
    ("file_text", "env", "overrides", "want"),
    [
        (
            "hardware:\n  default_cluster: a\n  colour: red\n",
            {},
            [],
            "argosy.yaml:3 field 'hardware.colour'",
        ),
        ("", {"ARGOSY__PLANNERR__X": "1"}, [], "environment ARGOSY__PLANNERR__X field 'plannerr'"),
        ("", {}, ["hardware.nope=1"], "--set hardware.nope=1 field 'hardware.nope'"),
        ("", {}, ["hardware"], "--set expects section.field=value"),
    ],
    ids=["file-unknown-key", "env-unknown-section", "set-unknown-key", "set-malformed"],
)
def test_unknown_keys_are_located(
    tmp_path: Path, file_text: str, env: dict[str, str], overrides: list[str], want: str
) -> None:
    path = tmp_path / "argosy.yaml"
    path.write_text(file_text or "{}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, env=env, overrides=overrides)
    assert want in str(info.value)


def test_config_is_frozen() -> None:
    config = load_config(env={})
    with pytest.raises(ValueError, match="frozen"):
        config.hardware.default_cluster = "x"  # type: ignore[misc]  # the point of the test


def test_every_field_has_a_docstring() -> None:
    def walk(model: type) -> list[str]:
        missing = []
        for name, field in model.model_fields.items():
            if not field.description:
                missing.append(f"{model.__name__}.{name}")
            annotation = field.annotation
            if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
                missing += walk(annotation)
        return missing

    assert walk(PlatformConfig) == []
