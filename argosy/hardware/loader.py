"""Load a cluster from a YAML file or from the shorthand `CHIP:COUNT[+CHIP:COUNT...]`.

Every mistake becomes a `ConfigError` that points at the file and line (YAML) or at the
part of the shorthand, with what was expected:

    load_cluster("h100:1024")
    load_cluster("a100-80g:512+910b:512", nic_gbps=200)
    load_cluster("clusters/lab.yaml")
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from pydantic import ValidationError

from argosy.core.documents import Document, load_yaml, located_error
from argosy.core.errors import ConfigError, UnknownNameError
from argosy.hardware.catalog import Catalog, default_catalog
from argosy.hardware.cluster import (
    Cluster,
    ClusterSpec,
    GroupError,
    NodeGroupSpec,
    resolve,
)

SHORTHAND_FORM = "CHIP:COUNT[+CHIP:COUNT...], e.g. h100:1024 or a100-80g:512+910b:512"


def load_cluster(
    text_or_path: str | Path,
    *,
    catalog: Catalog | None = None,
    nic_gbps: float | None = None,
) -> Cluster:
    """A cluster from a YAML path or a shorthand string; `nic_gbps` overrides every group."""
    catalog = catalog or default_catalog()
    if _looks_like_file(text_or_path):
        doc = load_yaml(Path(text_or_path))
        spec = _validate_spec(doc)
        cluster = _resolve_located(spec, catalog, doc)
    else:
        spec = parse_shorthand(str(text_or_path))
        cluster = _resolve_located(spec, catalog, None)
    if nic_gbps is not None:
        cluster = _override_nic(cluster, nic_gbps)
    return cluster


def parse_shorthand(text: str) -> ClusterSpec:
    """Parse `CHIP:COUNT[+CHIP:COUNT...]` into a spec (chips are checked at resolve time)."""
    groups = []
    for number, part in enumerate(text.split("+"), start=1):
        chip, sep, count = part.strip().partition(":")
        if not sep or not chip or not count.strip().isdigit():
            raise ConfigError(
                f"part {number} '{part}' is not CHIP:COUNT; expected {SHORTHAND_FORM}",
                source=text,
            )
        if int(count) == 0:
            raise ConfigError(
                f"part {number} '{part}': a group needs at least 1 device", source=text
            )
        groups.append(NodeGroupSpec(chip=chip.strip(), count=int(count)))
    return ClusterSpec(name=text, groups=tuple(groups))


def _looks_like_file(value: str | Path) -> bool:
    if isinstance(value, Path):
        return True
    return value.endswith((".yaml", ".yml")) or Path(value).is_file()


def _validate_spec(doc: Document) -> ClusterSpec:
    if not isinstance(doc.data, dict):
        raise ConfigError("a cluster file is a mapping with 'groups'", source=doc.source, line=1)
    try:
        return ClusterSpec.model_validate(doc.data)
    except ValidationError as err:
        raise located_error(err, doc) from err


def _resolve_located(spec: ClusterSpec, catalog: Catalog, doc: Document | None) -> Cluster:
    try:
        return resolve(spec, catalog)
    except GroupError as err:
        path = ("groups", err.index, err.field)
        raise _error(str(err), doc, spec, path) from err
    except UnknownNameError as err:
        index = next(i for i, g in enumerate(spec.groups) if g.chip == err.name)
        raise _error(str(err), doc, spec, ("groups", index, "chip")) from err


def _error(message: str, doc: Document | None, spec: ClusterSpec, path: tuple) -> ConfigError:
    field = ".".join(str(p) for p in path)
    if doc is None:
        return ConfigError(f"part {path[1] + 1}: {message}", source=spec.name)
    return ConfigError(message, source=doc.source, line=doc.line_of(path), field=field)


def _override_nic(cluster: Cluster, nic_gbps: float) -> Cluster:
    if nic_gbps <= 0:
        raise ConfigError(f"--nic-gbps must be positive, got {nic_gbps}")
    groups = tuple(replace(g, nic_gbps=nic_gbps) for g in cluster.groups)
    return replace(cluster, groups=groups)
