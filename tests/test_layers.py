"""Imports point down the layers (ARCHITECTURE.md): a package imports only layers below it."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "argosy"

BASE = {"core", "plugins"}
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "plugins": {"core"},
    "hardware": BASE,
    "planner": BASE | {"hardware"},
    "health": BASE | {"hardware"},
    "scheduler": BASE | {"hardware", "planner"},
    "checkpoint": BASE | {"hardware"},
    "runtime": BASE | {"hardware", "checkpoint", "health"},
    "serving": BASE | {"hardware", "planner"},
    "executors": BASE | {"hardware", "scheduler", "runtime"},
    "sim": BASE | {"hardware", "planner", "scheduler", "health"},
}


def argosy_imports(path: Path) -> set[str]:
    """Top-level argosy packages imported by one module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        found |= {n.split(".")[1] for n in names if n.startswith("argosy.") and n.count(".") >= 1}
    return found


COMPOSERS = {"cli", "config", "server"}  # may import any layer
PRESENT = sorted(p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists())


def test_every_package_has_a_place_in_the_layers() -> None:
    assert set(PRESENT) - set(ALLOWED) - COMPOSERS == set()


@pytest.mark.parametrize("layer", [layer for layer in PRESENT if layer in ALLOWED])
def test_layer_imports_only_layers_below(layer: str) -> None:
    bad = {}
    for path in (ROOT / layer).rglob("*.py"):
        extra = argosy_imports(path) - ALLOWED[layer] - {layer}
        if extra:
            bad[str(path.relative_to(ROOT))] = sorted(extra)
    assert bad == {}


def test_config_root_imports_only_config_sections() -> None:
    for path in (ROOT / "config").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            if module and module.startswith("argosy."):
                parts = module.split(".")
                assert parts[1] in {"config", "core"} or parts[-1] == "config", (path, module)
